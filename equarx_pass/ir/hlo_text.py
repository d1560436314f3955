"""Reading a compiled program's XLA HLO text: its computations, and how many times one run
of the program executes each (while loops' trip counts).

What a compiled TPU program sends between slices is written as instructions of its
computations; a scanned model's per-layer collectives sit in a while loop's body (XLA
peels one iteration into the caller), so what one run sends is each computation's
instructions times the runs of that computation.
"""

from __future__ import annotations

import math
import re

import numpy as np

_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$")
_NAME = r"%?([\w.\-]+)"


class UnknownTripCount(ValueError):
  """A while loop whose trip count the text does not give in a form read here."""


def split_computations(text: str) -> tuple[dict[str, list[str]], str | None]:
  """HLO module text -> ({computation name: its lines}, the entry computation's name)."""
  comps: dict[str, list[str]] = {}
  name = entry = None
  for line in text.splitlines():
    found = _HEADER.match(line)
    if found and not line.startswith(" "):
      name = found.group(2)
      comps[name] = []
      if found.group(1):
        entry = name
    elif name is not None:
      comps[name].append(line)
  return comps, entry


def _definitions(lines: list[str]) -> dict[str, str]:
  defs = {}
  for line in lines:
    lhs, eq, rhs = line.strip().removeprefix("ROOT ").partition(" = ")
    if eq:
      defs[lhs.lstrip("%")] = rhs
  return defs


def _search(pattern: str, text: str, what: str) -> re.Match:
  found = re.search(pattern, text)
  if found is None:
    raise UnknownTripCount(f"{what}: not found in {text[:200]!r}")
  return found


def trip_count(comps: dict[str, list[str]], caller: list[str], line: str) -> int:
  """Iterations of the while loop `line` (an instruction of computation `caller`): XLA's
  known_trip_count where given, else from its condition (the induction variable LT or LE
  a constant) and the induction variable's constant start in the loop's initial tuple."""
  known = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
  if known:
    return int(known.group(1))
  cond = _definitions(comps[_search(r"condition=" + _NAME, line, "condition").group(1)])
  compare = next((rhs for rhs in cond.values() if " compare(" in rhs), None)
  if compare is None:
    raise UnknownTripCount("the loop's condition holds no compare")
  a, b = _search(r"compare\(" + _NAME + r", " + _NAME + r"\)", compare, "compare").groups()
  direction = _search(r"direction=(\w+)", compare, "direction").group(1)
  if direction not in ("LT", "LE") or a not in cond or b not in cond:
    raise UnknownTripCount(f"a loop condition of direction {direction}")
  index = int(_search(r"get-tuple-element\(" + _NAME + r"\), index=(\d+)", cond[a], "gte").group(2))
  limit = int(_search(r" constant\((-?\d+)\)", cond[b], "limit").group(1))
  defs = _definitions(caller)
  operand = _search(r" while\(" + _NAME + r"\)", line, "operand").group(1)
  elements_text = _search(r"tuple\((.*)\)", defs.get(operand, ""), "initial tuple").group(1)
  elements = re.sub(r"/\*index=\d+\*/", "", elements_text).split(",")
  name = elements[index].strip().lstrip("%")
  for _ in range(16):  # through copies and bitcasts to the constant
    start = re.search(r" constant\((-?\d+)\)", defs.get(name, ""))
    if start:
      return limit - int(start.group(1)) + (1 if direction == "LE" else 0)
    name = _search(
      r" (?:copy|bitcast|convert)\(" + _NAME + r"\)", defs.get(name, ""), "start"
    ).group(1)
  raise UnknownTripCount("the induction variable's start is no constant")


def executions(text: str) -> dict[str, int]:
  """How many times one run of the module runs each computation reached from its entry
  (while bodies: their trip count; conditions: one more; fusions, calls, reductions and
  branches: their caller's, a branch's as if taken).  Raises UnknownTripCount."""
  comps, entry = split_computations(text)
  counts: dict[str, int] = {}

  def visit(name: str, times: int) -> None:
    counts[name] = counts.get(name, 0) + times
    for line in comps[name]:
      if " while(" in line:
        n = trip_count(comps, comps[name], line)
        visit(_search(r"body=" + _NAME, line, "body").group(1), times * n)
        visit(_search(r"condition=" + _NAME, line, "condition").group(1), times * (n + 1))
        continue
      for callee in _callees(line) + _branches(line):
        if callee in comps:
          visit(callee, times)

  if entry is not None:
    visit(entry, 1)
  return counts


def only_in_branches(text: str) -> frozenset[str]:
  """The computations that one run of the module reaches only through a conditional's
  branch: they run only when the program takes that branch, which it decides as it runs
  (a `jax.lax.cond`, MaxText's DiLoCo sync every few steps)."""
  comps, entry = split_computations(text)
  reached: dict[str, bool] = {}  # computation -> reached only through a branch

  def visit(name: str, in_branch: bool) -> None:
    if name in reached and (reached[name] <= in_branch):
      return  # seen so, or already reached outside a branch
    reached[name] = in_branch
    for line in comps[name]:
      for callee in _callees(line):
        if callee in comps:
          visit(callee, in_branch)
      for callee in _branches(line):
        if callee in comps:
          visit(callee, True)

  if entry is not None:
    visit(entry, False)
  return frozenset(name for name, in_branch in reached.items() if in_branch)


