"""Ahead-of-time compiles of a (rewritten) module for a TPU topology (--equarx_compile_for).
GPU clusters (gpu:MODEL:NxG) go to gpu_aot.py, which returns the same TopologyCompile.

No TPU is needed: libtpu (the jax[tpu] extra) gives compile-only devices for a
named topology (e.g. v5e:2x2, v4:2x2x1), and their client compiles a StableHLO
module into a real TPU executable.  libtpu can abort the whole process on a
module it dislikes instead of raising, so the compile runs in a child process
(`python -m equarx_pass.frontends.tpu_aot TARGET < module.mlir`) and a crash becomes a
CompileError.  Compiling for the CPU/GPU the program runs on happens in jit.py,
through JAX's own Lowered.compile().

libtpu takes a lock file so that one process at a time drives a TPU; a compile-only
client drives none, so the child sets ALLOW_MULTIPLE_LIBTPU_LOAD=1 (unless the user set
it): TPU compiles then run side by side with other JAX processes and with each other.
libtpu is the optional tpu extra (pip install 'equarx-pass[tpu]'); without it the
compile fails with a CompileError that says so.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from typing import Any

from equarx_pass.errors import CompileError
from equarx_pass.frontends import compile_child
from equarx_pass.planning.policy import parse_compile_target

COMPILE_TIMEOUT_S = 600
LIBTPU_MULTI_LOAD = "ALLOW_MULTIPLE_LIBTPU_LOAD"
LIBTPU_HINT = (
  "libtpu is not installed: install the tpu extra (pip install '.[tpu]' in a checkout, "
  "'equarx-pass[tpu]' from a wheel)"
)


def have_libtpu() -> bool:
  """Whether libtpu (the tpu extra) is installed, without loading it."""
  import importlib.util

  return importlib.util.find_spec("libtpu") is not None


@dataclasses.dataclass
class TopologyCompile:
  """What the TPU compiler made of a module."""

  target: str
  seconds: float  # compile time inside the child, excluding start-up
  num_devices: int
  quantized_permutes: int  # collective-permute(-start)s that move s8 data
  permutes: int  # all collective-permute(-start)s
  all_reduces: int  # all-reduce(-start)s left in the TPU program, cross-slice ones included
  quantized_collectives: int  # permutes, all-to-alls and all-gathers that move s8 data
  cost: dict  # the TPU compiler's cost_analysis(), as given
  hlo_text: str = dataclasses.field(repr=False, default="")
  all_reduce_shapes: tuple = ()  # the result shape of each all-reduce left
  temp_bytes: int | None = None  # temporary device memory the program needs, where given
  # The most device memory the program holds at once (arguments, results and temporaries;
  # libtpu counts a Pallas kernel's operands here and not in temp_bytes), where given.
  peak_bytes: int | None = None
  # All-reduces across slices: on multislice TPU these compile to host transfers to the
  # cross-slice runtime (cross_slice_bytes), not to all-reduce instructions.
  cross_slice_all_reduces: int = 0
  # GPU clusters (gpu_aot.py): bytes per device the program sends between nodes, counted
  # from its replica groups (gpu_aot.cross_node_bytes).
  cross_node_bytes: float | None = None
  # The program before the rewrite, compiled for the same target (compare_to_original).
  original: TopologyCompile | None = dataclasses.field(repr=False, default=None)

  @property
  def on_chip_seconds(self) -> float | None:
    """The compiler's estimate of one run's on-chip time, where it gives a usable one."""
    value = self.cost.get("optimal_seconds")
    return value if value is not None and value > 0 else None

  def summary(self) -> str:
    left = f"{self.all_reduces} all-reduce{'' if self.all_reduces == 1 else 's'} left"
    if self.cross_slice_all_reduces:
      left += f" ({self.cross_slice_all_reduces} across slices, as host transfers)"
    if self.all_reduce_shapes:
      left += f" ({', '.join(self.all_reduce_shapes)})"
      # The tiled forms' all-gather of the f32 scales, which the TPU compiler implements
      # as an all-reduce of a zero-padded buffer when it is small (a rewritten program:
      # it moves s8 codes; else the all-reduces left are the program's own).
      if (
        self.target.startswith("tpu:")
        and self.quantized_collectives
        and all(shape.startswith("f32[") for shape in self.all_reduce_shapes)
      ):
        left += "; the TPU compiler makes small all-gathers (the f32 scales') all-reduces"
    return (
      f"compiled for {self.target} in {self.seconds:.2f} s: {self.num_devices} devices, "
      f"{self.quantized_collectives} s8 collectives ({self.quantized_permutes} of "
      f"{self.permutes} collective-permutes), {left}{self._across_nodes()}"
    ) + self._against_original()

  def _across_nodes(self) -> str:
    if self.cross_node_bytes is None:
      return ""
    from equarx_pass.report import fmt_bytes  # (the report's units; imports the pass)

    return f"; {fmt_bytes(round(self.cross_node_bytes))} per device across nodes"

  def _against_original(self) -> str:
    """The compiler's on-chip estimate and temporary memory beside the original
    program's: for the whole program, since the compiler gives no figure per site."""
    original = self.original
    if original is None:
      return ""
    parts = []
    if self.cross_node_bytes is not None and original.cross_node_bytes is not None:
      from equarx_pass.report import fmt_bytes  # (the report's units; imports the pass)

      parts.append(
        f"across nodes {fmt_bytes(round(self.cross_node_bytes))} per device against the original's "
        f"{fmt_bytes(round(original.cross_node_bytes))} (counted from the compiled programs' "
        "replica groups)"
      )
    mine, theirs = self.on_chip_seconds, original.on_chip_seconds
    if mine is not None and theirs is not None:
      parts.append(
        f"on chip {mine * 1e6:.1f} us against the original's {theirs * 1e6:.1f} us "
        f"({mine / theirs:.2f}x its time; the compiler's estimate, no transfer time)"
      )
    from equarx_pass.report import fmt_bytes  # (the report's units; imports the pass)

    if self.temp_bytes is not None and original.temp_bytes is not None:
      parts.append(
        f"temporary memory {fmt_bytes(self.temp_bytes)} against the original's "
        f"{fmt_bytes(original.temp_bytes)}"
      )
    if self.peak_bytes is not None and original.peak_bytes is not None:
      parts.append(
        f"peak memory {fmt_bytes(self.peak_bytes)} against the original's "
        f"{fmt_bytes(original.peak_bytes)}"
      )
    return "".join(f"\n  {part}" for part in parts)


