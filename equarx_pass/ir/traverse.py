"""Walking a StableHLO module: its functions, the symbols they name, its ops, channels.

Plain traversal with no notion of sites; match.py, loops.py, the rewrite and the
front ends all read modules through it.
"""

from __future__ import annotations

import re

from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo


def find_function(module: ir.Module, name: str) -> ir.Operation | None:
  """The top-level func.func @name of `module`, or None."""
  for view in module.body.operations:
    op = view.operation
    if op.name == "func.func" and function_name(op) == name:
      return op
  return None


def walk(op: ir.Operation):
  """Every operation nested under `op` (pre-order), `op` excluded."""
  for region in op.regions:
    for block in region.blocks:
      for child in block.operations:
        yield child.operation
        yield from walk(child.operation)


def function_name(function: ir.Operation) -> str:
  """A func.func's symbol name."""
  return ir.StringAttr(function.attributes["sym_name"]).value


def called_functions(module: ir.Module) -> list[ir.Operation]:
  """The public functions and every function a symbol reference in them reaches,
  in module order.  Any attribute that names a symbol counts (func.call's callee, a
  custom call's called_computations, a composite's decomposition, ...)."""
  functions: dict[str, ir.Operation] = {}
  for view in module.body.operations:
    op = view.operation
    if op.name == "func.func":
      functions[function_name(op)] = op
  seen = set()
  stack = [
    name
    for name, op in functions.items()
    if "sym_visibility" not in op.attributes
    or ir.StringAttr(op.attributes["sym_visibility"]).value == "public"
  ]
  if not stack:  # no public function (a library of private ones): all count
    stack = list(functions)
  while stack:
    name = stack.pop()
    if name in seen:
      continue
    seen.add(name)
    for inner in walk(functions[name]):
      attrs = inner.attributes
      for i in range(len(attrs)):
        stack.extend(n for n in symbol_names(attrs[i].attr) if n in functions)
  return [op for name, op in functions.items() if name in seen]


def referenced_functions(op: ir.Operation) -> list[str]:
  """The symbols `op`'s attributes name (a call's callee, a custom call's computations)."""
  attrs = op.attributes
  return [n for i in range(len(attrs)) for n in symbol_names(attrs[i].attr)]


def symbol_names(attr: ir.Attribute) -> list[str]:
  """The symbols an attribute names, through arrays and dictionaries."""
  if isinstance(attr, ir.FlatSymbolRefAttr):
    return [attr.value]
  if isinstance(attr, ir.SymbolRefAttr):
    return [str(attr).lstrip("@").split("::")[0].strip('"')]
  if isinstance(attr, ir.ArrayAttr):
    return [n for a in attr for n in symbol_names(a)]
  if isinstance(attr, ir.DictAttr):
    return [n for i in range(len(attr)) for n in symbol_names(attr[i].attr)]
  return []


def enclosing_function(op: ir.Operation) -> str | None:
  parent = op.parent
  while parent is not None and parent.name != "func.func":
    parent = parent.parent
  return function_name(parent) if parent is not None else None


def channel_id(op: ir.Operation) -> int:
  """The op's channel handle, 0 without one; StableHLO's or MHLO's attribute."""
  if "channel_handle" not in op.attributes:
    return 0
  attr = op.attributes["channel_handle"]
  try:
    return stablehlo.ChannelHandle(attr).handle
  except ValueError:  # #mhlo.channel_handle<handle = 5, type = 2>
    found = re.search(r"handle\s*=\s*(-?\d+)", str(attr))
    return int(found.group(1)) if found else 0


def max_channel_handle(module: ir.Module) -> int:
  """Largest channel handle in use, so new collectives get fresh ones."""
  return max([0] + [channel_id(op) for op in walk(module.operation)])
