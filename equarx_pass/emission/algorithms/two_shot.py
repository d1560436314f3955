"""The two-shot quantized all-reduce: all-to-all, f32 sums, all-gather.

Group of N ranks, each with f32 [N, C] chunk rows (chunk c = row c):

  quantize    every rank quantizes all N of its chunks, once
  all-to-all  rank r receives chunk r of every rank j (in group order)
  sum         acc = 0; acc += dequantize(from rank j) for j = 0 .. N-1, in f32
              (XLA contracts each dequantize-and-add into one FMA)
  quantize    the owned sum, once
  all-gather  every rank receives every rank's quantized sum unchanged
  output      every rank dequantizes all N chunks

Same bytes on the wire as the ring (2(N-1) chunks per rank), but only two
quantizations in each value's path instead of N, and two collective steps
instead of 2(N-1): lower error and latency, at the price of all-to-all traffic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass.emission import quantize as qz
from equarx_pass.emission.algorithms.base import Algorithm, Finish
from equarx_pass.emission.formats import INT8, Format
from equarx_pass.emission.forms import (
  LOOP_FROM_MEMBERS,
  FlatSite,
  TiledSite,
  sum_in_group_order,
)
from equarx_pass.ir.hlo_builder import shape_of, while_loop
from equarx_pass.ir.layout import ChunkLayout

if TYPE_CHECKING:
  from equarx_pass.emission.scheme import Scheme


def two_shot_sums(x: Sequence[np.ndarray], block: int, fmt: Format = INT8) -> list[np.ndarray]:
  """The reduce-scatter half.  x[r]: rank r's f32 [N, C].  Returns rank r's f32 [C] sum
  of chunk r, in group order, before its quantization."""
  n = len(x)
  sent = [qz.quantize(x[j], block, fmt) for j in range(n)]  # [N, C] codes, [N, blocks]
  sums = []
  for r in range(n):
    acc = np.zeros_like(x[r][r])
    for j in range(n):
      q, s = sent[j][0][r], sent[j][1][r]
      values = qz.codes_to_f32(q, fmt, block).reshape(s.shape + (block,))
      acc = qz.fused_multiply_add(values, s[:, None], acc.reshape(values.shape)).reshape(-1)
    sums.append(acc)
  return sums


def two_shot_chunks(x: Sequence[np.ndarray], block: int, fmt: Format = INT8) -> list[tuple]:
  """x[r]: rank r's f32 [N, C].  Returns what every rank holds at the end: codes
  [N, code bytes] and scales [N, blocks] of all N reduced chunks."""
  n = len(x)
  owned = [qz.quantize(acc, block, fmt) for acc in two_shot_sums(x, block, fmt)]
  codes = np.stack([q for q, _ in owned])
  scales = np.stack([s for _, s in owned])
  return [(codes.copy(), scales.copy()) for _ in range(n)]


class _SumCarry(NamedTuple):
  acc: ir.Value  # f32 [1, C]: the sum so far
  received: ir.Value  # int8 [N, P]: row j from rank j


class TwoShot(Algorithm):
  name = "two_shot"
  description = "all-to-all of quantized chunks, f32 sums, all-gather: two quantizations"
  takes_microshards = False
  has_tiled_form = True
  emits_reduce_scatter = True
  chunk_order_free = True
  quantizes_chunks_once = True
  has_permuted_exchange = True

  def wire_bytes(self, layout: ChunkLayout, fmt: Format) -> int:
    """N-1 chunks in the all-to-all and N-1 in the all-gather: the ring's bytes."""
    n = layout.group_size
    chunk_bytes = fmt.payload_bytes(layout.chunk, layout.blocks)
    return (n - 1) * chunk_bytes + (n - 1) * chunk_bytes

  def collective_steps(self, group_size: int) -> int:
    """One all-to-all and one all-gather (the tiled form's codes and scales travel side
    by side)."""
    return 2

  def crossing_share(self, domains: Sequence[int]) -> float:
    """Half the bytes in an all-to-all, a piece to every other member, and half in an
    all-gather, which a collective that spans domains moves across them once per remote
    domain, not once per remote member (XLA across TPU slices; counted from compiled
    programs, tools/bench_multislice.py)."""
    n = len(domains)
    remote_members = sum(a != b for a in domains for b in domains) / n
    remote_domains = len(set(domains)) - 1
    return (remote_members + remote_domains) / (2 * (n - 1))

  def reference(
    self, x: list[np.ndarray], scheme: Scheme, layout: ChunkLayout, finish: Finish
  ) -> list[np.ndarray]:
    return [finish(q, s) for q, s in two_shot_chunks(x, layout.block, scheme.fmt)]

  def reduce_scatter_reference(
    self, x: list[np.ndarray], scheme: Scheme, layout: ChunkLayout
  ) -> list[np.ndarray]:
    return two_shot_sums(x, layout.block, scheme.fmt)

  def emit_flat(self, site: FlatSite) -> ir.Value:
    """all_to_all -> f32 sum in group order -> quantize once -> all_gather."""
    em, codec, coll = site.em, site.codec, site.coll
    n, c = site.layout.group_size, site.layout.chunk
    received = coll.all_to_all(codec.quantize_rows(site.widen(site.chunks)))  # j: from rank j

    def sum_step(j: ir.Value, carry: _SumCarry) -> _SumCarry:
      payload = em.dynamic_rows(carry.received, j, 0, 1, shape_of(carry.received)[1])
      term = codec.dequantize_rows(payload, c, requantized=True)
      return _SumCarry(hlo.AddOp(carry.acc, term).result, carry.received)

    acc = while_loop(_SumCarry(em.splat(0, (1, c), em.f32), received), n, sum_step).acc
    gathered = coll.all_gather(codec.quantize_rows(acc))  # row j: rank j's sum
    return codec.dequantize_rows(gathered, c, site.rotation_size)

  def emit_tiled(self, site: TiledSite) -> tuple[ir.Value, ir.Value]:
    """The reduce-scatter half, its sum quantized once (in the kernel form, summed and
    quantized in one kernel), all_gather."""
    codes, scales = self._exchanged(site)
    summed = site.sum_quantized(codes, scales) or site.codec.quantize(
      self._sum(site, codes, scales)
    )
    return site.exchange(site.coll.all_gather, *summed)

  def emit_permuted(self, site: TiledSite) -> ir.Value:
    """The kernel form's two-shot by collective-permutes: chunk k of the quantized chunks
    (rank + k's) goes k ranks on, the N received (the s-th from rank - s) are summed in
    group order, and the packed sum goes to every rank k on, N - 1 permutes each way.
    The same codes, sums and values as emit_tiled's; each permute can run while the
    kernels work on another chunk."""
    rank = site.permuted_rank()
    chunks = site.quantize_permuted(rank)
    received = [chunks[0]] + [site.coll.permute(chunks[k], k) for k in range(1, site.n)]
    summed = site.sum_permuted(received, rank)
    gathered = [summed] + [site.coll.permute(summed, k) for k in range(1, site.n)]
    return site.dequantize_permuted(gathered, rank)

  def emit_reduce_scatter(self, site: TiledSite) -> ir.Value:
    return self._sum(site, *self._exchanged(site))

  def _exchanged(self, site: TiledSite) -> tuple[ir.Value, ir.Value]:
    """Every chunk quantized and through the all_to_all: piece j from rank j."""
    codes, scales = site.quantize_chunks()
    return site.exchange(site.coll.all_to_all, codes, scales, site.n)

  def _sum(self, site: TiledSite, codes: ir.Value, scales: ir.Value) -> ir.Value:
    """The N terms summed in group order, in the rotated domain."""
    return sum_in_group_order(
      site.em, codes, scales, site.n, site.codec.dequantize, LOOP_FROM_MEMBERS
    )


TWO_SHOT = TwoShot()
