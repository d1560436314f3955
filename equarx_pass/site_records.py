"""The site records: what happened to each collective, in the report's words.

rewrite.py runs the pass and hands over, last, what it decided and emitted: each site's
decision (match.py, with the plan's typed route: plan.py), how often a run executes it and
whether only in a conditional's branch (loops.py), and, under --equarx_form=kernel, the notes of the kernels its emission asked
for (quantize_kernel.py).  This module turns them into one SiteRecord per site, which the
report (report.py), the CLI and the decorator print.  It reads routes by their types and
fields; nothing here is parsed back out of a string.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Mapping, Sequence

from equarx_pass.emission import forms
from equarx_pass.planning import cost, match, plan
from equarx_pass.planning.policy import Policy
from equarx_pass.planning.settings import DTYPE_BYTES
from equarx_pass.platforms import rules_for
from equarx_pass.site_kind import SiteKind

# What happened to an all-reduce.
Verdict = Literal["rewritten", "skipped"]

# (stage, why not: "" where the kernel ran) for each kernel a site's emission asked for,
# ("parts", how many) for a site taken in parts and ("exchange", how) for two-shot's
# exchange where the plan chose the permutes (quantize_kernel.QuantizeKernels.notes).
KernelNotes = Sequence[tuple[str, str]]


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
  # cost model's speed-up (cost.py); None where no route was planned, where the rewrite
  # sends more bytes than the native collective (plan.decide), or where the route has no
  # speed-up of its own (the identity route: plan.Route.priced).
  traffic_before: cost.Traffic | None = None
  traffic_after: cost.Traffic | None = None
  speedup: float | None = None
  # The route's name: "flat", "hierarchical", "calibrated", "identity", "native" (a skip
  # the cost model priced); "" when not planned.
  route: str = ""
  # How many times one run of the program executes the site (the while loops around it,
  # loops.py); None: inside a loop whose trip count is not read.  The report's bytes are
  # per run of the program: a site's, times this.
  runs: int | None = 1
  # In a branch of a conditional (jax.lax.cond, lax.switch; loops.in_branch): it runs only
  # when its branch is taken, which the program decides as it runs.  `runs` counts it as
  # if taken; the report totals its bytes apart from those of every call.
  in_branch: bool = False
  # With --equarx_slow_format: the format each link class carries for this site, (slow,
  # fast): a wire format, "native" (the collective's own type), or "" where the site
  # sends nothing on that class; () otherwise.
  link_formats: tuple[str, str] | tuple[()] = ()

  @property
  def rewritten(self) -> bool:
    return self.decision == "rewritten"


@dataclasses.dataclass(frozen=True)
class KernelForm:
  """Under --equarx_form=kernel: where the kernels were lowered for ("tpu", "cuda",
  "interpret"; "" where there were none) and why not, and each emitted site's notes."""

  target: str
  why_not: str
  notes: Mapping[int, KernelNotes]  # by site index


def records(
  decisions: Sequence[match.Decision],
  policy: Policy,
  flat_why: str | None,
  runs: Sequence[int | None],
  kernel_form: KernelForm | None = None,
) -> list[SiteRecord]:
  """One record per decision, in site order.  `policy` is the resolved policy the sites
  were planned with; flat_why: why the flat form is emitted (None: the tiled form is)."""
  out = []
  for decision, site_runs in zip(decisions, runs):
    record = dataclasses.replace(_record(decision, policy, flat_why), runs=site_runs)
    if policy.slow_format:
      record = dataclasses.replace(record, link_formats=link_formats(decision))
    if kernel_form is not None and isinstance(decision, match.Candidate):
      record = _with_form(record, decision.site.index, kernel_form)
    out.append(record)
  return out


def link_formats(decision: match.Decision) -> tuple[str, str]:
  """(slow, fast): the format the site sends on each link class as planned; "" where it
  sends nothing on that class."""
  route = decision.route
  if route is None:
    return ("native", "native")
  crosses = route.native.slow > 0
  if not isinstance(decision, match.Candidate) or isinstance(route, plan.IdentityRoute):
    quantized = "native"
  elif isinstance(route, plan.HierarchicalRoute):
    return (route.scheme.format, "native")
  elif isinstance(route, plan.CalibratedRoute):
    quantized = "int4+bf16"
  else:
    assert isinstance(route, plan.FlatRoute)
    quantized = route.scheme.format
  return (quantized if crosses else "", quantized if route.native.fast else "")


