"""Outlining: a rewritten site's compute between its collectives, as functions XLA keeps as calls.

Why outline at all: XLA compiles each such function as a computation of its own (on
XLA:CPU a nested thunk sequence) instead of adding a site's ~40 instructions to the
caller, and its analyses of one computation (fusion, copy insertion, the CPU runtime's
dependency graph of its thunks) grow faster than its size, so a many-site program
compiles markedly faster (BUILD_NOTES, "Compile-time decisions").

Why only the compute, never a collective: every device must enter the collectives of a
program in one order, or they wait for each other for ever.  XLA:CPU orders the
collectives of one computation by their launch (a scheduling edge on the communicator
resource), which is the same on every device.  A call or a loop that holds collectives
is launched as one thunk, before the collectives inside it, so a collective after it in
the caller may start first on some devices and last on others; with a bounded thread
pool that deadlocks (BUILD_NOTES, "One order of collectives").  So the site's
collectives stay where the all-reduce was, in the caller, in program order, and each
run of compute ops between two of them becomes one function.
"""

from __future__ import annotations

from typing import Iterable

from jax.extend.mlir import ir
from jax.extend.mlir.dialects import func

# Ops that talk to other devices.  A site's ops are split at these.
COLLECTIVES = frozenset(
  {
    "stablehlo.all_reduce",
    "stablehlo.all_gather",
    "stablehlo.all_to_all",
    "stablehlo.reduce_scatter",
    "stablehlo.collective_permute",
    "stablehlo.collective_broadcast",
    "stablehlo.send",
    "stablehlo.recv",
  }
)
# A run of fewer ops than this stays inline: a call costs more than it saves.
MIN_OPS = 4


def _nested(op: ir.Operation) -> Iterable[ir.Operation]:
  """`op` and every op in its regions."""
  yield op
  for region in op.regions:
    for block in region.blocks:
      for child in block.operations:
        yield from _nested(child.operation)


def holds_collective(op: ir.Operation) -> bool:
  """Whether `op` is a collective or has one in its regions (a loop, a call's callee is
  not looked into: the pass emits no calls that hold collectives)."""
  return any(o.name in COLLECTIVES for o in _nested(op))


def outline_compute(
  ops: list[ir.Operation], module: ir.Module, name: str, location: ir.Location
) -> None:
  """Move each run of ops between the collectives of `ops` (a site's ops, in order, in
  one block) into a private function of `module` called in its place; the collectives,
  and any op holding one, stay where they are."""
  runs: list[list[ir.Operation]] = [[]]
  for op in ops:
    if holds_collective(op):
      runs.append([])
    else:
      runs[-1].append(op)
  part = 0
  for run in runs:
    if len(run) >= MIN_OPS:
      _outline(run, module, f"{name}_{part}" if len(runs) > 1 else name, location)
      part += 1


def _outline(run: list[ir.Operation], module: ir.Module, name: str, location: ir.Location):
  # Which ops are in the run is marked in the IR itself: the bindings' op handles are
  # not stable keys once an operand of the op changes (an earlier run's outlining).
  for op in run:
    op.attributes[_MARK] = ir.UnitAttr.get()
  inputs: list[ir.Value] = []
  for op in (o for top in run for o in _nested(top)):  # in order: deterministic arguments
    for value in op.operands:
      if not _in_run(_defining_op(value)) and value not in inputs:
        inputs.append(value)
  outputs = [
    result
    for op in run
    for result in op.results
    if any(not _in_run(use.owner.operation) for use in result.uses)
  ]
  for op in run:
    del op.attributes[_MARK]
  if not outputs:  # nothing outside uses the run: XLA drops it, a call would not help
    return
  name = fresh_symbol(module, name)
  with location:
    with ir.InsertionPoint(module.body):
      callee = func.FuncOp(
        name, ir.FunctionType.get([v.type for v in inputs], [v.type for v in outputs])
      )
    callee.attributes["sym_visibility"] = ir.StringAttr.get("private")
    body = callee.add_entry_block()  # type: ignore[attr-defined]  # the bindings add it
    with ir.InsertionPoint(run[-1]):
      call = func.CallOp([v.type for v in outputs], ir.FlatSymbolRefAttr.get(name), inputs)
    # The frontend attribute that XLA's CallInliner honours: a call carrying it stays a
    # call, so its callee stays a computation of its own.
    call.attributes["mhlo.frontend_attributes"] = ir.DictAttr.get(
      {"inlineable": ir.StringAttr.get("false")}
    )
    with ir.InsertionPoint(body):
      ret = func.ReturnOp(outputs)
    for op in run:
      op.move_before(ret.operation)
  # Rewire by where each use now is: inside the callee an input is its argument;
  # outside, an output is the call's result.
  for value, argument in zip(inputs, body.arguments):
    for use in list(value.uses):
      if _function_of(use.owner.operation) == name:
        use.owner.operation.operands[use.operand_number] = argument
  for value, result in zip(outputs, call.results):
    for use in list(value.uses):
      if _function_of(use.owner.operation) != name:
        use.owner.operation.operands[use.operand_number] = result


_MARK = "equarx.outlining"


def _in_run(op: ir.Operation | None) -> bool:
  """Whether `op` is in the run being outlined (marked), or nested in one of its ops."""
  while op is not None and op.name != "func.func":
    if _MARK in op.attributes:
      return True
    op = op.parent
  return False


def _function_of(op: ir.Operation) -> str | None:
  """The name of the function `op` is in."""
  parent: ir.Operation | None = op
  while parent is not None and parent.name != "func.func":
    parent = parent.parent
  return ir.StringAttr(parent.attributes["sym_name"]).value if parent is not None else None


def _defining_op(value: ir.Value) -> ir.Operation | None:
  """The op that defines `value`; for a block argument, the op whose region holds the
  block (None for the function's own arguments)."""
  owner = value.owner
  if isinstance(owner, ir.Block):
    parent = owner.owner
    return parent.operation if parent is not None else None
  return owner.operation


def fresh_symbol(module: ir.Module, base: str, taken: set[str] | frozenset = frozenset()) -> str:
  """`base`, or base_2, base_3, ... if the module already has a symbol of that name (or
  it is in `taken`)."""
  table = ir.SymbolTable(module.operation)
  name, n = base, 1
  while name in table or name in taken:
    n += 1
    name = f"{base}_{n}"
  return name
