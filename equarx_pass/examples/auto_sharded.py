"""Auto-sharded programs: jax.jit + NamedSharding, no shard_map, no psum.

The SPMD partitioner inserts their all-reduces while compiling.  Each program
comes with the same computation written by hand (shard_map + psum), whose
all-reduces are in the lowered StableHLO: tests/test_auto_sharded.py and
tools/bench_auto_sharded.py compare the two.  Needs only JAX (no extras).

    mesh = tp_mesh()
    args = mlp_inputs(mesh)
    equarx_pass.jit(mlp, flags="--equarx_enable")(*args)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

HIDDEN, FFN, HEADS = 256, 1024, 8
COLUMNS, ROWS = P(None, "tp"), P("tp", None)


def tp_mesh(devices=None) -> Mesh:
  """A one-axis 'tp' mesh over `devices` (default: all)."""
  return Mesh(np.array(devices if devices is not None else jax.devices()), ("tp",))


def _put(mesh, array, spec):
  return jax.device_put(array, NamedSharding(mesh, spec))


def _normal(rng, shape, scale=1.0):
  return (rng.standard_normal(shape) * scale).astype(np.float32)


# --- a tensor-parallel MLP ----------------------------------------------------------


def mlp(x, w1, w2):
  """Column-parallel w1, row-parallel w2: the partitioner adds an all-reduce of the output."""
  return jax.nn.relu(x @ w1) @ w2


def mlp_inputs(mesh, seed=0, tokens=64, x_spec=P()):
  """x (tokens x HIDDEN, replicated or batch-sharded), w1 on columns, w2 on rows."""
  rng = np.random.default_rng(seed)
  return (
    _put(mesh, _normal(rng, (tokens, HIDDEN)), x_spec),
    _put(mesh, _normal(rng, (HIDDEN, FFN), HIDDEN**-0.5), COLUMNS),
    _put(mesh, _normal(rng, (FFN, HIDDEN), FFN**-0.5), ROWS),
  )


def mlp_by_hand(mesh, x_spec=P()):
  """`mlp` as shard_map + psum (x gathered first when it comes batch-sharded)."""

  def body(x, w1, w2):
    if x_spec != P():
      x = jax.lax.all_gather(x, "tp", tiled=True)
    return jax.lax.psum(mlp(x, w1, w2), "tp")

  return jax.shard_map(body, mesh=mesh, in_specs=(x_spec, COLUMNS, ROWS), out_specs=P())


def mlp_partials(args) -> list[np.ndarray]:
  """Each device's contribution to the all-reduce, in float64, device order."""
  x, w1, w2 = (np.asarray(a, np.float64) for a in args)
  n = len(args[1].sharding.mesh.devices.flat)
  cols = w1.shape[1] // n
  return [
    np.maximum(x @ w1[:, r * cols : (r + 1) * cols], 0) @ w2[r * cols : (r + 1) * cols]
    for r in range(n)
  ]


# --- a transformer block ------------------------------------------------------------


def layer_norm(x):
  mean = jnp.mean(x, axis=-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(jnp.var(x, axis=-1, keepdims=True) + 1e-5)


def attention(x, wq, wk, wv, wo, heads):
  """Multi-head self-attention; `heads` = the number of heads these weights hold."""
  b, s, _ = x.shape
  h = layer_norm(x)
  split = lambda t: t.reshape(b, s, heads, -1)
  q, k, v = split(h @ wq), split(h @ wk), split(h @ wv)
  scores = jnp.einsum("bshd,bthd->bhst", q, k) / np.float32(np.sqrt(q.shape[-1]))
  o = jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(scores, axis=-1), v)
  return o.reshape(b, s, -1) @ wo


def block(x, wq, wk, wv, wo, w1, w2):
  """A pre-norm transformer block, x + attention then x + MLP: two all-reduces."""
  x = x + attention(x, wq, wk, wv, wo, HEADS)
  return x + mlp(layer_norm(x), w1, w2)


def block_inputs(mesh, seed=0, batch=2, seq=64):
  """x replicated; wq, wk, wv, w1 on columns (heads / FFN split), wo, w2 on rows."""
  rng = np.random.default_rng(seed)
  d = HIDDEN
  col = lambda shape: _put(mesh, _normal(rng, shape, shape[0] ** -0.5), COLUMNS)
  row = lambda shape: _put(mesh, _normal(rng, shape, shape[0] ** -0.5), ROWS)
  return (
    _put(mesh, _normal(rng, (batch, seq, d)), P()),
    col((d, d)),
    col((d, d)),
    col((d, d)),
    row((d, d)),
    col((d, FFN)),
    row((FFN, d)),
  )


def block_by_hand(mesh):
  """`block` as shard_map with a psum after attention and after the MLP."""

  def body(x, wq, wk, wv, wo, w1, w2):
    heads = HEADS // mesh.size
    x = x + jax.lax.psum(attention(x, wq, wk, wv, wo, heads), "tp")
    return x + jax.lax.psum(mlp(layer_norm(x), w1, w2), "tp")

  return jax.shard_map(
    body, mesh=mesh, in_specs=(P(), COLUMNS, COLUMNS, COLUMNS, ROWS, COLUMNS, ROWS), out_specs=P()
  )
