"""The rewrite patterns: every route the plan gives, for every site kind, has exactly one
pattern, and a route without one is an error rather than a silent fallback."""

from types import SimpleNamespace

import pytest

from equarx_pass import site_patterns
from equarx_pass.planning import plan
from equarx_pass.site_kind import SiteKind

ROUTES = (plan.IdentityRoute, plan.CalibratedRoute, plan.HierarchicalRoute, plan.FlatRoute)


def _candidate(route: type[plan.Route], kind: SiteKind):
  # A route of the type without its fields: matching reads the type alone.
  return SimpleNamespace(route=object.__new__(route), site=SimpleNamespace(kind=kind))


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
@pytest.mark.parametrize("kind", list(SiteKind))
def test_each_route_and_kind_has_one_pattern(route, kind):
  cand = _candidate(route, kind)
  matching = [p for p in site_patterns.PATTERNS if p.matches(cand)]  # type: ignore[arg-type]
  assert len(matching) == 1, (route, kind, matching)
  assert site_patterns.pattern_for(cand) is matching[0]  # type: ignore[arg-type]


def test_a_route_without_a_pattern_is_an_error():
  with pytest.raises(AssertionError, match="no rewrite pattern for route 'native'"):
    site_patterns.pattern_for(_candidate(plan.NativeRoute, SiteKind.ALL_REDUCE))  # type: ignore[arg-type]
