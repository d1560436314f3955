"""The two emitted forms' shared parts: a site's operands as chunks, and the way back.

Every algorithm (algorithms/) emits the same all-reduce in up to two forms:

  flat    x: [N, C], the operands flattened, padded and rotated (the model's
          butterflies); rows quantized into single int8 payloads (quantize_emit.FlatCodec),
          so a lane moves with one collective; loops where steps repeat.  Every scheme
          has a flat form.
  tiled   x: [N, R, S, W], N chunks of R blocks, each block S rows of W lanes (W = 128
          when the block is a multiple of 128: one TPU vreg row; else the block); 8-bit
          codes of one-row blocks eight to a tile, [N, R / 8, 8, 128]; codes and scales
          as two arrays (quantize_emit.TileCodec), whose layouts an accelerator's compiler
          keeps without copies; steps written out.  The forward rotation is the model's
          butterflies on CPU (the same bits as the model) and a matmul elsewhere; the
          inverse a matmul on the codes (exact), then the signs.

A FlatSite or TiledSite holds what an algorithm's emitter starts from (the chunks, the
codec, the collectives) and turns its result back into the operands' shapes and types.
BUILD_NOTES ("Emitted forms") has the measurements behind the two.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Sequence

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass import rotation, rotation_emit
from equarx_pass.hlo_builder import (
  ChannelAllocator,
  Collectives,
  Emitter,
  front_order,
  narrow_float,
  shape_of,
)
from equarx_pass.layout import ChunkLayout, DeviceKind, GroupSchedule
from equarx_pass.quantize_emit import FlatCodec, TileCodec

if TYPE_CHECKING:
  from equarx_pass.scheme import Scheme

LANES = 128
SUBLANES = 8  # rows of a TPU tile


@dataclasses.dataclass(frozen=True)
class SitePlan:
  """One site's quantized all-reduce: what every algorithm's emitter needs."""

  layout: ChunkLayout
  schedule: GroupSchedule
  device_kind: DeviceKind
  num_devices: int
  scheme: Scheme
  unrolled: bool = False  # flat ring: reduce-scatter steps written out, not looped
  # The tiled form's forward rotation as a matmul (TPU, GPU) rather than the model's
  # butterflies (CPU: the same bits as the model, at the same speed there).
  matmul_rotation: bool = True
  # Whether a loop may hold collectives.  Not on XLA:CPU, which orders a loop's
  # collectives after the collectives that follow it only by the loop's launch: one
  # order of collectives on every device needs them written out there (outline.py).
  collectives_in_loops: bool = True

  @property
  def rotation_size(self) -> int:
    """The rotation's size, 0 without one."""
    s = self.scheme
    return s.resolved_rotation_size if s.rotation != rotation.NONE else 0


class FlatSite:
  """The flat form's start: `chunks` [N, C], f32, or the 16-bit pattern of bf16/f16
  operands (as i16) that `widen` makes f32 row by row; `finish` takes f32 [N, C]."""

  def __init__(self, operands: list[ir.Value], plan: SitePlan, channels: ChannelAllocator):
    em = self.em = Emitter()
    self.plan, self.scheme, self.layout = plan, plan.scheme, plan.layout
    n, c = plan.layout.group_size, plan.layout.chunk
    self.coll = Collectives(em, plan, channels)
    self.codec = FlatCodec(em, plan.scheme.fmt, plan.layout.block)
    self.rotation_size = plan.rotation_size
    # Flatten the operands, lay them out as N chunks, rotate.
    self.types = [ir.RankedTensorType(v.type) for v in operands]
    narrow = narrow_float(self.types) if not self.rotation_size else None
    x = em.flat_padded(operands, narrow or em.f32, plan.layout.padded)
    if self.rotation_size:
      x = rotation_emit.hadamard(em, x, self.rotation_size)
    chunks = em.reshape(x, (n, c))
    if narrow is not None:
      # Without a rotation, bf16/f16 chunks stay 16-bit and each ring step widens only
      # the row it reads (exact).  Widening up front writes a fresh f32 copy of all N
      # chunks: a quarter of the int8 ring's run time for 32 MiB of bf16 on XLA:CPU.
      # The rows travel as i16 bits because XLA:CPU's float normalization widens a
      # bf16 dynamic-slice's whole operand, and the loop then hoists that widening.
      chunks = em.bitcast(chunks, (n, c), em.i16)
    self.chunks = chunks
    self.widen = functools.partial(em.widen, narrow=narrow)

  def finish(self, values: ir.Value) -> list[ir.Value]:
    """f32 [N, C], the same bits on every rank -> one value per operand, its type."""
    return self.em.unflatten_like(values, self.types)


@dataclasses.dataclass(frozen=True)
class Pieces:
  """A reduce-scatter's or all-gather's operand as chunk rows: its `dimension` moved to
  the front, then `rows` pieces (a reduce-scatter's N, rank r's piece in row r; an
  all-gather's one, this rank's) of equal size, each padded to the chunk.  `result` is
  the collective's result type."""

  dimension: int
  rows: int
  result: ir.RankedTensorType


