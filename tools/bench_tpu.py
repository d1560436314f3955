"""TPU, on paper: what the TPU compiler itself estimates for the native and the rewritten all-reduce.

    python tools/bench_tpu.py                  # about 8 minutes (libtpu compiles: 0.5 s to 200 s)
    python tools/bench_tpu.py --topology v4:2x2x1 --sizes 1M 32M

No TPU is used or needed: libtpu compiles ahead of time for a named topology
(equarx_pass.compile.compile_for_target).  For each message size and dtype, a
psum over all chips of the topology is compiled as it is and rewritten by each
scheme.  Reported, all of it COMPILER ESTIMATES, not measurements:

  optimal_seconds   the TPU compiler's cost_analysis() estimate for one run
  flops, bytes accessed   the same cost analysis (on-chip work and HBM traffic)
  est. cycles       the sum of the per-instruction "estimated_cycles" the TPU
                    compiler writes into the compiled HLO, while-loop bodies
                    times their trip count
Neither of them prices the transfer over ICI: the all-reduce and the
collective-permutes carry no estimate.  So the table also gives the wire bytes
per chip (counted from the module, tools/wire_bytes.py) and the link bandwidth
below which the rewrite pays according to these estimates:
  break-even GB/s = (bf16 ring bytes - quantized bytes) / (extra optimal_seconds)
The paper (EQuARX, arXiv 2506.17615) measured 1.8x over the bf16 all-reduce on
real TPUs; nothing here measures a TPU.

Writes docs/tpu.json (or --out) and a PNG plot next to it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

PAPER_SPEEDUP = 1.8


def estimated_cycles(hlo_text: str) -> float:
  """Sum of estimated_cycles over the entry computation, loop bodies x trip count."""
  comps, current, name = {}, None, None
  for line in hlo_text.splitlines():
    m = re.match(r"^(ENTRY )?%(\S+) .*\{$", line)
    if m:
      name = "ENTRY" if m.group(1) else m.group(2)
      current = comps.setdefault(name, [])
      continue
    if line.startswith("}"):
      current = None
      continue
    if current is not None:
      current.append(line)

  def own_cycles(lines):
    return sum(float(c) for l in lines for c in re.findall(r'"estimated_cycles":"(\d+)"', l))

  def trip_count(cond):
    consts = [int(c) for l in comps.get(cond, []) for c in re.findall(r"constant\((\d+)\)", l)]
    lt = any("direction=LT" in l for l in comps.get(cond, []))
    return consts[0] if lt and len(consts) == 1 else 1

  def total(comp, depth=0):
    lines = comps.get(comp, [])
    cycles = own_cycles(lines)
    if depth > 8:
      return cycles
    for l in lines:
      m = re.search(r"condition=%([^,\s]+), body=%([^,\s]+)", l)
      if m:
        cycles += trip_count(m.group(1)) * total(m.group(2), depth + 1)
    return cycles

  return total("ENTRY")


def topology_devices(topology: str) -> int:
  """Number of devices of a TPU topology, asked in a child process (libtpu stays out of
  this one)."""
  code = ("from jax.experimental import topologies; import sys; "
          "print(len(topologies.get_topology_desc(sys.argv[1], 'tpu').devices))")
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  out = subprocess.run([sys.executable, "-c", code, topology], capture_output=True, text=True,
                       timeout=300, env=env)
  if out.returncode:
    raise SystemExit(f"cannot describe topology {topology}: {out.stderr.strip()[-300:]}")
  return int(out.stdout.strip().splitlines()[-1])


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  benchlib.add_scheme_argument(ap)
  ap.add_argument("--topology", default="v5e:2x2")
  ap.add_argument("--sizes", nargs="+", default=["64K", "1M", "8M", "32M"])
  ap.add_argument("--dtypes", nargs="+", default=["bf16", "f32"])
  ap.add_argument("--out", default=os.path.join(benchlib.DOCS, "tpu.json"))
  args = ap.parse_args()

  # libtpu allows one process at a time unless told otherwise; this process must
  # not load it (the compiles run in child processes), and others' may hold it.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  n = topology_devices(args.topology)
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  import equarx_pass
  import wire_bytes
  from equarx_pass import compile as compile_lib

  jax.config.update("jax_num_cpu_devices", n)
  mesh = Mesh(np.array(jax.devices()[:n]), ("x",))
  f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "x"), mesh=mesh,
                            in_specs=P("x"), out_specs=P("x")))
  # The default scheme's Hadamard rotation takes minutes per size to compile for TPU
  # (127 s at 1 MiB): ask for it with --scheme and small --sizes.
  schemes = args.scheme or [benchlib.RING, benchlib.RING + " --equarx_format=int4"]
  ok, missing = benchlib.split_schemes(schemes)
  target = f"tpu:{args.topology}"
  print(f"{target}: {n} chips; {len(args.sizes) * len(args.dtypes) * (1 + len(ok))} "
        "ahead-of-time compiles", flush=True)
  rows = []
  for dtype_name in args.dtypes:
    dtype = {"bf16": jnp.bfloat16, "f32": jnp.float32}[dtype_name]
    for size_text in args.sizes:
      size = benchlib.parse_size(size_text)
      values = size // np.dtype(dtype).itemsize
      module = f.lower(jax.ShapeDtypeStruct((n, values), dtype)).compiler_ir("stablehlo")
      bf16_ring = 2 * (n - 1) * -(-values // n) * 2
      for scheme in [""] + ok:
        row = dict(topology=args.topology, dtype=dtype_name, size=size, scheme=scheme,
                   bf16_ring_bytes=bf16_ring)
        if scheme:
          policy = equarx_pass.Policy.from_flags(scheme + " --equarx_min_bytes=0")
          mod = equarx_pass.rewrite_module(module, policy).module
          row["wire_bytes"] = wire_bytes.count_module(mod, n).bytes
        else:
          mod = module
          # The native all-reduce in its own dtype, as a ring would send it.
          row["wire_bytes"] = wire_bytes.count_module(mod, n).bytes
        try:
          tc = compile_lib.compile_for_target(str(mod), target)
        except Exception as e:
          rows.append(dict(row, error=f"{type(e).__name__}: {str(e)[:200]}"))
          print("  " + rows[-1]["error"], flush=True)
          continue
        row.update(compile_s=tc.seconds, permutes=tc.permutes, s8_permutes=tc.quantized_permutes,
                   all_reduces=tc.all_reduces, cost=tc.cost,
                   optimal_seconds=tc.cost.get("optimal_seconds"),
                   flops=tc.cost.get("flops"), bytes_accessed=tc.cost.get("bytes accessed"),
                   est_cycles=estimated_cycles(tc.hlo_text))
        rows.append(row)
        print(f"  {dtype_name} {benchlib.fmt_bytes(size):>8} "
              f"{benchlib.scheme_label(scheme) if scheme else 'native':<12} "
              f"optimal {row['optimal_seconds'] * 1e6:9.1f} us  compile {tc.seconds:.1f} s",
              flush=True)

  cols = ["dtype", "size", "program", "wire bytes/chip", "x less than bf16 ring",
          "optimal_seconds (us)", "est. cycles", "flops", "HBM bytes", "break-even GB/s",
          "compile s"]
  table_rows = []
  for r in rows:
    t = {"dtype": r["dtype"], "size": benchlib.fmt_bytes(r["size"]),
         "program": benchlib.scheme_label(r["scheme"]) if r["scheme"] else "native all-reduce",
         "wire bytes/chip": benchlib.fmt_bytes(r["wire_bytes"])}
    if "error" in r:
      t["optimal_seconds (us)"] = r["error"][:60]
      table_rows.append(t)
      continue
    native = next((o for o in rows if o["dtype"] == r["dtype"] and o["size"] == r["size"]
                   and not o["scheme"] and "optimal_seconds" in o), None)
    if r["scheme"]:
      t["x less than bf16 ring"] = f"{r['bf16_ring_bytes'] / r['wire_bytes']:.2f}"
      if native:
        extra = r["optimal_seconds"] - native["optimal_seconds"]
        saved = r["bf16_ring_bytes"] - r["wire_bytes"]
        r["extra_optimal_seconds"] = extra
        if extra > 0:
          r["break_even_gbps"] = saved / extra / 1e9
          t["break-even GB/s"] = f"{r['break_even_gbps']:.1f}"
    t.update({"optimal_seconds (us)": f"{r['optimal_seconds'] * 1e6:.1f}",
              "est. cycles": f"{r['est_cycles']:.0f}", "flops": f"{r['flops']:.3g}",
              "HBM bytes": benchlib.fmt_bytes(r["bytes_accessed"]),
              "compile s": f"{r['compile_s']:.1f}"})
    table_rows.append(t)
  print(f"TPU compiler estimates for {target} (not measurements; the paper measured "
        f"{PAPER_SPEEDUP}x over the bf16 all-reduce on TPUs)")
  print(benchlib.table(table_rows, cols))
  if missing:
    print("not available in this checkout: " + ", ".join(benchlib.scheme_label(s) for s in missing))
  benchlib.write_results(args.out, rows, table_rows, cols, target=target, chips=n,
                         paper_speedup=PAPER_SPEEDUP, unavailable=missing)
  plot(rows, os.path.splitext(args.out)[0] + ".png", target)
  return 0


def plot(rows, path, target) -> None:
  plt = benchlib.pyplot()
  if plt is None:
    return
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), squeeze=False)
  for ax, dtype in zip(axes[0], ("bf16", "f32")):
    for scheme in dict.fromkeys(r["scheme"] for r in rows if r["dtype"] == dtype):
      pts = sorted((r["size"], r["optimal_seconds"]) for r in rows if r["dtype"] == dtype
                   and r["scheme"] == scheme and r.get("optimal_seconds"))
      ax.plot([p[0] / 2 ** 20 for p in pts], [p[1] * 1e6 for p in pts], marker=".",
              label=benchlib.scheme_label(scheme) if scheme else "native all-reduce")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title(f"{target}, {dtype}: compiler's optimal_seconds", fontsize=8)
    ax.set_xlabel("MiB per chip")
    ax.set_ylabel("estimate, us (no ICI time)")
  axes[0][0].legend(fontsize=7)
  benchlib.save_plot(fig, path)


if __name__ == "__main__":
  sys.exit(main())
