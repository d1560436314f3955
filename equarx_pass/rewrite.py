"""rewrite + verify: replace every selected collective, on a copy, and check the result.

`rewrite_module` never mutates its input.  It copies the module, matches every
all-reduce (and with --equarx_ops reduce-scatter and all-gather: match.py), plans each
candidate's route on the topology (plan.py), and puts in its place what the first
matching pattern of site_patterns.py emits (with --equarx_outline, the compute between
its collectives moved into private functions called there: outline.py).  It verifies the
copy and returns it with one SiteRecord per site, built last (site_records.py).  Any
failure raises and the half-rewritten copy is dropped, so a caller only ever sees the original module or a
complete, verified rewrite.
"""

from __future__ import annotations

import dataclasses
import io
import time
from typing import Any, Sequence

from jax.extend.mlir import ir
from jax.extend.mlir.dialects import func
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass import site_patterns, site_records
from equarx_pass import topology as topology_lib
from equarx_pass.emission import quantize_kernel
from equarx_pass.errors import FlagError, InternalError, VerifyError
from equarx_pass.ir import outline, traverse
from equarx_pass.ir.hlo_builder import ChannelAllocator
from equarx_pass.planning import loops, match, plan
from equarx_pass.planning.policy import Policy
from equarx_pass.site_records import SiteRecord


@dataclasses.dataclass
class RewriteResult:
  module: ir.Module
  records: list[SiteRecord]
  seconds: float
  topology: topology_lib.Topology | None = None

  @property
  def modified(self) -> bool:
    return any(r.rewritten for r in self.records)


def copy_module(module: ir.Module) -> ir.Module:
  """A deep copy in the same context (the original stays as it was).

  Through bytecode: it keeps every location, which the site report shows.
  """
  buffer = io.BytesIO()
  module.operation.write_bytecode(buffer)
  return ir.Module.parse(buffer.getvalue(), context=module.context)


def rewrite_module(
  module: ir.Module,
  policy: Policy,
  platform: str | None = None,
  devices: Sequence[Any] | None = None,
) -> RewriteResult:
  """Rewrite the all-reduces of a copy of `module` that `policy` selects.

  platform: the JAX platform the result will be compiled for ("cpu", "gpu", "tpu"),
  when known; with --equarx_outline=auto, sites are outlined only for "cpu".
  devices: the program's devices, by logical id (jax devices), where known: their fast
  domains (TPU slices, processes) unless the flags say others (topology.derive).

  copy -> match -> plan -> emit -> verify; the records are built last, from what was
  decided and emitted (site_records.py).
  """
  start = time.perf_counter()
  out = copy_module(module)
  outline_into = out if policy.outlines(platform) else None
  target = policy.target_platform(platform)
  policy, flat_why = policy.replace(platform=target).resolved()
  selection = policy.selection
  facts = match.module_facts(out)
  topology = _topology(facts, policy, target, devices)
  ops = match.find_sites(out, policy.ops)
  decisions = [
    plan.decide(match.match(op, i, facts, selection), policy, topology) for i, op in enumerate(ops)
  ]
  decisions = plan.calibrated_routes(decisions, policy, topology)
  runs_of = loops.runs_in(out)
  runs = [runs_of(op) for op in ops]  # read before emission erases the ops
  candidates = [d for d in decisions if isinstance(d, match.Candidate)]
  kernel_form = None
  if candidates:
    kernels, no_kernel = _quantize_kernels(out, policy, platform, target, flat_why)
    ctx = site_patterns.RewriteContext(
      policy.emission,
      ChannelAllocator(traverse.max_channel_handle(out)),
      topology,
      target,
      tiled_form=flat_why is None,
      kernels=kernels,
    )
    notes: dict[int, list[tuple[str, str]]] = {}
    with out.context:
      for cand in candidates:
        site_ctx = ctx.for_site()
        replacement = site_patterns.pattern_for(cand).replacement(cand, site_ctx)
        _emit_in_place(cand, replacement, outline_into if replacement.outline else None)
        if site_ctx.kernels is not None:
          notes[cand.site.index] = site_ctx.kernels.notes
    verify(out)
    if policy.form == "kernel":
      target_of = kernels.target if kernels else ""
      kernel_form = site_records.KernelForm(target_of, no_kernel, notes)
  records = site_records.records(decisions, policy, flat_why, runs, kernel_form)
  return RewriteResult(out, records, time.perf_counter() - start, topology)


def _quantize_kernels(
  module: ir.Module, policy: Policy, platform: str | None, target: str, flat_why: str | None
) -> tuple[quantize_kernel.QuantizeKernels | None, str]:
  """The kernel form's kernels for `module` (None where there are none), and why not."""
  if policy.form != "kernel" or flat_why is not None:
    return None, ""
  where = quantize_kernel.target_for(platform, target)
  if where not in ("tpu", "cuda", "interpret"):
    return None, where
  return quantize_kernel.QuantizeKernels(module, where), ""  # type: ignore[arg-type]