def compile_for_target(
  module_text: str, target: str, timeout: float = COMPILE_TIMEOUT_S, device_ids=None
) -> TopologyCompile:
  """Compile `module_text` for `target` ('tpu:v5e:2x2', 'gpu:h100:2x8') in a child process.
  device_ids: for a GPU cluster, its device ids by logical id (gpu_aot.compile_for_target)."""
  platform, _ = parse_compile_target(target)
  if platform == "gpu":
    from equarx_pass.frontends import gpu_aot

    data = gpu_aot.compile_for_target(module_text, target, timeout, device_ids)
    return TopologyCompile(**data, **count_collectives(data["hlo_text"]))
  if not have_libtpu():
    raise CompileError(f"cannot compile for {target}: {LIBTPU_HINT}")
  data = compile_child.run(
    "equarx_pass.frontends.tpu_aot",
    module_text,
    target,
    [],
    {"TPU_SKIP_MDS_QUERY": "1", LIBTPU_MULTI_LOAD: os.environ.get(LIBTPU_MULTI_LOAD, "1")},
    timeout,
  )
  return TopologyCompile(**data)


def compare_to_original(
  module_text: str,
  original_text: str,
  target: str,
  timeout: float = COMPILE_TIMEOUT_S,
  device_ids=None,
) -> TopologyCompile:
  """compile_for_target of the rewritten module, with the original module compiled for
  the same target beside it (TopologyCompile.original); the same text is compiled once."""
  done = compile_for_target(module_text, target, timeout, device_ids)
  if original_text != module_text:
    done.original = compile_for_target(original_text, target, timeout, device_ids)
  return done


def count_collectives(hlo_text: str) -> dict:
  """Collective instructions of an HLO module text, by what they move."""
  permutes = quantized = all_reduces = quantized_collectives = cross_slice = 0
  shapes = []
  for line in hlo_text.splitlines():
    _, eq, rhs = line.partition(" = ")
    if not eq:
      continue
    moves_s8 = rhs.lstrip("(").startswith("s8[")
    if " collective-permute-start(" in rhs or " collective-permute(" in rhs:
      permutes += 1
      quantized += moves_s8
      quantized_collectives += moves_s8
    elif any(f" {op}(" in rhs or f" {op}-start(" in rhs for op in ("all-to-all", "all-gather")):
      quantized_collectives += moves_s8
    elif " all-reduce(" in rhs or " all-reduce-start(" in rhs:
      all_reduces += 1
      shapes.append(rhs.split("{", 1)[0].split(" ", 1)[0])
    elif _is_cross_slice_all_reduce(rhs):
      cross_slice += 1
  return {
    "permutes": permutes,
    "quantized_permutes": quantized,
    "all_reduces": all_reduces + cross_slice,
    "cross_slice_all_reduces": cross_slice,
    "quantized_collectives": quantized_collectives,
    "all_reduce_shapes": shapes,
  }


# Bytes per element of the HLO element types a transfer may carry.
_HLO_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2}
_TRANSFER = re.compile(r"= \(([a-z0-9]+)\[([0-9,]*)\]")
_TRANSFER_TYPE = re.compile(r'_xla_megascale_transfer_type="(\w+)"')


def _is_cross_slice_all_reduce(rhs: str) -> bool:
  """A host transfer that sends one all-reduce's operand to the cross-slice runtime (its
  -done half and the matching recv are the same all-reduce)."""
  return (
    " send(" in rhs
    and "is_host_transfer=true" in rhs
    and '_xla_megascale_transfer_type="ALL_REDUCE"' in rhs
  )


