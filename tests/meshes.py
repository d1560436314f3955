"""Mesh helpers shared by the numeric tests."""

import jax
import numpy as np
from jax.sharding import PartitionSpec as P


def psum_program(mesh, axis):
  """A shard_map'd psum over `axis` of an array sharded over every mesh axis."""
  return jax.shard_map(
    lambda x: jax.lax.psum(x, axis),
    mesh=mesh,
    in_specs=P(mesh.axis_names),
    out_specs=P(mesh.axis_names),
  )


def ring_groups(mesh, axes: tuple[str, ...]) -> list[list[tuple[int, ...]]]:
  """Mesh positions of each replica group of a psum over `axes`, ranks in ring order
  (row-major over `axes`)."""
  names, shape = mesh.axis_names, mesh.devices.shape
  red = [names.index(a) for a in axes]
  keep = [i for i in range(len(names)) if i not in red]
  groups = []
  for k in np.ndindex(*[shape[i] for i in keep]):
    group = []
    for r in np.ndindex(*[shape[i] for i in red]):
      pos = [0] * len(names)
      for i, v in zip(keep + red, k + r):
        pos[i] = v
      group.append(tuple(pos))
    groups.append(group)
  return groups
