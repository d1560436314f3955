"""TPU, on paper: what the TPU compiler itself estimates for the native and the rewritten all-reduce.

    python tools/bench_tpu.py                  # v5e:2x2 and v4:2x2x1, 1 and 32 MiB: ~5 minutes
    python tools/bench_tpu.py --topology v4:2x2x1 --sizes 1M 32M --scheme="--equarx_enable"
    python tools/bench_tpu.py --columns 1024   # [rows, 1024] per chip, as activations are
    python tools/bench_tpu.py --topology v5e:2x2 --sizes 32M --dtypes bf16 \
      --scheme=--equarx_enable --collectives-alone   # and what the collectives alone cost

No TPU is used or needed: libtpu compiles ahead of time for a named topology
(equarx_pass.frontends.tpu_aot.compile_for_target).  For each topology, message size and dtype,
a psum of a flat array (with --columns, a [rows, columns] one) over all chips is
compiled as it is and rewritten by each scheme in the form the pass emits for TPU
(--equarx_platform=tpu: the tiled forms of two-shot and the ring; --form flat for the
flat form).  Reported, all of it COMPILER ESTIMATES, not measurements:

  optimal_seconds   the TPU compiler's cost_analysis() estimate for one run
  flops, bytes accessed   the same cost analysis (on-chip work and HBM traffic)
  est. cycles       the sum of the per-instruction "estimated_cycles" the TPU
                    compiler writes into the compiled HLO, while-loop bodies
                    times their trip count
  temp MiB, peak MiB  the compiled program's memory statistics: temporary memory, and
                    the most it holds at once (arguments and results included; a
                    Pallas kernel's operands count in the peak, not in temp)
Neither of them prices the transfer over ICI: the all-reduce and the
collective-permutes carry no estimate.  So the table also gives the wire bytes
per chip (counted from the module, equarx_pass/ir/wire_bytes.py) and the link bandwidth
below which the rewrite pays according to these estimates:
  break-even GB/s = (native ring bytes - quantized bytes) / (extra optimal_seconds)
where the native ring sends the data's own type (bf16 or f32)
and, per rewritten program, its most expensive instructions by estimated cycles, so a
regression names its cause, and its async collectives (start ... done in the compiled
schedule) with how many have work scheduled while they are in flight.
The paper (EQuARX, arXiv 2506.17615) measured 1.8x over the bf16 all-reduce on
real TPUs; nothing here measures a TPU.

--collectives-alone adds three programs holding only an algorithm's collectives, on int8
codes already in (8, 128) tiles, one byte per value: two-shot's all_to_all of every
chip's codes and all_gather of a chip's share, the same with the f32 scales beside them
(one a row of 128, in their own all_to_all and all_gather, as the tiled and kernel forms
send them); the ring's 2 (N - 1) collective-permutes of a chip's share, one after the
other.  No quantization, no sum: the part of a form's
estimate that no emitted form of that algorithm can avoid.  A fourth, two-shot's passes
alone, adds the least local work: the operand cast to int8, the codes summed in int8, the
gathered codes cast back, each its own pass over HBM as every emitted form's stages are
(no scales, maxima or rotation): a floor under any such form's on-chip estimate.

Writes results/tpu.json (or --out) and a PNG plot next to it.
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


# The --collectives-alone programs' names in the rows' "scheme" field.
ALONE = (
  "two_shot collectives alone",
  "two_shot+scales collectives alone",
  "ring collectives alone",
  "two_shot passes alone",
)


def program_label(scheme: str) -> str:
  if scheme in ALONE:
    name = scheme.replace("_", "-").replace(" collectives", "'s collectives")
    if scheme.endswith("passes alone"):
      return "two-shot's passes alone (int8 casts)"
    return name.replace("+scales's", "'s") + (
      " (int8, f32 scales)" if "+scales" in name else " (int8)"
    )
  return benchlib.scheme_label(scheme) if scheme else "native all-reduce"


def collectives_alone(jax, n: int, values: int, algorithm: str):
  """The collectives of a site of `values` per chip over `n` chips, on int8 codes in
  (8, 128) tiles, nothing computed.  two_shot: every chip's codes through an all_to_all,
  a chip's share through an all_gather; two_shot+scales: the same, and beside them the
  f32 scales of the tiled and kernel forms ([rows / 8, 8], one a row of 128) through an
  all_to_all and an all_gather of their own.  ring: a chip's share through N - 1
  collective-permutes one after the other, twice (reduce-scatter, all-gather)."""

  rows = values // 128
  if values % 128 or rows % (8 * n):
    raise ValueError(f"{values} values per chip are not whole (8, 128) tiles per member")

  def two_shot(codes):
    gathered = jax.lax.all_to_all(codes.reshape(n, rows // n, 128), "x", 0, 0, tiled=True)
    return gathered, jax.lax.all_gather(codes[: rows // n], "x", tiled=True)

  def ring(codes):
    step = codes[: rows // n]
    sent = []
    for _ in range(2 * (n - 1)):
      step = jax.lax.ppermute(step, "x", [(i, (i + 1) % n) for i in range(n)])
      sent.append(step)
    return tuple(sent)

  def two_shot_scales(codes, scales):
    share = scales.reshape(n, rows // 8 // n, 8)
    return (
      *two_shot(codes),
      jax.lax.all_to_all(share, "x", 0, 0, tiled=True),
      jax.lax.all_gather(scales[: rows // 8 // n], "x", tiled=True),
    )

  exchange = {"two_shot": two_shot, "two_shot+scales": two_shot_scales, "ring": ring}[algorithm]
  args = [jax.ShapeDtypeStruct((n * rows, 128), jax.numpy.int8)]
  if algorithm == "two_shot+scales":
    args.append(jax.ShapeDtypeStruct((n * rows // 8, 8), jax.numpy.float32))
  return lowered_over_chips(jax, n, exchange, args)


def passes_alone(jax, n: int, values: int, dtype):
  """Two-shot over `values` of `dtype` per chip with its stages as separate passes and no
  arithmetic of its own: the operand cast to int8, an all_to_all, the members' codes
  summed in int8, an all_gather, a cast back.  No scales, maxima or rotation: the least a
  two-shot whose stages each read and write HBM (every form this pass emits) can cost on
  chip."""
  jnp = jax.numpy
  if values % (1024 * n):
    raise ValueError(f"{values} values per chip are not whole (8, 128) tiles per member")

  def passes(x):
    codes = x.reshape(n, -1, 8, 128).astype(jnp.int8)
    pieces = jax.lax.all_to_all(codes, "x", 0, 0, tiled=True)
    share = pieces.sum(0, dtype=jnp.int8)
    return jax.lax.all_gather(share, "x", tiled=True).astype(x.dtype).reshape(-1)

  return lowered_over_chips(jax, n, passes, [jax.ShapeDtypeStruct((n * values,), dtype)])


def lowered_over_chips(jax, n: int, body, args):
  """jax.jit of a shard_map of `body` over axis "x" of the first `n` devices, every
  argument and result split along its first axis, lowered for `args`: StableHLO."""
  import numpy as np
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  mesh = Mesh(np.array(jax.devices()[:n]), ("x",))
  specs = (P("x"),) * len(args)
  program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P("x")))
  return program.lower(*args).compiler_ir("stablehlo")


# Instructions that do no work of their own between an async collective's start and done.
_NO_WORK = ("get-tuple-element", "tuple", "bitcast", "parameter", "constant", "-start", "-done")


def overlap(hlo_text: str) -> dict:
  """For every async collective (`X-start` ... `X-done`) of the entry computation, in the
  compiled schedule's order: how many instructions that do work (fusions, dots, copies)
  the schedule puts between its start and its done, i.e. what can run while the transfer
  is in flight."""
  entry, inside = [], False
  for line in hlo_text.splitlines():
    if line.startswith("ENTRY "):
      inside = True
      continue
    if inside and line.startswith("}"):
      break
    if inside and " = " in line:
      name, rest = line.strip().removeprefix("ROOT ").split(" = ", 1)
      op = re.search(r"\s([\w-]+)\(", rest)
      entry.append((name, op.group(1) if op else "", rest))
  pairs = []
  for i, (name, op, _) in enumerate(entry):
    if not op.endswith("-start") or op == "copy-start":
      continue
    for j in range(i + 1, len(entry)):
      operands = entry[j][2].split("(", 1)[1][:200] if "(" in entry[j][2] else ""
      if entry[j][1].endswith("-done") and f"{name})" in operands:
        work = sum(1 for _, o, _ in entry[i + 1 : j] if o and not o.endswith(_NO_WORK))
        pairs.append((op.removesuffix("-start"), work))
        break
  return {
    "async_collectives": len(pairs),
    "with_work_between": sum(1 for _, w in pairs if w),
    "work_between": [w for _, w in pairs],
  }


def top_instructions(hlo_text: str, count: int = 8) -> list[tuple[float, str, str]]:
  """The `count` instructions with the most estimated cycles: (cycles, name, shape)."""
  found = []
  for line in hlo_text.splitlines():
    cycles = re.findall(r'"estimated_cycles":"(\d+)"', line)
    if cycles and " = " in line:
      name, rest = line.strip().split(" = ", 1)
      found.append((float(cycles[0]), name.removeprefix("ROOT ").strip(), rest.split(" ")[0][:80]))
  return sorted(found, reverse=True)[:count]


def topology_devices(topology: str) -> int:
  """Number of devices of a TPU topology, asked in a child process (libtpu stays out of
  this one)."""
  code = (
    "from jax.experimental import topologies; import sys; "
    "print(len(topologies.get_topology_desc(sys.argv[1], 'tpu').devices))"
  )
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  out = subprocess.run(
    [sys.executable, "-c", code, topology], capture_output=True, text=True, timeout=300, env=env
  )
  if out.returncode:
    raise SystemExit(f"cannot describe topology {topology}: {out.stderr.strip()[-300:]}")
  return int(out.stdout.strip().splitlines()[-1])


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  benchlib.add_scheme_argument(ap)
  ap.add_argument("--topology", nargs="+", default=["v5e:2x2", "v4:2x2x1"])
  ap.add_argument("--sizes", nargs="+", default=["1M", "32M"])
  ap.add_argument("--dtypes", nargs="+", default=["bf16", "f32"])
  ap.add_argument(
    "--form",
    default="auto",
    choices=["auto", "flat", "kernel"],
    help="the emitted form: auto (what a TPU gets: tiled where the scheme has a tiled "
    "form, or the scheme's own --equarx_form), flat (for comparison) or kernel (the tiled "
    "form with two-shot's quantize, sum and dequantize as Pallas kernels)",
  )
  ap.add_argument(
    "--columns",
    type=int,
    default=0,
    help="the operand per chip as [rows, COLUMNS], as activations and weights are, "
    "instead of a flat array (0)",
  )
  ap.add_argument(
    "--collectives-alone",
    action="store_true",
    help="also programs of two-shot's and the ring's collectives alone on int8 codes",
  )
  ap.add_argument("--out", default=os.path.join(benchlib.RESULTS, "tpu.json"))
  args = ap.parse_args()

  # libtpu allows one process at a time unless told otherwise; this process must
  # not load it (the compiles run in child processes), and others' may hold it.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  chips = {topology: topology_devices(topology) for topology in args.topology}
  import jax
  import numpy as np

  import equarx_pass
  from equarx_pass.frontends import tpu_aot
  from equarx_pass.ir import wire_bytes

  jax.config.update("jax_num_cpu_devices", max(chips.values()))
  schemes = args.scheme or [
    "--equarx_enable",  # the default scheme
    "--equarx_enable --equarx_rotation=none",  # int8 two-shot, no rotation
    benchlib.RING,  # int8 ring
    benchlib.RING + " --equarx_format=int4 --equarx_block_size=128",
  ]
  ok, missing = benchlib.split_schemes(schemes)
  print(
    f"{len(chips) * len(args.sizes) * len(args.dtypes) * (1 + len(ok))} ahead-of-time compiles",
    flush=True,
  )
  rows = []
  for topology, n in chips.items():
    target = f"tpu:{topology}"
    # A flat array per chip, as a bucket of gradients is; or [rows, columns] (--columns).
    f = benchlib.psum_program(n)
    for dtype_name in args.dtypes:
      dtype = benchlib.jnp_dtype(dtype_name)
      for size_text in args.sizes:
        size = benchlib.parse_size(size_text)
        values = size // np.dtype(dtype).itemsize
        shape = (n * values // args.columns, args.columns) if args.columns else (n * values,)
        module = f.lower(jax.ShapeDtypeStruct(shape, dtype)).compiler_ir("stablehlo")
        # What the native all-reduce sends: a ring in the data's own type.
        native_ring = 2 * (n - 1) * -(-values // n) * np.dtype(dtype).itemsize
        programs = [""] + ok + (list(ALONE) if args.collectives_alone else [])
        for scheme in programs:
          row = dict(
            topology=topology,
            dtype=dtype_name,
            size=size,
            shape_per_chip=[values // args.columns, args.columns] if args.columns else [values],
            scheme=scheme,
            native_ring_bytes=native_ring,
          )
          if scheme.endswith("passes alone"):
            mod = passes_alone(jax, n, values, dtype)
          elif scheme in ALONE:
            mod = collectives_alone(jax, n, values, scheme.split()[0])
          elif scheme:
            policy = equarx_pass.Policy.from_flags(scheme + " --equarx_min_bytes=0 --equarx_force")
            if args.form != "auto":
              policy = policy.replace(form=args.form)
            result = equarx_pass.rewrite_module(
              module, policy.replace(platform="tpu", form=policy.form)
            )
            mod = result.module
            row["form"] = result.records[0].reason
          else:
            mod = module
          # The native all-reduce in its own dtype, as a ring would send it.
          row["wire_bytes"] = wire_bytes.count_module(mod, n).bytes
          # The size of what the pass emits (the module as text), which a compile follows.
          row["module_bytes"] = len(str(mod))
          try:
            tc = tpu_aot.compile_for_target(str(mod), target)
          except Exception as e:
            rows.append(dict(row, error=f"{type(e).__name__}: {str(e)[:200]}"))
            print("  " + rows[-1]["error"], flush=True)
            continue
          row.update(
            compile_s=tc.seconds,
            permutes=tc.permutes,
            s8_permutes=tc.quantized_permutes,
            all_reduces=tc.all_reduces,
            cost=tc.cost,
            optimal_seconds=tc.cost.get("optimal_seconds"),
            temp_bytes=tc.temp_bytes,
            peak_bytes=tc.peak_bytes,
            flops=tc.cost.get("flops"),
            bytes_accessed=tc.cost.get("bytes accessed"),
            est_cycles=tpu_aot.estimated_cycles(tc.hlo_text),
            top_instructions=top_instructions(tc.hlo_text),
            overlap=overlap(tc.hlo_text),
          )
          rows.append(row)
          print(
            f"  {topology} {dtype_name} {benchlib.fmt_bytes(size):>8} "
            f"{program_label(scheme):<16} "
            f"optimal {row['optimal_seconds'] * 1e6:9.1f} us  compile {tc.seconds:.1f} s",
            flush=True,
          )
          if scheme not in ("",) + ALONE and size == max(map(benchlib.parse_size, args.sizes)):
            lap = row["overlap"]
            print(
              f"      async collectives {lap['async_collectives']}, with work scheduled "
              f"between start and done: {lap['with_work_between']}",
              flush=True,
            )
            for cycles, name, shape in row["top_instructions"][:4]:
              print(f"      {cycles:>9.0f} cycles  {name}  {shape}", flush=True)

  cols = [
    "topology",
    "dtype",
    "size",
    "program",
    "wire bytes/chip",
    "x less than native ring",
    "optimal_seconds (us)",
    "x native on chip",
    "HBM bytes",
    "x native HBM",
    "break-even GB/s",
    "compile s",
    "module KB",
    "temp MiB",
    "peak MiB",
  ]
  table_rows = []
  for r in rows:
    t = {
      "topology": r["topology"],
      "dtype": r["dtype"],
      "size": benchlib.fmt_bytes(r["size"]),
      "program": program_label(r["scheme"]),
      "wire bytes/chip": benchlib.fmt_bytes(r["wire_bytes"]),
      "module KB": f"{r['module_bytes'] / 1e3:.0f}",
      "temp MiB": f"{r['temp_bytes'] / 2**20:.1f}" if r.get("temp_bytes") is not None else "-",
      "peak MiB": f"{r['peak_bytes'] / 2**20:.1f}" if r.get("peak_bytes") else "-",
    }
    if "error" in r:
      t["optimal_seconds (us)"] = r["error"][:60]
      table_rows.append(t)
      continue
    native = next(
      (
        o
        for o in rows
        if o["dtype"] == r["dtype"]
        and o["size"] == r["size"]
        and o["topology"] == r["topology"]
        and not o["scheme"]
        and "optimal_seconds" in o
      ),
      None,
    )
    if r["scheme"]:
      t["x less than native ring"] = f"{r['native_ring_bytes'] / r['wire_bytes']:.2f}"
      if native:
        r["x_native_on_chip"] = r["optimal_seconds"] / native["optimal_seconds"]
        r["x_native_hbm"] = r["bytes_accessed"] / native["bytes_accessed"]
        t["x native on chip"] = f"{r['x_native_on_chip']:.2f}"
        t["x native HBM"] = f"{r['x_native_hbm']:.2f}"
        extra = r["optimal_seconds"] - native["optimal_seconds"]
        saved = r["native_ring_bytes"] - r["wire_bytes"]
        r["extra_optimal_seconds"] = extra
        if extra > 0:
          r["break_even_gbps"] = saved / extra / 1e9
          t["break-even GB/s"] = f"{r['break_even_gbps']:.1f}"
    t.update(
      {
        "optimal_seconds (us)": f"{r['optimal_seconds'] * 1e6:.1f}",
        "HBM bytes": benchlib.fmt_bytes(r["bytes_accessed"]),
        "compile s": f"{r['compile_s']:.1f}",
      }
    )
    table_rows.append(t)
  print(
    f"TPU compiler estimates for {', '.join(chips)} (not measurements; the paper measured "
    f"{PAPER_SPEEDUP}x over the bf16 all-reduce on TPUs)"
  )
  print(benchlib.table(table_rows, cols))
  if missing:
    print("not available in this checkout: " + ", ".join(benchlib.scheme_label(s) for s in missing))
  benchlib.write_results(
    args.out,
    rows,
    table_rows,
    cols,
    targets=list(chips),
    chips=chips,
    paper_speedup=PAPER_SPEEDUP,
    unavailable=missing,
  )
  plot(
    [r for r in rows if r["topology"] == args.topology[0]],
    os.path.splitext(args.out)[0] + ".png",
    f"tpu:{args.topology[0]}",
  )
  return 0


def plot(rows, path, target) -> None:
  plt = benchlib.pyplot()
  if plt is None:
    return
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), squeeze=False)
  for ax, dtype in zip(axes[0], ("bf16", "f32")):
    for scheme in dict.fromkeys(r["scheme"] for r in rows if r["dtype"] == dtype):
      pts = sorted(
        (r["size"], r["optimal_seconds"])
        for r in rows
        if r["dtype"] == dtype and r["scheme"] == scheme and r.get("optimal_seconds")
      )
      ax.plot(
        [p[0] / 2**20 for p in pts],
        [p[1] * 1e6 for p in pts],
        marker=".",
        label=program_label(scheme),
      )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title(f"{target}, {dtype}: compiler's optimal_seconds", fontsize=8)
    ax.set_xlabel("MiB per chip")
    ax.set_ylabel("estimate, us (no ICI time)")
  axes[0][0].legend(fontsize=7)
  benchlib.save_plot(fig, path)


if __name__ == "__main__":
  sys.exit(main())