def _moved_shape(shape: Sequence[int], dimension: int) -> tuple[int, ...]:
  return (shape[dimension], *shape[:dimension], *shape[dimension + 1 :])


class TiledSite:
  """The tiled form's start: `chunks` [N, *tile] (rotated where the scheme rotates; 16-bit
  floats stay 16-bit until a step reads them); `finish` takes the gathered codes and
  scales of all N chunks in chunk order.  With `pieces`, the chunks are a reduce-scatter's
  or all-gather's rows ([rows, *tile]), and `finish_pieces` / `finish_own` end it."""

  def __init__(
    self,
    operands: list[ir.Value],
    plan: SitePlan,
    channels: ChannelAllocator,
    pieces: Pieces | None = None,
  ):
    em = self.em = Emitter()
    self.plan, self.scheme, self.layout = plan, plan.scheme, plan.layout
    self.coll = Collectives(em, plan, channels)
    self.fmt = plan.scheme.fmt
    self.n, c, block = plan.layout.group_size, plan.layout.chunk, plan.layout.block
    w = LANES if block % LANES == 0 else block
    # One chunk: R blocks of S x W; 8-bit codes of one-row blocks of 128 lanes eight to
    # a tile [R / 8, 8, 128], with scales [R / 8, 8]; else [R, W].  Never a size-1
    # dimension above the lanes.  By the TPU compiler's estimates (v5e:2x2, 32 MiB of
    # bf16) int8 two-shot with block 128 and H_128 costs 6.80x the native all-reduce's
    # on-chip time so, 11.15x as [R, 128] (whose scales a TPU lays out along lanes and
    # relayouts); the int4 ring with block 128 6.03x as [R, 128], 7.03x (nibbles paired
    # across lanes) and 7.25x (across rows) as [R / 8, 8, 128].
    rows = block // w
    self.tile: tuple[int, ...]
    if rows > 1:
      self.tile, block_dims = (c // block, rows, w), 2
    elif w == LANES and (c // block) % SUBLANES == 0 and self.fmt.bits == 8:
      self.tile, block_dims = (c // block // SUBLANES, SUBLANES, w), 1
    else:
      self.tile, block_dims = (c // block, w), 1
    # int4 bytes pair the halves of a block's rows where it has an even number of them,
    # else the halves of its lanes.
    pair_rows = block_dims == 2 and rows % 2 == 0
    self.codec = TileCodec(em, self.fmt, block_dims, -2 if pair_rows else -1)
    self.types = [ir.RankedTensorType(v.type) for v in operands]
    self.size = plan.rotation_size
    # 16-bit floats stay 16-bit until a step reads them (exact), and enter the rotation's
    # matmul as they are: their products with +-1 are exact and the sums f32.
    entry = narrow_float(self.types) or em.f32
    self.pieces = pieces
    if pieces is None:
      x = em.reshape(em.flat_padded(operands, entry, plan.layout.padded), (self.n, *self.tile))
    else:
      x = em.reshape(self._piece_rows(operands[0], pieces, entry), (pieces.rows, *self.tile))
    if self.size and plan.matmul_rotation:
      # (H / size) x in one matmul: the power-of-two scale is exact in the matrix and in
      # the products (the same value as scaling first, unless a sum overflows).
      x = rotation_emit.matmul(em, x, self.size, exact=False, forward=True)
    elif self.size:
      # The model's butterflies, in its order: the same bits as the model.
      shape = shape_of(x)
      flat = em.reshape(em.convert(x, em.f32), (int(np.prod(shape, dtype=np.int64)),))
      x = em.reshape(rotation_emit.hadamard(em, flat, self.size), shape)
    self.chunks = x

  def _piece_rows(self, operand: ir.Value, pieces: Pieces, entry: ir.Type) -> ir.Value:
    """The operand's pieces, [rows, C] of `entry`: moved, cut, each padded to the chunk."""
    em, c = self.em, self.layout.chunk
    shape = shape_of(operand)
    x = operand
    if pieces.dimension:
      x = hlo.TransposeOp(x, front_order(len(shape), pieces.dimension)).result
    size = int(np.prod(shape, dtype=np.int64)) // pieces.rows
    x = em.reshape(em.convert(x, entry), (pieces.rows, size))
    if c > size:
      x = hlo.PadOp(x, em.splat(0, (), entry), [0, 0], [0, c - size], [0, 0]).result
    return x

  def _from_rows(self, values: ir.Value, rows: int) -> ir.Value:
    """f32 values of `rows` chunks (any shape, in order) -> the pieces in the result's
    shape and type: padding cut, the moved dimension back in place."""
    em, pieces = self.em, self.pieces
    assert pieces is not None
    result = pieces.result
    moved = _moved_shape(result.shape, pieces.dimension)
    size = int(np.prod(moved, dtype=np.int64)) // rows
    x = em.reshape(values, (rows, self.layout.chunk))
    if size < self.layout.chunk:
      x = em.slice(x, (0, 0), (rows, size))
    x = em.reshape(x, moved)
    if pieces.dimension:
      back = np.argsort(front_order(len(moved), pieces.dimension))
      x = hlo.TransposeOp(x, [int(i) for i in back]).result
    return em.convert(x, result.element_type)

  def finish_own(self, values: ir.Value) -> list[ir.Value]:
    """A reduce-scatter's end: this rank's f32 sum [*tile] (rotated domain) -> its piece.
    The inverse rotation runs on the f32 sums: the model's butterflies, then the signs."""
    em = self.em
    if self.size:
      flat = em.reshape(values, (self.layout.chunk,))
      flat = rotation_emit.butterflies(em, flat, self.size)
      values = rotation_emit.times_per_position(em, flat, rotation.signs(self.size))
    return [self._from_rows(values, 1)]

  def finish_pieces(self, codes: ir.Value, scales: ir.Value) -> list[ir.Value]:
    """An all-gather's end: every rank's codes and scales, in group order -> the result."""
    return [self._from_rows(self._dequantize(codes, scales), self.layout.group_size)]

  def local(self, index: ir.Value) -> ir.Value:
    """This rank's chunk `index` (a traced i32 scalar), f32 [*tile]."""
    em = self.em
    zero = em.i32_scalar(0)
    shape = shape_of(self.chunks)
    piece = em.dynamic_slice(self.chunks, [index] + [zero] * (len(shape) - 1), (1, *shape[1:]))
    return em.convert(em.reshape(piece, shape[1:]), em.f32)

  def finish(self, codes: ir.Value, scales: ir.Value) -> list[ir.Value]:
    """All N chunks' codes [N R, ...] and scales [N R, ...], in chunk order -> the results."""
    return self.em.unflatten_like(self._dequantize(codes, scales), self.types)

  def _dequantize(self, codes: ir.Value, scales: ir.Value) -> ir.Value:
    """Codes and scales -> f32 values, rotated back where the scheme rotates."""
    em = self.em
    if self.size:
      values = rotation_emit.matmul(
        em, self.codec.values(codes), self.size, exact=True, forward=False
      )
      # The signs after H, as the model flips them: a zero sum at a flipped position is
      # -0 there (folded into the matrix it would come out +0).
      shape = shape_of(values)
      flat = em.reshape(values, (int(np.prod(shape, dtype=np.int64)),))
      values = em.reshape(
        rotation_emit.times_per_position(em, flat, rotation.signs(self.size)), shape
      )
      scales = self.codec.scales(scales)
      lead = list(range(len(shape_of(scales))))
      values = hlo.MulOp(values, em.bcast(scales, shape_of(values), lead)).result
    else:
      values = self.codec.dequantize(codes, scales)
    return values


def plus_zero(em: Emitter, x: ir.Value) -> ir.Value:
  """x + 0, as the model's sum starts (-0 becomes +0; fp8 codes have a signed zero).
  Written as a select: XLA simplifies an add of 0 away."""
  zero = em.splat(0, shape_of(x), em.f32)
  is_zero = hlo.CompareOp(x, zero, hlo.ComparisonDirectionAttr.get("EQ")).result
  return hlo.SelectOp(is_zero, zero, x).result


def add(term: ir.Value, acc: ir.Value) -> ir.Value:
  """term + acc, the new term first: XLA:CPU contracts a multiply feeding an add into an
  FMA, and where both operands of an add are products LLVM fuses the first one's.  So
  the sum is fma(q, s, acc), as quantize.fused_multiply_add has it."""
  return hlo.AddOp(term, acc).result


def row(em: Emitter, x: ir.Value, j: int) -> ir.Value:
  """x[j] of an array with a leading dimension, that dimension dropped."""
  shape = shape_of(x)
  start = (j,) + (0,) * (len(shape) - 1)
  return em.reshape(em.slice(x, start, (j + 1,) + shape[1:]), shape[1:])


def dynamic_row(em: Emitter, x: ir.Value, j: ir.Value) -> ir.Value:
  """x[j] for a traced i32 scalar j, the leading dimension dropped."""
  shape = shape_of(x)
  zero = em.i32_scalar(0)
  piece = em.dynamic_slice(x, [j] + [zero] * (len(shape) - 1), (1, *shape[1:]))
  return em.reshape(piece, shape[1:])


# From this many group members on, the steps that repeat once per member (the two-shot's
# sum, the ring's reduce-scatter) are a loop, not written out: the emitted program, and
# the compile, then stay the same size whatever the group (at 256 chips, written out,
# one site compiled for a TPU in 34 s).
LOOP_FROM_MEMBERS = 16
