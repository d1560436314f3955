"""A compiled TPU program's time by its own schedule: the compiler's per-instruction
estimates for the work on chip, each transfer priced at the cost model's link figure, and
asynchronous transfers overlapped with the work the schedule puts inside them.

The TPU compiler's estimates price no transfer (an all-reduce or all-gather carries no
estimated cycles, and cost_analysis()'s optimal_seconds counts only the bytes a program
moves through HBM), so a compile-only figure for a site's time needs the link's.  This
reads the scheduled HLO text of a compiled program (is_scheduled=true: the entry
computation's instructions are in the order the chip runs them) and replays it on two
resources, the core and the links:

  an instruction on the core  max(estimated cycles / clock, bytes read and written / HBM
                              bandwidth): a roofline per instruction.  A Pallas kernel's
                              custom call carries no cycles: the bytes its cost estimate
                              declares (else its operands' and results') alone.
  a collective                its bytes per chip over the link (the cost model's
                              accounting, cost.py: an all-reduce of B bytes over N chips
                              sends 2 (N-1)/N B, an all-gather (N-1)/N of its result, an
                              all-to-all and a reduce-scatter (N-1)/N of their operand, a
                              collective-permute its operand), plus the link's latency per
                              collective.  One transfer at a time on the links (FIFO).
  synchronous (X)             the core waits for the transfer
  asynchronous (X-start/done) the transfer starts at X-start; the core runs on and waits
                              at X-done only for what is left of it

While loops run their body's schedule trip-count times (hlo_text.trip_count); a call runs
its computation's.  Local copies between memory spaces (copy-start/-done) and
instructions that only name data (bitcast, get-tuple-element, tuple, parameter, constant)
take no time.  Transfers between slices (host transfers to the cross-slice runtime) are
not priced here: the text raises ScheduleError.

Both the figures this gives and the cost model's are estimates: neither is a measurement
of a TPU.  Plain Python over the HLO text; compiling needs libtpu (tpu_aot.py).
"""

from __future__ import annotations

import dataclasses
import re

from equarx_pass.ir import hlo_text as hlo
from equarx_pass.platforms import LinkClass

# Clock of a TPU generation's TensorCore, by the topology name's prefix: what turns the
# compiler's estimated cycles into seconds.  From the published peak bf16 rates over the
# MXUs' multiply-adds per cycle (v4: 275 TFLOP/s, 8 MXUs of 128 x 128 per chip; v5e:
# 197 TFLOP/s, 4; v5p: 459 TFLOP/s, 8).  v6e publishes none that this reads: give it.
CLOCK_HZ = {"v4": 1.05e9, "v5e": 1.5e9, "v5litepod": 1.5e9, "v5p": 1.75e9}

_OP = re.compile(r"\s([a-z][\w\-]*)\(")
_OPERAND = re.compile(r"%([\w.\-]+)")
_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')
_DECLARED_BYTES = re.compile(r'"cost_estimate":\{[^}]*"bytes_accessed":"(\d+)"')
COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "reduce-scatter", "collective-permute")
# Instructions that only name data or move it between a chip's own memories.
_FREE = (
  "bitcast",
  "get-tuple-element",
  "tuple",
  "parameter",
  "constant",
  "copy-start",
  "copy-done",
  "after-all",
  "partition-id",
  "replica-id",
  "opt-barrier",
)


class ScheduleError(ValueError):
  """A compiled program this reading cannot price faithfully."""


@dataclasses.dataclass(frozen=True)
class Chip:
  """What prices a program: the core's clock, its HBM bandwidth, the link."""

  clock_hz: float
  hbm_bytes_per_s: float
  link: LinkClass


@dataclasses.dataclass(frozen=True)
class Transfer:
  """One collective of the program, as the replay priced it."""

  name: str
  op: str
  wire_bytes: float
  seconds: float  # on the link, latency included
  asynchronous: bool
  hidden_seconds: float  # of `seconds`, what ran while the core worked


@dataclasses.dataclass(frozen=True)
class ScheduleEstimate:
  """A program's time by its schedule (seconds), and its parts."""

  seconds: float
  core_seconds: float  # the work on the core, one instruction after the other
  transfers: tuple[Transfer, ...]

  @property
  def wire_seconds(self) -> float:
    return sum(t.seconds for t in self.transfers)

  @property
  def hidden_seconds(self) -> float:
    """Transfer time that ran while the core worked."""
    return sum(t.hidden_seconds for t in self.transfers)


def clock_for(topology: str) -> float:
  """The TensorCore clock of a topology ('v5e:2x2'); raises ScheduleError where none is
  known."""
  generation = topology.split(":", 1)[0]
  if generation not in CLOCK_HZ:
    raise ScheduleError(
      f"no clock figure for TPU {generation} (known: {', '.join(CLOCK_HZ)}): give one"
    )
  return CLOCK_HZ[generation]