def _topology(
  facts: match.ModuleFacts, policy: Policy, platform: str, devices: Sequence[Any] | None
) -> topology_lib.Topology:
  """The module's topology by the one rule (topology.derive), from the policy's flags."""
  links = policy.links
  try:
    return topology_lib.derive(
      facts.num_partitions * facts.num_replicas,
      platform,
      devices,
      links.domain_devices,
      links.domains,
      links.one_slice,
      links.fast_link_bandwidth,
      links.slow_link_bandwidth,
      links.node_size,
    )
  except ValueError as e:
    raise FlagError(f"--equarx_domains: {e}") from None


def _emit_in_place(
  cand: match.Candidate,
  replacement: site_patterns.Replacement,
  outline_into: ir.Module | None,
) -> None:
  """Emit the replacement at the all-reduce, rewire its uses, erase it; given a module to
  outline into, move the compute between the replacement's collectives into functions
  of it (outline.py: the collectives stay here, in program order).

  An async pair (all-reduce-start/-done) is replaced whole, at the async_done: that is
  where its result is first needed.  An all-reduce that promotes (bf16 in, f32 out)
  gets its operands converted to the result type first: the sum is in that type.
  """
  op = cand.op
  location = op.location
  pair = match.async_pair(op)
  if isinstance(pair, str):  # matching skips these
    raise InternalError(f"all-reduce #{cand.site.index}: {pair}")
  if cand.slice_op is not None:  # an all-reduce and the slice of each rank's piece
    sliced = cand.slice_op
    at, operands, old_results, erase = sliced, list(op.operands), list(sliced.results), [sliced, op]
  elif pair is not None:
    start, done = pair
    at, operands, old_results, erase = done, list(start.operands), list(done.results), [done, start]
  else:
    at, operands, old_results, erase = op, list(op.operands), list(op.results), [op]
  result_types = [v.type for v in old_results]

  def emit_promoted(values):
    return replacement.emit([_promote(v, t) for v, t in zip(values, result_types)])

  try:
    with location, ir.InsertionPoint(at):
      if outline_into is not None:
        new_values, site_ops = _emit_collecting(operands, at, outline_into, emit_promoted)
      else:
        new_values, site_ops = emit_promoted(operands), []
  except Exception as e:
    raise InternalError(
      f"all-reduce #{cand.site.index} at {cand.site.location}: cannot emit "
      f"{replacement.what} ({type(e).__name__}: {_first_line(e)}); this is a bug in "
      f"equarx-pass, please report it; to go on, {replacement.advice}"
    ) from e
  for old, new in zip(old_results, new_values):
    old.replace_all_uses_with(new)
  for dead in erase:
    dead.erase()
  if outline_into is not None and site_ops:
    with outline_into.context:
      outline.outline_compute(
        site_ops, outline_into, f"equarx_allreduce_{cand.site.index}", location
      )


def _emit_collecting(
  operands: list[ir.Value], at: ir.Operation, module: ir.Module, emit
) -> tuple[list[ir.Value], list[ir.Operation]]:
  """Emit the replacement before `at`, as emit_promoted does, and also return the ops it
  made, in order.  They are built in a scratch function of `module` (the bindings give no
  way to walk a block from an op) and moved before `at`."""
  with ir.InsertionPoint(module.body):
    scratch = func.FuncOp("equarx_scratch", ir.FunctionType.get([v.type for v in operands], []))
  body = scratch.add_entry_block()  # type: ignore[attr-defined]  # the bindings add it
  with ir.InsertionPoint(body):
    values = emit(list(body.arguments))
  ops = [view.operation for view in body.operations]
  for argument, value in zip(body.arguments, operands):
    argument.replace_all_uses_with(value)
  for made in ops:
    made.move_before(at)
  scratch.operation.erase()
  return values, ops


def _promote(value: ir.Value, result_type: ir.Type) -> ir.Value:
  """`value` converted to the element type of `result_type`, where they differ."""
  source = ir.RankedTensorType(value.type)
  element = ir.RankedTensorType(result_type).element_type
  if source.element_type == element:
    return value
  return hlo.ConvertOp(ir.RankedTensorType.get(source.shape, element), value).result


def _first_line(e: BaseException | str) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else ""


def verify(module: ir.Module, what: str = "rewritten module") -> None:
  """MLIR verification.  A failure is the pass's own bug (its input was verified):
  one line, naming the first error and where it is, never a dump of the module."""
  try:
    ok = module.operation.verify()
  except ir.MLIRError as e:
    diag = e.error_diagnostics[0] if e.error_diagnostics else None
    where = f" at {_short_location(diag.location)}" if diag is not None else ""
    message = _first_line(diag.message if diag is not None else e.message or str(e))
    raise VerifyError(
      f"internal error: the {what} failed verification{where}: {message}; "
      "this is a bug in equarx-pass, please report it; to go on, exclude "
      "that all-reduce (--equarx_max_bytes, --equarx_dtypes) or rerun "
      "without --equarx_enable"
    ) from None
  if not ok:
    raise VerifyError(f"internal error: the {what} failed verification")


def _short_location(location: ir.Location) -> str:
  text = str(location)
  return text if len(text) <= 120 else text[:117] + "..."
