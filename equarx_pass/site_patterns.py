"""The rewrite patterns: what replaces a planned site, one pattern per route and site kind.

plan.py gives every candidate a typed route (plan.IdentityRoute, CalibratedRoute,
HierarchicalRoute, FlatRoute) carrying what emission needs; rewrite.py asks each pattern
in PATTERNS, in order, whether it matches the candidate's route type and site kind, and
takes the first that does.  A pattern builds a Replacement: the function that emits the
new ops for the site's operands, what it is (for error messages) and what a user can do
when emitting fails.  rewrite.py puts it in place (and outlines it where asked).

A new route is a route type and function in plan.py and a pattern here (and its words in
site_records.py); nothing else branches on routes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Protocol

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass.emission import hierarchical
from equarx_pass.emission.all_gather import emit_all_gather
from equarx_pass.emission.forms import Pieces, SitePlan
from equarx_pass.emission.outlier_emit import emit_calibrated_allreduce
from equarx_pass.emission.quantize_kernel import KernelExchange, QuantizeKernels
from equarx_pass.ir.hlo_builder import ChannelAllocator, Emitter
from equarx_pass.planning import match, plan
from equarx_pass.planning.settings import EmissionSettings
from equarx_pass.platforms import rules_for
from equarx_pass.site_kind import SiteKind
from equarx_pass.topology import Topology

Emit = Callable[[list[ir.Value]], list[ir.Value]]

_EXCLUDE = "rerun without --equarx_enable or exclude it with --equarx_max_bytes/--equarx_dtypes"


@dataclasses.dataclass(frozen=True)
class RewriteContext:
  """What every pattern may use, the same for all sites of one module."""

  emission: EmissionSettings
  channels: ChannelAllocator
  topology: Topology
  target: str  # the platform compiled for: "cpu", "gpu", "tpu"
  tiled_form: bool  # False: the flat form (the report says why)
  # The kernel form's kernels (--equarx_form=kernel); in the context of one site
  # (for_site), a view whose notes are that site's.
  kernels: QuantizeKernels | None = None

  def for_site(self) -> RewriteContext:
    """This context for one site: the kernels' notes it gathers are its own."""
    if self.kernels is None:
      return self
    return dataclasses.replace(self, kernels=self.kernels.for_site())

  def site_plan(self, cand: match.Candidate, layout, schedule) -> SitePlan:
    site = cand.site
    assert isinstance(cand.route, (plan.FlatRoute, plan.HierarchicalRoute))
    scheme = cand.route.scheme
    unrolled = site.nbytes >= self.emission.unroll_min_bytes
    rules = rules_for(self.target)
    return SitePlan(
      layout,
      schedule,
      site.device_kind,
      site.num_devices,
      scheme,
      unrolled=unrolled,
      matmul_rotation=rules.matmul_rotation,
      nan_in_combiner=rules.nan_in_combiner,
      block_max_in_stages=rules.block_max_in_stages,
      tile_order=rules.tile_order,
      pack_scales=rules.pack_small_scales and not unrolled,
      collectives_in_loops=rules.collectives_in_loops,
      # Only where the site quantizes its chunks once, together: two-shot's first
      # quantize, an all-gather's only one.
      quantize_kernels=self.kernels
      if site.kind == SiteKind.ALL_GATHER or scheme.algo.quantizes_chunks_once
      else None,
      kernel_exchange=cand.route.kernel_exchange
      if isinstance(cand.route, plan.FlatRoute)
      else KernelExchange.COLLECTIVES,
      kernel_exchange_why=cand.route.kernel_exchange_why
      if isinstance(cand.route, plan.FlatRoute)
      else "",
    )


@dataclasses.dataclass(frozen=True)
class Replacement:
  emit: Emit
  what: str  # "the quantized ring all-reduce", for error messages
  advice: str  # what a user can do when emitting it fails
  outline: bool = True  # may its compute be outlined (--equarx_outline)


class SitePattern(Protocol):
  def matches(self, cand: match.Candidate) -> bool: ...

  def replacement(self, cand: match.Candidate, ctx: RewriteContext) -> Replacement: ...