def _callees(line: str) -> list[str]:
  """The computations an instruction runs unconditionally (a while's body and condition,
  a fusion's or call's, a reduction's)."""
  return re.findall(r"(?:calls|to_apply|body|condition)=" + _NAME, line)


def _branches(line: str) -> list[str]:
  """The branches of a conditional instruction, in either of XLA's spellings."""
  found = re.findall(r"(?:true|false)_computation=" + _NAME, line)
  for group in re.findall(r"branch_computations=\{([^}]*)\}", line):
    found += [c.strip().lstrip("%") for c in group.split(",")]
  return found


# Bytes per element of XLA's HLO element types.
ELEMENT_BYTES = {
  "pred": 1,
  "token": 0,
  "s4": 0.5,
  "u4": 0.5,
  "s8": 1,
  "u8": 1,
  "f8e4m3fn": 1,
  "f8e5m2": 1,
  "f8e4m3": 1,
  "f8e5m2fnuz": 1,
  "f8e4m3fnuz": 1,
  "bf16": 2,
  "f16": 2,
  "s16": 2,
  "u16": 2,
  "f32": 4,
  "s32": 4,
  "u32": 4,
  "f64": 8,
  "s64": 8,
  "u64": 8,
  "c64": 8,
  "c128": 16,
}
_ARRAY = re.compile(r"\b([a-z]+[0-9a-z]*)\[([0-9,]*)\]")


def shape_bytes(text: str) -> tuple[float, list[str]]:
  """Bytes of the arrays an HLO shape names ('bf16[16,128]{1,0}', or a tuple of them,
  summed), and the element types in it that ELEMENT_BYTES does not know (not counted)."""
  total, unknown = 0.0, []
  for element, dims in _ARRAY.findall(text):
    if element not in ELEMENT_BYTES:
      unknown.append(element)
      continue
    total += ELEMENT_BYTES[element] * math.prod(int(d) for d in dims.split(",") if d)
  return total, unknown


def replica_groups(line: str, num_devices: int) -> list[list[int]]:
  """The groups of a collective instruction's text, in XLA's three spellings: explicit
  `{{0,1},{2,3}}`, iota `[2,2]<=[4]` (or `[2,2]<=[2,2]T(1,0)`), and over a mesh
  `mesh['a'=2,'b'=2], device_ids=(...) {'a'}`; `{}` is every device in one group."""
  found = re.search(r"replica_groups=\{((?:\{[\d,\s]*\},?\s*)+)\}", line)
  if found:
    return [
      [int(x) for x in group.split(",") if x.strip()]
      for group in re.findall(r"\{([\d,\s]*)\}", found.group(1))
    ]
  found = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
  if found:
    shape = [int(x) for x in found.group(1).split(",")]
    ids = np.arange(math.prod(int(x) for x in found.group(2).split(",")))
    ids = ids.reshape([int(x) for x in found.group(2).split(",")])
    if found.group(3):
      ids = ids.transpose([int(x) for x in found.group(3).split(",")])
    return ids.reshape(shape).tolist()
  found = re.search(
    r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(([^)]*\)?)\))?\s*\{([^}]*)\}", line
  )
  if found:
    axes = [
      (name.strip().strip("'\""), int(size))
      for name, _, size in (a.partition("=") for a in found.group(1).split(",") if a)
    ]
    count = math.prod(size for _, size in axes)
    order = _mesh_order(found.group(2), count) if found.group(2) else list(range(count))
    grid = np.asarray(order).reshape([size for _, size in axes])
    reduced = [a.strip().strip("'\"") for a in found.group(3).split(",") if a.strip()]
    names = [name for name, _ in axes]
    keep = [i for i, n in enumerate(names) if n not in reduced]
    over = [names.index(n) for n in reduced]
    size = math.prod(axes[i][1] for i in over)
    return grid.transpose(keep + over).reshape(-1, size).tolist()
  if re.search(r"replica_groups=\{\s*\}", line) or "replica_groups=" not in line:
    return [list(range(num_devices))]
  raise ValueError(f"replica groups in a form not read here: {line.strip()[:300]}")


def _mesh_order(text: str, count: int) -> list[int]:
  """A mesh's device_ids: `[2,4]T(1,0)` (an iota reshaped and transposed),
  `[8]<=[2,4]T(1,0)`, or the ids listed."""
  found = re.fullmatch(r"\s*\[([\d,]+)\](?:<=\[([\d,]+)\])?(?:T\(([\d,]+)\))?\s*", text)
  if found is None:
    ids = [int(i) for i in text.split(",")]
  else:
    source = found.group(2) or found.group(1)
    iota = np.arange(count).reshape([int(d) for d in source.split(",")])
    if found.group(3):
      iota = iota.transpose([int(p) for p in found.group(3).split(",")])
    ids = iota.reshape(-1).tolist()
  if sorted(ids) != list(range(count)):
    raise ValueError(f"mesh device ids {text!r} are not a permutation of {count} devices")
  return ids
