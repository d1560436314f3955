"""The block codec of quantize.py, emitted: StableHLO ops in the model's order.

Two shapes of the same codec, one per emitted form:
  FlatCodec   rows of a flat chunk matrix; the codes and the scale bytes packed into
              one int8 payload per row, so a lane moves with a single collective
              (the flat forms, algorithms/*.py `emit_flat`);
  TileCodec   tiles [..., R, S, W] with one scale per block of the last dimensions;
              codes and scales as two arrays (the tiled forms, `emit_tiled`).
Both quantize through `quantize_blocks`, and what differs between formats (scales from
the absmax, values to codes and back, the scales' bytes) is the format object's.
int4 codes travel two per byte; `pack_int4` and `unpack_int4` are quantize.pack_int4's.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass.emission import quantize as qz
from equarx_pass.emission import rotation, rotation_emit
from equarx_pass.emission.formats import Format
from equarx_pass.ir.hlo_builder import Emitter, reduce, shape_of


def encode_scaled(em: Emitter, fmt: Format, x: ir.Value, recip: ir.Value) -> ir.Value:
  """Qp2: f32 [m, ...] times its block's reciprocal scale (recip [m, ...] over x's
  leading dimensions), clamped and encoded: int8 codes of x's shape."""
  lead = len(shape_of(recip))
  scaled = hlo.MulOp(x, em.bcast(recip, shape_of(x), list(range(lead)))).result
  clamped = hlo.ClampOp(
    em.splat(-fmt.qmax, (), em.f32), scaled, em.splat(fmt.qmax, (), em.f32)
  ).result
  return fmt.emit_encode(em, clamped)


def nan_propagating_max(a: ir.Value, b: ir.Value) -> hlo.SelectOp:
  """max(a, b), NaN if either is NaN, whatever the backend's max does with NaN (an op, as
  hlo_builder.reduce's combiners are)."""
  a_nan = hlo.CompareOp(a, a, hlo.ComparisonDirectionAttr.get("NE")).result
  b_nan = hlo.CompareOp(b, b, hlo.ComparisonDirectionAttr.get("NE")).result
  return hlo.SelectOp(a_nan, a, hlo.SelectOp(b_nan, b, hlo.MaxOp(a, b).result).result)


def block_max(
  em: Emitter,
  x: ir.Value,
  axes: tuple[int, ...],
  nan_in_combiner: bool,
  in_stages: bool = False,
) -> ir.Value:
  """max |x| over `axes` of an f32 x; a block holding NaN gets a non-finite maximum.

  Two forms of the same guard.  XLA:CPU's fast max-reduction drops NaN, so there every
  NaN is first made +inf (the model's inf scale).  On TPU that per-value select is a
  mask the compiler writes to memory, which keeps the reduction out of the fusion that
  produces x (v5e:2x2, 32 MiB of bf16, the default: 6.80x against 5.74x native by its
  estimates); a combiner that propagates NaN gives a NaN scale instead, and the block
  still comes back non-finite.

  `in_stages`, for blocks of rows and lanes (two axes, the last ones): the rows first,
  then the lanes.  libtpu's code for one reduction of (8, 128) blocks into a vector of
  scales grows with the number of blocks, and its compile time with it (the ring's first
  quantization on v5e at 32 MiB of bf16 a chip: 9.3 times the low-level code of 1 MiB);
  the two reductions' code is a fraction of it.  The maximum is exact in any order: the
  same bits.  The lanes' combiner takes its operands swapped, so that XLA, which folds a
  reduction of a reduction with the same combiner into one, keeps the two."""
  magnitude: ir.Value
  combine: Any
  if nan_in_combiner:
    magnitude, combine = hlo.AbsOp(x).result, nan_propagating_max
  else:
    magnitude, combine = em.magnitude(x), hlo.MaxOp
  zero = em.splat(0, (), em.f32)
  if not in_stages or len(axes) == 1:
    return reduce(magnitude, zero, em.f32, axes, combine)
  rows, lanes = axes
  if lanes != rows + 1 or lanes != len(shape_of(x)) - 1:
    raise ValueError(f"a block maximum in stages needs blocks of rows and lanes, got {axes}")
  row_max = reduce(magnitude, zero, em.f32, (rows,), combine)
  return reduce(row_max, zero, em.f32, (rows,), lambda a, b: combine(b, a))


