"""The baseline for the network benchmark: an unquantized bf16 ring all-reduce in JAX.

    python tools/bf16_ring.py        # self-check on 8 virtual CPU devices

The same ring as the quantized one (equarx_pass.ring): N-1 reduce-scatter steps,
then N-1 all-gather steps, each one jax.lax.ppermute to the next rank, f32
accumulation.  It is the bandwidth-optimal bf16 all-reduce: each rank sends
2(N-1)/N of the message in 2 bytes per value.  XLA's own CPU all-reduce over gloo
is not (and XLA:CPU widens bf16 collectives to f32 on the wire), so beating the
native psum alone proves little; beating this ring is what the paper claims.

Payloads travel as their uint16 bits (bitcast_convert_type): a bf16 ppermute
would be widened to f32 by XLA:CPU.  The owner of a chunk keeps the bf16 copy it
sends, so every rank ends with the same bits.
"""

from __future__ import annotations

import os
import sys


def bf16_ring_allreduce(x, axis_name: str, axis_size: int, permute=None, rank=None):
  """psum(x, axis_name) as a bf16 ring; call inside shard_map.  Same shape and dtype.

  permute and rank stand in for ppermute to the next rank and axis_index (the compute-only
  twin of tools/bench_twin.py passes the identity and 0)."""
  import jax
  import jax.numpy as jnp

  n = axis_size
  shape, dtype = x.shape, x.dtype
  flat = x.reshape(-1).astype(jnp.float32)
  length = flat.shape[0]
  chunk = -(-length // n)
  chunks = jnp.pad(flat, (0, n * chunk - length)).reshape(n, chunk)
  rank = jax.lax.axis_index(axis_name) if rank is None else rank
  perm = [(i, (i + 1) % n) for i in range(n)]
  if permute is None:

    def permute(bits):
      return jax.lax.ppermute(bits, axis_name, perm)

  def send(v):  # bf16 -> the next rank, as 2 bytes per value
    bits = jax.lax.bitcast_convert_type(v, jnp.uint16)
    return jax.lax.bitcast_convert_type(permute(bits), jnp.bfloat16)

  # Reduce-scatter: rank r starts with chunk r, at step s adds chunk (r - s - 1) mod n.
  partial = chunks[rank]
  for s in range(n - 1):
    partial = send(partial.astype(jnp.bfloat16)).astype(jnp.float32) + chunks[(rank - s - 1) % n]
  # Rank r now owns chunk (r + 1) mod n; the all-gather forwards bf16 chunks unchanged.
  own = partial.astype(jnp.bfloat16)
  gathered = jnp.zeros((n, chunk), jnp.bfloat16).at[(rank + 1) % n].set(own)
  current = own
  for s in range(n - 1):
    current = send(current)
    gathered = gathered.at[(rank - s) % n].set(current)
  return gathered.reshape(-1)[:length].astype(dtype).reshape(shape)


def wire_bytes(num_values: int, n: int) -> int:
  """Bytes one rank sends: 2(N-1) chunks of ceil(L/N) bf16 values."""
  return 2 * (n - 1) * -(-num_values // n) * 2


def self_check(n: int = 8, length: int = 100_003) -> None:
  """The ring against the float64 sum; every rank must hold the same bits."""
  import jax
  import numpy as np
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  mesh = Mesh(np.array(jax.devices()[:n]), ("x",))
  rng = np.random.default_rng(0)
  for dtype in (np.float32, jax.numpy.bfloat16):
    x = rng.standard_normal((n, length)).astype(dtype)
    f = jax.jit(
      jax.shard_map(
        lambda v: bf16_ring_allreduce(v, "x", n), mesh=mesh, in_specs=P("x"), out_specs=P("x")
      )
    )
    out = np.asarray(f(x)).astype(np.float64)
    exact = x.astype(np.float64).sum(0)
    err = np.linalg.norm(out[0] - exact) / np.linalg.norm(exact)
    same = all(np.array_equal(out[0], out[r]) for r in range(n))
    # bf16 keeps 8 significant bits; a sum rounded N times lands near 3.5e-3 here.
    assert err < 1e-2 and same, (dtype, err, same)
    print(
      f"bf16 ring self-check, {n} ranks, {np.dtype(dtype).name}[{length}]: "
      f"relative error {err:.2e}, identical on every rank: {same}"
    )


if __name__ == "__main__":
  import argparse

  argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax

  jax.config.update("jax_num_cpu_devices", 8)
  self_check()
  sys.exit(0)
