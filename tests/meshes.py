"""Mesh helpers shared by the numeric tests."""

import numpy as np


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
