"""The ring step's arithmetic (Dq -> f32 add -> Q) on one device, against copy bandwidth.

    python tools/bench_gpu_step.py                          # CPU, about 1 minute
    python tools/bench_gpu_step.py --platform cuda      # writes results/ring_step_cuda.json

The GPU step: between two collective-permutes, every ring step dequantizes
the chunk it received, adds its own f32 chunk and quantizes the sum for the next
hop.  This tool emits exactly those ops with the pass's own emitter
(`ring.emit_ring_step` in equarx_pass/emission/algorithms/ring.py, the body of the reduce-scatter loop without the permute),
compiles them for the device alone and times them for large chunks, next to:
  - the device's copy bandwidth (a jitted f32 negate: one read and one write, the
    cheapest pass over the chunk), measured in the same run;
  - the time the chunk's payload takes on a few links (NVLink-class 450 GB/s,
    100 Gbit/s, 1 Gbit/s), so one can see whether the step hides behind the transfer.
Each step's output is checked against the NumPy model (equarx_pass/emission/ring_step.py): "model" says
"same bits", "same bits, no FMA" (the model with the product rounded before the add),
or how many codes and scales differ from the model.  The step needs no collective,
so one device is enough (`--platform cuda` needs jax[cuda] on the GPU machine).  Writes JSON (--out) and a PNG next to it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

SIZES = ["1M", "4M", "16M", "64M"]  # values per chunk
FORMAT_NAMES = ["int8", "int4", "fp8_e4m3"]
LINKS = {"450 GB/s": 450e9, "100 Gbit/s": 100e9 / 8, "1 Gbit/s": 1e9 / 8}


def timed(fn, args, calls: int, batch: int = 10) -> float:
  """Median over `calls` of the time per call of `batch` calls dispatched back to
  back, so the launch overhead of an asynchronous backend overlaps the work."""
  import jax

  jax.block_until_ready(fn(*args))  # warm-up
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    outs = [fn(*args) for _ in range(batch)]
    jax.block_until_ready(outs)
    times.append((time.perf_counter() - start) / batch)
  return sorted(times)[len(times) // 2]


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--sizes", nargs="+", default=SIZES, help="values per chunk (K/M suffixes)")
  ap.add_argument("--formats", nargs="+", default=FORMAT_NAMES)
  ap.add_argument("--block", type=int, default=1024)
  ap.add_argument("--calls", type=int, default=20)
  ap.add_argument("--platform", default="cpu", help="JAX platform: cpu, cuda, ...")
  ap.add_argument("--out", help="JSON path (default results/ring_step_<platform>.json)")
  ap.add_argument("--hlo-dir", help="also write each step's optimized HLO there")
  args = ap.parse_args()
  os.environ["JAX_PLATFORMS"] = args.platform  # before JAX starts: no TPU probing
  args.out = args.out or os.path.join(benchlib.RESULTS, f"ring_step_{args.platform}.json")

  import jax
  import numpy as np

  from equarx_pass.emission import quantize as qz
  from equarx_pass.emission import ring_step
  from equarx_pass.emission.formats import FORMATS

  device = jax.devices()[0]
  print(f"device: {device.platform} {device.device_kind}", flush=True)
  arithmetic = ring_step.backend_arithmetic()
  print(f"arithmetic: {arithmetic}", flush=True)
  negate = jax.jit(lambda x: -x)
  rng = np.random.default_rng(0)
  rows = []
  for size_text in args.sizes:
    c = benchlib.parse_size(size_text)
    local = rng.standard_normal((1, c), dtype=np.float32)
    local_dev = jax.device_put(local, device)
    copy_s = timed(negate, (local_dev,), args.calls)
    copy_gbs = 2 * 4 * c / copy_s / 1e9
    for fmt_name in args.formats:
      fmt = FORMATS[fmt_name]
      step, p = ring_step.step_program(c, args.block, fmt)
      if args.hlo_dir:
        os.makedirs(args.hlo_dir, exist_ok=True)
        with open(os.path.join(args.hlo_dir, f"step_{fmt_name}_{size_text}.hlo"), "w") as f:
          f.write(step.as_text())
      payload = ring_step.to_payload(
        *qz.quantize(rng.standard_normal((1, c), dtype=np.float32), args.block, fmt)
      )
      args_dev = (jax.device_put(payload, device), local_dev)
      step_s = timed(step, args_dev, args.calls)
      model = ring_step.compare(np.asarray(step(*args_dev)), payload, local, c, args.block, fmt)
      moved = 2 * p + 4 * c  # read payload and chunk, write payload
      row = dict(
        device=f"{device.platform} {device.device_kind}",
        values=c,
        format=fmt_name,
        payload_bytes=p,
        step_ms=step_s * 1e3,
        step_gbs=moved / step_s / 1e9,
        copy_ms=copy_s * 1e3,
        copy_gbs=copy_gbs,
        step_over_copy=step_s / copy_s,
        model=model,
        link_ms={name: p / rate * 1e3 for name, rate in LINKS.items()},
      )
      rows.append(row)
      print(
        "  "
        + ", ".join(
          f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
          for k, v in row.items()
          if k != "link_ms"
        ),
        flush=True,
      )

  cols = (
    [
      "values",
      "format",
      "payload",
      "step ms",
      "step GB/s",
      "f32 copy ms",
      "copy GB/s",
      "step / copy",
    ]
    + [f"send at {n} ms" for n in LINKS]
    + ["model"]
  )
  table_rows = [
    {
      "values": benchlib.fmt_bytes(r["values"]).replace("B", ""),
      "format": r["format"],
      "payload": benchlib.fmt_bytes(r["payload_bytes"]),
      "step ms": f"{r['step_ms']:.3f}",
      "step GB/s": f"{r['step_gbs']:.1f}",
      "f32 copy ms": f"{r['copy_ms']:.3f}",
      "copy GB/s": f"{r['copy_gbs']:.1f}",
      "step / copy": f"{r['step_over_copy']:.2f}",
      **{f"send at {n} ms": f"{r['link_ms'][n]:.3f}" for n in LINKS},
      "model": r["model"],
    }
    for r in rows
  ]
  print(benchlib.table(table_rows, cols, title=f"ring step on {rows[0]['device']}"))
  benchlib.write_results(
    args.out, rows, table_rows, cols, block=args.block, calls=args.calls, arithmetic=arithmetic
  )
  plot(rows, os.path.splitext(args.out)[0] + ".png")
  return 0 if all(r["model"].startswith("same bits") for r in rows) else 1


def plot(rows, path) -> None:
  plt = benchlib.pyplot()
  if plt is None:
    return
  fig, ax = plt.subplots(figsize=(6, 4))
  for fmt in sorted({r["format"] for r in rows}):
    mine = [r for r in rows if r["format"] == fmt]
    ax.plot([r["values"] for r in mine], [r["step_gbs"] for r in mine], "o-", label=f"step, {fmt}")
  copies = {r["values"]: r["copy_gbs"] for r in rows}
  ax.plot(sorted(copies), [copies[k] for k in sorted(copies)], "k--", label="f32 copy")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("values per chunk")
  ax.set_ylabel("GB/s moved (read + write)")
  ax.set_title(f"Dq -> add -> Q, {rows[0]['device']}")
  ax.legend()
  benchlib.save_plot(fig, path)


if __name__ == "__main__":
  sys.exit(main())
