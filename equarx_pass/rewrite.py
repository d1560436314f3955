"""rewrite + verify: replace every selected collective, on a copy, and check the result.

`rewrite_module` never mutates its input.  It copies the module, matches every
all-reduce (and with --equarx_ops reduce-scatter and all-gather: match.py), plans each
candidate's route on the topology (plan.py), and puts in its place what the first
matching pattern of site_patterns.py emits (with --equarx_outline, the compute between
its collectives moved into private functions called there: outline.py).  It verifies the
copy and returns it with one SiteRecord per site.  Any failure raises and the
half-rewritten copy is dropped, so a caller only ever sees the original module or a
complete, verified rewrite.
"""

from __future__ import annotations

import dataclasses
import io
import time
from typing import Literal

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import func
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass import cost, forms, loops, match, outline, plan, quantize_kernel, site_patterns
from equarx_pass import topology as topology_lib
from equarx_pass.calibrated import calibration, outlier
from equarx_pass.hlo_builder import ChannelAllocator
from equarx_pass.calibrated.outlier_emit import CalibratedPlan
from equarx_pass.errors import FlagError, InternalError, VerifyError
from equarx_pass.policy import DTYPE_BYTES, Policy
from equarx_pass.site_kind import SiteKind


# What happened to an all-reduce.
Verdict = Literal["rewritten", "skipped"]


@dataclasses.dataclass(frozen=True)
class SiteRecord:
  """What happened to one collective (an all-reduce, or with --equarx_ops a reduce-scatter
  or an all-gather); the report and the CLI print these."""

  index: int
  location: str
  shapes: tuple[tuple[int, ...] | None, ...]  # None: not a static shape
  dtypes: tuple[str, ...]
  group_size: int
  num_groups: int
  decision: Verdict
  reason: str  # why skipped, or the scheme used
  bytes_before: int  # bytes one rank sends: a ring of the original dtype (all-reduce, ...)
  bytes_after: int  # bytes one rank sends after the rewrite (= before when skipped)
  kind: SiteKind = SiteKind.ALL_REDUCE  # what it is rewritten as
  found_as: SiteKind = SiteKind.ALL_REDUCE  # the op in the program (an all-reduce may be sliced)
  # Per link class (topology.py), bytes one device sends natively and rewritten, and the
  # cost model's speed-up (cost.py); None where no route was planned, or where the rewrite
  # sends more bytes than the native collective (plan.decide).
  traffic_before: cost.Traffic | None = None
  traffic_after: cost.Traffic | None = None
  speedup: float | None = None
  route: str = (
    ""  # How many times one run of the program executes the site (the while loops around it,
  )
  # loops.py); None: inside a loop whose trip count is not read.  The report's bytes are
  # per run of the program: a site's, times this.
  runs: int | None = 1
  # "flat", "hierarchical", "identity"; "" when not planned

  @property
  def rewritten(self) -> bool:
    return self.decision == "rewritten"


@dataclasses.dataclass
class RewriteResult:
  module: ir.Module
  records: list[SiteRecord]
  seconds: float
  topology: topology_lib.Topology | None = None

  @property
  def modified(self) -> bool:
    return any(r.rewritten for r in self.records)


