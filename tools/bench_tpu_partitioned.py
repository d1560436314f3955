"""Auto-sharded training steps compiled for multislice TPU, natively and through the pass.

    python tools/bench_tpu_partitioned.py                       # v5e:2x2 and v5e:4x4, 2 slices
    python tools/bench_tpu_partitioned.py --topologies v5e:4x4 --slices 2 4 --dtypes bf16

No TPU is used: libtpu compiles ahead of time for named topologies.  The program is
equarx_pass/examples/fsdp_step.py's SGD step (jax.jit, NamedSharding, FSDP inside a
slice, data parallel across slices: the partitioner writes every collective), lowered and
compiled with plain jax.jit and with equarx_pass.jit under --flags, one after the other
in this process.  Per row:

  dcn MiB        bytes per chip per step sent between slices, counted from each compiled
                 program's cross-slice host transfers (tpu_aot.cross_slice_bytes)
  compile s      lower + compile, wall clock (the machine's load moves it)
  on-chip added  the TPU compiler's per-instruction estimated cycles, rewritten minus
                 native, at 1.5 GHz: ESTIMATES, no TPU ran them
  dcn saved      the bytes saved at the DCN figure the cost model uses (3.125 GB/s a chip)
  peak MiB       the compiled programs' peak device memory

Writes results/tpu_partitioned.json (or --out).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402

from equarx_pass.frontends.tpu_aot import estimated_cycles  # noqa: E402

# The TPU clock the estimated cycles are converted at (v5e: 1.5 GHz).
CLOCK_HZ = 1.5e9
COLUMNS = [
  "topology",
  "dtype",
  "sites",
  "dcn MiB native",
  "dcn MiB pass",
  "dcn ratio",
  "compile s native",
  "compile s pass",
  "compile ratio",
  "on-chip added ms",
  "dcn saved ms",
  "added/saved",
  "peak ratio",
]


def measure(topology: str, slices: int, dtype_name: str, flags: str) -> dict:
  import jax
  from jax.experimental import topologies

  import equarx_pass
  from equarx_pass.examples import fsdp_step
  from equarx_pass.frontends.tpu_aot import cross_slice_bytes

  desc = topologies.get_topology_desc(platform="tpu", topology_name=topology, num_slices=slices)
  mesh = fsdp_step.hybrid_mesh(desc.devices, slices)
  step, args = fsdp_step.sgd_step(mesh, benchlib.jnp_dtype(dtype_name))
  outs = fsdp_step.out_shardings(mesh)
  row: dict = {"topology": f"{topology} x{slices}", "dtype": dtype_name}
  compiled = {}
  for name, fn in (
    ("native", jax.jit(step, out_shardings=outs)),
    ("pass", equarx_pass.jit(step, flags=flags, out_shardings=outs)),
  ):
    start = time.perf_counter()
    compiled[name] = fn.lower(*args).compile()
    row[f"compile s {name}"] = round(time.perf_counter() - start, 2)
    text = compiled[name].as_text()
    row[f"dcn MiB {name}"] = round(cross_slice_bytes(text, slices) / 2**20, 2)
    row[f"cycles {name}"] = estimated_cycles(text)
    row[f"peak {name}"] = compiled[name].memory_analysis().peak_memory_in_bytes
    if name == "pass":
      records = fn.report.records
      row["sites"] = f"{sum(r.rewritten for r in records)}/{len(records)}"
      gb_per_s = fn.report.lowerings[0].topology.slow.gbytes_per_s
  row["dcn ratio"] = round(row["dcn MiB pass"] / row["dcn MiB native"], 3)
  row["compile ratio"] = round(row["compile s pass"] / row["compile s native"], 2)
  added = (row["cycles pass"] - row["cycles native"]) / CLOCK_HZ
  saved = (row["dcn MiB native"] - row["dcn MiB pass"]) * 2**20 / (gb_per_s * 1e9)
  row["on-chip added ms"] = round(added * 1e3, 3)
  row["dcn saved ms"] = round(saved * 1e3, 3)
  row["added/saved"] = round(added / saved, 3) if saved > 0 else None
  row["peak ratio"] = round(row["peak pass"] / row["peak native"], 3)
  return row


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--topologies", nargs="+", default=["v5e:2x2", "v5e:4x4"])
  parser.add_argument("--slices", nargs="+", type=int, default=[2])
  parser.add_argument("--dtypes", nargs="+", default=["f32", "bf16"])
  parser.add_argument("--flags", default="--equarx_enable")
  parser.add_argument("--out", default=os.path.join("results", "tpu_partitioned.json"))
  args = parser.parse_args(argv)
  if min(args.slices) < 2:
    parser.error("--slices: 2 or more (the tool counts the bytes between slices)")
  rows = []
  for topology in args.topologies:
    for slices in args.slices:
      for dtype in args.dtypes:
        rows.append(measure(topology, slices, dtype, args.flags))
        print(benchlib.table(rows[-1:], COLUMNS), flush=True)
  title = (
    f"FSDP + data-parallel SGD step, {args.flags}; TPU figures are the TPU compiler's "
    "estimates (compile-only, no TPU)"
  )
  print("\n" + benchlib.table(rows, COLUMNS, title))
  benchlib.write_results(args.out, rows, rows, COLUMNS, flags=args.flags)
  return 0


if __name__ == "__main__":
  sys.exit(main())
