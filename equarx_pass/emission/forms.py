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
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass.emission import quantize_kernel, rotation, rotation_emit
from equarx_pass.emission.quantize_emit import FlatCodec, TileCodec
from equarx_pass.ir.hlo_builder import (
  ChannelAllocator,
  Collectives,
  Emitter,
  back_order,
  front_order,
  narrow_float,
  shape_of,
  while_loop,
)
from equarx_pass.ir.layout import ChunkLayout, DeviceKind, GroupSchedule

if TYPE_CHECKING:
  from equarx_pass.emission.quantize_kernel import QuantizeKernels
  from equarx_pass.emission.scheme import Scheme

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
  # The block maximum's NaN guard in the reduction's combiner (TPU, GPU), not a
  # select per value (CPU: quantize_emit.block_max).
  nan_in_combiner: bool = False
  # The tiled form's block maxima over a block's rows, then its lanes (TPU:
  # quantize_emit.block_max says why).
  block_max_in_stages: bool = False
  # Blocks in the order of the operand's (8, 128) tiles where its shape has them (TPU,
  # which stores arrays so), not in its flat order (tile_grid).
  tile_order: bool = False
  # Codes and scales through one collective of int8 rows (CPU), not one each
  # (TiledSite.exchange).
  pack_scales: bool = False
  # Whether a loop may hold collectives.  Not on XLA:CPU, which orders a loop's
  # collectives after the collectives that follow it only by the loop's launch: one
  # order of collectives on every device needs them written out there (outline.py).
  collectives_in_loops: bool = True
  # The kernel form: the site's quantize (TiledSite.quantize_chunks), sum
  # (sum_quantized) and dequantize (finish) as Pallas kernels where they can take the
  # site (quantize_kernel.py); given only for algorithms that quantize their chunks once.
  quantize_kernels: QuantizeKernels | None = None
  # How the kernel form's two-shot moves its chunks (the plan's choice, which a site's
  # shape can still turn back to the collectives: TiledSite.permuted).
  kernel_exchange: quantize_kernel.KernelExchange = quantize_kernel.KernelExchange.COLLECTIVES
  # Why the plan kept the collectives where the permutes were asked for ("" where it did
  # not, or they were not asked for): the report says it.
  kernel_exchange_why: str = ""

  @property
  def rotation_size(self) -> int:
    """The rotation's size, 0 without one."""
    s = self.scheme
    return s.resolved_rotation_size if s.rotation != rotation.NONE else 0


