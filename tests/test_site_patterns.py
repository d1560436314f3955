"""The rewrite patterns: every route the plan names, for every site kind, has exactly one
pattern, and a route without one is an error rather than a silent fallback."""

from types import SimpleNamespace

import pytest

from equarx_pass import site_patterns

ROUTES = ("identity", "calibrated", "hierarchical", "flat")
KINDS = ("all_reduce", "reduce_scatter", "all_gather")


def _candidate(route: str, kind: str):
  return SimpleNamespace(route=SimpleNamespace(name=route), site=SimpleNamespace(kind=kind))


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("kind", KINDS)
def test_each_route_and_kind_has_one_pattern(route, kind):
  cand = _candidate(route, kind)
  matching = [p for p in site_patterns.PATTERNS if p.matches(cand)]  # type: ignore[arg-type]
  assert len(matching) == 1, (route, kind, matching)
  assert site_patterns.pattern_for(cand) is matching[0]  # type: ignore[arg-type]


def test_a_route_without_a_pattern_is_an_error():
  with pytest.raises(AssertionError, match="no rewrite pattern for route 'native'"):
    site_patterns.pattern_for(_candidate("native", "all_reduce"))  # type: ignore[arg-type]