def array_bytes(type_text: str) -> float:
  """Bytes of an HLO type ('bf16[16,128]{...}' or a tuple of them)."""
  total, unknown = hlo.shape_bytes(type_text)
  if unknown:
    raise ScheduleError(f"unknown HLO element type {unknown[0]!r} in {type_text[:120]!r}")
  return total


@dataclasses.dataclass(frozen=True)
class _Instruction:
  name: str
  op: str
  result_bytes: float
  operands: tuple[str, ...]
  line: str

  @property
  def cycles(self) -> float:
    return sum(float(c) for c in _CYCLES.findall(self.line))


def _closing(text: str, start: int) -> int:
  """Index of the parenthesis that closes the one open before `start`."""
  depth = 1
  for i in range(start, len(text)):
    if text[i] == "(":
      depth += 1
    elif text[i] == ")":
      depth -= 1
      if depth == 0:
        return i
  return len(text)


def _instructions(lines: list[str]) -> list[_Instruction]:
  out = []
  for line in lines:
    lhs, eq, rhs = line.strip().removeprefix("ROOT ").partition(" = ")
    if not eq:
      continue
    found = _OP.search(rhs)
    if found is None:
      continue
    args = rhs[found.end() : _closing(rhs, found.end())]
    out.append(
      _Instruction(
        lhs.lstrip("%"),
        found.group(1),
        array_bytes(rhs[: found.start()]),
        tuple(_OPERAND.findall(args)),
        line,
      )
    )
  return out


def group_size(line: str) -> int:
  """The size of a collective's groups, from its replica_groups (hlo_text.replica_groups:
  listed, iota or over a mesh)."""
  try:
    groups = hlo.replica_groups(line, 0)
  except ValueError as e:
    raise ScheduleError(str(e)) from None
  if not groups or not groups[0]:
    raise ScheduleError(f"no replica groups read in {line.strip()[:160]!r}")
  return len(groups[0])


def wire_bytes(op: str, line: str, operand_bytes: float, result_bytes: float) -> float:
  """Bytes one chip sends for a collective `op` (cost.py's accounting)."""
  if op == "collective-permute":
    return operand_bytes
  n = group_size(line)
  share = (n - 1) / n
  if op == "all-reduce":
    return 2 * share * result_bytes
  if op == "all-gather":
    return share * result_bytes
  return share * operand_bytes  # all-to-all, reduce-scatter


class _Replay:
  """The core's clock and the links' through one run of the program."""

  def __init__(self, comps: dict[str, list[str]], chip: Chip):
    self.comps = comps
    self.chip = chip
    self.core = 0.0  # when the core is next free
    self.core_busy = 0.0
    self.link = 0.0  # when the links are next free
    self.transfers: list[Transfer] = []

  def transfer(self, name: str, op: str, nbytes: float, asynchronous: bool) -> float:
    """Queue a transfer on the links from now; returns when it ends."""
    seconds = self.chip.link.seconds(nbytes, 1)
    start = max(self.core, self.link)
    self.link = start + seconds
    self.transfers.append(Transfer(name, op, nbytes, seconds, asynchronous, 0.0))
    return self.link

  def run(self, computation: str) -> None:
    sizes: dict[str, float] = {}
    pending: dict[str, tuple[int, float, float]] = {}  # start -> (transfer, end, core then)
    lines = self.comps[computation]
    for ins in _instructions(lines):
      sizes[ins.name] = ins.result_bytes
      operand_bytes = sum(sizes.get(o, 0.0) for o in ins.operands)
      op = ins.op
      if op in ("send", "recv", "send-done", "recv-done") or "is_host_transfer=true" in ins.line:
        raise ScheduleError(
          f"{ins.name}: a host transfer (between slices) is not priced by this reading"
        )
      if op == "while":
        trips = hlo.trip_count(self.comps, lines, ins.line)
        body = re.search(r"body=%?([\w.\-]+)", ins.line)
        if body is None:
          raise ScheduleError(f"{ins.name}: a while loop without a body read")
        for _ in range(trips):
          self.run(body.group(1))
        continue
      if op == "call":
        callee = re.search(r"to_apply=%?([\w.\-]+)", ins.line)
        if callee is None:
          raise ScheduleError(f"{ins.name}: a call without a computation read")
        self.run(callee.group(1))
        continue
      if op in ("conditional", "async-start", "async-update", "async-done"):
        raise ScheduleError(f"{ins.name}: {op} is not priced by this reading")
      base = op.removesuffix("-start").removesuffix("-done")
      if base in COLLECTIVES:
        if op.endswith("-start"):
          done = self._done_of(ins.name, lines)
          nbytes = wire_bytes(base, ins.line, operand_bytes, done)
          end = self.transfer(ins.name, base, nbytes, asynchronous=True)
          pending[ins.name] = (len(self.transfers) - 1, end, self.core)
        elif op.endswith("-done"):
          started = [o for o in ins.operands if o in pending]
          if len(started) != 1:
            raise ScheduleError(f"{ins.name}: a -done whose -start was not read")
          start = started[0]
          index, end, core_then = pending.pop(start)
          hidden = min(self.core, end) - core_then
          t = self.transfers[index]
          self.transfers[index] = dataclasses.replace(
            t, hidden_seconds=max(0.0, min(t.seconds, hidden))
          )
          self.core = max(self.core, end)
        else:
          nbytes = wire_bytes(op, ins.line, operand_bytes, ins.result_bytes)
          self.core = self.transfer(ins.name, op, nbytes, asynchronous=False)
        continue
      if op in _FREE:
        continue
      declared = _DECLARED_BYTES.search(ins.line) if op == "custom-call" else None
      moved = float(declared.group(1)) if declared else operand_bytes + ins.result_bytes
      roofline = moved / self.chip.hbm_bytes_per_s
      seconds = max(ins.cycles / self.chip.clock_hz, roofline)
      self.core += seconds
      self.core_busy += seconds
    if pending:
      raise ScheduleError(f"{computation}: {', '.join(pending)} started and never done")

  def _done_of(self, start: str, lines: list[str]) -> float:
    """The result bytes of the -done that ends the async collective `start`."""
    for ins in _instructions(lines):
      if ins.op.endswith("-done") and start in ins.operands:
        return ins.result_bytes
    raise ScheduleError(f"{start}: no -done read")


