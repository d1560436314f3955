"""The planner on its own: each candidate's typed route, what it carries for emission, and
how it is priced (plan.py), on sites built by hand (no module, no MLIR)."""

import dataclasses
from typing import Sequence

import pytest

from equarx_pass import topology as topology_lib
from equarx_pass.emission import algorithms, hierarchical
from equarx_pass.emission.algorithms.base import Algorithm
from equarx_pass.ir.layout import ChunkLayout, make_schedule
from equarx_pass.planning import cost, plan
from equarx_pass.planning.match import Candidate, Operand, Site, Skip
from equarx_pass.planning.policy import Policy
from equarx_pass.site_kind import SiteKind

EIGHT = (tuple(range(8)),)


def _policy(platform: str = "cpu", **fields) -> Policy:
  """The policy as rewrite_module plans with it: the platform set, defaults resolved."""
  base = Policy(enable=True, min_bytes=0, **fields)
  return base.replace(platform=platform).resolved()[0]


def _candidate(
  policy: Policy,
  values: int = 1 << 20,
  dtype: str = "f32",
  groups: tuple[tuple[int, ...], ...] = EIGHT,
  kind: SiteKind = SiteKind.ALL_REDUCE,
) -> Candidate:
  n = len(groups[0])
  devices = sum(len(g) for g in groups)
  site = Site(0, "here", (Operand((values,), dtype),), groups, "partition", devices, kind=kind)
  # An all-gather's layout covers the gathered tensor, as match.py makes it.
  total = values * n if kind == SiteKind.ALL_GATHER else values
  return Candidate(site, None, policy.scheme.layout(total, n), make_schedule(groups))


def _domains(topology: topology_lib.Topology, group: Sequence[int]) -> list[int]:
  return [topology.domain_of(d) for d in group]


def test_a_flat_route_carries_its_scheme_and_is_priced_by_its_declaration():
  policy = _policy(hierarchy="flat")
  topology = topology_lib.from_size(8, "cpu", domain_devices=4)
  cand = _candidate(policy)
  route = plan.route_of(cand, policy, topology)
  assert isinstance(route, plan.FlatRoute) and route.scheme == policy.scheme
  declared = policy.scheme.traffic(cand.layout, SiteKind.ALL_REDUCE, _domains(topology, EIGHT[0]))
  assert route.rewritten == cost.priced(declared)
  assert route.quantized_values == 1 << 20


def test_a_hierarchical_route_carries_its_levels_and_schedule():
  policy = _policy()
  topology = topology_lib.from_size(8, "cpu", domain_devices=4)
  route = plan.route_of(_candidate(policy), policy, topology)
  assert isinstance(route, plan.HierarchicalRoute)
  assert (route.levels.domains, route.levels.per_domain) == (2, 4)
  assert route.outer == make_schedule(route.levels.outer)
  assert route.order == ()  # an all-reduce needs no piece order
  # Native inside each domain, a quarter of the operand across.
  assert route.quantized_values == (1 << 20) // 4
  assert route.rewritten.slow < route.native.slow


def test_a_hierarchical_reduce_scatter_carries_its_piece_order():
  policy = _policy(ops=("all_reduce", "reduce_scatter"))
  topology = topology_lib.from_size(8, "cpu", domain_devices=4)
  cand = _candidate(policy, kind=SiteKind.REDUCE_SCATTER)
  route = plan.route_of(cand, policy, topology)
  assert isinstance(route, plan.HierarchicalRoute)
  assert route.order == hierarchical.piece_order(EIGHT, route.levels)


def test_a_group_inside_one_domain_is_flat_without_a_note():
  policy = _policy()
  topology = topology_lib.from_size(8, "cpu", domain_devices=8)
  route = plan.route_of(_candidate(policy), policy, topology)
  assert isinstance(route, plan.FlatRoute) and route.note == ""


