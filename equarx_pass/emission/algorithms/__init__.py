"""The all-reduce algorithms, by name: each is one object (algorithms/base.py) in a module
of its own, with its NumPy model, its wire bytes and its emitters.

A new algorithm is a module here defining an `Algorithm` and one `register` line below;
the policy's --equarx_algorithm choices, the scheme's checks, the model the tests use and
the report's bytes all come from this registry.
"""

from __future__ import annotations

from equarx_pass import registry
from equarx_pass.emission.algorithms.base import Algorithm
from equarx_pass.emission.algorithms.one_shot import ONE_SHOT
from equarx_pass.emission.algorithms.ring import BIDIRECTIONAL, RING
from equarx_pass.emission.algorithms.two_shot import TWO_SHOT

ALGORITHMS: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> Algorithm:
  return registry.add(ALGORITHMS, algorithm, "algorithm")


for _algorithm in (RING, TWO_SHOT, BIDIRECTIONAL, ONE_SHOT):
  register(_algorithm)

__all__ = ["ALGORITHMS", "Algorithm", "register"]
