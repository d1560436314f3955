"""A reference for the benchmarks: the hierarchical int8 all-reduce written by hand in jnp.

    python tools/int8_reference.py        # self-check on 8 virtual CPU devices (2 x 4)

What a user could write without the pass, inside shard_map: a native reduce-scatter over
the fast axis, an int8 two-shot all-reduce of each 1/k piece over the slow axis (absmax
scale per 128 values, f32; all_to_all of codes and scales, an f32 sum, requantize,
all_gather), a native all-gather over the fast axis.  No rotation.  The network benchmark
and the multislice benchmark run it beside the pass, so the pass's figures have a plain
baseline with the same bytes on the slow links.
"""

from __future__ import annotations

import argparse
import os
import sys

BLOCK = 128


def _quantize(x):
  """x: [..., 128] f32 -> int8 codes and one f32 scale per row."""
  import jax.numpy as jnp

  scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 127.0
  codes = jnp.round(x / jnp.where(scale == 0, 1.0, scale)).astype(jnp.int8)
  return codes, scale


def hierarchical_int8(v, fast: str, slow: str, fast_size: int, slow_size: int):
  """psum(v, (slow, fast)) of a 1-D v; call inside shard_map.  Same shape and dtype.

  fast_size, slow_size: the axes' sizes (devices per domain, domains)."""
  import jax
  import jax.numpy as jnp

  size = v.shape[0]
  unit = fast_size * slow_size * BLOCK
  padded = jnp.pad(v, (0, -size % unit))
  piece = jax.lax.psum_scatter(padded, fast, scatter_dimension=0, tiled=True)  # native
  x = piece.astype(jnp.float32).reshape(slow_size, -1, BLOCK)
  codes, scales = _quantize(x)
  codes = jax.lax.all_to_all(codes, slow, 0, 0)  # int8 across domains
  scales = jax.lax.all_to_all(scales, slow, 0, 0)
  part = jnp.sum(codes.astype(jnp.float32) * scales, axis=0)  # f32 sum of the domain pieces
  codes, scales = _quantize(part)
  codes = jax.lax.all_gather(codes, slow)  # int8 across domains
  scales = jax.lax.all_gather(scales, slow)
  piece = (codes.astype(jnp.float32) * scales).reshape(-1).astype(v.dtype)
  return jax.lax.all_gather(piece, fast, tiled=True)[:size]  # native


def main() -> int:
  argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  mesh = jax.make_mesh((2, 4), ("slow", "fast"))
  spec = P(("slow", "fast"))
  x = np.random.default_rng(0).standard_normal((8, 100_000)).astype(np.float32)

  def body(v):
    return hierarchical_int8(v.reshape(-1), "fast", "slow", 4, 2)[None]

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
  out = np.asarray(f(jax.device_put(x, NamedSharding(mesh, spec))))
  want = x.astype(np.float64).sum(0)
  err = np.linalg.norm(out[0] - want) / np.linalg.norm(want)
  same = all(np.array_equal(out[0], row) for row in out)
  print(f"hierarchical int8 psum over 2 x 4 devices: relative error {err:.2e}, same: {same}")
  return 0 if err < 2e-2 and same else 1


if __name__ == "__main__":
  sys.exit(main())
