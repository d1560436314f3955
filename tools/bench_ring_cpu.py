"""The all-reduce's own compute on one host: P virtual CPU devices in one process.

    python tools/bench_ring_cpu.py                       # bf16 and f32, 16M values per device
    python tools/bench_ring_cpu.py --values 4M --dtypes bf16 --scheme="--equarx_enable"

No network: every permute is a memory copy, so what is timed is the arithmetic and the
memory traffic of each scheme, side by side with the bf16 ring (tools/bf16_ring.py) and
the native psum in the same run.  Per program: the median and the fastest of --calls
calls after one warm-up, and the process CPU time per call (all devices together; on a
machine with fewer cores than devices the wall time hides how much work was done).
This is the compute that an emulated host (tools/netbench.py) cannot overlap with its
link, measured without the link's noise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

RING = "--equarx_enable --equarx_algorithm=ring --equarx_rotation=none"
SCHEMES = (RING, RING + " --equarx_format=int4")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--devices", type=int, default=4)
  parser.add_argument("--values", default="16M", help="values per device (K/M suffixes)")
  parser.add_argument("--dtypes", nargs="+", default=["bf16", "f32"], choices=["bf16", "f32"])
  parser.add_argument("--calls", type=int, default=9)
  benchlib.add_scheme_argument(parser)
  parser.add_argument("--out", default=os.path.join(benchlib.RESULTS, "ring_cpu.json"))
  args = parser.parse_args(argv)
  # Before JAX starts.
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"
  )
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax
  import jax.numpy as jnp
  import numpy as np
  from bf16_ring import bf16_ring_allreduce
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  import equarx_pass

  values = benchlib.parse_size(args.values)
  count = benchlib.fmt_bytes(values).replace("B", "")  # "16 Mi", as bench_gpu_step prints it
  n = args.devices
  schemes, missing = benchlib.split_schemes(args.scheme or SCHEMES)
  mesh = Mesh(np.array(jax.devices()[:n]), ("x",))

  def per_device(f):
    return jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)

  psum = per_device(lambda v: jax.lax.psum(v, "x"))
  programs = [
    ("native", jax.jit(psum)),
    ("bf16 ring", jax.jit(per_device(lambda v: bf16_ring_allreduce(v, "x", n)))),
  ]
  # min_bytes 0: every scheme rewrites its one all-reduce whatever --values is.
  programs += [
    (benchlib.scheme_label(s), equarx_pass.jit(psum, flags=s + " --equarx_min_bytes=0"))
    for s in schemes
  ]

  rows = []
  for dtype_name in args.dtypes:
    dtype = {"bf16": jnp.bfloat16, "f32": jnp.float32}[dtype_name]
    x = jax.device_put(
      jnp.asarray(np.random.default_rng(0).standard_normal(n * values), dtype),
      NamedSharding(mesh, P("x")),
    )
    for name, f in programs:
      f(x).block_until_ready()
      times = []
      before = os.times()
      for _ in range(args.calls):
        start = time.perf_counter()
        f(x).block_until_ready()
        times.append(time.perf_counter() - start)
      after = os.times()
      cpu = (after.user + after.system - before.user - before.system) / args.calls
      rows.append(
        dict(
          dtype=dtype_name,
          program=name,
          values_per_device=values,
          devices=n,
          median_ms=float(np.median(times)) * 1e3,
          min_ms=min(times) * 1e3,
          cpu_ms_per_call=cpu * 1e3,
          calls=args.calls,
        )
      )
      print(f"  {dtype_name} {name}: {rows[-1]['median_ms']:.1f} ms", flush=True)

  columns = ["dtype", "program", "median ms", "min ms", "CPU ms/call", "bf16 ring / median"]
  ring_ms = {r["dtype"]: r["median_ms"] for r in rows if r["program"] == "bf16 ring"}
  table_rows = [
    {
      "dtype": r["dtype"],
      "program": r["program"],
      "median ms": f"{r['median_ms']:.1f}",
      "min ms": f"{r['min_ms']:.1f}",
      "CPU ms/call": f"{r['cpu_ms_per_call']:.0f}",
      "bf16 ring / median": f"{ring_ms[r['dtype']] / r['median_ms']:.2f}",
    }
    for r in rows
  ]
  print(
    benchlib.table(
      table_rows,
      columns,
      f"all-reduce compute, {n} CPU devices in one process, {count} values per device",
    )
  )
  for scheme, why in missing.items():
    print(f"  {scheme}: {why}")
  benchlib.write_results(
    args.out, rows, table_rows, columns, devices=n, values=values, unavailable=missing
  )
  plt = benchlib.pyplot()
  if plt is not None:
    fig, axes = plt.subplots(
      1, len(args.dtypes), figsize=(5 * len(args.dtypes), 3.5), squeeze=False
    )
    for ax, dtype_name in zip(axes[0], args.dtypes):
      mine = [r for r in rows if r["dtype"] == dtype_name]
      ax.barh([r["program"] for r in mine], [r["median_ms"] for r in mine])
      ax.set_xlabel("median ms per call")
      ax.set_title(f"{dtype_name}, {n} devices, {count} values each")
    benchlib.save_plot(fig, os.path.splitext(args.out)[0] + ".png")
  return 0


if __name__ == "__main__":
  sys.exit(main())