def cross_slice_bytes(hlo_text: str, num_slices: int, in_branches: bool = False) -> float:
  """Bytes per chip that a compiled multislice TPU program sends between slices (DCN).

  Traffic between slices is the program's host transfers (`send`/`recv` with
  `is_host_transfer=true`) to the cross-slice runtime, each typed by the attribute
  `_xla_megascale_transfer_type`.  For S slices, per chip and per transfer of B bytes:
  an ALL_REDUCE sends 2 (S-1)/S B (a bandwidth-optimal all-reduce of B across S), an
  ALL_TO_ALL (S-1)/S B (the parts bound for other slices), an ALL_GATHER of a result of
  R bytes (S-1)/S R (its own part once to every other slice); any other host transfer,
  its B bytes.  B is the transfer's shape as the compiler wrote it: where the operand's
  layout pads its (8, 128) tiles, the compiler sends the padded buffer and the shape says
  so (a `ZeroCrop` of f32[N,64] to f32[N,128] before the send).

  Per run of the program: a transfer inside a while loop's body counts once per iteration
  (hlo_text.executions; a loop whose trip count the text does not give raises
  hlo_text.UnknownTripCount).  Computations that run only when a conditional's branch is
  taken (hlo_text.only_in_branches) are left out; `in_branches` counts them instead, each
  as if its branch were taken.  Text with no computation headers (a fragment) is counted
  as it is.
  """
  from equarx_pass.ir import hlo_text as hlo

  comps, entry = hlo.split_computations(hlo_text)
  if entry is None:
    return 0.0 if in_branches else _transfer_bytes(hlo_text.splitlines(), num_slices)
  runs = hlo.executions(hlo_text)
  taken = hlo.only_in_branches(hlo_text)
  return sum(
    runs[name] * _transfer_bytes(lines, num_slices)
    for name, lines in comps.items()
    if name in runs and (name in taken) == in_branches
  )


def _transfer_bytes(lines, num_slices: int) -> float:
  """cross_slice_bytes of the instructions `lines`, each counted once."""
  share = (num_slices - 1) / num_slices
  total = 0.0
  for line in lines:
    if "is_host_transfer=true" not in line or "-done" in line.split("=")[0]:
      continue
    sends, receives = " send(" in line, " recv(" in line
    found = _TRANSFER.search(line)
    if not found or not (sends or receives):
      continue
    dims = [int(d) for d in found.group(2).split(",") if d]
    nbytes = _HLO_BYTES.get(found.group(1), 4) * math.prod(dims)
    kind_match = _TRANSFER_TYPE.search(line)
    kind = kind_match.group(1) if kind_match else "OTHER"
    if kind == "ALL_GATHER":
      total += share * nbytes if receives else 0
    elif sends:
      total += {"ALL_REDUCE": 2 * share, "ALL_TO_ALL": share}.get(kind, 1.0) * nbytes
  return total


def estimated_cycles(hlo_text: str) -> float:
  """Sum of the per-instruction "estimated_cycles" the TPU compiler writes into a compiled
  program's HLO, each computation's times the runs of it in one run of the program (while
  bodies: their trip count, hlo_text.executions).  Instructions are summed as if run one
  after the other (the compiler's other estimate, cost_analysis()'s optimal_seconds, may
  overlap them), and a Pallas kernel's own work is not in it (its custom call carries no
  estimate)."""
  from equarx_pass.ir import hlo_text as hlo

  comps, _ = hlo.split_computations(hlo_text)
  runs = hlo.executions(hlo_text)
  return sum(
    runs.get(name, 0) * sum(float(c) for line in lines for c in _CYCLES.findall(line))
    for name, lines in comps.items()
  )


_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')


def _compile_in_this_process(module_text: str, target: str) -> dict:
  from jax.experimental import topologies

  _, topology = parse_compile_target(target)
  devices: list[Any] = topologies.get_topology_desc(topology, "tpu").devices
  compiled = compile_child.compile_here(module_text, devices, topology)
  if isinstance(compiled, dict):
    return compiled
  executable, seconds = compiled
  hlo_text = "\n".join(m.to_string() for m in executable.hlo_modules())
  cost = executable.cost_analysis() if hasattr(executable, "cost_analysis") else {}
  if isinstance(cost, list):
    cost = cost[0] if cost else {}
  cost = {k: float(v) for k, v in dict(cost).items()}
  try:
    stats = executable.get_compiled_memory_stats()
    temp_bytes: int | None = int(stats.temp_size_in_bytes)
    peak_bytes: int | None = int(getattr(stats, "peak_memory_in_bytes", 0)) or None
  except Exception:  # a client that gives no memory statistics
    temp_bytes = peak_bytes = None
  return dict(
    temp_bytes=temp_bytes,
    peak_bytes=peak_bytes,
    target=target,
    seconds=seconds,
    num_devices=len(devices),
    cost=cost,
    hlo_text=hlo_text,
    **count_collectives(hlo_text),
  )


def main(argv: list[str]) -> int:
  os.environ.setdefault(LIBTPU_MULTI_LOAD, "1")  # before libtpu loads (see the docstring)
  usage = "usage: python -m equarx_pass.frontends.tpu_aot tpu:TOPOLOGY < module"
  return compile_child.child_main(argv, usage, (2,), _compile_in_this_process)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
