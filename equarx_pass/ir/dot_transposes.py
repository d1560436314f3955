"""Dots that read a transpose XLA wrote in the default layout: the transpose folded back in.

XLA's HLO -> StableHLO conversion drops the layout of an op; a transpose whose layout is
not the default one keeps it as an attribute (`result_layout`), one in the default
layout gets none.  Back in HLO (the StableHLO -> HLO translation, through XlaBuilder),
every transpose gets the layout that makes it a bitcast of its operand: for a 2-D
transpose of a row-major operand, column-major.  Nothing in StableHLO asks for another
(the translation ignores `result_layout` and `xla_shape` on a transpose, and folds any
no-op reshape, broadcast or copy put after it).

That matters where XLA reads the layout before assigning layouts.  XLA:CPU's
`float-normalization-bf16` keeps a bf16 dot in bf16 when its operands are row-major (the
library dot takes them) and otherwise computes it in f32 (XLA:CPU of jaxlib 0.12); XLA's
`dot_decomposer`, which runs before it, writes a dot's operands in the canonical order by
transposes in the default layout.  The partitioned route reads the program after
XLA:CPU's `simplification` (frontends/partitioned.py, `_pick_dump`), so its dots read
those transposes; rebuilt, each transpose comes back column-major, the second compile's
float normalization computes the dot in f32 and the bf16 rounding of its result is gone
(MaxText 0.2.5's train step: the output layer's and the MLP's backward dots; the raw
gradient norm 2.5e-05 off at step 0, the loss from step 1 on).

So each such transpose that a dot reads is folded into the dot's dimension numbers (the
dot reads the transpose's operand): what XLA's own `transpose-folding` does to the first
compile's program later, before layout assignment (MaxText's step: the same 4 dots, the
same dimension numbers).  The second compile's passes before it then find a dot with a
row-major operand, as the first compile's did, and keep it in bf16.  Folded only where
the dot's result keeps its dimension order (the free dimensions of the operand stay in
order); the transpose stays where anything else reads it.
"""

from __future__ import annotations

from typing import Any

from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass.ir import traverse

DOTS = ("stablehlo.dot", "stablehlo.dot_general")


def fold_default_layout_transposes(module: ir.Module) -> int:
  """Fold, in place, every transpose with no `result_layout` (XLA's default layout) that a
  dot reads into that dot's dimension numbers, where the dot's result keeps its order.
  Returns how many dots were changed."""
  folded = 0
  for op in list(traverse.walk(module.operation)):
    if op.name not in DOTS:
      continue
    operands = [op.operands[0], op.operands[1]]
    dims = _dimension_numbers(op)
    emptied = []
    for i, side in enumerate(("lhs", "rhs")):
      found = _default_layout_transpose(operands[i])
      if found is None:
        continue
      transpose, perm = found
      batch, contracting = dims[f"{side}_batch"], dims[f"{side}_contracting"]
      free = [d for d in range(len(perm)) if d not in batch and d not in contracting]
      if [perm[d] for d in free] != sorted(perm[d] for d in free):
        continue  # the result's dimensions would come in another order
      dims[f"{side}_batch"] = [perm[d] for d in batch]
      dims[f"{side}_contracting"] = [perm[d] for d in contracting]
      operands[i] = transpose.operands[0]
      emptied.append(transpose)
    if not emptied:
      continue
    _replace_dot(op, operands[0], operands[1], dims)
    folded += 1
    for transpose in dict.fromkeys(emptied):  # once, where both operands were one transpose
      if not list(transpose.results[0].uses):
        transpose.erase()
  return folded


def _defining_op(value: ir.Value) -> ir.Operation | None:
  """The operation that defines `value` (None for a block argument)."""
  owner: Any = value.owner
  if isinstance(owner, ir.Block):
    return None
  return owner if isinstance(owner, ir.Operation) else owner.operation


def _default_layout_transpose(value: ir.Value) -> tuple[ir.Operation, list[int]] | None:
  """The transpose that defines `value` and its permutation, where XLA wrote it in the
  default layout (no `result_layout`) and it moves a dimension; else None."""
  op = _defining_op(value)
  if op is None or op.name != "stablehlo.transpose" or "result_layout" in op.attributes:
    return None
  perm = [int(p) for p in ir.DenseI64ArrayAttr(op.attributes["permutation"])]
  if perm == sorted(perm):
    return None
  return op, perm


def _dimension_numbers(op: ir.Operation) -> dict[str, list[int]]:
  if op.name == "stablehlo.dot":
    lhs_rank = len(ir.RankedTensorType(op.operands[0].type).shape)
    return {
      "lhs_batch": [],
      "rhs_batch": [],
      "lhs_contracting": [lhs_rank - 1],
      "rhs_contracting": [0],
    }
  numbers = hlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
  return {
    "lhs_batch": list(numbers.lhs_batching_dimensions),
    "rhs_batch": list(numbers.rhs_batching_dimensions),
    "lhs_contracting": list(numbers.lhs_contracting_dimensions),
    "rhs_contracting": list(numbers.rhs_contracting_dimensions),
  }


def _replace_dot(op: ir.Operation, lhs: ir.Value, rhs: ir.Value, dims: dict) -> None:
  """`op` (a dot or dot_general) -> a dot_general of lhs and rhs with `dims`, its other
  attributes (precision, algorithm) and location kept."""
  attributes = {
    op.attributes[i].name: op.attributes[i].attr
    for i in range(len(op.attributes))
    if op.attributes[i].name != "dot_dimension_numbers"
  }
  with op.context, op.location:
    attributes["dot_dimension_numbers"] = hlo.DotDimensionNumbers.get(
      lhs_batching_dimensions=dims["lhs_batch"],
      rhs_batching_dimensions=dims["rhs_batch"],
      lhs_contracting_dimensions=dims["lhs_contracting"],
      rhs_contracting_dimensions=dims["rhs_contracting"],
    )
    new = ir.Operation.create(
      "stablehlo.dot_general",
      results=[op.results[0].type],
      operands=[lhs, rhs],
      attributes=attributes,
      loc=op.location,
      ip=ir.InsertionPoint(op),
    )
  op.results[0].replace_all_uses_with(new.results[0])
  op.erase()
