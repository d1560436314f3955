"""Multislice TPU, by the TPU compiler's own output (compile-only, no TPU): what crosses the
slow data-center network (DCN) between slices, the on-chip time, the compile time.

    ALLOW_MULTIPLE_LIBTPU_LOAD=1 python tools/bench_multislice.py \
        [--topologies v5e:2x2 v5e:4x4] [--slices 2 4] [--axes dcn,ici dcn ici] \
        [--dtypes bf16 f32] [--sizes 1M 16M] [--out results/multislice.json]

For each TPU topology and slice count, a hybrid ("dcn", "ici") mesh as users build one
(`mesh_utils.create_hybrid_device_mesh`), and one psum over the given axes of SIZE bytes
per chip, compiled these ways:

  native        jax.jit
  int8ref       jax.jit of the hierarchical int8 all-reduce written by hand in jnp
                (tools/int8_reference.py; only for a psum over both axes): the plain
                baseline with the same DCN bytes
  flat          equarx_pass.jit --equarx_hierarchy=flat --equarx_force: the quantized
                all-reduce over the whole group
  hierarchical  equarx_pass.jit --equarx_force: native inside each slice, quantized across
  hierarchical_no_rotation  the same with --equarx_rotation=none (what the rotation costs)
  default       equarx_pass.jit with the default flags: the cost model decides
  int4_across   the default with --equarx_slow_format=int4: int4 across slices only
  int4_across_one_shot  the same with --equarx_algorithm=one_shot

DCN bytes per chip are counted from the compiled program's cross-slice transfers
(equarx_pass.frontends.tpu_aot.cross_slice_bytes); the report's own DCN bytes are printed beside them.
On-chip time is the compiler's estimate (`cost_analysis()["optimal_seconds"]`), which prices
no ICI or DCN transfer: an estimate, not a measurement on a TPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402

REFERENCE = "int8 reference"
VARIANTS = {
  "native": None,
  "int8ref": REFERENCE,
  "flat": "--equarx_enable --equarx_min_bytes=0 --equarx_hierarchy=flat --equarx_force",
  "hierarchical": "--equarx_enable --equarx_min_bytes=0 --equarx_force",
  "hierarchical_no_rotation": (
    "--equarx_enable --equarx_min_bytes=0 --equarx_force --equarx_rotation=none"
  ),
  "default": "--equarx_enable",
  # int4 only across slices (--equarx_slow_format), the cost model deciding.
  "int4_across": "--equarx_enable --equarx_slow_format=int4",
  # The same with the one-shot (one quantization per value; the two-shot's bytes between
  # two slices, N/2 times them beyond).
  "int4_across_one_shot": "--equarx_enable --equarx_slow_format=int4 --equarx_algorithm=one_shot",
  # The hierarchical form with the kernel form across slices (opt-in; the estimates
  # price its Pallas kernels by the bytes they move).
  "hierarchical_kernel": (
    "--equarx_enable --equarx_min_bytes=0 --equarx_force --equarx_form=kernel"
  ),
}


def on_chip_seconds(cost: dict) -> float | None:
  """The compiler's on-chip estimate, or None where it gives none: for some programs with
  all-to-alls of int8 it returns a large negative number (seen at 1 MiB per chip)."""
  seconds = float(cost.get("optimal_seconds", -1.0))
  return seconds if seconds > 0 else None


def hybrid_mesh(topology: str, slices: int):
  import numpy as np
  from jax.experimental import mesh_utils, topologies
  from jax.sharding import Mesh

  desc = topologies.get_topology_desc(platform="tpu", topology_name=topology, num_slices=slices)
  per_slice = len(desc.devices) // slices
  devices = mesh_utils.create_hybrid_device_mesh((1, per_slice), (slices, 1), desc.devices)
  return Mesh(np.asarray(devices), ("dcn", "ici")), per_slice


def measure(
  topology: str, slices: int, axes: tuple[str, ...], dtype: str, size: int, variants=VARIANTS
) -> list:
  import jax
  from int8_reference import hierarchical_int8
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import equarx_pass
  from equarx_pass.frontends.tpu_aot import cross_slice_bytes

  mesh, per_slice = hybrid_mesh(topology, slices)
  chips = slices * per_slice
  jnp_dtype = benchlib.jnp_dtype(dtype)
  values = size // jax.numpy.dtype(jnp_dtype).itemsize
  spec = P(("dcn", "ici"))
  arg = jax.ShapeDtypeStruct((chips * values,), jnp_dtype, sharding=NamedSharding(mesh, spec))
  psum = jax.shard_map(
    lambda v: jax.lax.psum(v, axes), mesh=mesh, in_specs=spec, out_specs=P(), check_vma=False
  )

  def reference(v):
    return hierarchical_int8(v, "ici", "dcn", per_slice, slices)

  rows = []
  native_s = None
  for name, flags in variants.items():
    if flags is REFERENCE:
      if axes != ("dcn", "ici"):
        continue
      fn = jax.jit(
        jax.shard_map(reference, mesh=mesh, in_specs=spec, out_specs=P(), check_vma=False)
      )
    else:
      fn = jax.jit(psum) if flags is None else equarx_pass.jit(psum, flags=flags)
    start = time.perf_counter()
    compiled = fn.lower(arg).compile()
    compile_s = time.perf_counter() - start
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    seconds = on_chip_seconds(cost)
    native_s = seconds if name == "native" else native_s
    row = {
      "topology": topology,
      "slices": slices,
      "chips_per_slice": per_slice,
      "axes": ",".join(axes),
      "dtype": dtype,
      "bytes_per_chip": size,
      "variant": name,
      "dcn_bytes": cross_slice_bytes(compiled.as_text(), slices),
      "on_chip_us": seconds * 1e6 if seconds is not None else None,
      "on_chip_vs_native": seconds / native_s if seconds is not None and native_s else None,
      "compile_s": compile_s,
    }
    if flags not in (None, REFERENCE):
      [record] = fn.report.records
      row["decision"] = record.decision
      row["route"] = record.route
      after = record.traffic_after if record.rewritten else record.traffic_before
      row["report_dcn_bytes"] = after.slow if after is not None else None
      row["predicted"] = record.speedup
      row["why"] = record.reason
    rows.append(row)
  native_dcn = rows[0]["dcn_bytes"]
  for row in rows:
    row["dcn_vs_native"] = row["dcn_bytes"] / native_dcn if native_dcn else None
  return rows


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--topologies", nargs="+", default=["v5e:2x2", "v5e:4x4"])
  parser.add_argument("--slices", nargs="+", type=int, default=[2, 4])
  parser.add_argument("--axes", nargs="+", default=["dcn,ici", "dcn", "ici"])
  parser.add_argument("--dtypes", nargs="+", default=["bf16", "f32"])
  parser.add_argument("--sizes", nargs="+", default=["1M", "16M"])
  parser.add_argument(
    "--variants",
    nargs="+",
    choices=list(VARIANTS)[1:],
    default=[v for v in list(VARIANTS)[1:] if v != "hierarchical_kernel"],
    help="besides native (always measured, the reference); default: all but hierarchical_kernel",
  )
  parser.add_argument("--out", default=os.path.join(benchlib.RESULTS, "multislice.json"))
  args = parser.parse_args()

  rows, unavailable = [], {}
  for topology in args.topologies:
    for slices in args.slices:
      for axes in args.axes:
        for dtype in args.dtypes:
          for size in args.sizes:
            key = f"{topology} x {slices}"
            try:
              variants = {"native": None} | {v: VARIANTS[v] for v in args.variants}
              rows += measure(
                topology,
                slices,
                tuple(axes.split(",")),
                dtype,
                benchlib.parse_size(size),
                variants,
              )
            except Exception as e:  # a topology this libtpu does not know
              unavailable[key] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
              print(f"{key}: not available ({unavailable[key]})", file=sys.stderr)
              break
  columns = [
    "topology",
    "slices",
    "axes",
    "dtype",
    "bytes_per_chip",
    "variant",
    "dcn_bytes",
    "report_dcn_bytes",
    "dcn_vs_native",
    "on_chip_vs_native",
    "compile_s",
    "decision",
  ]
  print(benchlib.table(rows, columns, "multislice psum, TPU compiler estimates (compile-only)"))
  benchlib.write_results(args.out, rows, rows, columns, unavailable=unavailable)
  return 0


if __name__ == "__main__":
  sys.exit(main())