def quantize_blocks(
  em: Emitter,
  fmt: Format,
  x: ir.Value,
  block_dims: int,
  max_of: ir.Value | None = None,
  nan_in_combiner: bool = False,
  max_in_stages: bool = False,
) -> tuple[ir.Value, ir.Value]:
  """Qp1 + Qp2 over blocks made of x's last `block_dims` dimensions: (int8 codes of x's
  shape, f32 scales of x's leading shape).  `max_of`: the same values as x computed a
  second time, whose block maxima are taken (TileCodec.quantize says why);
  `max_in_stages`: block_max's `in_stages`."""
  source = x if max_of is None else max_of
  shape = shape_of(source)
  axes = tuple(range(len(shape) - block_dims, len(shape)))
  amax = block_max(em, source, axes, nan_in_combiner, max_in_stages)
  scale, recip = fmt.emit_scales(em, amax)
  return encode_scaled(em, fmt, x, recip), scale


# --- int4: two codes per byte (quantize.pack_int4) ------------------------------


def nibbles(em: Emitter, b: ir.Value) -> list[ir.Value]:
  """int8 bytes -> [low nibbles, high nibbles], each sign-extended: (b << 4) >>a 4, b >>a 4."""
  four = em.splat(4, shape_of(b), em.i8)
  return [
    hlo.ShiftRightArithmeticOp(hlo.ShiftLeftOp(b, four).result, four).result,
    hlo.ShiftRightArithmeticOp(b, four).result,
  ]


def or_nibbles(em: Emitter, low: ir.Value, high: ir.Value) -> ir.Value:
  """Two int8 code tensors in [-8, 7] -> one: low & 0xF | high << 4."""
  shape = shape_of(low)
  return hlo.OrOp(  # type: ignore[no-any-return]
    hlo.AndOp(low, em.splat(0xF, shape, em.i8)).result,
    hlo.ShiftLeftOp(high, em.splat(4, shape, em.i8)).result,
  ).result


