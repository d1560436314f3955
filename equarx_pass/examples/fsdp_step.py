"""A plain-JAX training step sharded the way TPU trainers shard theirs.

Data parallel across slices, FSDP inside a slice: a two-axis mesh ("dcn", "ici"), the
batch split over both axes, each weight split over "ici" (and replicated across
slices), `jax.jit` with NamedSharding and `with_sharding_constraint`, no shard_map and
no psum.  XLA's partitioner writes every collective: all-gathers of the weights inside
a slice, and for the gradients an all-reduce over both axes that it narrows to a
reduce-scatter inside the slice and an all-reduce across slices.  This is the route
MaxText's cross-slice gradient all-reduce takes.

    mesh = hybrid_mesh(devices, slices=2)
    step, args = sgd_step(mesh, jnp.bfloat16)
    equarx_pass.jit(step, out_shardings=...).lower(*args).compile()
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def hybrid_mesh(devices, slices: int) -> Mesh:
  """("dcn", "ici") over `devices` of `slices` TPU slices (slice_index), or over any
  devices in order as `slices` equal groups."""
  per_slice = len(devices) // slices
  if hasattr(devices[0], "slice_index"):
    grid = mesh_utils.create_hybrid_device_mesh((1, per_slice), (slices, 1), devices)
  else:
    grid = np.asarray(devices).reshape(slices, per_slice)
  return Mesh(np.asarray(grid), ("dcn", "ici"))


def shardings(mesh: Mesh) -> dict:
  """The step's shardings: parameters over "ici", the batch over both axes."""
  S = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
  return {
    "params": {"w1": S("ici", None), "w2": S(None, "ici")},
    "batch": S(("dcn", "ici"), None),
  }


def sgd_step(mesh: Mesh, dtype=jnp.float32, width: int = 2048, hidden: int = 4096, batch=64):
  """(step, abstract arguments): a two-layer MLP's SGD step, parameters in `dtype`.

  step(params, x, y) -> (new params, loss); the arguments are ShapeDtypeStructs with
  their shardings (for .lower(), which needs no data)."""
  s = shardings(mesh)
  batch_sharding = s["batch"]

  def loss_fn(params, x, y):
    x = jax.lax.with_sharding_constraint(x, batch_sharding)
    h = jax.nn.relu(x @ params["w1"])
    h = jax.lax.with_sharding_constraint(h, batch_sharding)
    out = h @ params["w2"]
    return jnp.mean((out.astype(jnp.float32) - y.astype(jnp.float32)) ** 2)

  def step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    new = jax.tree.map(lambda p, g: (p - 1e-3 * g).astype(p.dtype), params, grads)
    return jax.lax.with_sharding_constraint(new, s["params"]), loss

  def arg(shape, sharding):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

  rows = batch * mesh.devices.size
  params = {
    "w1": arg((width, hidden), s["params"]["w1"]),
    "w2": arg((hidden, width), s["params"]["w2"]),
  }
  return step, (params, arg((rows, width), batch_sharding), arg((rows, width), batch_sharding))


def out_shardings(mesh: Mesh):
  """The step's output shardings: parameters as they came in, the loss replicated."""
  return (shardings(mesh)["params"], NamedSharding(mesh, P()))