def test_an_uneven_group_is_flat_and_says_why():
  policy = _policy()
  topology = topology_lib.from_size(8, "cpu", domain_devices=4)
  groups = ((0, 1, 2, 4),)
  route = plan.route_of(_candidate(policy, groups=groups), policy, topology)
  assert isinstance(route, plan.FlatRoute) and route.note.startswith("not hierarchical: ")


def test_identity_plans_as_without_it_and_sends_the_native_bytes():
  topology = topology_lib.from_size(8, "cpu", domain_devices=4)
  planned = plan.decide(_candidate(_policy()), _policy(), topology)
  policy = _policy(identity=True)
  decided = plan.decide(_candidate(policy), policy, topology)
  assert isinstance(decided, Candidate) and isinstance(decided.route, plan.IdentityRoute)
  assert decided.route.native == planned.route.native == decided.route.rewritten


def test_a_site_predicted_to_lose_is_skipped_with_its_route_and_reason():
  policy = _policy()
  topology = topology_lib.from_size(8, "cpu", domain_devices=8)  # fast links only
  decided = plan.decide(_candidate(policy, values=1 << 10), policy, topology)
  assert isinstance(decided, Skip) and decided.reason.startswith("fast links only")
  assert isinstance(decided.route, plan.FlatRoute)
  forced = plan.decide(_candidate(policy, values=1 << 10), policy.replace(force=True), topology)
  assert isinstance(forced, Candidate) and forced.forced_over.startswith("fast links only")


def test_a_skip_from_matching_gets_the_native_bytes():
  policy = _policy()
  topology = topology_lib.from_size(8, "cpu", domain_devices=4)
  skip = Skip(_candidate(policy).site, "not selected")
  decided = plan.decide(skip, policy, topology)
  assert isinstance(decided, Skip) and isinstance(decided.route, plan.NativeRoute)
  assert decided.route.rewritten == decided.route.native


def test_a_small_site_across_two_slices_falls_back_to_the_one_shot():
  policy = _policy("tpu")
  topology = topology_lib.from_size(2, "tpu", num_domains=2)
  cand = _candidate(policy, values=72 * 1024, dtype="bf16", groups=((0, 1),))
  decided = plan.decide(cand, policy, topology)
  assert isinstance(decided, Candidate) and isinstance(decided.route, plan.FlatRoute)
  assert policy.scheme.algorithm == "two_shot"
  assert decided.route.scheme.algorithm in plan.FALLBACK_ALGORITHMS["two_shot"]


class _Star(Algorithm):
  """A toy: every rank sends its N chunks to member 0 and gets the sum back, in one step.
  Only its declaration matters here."""

  name = "toy_star"
  description = "a toy for the planner's tests"

  def wire_bytes(self, layout: ChunkLayout, fmt) -> int:
    return 2 * layout.group_size * fmt.payload_bytes(layout.chunk, layout.blocks)

  def collective_steps(self, group_size: int) -> int:
    return 1

  def crossing_share(self, domains: Sequence[int]) -> float:
    return sum(d != domains[0] for d in domains) / len(domains)


@pytest.fixture
def star():
  algorithm = algorithms.register(_Star())
  yield algorithm
  del algorithms.ALGORITHMS[algorithm.name]


def test_a_registered_algorithm_is_priced_from_its_own_declaration(star):
  """A new algorithm is its module and its registration: the policy takes its name and
  the plan prices it from what it declares, not as a ring or a two-shot."""
  policy = _policy(algorithm=star.name, hierarchy="flat", form="flat")
  topology = topology_lib.from_size(8, "cpu", domain_devices=4)
  cand = _candidate(policy)
  route = plan.route_of(cand, policy, topology)
  assert isinstance(route, plan.FlatRoute) and route.scheme.algo is star
  wire = star.wire_bytes(cand.layout, policy.scheme.fmt)
  assert route.rewritten == cost.Traffic(fast=wire / 2, slow=wire / 2, fast_steps=1, slow_steps=1)
  for other in ("ring", "two_shot"):
    scheme = dataclasses.replace(policy.scheme, algorithm=other)
    assert plan.route_of(cand, policy, topology, scheme).rewritten != route.rewritten