def _ring_bytes_before(site: match.Site) -> int:
  """Bytes per rank of an unquantized ring all-reduce of the site's operands (a
  reduce-scatter: its first half; an all-gather: N-1 of its pieces)."""
  n = max(site.group_size, 1)
  total = 0
  for o in site.operands:
    if site.kind != SiteKind.ALL_REDUCE:
      piece = o.size // n if site.kind == SiteKind.REDUCE_SCATTER else o.size
      total += (n - 1) * piece * DTYPE_BYTES.get(o.dtype, match.bytes_of(o.dtype))
      continue
    per_chunk = -(-o.size // n)
    total += 2 * (n - 1) * per_chunk * DTYPE_BYTES.get(o.dtype, match.bytes_of(o.dtype))
  return total


def _tile_order_note(decision: match.Decision, policy: Policy, route: plan.Route) -> str:
  """Where a TPU's tiled form takes the operand's blocks: in its own (8, 128) tiles, or in
  its flat order (which the compiler relayouts), and why (forms.tile_grid)."""
  if policy.platform != "tpu" or route.name != "flat" or decision.site.kind != SiteKind.ALL_REDUCE:
    return ""
  if not isinstance(decision, match.Candidate) or decision.slice_op is not None:
    return ""
  shapes = [o.shape for o in decision.site.operands if o.shape is not None]
  if len(shapes) != len(decision.site.operands):
    return ""
  if len(shapes) == 1 and len(shapes[0]) == 1:
    return ""  # a vector: a TPU stores it in its flat order
  grid = forms.tile_grid(shapes, policy.scheme, decision.layout)
  if isinstance(grid, tuple):
    return "; blocks in the operand's tiles"
  return f"; blocks in flat order: {grid}"


def _record(decision: match.Decision, policy: Policy, flat_why: str | None) -> SiteRecord:
  """flat_why: why the flat form is emitted, None: the tiled form is."""
  site = decision.site
  route: plan.Route | None = decision.route
  before = round(route.native.total) if route else _ring_bytes_before(site)
  verdict: Verdict = "rewritten"
  sliced = isinstance(decision, match.Candidate) and decision.slice_op is not None
  if isinstance(decision, match.Skip):
    after, verdict, reason = before, "skipped", decision.reason
  elif policy.identity:
    native = (
      "the native all-reduce, each rank's piece sliced as recognised"
      if sliced
      else f"the native {site.kind.op_name}"
    )
    after, reason = before, f"identity: {native}, rebuilt"
  else:
    assert route is not None
    after = round(route.rewritten.total)
    # The algorithm does not enter an all-gather: one quantization, one all_gather.
    reason = plan.site_scheme(decision, policy).describe(algorithm=site.kind != SiteKind.ALL_GATHER)
    if route.name == "hierarchical":
      levels = route.note.removeprefix("levels=")
      reason = f"hierarchical ({levels}: native inside each domain, {reason} across)"
    elif route.note:
      reason += f"; {route.note}"
    forced_over = decision.forced_over if isinstance(decision, match.Candidate) else ""
    if forced_over:  # says what the plan would have done, the bytes sent among it
      reason += f"; forced (--equarx_force): {forced_over}"
    else:
      reason += _more_bytes_note(route)
    if flat_why is None:
      reason += _tile_order_note(decision, policy, route) + "; tiled form"
    elif not policy.calibration:
      reason += f"; flat form ({flat_why})"
  if isinstance(decision, match.Candidate):
    reason += _promotion_note(decision.op)
  if sliced:
    reason = f"an all-reduce and the slice of each rank's piece: {reason}"
  if site.kind != SiteKind.ALL_REDUCE:
    reason = f"{site.kind}: {reason}"
  prediction = decision.prediction
  return SiteRecord(
    site.index,
    site.location,
    tuple(o.shape for o in site.operands),
    tuple(o.dtype for o in site.operands),
    site.group_size,
    len(site.groups or ()),
    verdict,
    reason,
    before,
    after,
    site.kind,
    SiteKind.ALL_REDUCE if sliced else site.kind,
    route.native if route else None,
    (route.rewritten if verdict == "rewritten" else route.native) if route else None,
    prediction.speedup if prediction else None,
    route.name if route else "",
  )


def _promotion_note(op: ir.Operation) -> str:
  """'; bf16 summed as f32' for an all-reduce whose result type is wider."""
  pairs = {
    (str(ir.RankedTensorType(a.type).element_type), str(ir.RankedTensorType(r.type).element_type))
    for a, r in zip(op.operands, op.results)
  }
  promoted = sorted(f"{a} summed as {r}" for a, r in pairs if a != r)
  return f"; {', '.join(promoted)}" if promoted else ""


def _more_bytes_note(route: plan.Route) -> str:
  """Where a forced rewrite sends more than the native collective: on the slow links when
  it crosses any, else in all (padding to whole blocks, or a flat form across domains)."""
  if route.native.slow:
    before, after, where = route.native.slow, route.rewritten.slow, " across domains"
  else:
    before, after, where = route.native.total, route.rewritten.total, ""
  if before and after >= before:
    return f"; sends {after / before:.2f}x the native bytes{where}"
  return ""


def _padding_note(after: int, before: int) -> str:
  """Padding to whole blocks (a tiny tensor, or the grid layout with a rotation) can
  cost more than quantizing saves; --equarx_min_bytes is the user's guard."""
  if before and after >= before:
    return f"; sends {after / before:.2f}x the native bytes (padding)"
  return ""


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
  topology: topology_lib.Topology | None = None,
) -> RewriteResult:
  """Rewrite the all-reduces of a copy of `module` that `policy` selects.

  platform: the JAX platform the result will be compiled for ("cpu", "gpu", "tpu"),
  when known; with --equarx_outline=auto, sites are outlined only for "cpu".
  topology: the fast domains of the module's device ids and their links (topology.py);
  default: from --equarx_domain_devices / --equarx_domains, else one host per device.
  """
  start = time.perf_counter()
  out = copy_module(module)
  outline_into = out if policy.outlines(platform) else None
  target = policy.target_platform(platform)
  policy, flat_why = policy.replace(platform=target).resolved()
  facts = match.module_facts(out)
  if topology is None or policy.domain_devices or policy.domains:
    topology = default_topology(facts, policy, target)
  ops = match.find_sites(out, policy.ops)
  decisions = [
    plan.decide(match.match(op, i, facts, policy), policy, topology) for i, op in enumerate(ops)
  ]
  runs_of = loops.runs_in(out)
  records = [
    dataclasses.replace(_record(d, policy, flat_why), runs=runs_of(op))
    for d, op in zip(decisions, ops)
  ]
  candidates = [d for d in decisions if isinstance(d, match.Candidate)]
  calibrated: dict[int, CalibratedPlan] = {}
  if not policy.identity:
    candidates, calibrated = _calibrated_plans(candidates, policy, records, topology)
  if candidates:
    kernels, no_kernel = _quantize_kernels(out, policy, platform, target, flat_why)
    ctx = site_patterns.RewriteContext(
      policy,
      ChannelAllocator(match.max_channel_handle(out)),
      topology,
      target,
      tiled_form=flat_why is None,
      calibrated=calibrated,
      kernels=kernels,
    )
    with out.context:
      for cand in candidates:
        noted = len(kernels.notes) if kernels else 0
        replacement = site_patterns.pattern_for(cand).replacement(cand, ctx)
        _emit_in_place(cand, replacement, outline_into if replacement.outline else None)
        if policy.form == "kernel":
          notes = kernels.notes[noted:] if kernels else [("quantize", no_kernel)]
          records[cand.site.index] = _with_form(records[cand.site.index], notes, kernels)
    verify(out)
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


