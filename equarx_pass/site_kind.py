"""What a site is: the one enum of the collectives the pass finds and rewrites.

A `StrEnum`: a kind is its own flag spelling (`--equarx_ops=reduce_scatter`), so it
compares, hashes and prints as that string, and the report's text is the same whether a
kind came from a flag or from the enum.
"""

from __future__ import annotations

import enum


class SiteKind(enum.StrEnum):
  """A float-sum all-reduce (the default), and, when --equarx_ops names them, a float-sum
  reduce-scatter and an all-gather (match.py finds them)."""

  ALL_REDUCE = "all_reduce"
  REDUCE_SCATTER = "reduce_scatter"
  ALL_GATHER = "all_gather"

  @property
  def op_name(self) -> str:
    """all_reduce -> all-reduce: the collective as XLA and the README name it."""
    return self.value.replace("_", "-")


# Every kind's flag spelling, in declaration order (--equarx_ops's choices).
SITE_KINDS: tuple[str, ...] = tuple(k.value for k in SiteKind)
