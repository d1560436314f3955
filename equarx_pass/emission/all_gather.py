"""The quantized all-gather (--equarx_ops=...,all_gather): the model is
scheme.all_gather_reference.

Every rank quantizes its piece once (rotated first where the scheme rotates), one
all_gather moves the codes and one the scales, and every rank dequantizes all N pieces
the same way, its own included: the same bits on every rank.  The same for every
algorithm; emitted in the tiled form (forms.TiledSite with one row).
"""

from __future__ import annotations

from jax.extend.mlir import ir

from equarx_pass.emission.forms import Pieces, SitePlan, TiledSite
from equarx_pass.ir.hlo_builder import ChannelAllocator


def emit_all_gather(
  operand: ir.Value, plan: SitePlan, channels: ChannelAllocator, pieces: Pieces
) -> list[ir.Value]:
  """The all-gather at the current insertion point: the result, one value."""
  site = TiledSite([operand], plan, channels, pieces)
  codes, scales = site.quantize_chunks()
  return site.finish_pieces(*site.exchange(site.coll.all_gather, codes, scales))