def pack_int4(em: Emitter, q: ir.Value, group: int) -> ir.Value:
  """int8 [rows, s] in [-8, 7] -> [rows, s/2]: quantize.pack_int4 (value j of each
  group of `group` in the low nibble, value j + group/2 in the high one)."""
  rows, s = shape_of(q)
  groups, half = rows * s // group, group // 2
  q = em.reshape(q, (groups, group))
  packed = or_nibbles(
    em, em.slice(q, (0, 0), (groups, half)), em.slice(q, (0, half), (groups, group))
  )
  return em.reshape(packed, (rows, s // 2))


def unpack_int4(em: Emitter, packed: ir.Value, group: int, by_broadcast: bool) -> ir.Value:
  """int8 [rows, s/2] -> int8 [rows, s], each nibble sign-extended: low = (b << 4) >>a 4,
  high = b >>a 4, the two halves of each group side by side.

  Two equal forms; which one XLA:CPU runs faster depends on where the unpack ends up
  (BUILD_NOTES.md, int4 nibbles):
  - concatenated halves where the values feed a sum that is quantized again, which
    XLA recomputes in two fusions (block magnitudes, then codes): two-shot's and the
    calibrated scheme's sums, and a ring step over rows of an odd number of blocks.
    The usual ring step unpacks its two halves apart and concatenates nothing
    (FlatCodec.accumulate);
  - by_broadcast, every byte broadcast to [2, group/2] and shifted by 4 or 0, where
    one fusion writes the result: no concatenate's per-element select there.
  """
  rows, half_row = shape_of(packed)
  groups, half = rows * half_row * 2 // group, group // 2
  b = em.reshape(packed, (groups, half))
  if by_broadcast:
    shape = (groups, 2, half)
    shift = em.bcast(em.const(np.array([4, 0], np.int8), em.i8), shape, [1])
    up = hlo.ShiftLeftOp(em.bcast(b, shape, [0, 2]), shift).result
    both: ir.Value = hlo.ShiftRightArithmeticOp(up, em.splat(4, shape, em.i8)).result
  else:
    both = em.concat(nibbles(em, b), 1)
  return em.reshape(both, (rows, 2 * half_row))


# --- the flat form: one int8 payload per row --------------------------------------


class FlatCodec:
  """quantize.py on rows f32 [rows, s] of whole blocks of `block` values: payloads int8
  [rows, code bytes + scale bytes], the codes first.

  A row's parts: f32 [rows, s] is quantized as `count` parts [rows, s / count] of whole
  blocks, each with its own scales.  int4 rows of an even number of blocks have two,
  the row's halves, whose codes share bytes (quantize.nibble_group); else one, the row.
  """

  def __init__(self, em: Emitter, fmt: Format, block: int):
    self.em, self.fmt, self.block = em, fmt, block

  def part_count(self, s: int) -> int:
    """2 for int4 rows of an even number of blocks, else 1."""
    return 2 if self.fmt.bits == 4 and qz.pairs_row_halves(self.block, s) else 1

  def block_parts(self, x: ir.Value) -> list[ir.Value]:
    """f32 [rows, s] -> its parts, sliced."""
    rows, s = shape_of(x)
    count = self.part_count(s)
    w = s // count
    if count == 1:
      return [x]
    return [self.em.slice(x, (0, i * w), (rows, (i + 1) * w)) for i in range(count)]

  def dynamic_parts(self, chunks: ir.Value, row: ir.Value, col: int, width: int) -> list[ir.Value]:
    """block_parts of chunks[row:row+1, col:col+width] (chunks [N, C], `row` a traced i32
    scalar), each part a dynamic-slice of its own."""
    count = self.part_count(width)
    w = width // count
    return [self.em.dynamic_rows(chunks, row, col + i * w, 1, w) for i in range(count)]

  def quantize_rows(self, x: ir.Value) -> ir.Value:
    """f32 [rows, s] -> int8 payload [rows, P]."""
    return self.quantize_parts(self.block_parts(x))

  def quantize_parts(self, parts: list[ir.Value]) -> ir.Value:
    """block_parts (f32) -> int8 payload [rows, code bytes + scale bytes]."""
    em, fmt, block = self.em, self.fmt, self.block
    rows, s = shape_of(parts[0])[0], sum(shape_of(part)[1] for part in parts)
    codes, scales = [], []
    for part in parts:
      m = rows * shape_of(part)[1] // block
      part_codes, scale = quantize_blocks(em, fmt, em.reshape(part, (m, block)), 1)
      codes.append(part_codes)
      scales.append(scale)

    def scale_bytes() -> list[ir.Value]:
      return [
        em.reshape(
          fmt.emit_scale_bytes(em, scale),
          (rows, shape_of(scale)[0] // rows * fmt.scale_bytes),
        )
        for scale in scales
      ]

    if len(codes) == 1:
      packed = em.reshape(codes[0], (rows, s))
      if fmt.bits == 4:
        packed = pack_int4(em, packed, qz.nibble_group(block, s))
      return em.concat([packed] + scale_bytes(), 1)
    # Two int4 halves: the payload's bytes are put together as rows of w (a divisor of
    # every piece and of the block), so the fusion that writes the codes loops over
    # [bytes / w, w].  Both halves' scales are then constant along the inner loop and
    # XLA:CPU vectorizes it; over the flat [1, P] it made a scalar loop (9.7 vs 2.9 ms
    # for a step of 4M values).  The int8 step is vectorized in the flat form already and
    # was no faster in rows (the differences measured were within noise), so it keeps
    # the flat form.  The bytes are the same.
    pieces = [or_nibbles(em, *[em.reshape(c, (rows, s // 2)) for c in codes])] + scale_bytes()
    w = math.gcd(block, *[shape_of(piece)[1] for piece in pieces])
    payload = em.concat(
      [em.reshape(piece, (rows, shape_of(piece)[1] // w, w)) for piece in pieces], 1
    )
    return em.reshape(payload, (rows, sum(shape_of(piece)[1] for piece in pieces)))

  def dequantize_rows(
    self, payload: ir.Value, s: int, rotation_size: int = 0, requantized: bool = False
  ) -> ir.Value:
    """int8 payload [rows, P] -> f32 [rows, s]; with a rotation size, also the
    inverse rotation, as rotation.dequantize_rotated does it (on the codes).
    requantized: the values feed a sum that is quantized again (unpack_int4's form)."""
    em, fmt, block = self.em, self.fmt, self.block
    rows = shape_of(payload)[0]
    nb = s // block
    codes, scale = self._payload_fields(payload, s)
    if fmt.bits == 4:
      codes = unpack_int4(em, codes, qz.nibble_group(block, s), by_broadcast=not requantized)
    values = fmt.emit_decode(em, codes)
    if rotation_size:
      values = rotation_emit.butterflies(em, em.reshape(values, (rows * s,)), rotation_size)
      values = rotation_emit.times_per_position(em, values, rotation.signs(rotation_size))
    out = hlo.MulOp(
      em.reshape(values, (rows * nb, block)), em.bcast(scale, (rows * nb, block), [0])
    ).result
    return em.reshape(out, (rows, s))

  def _payload_fields(self, payload: ir.Value, s: int) -> tuple[ir.Value, ir.Value]:
    """int8 payload [rows, P] of rows of s values -> (code bytes [rows, B], f32 scales
    [rows * nb])."""
    em, fmt = self.em, self.fmt
    rows, p = shape_of(payload)
    nb = s // self.block
    code_bytes = fmt.code_bytes(s)
    codes = em.slice(payload, (0, 0), (rows, code_bytes))
    data = em.reshape(em.slice(payload, (0, code_bytes), (rows, p)), (rows * nb, fmt.scale_bytes))
    return codes, fmt.emit_scales_from_bytes(em, data)

  def accumulate(self, payload: ir.Value, local: list[ir.Value]) -> list[ir.Value]:
    """A ring step's sum, Dq(payload) + local, as block_parts (XLA:CPU fuses each part's
    sum into one FMA).  The int4 halves are unpacked apart: no concatenate."""
    em, fmt, block = self.em, self.fmt, self.block
    rows, s = shape_of(local[0])[0], sum(shape_of(part)[1] for part in local)
    if len(local) == 1:
      return [hlo.AddOp(self.dequantize_rows(payload, s, requantized=True), local[0]).result]
    codes, scale = self._payload_fields(payload, s)
    nb, w = s // block, s // 2
    m = rows * nb // 2  # blocks per half
    scale = em.reshape(scale, (rows, nb))
    out: list[ir.Value] = []
    for i, (half, part) in enumerate(zip(nibbles(em, codes), local)):
      part_scale = em.reshape(em.slice(scale, (0, i * nb // 2), (rows, (i + 1) * nb // 2)), (m,))
      values = hlo.MulOp(
        em.reshape(fmt.emit_decode(em, half), (m, block)),
        em.bcast(part_scale, (m, block), [0]),
      ).result
      out.append(hlo.AddOp(em.reshape(values, (rows, w)), part).result)
    return out


# --- the tiled form: codes and scales as two arrays ------------------------------


class TileCodec:
  """quantize.py's block codec on tiles [..., R, S, W] (or [..., R, W]): one scale per block
  of the last `block_dims` dimensions.

  int4 codes travel two per byte: the first and second half of the tiles along
  `pack_axis` (-2: rows, -1: lanes) share the bytes.  Which values share a byte changes
  nothing but the bytes: the dequantized values are the model's.
  """

  def __init__(
    self,
    em: Emitter,
    fmt: Format,
    block_dims: int,
    pack_axis: int,
    nan_in_combiner: bool = False,
    max_in_stages: bool = False,
  ):
    self.em, self.fmt, self.block_dims = em, fmt, block_dims
    self.packs = fmt.bits == 4
    self.pack_axis = pack_axis
    self.nan_in_combiner = nan_in_combiner  # block_max's form
    # A block of rows and lanes takes its maximum over the rows, then the lanes
    # (block_max's `in_stages`), in every algorithm that quantizes such blocks.
    self.max_in_stages = max_in_stages

  def quantize(self, x: ir.Value, max_of: ir.Value | None = None) -> tuple[ir.Value, ir.Value]:
    """f32 [..., R, S, W] -> codes (int8 bytes) and the scales as they travel [..., R].

    `max_of`: the same values computed a second time, whose block maxima set the scales.
    A block's codes need its maximum first, so the values are read twice; where both
    reads are of one computed x, a TPU writes x to memory and reads it back; each read of
    its own computation is fused with it instead (TiledSite.quantize_chunks)."""
    codes, scale = quantize_blocks(
      self.em, self.fmt, x, self.block_dims, max_of, self.nan_in_combiner, self.max_in_stages
    )
    codes = self._pack(codes) if self.packs else codes
    return codes, self.fmt.emit_wire_scales(self.em, scale)

  def scales(self, wire: ir.Value) -> ir.Value:
    """The scales as they travel -> f32."""
    return self.fmt.emit_scales_from_wire(self.em, wire)

  def values(self, codes: ir.Value) -> ir.Value:
    """The codes' values, f32 [..., R, S, W]."""
    if self.packs:
      codes = self._unpack(codes)
    return self.fmt.emit_decode(self.em, codes)

  def dequantize(self, codes: ir.Value, wire: ir.Value) -> ir.Value:
    """codes times their block's scale: f32 [..., R, S, W]."""
    values = self.values(codes)
    scales = self.scales(wire)
    lead = len(shape_of(scales))
    return hlo.MulOp(values, self.em.bcast(scales, shape_of(values), list(range(lead)))).result  # type: ignore[no-any-return]

  def _pack(self, codes: ir.Value) -> ir.Value:
    """int4 codes in [-7, 7]: the first half along the pack axis in the low nibbles, the
    second in the high ones."""
    shape = shape_of(codes)
    axis = len(shape) + self.pack_axis
    half = shape[axis] // 2
    low_end = list(shape)
    low_end[axis] = half
    high_start = [0] * len(shape)
    high_start[axis] = half
    low = self.em.slice(codes, [0] * len(shape), low_end)
    high = self.em.slice(codes, high_start, shape)
    return or_nibbles(self.em, low, high)

  def _unpack(self, packed: ir.Value) -> ir.Value:
    """Each nibble sign-extended, the halves back in place."""
    axis = len(shape_of(packed)) + self.pack_axis
    return self.em.concat(nibbles(self.em, packed), axis)