def estimate(hlo_text: str, chip: Chip) -> ScheduleEstimate:
  """The time of one run of a compiled, scheduled TPU program (its HLO text)."""
  comps, entry = hlo.split_computations(hlo_text)
  if entry is None:
    raise ScheduleError("no ENTRY computation in the text")
  if "is_scheduled=true" not in hlo_text.split("\n", 1)[0]:
    raise ScheduleError("the program is not scheduled (not a compiled program's text)")
  replay = _Replay(comps, chip)
  try:
    replay.run(entry)
  except hlo.UnknownTripCount as e:
    raise ScheduleError(f"a while loop's trip count: {e}") from None
  end = max(replay.core, replay.link)
  return ScheduleEstimate(end, replay.core_busy, tuple(replay.transfers))


# The TPU link classes (platforms.TPU_LINKS) by the topology name's generation prefix.
DEVICE_KIND = {
  "v4": "TPU v4",
  "v5e": "TPU v5 lite",
  "v5litepod": "TPU v5 lite",
  "v5p": "TPU v5",
  "v6e": "TPU v6 lite",
}


def ici_for(topology: str) -> LinkClass:
  """The cost model's ICI link of a topology's generation ('v5p:2x2x1')."""
  from equarx_pass.platforms import TPU_LINKS

  generation = topology.split(":", 1)[0]
  if generation not in DEVICE_KIND:
    raise ScheduleError(f"no link figure for TPU {generation} (known: {', '.join(DEVICE_KIND)})")
  return TPU_LINKS[DEVICE_KIND[generation]][0]


def probe_module(num_devices: int, values: int = 1 << 22) -> str:
  """A program of one elementwise add on every chip: what the compiler's HBM bandwidth is
  read from (its optimal_seconds is the bytes it moves over that bandwidth)."""
  t = f"tensor<{values}xf32>"
  return (
    f"module @probe attributes {{mhlo.num_partitions = {num_devices} : i32, "
    f"mhlo.num_replicas = 1 : i32}} {{\n"
    f"  func.func public @main(%arg0: {t}) -> {t} {{\n"
    f"    %0 = stablehlo.add %arg0, %arg0 : {t}\n"
    f"    return %0 : {t}\n  }}\n}}\n"
  )


def chip_for(topology: str, num_devices: int, link: LinkClass | None = None) -> Chip:
  """The Chip of a TPU topology: its clock (CLOCK_HZ), the HBM bandwidth the compiler
  itself assumes (one compile of probe_module, libtpu), the ICI link the cost model uses
  for its generation unless `link` is given."""
  from equarx_pass.frontends import tpu_aot

  probe = tpu_aot.compile_for_target(probe_module(num_devices), f"tpu:{topology}")
  seconds, nbytes = probe.cost.get("optimal_seconds"), probe.cost.get("bytes accessed")
  if not seconds or not nbytes:
    raise ScheduleError(f"the compiler gave no HBM figure for {topology}: {probe.cost}")
  return Chip(clock_for(topology), nbytes / seconds, link or ici_for(topology))