def _with_form(record: SiteRecord, notes: list[tuple[str, str]], kernels) -> SiteRecord:
  """The record of a site emitted under --equarx_form=kernel: which of its stages are
  kernels, and in how many parts (notes: quantize_kernel.QuantizeKernels.notes of this
  site, (stage, why not) and ("parts", how many))."""
  parts = "".join(f", in {n} parts" for stage, n in notes if stage == "parts")
  notes = [(stage, why) for stage, why in notes if stage != "parts"]
  ran = [stage for stage, why in notes if not why]
  declined = [(stage, why) for stage, why in notes if why]
  if ran:
    where = {"tpu": "Mosaic", "cuda": "Triton", "interpret": "Pallas interpreter"}
    stages = " + ".join(dict.fromkeys(ran))
    tiled = "".join(f"; {stage} tiled: {why}" for stage, why in declined)
    form = f"; kernel form (Pallas {stages}, {where[kernels.target]}{parts}{tiled})"
  else:
    why = declined[0][1] if declined else "the algorithm quantizes in its steps"
    form = f"; tiled form (no kernel: {why})"
  return dataclasses.replace(record, reason=record.reason.replace("; tiled form", form, 1))


def default_topology(
  facts: match.ModuleFacts, policy: Policy, platform: str
) -> topology_lib.Topology:
  """The topology the flags give for the module's devices: --equarx_domain_devices or
  --equarx_domains; else one TPU slice for --equarx_compile_for=tpu:TOPOLOGY (a named
  topology is one slice), else one host per device."""
  domains = policy.domains
  if not domains and not policy.domain_devices and policy.compile_for.startswith("tpu:"):
    domains = 1
  try:
    return topology_lib.from_size(
      facts.num_partitions * facts.num_replicas,
      platform,
      policy.domain_devices,
      domains,
      policy.fast_link_bandwidth,
      policy.slow_link_bandwidth,
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


def _calibrated_plans(
  candidates: list[match.Candidate],
  policy: Policy,
  records: list[SiteRecord],
  topology: topology_lib.Topology,
) -> tuple[list[match.Candidate], dict[int, CalibratedPlan]]:
  """With --equarx_calibration: the candidates, those found in the file on the
  "calibrated" route (their records updated), and their calibrated plans by site index;
  the others keep the dynamic scheme, and their record says why they are not calibrated."""
  if not policy.calibration:
    return candidates, {}
  calib = calibration.load_cached(policy.calibration)
  plans = {}
  routed = []
  for cand in candidates:
    site = cand.site
    if site.kind != SiteKind.ALL_REDUCE:
      routed.append(cand)
      continue
    i = site.index  # records are in site order
    why: str | None
    if len(site.operands) != 1:
      why = "several operands in one all-reduce"
    else:
      operand = site.operands[0]
      why = calibration.mismatch(
        calib.sites.get(site.index),
        site.index,
        site.location,
        operand.shape,
        operand.dtype,
        site.groups,
      )
    if why:
      records[i] = dataclasses.replace(
        records[i], reason=f"{records[i].reason}; not calibrated: {why}"
      )
      routed.append(cand)
      continue
    site_plan = _calibrated_plan(cand, calib.sites[site.index], policy.calibration_clip)
    plans[site.index] = site_plan
    lay = site_plan.layout
    reason = (
      f"calibrated int4 two_shot, {len(lay.outliers)} of {lay.features} features "
      f"in bf16, {lay.bits_per_value:.2f} bits/value"
    )
    if policy.calibration_clip:
      reason += f", ranges clipped at {policy.calibration_clip:g} rms"
    if policy.rounding != "nearest":
      reason += f" (static scales round to nearest: --equarx_rounding={policy.rounding} unused)"
    after = lay.wire_bytes()
    reason += _padding_note(after, records[i].bytes_before)
    route, prediction = plan.calibrated(cand, after, topology)
    records[i] = dataclasses.replace(
      records[i],
      reason=reason,
      bytes_after=after,
      traffic_after=route.rewritten,
      speedup=prediction.speedup,
      route=route.name,
    )
    routed.append(dataclasses.replace(cand, route=route, prediction=prediction))
  return routed, plans


def _calibrated_plan(
  cand: match.Candidate, entry: calibration.SiteCalibration, clip: float
) -> CalibratedPlan:
  site = cand.site
  outliers = entry.outliers()
  shape = site.operands[0].shape
  assert shape is not None  # a candidate's shape is static
  layout = outlier.make_layout(shape, site.group_size, outliers)
  normal = list(layout.normal)
  per_group = [entry.group_scales(group, outliers, clip) for group in cand.schedule.groups]
  in_scale, in_reciprocal = zip(
    *(outlier.static_scales(np.asarray(g.in_ranges, np.float32)[:, normal]) for g in per_group)
  )
  out_scale, out_reciprocal = zip(
    *(outlier.static_scales(np.asarray(g.out_ranges, np.float32)[normal]) for g in per_group)
  )
  return CalibratedPlan(
    layout,
    cand.schedule,
    site.device_kind,
    site.num_devices,
    np.stack(in_scale),
    np.stack(in_reciprocal),
    np.stack(out_scale),
    np.stack(out_reciprocal),
  )


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
