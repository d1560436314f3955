"""Extra compile cost of the partitioned route (compiler-inserted all-reduces).

    python tools/bench_auto_sharded.py [--reps 3] [--flags "--equarx_enable"]

Programs from equarx_pass/examples/auto_sharded.py on 8 CPU devices: the TP MLP
(x replicated) and the transformer block, both plain jax.jit + NamedSharding.
For each: lower + compile time of plain jax.jit, and of equarx_pass.jit split into
the compile that exposes the partitioned program, the pass (convert, rewrite,
rebuild) and the lowering + compile of the rewritten module; and, for scale, the
same computation written with shard_map + psum through equarx_pass.jit (the
lowered route, no extra compile); median of --reps fresh runs
(JAX's caches cleared in between).  Also the sites rewritten, the relative L2
error against plain jax.jit's output, and whether every device holds the same bits.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

import equarx_pass  # noqa: E402
from equarx_pass.examples import auto_sharded as ex  # noqa: E402


def timed(fn):
  start = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - start


def measure(name, fun, by_hand, args, flags, reps):
  plain_times, eq_times, first, passes, rewritten_compile, hand = [], [], [], [], [], []
  for _ in range(reps):
    jax.clear_caches()
    _, t = timed(lambda: equarx_pass.jit(by_hand, flags=flags).lower(*args).compile())
    hand.append(t)
    jax.clear_caches()
    _, t = timed(lambda: jax.jit(fun).lower(*args).compile())
    plain_times.append(t)
    jax.clear_caches()
    wrapped = equarx_pass.jit(fun, flags=flags)
    compiled, t = timed(lambda: wrapped.lower(*args).compile())
    eq_times.append(t)
    [low] = wrapped.report.lowerings
    first.append(low.first_compile_seconds)
    passes.append(low.pass_seconds)
    rewritten_compile.append(t - low.first_compile_seconds - low.pass_seconds)
  out = compiled(*args)
  want = np.asarray(jax.jit(fun)(*args), np.float64)
  err = np.linalg.norm(np.asarray(out, np.float64) - want) / np.linalg.norm(want)
  shards = [np.asarray(s.data).tobytes() for s in out.addressable_shards]
  med = statistics.median
  return dict(
    program=name,
    route=low.route,
    sites=f"{sum(r.rewritten for r in low.records)}/{len(low.records)}",
    plain=med(plain_times),
    equarx=med(eq_times),
    first=med(first),
    pass_=med(passes),
    rewritten=med(rewritten_compile),
    hand=med(hand),
    err=err,
    identical=all(s == shards[0] for s in shards),
  )


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=3)
  parser.add_argument("--flags", default="--equarx_enable")
  opts = parser.parse_args(argv)
  mesh = ex.tp_mesh()
  rows = [
    measure(
      "TP MLP 64x256, ffn 1024",
      ex.mlp,
      ex.mlp_by_hand(mesh),
      ex.mlp_inputs(mesh),
      opts.flags,
      opts.reps,
    ),
    measure(
      "transformer block 2x64x256",
      ex.block,
      ex.block_by_hand(mesh),
      ex.block_inputs(mesh),
      opts.flags,
      opts.reps,
    ),
  ]
  print(
    f"flags: {opts.flags}; median of {opts.reps}; 8 CPU devices; times in seconds (lower + compile)"
  )
  columns = [
    "program",
    "sites rewritten",
    "jax.jit",
    "equarx_pass.jit",
    "= partitioning compile + pass + lower and rewritten compile",
    "ratio",
    "same by hand (shard_map + psum), equarx_pass.jit",
    "rel. error vs jax.jit",
    "ranks identical",
  ]
  cells = [
    dict(
      zip(
        columns,
        [
          r["program"],
          r["sites"],
          f"{r['plain']:.3f}",
          f"{r['equarx']:.3f}",
          f"{r['first']:.3f} + {r['pass_']:.3f} + {r['rewritten']:.3f}",
          f"{r['equarx'] / r['plain']:.1f}x",
          f"{r['hand']:.3f}",
          f"{r['err']:.2e}",
          r["identical"],
        ],
      )
    )
    for r in rows
  ]
  print(benchlib.markdown_table(cells, columns))


if __name__ == "__main__":
  main()