class IdentityPattern:
  """--equarx_identity: the native collective, rebuilt."""

  def matches(self, cand: match.Candidate) -> bool:
    return isinstance(cand.route, plan.IdentityRoute)

  def replacement(self, cand: match.Candidate, ctx: RewriteContext) -> Replacement:
    # Never outlined: a call boundary keeps the rounding of a bf16 operand that XLA:CPU
    # may skip inline (excess precision), and the native op needs no call.
    what = (
      "the native all-reduce and slice" if cand.slice_op is not None else "the native collective"
    )
    return Replacement(
      functools.partial(emit_native, cand), what, "rerun without --equarx_identity", False
    )


class CalibratedPattern:
  """--equarx_calibration: static scales and bf16 outlier features (emission/outlier_emit.py)."""

  def matches(self, cand: match.Candidate) -> bool:
    return isinstance(cand.route, plan.CalibratedRoute)

  def replacement(self, cand: match.Candidate, ctx: RewriteContext) -> Replacement:
    assert isinstance(cand.route, plan.CalibratedRoute)
    site_plan = cand.route.plan
    return Replacement(
      lambda operands: emit_calibrated_allreduce(operands, site_plan, ctx.channels),
      "the calibrated scheme",
      "rerun without --equarx_calibration",
    )


class HierarchicalAllReducePattern:
  """An all-reduce over several fast domains: native inside each, quantized across."""

  def matches(self, cand: match.Candidate) -> bool:
    hierarchical_route = isinstance(cand.route, plan.HierarchicalRoute)
    return hierarchical_route and cand.site.kind == SiteKind.ALL_REDUCE

  def replacement(self, cand: match.Candidate, ctx: RewriteContext) -> Replacement:
    route = cand.route
    assert isinstance(route, plan.HierarchicalRoute)
    site, scheme, levels, outer = cand.site, route.scheme, route.levels, route.outer

    def cross(piece: ir.Value) -> ir.Value:
      (size,) = ir.RankedTensorType(piece.type).shape
      layout = scheme.layout(size, levels.domains)
      return scheme.algo.emit(
        [piece], ctx.site_plan(cand, layout, outer), ctx.channels, ctx.tiled_form
      )[0]

    emit = functools.partial(
      hierarchical.emit,
      levels=levels,
      device_kind=site.device_kind,
      channels=ctx.channels,
      cross=cross,
      num_devices=site.num_devices,
      # Where the platform takes them so, the pieces inside a domain come from an
      # all-reduce (domain_piece says why).
      by_all_reduce=rules_for(ctx.target).pieces_by_all_reduce,
    )
    return Replacement(emit, f"the hierarchical {scheme.algorithm} all-reduce", _EXCLUDE)


class HierarchicalPiecesPattern:
  """A reduce-scatter or all-gather over several fast domains: the native one of the whole
  tensor inside each domain, the quantized one of a 1/k part across."""

  def matches(self, cand: match.Candidate) -> bool:
    hierarchical_route = isinstance(cand.route, plan.HierarchicalRoute)
    return hierarchical_route and cand.site.kind != SiteKind.ALL_REDUCE

  def replacement(self, cand: match.Candidate, ctx: RewriteContext) -> Replacement:
    route = cand.route
    assert isinstance(route, plan.HierarchicalRoute)
    site, scheme, levels, outer = cand.site, route.scheme, route.levels, route.outer
    order = route.order
    result_type = ir.RankedTensorType((cand.slice_op or cand.op).results[0].type)
    gather = site.kind == SiteKind.ALL_GATHER

    def cross_pieces(part: ir.Value, piece_type: ir.RankedTensorType) -> ir.Value:
      size = int(np.prod(ir.RankedTensorType(part.type).shape, dtype=np.int64))
      layout = scheme.layout(size * levels.domains if gather else size, levels.domains)
      site_plan = ctx.site_plan(cand, layout, outer)
      if gather:
        return emit_all_gather(part, site_plan, ctx.channels, Pieces(0, 1, piece_type))[0]
      pieces = Pieces(0, levels.domains, piece_type)
      return scheme.algo.emit_pieces(part, site_plan, ctx.channels, pieces)[0]

    emit_levels = hierarchical.emit_all_gather if gather else hierarchical.emit_reduce_scatter

    def emit(operands: list[ir.Value]) -> list[ir.Value]:
      return emit_levels(
        operands[0],
        levels,
        order,
        site.dimension,
        result_type,
        site.device_kind,
        ctx.channels,
        cross_pieces,
        site.num_devices,
        rules_for(ctx.target).pieces_by_all_reduce,
      )

    return Replacement(emit, f"the hierarchical {site.kind}", _EXCLUDE)


