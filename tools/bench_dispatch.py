"""Per-call Python dispatch overhead of equarx_pass.jit against jax.jit, on a warm call.

    python tools/bench_dispatch.py            # about 30 s; writes results/dispatch.json

Both wrappers run the same executable: the pass is enabled with a --equarx_min_bytes no
site reaches, so equarx_pass.jit compiles the program jax.jit lowered, unchanged.  What
differs is the path from the Python call to the executable: jax.jit's C++ fast path,
against equarx_pass.jit's cache lookup (the arguments' pytree and abstract values) and
then the compiled stage's own C++ call.  The pass-disabled wrapper, which forwards to
its jax.jit object, is timed too.

Per program: `--repeats` rounds, each timing `--calls` back-to-back calls of every
wrapper in turn (interleaved, so the machine's load hits all of them alike); a call's
time is the round's total over --calls.  Reported: the median per-call time of each,
and the median over rounds of equarx_pass.jit's time minus jax.jit's (the overhead).
Programs: one f32[128] array on one device, and a pytree of 16 such arrays (the cache
key is computed per leaf).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

OFF_FLAGS = "--equarx_enable --equarx_min_bytes=1099511627776"  # enabled, nothing selected


def programs():
  import jax.numpy as jnp

  one = (jnp.ones((128,), jnp.float32),)
  tree = ({f"w{i}": jnp.full((128,), float(i), jnp.float32) for i in range(16)},)
  return {
    "1 array": (lambda x: x * 2.0 + 1.0, one),
    "16-leaf pytree": (lambda p: {k: v * 2.0 + 1.0 for k, v in p.items()}, tree),
  }


def time_round(fn, args, calls: int) -> float:
  import jax

  start = time.perf_counter()
  for _ in range(calls):
    out = fn(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / calls


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--calls", type=int, default=2000, help="calls per round")
  parser.add_argument("--repeats", type=int, default=15, help="rounds")
  parser.add_argument("--out", default=os.path.join(benchlib.RESULTS, "dispatch.json"))
  args = parser.parse_args(argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax

  import equarx_pass

  rows = []
  load_before = os.getloadavg()[0]
  for name, (fun, inputs) in programs().items():
    wrappers = {
      "jax.jit": jax.jit(fun),
      "equarx_pass.jit, enabled": equarx_pass.jit(fun, flags=OFF_FLAGS),
      "equarx_pass.jit, disabled": equarx_pass.jit(fun),
    }
    with warnings.catch_warnings():
      # "nothing was rewritten": on purpose here (the same executable as jax.jit's).
      warnings.simplefilter("ignore", equarx_pass.EquarxWarning)
      for fn in wrappers.values():  # compile, then warm up
        time_round(fn, inputs, 100)
    times: dict[str, list[float]] = {w: [] for w in wrappers}
    for _ in range(args.repeats):
      for label, fn in wrappers.items():
        times[label].append(time_round(fn, inputs, args.calls))
    base = times["jax.jit"]
    for label, samples in times.items():
      extra = [s - b for s, b in zip(samples, base)]
      rows.append(
        dict(
          program=name,
          wrapper=label,
          us_per_call=statistics.median(samples) * 1e6,
          us_min=min(samples) * 1e6,
          overhead_us=statistics.median(extra) * 1e6,
        )
      )
  table = [
    {
      "program": r["program"],
      "wrapper": r["wrapper"],
      "median us/call": f"{r['us_per_call']:.2f}",
      "min us/call": f"{r['us_min']:.2f}",
      "over jax.jit, us": "" if r["wrapper"] == "jax.jit" else f"{r['overhead_us']:+.2f}",
    }
    for r in rows
  ]
  columns = ["program", "wrapper", "median us/call", "min us/call", "over jax.jit, us"]
  print(benchlib.table(table, columns, title="warm calls, one CPU device"))
  # The 1-minute load average before and after: other jobs on the cores stretch Python.
  benchlib.write_results(
    args.out,
    rows,
    table,
    columns,
    calls=args.calls,
    repeats=args.repeats,
    load_average=[load_before, os.getloadavg()[0]],
  )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
