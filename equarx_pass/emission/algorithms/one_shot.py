"""The one-shot quantized all-reduce: one all-gather of every rank's quantized operand, and
every rank sums them all.

Group of N ranks, each with f32 [N, C] chunk rows:

  quantize    every rank quantizes all N of its chunks, once
  all-gather  every rank receives every rank's codes and scales, unchanged
  sum         acc = 0; acc += dequantize(rank j's chunks) for j = 0 .. N-1, in f32, in
              group order (XLA contracts each dequantize-and-add into one FMA); with a
              rotation, each rank's values are rotated back before they are added

One quantization in each value's path and one collective step, against the two-shot's
two and two; a rank sends N-1 copies of its whole operand, N/2 times the two-shot's bytes.
For two ranks the bytes are the two-shot's, and the step it saves is what a small site
pays on a slow link (the cost model's latency per step): there the plan takes it where
the two-shot is predicted to lose (plan.py).  Every rank adds the same values in the same
order, so all hold the same bits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
from jax.extend.mlir import ir

from equarx_pass.emission import quantize as qz
from equarx_pass.emission import rotation
from equarx_pass.emission.algorithms.base import Algorithm, Finish
from equarx_pass.emission.formats import Format
from equarx_pass.emission.forms import (
  LOOP_FROM_MEMBERS,
  FlatSite,
  SitePlan,
  TiledSite,
  add,
  plus_zero,
  sum_in_group_order,
)
from equarx_pass.ir.hlo_builder import ChannelAllocator, shape_of
from equarx_pass.ir.layout import ChunkLayout

if TYPE_CHECKING:
  from equarx_pass.emission.scheme import Scheme


def one_shot_sum(x: Sequence[np.ndarray], scheme: Scheme, block: int) -> np.ndarray:
  """x[r]: rank r's f32 [N, C] (rotated where the scheme rotates).  Returns the f32
  [N, C] result every rank holds: each rank's quantized chunks, dequantized and rotated
  back, summed in group order."""
  fmt = scheme.fmt
  size = scheme.resolved_rotation_size if scheme.rotation != rotation.NONE else 0
  acc = np.zeros_like(x[0], dtype=np.float32)
  for xj in x:
    codes, scales = qz.quantize(xj, block, fmt)
    values = qz.codes_to_f32(codes, fmt, block)
    if size:  # the inverse rotation on the code values (exact), as on the way out
      values = rotation.butterflies(values, size).reshape(-1, size) * rotation.signs(size)
    values = values.reshape(scales.shape + (block,))
    acc = qz.fused_multiply_add(values, scales[..., None], acc.reshape(values.shape))
  return acc.reshape(x[0].shape)


class OneShot(Algorithm):
  name = "one_shot"
  description = "all-gather of every rank's quantized operand, f32 sums: one quantization, one step"
  takes_microshards = False
  has_tiled_form = True
  chunk_order_free = True

  def wire_bytes(self, layout: ChunkLayout, fmt: Format) -> int:
    """N-1 copies of this rank's N quantized chunks."""
    n = layout.group_size
    return (n - 1) * n * fmt.payload_bytes(layout.chunk, layout.blocks)

  def collective_steps(self, group_size: int) -> int:
    """One all-gather (the tiled form's codes and scales travel side by side)."""
    return 1

  def crossing_share(self, domains: Sequence[int]) -> float:
    """An all-gather: a rank's payload crosses to each other domain once (XLA moves an
    all-gather across TPU slices once per remote domain, tools/bench_multislice.py), of
    the N-1 copies the group's members receive."""
    n = len(domains)
    return (len(set(domains)) - 1) / (n - 1)

  def reference(
    self, x: list[np.ndarray], scheme: Scheme, layout: ChunkLayout, finish: Finish
  ) -> list[np.ndarray]:
    result = one_shot_sum(x, scheme, layout.block)
    return [result.copy() for _ in x]

  def emit_flat(self, site: FlatSite) -> ir.Value:
    """quantize -> all_gather -> each rank's rows dequantized (and rotated back), summed
    in group order."""
    em, codec = site.em, site.codec
    n, c = site.layout.group_size, site.layout.chunk
    gathered = site.coll.all_gather(codec.quantize_rows(site.widen(site.chunks)))
    width = shape_of(gathered)[1]

    def term(j: int) -> ir.Value:
      rows = em.slice(gathered, (j * n, 0), ((j + 1) * n, width))
      return codec.dequantize_rows(rows, c, site.rotation_size)

    acc = plus_zero(em, term(0))
    for j in range(1, n):
      acc = add(term(j), acc)
    return acc

  def emit_tiled(self, site: TiledSite) -> tuple[ir.Value, ir.Value]:
    raise AssertionError("one_shot ends in f32 values: emit_tiled_values")

  def emit_tiled_values(self, site: TiledSite) -> ir.Value:
    """Every chunk quantized, all_gather, each rank's chunks dequantized (rotated back)
    and summed in group order: f32 values of all N chunks."""
    em, n = site.em, site.n
    codes, scales = site.quantize_chunks()
    codes, scales = site.exchange(site.coll.all_gather, codes, scales)
    # Row j of each: rank j's N chunks.
    codes, scales = (
      em.reshape(v, (n, shape_of(v)[0] // n, *shape_of(v)[1:])) for v in (codes, scales)
    )
    return sum_in_group_order(em, codes, scales, n, site.dequantize, LOOP_FROM_MEMBERS)

  def emit(
    self, operands: list[ir.Value], plan: SitePlan, channels: ChannelAllocator, tiled: bool
  ) -> list[ir.Value]:
    if not tiled:
      return super().emit(operands, plan, channels, tiled)
    site = TiledSite(operands, plan, channels)
    return site.finish_values(self.emit_tiled_values(site))


ONE_SHOT = OneShot()