class FlatAllReducePattern:
  """The scheme's algorithm over the whole group."""

  def matches(self, cand: match.Candidate) -> bool:
    return isinstance(cand.route, plan.FlatRoute) and cand.site.kind == SiteKind.ALL_REDUCE

  def replacement(self, cand: match.Candidate, ctx: RewriteContext) -> Replacement:
    assert isinstance(cand.route, plan.FlatRoute)
    scheme = cand.route.scheme
    emit = functools.partial(
      scheme.algo.emit,
      plan=ctx.site_plan(cand, cand.layout, cand.schedule),
      channels=ctx.channels,
      tiled=ctx.tiled_form,
    )
    return Replacement(emit, f"the quantized {scheme.algorithm} all-reduce", _EXCLUDE)


class FlatPiecesPattern:
  """A reduce-scatter (the algorithm's first half) or an all-gather (one quantization, one
  all_gather) over the whole group."""

  def matches(self, cand: match.Candidate) -> bool:
    return isinstance(cand.route, plan.FlatRoute) and cand.site.kind != SiteKind.ALL_REDUCE

  def replacement(self, cand: match.Candidate, ctx: RewriteContext) -> Replacement:
    site, route = cand.site, cand.route
    assert isinstance(route, plan.FlatRoute)
    result = (cand.slice_op or cand.op).results[0]
    pieces = Pieces(
      site.dimension,
      site.group_size if site.kind == SiteKind.REDUCE_SCATTER else 1,
      ir.RankedTensorType(result.type),
    )
    emitter = (
      route.scheme.algo.emit_pieces if site.kind == SiteKind.REDUCE_SCATTER else emit_all_gather
    )
    site_plan = ctx.site_plan(cand, cand.layout, cand.schedule)
    return Replacement(
      lambda operands: emitter(operands[0], site_plan, ctx.channels, pieces),
      f"the quantized {site.kind}",
      _EXCLUDE,
    )


PATTERNS: list[SitePattern] = [
  IdentityPattern(),
  CalibratedPattern(),
  HierarchicalAllReducePattern(),
  HierarchicalPiecesPattern(),
  FlatAllReducePattern(),
  FlatPiecesPattern(),
]


def pattern_for(cand: match.Candidate) -> SitePattern:
  for pattern in PATTERNS:
    if pattern.matches(cand):
      return pattern
  name = cand.route.name if cand.route is not None else None
  raise AssertionError(f"no rewrite pattern for route {name!r} of a {cand.site.kind}")


def emit_native(cand: match.Candidate, operands: list[ir.Value]) -> list[ir.Value]:
  """--equarx_identity: the site's collective itself, on `operands`: a copy of the op.

  For an all-reduce and the slice of each rank's piece (taken as a reduce-scatter): a copy
  of the all-reduce and a new slice of the piece the recognition names for each rank (its
  dimension and groups; the rank's offset looked up by device id), so that a recognition
  that named the wrong pieces gives other results than plain jax.jit.  Not one native
  reduce-scatter: XLA:CPU lays a reduce-scatter over any dimension but the first out
  with that dimension major, and a fused reduction that reads its result then sums in
  another order than the same reduction over the slice (BUILD_NOTES, "Faithfulness
  decisions")."""
  op = cand.op
  new = op.clone()
  for i, value in enumerate(operands):
    new.operands[i] = value
  if cand.slice_op is None:
    return list(new.results)
  site = cand.site
  assert site.groups is not None  # a recognised piece has its groups
  em = Emitter()
  shape = ir.RankedTensorType(cand.slice_op.results[0].type).shape
  piece = shape[site.dimension]
  position = np.zeros(site.num_devices, np.int32)
  for group in site.groups:
    for rank, member in enumerate(group):
      position[member] = rank * piece
  device_id = hlo.PartitionIdOp() if site.device_kind == "partition" else hlo.ReplicaIdOp()
  device = em.convert(device_id.result, em.i32)
  start = em.reshape(em.dynamic_slice(em.const(position, em.i32), [device], [1]), ())
  zero = em.i32_scalar(0)
  starts = [start if d == site.dimension else zero for d in range(len(shape))]
  return [em.dynamic_slice(new.results[0], starts, shape)]
