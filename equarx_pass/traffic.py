"""What a rewritten collective declares it sends: the one shape the cost model prices.

Algorithms (algorithms/base.py) and schemes (scheme.py) build a Declaration; cost.py prices
it.  It lives below both, plain data, so that emission's modules never import the
planner's.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Declaration:
  """What a rewritten site declares it sends (Algorithm.traffic, Scheme.traffic): the bytes
  one device sends, the collective steps it takes one after the other (what a link's
  latency is paid for), and the share of the bytes that crosses domains.  The cost model
  prices this and nothing else about an algorithm, so a new algorithm is priced from its
  own declaration."""

  wire_bytes: int
  steps: int
  crossing: float = 0.0
