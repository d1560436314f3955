"""Figures for a Megatron-style TP MLP on 8 CPU devices, per scheme.

    python tools/tp_mlp_report.py [--tokens 256] [--hidden 1024] [--ffn 4096] [--repeat 20]

x [tokens, hidden] (replicated) @ W1 [hidden, ffn] (column-parallel) -> gelu
-> @ W2 [ffn, hidden] (row-parallel) -> psum over 8 devices, Gaussian inputs.
Prints per scheme: sites rewritten, relative L2 error of the all-reduce result
against the float64 sum of the 8 devices' partial products (computed from the
same f32 partials), whether all devices hold identical bits, wire bits per
element (bytes each rank sends / values / 2(N-1)/N, so 16 = a bf16 ring), and
the pass time (median over --repeat rewrites of the lowered module).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

SCHEMES = [
  "--equarx_enable",  # the default
  "--equarx_enable --equarx_algorithm=ring --equarx_rotation=none",  # EQuARX ring
  "--equarx_enable --equarx_format=int4 --equarx_block_size=128",
]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tokens", type=int, default=256)
  parser.add_argument("--hidden", type=int, default=1024)
  parser.add_argument("--ffn", type=int, default=4096)
  parser.add_argument("--repeat", type=int, default=20)
  args = parser.parse_args(argv)

  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax

  jax.config.update("jax_num_cpu_devices", 8)
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import equarx_pass

  n = 8
  mesh = Mesh(np.array(jax.devices()[:n]), ("tp",))
  rng = np.random.default_rng(0)
  x = rng.standard_normal((args.tokens, args.hidden)).astype(np.float32)
  w1 = (rng.standard_normal((args.hidden, args.ffn)) / np.sqrt(args.hidden)).astype(np.float32)
  w2 = (rng.standard_normal((args.ffn, args.hidden)) / np.sqrt(args.ffn)).astype(np.float32)

  def partial(x, w1, w2):
    return jax.nn.gelu(x @ w1) @ w2

  def mlp(x, w1, w2):
    return jax.lax.psum(partial(x, w1, w2), "tp")

  specs = dict(mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)))
  program = jax.shard_map(mlp, out_specs=P(), **specs)
  # The exact all-reduce of the very partials the program sums: float64 sum of
  # each device's f32 partial product.
  partials = jax.jit(jax.shard_map(partial, out_specs=P("tp"), **specs))(x, w1, w2)
  exact = np.asarray(partials, np.float64).reshape(n, args.tokens, args.hidden).sum(0)

  print(
    f"TP MLP on {n} CPU devices: x[{args.tokens},{args.hidden}] @ W1[{args.hidden},"
    f"{args.ffn}] -> gelu -> @ W2[{args.ffn},{args.hidden}] -> psum; Gaussian inputs"
  )
  print(
    f"{'scheme':<60} {'sites':>7} {'rel. error':>11} {'identical':>9} "
    f"{'wire bits/elem':>15} {'pass ms':>8}"
  )
  native = np.asarray(jax.jit(program)(x, w1, w2), np.float64)
  print(
    f"{'jax.jit (native psum, f32)':<60} {'-':>7} "
    f"{np.linalg.norm(native - exact) / np.linalg.norm(exact):>11.2e} {'-':>9} "
    f"{32:>15.2f} {'-':>8}"
  )
  for flags in SCHEMES:
    fn = equarx_pass.jit(program, flags=flags)
    out = fn(x, w1, w2)
    shards = [np.asarray(s.data) for s in out.addressable_shards]
    identical = all(np.array_equal(shards[0], s) for s in shards[1:])
    err = np.linalg.norm(np.asarray(out, np.float64) - exact) / np.linalg.norm(exact)
    records = fn.report.records
    done = [r for r in records if r.rewritten]
    values = sum(int(np.prod(s)) for r in done for s in r.shapes)
    bits = 8 * sum(r.bytes_after for r in done) / (values * 2 * (n - 1) / n)
    module = jax.jit(program).lower(x, w1, w2).compiler_ir("stablehlo")
    times = [
      equarx_pass.rewrite_module(module, fn.policy, "cpu").seconds for _ in range(args.repeat)
    ]
    sites = f"{len(done)}/{len(records)}"
    print(
      f"{fn.policy.scheme.describe():<60} {sites:>7} {err:>11.2e} "
      f"{str(identical):>9} {bits:>15.2f} {statistics.median(times) * 1e3:>8.2f}"
    )
  return 0


if __name__ == "__main__":
  sys.exit(main())
