"""The per-site plan: which rewrite a matched site gets on this topology, and whether it pays.

match.py says which collectives the policy selects; this module takes each candidate and
the topology (topology.py) and returns the candidate with its route and the cost model's
prediction (cost.py), or a Skip with the reason ("fast links only: rewrite predicted
0.40x").  The routes, tried in order, each a small function that returns None where it
does not apply:

  hierarchical  an all-reduce whose groups span fast domains evenly: native inside each
                domain, quantized across (hierarchical.py)
  flat          the scheme over the whole group (also every reduce-scatter and all-gather,
                and the calibrated scheme)

A route is a type (below) that carries everything emission needs: a flat route its
scheme; a hierarchical one its scheme, levels, the schedule across domains and (a
reduce-scatter's or all-gather's) piece order; a calibrated one its plan of static scales
(calibrated_routes, with --equarx_calibration).  site_patterns.py takes each route type
and site kind to its pattern; site_records.py reads the same fields for the report.

`--equarx_force` keeps every candidate whatever the prediction; nothing else does.
Under `--equarx_identity` a site is planned exactly as without it (the same route chosen,
the same sites kept and skipped) and then gets the "identity" route: the native collective,
rebuilt, sending what the native one sends.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar, Sequence

import numpy as np

from equarx_pass.emission import forms, hierarchical, outlier, quantize_kernel, rotation
from equarx_pass.emission.algorithms.two_shot import TWO_SHOT
from equarx_pass.emission.outlier_emit import CalibratedPlan
from equarx_pass.emission.scheme import Scheme
from equarx_pass.ir.layout import ChunkLayout, GroupSchedule, make_schedule
from equarx_pass.planning import calibration, cost, match
from equarx_pass.planning.match import Candidate, Decision, Skip
from equarx_pass.planning.policy import Policy
from equarx_pass.planning.settings import DTYPE_BYTES
from equarx_pass.platforms import rules_for
from equarx_pass.site_kind import SiteKind
from equarx_pass.topology import Levels, Topology, split_groups
from equarx_pass.traffic import Declaration


@dataclasses.dataclass(frozen=True)
class Route:
  """How a candidate is rewritten, with what it sends.  Each subclass is one route; its
  `name` is what the report's records say."""

  name: ClassVar[str] = ""
  # Whether the cost model's speed-up is the route's (the identity route emits the
  # native collective: it has none).
  priced: ClassVar[bool] = True
  native: cost.Traffic
  rewritten: cost.Traffic
  quantized_values: int  # operand values that enter the quantized all-reduce
  note: str = ""  # why the route was taken over a better one, for the report
  members: int = 0  # devices in each group of the quantized all-reduce


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlatRoute(Route):
  """The scheme's algorithm over the whole group."""

  name: ClassVar[str] = "flat"
  # The policy's, or a fallback algorithm's (FALLBACK_ALGORITHMS); with
  # --equarx_slow_format, its format where every member is in a domain of its own.
  scheme: Scheme
  layout: ChunkLayout  # the scheme's chunks (the candidate's, unless the format fixes others)
  # With --equarx_calibration, why this all-reduce keeps the dynamic scheme.
  not_calibrated: str = ""
  # Under --equarx_form=kernel, how two-shot's kernels exchange the chunks, and why not by
  # the permutes asked for where the platform has them (for the report).
  kernel_exchange: quantize_kernel.KernelExchange = quantize_kernel.KernelExchange.COLLECTIVES
  kernel_exchange_why: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class HierarchicalRoute(Route):
  """Native inside each fast domain, the scheme across (hierarchical.py)."""

  name: ClassVar[str] = "hierarchical"
  scheme: Scheme
  levels: Levels
  outer: GroupSchedule  # the schedule of the groups across domains (levels.outer)
  layout: ChunkLayout  # the chunks of the quantized step across domains
  # A reduce-scatter's or all-gather's ranks in (position, domain) order; () for an
  # all-reduce.
  order: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class CalibratedRoute(Route):
  """--equarx_calibration: static scales and bf16 outlier features, flat two-shot."""

  name: ClassVar[str] = "calibrated"
  plan: CalibratedPlan
  wire_bytes: int  # what one rank sends


@dataclasses.dataclass(frozen=True)
class IdentityRoute(Route):
  """--equarx_identity: the native collective, rebuilt; it sends what the native sends."""

  name: ClassVar[str] = "identity"
  priced: ClassVar[bool] = False


