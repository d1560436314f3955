"""Bytes one rank sends, counted from a StableHLO module's collective ops.

    count_module(module) -> WireCount(bytes=..., ops=[...], unknown_trip_counts=0)

Walks every region of the module; each collective op contributes what one rank of
its group sends when it runs once, times the trip counts of the stablehlo.while
loops around it:

  collective_permute     the operand (each rank is one source)
  all_gather             the operand x (N - 1)          (ring)
  all_to_all             the operand x (N - 1) / N
  reduce_scatter         the operand x (N - 1) / N      (ring)
  all_reduce             the operand x 2 (N - 1) / N    (ring, in its element type)

A while loop's trip count is read from its condition, `compare LT, counter, C`
with the counter's initial value a constant (what equarx_pass and
jax.lax.fori_loop emit).  Where it cannot be read the op counts once and
`unknown_trip_counts` says so.  These are logical bytes in the module's element
types: XLA:CPU widens bf16 collectives to f32 on the wire, which this does not
model (see tools/netbench.py for bytes counted on an interface).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jax.extend.mlir import ir

COLLECTIVES = (
  "stablehlo.collective_permute",
  "stablehlo.all_gather",
  "stablehlo.all_to_all",
  "stablehlo.reduce_scatter",
  "stablehlo.all_reduce",
)


@dataclasses.dataclass
class WireCount:
  bytes: float = 0.0
  ops: list = dataclasses.field(default_factory=list)  # (op name, element type, bytes, runs)
  unknown_trip_counts: int = 0

  def by_kind(self) -> dict:
    out: dict[str, float] = {}
    for name, _, nbytes, runs in self.ops:
      out[name] = out.get(name, 0) + nbytes * runs
    return out


def element_bytes(element_type) -> float:
  """Bytes per element of an MLIR element type (i4 = 0.5)."""
  text = str(element_type)
  if text.startswith(("i", "ui", "si")) and text.lstrip("usi").isdigit():
    return int(text.lstrip("usi")) / 8
  widths = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8}
  if text in widths:
    return widths[text]
  if text.startswith("f8"):
    return 1
  if text.startswith("f4") or text.startswith("f6"):
    return int(text[1]) / 8
  if text.startswith("complex<f32"):
    return 8
  raise ValueError(f"unknown element type {text}")


def tensor_bytes(value) -> float:
  t = ir.RankedTensorType(value.type)
  return int(np.prod(t.shape, dtype=np.int64)) * element_bytes(t.element_type)


def _group_size(op, default: int) -> int:
  attrs = op.attributes
  if "replica_groups" in attrs:
    groups = ir.DenseIntElementsAttr(attrs["replica_groups"])
    shape = ir.ShapedType(groups.type).shape
    if len(shape) == 2 and shape[1] > 0:
      return shape[1]
  return default


def _constant_int(value) -> int | None:
  owner = value.owner
  if not isinstance(owner, ir.Operation):
    owner = getattr(owner, "operation", None)
  if owner is None or owner.name != "stablehlo.constant":
    return None
  attr = ir.DenseIntElementsAttr(owner.attributes["value"])
  if not attr.is_splat:
    return None
  return ir.IntegerAttr(attr.get_splat_value()).value


def trip_count(while_op) -> int | None:
  """Trip count of a counted stablehlo.while (counter < C, counter from a constant)."""
  cond = while_op.regions[0].blocks[0]
  ops = list(cond.operations)
  if len(ops) < 1:
    return None
  ret = ops[-1]
  pred = ret.operands[0].owner
  if not isinstance(pred, ir.Operation):
    pred = pred.operation
  if pred.name != "stablehlo.compare" or "LT" not in str(pred.attributes["comparison_direction"]):
    return None
  lhs, rhs = pred.operands
  if not isinstance(lhs, ir.BlockArgument):
    return None
  limit = _constant_int(rhs)
  # The limit may also be a loop-invariant carried constant.
  if limit is None and isinstance(rhs, ir.BlockArgument):
    limit = _constant_int(while_op.operands[ir.BlockArgument(rhs).arg_number])
  start = _constant_int(while_op.operands[ir.BlockArgument(lhs).arg_number])
  if limit is None or start is None:
    return None
  return max(limit - start, 0)


def count_module(module: ir.Module, num_devices: int = 0) -> WireCount:
  """Bytes one rank sends for one run of the module's main function."""
  count = WireCount()

  def walk(op, runs: int) -> None:
    for region in op.regions:
      for block in region.blocks:
        for inner in block.operations:
          inner = inner.operation
          name = inner.name
          if name in COLLECTIVES:
            n = _group_size(inner, num_devices)
            nbytes = sum(tensor_bytes(v) for v in inner.operands)
            factor = {
              "stablehlo.collective_permute": 1.0,
              "stablehlo.all_gather": n - 1,
              "stablehlo.all_to_all": (n - 1) / n,
              "stablehlo.reduce_scatter": (n - 1) / n,
              "stablehlo.all_reduce": 2 * (n - 1) / n,
            }[name]
            etype = str(ir.RankedTensorType(inner.operands[0].type).element_type)
            count.ops.append((name.split(".")[1], etype, nbytes * factor, runs))
            count.bytes += nbytes * factor * runs
            # all_reduce has a reduction region; nothing to count inside.
            continue
          inner_runs = runs
          if name == "stablehlo.while":
            trips = trip_count(inner)
            if trips is None:
              count.unknown_trip_counts += 1
            else:
              inner_runs = runs * trips
          walk(inner, inner_runs)

  walk(module.operation, 1)
  return count
