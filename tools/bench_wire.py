"""Wire bytes per rewritten all-reduce, counted from the rewritten module.

    python tools/bench_wire.py                      # about 30 s
    python tools/bench_wire.py --scheme="--equarx_enable --equarx_format=int4"

For each group size, dtype and message size, one psum in a shard_map is lowered,
rewritten with each scheme, and the bytes one rank sends are counted from the
collective ops of the rewritten module (equarx_pass/ir/wire_bytes.py: every
collective_permute, all_gather, all_to_all, ... times the trip counts of the
while loops around it).  Compared with a bf16 ring all-reduce of the same tensor
(2(N-1) chunks of ceil(L/N) values, 2 bytes each) and with what the pass's own
report claims (SiteRecord.bytes_after).  Limits: int8 + an f32 scale per 1024
values is 8.03 bits, 1.99x less than bf16; int4 4.03 bits, 3.97x.

Writes results/wire_bytes.json (or --out) and a PNG plot next to it.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

SIZES = ["4K", "64K", "1M", "8M", "32M"]


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  benchlib.add_scheme_argument(ap)
  ap.add_argument("--groups", nargs="+", type=int, default=[4, 8])
  ap.add_argument("--sizes", nargs="+", default=SIZES, help="bytes per device")
  ap.add_argument("--dtypes", nargs="+", default=["bf16", "f32"])
  ap.add_argument("--out", default=os.path.join(benchlib.RESULTS, "wire_bytes.json"))
  args = ap.parse_args()

  import jax

  jax.config.update("jax_num_cpu_devices", max(args.groups))
  import numpy as np

  import equarx_pass
  from equarx_pass.ir import wire_bytes

  schemes = args.scheme or list(benchlib.DEFAULT_SCHEMES)
  rows = []
  for n in args.groups:
    f = benchlib.psum_program(n)
    for dtype_name in args.dtypes:
      dtype = benchlib.jnp_dtype(dtype_name)
      for size_text in args.sizes:
        size = benchlib.parse_size(size_text)
        values = size // np.dtype(dtype).itemsize
        module = f.lower(jax.ShapeDtypeStruct((n, values), dtype)).compiler_ir("stablehlo")
        bf16_ring = 2 * (n - 1) * -(-values // n) * 2
        native = wire_bytes.count_module(module, n).bytes
        for scheme in schemes:
          row = dict(
            group=n,
            dtype=dtype_name,
            size=size,
            scheme=scheme,
            label=benchlib.scheme_label(scheme),
            bf16_ring=bf16_ring,
            native_logical=native,
          )
          why = benchlib.check_scheme(scheme)
          if why:
            rows.append(dict(row, error=why))
            continue
          policy = equarx_pass.Policy.from_flags(scheme + " --equarx_min_bytes=0")
          result = equarx_pass.rewrite_module(module, policy)
          count = wire_bytes.count_module(result.module, n)
          rec = result.records[0]
          rows.append(
            dict(
              row,
              counted=count.bytes,
              reported=rec.bytes_after,
              by_kind=count.by_kind(),
              unknown_loops=count.unknown_trip_counts,
              ratio=bf16_ring / count.bytes if count.bytes else None,
              bits_per_value=count.bytes * 8 / (2 * (n - 1) * -(-values // n)),
              pass_ms=result.seconds * 1e3,
            )
          )

  cols = [
    "N",
    "dtype",
    "size",
    "scheme",
    "bytes sent/rank",
    "bf16 ring",
    "x less than bf16 ring",
    "bits/value",
    "report agrees",
  ]
  table_rows = []
  for r in rows:
    t = {
      "N": r["group"],
      "dtype": r["dtype"],
      "size": benchlib.fmt_bytes(r["size"]),
      "scheme": r["label"],
      "bf16 ring": benchlib.fmt_bytes(r["bf16_ring"]),
    }
    if "error" in r:
      continue
    else:
      agrees = abs(r["counted"] - r["reported"]) < 0.5 and not r["unknown_loops"]
      t.update(
        {
          "bytes sent/rank": benchlib.fmt_bytes(r["counted"]),
          "x less than bf16 ring": f"{r['ratio']:.3f}",
          "bits/value": f"{r['bits_per_value']:.3f}",
          "report agrees": "yes"
          if agrees
          else f"NO (report {r['reported']}, loops unknown {r['unknown_loops']})",
        }
      )
    table_rows.append(t)
  print(benchlib.table(table_rows, cols))
  missing = sorted({r["label"] for r in rows if "error" in r})
  if missing:
    print("not available in this checkout: " + ", ".join(missing))
  benchlib.write_results(args.out, rows, table_rows, cols)
  plot(rows, os.path.splitext(args.out)[0] + ".png")
  return 0


def plot(rows, path) -> None:
  plt = benchlib.pyplot()
  if plt is None:
    return
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), squeeze=False)
  for ax, dtype in zip(axes[0], ("bf16", "f32")):
    for n, label in dict.fromkeys(
      (r["group"], r["label"]) for r in rows if "ratio" in r and r["dtype"] == dtype
    ):
      pts = sorted(
        (r["size"], r["ratio"])
        for r in rows
        if r.get("ratio") and r["group"] == n and r["label"] == label and r["dtype"] == dtype
      )
      ax.plot([p[0] / 2**20 for p in pts], [p[1] for p in pts], marker=".", label=f"{label}, N={n}")
    for limit, name in ((16 / (8 + 32 / 1024), "int8 limit"), (16 / (4 + 32 / 1024), "int4 limit")):
      ax.axhline(limit, color="grey", lw=0.5, ls=":")
      ax.text(2**-8, limit, name, fontsize=6, va="bottom")
    ax.set_xscale("log", base=2)
    ax.set_title(f"{dtype} all-reduce")
    ax.set_xlabel("MiB per device")
    ax.set_ylabel("bytes of a bf16 ring / bytes sent")
  axes[0][0].legend(fontsize=6)
  benchlib.save_plot(fig, path)


if __name__ == "__main__":
  sys.exit(main())