@dataclasses.dataclass(frozen=True)
class NativeRoute(Route):
  """No rewrite: what a skipped all-reduce sends natively (the report's bytes)."""

  name: ClassVar[str] = "native"


def _operand_bytes(cand: Candidate) -> tuple[int, int]:
  """(bytes of the operands per device, bytes per element of the widest)."""
  site = cand.site
  sizes = [DTYPE_BYTES.get(o.dtype, 4) for o in site.operands]
  return sum(o.size * b for o, b in zip(site.operands, sizes)), max(sizes)


def stored_bytes(site: match.Site, platform: str) -> int:
  """Bytes of the operands per device as the platform stores them, which the native
  collective sends: on a TPU in whole tiles, padding included (PlatformRules.tiles; where
  a conditional takes or gives the operand, in the default layout: Site.default_layout)."""
  rules = rules_for(platform)
  total = 0
  for o in site.operands:
    itemsize = DTYPE_BYTES.get(o.dtype, 4)
    size = o.size if o.shape is None else rules.stored_size(o.shape, itemsize, site.default_layout)
    total += size * itemsize
  return total


def _hierarchical(
  cand: Candidate, policy: Policy, topology: Topology, scheme: Scheme
) -> Route | None:
  site = cand.site
  if policy.hierarchy == "flat" or policy.calibration:
    return None  # (the calibrated scheme's scales are per device: it stays flat)
  assert site.groups is not None
  levels = split_groups(site.groups, topology)
  if isinstance(levels, str) or levels.per_domain < 2:
    return None
  scheme = policy.slow_scheme(scheme)  # only the step across domains is quantized
  nbytes, itemsize = _operand_bytes(cand)
  k, s = levels.per_domain, levels.domains
  values = sum(o.size for o in site.operands)
  native = _native(cand, itemsize, topology)
  outer = make_schedule(levels.outer)
  across_domains = range(s)  # one member of each domain
  if site.kind == SiteKind.ALL_REDUCE:
    layout = scheme.layout(-(-values // k), s)
    inside = cost.native_inside(k, nbytes, itemsize, topology.platform)
    across = cost.across(scheme.traffic(layout, site.kind, across_domains))
    return HierarchicalRoute(
      native,
      inside + across,
      -(-values // k),
      members=s,
      scheme=scheme,
      levels=levels,
      outer=outer,
      layout=layout,
    )
  order = hierarchical.piece_order(site.groups, levels)
  if isinstance(order, str):
    return None
  # Half of an all-reduce inside (a native reduce-scatter or all-gather of the whole
  # tensor) and a quantized reduce-scatter or all-gather of a 1/k part across.
  whole = nbytes * site.group_size if site.kind == SiteKind.ALL_GATHER else nbytes
  whole_values = values * site.group_size if site.kind == SiteKind.ALL_GATHER else values
  layout = scheme.layout(whole_values // k, s)
  half = cost.native_inside(k, whole, itemsize, topology.platform)
  inside = cost.Traffic(fast=half.fast / 2, fast_steps=1)
  across = cost.across(scheme.traffic(layout, site.kind, across_domains))
  return HierarchicalRoute(
    native,
    inside + across,
    whole_values // k,
    members=s,
    scheme=scheme,
    levels=levels,
    outer=outer,
    layout=layout,
    order=order,
  )


def _flat(cand: Candidate, policy: Policy, topology: Topology, scheme: Scheme) -> Route:
  site = cand.site
  assert site.groups is not None
  group = site.groups[0]
  _, itemsize = _operand_bytes(cand)
  native = _native(cand, itemsize, topology)
  domains = [topology.domain_of(d) for d in group]
  # A group with every member in a domain of its own sends all it sends across the slow
  # links: there --equarx_slow_format applies (a group that also spans fast links keeps
  # --equarx_format, which its fast links would carry too).
  layout = cand.layout
  if all(len({topology.domain_of(d) for d in g}) == len(g) for g in site.groups):
    slow = policy.slow_scheme(scheme)
    if slow is not scheme:
      scheme, layout = slow, match.site_layout(site, slow)
  rewritten = cost.priced(scheme.traffic(layout, site.kind, domains))
  note = ""
  if site.kind == SiteKind.ALL_REDUCE and policy.hierarchy == "auto" and not policy.calibration:
    why = split_groups(site.groups, topology)
    if isinstance(why, str) and why != "inside one fast domain":
      note = f"not hierarchical: the group {why}"
  values = sum(o.size for o in site.operands)
  return FlatRoute(native, rewritten, values, note, len(group), scheme=scheme, layout=layout)


def _native(cand: Candidate, itemsize: int, topology: Topology) -> cost.Traffic:
  """What the native collective sends: an all-reduce's bytes and steps; a reduce-scatter's
  or an all-gather's, half those of an all-reduce of the whole tensor (so is an
  all-reduce that the compiler makes a reduce-scatter: Site.scattered).  The bytes are
  the operands' as the platform stores them (stored_bytes)."""
  site = cand.site
  assert site.groups is not None
  nbytes = stored_bytes(site, topology.platform)
  group = site.groups[0]
  if site.kind == SiteKind.ALL_REDUCE and not site.scattered:
    return cost.native_all_reduce(group, nbytes, itemsize, topology)
  whole = nbytes * len(group) if site.kind == SiteKind.ALL_GATHER else nbytes
  full = cost.native_all_reduce(group, whole, itemsize, topology)
  return cost.Traffic(full.fast / 2, full.slow / 2, full.fast_steps // 2, full.slow_steps // 2)


ROUTES: list[Callable[[Candidate, Policy, Topology, Scheme], Route | None]] = [
  _hierarchical,
  _flat,
]

# Tried, in order, for an all-reduce across slow links where the policy's algorithm is the
# key's and is predicted to lose: the one-shot takes one collective step where the
# two-shot takes two (the same bytes for two ranks), which decides a small site on a slow
# link (a latency per step).  Only under the two-shot, the default: an algorithm a user
# names is the one the sites get.  Not on fast links alone, where the on-chip work decides
# and a site the two-shot loses stays native.
FALLBACK_ALGORITHMS: dict[str, tuple[str, ...]] = {"two_shot": ("one_shot",)}


def route_of(
  cand: Candidate, policy: Policy, topology: Topology, scheme: Scheme | None = None
) -> Route:
  scheme = scheme or policy.scheme
  for choose in ROUTES:
    route = choose(cand, policy, topology, scheme)
    if route is not None:
      return route
  raise AssertionError("the flat route always applies")


def decide(decision: Decision, policy: Policy, topology: Topology) -> Decision:
  """The candidate with its route and prediction, or a Skip saying why the rewrite would
  not pay; a Skip keeps its reason, with what the native all-reduce sends where that is
  known (the report's bytes cover every site)."""
  if not isinstance(decision, Candidate):
    return _with_native_traffic(decision, topology)
  route, prediction = _priced(decision, policy, topology, policy.scheme)
  grows = _sends_more(route)
  loses = grows or _predicted_loss(prediction, route, topology)
  all_reduce = decision.site.kind == SiteKind.ALL_REDUCE
  if loses and route.native.slow and all_reduce and not policy.calibration:
    for name in FALLBACK_ALGORITHMS.get(policy.scheme.algorithm, ()):
      scheme = dataclasses.replace(policy.scheme, algorithm=name)
      other, other_prediction = _priced(decision, policy, topology, scheme)
      if not _sends_more(other) and not _predicted_loss(other_prediction, other, topology):
        route, prediction, grows, loses = other, other_prediction, None, None
        break
  # A rewrite that sends more is a loss whatever the time model says: no prediction beside
  # it, left native or forced (it would read as a win for a tiny site's latency).
  kept = None if grows else prediction
  if loses and not policy.force:
    return Skip(decision.site, f"{loses}; left native (--equarx_force rewrites it)", route, kept)
  layout = route.layout if isinstance(route, FlatRoute) else decision.layout
  if policy.identity:
    route = IdentityRoute(route.native, route.native, 0, route.note)
  return dataclasses.replace(
    decision, route=route, prediction=kept, forced_over=loses or "", layout=layout
  )


def _priced(
  cand: Candidate, policy: Policy, topology: Topology, scheme: Scheme
) -> tuple[Route, cost.Prediction]:
  route = route_of(cand, policy, topology, scheme)
  group = cand.site.groups[0] if cand.site.groups else ()
  sharing = max((len(p) for p in topology.split(group)), default=1)
  tiles = _tiles(scheme, route)
  itemsize = _operand_bytes(cand)[1]
  exchange = None
  if tiles is not None and _kernel_priced(policy, scheme, tiles, cand, topology.platform):
    exchange = quantize_kernel.KernelExchange.COLLECTIVES
    if isinstance(route, FlatRoute) and _permutes_asked(policy, topology):
      parts, why = _permuted_parts(cand, route, itemsize)
      if why:
        route = dataclasses.replace(route, kernel_exchange_why=why)
      else:
        exchange = quantize_kernel.KernelExchange.PERMUTES
        # 2 (N - 1) collective-permutes a part where two-shot has two collectives.
        steps = 2 * (route.members - 1) * parts
        rewritten = dataclasses.replace(route.rewritten, fast_steps=steps)
        route = dataclasses.replace(route, rewritten=rewritten, kernel_exchange=exchange)
  prediction = cost.predict(
    route.native,
    route.rewritten,
    route.quantized_values,
    topology,
    sharing,
    kernels=exchange,
    members=route.members,
    blocks_of_rows=itemsize if tiles and tiles[1] == 2 and not exchange else 0,
    itemsize=itemsize,
  )
  return route, prediction


def _tiles(scheme: Scheme, route: Route) -> tuple[tuple[int, ...], int] | None:
  """The tiled form's chunk shape and block dimensions for the route's quantized step
  (forms.tile_shape); None where the route has no dynamic quantized step."""
  if not isinstance(route, (FlatRoute, HierarchicalRoute)):
    return None
  return forms.tile_shape(route.layout.chunk, route.layout.block, scheme.fmt.bits)


def _kernel_priced(
  policy: Policy,
  scheme: Scheme,
  tiles: tuple[tuple[int, ...], int],
  cand: Candidate,
  platform: str,
) -> bool:
  """Whether the site gets the kernel form's on-chip cost: --equarx_form=kernel with a
  scheme (two-shot, int8 to nearest) and chunks the kernels take.  A site they decline is
  emitted in the tiled form, so it is priced as one: a kernel's figure there would make a
  losing rewrite look like a win."""
  if policy.form != "kernel" or not scheme.algo.quantizes_chunks_once:
    return False
  rotation_size = scheme.resolved_rotation_size if scheme.rotation != rotation.NONE else 0
  why = quantize_kernel.why_not(
    scheme.fmt.name,
    scheme.rounding == "stochastic",
    *tiles,
    rotation_size,
    rules_for(platform).matmul_rotation,
  )
  # 16-bit floats enter the kernels as they are; a TPU has no f16 arithmetic.
  f16 = platform == "tpu" and any(o.dtype == "f16" for o in cand.site.operands)
  return not why and not f16


def _permutes_asked(policy: Policy, topology: Topology) -> bool:
  """Whether the kernel form's permuted exchange is asked for (the default) where the
  platform has it: a site that keeps the collectives then says why."""
  return policy.kernel_exchange == "permutes" and rules_for(topology.platform).kernel_permutes


def _permuted_parts(cand: Candidate, route: FlatRoute, itemsize: int) -> tuple[int, str]:
  """In how many parts the kernel form's two-shot exchanges this site of `itemsize`-byte
  values by collective-permutes of packed chunks (quantize_kernel.KernelExchange, where
  _permutes_asked), or (0, why it keeps the all-to-all and all-gather)."""
  layout = route.layout
  if cand.site.kind != SiteKind.ALL_REDUCE or not route.scheme.algo.has_permuted_exchange:
    return 0, "only two-shot all-reduces"
  if route.rewritten.slow:
    return 0, "links between domains"
  if layout.block != quantize_kernel.LANES or layout.padded % (
    quantize_kernel.ROWS * quantize_kernel.LANES
  ):
    return 0, f"blocks of {layout.block} values"
  tiles = layout.padded // (quantize_kernel.ROWS * quantize_kernel.LANES)
  # The columns of (8, 128) tiles the kernels read an operand of whole tiles in, where it
  # lies (forms.TiledSite): a step stays inside a column.
  columns = 0
  shapes = [o.shape for o in cand.site.operands if o.shape is not None]
  grid = forms.tile_grid(shapes, route.scheme, layout)
  if isinstance(grid, tuple) and grid[0] * grid[1] * grid[2] == tiles:
    if not quantize_kernel.shape_why_not("tpu", tiles, columns=grid[2]):
      columns = grid[2]
  return quantize_kernel.permuted_parts("tpu", tiles, route.members, itemsize, columns)


def calibrated_routes(
  decisions: Sequence[Decision], policy: Policy, topology: Topology
) -> list[Decision]:
  """With --equarx_calibration: the decisions, each all-reduce candidate found in the file
  on a CalibratedRoute (its plan of static scales and what it sends), the others on their
  flat route with why they are not calibrated."""
  if not policy.calibration or policy.identity:
    return list(decisions)
  calib = calibration.load_cached(policy.calibration)
  out: list[Decision] = []
  for decision in decisions:
    site = decision.site
    if not isinstance(decision, Candidate) or site.kind != SiteKind.ALL_REDUCE:
      out.append(decision)
      continue
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
      route = dataclasses.replace(decision.route, not_calibrated=why)
      out.append(dataclasses.replace(decision, route=route))
      continue
    site_plan = _calibrated_plan(decision, calib.sites[site.index], policy.calibration_clip)
    route, prediction = _calibrated(decision, site_plan, topology)
    out.append(dataclasses.replace(decision, route=route, prediction=prediction))
  return out


def _calibrated_plan(
  cand: Candidate, entry: calibration.SiteCalibration, clip: float
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


def _calibrated(
  cand: Candidate, site_plan: CalibratedPlan, topology: Topology
) -> tuple[CalibratedRoute, cost.Prediction]:
  """The route and prediction of a site that gets the calibrated scheme (flat two-shot):
  decide() priced it with the dynamic scheme's bytes, and the report must give what the
  calibrated program sends.  The decision itself stands: the calibrated scheme sends
  fewer bytes than the dynamic one it was priced as."""
  site = cand.site
  assert site.groups is not None and cand.route is not None
  group = site.groups[0]
  wire_bytes = site_plan.layout.wire_bytes()
  # The two-shot's steps and share across domains, with the calibrated layout's bytes.
  domains = [topology.domain_of(d) for d in group]
  steps, crossing = TWO_SHOT.collective_steps(len(group)), TWO_SHOT.crossing_share(domains)
  rewritten = cost.priced(Declaration(wire_bytes, steps, crossing))
  native, values = cand.route.native, cand.route.quantized_values
  route = CalibratedRoute(
    native, rewritten, values, cand.route.note, len(group), plan=site_plan, wire_bytes=wire_bytes
  )
  sharing = max((len(p) for p in topology.split(group)), default=1)
  prediction = cost.predict(native, rewritten, values, topology, sharing, members=len(group))
  return route, prediction


def _with_native_traffic(skip: Skip, topology: Topology) -> Skip:
  site = skip.site
  if skip.route is not None or site.kind != SiteKind.ALL_REDUCE or not site.groups:
    return skip
  if any(o.shape is None or o.dtype not in DTYPE_BYTES for o in site.operands):
    return skip
  itemsize = max(DTYPE_BYTES[o.dtype] for o in site.operands)
  nbytes = stored_bytes(site, topology.platform)
  native = cost.native_all_reduce(site.groups[0], nbytes, itemsize, topology)
  return dataclasses.replace(skip, route=NativeRoute(native, native, 0))


def _sends_more(route: Route) -> str | None:
  """Why the rewrite sends at least the native bytes, or None."""
  # Where the native collective crosses slow links, those are the bytes to save (a
  # hierarchical rewrite may add some on the fast ones); else all of them.
  slow = route.native.slow > 0
  before = route.native.slow if slow else route.native.total
  after = route.rewritten.slow if slow else route.rewritten.total
  if after < before:
    return None
  where = " across domains" if slow else ""
  return f"sends {after / before:.2f}x the native bytes{where} (padding to whole blocks)"


def _predicted_loss(prediction: cost.Prediction, route: Route, topology: Topology) -> str | None:
  """Why the rewrite is predicted slower, or None."""
  if prediction.speedup > 1:
    return None
  link = topology.slow if route.native.slow else topology.fast
  where = "fast links only" if not route.native.slow else "compute outweighs the bytes saved"
  return (
    f"{where}: rewrite predicted {prediction.speedup:.2f}x ({link.name} {link.gbytes_per_s:g} GB/s)"
  )