def tile_shape(chunk: int, block: int, bits: int) -> tuple[tuple[int, ...], int]:
  """The tiled form's chunk shape and how many of its last dimensions make a block.

  R blocks of S x W (W = 128 when the block is a multiple of 128); 8-bit codes of
  one-row blocks of 128 lanes eight to a tile [R / 8, 8, 128] (scales [R / 8, 8]); else
  [R, W].  Never a size-1 dimension above the lanes.  By the TPU compiler's estimates
  (v5e:2x2, 32 MiB of bf16, the NaN guard as a select) int8 two-shot with block 128 and
  H_128 costs 6.80x the native all-reduce's on-chip time so, 11.15x as [R, 128] (whose
  scales a TPU lays out along lanes and relayouts); the int4 ring with block 128 6.03x
  as [R, 128], 7.03x (nibbles paired across lanes) and 7.25x (across rows) as
  [R / 8, 8, 128]."""
  w = LANES if block % LANES == 0 else block
  rows = block // w
  if rows > 1:
    return (chunk // block, rows, w), 2
  if w == LANES and (chunk // block) % SUBLANES == 0 and bits == 8:
    return (chunk // block // SUBLANES, SUBLANES, w), 1
  return (chunk // block, w), 1


def tile_grid(
  shapes: Sequence[Sequence[int]], scheme: Scheme, layout: ChunkLayout
) -> tuple[int, int, int] | str:
  """(leading size, tile rows, tile columns) of the operand's (8, 128) tiles, where the
  tiled form may take its blocks in their order; else why it keeps the flat order.

  A TPU stores an array of two dimensions or more in (8, 128) tiles of its last two.
  In flat order a block of 128 values is still one tile row, but the chunks are runs of
  the flat order, so the compiler relayouts the whole operand on the way in and out
  (v5e:2x2, 32 MiB of bf16 as [16384, 1024], the default with SitePlan.tile_order off:
  14.7x native's bytes by its estimates and 128 MiB of temporary memory, against 6.5x
  and none in tile order).  In tile order the same blocks are read where they lie.
  Only where no bit depends on the order: one operand, blocks of one tile row, an
  algorithm whose blocks sum alike in every chunk (the padding is whole zero tiles
  either way)."""
  if not scheme.algo.chunk_order_free:
    return f"{scheme.algorithm} sums each chunk in its own order"
  if len(shapes) != 1:
    return "several operands"
  if layout.block != LANES:
    return f"blocks of {layout.block} values"
  shape = list(shapes[0])
  if len(shape) < 2 or shape[-2] % SUBLANES or shape[-1] % LANES:
    return f"shape {shape} is not whole (8, 128) tiles"
  tile, _ = tile_shape(layout.chunk, layout.block, scheme.fmt.bits)
  if tile[1:] != (SUBLANES, LANES):
    return f"each member's share, {layout.chunk} values, is not whole (8, 128) tiles"
  lead = int(np.prod(shape[:-2], dtype=np.int64))
  return lead, shape[-2] // SUBLANES, shape[-1] // LANES


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
    self.tile, block_dims = tile_shape(c, block, self.fmt.bits)
    # int4 bytes pair the halves of a block's rows where it has an even number of them,
    # else the halves of its lanes.
    pair_rows = block_dims == 2 and self.tile[-2] % 2 == 0
    self.codec = TileCodec(
      em,
      self.fmt,
      block_dims,
      -2 if pair_rows else -1,
      plan.nan_in_combiner,
      plan.block_max_in_stages,
    )
    self._kernels = plan.quantize_kernels
    if self._kernels is not None:
      why = quantize_kernel.why_not(
        self.fmt.name,
        plan.scheme.rounding == "stochastic",
        self.tile,
        block_dims,
        plan.rotation_size,
        plan.matmul_rotation,
      )
      if why:
        self._kernels.notes.append(("quantize", why))
        self._kernels = None
    self.types = [ir.RankedTensorType(v.type) for v in operands]
    self.size = plan.rotation_size
    # 16-bit floats stay 16-bit until a step reads them (exact), and enter the rotation's
    # matmul as they are: their products with +-1 are exact and the sums f32.
    entry = narrow_float(self.types) or em.f32
    self.pieces = pieces
    grid = (
      tile_grid([shape_of(v) for v in operands], plan.scheme, plan.layout)
      if pieces is None and plan.tile_order
      else None
    )
    self.tiles = grid if isinstance(grid, tuple) else None
    # The kernel form reads and writes an operand of whole (8, 128) tiles where it lies,
    # one column of tiles after the other, instead of moving it into tile order.
    self._columns = 0
    if self.tiles is not None and self._kernels is not None:
      lead, rows, cols = self.tiles
      whole = lead * rows * cols * SUBLANES * LANES == plan.layout.padded
      if whole and not self._kernels.why_not(lead * rows * cols, str(entry), cols):
        self._columns = cols
    # Large operands go through the kernels in parts, one after the other (finish_parts).
    self.parts, self._part = 1, 0
    self._written: ir.Value | None = None  # the values the parts so far wrote
    single = len({t.element_type for t in self.types}) == 1 and self.types[0].element_type == entry
    tiles = plan.layout.padded // (SUBLANES * LANES)
    itemsize = ir.FloatType(entry).width // 8
    if self._kernels is not None and pieces is None and single:
      if self._columns or self.tiles is None:
        self.parts = self._kernels.parts_for(tiles, self.n, itemsize, self._columns)
    # The permuted exchange (KernelExchange.PERMUTES) where the plan chose it and the
    # kernels can take the site, in parts of their own where it is large.
    self.permuted = False
    permutes = quantize_kernel.KernelExchange.PERMUTES
    if self._kernels is not None and plan.kernel_exchange is permutes:
      why = "a reduce-scatter or all-gather" if pieces is not None else ""
      why = why or ("several element types" if not single else "")
      if not why:
        parts, why = self._kernels.permuted_parts(
          tiles, self.n, str(entry), itemsize, self._columns
        )
        self.parts = parts or self.parts  # the permuted exchange's own parts
      self.permuted = not why
      kept = why
      if self.permuted:
        self._kernels.notes.append(("exchange", permutes.value))
    else:
      kept = plan.kernel_exchange_why  # the plan's reason, where permutes were asked for
    if self._kernels is not None and kept:
      collectives = quantize_kernel.KernelExchange.COLLECTIVES.value
      self._kernels.notes.append(("exchange", f"{collectives}: {kept}"))
    if self._columns:
      lead, rows, cols = self.tiles  # type: ignore[misc]
      x = em.reshape(em.convert(operands[0], entry), (lead * rows * SUBLANES, cols * LANES))
    elif self.tiles is not None:
      x = em.reshape(self._in_tile_order(operands[0], entry), (self.n, *self.tile))
    elif pieces is None:
      x = em.reshape(em.flat_padded(operands, entry, plan.layout.padded), (self.n, *self.tile))
    else:
      x = em.reshape(self._piece_rows(operands[0], pieces, entry), (pieces.rows, *self.tile))
    self._unrotated = x
    self._forward_matrix: ir.Value | None = None
    if self._kernels is not None:
      pass  # the kernel rotates as it quantizes (quantize_chunks)
    elif self.size and plan.matmul_rotation:
      x = self._rotate(x)
    elif self.size:
      # The model's butterflies, in its order: the same bits as the model.
      shape = shape_of(x)
      flat = em.reshape(em.convert(x, em.f32), (int(np.prod(shape, dtype=np.int64)),))
      x = em.reshape(rotation_emit.hadamard(em, flat, self.size), shape)
    self.chunks = x

  def _in_tile_order(self, operand: ir.Value, entry: ir.Type) -> ir.Value:
    """The operand as its (8, 128) tiles in storage order, [tiles, 8, 128], zero tiles
    appended up to the padded size."""
    em = self.em
    assert self.tiles is not None
    lead, rows, cols = self.tiles
    x = em.reshape(em.convert(operand, entry), (lead, rows, SUBLANES, cols, LANES))
    x = hlo.TransposeOp(x, [0, 1, 3, 2, 4]).result
    count = lead * rows * cols
    x = em.reshape(x, (count, SUBLANES, LANES))
    padded = self.layout.padded // (SUBLANES * LANES)
    if padded > count:
      zero = em.splat(0, (), entry)
      x = hlo.PadOp(x, zero, [0, 0, 0], [padded - count, 0, 0], [0, 0, 0]).result
    return x

  def _from_tile_order(self, values: ir.Value) -> ir.Value:
    """_in_tile_order undone: values of all the tiles (any shape, in order) -> the
    operand's shape and type."""
    em = self.em
    assert self.tiles is not None
    lead, rows, cols = self.tiles
    count = lead * rows * cols
    x = em.reshape(values, (self.layout.padded // (SUBLANES * LANES), SUBLANES, LANES))
    x = em.slice(x, (0, 0, 0), (count, SUBLANES, LANES))
    x = em.reshape(x, (lead, rows, cols, SUBLANES, LANES))
    x = hlo.TransposeOp(x, [0, 1, 3, 2, 4]).result
    result = self.types[0]
    return em.convert(em.reshape(x, result.shape), result.element_type)

  def _rotate(self, x: ir.Value) -> ir.Value:
    """(H / size) x in one matmul: the power-of-two scale is exact in the matrix and in
    the products (the same value as scaling first, unless a sum overflows)."""
    return rotation_emit.matmul(
      self.em, x, self.size, exact=False, forward=True, rhs=self._matrix(x)
    )

  def _matrix(self, x: ir.Value) -> ir.Value:
    """The forward rotation's matrix in x's element type (one constant per site)."""
    if self._forward_matrix is None:
      element_type = ir.RankedTensorType(x.type).element_type
      self._forward_matrix = rotation_emit.matrix(self.em, self.size, True, element_type)
    return self._forward_matrix

  def quantize_chunks(self) -> tuple[ir.Value, ir.Value]:
    """Codes and scales of all the chunks [rows, *tile].

    With the matmul rotation of a 16-bit operand the rotation runs twice, once for the
    block maxima and once for the codes (TileCodec.quantize), its input behind an
    optimization_barrier so that XLA keeps the two: a matmul is next to free on a TPU,
    and its f32 result, twice the operand's bytes, then never goes to memory.  By the
    TPU compiler's estimates (v5e:2x2, 512 MiB of bf16 per chip as [rows, 1024]) the
    default moves 4.52x the native all-reduce's bytes instead of 6.02x and needs 768 MiB
    of temporary memory instead of 1032 MiB.  An f32 operand is read twice at the cost
    of the round trip it saves, and is not (32 MiB: 3.37x against 4.63x)."""
    em = self.em
    if self._kernels is not None:
      matrix = self._matrix(self._unrotated) if self.size else None
      done = self._kernels.quantize(
        em, self._unrotated, matrix, self._columns, self._part, self.parts, self._written
      )
      if done is not None:
        lead = (self.n,) if self._columns or self.parts > 1 else shape_of(self._unrotated)[:1]
        tile = (self.tile[0] // self.parts, *self.tile[1:])
        codes = em.reshape(done[0], (*lead, *tile))
        scales = em.reshape(done[1], (*lead, *tile[:-1]))
        return codes, self.fmt.emit_wire_scales(em, scales)
      # Not expected (the kernels said they could), but the tiled form from here on.
      assert not self._columns and self.parts == 1, "the kernel form declined an operand"
      self._kernels = None
      self.chunks = self._rotate(self._unrotated) if self.size else self._unrotated
    x = em.convert(self.chunks, em.f32)
    narrow = ir.RankedTensorType(self._unrotated.type).element_type != em.f32
    if not (self.size and self.plan.matmul_rotation and narrow):
      return self.codec.quantize(x)
    barrier = hlo.OptimizationBarrierOp([self._unrotated]).results[0]
    return self.codec.quantize(self._rotate(barrier), max_of=x)

  def permuted_rank(self) -> ir.Value:
    """This device's rank in its group, i32 [1]: the permuted kernels' scalar operand."""
    return self.em.reshape(self.coll.group_rank(), (1,))

  def quantize_permuted(self, rank: ir.Value) -> list[ir.Value]:
    """The permuted exchange's start: every chunk quantized and packed, the k-th the one
    to send k ranks on (chunk rank + k)."""
    assert self._kernels is not None and self.permuted
    matrix = self._matrix(self._unrotated) if self.size else None
    return self._kernels.quantize_permuted(
      self.em,
      self._unrotated,
      matrix,
      rank,
      self.n,
      self._columns,
      self._part,
      self.parts,
      self._written,
    )

  def sum_permuted(self, received: list[ir.Value], rank: ir.Value) -> ir.Value:
    """The packed chunks received (the s-th from s ranks back, the 0-th this rank's own)
    summed in group order and packed again."""
    assert self._kernels is not None
    tiles = self.layout.padded // (SUBLANES * LANES)
    return self._kernels.sum_permuted(self.em, received, rank, tiles, self._columns, self.parts)

  def dequantize_permuted(self, gathered: list[ir.Value], rank: ir.Value) -> ir.Value:
    """The packed sums gathered (the k-th from k ranks back) -> all the values, in the
    layout the site took them in (finish_values ends it)."""
    assert self._kernels is not None
    em = self.em
    kinds = {t.element_type for t in self.types}
    element = kinds.pop() if len(kinds) == 1 else em.f32
    tiles = self.layout.padded // (SUBLANES * LANES)
    return self._kernels.dequantize_permuted(
      em,
      gathered,
      rank,
      tiles,
      element,
      self._inverse_rotation(),
      self._columns,
      self._part,
      self.parts,
      self._written,
    )

  def _inverse_rotation(self) -> tuple[ir.Value, ir.Value] | None:
    """The dequantize kernels' (H, the signs as [8, 128]), f32; None without a rotation."""
    if not self.size:
      return None
    em = self.em
    signs = np.broadcast_to(rotation.signs(self.size), (SUBLANES, self.size))
    return (
      rotation_emit.matrix(em, self.size, False, em.f32),
      em.const(np.ascontiguousarray(signs, np.float32), em.f32),
    )

  def sum_quantized(self, codes: ir.Value, scales: ir.Value) -> tuple[ir.Value, ir.Value] | None:
    """The kernel form's sum: the N received pieces' codes [N, *tile] and scales summed in
    f32 and quantized again, in one kernel; None where the site has no kernel."""
    if self._kernels is None:
      return None
    done = self._kernels.sum_quantize(self.em, codes, self.codec.scales(scales))
    if done is None:
      return None
    summed, summed_scales = done
    return summed, self.fmt.emit_wire_scales(self.em, summed_scales)

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
      x = hlo.TransposeOp(x, back_order(len(moved), pieces.dimension)).result
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
    return [self._from_rows(self.dequantize(codes, scales), self.layout.group_size)]

  def exchange(
    self,
    collective: Callable[[ir.Value], ir.Value],
    codes: ir.Value,
    scales: ir.Value,
    rows: int = 1,
  ) -> tuple[ir.Value, ir.Value]:
    """Codes and scales through `collective` (along dimension 0), in `rows` pieces (an
    all-to-all's N, else 1): one collective of int8 payloads [rows, code bytes + scale
    bytes] where the plan packs them, else one collective each.

    XLA:CPU builds each computation's thunk graph with a transitive reduction whose cost
    grows faster than the number of collectives in it: the 128-layer forward program
    (256 sites) compiled in 94.7 s with two collectives per exchange, 20.2 s with one
    (`python tools/bench_compile.py --programs forward --layers 128 --tpu ''`).  The
    bytes are the same, but packing and unpacking are copies: 8 MiB of bf16 per device
    took 18.5 against 14.5 ms in two-shot without rotation, 13.2 against 8.3 ms in the
    int8 ring (`tools/bench_ring_cpu.py --values 4M`), so only sites below
    --equarx_unroll_min_bytes are packed.  A TPU keeps two arrays, each in its own layout
    (tile_shape)."""
    if not self.plan.pack_scales:
      return collective(codes), collective(scales)
    em = self.em
    code_shape, scale_shape = shape_of(codes), shape_of(scales)
    scale_type = ir.RankedTensorType(scales.type).element_type
    # Scales travel as f32 (4 bytes each) or as one i8 byte (mx formats' exponents).
    width = 1 if scale_type == em.i8 else ir.FloatType(scale_type).width // 8
    code_bytes = int(np.prod(code_shape, dtype=np.int64)) // rows
    scale_count = int(np.prod(scale_shape, dtype=np.int64)) // rows
    scale_bytes = (
      scales if scale_type == em.i8 else em.bitcast(scales, (*scale_shape, width), em.i8)
    )
    payload = em.concat(
      [
        em.reshape(codes, (rows, code_bytes)),
        em.reshape(scale_bytes, (rows, scale_count * width)),
      ],
      1,
    )
    out = collective(payload)
    out_rows = shape_of(out)[0]
    codes = em.reshape(
      em.slice(out, (0, 0), (out_rows, code_bytes)),
      (out_rows * code_shape[0] // rows, *code_shape[1:]),
    )
    scale_shape = (out_rows * scale_shape[0] // rows, *scale_shape[1:])
    scale_bytes = em.slice(out, (0, code_bytes), (out_rows, code_bytes + scale_count * width))
    if scale_type == em.i8:
      return codes, em.reshape(scale_bytes, scale_shape)
    scales = em.bitcast(em.reshape(scale_bytes, (*scale_shape, width)), scale_shape, scale_type)
    return codes, scales

  def local(self, index: ir.Value) -> ir.Value:
    """This rank's chunk `index` (a traced i32 scalar), f32 [*tile]."""
    em = self.em
    zero = em.i32_scalar(0)
    shape = shape_of(self.chunks)
    piece = em.dynamic_slice(self.chunks, [index] + [zero] * (len(shape) - 1), (1, *shape[1:]))
    return em.convert(em.reshape(piece, shape[1:]), em.f32)

  def finish(self, codes: ir.Value, scales: ir.Value) -> list[ir.Value]:
    """All N chunks' codes [N R, ...] and scales [N R, ...], in chunk order -> the results."""
    values = self._kernel_values(codes, scales)
    if values is None:
      # Codes in the kernels' column order need the dequantize kernel (which takes
      # whatever the quantize kernel took).
      assert not self._columns, "the kernel form declined to dequantize an operand"
      values = self.dequantize(codes, scales)
    return self._results(values)

  def finish_values(self, values: ir.Value) -> list[ir.Value]:
    """f32 values of all N chunks, in chunk order and rotated back -> the results (an
    algorithm that ends in values, not codes: algorithms/one_shot.py)."""
    return self._results(values)

  def _results(self, values: ir.Value) -> list[ir.Value]:
    """All the values, in the order the site took them -> the results."""
    if self._columns:  # the kernels wrote the operand's own rows
      return [self.em.reshape(values, self.types[0].shape)]
    if self.tiles is not None:
      return [self._from_tile_order(values)]
    return self.em.unflatten_like(values, self.types)

  def finish_permuted(self, emit_part: Callable[[], ir.Value]) -> list[ir.Value]:
    """The permuted exchange over self.parts parts of the operand: emit_part() (the
    algorithm's emit_permuted) writes the current part's values into the values so far."""
    return self._each_part(emit_part)

  def finish_parts(self, emit_part: Callable[[], tuple[ir.Value, ir.Value]]) -> list[ir.Value]:
    """The kernel form over self.parts parts of the operand: for each, emit_part() (the
    algorithm's emit_tiled) gives the part's reduced codes and scales, and the dequantize
    kernel writes the part's values into the values so far (quantize_kernel.dequantize_module)."""
    return self._each_part(lambda: self._kernel_values(*emit_part(), into=self._written))

  def _each_part(self, write_part: Callable[[], ir.Value | None]) -> list[ir.Value]:
    """The parts one after the other, write_part() giving the values written so far;
    the next part's quantize waits for them, so at any time only one part's codes are
    alive."""
    assert self._kernels is not None
    if self.parts > 1:
      self._kernels.notes.append(("parts", str(self.parts)))
    for part in range(self.parts):
      self._part = part
      self._written = write_part()
    assert self._written is not None, "the kernel form declined a part"
    return self._results(self._written)

  def _kernel_values(
    self, codes: ir.Value, scales: ir.Value, into: ir.Value | None = None
  ) -> ir.Value | None:
    """The kernel form's finish: _dequantize in one kernel, its values already in the
    results' element type (f32 where they differ); with parts, the current part's values
    written into `into`.  None where the site has no kernel."""
    if self._kernels is None:
      return None
    em = self.em
    kinds = {t.element_type for t in self.types}
    element = kinds.pop() if len(kinds) == 1 else em.f32
    inverse = self._inverse_rotation()
    scales = self.codec.scales(scales)
    return self._kernels.dequantize(
      em, codes, scales, element, inverse, self._columns, into, self._part, self.parts
    )

  def dequantize(self, codes: ir.Value, scales: ir.Value) -> ir.Value:
    """Codes and scales -> f32 values, rotated back where the scheme rotates."""
    em = self.em
    if self.size:
      values = rotation_emit.matmul(
        em, self.codec.values(codes), self.size, exact=True, forward=False
      )
      # The signs after H, as the model flips them: a zero sum at a flipped position is
      # -0 there (folded into the matrix it would come out +0).
      shape = shape_of(values)
      if self.tiles is None:
        values = em.reshape(values, (int(np.prod(shape, dtype=np.int64)),))
      values = em.reshape(
        rotation_emit.times_per_position(em, values, rotation.signs(self.size)), shape
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
  return hlo.SelectOp(is_zero, zero, x).result  # type: ignore[no-any-return]


def add(term: ir.Value, acc: ir.Value) -> ir.Value:
  """term + acc, the new term first: XLA:CPU contracts a multiply feeding an add into an
  FMA, and where both operands of an add are products LLVM fuses the first one's.  So
  the sum is fma(q, s, acc), as quantize.fused_multiply_add has it."""
  return hlo.AddOp(term, acc).result  # type: ignore[no-any-return]


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


class _GroupSum(NamedTuple):
  acc: ir.Value  # f32: the sum so far
  codes: ir.Value  # [N, ...]: row j from rank j
  scales: ir.Value


def sum_in_group_order(
  em: Emitter,
  codes: ir.Value,
  scales: ir.Value,
  n: int,
  dequantize: Callable[[ir.Value, ir.Value], ir.Value],
  loop_from: int,
) -> ir.Value:
  """Row j of `codes` and `scales` (rank j's) dequantized and summed in f32 in group order:
  written out, or a loop from `loop_from` members on (the same ops, in the same order).
  The caller passes its module's LOOP_FROM_MEMBERS, which tests lower."""
  acc = plus_zero(em, dequantize(row(em, codes, 0), row(em, scales, 0)))
  if n < loop_from:
    for j in range(1, n):
      acc = add(dequantize(row(em, codes, j), row(em, scales, j)), acc)
    return acc

  def sum_step(step: ir.Value, carry: _GroupSum) -> _GroupSum:
    j = em.add_i32(step, 1)
    term = dequantize(dynamic_row(em, carry.codes, j), dynamic_row(em, carry.scales, j))
    return carry._replace(acc=add(term, carry.acc))

  summed: ir.Value = while_loop(_GroupSum(acc, codes, scales), n - 1, sum_step).acc
  return summed


# From this many group members on, the steps that repeat once per member (the two-shot's
# sum, the ring's reduce-scatter) are a loop, not written out: the emitted program, and
# the compile, then stay the same size whatever the group (at 256 chips, written out,
# one site compiled for a TPU in 34 s).
LOOP_FROM_MEMBERS = 16