def ring_bytes_before(site: match.Site) -> int:
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
  flat = isinstance(route, plan.FlatRoute)
  tile_order = rules_for(policy.platform).tile_order
  if not tile_order or not flat or decision.site.kind != SiteKind.ALL_REDUCE:
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
  site = decision.site
  route: plan.Route | None = decision.route
  before = round(route.native.total) if route else ring_bytes_before(site)
  verdict: Verdict = "rewritten"
  sliced = isinstance(decision, match.Candidate) and decision.slice_op is not None
  after = before
  if isinstance(decision, match.Skip):
    verdict, reason = "skipped", decision.reason
  elif isinstance(route, plan.IdentityRoute):
    native = (
      "the native all-reduce, each rank's piece sliced as recognised"
      if sliced
      else f"the native {site.kind.op_name}"
    )
    reason = f"identity: {native}, rebuilt"
  elif isinstance(route, plan.CalibratedRoute):
    after, reason = route.wire_bytes, _calibrated_reason(route, policy, before)
  else:
    assert isinstance(route, (plan.FlatRoute, plan.HierarchicalRoute))
    after = round(route.rewritten.total)
    reason = _scheme_reason(decision, policy, route, flat_why)
  if isinstance(decision, match.Candidate) and not isinstance(route, plan.CalibratedRoute):
    if site.promoted:
      reason += f"; {', '.join(site.promoted)}"
    if sliced:
      reason = f"an all-reduce and the slice of each rank's piece: {reason}"
    if site.kind != SiteKind.ALL_REDUCE:
      reason = f"{site.kind}: {reason}"
    if isinstance(route, plan.FlatRoute) and route.not_calibrated:
      reason += f"; not calibrated: {route.not_calibrated}"
  elif isinstance(decision, match.Skip) and site.kind != SiteKind.ALL_REDUCE:
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
    prediction.speedup if prediction and route and route.priced else None,
    route.name if route else "",
    in_branch=site.in_branch,
  )


def _scheme_reason(
  decision: match.Candidate,
  policy: Policy,
  route: plan.FlatRoute | plan.HierarchicalRoute,
  flat_why: str | None,
) -> str:
  """The scheme a flat or hierarchical site is emitted with, and the form."""
  site = decision.site
  # The algorithm does not enter an all-gather: one quantization, one all_gather.
  reason = route.scheme.describe(algorithm=site.kind != SiteKind.ALL_GATHER)
  if isinstance(route, plan.HierarchicalRoute):
    levels = f"{route.levels.domains}x{route.levels.per_domain}"
    reason = f"hierarchical ({levels}: native inside each domain, {reason} across)"
  elif route.note:
    reason += f"; {route.note}"
  if decision.forced_over:  # says what the plan would have done, the bytes sent among it
    reason += f"; forced (--equarx_force): {decision.forced_over}"
  else:
    reason += _more_bytes_note(route)
  if flat_why is None:
    reason += _tile_order_note(decision, policy, route) + "; tiled form"
  elif not policy.calibration:
    reason += f"; flat form ({flat_why})"
  return reason


def _calibrated_reason(route: plan.CalibratedRoute, policy: Policy, before: int) -> str:
  lay = route.plan.layout
  reason = (
    f"calibrated int4 two_shot, {len(lay.outliers)} of {lay.features} features "
    f"in bf16, {lay.bits_per_value:.2f} bits/value"
  )
  if policy.calibration_clip:
    reason += f", ranges clipped at {policy.calibration_clip:g} rms"
  if policy.rounding != "nearest":
    reason += f" (static scales round to nearest: --equarx_rounding={policy.rounding} unused)"
  return reason + _padding_note(route.wire_bytes, before)


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


def _with_form(record: SiteRecord, index: int, kernel_form: KernelForm) -> SiteRecord:
  """The record of a site emitted under --equarx_form=kernel: which of its stages are
  kernels, and in how many parts."""
  notes = kernel_form.notes.get(index)
  if not kernel_form.target:
    notes = [("quantize", kernel_form.why_not)]
  notes = notes or []
  parts = "".join(f", in {n} parts" for stage, n in notes if stage == "parts")
  parts += "".join(f", {how}" for stage, how in notes if stage == "exchange")
  notes = [(stage, why) for stage, why in notes if stage not in ("parts", "exchange")]
  ran = [stage for stage, why in notes if not why]
  declined = [(stage, why) for stage, why in notes if why]
  if ran:
    where = {"tpu": "Mosaic", "cuda": "Triton", "interpret": "Pallas interpreter"}
    stages = " + ".join(dict.fromkeys(ran))
    tiled = "".join(f"; {stage} tiled: {why}" for stage, why in declined)
    form = f"; kernel form (Pallas {stages}, {where[kernel_form.target]}{parts}{tiled})"
  else:
    why = declined[0][1] if declined else "the algorithm quantizes in its steps"
    form = f"; tiled form (no kernel: {why})"
  return dataclasses.replace(record, reason=record.reason.replace("; tiled form", form, 1))
