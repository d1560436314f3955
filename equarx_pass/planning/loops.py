"""How many times one run of a module executes an op: the trip counts of the while loops
around it, through the functions that call it.

A scanned model (`jax.lax.scan`, MaxText's and flax's scanned layers) runs its per-layer
collectives inside a while loop, so one step sends a site's bytes once per iteration.
The report counts them so.  A trip count is read where the loop has the form JAX and
XLA write: a counter that starts at a constant, is compared LT (or LE) with a constant
in the condition, and grows by a constant in the body.  Any other loop gives None
(unknown), and so does every op inside it.

An op in a branch of a conditional (`jax.lax.cond` and `lax.switch` lower to
stablehlo.case; stablehlo.if too), or in a function only such branches call, runs only
when its branch is taken, which the program decides as it runs (MaxText's DiLoCo trainer
syncs across slices in one branch, every few steps).  Its runs are counted as if taken,
and the report counts its bytes apart from those of every call (in_branch).
"""

from __future__ import annotations

from typing import Any, Callable

from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo

from equarx_pass.ir import traverse

WHILE = "stablehlo.while"
CONDITIONALS = ("stablehlo.case", "stablehlo.if")


def _defining_op(value: ir.Value) -> ir.Operation | None:
  """The operation that defines `value` (None for a block argument)."""
  owner: Any = value.owner
  if isinstance(owner, ir.Block):
    return None
  return owner if isinstance(owner, ir.Operation) else owner.operation


def _constant(value: ir.Value) -> int | None:
  """The integer a scalar stablehlo.constant holds, else None."""
  owner = _defining_op(value)
  if owner is None or owner.name != "stablehlo.constant":
    return None
  attr: Any = owner.attributes["value"]
  if not isinstance(attr, ir.DenseIntElementsAttr):
    return None
  if attr.is_splat:
    return int(ir.IntegerAttr(attr.get_splat_value()).value)
  return int(attr[0]) if len(attr) == 1 else None


def _argument_index(value: ir.Value, block: ir.Block) -> int | None:
  if isinstance(value, ir.BlockArgument) and value.owner == block:
    return value.arg_number
  return None


def trip_count(loop: ir.Operation) -> int | None:
  """Iterations of a stablehlo.while, or None where its form is not the counter's."""
  cond, body = loop.regions[0].blocks[0], loop.regions[1].blocks[0]
  cond_ops = [o.operation for o in cond.operations]
  body_ops = [o.operation for o in body.operations]
  if not cond_ops or not body_ops:
    return None
  compare = _defining_op(cond_ops[-1].operands[0])
  if compare is None or compare.name != "stablehlo.compare":
    return None
  direction = str(
    stablehlo.ComparisonDirectionAttr(compare.attributes["comparison_direction"]).value
  )
  index = _argument_index(compare.operands[0], cond)
  limit = _constant(compare.operands[1])
  if direction not in ("LT", "LE") or index is None or limit is None:
    return None
  start = _constant(loop.operands[index])
  grown = _defining_op(body_ops[-1].operands[index])
  if start is None or grown is None or grown.name != "stablehlo.add":
    return None
  a, b = grown.operands
  step = _constant(b) if _argument_index(a, body) == index else None
  if step is None and _argument_index(b, body) == index:
    step = _constant(a)
  if not step or step < 0:
    return None
  span = limit - start + (1 if direction == "LE" else 0)
  return max(0, -(-span // step))


def _inside_loops(op: ir.Operation) -> int | None:
  """The product of the trip counts of the while loops around `op` in its function."""
  runs: int | None = 1
  parent = op.parent
  while parent is not None and parent.name != "func.func":
    if parent.name == WHILE and runs is not None:
      trips = trip_count(parent)
      runs = None if trips is None else runs * trips
    parent = parent.parent
  return runs


def _inside_branch(op: ir.Operation) -> bool:
  """Whether `op` sits in a branch of a conditional in its function."""
  parent = op.parent
  while parent is not None and parent.name != "func.func":
    if parent.name in CONDITIONALS:
      return True
    parent = parent.parent
  return False


def _ancestors(op: ir.Operation) -> list[ir.Operation]:
  """The ops around `op` in its function, innermost first."""
  out = []
  parent = op.parent
  while parent is not None and parent.name != "func.func":
    out.append(parent)
    parent = parent.parent
  return out


def used_in_branch(op: ir.Operation) -> bool:
  """Whether a result of `op` is used inside the branch of a conditional that `op` is not
  in (a branch reads the values around it without operands; XLA passes them in)."""
  around = _ancestors(op)
  for result in op.results:
    for use in result.uses:
      owner: Any = use.owner
      user = owner if isinstance(owner, ir.Operation) else owner.operation
      for parent in _ancestors(user):
        if parent.name in CONDITIONALS and not any(parent == a for a in around):
          return True
  return False


def branch_functions(module: ir.Module) -> frozenset[str]:
  """The functions of `module` that run only when a conditional's branch is taken: every
  call of them is in a branch, or in a function of this set."""
  functions = {traverse.function_name(f): f for f in traverse.called_functions(module)}
  calls: dict[str, list[tuple[str, bool]]] = {name: [] for name in functions}
  for name, function in functions.items():
    for inner in traverse.walk(function):
      for callee in traverse.referenced_functions(inner):
        if callee in functions and callee != name:
          calls[callee].append((name, _inside_branch(inner)))
  # A function is conditional when it has callers and each call is in a branch or in a
  # conditional function; found by growing the set until nothing changes (calls form no
  # cycle, so this ends).
  conditional: set[str] = set()
  changed = True
  while changed:
    changed = False
    for name, callers in calls.items():
      if name in conditional or not callers:
        continue
      if all(branch or caller in conditional for caller, branch in callers):
        conditional.add(name)
        changed = True
  return frozenset(conditional)


def in_branch(op: ir.Operation, conditional_functions: frozenset[str]) -> bool:
  """Whether `op` runs only when a conditional's branch is taken: it sits in a branch, or
  in a function of `conditional_functions` (branch_functions)."""
  return _inside_branch(op) or traverse.enclosing_function(op) in conditional_functions


def runs_in(module: ir.Module) -> Callable[[ir.Operation], int | None]:
  """A function that gives how many times one run of `module` executes an op: 1 outside
  any loop, None where a loop around it (or around a call of its function) is not read."""
  functions = {traverse.function_name(f): f for f in traverse.called_functions(module)}
  # Call edges (caller, callee, loop trip counts around the call), then the functions in
  # an order where every caller comes before its callees (calls form no cycle).
  edges = [
    (name, callee, _inside_loops(inner))
    for name, function in functions.items()
    for inner in traverse.walk(function)
    for callee in traverse.referenced_functions(inner)
    if callee in functions and callee != name
  ]
  callers = {name: 0 for name in functions}
  for _, callee, _ in edges:
    callers[callee] += 1
  runs: dict[str, int | None] = {name: (1 if not n else 0) for name, n in callers.items()}
  ready = [name for name, n in callers.items() if not n]
  while ready:
    name = ready.pop()
    for caller, callee, inside in edges:
      if caller != name:
        continue
      old, mine = runs[callee], runs[name]
      add = None if mine is None or inside is None else mine * inside
      runs[callee] = None if old is None or add is None else old + add
      callers[callee] -= 1
      if not callers[callee]:
        ready.append(callee)

  def runs_of(op: ir.Operation) -> int | None:
    name = traverse.enclosing_function(op)
    outer = runs.get(name, 1) if name is not None else 1
    inside = _inside_loops(op)
    return None if outer is None or inside is None else outer * inside

  return runs_of
