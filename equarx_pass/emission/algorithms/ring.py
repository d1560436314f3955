"""The quantized ring all-reduce (EQuARX), and the bidirectional ring: model and emitters.

Group of N ranks, each with a flat f32 vector of L values laid out as N chunks
(layout.py):

  RS step s (s = 0 .. N-2), on rank r:
            send  quantize(partial)            to rank r+1
            recv  from rank r-1, partial = dequantize(recv) + x[(r - s - 1) mod N]
            (partial starts as x[r]; rank r ends owning chunk (r + 1) mod N)
  final     own = quantize(partial), once
  AG step s (s = 0 .. N-2), on rank r:
            forward the quantized chunk (own at s = 0) to rank r+1 unchanged,
            recv chunk (r - s) mod N from rank r-1
  output    every rank dequantizes all N quantized chunks (its own included, so
            all ranks hold the same bits), casts to the original dtype, un-pads.

Lanes: a chunk may be split into lanes (scheme.Lane), each on its own permutes: the
microshards, and for the bidirectional ring a counter-clockwise half, which is the
clockwise ring over the group in reverse order.

The flat form loops (the paper's "full-loop" ring): two while loops per site whatever
the group size, or the reduce-scatter written out for large sites (SitePlan.unrolled).
q() packs the codes and the scales into one int8 payload, so a lane moves with a single
permute.  The tiled form (one lane) writes the N-1 reduce-scatter steps out and gathers
the owned chunks with one all_gather: the bytes the ring's all-gather steps forward.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo
from numpy.typing import DTypeLike

from equarx_pass.emission import quantize as qz
from equarx_pass.emission.algorithms.base import Algorithm, Finish
from equarx_pass.emission.formats import INT8, Format
from equarx_pass.emission.forms import LOOP_FROM_MEMBERS, FlatSite, TiledSite, add
from equarx_pass.emission.quantize_emit import FlatCodec
from equarx_pass.ir.hlo_builder import Emitter, shape_of, unrolled_loop, while_loop
from equarx_pass.ir.layout import ChunkLayout, chunk_layout, pad_chunks, unpad

if TYPE_CHECKING:
  from equarx_pass.emission.scheme import Lane, Scheme


# --- the NumPy model -----------------------------------------------------------------


def reduce_scatter_chunk(rank: int, step: int, n: int) -> int:
  """Index of the local chunk that rank adds at RS step `step`."""
  return (rank - step - 1) % n


def all_gather_chunk(rank: int, step: int, n: int) -> int:
  """Index of the quantized chunk that rank receives at AG step `step`."""
  return (rank - step) % n


def owned_chunk(rank: int, n: int) -> int:
  return (rank + 1) % n


def ring_reduce_scatter(
  x: Sequence[np.ndarray], block: int, fmt: Format = INT8
) -> list[np.ndarray]:
  """The ring's reduce-scatter half on chunk matrices: x[r] is rank r's f32 [N, s]
  (ranks in ring order: r sends to r + 1).  Returns rank r's f32 [s] sum of chunk
  owned_chunk(r), before its quantization."""
  n = len(x)
  # partial[r] is what rank r sends at the next step.
  partial = [x[r][r].copy() for r in range(n)]
  for step in range(n - 1):
    sent = [qz.quantize(partial[r], block, fmt) for r in range(n)]
    for r in range(n):
      q, s = sent[(r - 1) % n]
      # Dequantize and add in one rounding: XLA contracts the multiply and the add.
      values = qz.codes_to_f32(q, fmt, block).reshape(s.shape + (block,))
      local = x[r][reduce_scatter_chunk(r, step, n)].reshape(values.shape)
      partial[r] = qz.fused_multiply_add(values, s[:, None], local).reshape(-1)
  return partial


def ring_chunks(x: Sequence[np.ndarray], block: int, fmt: Format = INT8) -> list[tuple]:
  """The quantized ring on chunk matrices: x[r] is rank r's f32 [N, s] (ranks in
  ring order: r sends to r + 1).  Returns what every rank holds at the end: the
  codes [N, code bytes] and scales [N, blocks] of all N reduced chunks."""
  n = len(x)
  partial = ring_reduce_scatter(x, block, fmt)
  # Final quantization once; the all-gather forwards the bytes unchanged.
  own = [qz.quantize(partial[r], block, fmt) for r in range(n)]
  gathered: list[list] = [[None] * n for _ in range(n)]
  for r in range(n):
    gathered[r][owned_chunk(r, n)] = own[r]
  cur = own
  for step in range(n - 1):
    cur = [cur[(r - 1) % n] for r in range(n)]
    for r in range(n):
      gathered[r][all_gather_chunk(r, step, n)] = cur[r]
  # Every rank holds every chunk's quantized bytes, its own included.
  return [
    (np.stack([q for q, _ in gathered[r]]), np.stack([s for _, s in gathered[r]])) for r in range(n)
  ]


def reference_allreduce(
  inputs: Sequence[np.ndarray], block_size: int, out_dtype: DTypeLike | None = None
) -> list[np.ndarray]:
  """Per-rank results of the int8 ring over one group, ranks in ring order.

  inputs[r] is rank r's operand (any shape, all equal); the result of rank r has
  the same shape and `out_dtype` (default: the input dtype).  Every other scheme:
  equarx_pass.emission.scheme.reference.
  """
  n = len(inputs)
  shape = np.shape(inputs[0])
  out_dtype = out_dtype or np.asarray(inputs[0]).dtype
  layout = chunk_layout(int(np.prod(shape, dtype=np.int64)), n, block_size)
  out = ring_chunks([pad_chunks(v, layout) for v in inputs], layout.block)
  return [unpad(qz.dequantize(q, s, layout.block), layout, shape, out_dtype) for q, s in out]


def error_bound(inputs: Sequence[np.ndarray], block_size: int) -> float:
  """A loose upper bound on max |result - exact sum| for the int8 ring.

  Each quantization of a block with absmax m adds at most m / 254 per value
  (half a step).  A partial sum's absmax is at most the sum of the absmaxes of its
  terms, so every one of the N quantizations in a value's path adds at most
  S / 254, S = sum over ranks of max|x_r|.
  """
  n = len(inputs)
  s = sum(float(np.max(np.abs(np.asarray(v, np.float64)))) for v in inputs)
  return n * s / (2 * INT8.qmax) * (1 + 1e-5) + 1e-30


# --- the emitters --------------------------------------------------------------------


class _ReduceScatterCarry(NamedTuple):
  partials: list  # per lane, its partial sum's block parts (FlatCodec.block_parts), f32
  chunks: ir.Value  # [N, C], where the local chunks are read
  rank: ir.Value  # this rank's position in the clockwise ring
  ccw_rank: ir.Value  # ... and in the counter-clockwise one


class _AllGatherCarry(NamedTuple):
  currents: list  # per lane, the payload forwarded at this step
  gathered: list  # per lane, int8 [N, P]: the payloads received so far
  rank: ir.Value
  ccw_rank: ir.Value


class Ring(Algorithm):
  name = "ring"
  description = "the paper's ring: 2(N-1) steps, a quantization at each reduce-scatter step"
  has_tiled_form = True

  def __init__(self, name: str = "ring", directions: int = 1, description: str = ""):
    self.name, self.directions = name, directions
    self.description = description or Ring.description
    self.has_tiled_form = self.emits_reduce_scatter = directions == 1

  def wire_bytes(self, layout: ChunkLayout, fmt: Format) -> int:
    """2(N-1) quantized chunks (bidirectional: each direction a share of every chunk)."""
    return 2 * (layout.group_size - 1) * fmt.payload_bytes(layout.chunk, layout.blocks)

  def reference(
    self, x: list[np.ndarray], scheme: Scheme, layout: ChunkLayout, finish: Finish
  ) -> list[np.ndarray]:
    n = len(x)
    out = [np.zeros_like(v) for v in x]
    for lane in scheme.lanes(layout):
      cols = slice(lane.offset, lane.offset + lane.size)
      # Counter-clockwise is the clockwise ring over the ranks in reverse order.
      order = list(range(n)) if lane.direction == 1 else list(range(n))[::-1]
      res = ring_chunks([x[r][:, cols] for r in order], layout.block, scheme.fmt)
      for pos, r in enumerate(order):
        out[r][:, cols] = finish(*res[pos])
    return out

  def reduce_scatter_reference(
    self, x: list[np.ndarray], scheme: Scheme, layout: ChunkLayout
  ) -> list[np.ndarray]:
    """The ring over the rows rolled by one, so that rank r ends owning row r."""
    return ring_reduce_scatter([np.roll(v, 1, axis=0) for v in x], layout.block, scheme.fmt)

  def emit_flat(self, site: FlatSite) -> ir.Value:
    """Reduce-scatter and all-gather loops over the lanes; f32 [N, C]."""
    em, codec, coll = site.em, site.codec, site.coll
    n = site.layout.group_size
    lanes = site.scheme.lanes(site.layout)
    rank = coll.group_rank()
    # Counter-clockwise lanes run the clockwise ring over the group reversed:
    # there rank r sits at position N-1-r.
    ccw_rank = hlo.SubtractOp(em.i32_scalar(n - 1), rank).result

    def ranks_of(carry: _ReduceScatterCarry | _AllGatherCarry) -> dict[int, ir.Value]:
      return {1: carry.rank, -1: carry.ccw_rank}

    def local_parts(chunks: ir.Value, row: ir.Value, lane: Lane) -> list[ir.Value]:
      return [site.widen(part) for part in codec.dynamic_parts(chunks, row, lane.offset, lane.size)]

    def rs_step(step: ir.Value, carry: _ReduceScatterCarry) -> _ReduceScatterCarry:
      ranks, new = ranks_of(carry), []
      for lane, partial in zip(lanes, carry.partials):
        received = coll.permute(codec.quantize_parts(partial), lane.direction)
        idx = em.mod(em.add_i32(hlo.SubtractOp(ranks[lane.direction], step).result, -1), n)
        new.append(codec.accumulate(received, local_parts(carry.chunks, idx, lane)))
      return carry._replace(partials=new)

    start = {1: rank, -1: ccw_rank}
    partials = [local_parts(site.chunks, start[lane.direction], lane) for lane in lanes]
    # A while loop must carry the chunks, and XLA copies all N of them into the loop's
    # buffer on every call; written out, each step slices the operand where it lies.
    # Where loops may not hold collectives (XLA:CPU), both loops are written out.
    in_loops = site.plan.collectives_in_loops
    loop = unrolled_loop if site.plan.unrolled or not in_loops else while_loop
    carry = loop(_ReduceScatterCarry(partials, site.chunks, rank, ccw_rank), n - 1, rs_step)

    # Final quantization, once; then the all-gather forwards bytes unchanged.
    owns = [codec.quantize_parts(parts) for parts in carry.partials]
    # The gather buffer starts as N copies of this rank's own chunk: its own row is then
    # in place, and the all-gather overwrites every other one.
    gathered = [em.bcast(own, (n, shape_of(own)[1]), [0, 1]) for own in owns]

    def ag_step(step: ir.Value, carry: _AllGatherCarry) -> _AllGatherCarry:
      ranks, currents, outs = ranks_of(carry), [], []
      for lane, cur, out in zip(lanes, carry.currents, carry.gathered):
        cur = coll.permute(cur, lane.direction)
        idx = em.mod(hlo.SubtractOp(ranks[lane.direction], step).result, n)
        currents.append(cur)
        outs.append(em.set_rows(out, idx, cur))
      return carry._replace(currents=currents, gathered=outs)

    ag_loop = while_loop if in_loops else unrolled_loop
    done = ag_loop(_AllGatherCarry(owns, gathered, rank, ccw_rank), n - 1, ag_step)
    # Every rank dequantizes all N chunks the same way: identical bits everywhere.
    return em.concat(
      [
        codec.dequantize_rows(g, lane.size, site.rotation_size)
        for g, lane in zip(done.gathered, lanes)
      ],
      1,
    )

  def emit_tiled(self, site: TiledSite) -> tuple[ir.Value, ir.Value]:
    """N-1 reduce-scatter steps written out, each quantize -> permute codes and scales ->
    dequantize + this rank's chunk; the owned chunk quantized once; then one all_gather
    of the quantized chunks (the bytes the ring's all-gather steps would forward)."""
    coll, n = site.coll, site.n
    partial = self._reduce_scatter_steps(site, coll.group_rank(), 0)
    # rank r owns chunk (r + 1) mod N
    codes, scales = site.codec.quantize(partial)
    # Gathered from rank N-1 (which owns chunk 0) on, the chunks arrive in their order:
    # the group listed from its last rank, no reordering afterwards.
    return site.exchange(functools.partial(coll.all_gather, first=n - 1), codes, scales)

  def emit_reduce_scatter(self, site: TiledSite) -> ir.Value:
    """The steps over the rows shifted by one, so that rank r ends owning row r."""
    return self._reduce_scatter_steps(site, site.coll.group_rank(), 1)

  def _reduce_scatter_steps(self, site: TiledSite, rank: ir.Value, shift: int) -> ir.Value:
    """The N-1 steps written out, row (index - shift) mod N standing for chunk index; the
    f32 partial sum this rank ends with."""
    em, codec, coll, n = site.em, site.codec, site.coll, site.n

    def row_of(index: ir.Value) -> ir.Value:
      return em.mod(em.add_i32(index, -shift), n) if shift else index

    def step_fn(step: ir.Value, partial: ir.Value) -> ir.Value:
      codes, scales = codec.quantize(partial)
      codes, scales = site.exchange(functools.partial(coll.permute, direction=1), codes, scales)
      behind = hlo.SubtractOp(em.add_i32(rank, -1 - shift), step).result
      return add(codec.dequantize(codes, scales), site.local(em.mod(behind, n)))

    # A loop from LOOP_FROM_MEMBERS members on, where a loop may hold collectives (not
    # on CPU: outline.py); the same ops either way.
    looped = n >= LOOP_FROM_MEMBERS and site.plan.collectives_in_loops
    loop = while_loop if looped else unrolled_loop
    partial: ir.Value = loop(site.local(row_of(rank)), n - 1, step_fn)
    return partial


RING = Ring()
BIDIRECTIONAL = Ring(
  "bidirectional", 2, "the ring in both directions at once, each on half of every chunk"
)


def emit_ring_step(payload: ir.Value, local: ir.Value, block: int, fmt: Format) -> ir.Value:
  """One flat ring step's arithmetic between two permutes: Dq -> f32 add -> Qp1/Qp2.

  payload: int8 [1, P] as received; local: f32 [1, C], this rank's chunk.
  Returns the int8 [1, P] payload the next permute sends: the reduce-scatter step's
  own ops (FlatCodec.accumulate, quantize_parts); ring_step.py compiles them alone.
  """
  codec = FlatCodec(Emitter(), fmt, block)
  return codec.quantize_parts(codec.accumulate(payload, codec.block_parts(local)))
