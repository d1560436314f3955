"""Compute-only twin: the emitted all-reduce's local work on one device, no transfers.

    python tools/bench_twin.py                          # CPU, 4M values, N = 4
    python tools/bench_twin.py --platform cuda          # on a GPU, where there is one

The rewritten site for a group of N devices, as the pass emits it for the platform that
runs the twin (outlined on CPU, inline on GPU, as `--equarx_outline=auto` does), becomes
a one-device program: the shard_map's body is its main, every collective_permute and
all_to_all returns its operand (a self-permute: the data stays), every all_gather is N
copies of its operand, and the rank is 0.  So what is timed is exactly the emitted arithmetic and memory traffic of one
rank, with nothing sent.  Beside it, in the same run: the local work of the
bandwidth-optimal bf16 ring (tools/bf16_ring.py with the same stand-ins), the N-way sum
a one-shot native all-reduce does, and a memory copy of the operand (one read, one
write, as x + 1: the floor any all-reduce pays).  Median of --calls calls after a warm-up.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

SCHEMES = (
  "--equarx_enable",
  "--equarx_enable --equarx_rotation=none",
  "--equarx_enable --equarx_algorithm=ring --equarx_rotation=none",
  "--equarx_enable --equarx_algorithm=ring --equarx_rotation=none --equarx_format=int4",
)


def twin_module(module, n: int):
  """The per-device program of rewritten `module` (the body of its one shard_map: the
  site's collectives and the calls of its outlined compute) as a one-device module: its
  collectives replaced by local stand-ins, its rank 0."""
  from jax.extend.mlir import ir
  from jax.extend.mlir.dialects import func
  from jax.extend.mlir.dialects import stablehlo as hlo

  from equarx_pass import rewrite
  from equarx_pass.ir import traverse

  twin = rewrite.copy_module(module)
  with twin.context, ir.Location.unknown():
    manual = [op for op in traverse.walk(twin.operation) if op.name == "sdy.manual_computation"]
    if len(manual) != 1:
      raise SystemExit(f"expected one shard_map in the program, found {len(manual)}")
    body = manual[0].regions[0].blocks[0]
    ops = list(body.operations)
    returned = list(ops[-1].operands)  # sdy.return
    signature = ir.FunctionType.get([a.type for a in body.arguments], [v.type for v in returned])
    with ir.InsertionPoint(twin.body):
      site = func.FuncOp("main_twin", signature)
    entry = site.add_entry_block()
    with ir.InsertionPoint(entry):
      end = func.ReturnOp(returned)
    for old, new in zip(body.arguments, entry.arguments):
      old.replace_all_uses_with(new)
    for op in ops[:-1]:
      op.move_before(end)
    for op in list(twin.body.operations):  # main (with the emptied shard_map), the meshes
      keep = op.operation.name == "func.func" and ir.StringAttr(
        op.attributes["sym_name"]
      ).value.startswith(("main_twin", "equarx_"))
      if not keep:
        op.operation.erase()
    site.attributes["sym_name"] = ir.StringAttr.get("main")
    site.attributes["sym_visibility"] = ir.StringAttr.get("public")
    for name in ("mhlo.num_partitions", "mhlo.num_replicas"):
      twin.operation.attributes[name] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 1)

    for op in list(traverse.walk(site.operation)):  # a list: the loop erases ops
      name = op.name
      if name in ("stablehlo.collective_permute", "stablehlo.all_to_all", "stablehlo.all_reduce"):
        # The data stays where it is (all_to_all: split and concatenated on one axis).
        for result, operand in zip(op.results, op.operands):
          if result.type != operand.type:
            raise SystemExit(f"{name} changes the type; no local stand-in")
          result.replace_all_uses_with(operand)
        op.erase()
      elif name == "stablehlo.all_gather":
        dim = ir.IntegerAttr(op.attributes["all_gather_dim"]).value
        with ir.InsertionPoint(op):
          for result, operand in zip(op.results, op.operands):
            copies = hlo.ConcatenateOp([operand] * n, dim).result
            result.replace_all_uses_with(copies)
        op.erase()
      elif name in ("stablehlo.partition_id", "stablehlo.replica_id"):
        with ir.InsertionPoint(op):
          zero = hlo.ConstantOp(
            ir.DenseElementsAttr.get_splat(
              op.results[0].type, ir.IntegerAttr.get(ir.IntegerType.get_unsigned(32), 0)
            )
          ).result
        op.results[0].replace_all_uses_with(zero)
        op.erase()
  return twin


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--group", type=int, default=4, help="N, the devices the site is for")
  parser.add_argument("--values", default="4M", help="values per device (K/M suffixes)")
  parser.add_argument("--dtypes", nargs="+", default=["bf16", "f32"], choices=["bf16", "f32"])
  parser.add_argument("--calls", type=int, default=9)
  parser.add_argument("--platform", default="cpu", help="the JAX platform that runs the twins")
  benchlib.add_scheme_argument(parser)
  parser.add_argument("--out", default=os.path.join(benchlib.RESULTS, "twin_cpu.json"))
  args = parser.parse_args(argv)
  import jax

  jax.config.update("jax_num_cpu_devices", args.group)
  import bf16_ring
  import jax.numpy as jnp
  import numpy as np
  from jax.extend import backend as jax_backend

  import equarx_pass
  from equarx_pass import _jax_private

  n, values = args.group, benchlib.parse_size(args.values)
  device = jax.devices(args.platform)[0]
  schemes, missing = benchlib.split_schemes(args.scheme or SCHEMES)
  rows = []
  for dtype_name in args.dtypes:
    dtype = benchlib.jnp_dtype(dtype_name)
    x = jax.device_put(jnp.asarray(np.random.default_rng(0).standard_normal(values), dtype), device)
    stacked = jax.device_put(jnp.stack([x] * n), device)
    copy = jax.jit(lambda v: v + 1)

    def one_shot(s):  # the N buffers added in f32, as a one-shot all-reduce does
      total = s[0].astype(jnp.float32)
      for j in range(1, n):
        total = total + s[j].astype(jnp.float32)
      return total.astype(s.dtype)

    one_shot = jax.jit(one_shot)
    ring = jax.jit(lambda v: bf16_ring.bf16_ring_allreduce(v, "x", n, permute=lambda b: b, rank=0))
    base = {
      "one pass (x + 1)": benchlib.median_seconds(lambda: copy(x), args.calls),
      "native one-shot sum of N": benchlib.median_seconds(lambda: one_shot(stacked), args.calls),
      "bf16 ring": benchlib.median_seconds(lambda: ring(x), args.calls),
    }
    for program, seconds in base.items():
      rows.append(dict(dtype=dtype_name, program=program, seconds=seconds))
    # Lowered for N CPU devices (one GPU cannot lower a group of N); only the twin runs
    # on --platform.
    lowered = benchlib.psum_program(n, "cpu").lower(jax.ShapeDtypeStruct((n * values,), dtype))
    module = lowered.compiler_ir("stablehlo")
    for scheme in schemes:
      # The form and the outlining the pass gives the twin's platform.
      platform = "cpu" if args.platform == "cpu" else "gpu"
      policy = equarx_pass.Policy.from_flags(scheme + " --equarx_min_bytes=0 --equarx_force")
      result = equarx_pass.rewrite_module(module, policy.replace(platform=platform), platform)
      twin = twin_module(result.module, n)
      options = jax_backend.get_compile_options(num_replicas=1, num_partitions=1)
      executable = device.client.compile_and_load(
        str(twin), _jax_private.device_list([device]), options
      )
      seconds = benchlib.median_seconds(
        lambda: executable.execute_sharded([x]).disassemble_into_single_device_arrays(),
        args.calls,
      )
      rows.append(
        dict(
          dtype=dtype_name,
          program=benchlib.scheme_label(scheme),
          form=result.records[0].reason,
          seconds=seconds,
        )
      )
    copy_s = base["one pass (x + 1)"]
    ring_s = base["bf16 ring"]
    for row in rows:
      if row["dtype"] == dtype_name:
        row["x_copy"] = row["seconds"] / copy_s
        row["x_bf16_ring"] = row["seconds"] / ring_s
    for row in rows:
      if row["dtype"] == dtype_name:
        print(
          f"  {dtype_name} {row['program']:<40} {row['seconds'] * 1e3:8.2f} ms  "
          f"{row['x_copy']:6.2f}x copy  {row['x_bf16_ring']:6.2f}x bf16 ring",
          flush=True,
        )
  for row in rows:
    row["ms"] = round(row.pop("seconds") * 1e3, 2)
    row["x_copy"], row["x_bf16_ring"] = round(row["x_copy"], 2), round(row["x_bf16_ring"], 2)
  title = (
    f"Compute-only twins on one {device.platform} device: a group of N = {n}, "
    f"{benchlib.fmt_bytes(values)} values per device, nothing sent (median of {args.calls})"
  )
  columns = ["dtype", "program", "ms", "x_copy", "x_bf16_ring"]
  print(benchlib.table(rows, columns, title))
  benchlib.write_results(
    args.out,
    rows,
    rows,
    columns,
    group=n,
    values=values,
    platform=device.platform,
    missing_schemes=missing,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
