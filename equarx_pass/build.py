"""build: turn a plan (scheme.py, ring.py) into StableHLO ops.

The schedule (source-target pairs, chunk indices, layout, lanes) is computed in
plain NumPy by scheme.py and ring.py; this module only emits ops for it, with
the dialect's Python op builders, at the insertion point of the all-reduce it
replaces.  Every op follows the NumPy model (quantize.py, rotation.py, ring.py,
two_shot.py) in kind and order, so the program equals the model bit for bit.

Emitted shape of one ring site (N ranks, chunk C, lanes l of s values, P_l payload bytes):

  x:[N,C] f32 = rotate(pad(concat(convert_f32(reshape(operand_i)))))
  rank        = dynamic_slice(rank_table, partition_id or replica_id)
  while s < N-1 (reduce-scatter), per lane:
                partial_l = dq(permute_l(q(partial_l))) + x[(rank-s-1) mod N, lane l]
  own_l:[1,P_l] i8 = q(partial_l)     the one final quantization
  out_l:[N,P_l] i8 = broadcast(own_l)  its own row in place; the loop fills the others
  while s < N-1 (all-gather), per lane:
                cur_l = permute_l(cur_l); out_l[(rank-s) mod N] = cur_l
  result_i    = convert_T(reshape(slice(rotate(concat_l(dq(out_l))))))

Two loops per site, whatever the group size, keep the module small: the paper's
"full-loop" ring.  Lanes are the microshards (independent permutes inside one
step, so XLA can overlap one's transfer with another's arithmetic) and, for the
bidirectional ring, the counter-clockwise half.  q() packs the codes and the f32
scales (as bytes) into one int8 payload so a lane moves with a single permute.
For int4 rows of an even number of blocks, partial_l is carried as its two halves,
whose codes share the bytes (Emitter.block_parts).
Two-shot replaces both loops by all_to_all -> f32 sum loop -> all_gather.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass import quantize as qz
from equarx_pass import outlier, ring, rotation
from equarx_pass import scheme as scheme_lib

# stablehlo ChannelHandle type 1 = DEVICE_TO_DEVICE, what JAX gives ppermute.
DEVICE_TO_DEVICE = 1


class ChannelAllocator:
  """Hands out channel handles above every handle already in the module."""

  def __init__(self, highest_in_use: int):
    self._next = highest_in_use + 1

  def new(self) -> int:
    handle, self._next = self._next, self._next + 1
    return handle


@dataclasses.dataclass(frozen=True)
class RingPlan:
  layout: ring.ChunkLayout
  schedule: ring.RingSchedule
  device_kind: str  # "partition" (collectives carry a channel) or "replica"
  num_devices: int
  scheme: scheme_lib.Scheme = scheme_lib.Scheme()
  unrolled: bool = False  # ring schemes: reduce-scatter steps written out, not looped
  # The tiled form's forward rotation as a matmul (TPU, GPU) rather than the model's
  # butterflies (CPU: the same bits as the model, at the same speed there).
  matmul_rotation: bool = True


def tensor(shape, element_type) -> ir.RankedTensorType:
  return ir.RankedTensorType.get(list(shape), element_type)


def shape_of(x) -> tuple[int, ...]:
  """The static shape of a ranked tensor value."""
  return tuple(ir.RankedTensorType(x.type).shape)


class Emitter:
  """Small typed helpers over the op builders; every value is a ranked tensor."""

  def __init__(self):
    self.f32 = ir.F32Type.get()
    self.i8 = ir.IntegerType.get_signless(8)
    self.i16 = ir.IntegerType.get_signless(16)
    self.i32 = ir.IntegerType.get_signless(32)
    self.i64 = ir.IntegerType.get_signless(64)

  # constants
  def const(self, array: np.ndarray, element_type) -> ir.Value:
    array = np.ascontiguousarray(array)
    attr = ir.DenseElementsAttr.get(array, type=tensor(array.shape, element_type))
    return hlo.ConstantOp(attr).result

  def splat(self, value, shape, element_type) -> ir.Value:
    t = tensor(shape, element_type)
    scalar = (
      ir.FloatAttr.get(element_type, float(value))
      if isinstance(element_type, ir.FloatType)
      else ir.IntegerAttr.get(element_type, int(value))
    )
    return hlo.ConstantOp(ir.DenseElementsAttr.get_splat(t, scalar)).result

  def i32_scalar(self, value: int) -> ir.Value:
    return self.splat(value, (), self.i32)

  def groups_attr(self, groups) -> ir.Attribute:
    array = np.array(groups, np.int64)
    return ir.DenseIntElementsAttr.get(array, type=tensor(array.shape, self.i64))

  # shape ops
  def reshape(self, x, shape) -> ir.Value:
    if shape_of(x) == tuple(shape):
      return x
    return hlo.ReshapeOp(tensor(shape, ir.RankedTensorType(x.type).element_type), x).result

  def convert(self, x, element_type) -> ir.Value:
    if ir.RankedTensorType(x.type).element_type == element_type:
      return x
    return hlo.ConvertOp(tensor(shape_of(x), element_type), x).result

  def widen(self, x, narrow) -> ir.Value:
    """f32 of x; x holds the bits of `narrow` (a 16-bit float type) as i16, or is f32."""
    if narrow is None:
      return x
    return self.convert(self.bitcast(x, shape_of(x), narrow), self.f32)

  def bitcast(self, x, shape, element_type) -> ir.Value:
    return hlo.BitcastConvertOp(tensor(shape, element_type), x).result

  def flat_padded(self, operands, element_type, padded: int) -> ir.Value:
    """The operands converted to `element_type` and flattened, one after another, then
    zero-padded to `padded` values: what every algorithm lays out as chunks."""
    sizes = [int(np.prod(shape_of(v), dtype=np.int64)) for v in operands]
    x = self.concat(
      [self.reshape(self.convert(v, element_type), (size,)) for v, size in zip(operands, sizes)], 0
    )
    if padded > sum(sizes):
      x = hlo.PadOp(x, self.splat(0, (), element_type), [0], [padded - sum(sizes)], [0]).result
    return x

  def unflatten_like(self, values, types) -> list[ir.Value]:
    """flat_padded undone: `values` (any shape, flat in order) cut into one value per
    type of `types`, in its shape and element type."""
    flat = self.reshape(values, (int(np.prod(shape_of(values), dtype=np.int64)),))
    results, offset = [], 0
    for t in types:
      size = int(np.prod(t.shape, dtype=np.int64))
      piece = self.slice(flat, (offset,), (offset + size,))
      results.append(self.convert(self.reshape(piece, t.shape), t.element_type))
      offset += size
    return results

  def slice(self, x, start, limit) -> ir.Value:
    return hlo.SliceOp(x, list(start), list(limit), [1] * len(start)).result

  def concat(self, values, axis) -> ir.Value:
    return values[0] if len(values) == 1 else hlo.ConcatenateOp(values, axis).result

  def dynamic_slice(self, x, starts, sizes) -> ir.Value:
    """x[starts[0]:starts[0]+sizes[0], ...], `starts` traced i32 scalars."""
    element_type = ir.RankedTensorType(x.type).element_type
    return hlo.DynamicSliceOp(
      x, list(starts), list(sizes), results=[tensor(tuple(sizes), element_type)]
    ).result

  def dynamic_rows(self, x, row, col, rows, width) -> ir.Value:
    """x[row:row+rows, col:col+width] of a 2-D x, `row` a traced i32 scalar."""
    return self.dynamic_slice(x, [row, self.i32_scalar(col)], [rows, width])

  def set_rows(self, x, row, value) -> ir.Value:
    return hlo.DynamicUpdateSliceOp(x, value, [row, self.i32_scalar(0)]).result

  def mod(self, x, n: int) -> ir.Value:
    """(x + n) mod n for x >= -n, on i32 scalars (rem alone keeps the sign)."""
    return hlo.RemOp(hlo.AddOp(x, self.i32_scalar(n)).result, self.i32_scalar(n)).result

  def add_i32(self, x, k: int) -> ir.Value:
    return hlo.AddOp(x, self.i32_scalar(k)).result

  def bcast(self, x, shape, dims) -> ir.Value:
    t = ir.RankedTensorType(x.type)
    return hlo.BroadcastInDimOp(tensor(shape, t.element_type), x, list(dims)).result

  # quantization: the ops of quantize.py, in its order
  def magnitude(self, x) -> ir.Value:
    """|x| of an f32 tensor, with NaN counted as +inf (quantize.py): a max kernel
    may drop NaN, never an inf."""
    is_nan = hlo.CompareOp(x, x, hlo.ComparisonDirectionAttr.get("NE")).result
    return hlo.SelectOp(
      is_nan, self.splat(np.inf, shape_of(x), self.f32), hlo.AbsOp(x).result
    ).result

  def quantize_rows(self, x, block: int, fmt: qz.Format) -> ir.Value:
    """f32 [rows, s] -> int8 payload [rows, code bytes + 4 * blocks]: codes, then scale bytes."""
    return self.quantize_parts(self.block_parts(x, block, fmt), block, fmt)

  # A row's parts: f32 [rows, s] is quantized as `count` parts [rows, s / count] of whole
  # blocks, each with its own scales.  int4 rows of an even number of blocks have two,
  # the row's halves, whose codes share bytes (quantize.nibble_group); else one, x itself.
  def block_parts(self, x, block: int, fmt: qz.Format) -> list[ir.Value]:
    """f32 [rows, s] -> its parts, sliced."""
    rows, s = shape_of(x)
    count = _part_count(s, block, fmt)
    w = s // count
    return (
      [x] if count == 1 else [self.slice(x, (0, i * w), (rows, (i + 1) * w)) for i in range(count)]
    )

  def dynamic_parts(
    self, chunks, row, col: int, width: int, block: int, fmt: qz.Format
  ) -> list[ir.Value]:
    """block_parts of chunks[row:row+1, col:col+width] (chunks [N, C], `row` a traced i32
    scalar), each part a dynamic-slice of its own."""
    count = _part_count(width, block, fmt)
    w = width // count
    return [self.dynamic_rows(chunks, row, col + i * w, 1, w) for i in range(count)]

  def quantize_parts(self, parts: list[ir.Value], block: int, fmt: qz.Format) -> ir.Value:
    """block_parts (f32) -> int8 payload [rows, code bytes + 4 * blocks]."""
    rows, s = shape_of(parts[0])[0], sum(shape_of(part)[1] for part in parts)
    codes, scales = [], []
    for part in parts:
      m = rows * shape_of(part)[1] // block
      blocks = self.reshape(part, (m, block))
      # Qp1: block metadata.
      amax = reduce(self.magnitude(blocks), self.splat(0, (), self.f32), self.f32, 1, hlo.MaxOp)
      scale = hlo.MulOp(amax, self.splat(qz.inverse(fmt.qmax), (m,), self.f32)).result
      positive = hlo.CompareOp(
        scale, self.splat(0, (m,), self.f32), hlo.ComparisonDirectionAttr.get("GT")
      ).result
      safe = hlo.SelectOp(positive, scale, self.splat(1, (m,), self.f32)).result
      reciprocal = hlo.MinOp(
        hlo.DivOp(self.splat(1, (m,), self.f32), safe).result,
        self.splat(qz.FLT_MAX, (m,), self.f32),
      ).result
      # Qp2: scale, clamp, cast.
      codes.append(self.codes(blocks, reciprocal, fmt))
      scales.append(scale)

    def scale_bytes():
      return [
        self.reshape(
          self.bitcast(scale, (shape_of(scale)[0], 4), self.i8),
          (rows, shape_of(scale)[0] // rows * 4),
        )
        for scale in scales
      ]

    if len(codes) == 1:
      packed = self.reshape(codes[0], (rows, s))
      if fmt.bits == 4:
        packed = self.pack_int4(packed, qz.nibble_group(block, s))
      return self.concat([packed] + scale_bytes(), 1)
    # Two int4 halves: the payload's bytes are put together as rows of w (a divisor of
    # every piece and of the block), so the fusion that writes the codes loops over
    # [bytes / w, w].  Both halves' scales are then constant along the inner loop and
    # XLA:CPU vectorizes it; over the flat [1, P] it made a scalar loop (9.7 vs 2.9 ms
    # for a step of 4M values).  The int8 step is vectorized in the flat form already and
    # was no faster in rows (the differences measured were within noise), so it keeps
    # the flat form.  The bytes are the same.
    pieces = [self.or_nibbles(*[self.reshape(c, (rows, s // 2)) for c in codes])] + scale_bytes()
    w = math.gcd(block, *[shape_of(piece)[1] for piece in pieces])
    payload = self.concat(
      [self.reshape(piece, (rows, shape_of(piece)[1] // w, w)) for piece in pieces], 1
    )
    return self.reshape(payload, (rows, sum(shape_of(piece)[1] for piece in pieces)))

  def codes(self, x, reciprocal, fmt: qz.Format) -> ir.Value:
    """f32 [m, ...] times its block's reciprocal scale (reciprocal [m, ...] over x's
    leading dimensions), clamped and cast: int8 codes of x's shape."""
    lead = len(shape_of(reciprocal))
    scaled = hlo.MulOp(x, self.bcast(reciprocal, shape_of(x), list(range(lead)))).result
    clamped = hlo.ClampOp(
      self.splat(-fmt.qmax, (), self.f32), scaled, self.splat(fmt.qmax, (), self.f32)
    ).result
    if fmt.fp8:
      return self.bitcast(self.convert(clamped, fp8_type(fmt)), shape_of(x), self.i8)
    return self.convert(hlo.RoundNearestEvenOp(clamped).result, self.i8)

  def dequantize_rows(
    self,
    payload,
    s: int,
    block: int,
    fmt: qz.Format,
    rotation_size: int = 0,
    requantized: bool = False,
  ) -> ir.Value:
    """int8 payload [rows, P] -> f32 [rows, s]; with a rotation size, also the
    inverse rotation, as rotation.dequantize_rotated does it (on the codes).
    requantized: the values feed a sum that is quantized again (unpack_int4's form)."""
    rows = shape_of(payload)[0]
    nb = s // block
    codes, scale = self._payload_fields(payload, s, block, fmt)
    if fmt.fp8:
      values = self.convert(self.bitcast(codes, (rows, s), fp8_type(fmt)), self.f32)
    elif fmt.bits == 4:
      values = self.convert(
        self.unpack_int4(codes, qz.nibble_group(block, s), by_broadcast=not requantized), self.f32
      )
    else:
      values = self.convert(codes, self.f32)
    if rotation_size:
      values = self.butterflies(self.reshape(values, (rows * s,)), rotation_size)
      values = self.times_per_position(values, rotation.signs(rotation_size))
    out = hlo.MulOp(
      self.reshape(values, (rows * nb, block)), self.bcast(scale, (rows * nb, block), [0])
    ).result
    return self.reshape(out, (rows, s))

  def _payload_fields(self, payload, s: int, block: int, fmt: qz.Format):
    """int8 payload [rows, P] of rows of s values -> (code bytes [rows, B], f32 scales [rows * nb])."""
    rows, p = shape_of(payload)
    nb = s // block
    code_bytes = fmt.code_bytes(s)
    codes = self.slice(payload, (0, 0), (rows, code_bytes))
    scale_bytes = self.reshape(self.slice(payload, (0, code_bytes), (rows, p)), (rows * nb, 4))
    return codes, self.bitcast(scale_bytes, (rows * nb,), self.f32)

  def accumulate(
    self, payload, local: list[ir.Value], block: int, fmt: qz.Format
  ) -> list[ir.Value]:
    """A ring step's sum, Dq(payload) + local, as block_parts (XLA:CPU fuses each part's
    sum into one FMA).  The int4 halves are unpacked apart: no concatenate."""
    rows, s = shape_of(local[0])[0], sum(shape_of(part)[1] for part in local)
    if len(local) == 1:
      return [
        hlo.AddOp(self.dequantize_rows(payload, s, block, fmt, requantized=True), local[0]).result
      ]
    codes, scale = self._payload_fields(payload, s, block, fmt)
    nb, w = s // block, s // 2
    m = rows * nb // 2  # blocks per half
    scale = self.reshape(scale, (rows, nb))
    out = []
    for i, (half, part) in enumerate(zip(self.nibbles(codes), local)):
      part_scale = self.reshape(
        self.slice(scale, (0, i * nb // 2), (rows, (i + 1) * nb // 2)), (m,)
      )
      values = hlo.MulOp(
        self.reshape(self.convert(half, self.f32), (m, block)),
        self.bcast(part_scale, (m, block), [0]),
      ).result
      out.append(hlo.AddOp(self.reshape(values, (rows, w)), part).result)
    return out

  def pack_int4(self, q, group: int) -> ir.Value:
    """int8 [rows, s] in [-8, 7] -> [rows, s/2]: quantize.pack_int4 (value j of each
    group of `group` in the low nibble, value j + group/2 in the high one)."""
    rows, s = shape_of(q)
    groups, half = rows * s // group, group // 2
    q = self.reshape(q, (groups, group))
    packed = self.or_nibbles(
      self.slice(q, (0, 0), (groups, half)), self.slice(q, (0, half), (groups, group))
    )
    return self.reshape(packed, (rows, s // 2))

  def nibbles(self, b) -> list[ir.Value]:
    """int8 bytes -> [low nibbles, high nibbles], each sign-extended: (b << 4) >>a 4, b >>a 4."""
    four = self.splat(4, shape_of(b), self.i8)
    return [
      hlo.ShiftRightArithmeticOp(hlo.ShiftLeftOp(b, four).result, four).result,
      hlo.ShiftRightArithmeticOp(b, four).result,
    ]

  def or_nibbles(self, low, high) -> ir.Value:
    """Two int8 code tensors in [-8, 7] -> one: low & 0xF | high << 4."""
    shape = shape_of(low)
    return hlo.OrOp(
      hlo.AndOp(low, self.splat(0xF, shape, self.i8)).result,
      hlo.ShiftLeftOp(high, self.splat(4, shape, self.i8)).result,
    ).result

  def unpack_int4(self, packed, group: int, by_broadcast: bool) -> ir.Value:
    """int8 [rows, s/2] -> int8 [rows, s], each nibble sign-extended: low = (b << 4) >>a 4,
    high = b >>a 4, the two halves of each group side by side.

    Two equal forms; which one XLA:CPU runs faster depends on where the unpack ends up
    (BUILD_NOTES.md, int4 nibbles):
    - concatenated halves where the values feed a sum that is quantized again, which
      XLA recomputes in two fusions (block magnitudes, then codes): two-shot's and the
      calibrated scheme's sums, and a ring step over rows of an odd number of blocks.
      The usual ring step unpacks its two halves apart and concatenates nothing
      (accumulate);
    - by_broadcast, every byte broadcast to [2, group/2] and shifted by 4 or 0, where
      one fusion writes the result: no concatenate's per-element select there.
    """
    rows, half_row = shape_of(packed)
    groups, half = rows * half_row * 2 // group, group // 2
    b = self.reshape(packed, (groups, half))
    if by_broadcast:
      shape = (groups, 2, half)
      shift = self.bcast(self.const(np.array([4, 0], np.int8), self.i8), shape, [1])
      up = hlo.ShiftLeftOp(self.bcast(b, shape, [0, 2]), shift).result
      both = hlo.ShiftRightArithmeticOp(up, self.splat(4, shape, self.i8)).result
    else:
      both = self.concat(self.nibbles(b), 1)
    return self.reshape(both, (rows, 2 * half_row))

  def butterflies(self, x, size: int) -> ir.Value:
    """rotation.butterflies on a flat f32 vector: the constant-geometry (Pease) form.

    One pass takes the stages of index bits 0 and 1 of each block: a, b, c, d at
    positions 4i..4i+3 give (a+b)+(c+d), (a-b)+(c-d), (a+b)-(c+d), (a-b)-(c-d), the
    model's adds in the model's order (so the same bits), written to positions
    i, i + size/4, i + size/2, i + 3 size/4.  That rotates the index bits by two, so
    the next pass finds the next two stages' pairs at the same places: every pass is
    the same, and log4(size) passes run as one `while` loop (an odd last stage is one
    radix-2 pass after it).  The module and XLA:CPU's kernels stay the size of one
    pass whatever the rotation size (unrolled, 5 + 5 passes of H_1024 were half of a
    site's compile time).
    """
    (m,) = shape_of(x)
    blocks, k = m // size, size.bit_length() - 1

    def one_pass(y, radix):
      q = size // radix
      group = self.reshape(y, (blocks, q, radix))
      outs = [
        self.reshape(self.slice(group, (0, 0, j), (blocks, q, j + 1)), (blocks, 1, q))
        for j in range(radix)
      ]
      stride = 1
      while stride < radix:  # the stage of bit `stride`: pairs (j, j + stride)
        new = list(outs)
        for j in range(radix):
          if not j & stride:
            new[j] = hlo.AddOp(outs[j], outs[j + stride]).result
            new[j + stride] = hlo.SubtractOp(outs[j], outs[j + stride]).result
        outs, stride = new, 2 * stride
      return self.reshape(self.concat(outs, 1), (blocks, size))

    y = self.reshape(x, (blocks, size))
    if k // 2 == 1:
      y = one_pass(y, 4)
    elif k // 2:
      y = _while([y], k // 2, lambda step, y_: [one_pass(y_, 4)])[0]
    if k % 2:
      y = one_pass(y, 2)
    return self.reshape(y, (m,))

  def hadamard(self, x, size: int) -> ir.Value:
    """rotation.hadamard on a flat f32 vector: the exact signs / size, then the stages."""
    return self.butterflies(
      self.times_per_position(x, rotation.signs(size) * rotation.norm(size)), size
    )

  def times_per_position(self, x, factors: np.ndarray) -> ir.Value:
    """A flat f32 vector times `factors` (f32 [size]) repeated along it."""
    (m,) = shape_of(x)
    size = factors.shape[0]
    rows = self.reshape(x, (m // size, size))
    product = hlo.MulOp(
      rows, self.bcast(self.const(factors.astype(np.float32), self.f32), (m // size, size), [1])
    ).result
    return self.reshape(product, (m,))


def _part_count(s: int, block: int, fmt: qz.Format) -> int:
  """How many parts a row of s values is quantized in (Emitter.block_parts): 2 for int4
  rows of an even number of blocks, whose two halves pair in the code bytes
  (quantize.nibble_group), else 1."""
  return 2 if fmt.bits == 4 and qz.pairs_row_halves(block, s) else 1


def fp8_type(fmt: qz.Format) -> ir.Type:
  return {"float8_e4m3fn": ir.Float8E4M3FNType, "float8_e5m2": ir.Float8E5M2Type}[fmt.fp8].get()


def reduce(x, init, element_type, axes: int | tuple[int, ...], combine) -> ir.Value:
  """combine (hlo.MaxOp, hlo.AddOp, ...) over one axis (or several) of a tensor."""
  axes = (axes,) if isinstance(axes, int) else tuple(axes)
  shape = [d for i, d in enumerate(shape_of(x)) if i not in axes]
  op = hlo.ReduceOp([tensor(shape, element_type)], [x], [init], list(axes))
  scalar = tensor((), element_type)
  block = op.body.blocks.append(scalar, scalar)
  with ir.InsertionPoint(block):
    hlo.ReturnOp([combine(block.arguments[0], block.arguments[1]).result])
  return op.result


def emit_feature_stats(value: ir.Value) -> list[ir.Value]:
  """Per feature (last dimension) of a tensor: [absmax, mean square], each f32 [1, H].

  NaN counts as +inf in the absmax (as in quantize.py), so non-finite data shows
  as an infinite range.  calibrate (observe.py) records these.
  """
  em = Emitter()
  rows, features = outlier.rows_and_features(shape_of(value))
  x = em.reshape(em.convert(value, em.f32), (rows, features))
  zero = em.splat(0, (), em.f32)
  absmax = reduce(em.magnitude(x), zero, em.f32, 0, hlo.MaxOp)
  square_sum = reduce(hlo.MulOp(x, x).result, zero, em.f32, 0, hlo.AddOp)
  mean_square = hlo.MulOp(square_sum, em.splat(1.0 / max(rows, 1), (features,), em.f32)).result
  return [em.reshape(absmax, (1, features)), em.reshape(mean_square, (1, features))]


def _while(init: list[ir.Value], trip_count: int, body_fn) -> list[ir.Value]:
  """for s in range(trip_count): carry = body_fn(s, *carry).  s is the first carry.

  Everything the body uses is carried (no implicit captures), as JAX does.
  """
  em = Emitter()
  operands = [em.i32_scalar(0)] + list(init)
  types = [v.type for v in operands]
  op = hlo.WhileOp(types, operands)
  cond = op.cond.blocks.append(*types)
  with ir.InsertionPoint(cond):
    lt = hlo.CompareOp(
      cond.arguments[0], em.i32_scalar(trip_count), hlo.ComparisonDirectionAttr.get("LT")
    ).result
    hlo.ReturnOp([lt])
  body = op.body.blocks.append(*types)
  with ir.InsertionPoint(body):
    step = body.arguments[0]
    new = body_fn(step, *body.arguments[1:])
    hlo.ReturnOp([em.add_i32(step, 1)] + list(new))
  return list(op.results)[1:]


def _unrolled(init: list[ir.Value], trip_count: int, body_fn) -> list[ir.Value]:
  """_while's loop written out: body_fn(s, *carry) for s = 0 .. trip_count - 1."""
  em = Emitter()
  carry = list(init)
  for s in range(trip_count):
    carry = body_fn(em.i32_scalar(s), *carry)
  return carry


class Collectives:
  """The collectives of one site: fresh channel handles, the site's groups."""

  def __init__(self, em: Emitter, plan: RingPlan, channels: ChannelAllocator):
    self.em, self.plan, self.channels = em, plan, channels
    self.partition = plan.device_kind == "partition"

  def _channel(self) -> dict:
    if not self.partition:
      return {}
    return {"channel_handle": hlo.ChannelHandle.get(self.channels.new(), DEVICE_TO_DEVICE)}

  def permute(self, x, direction: int) -> ir.Value:
    pairs = np.array(self.plan.schedule.source_target_pairs(direction), np.int64).reshape(-1, 2)
    return hlo.CollectivePermuteOp(x, self.em.groups_attr(pairs), **self._channel()).result

  def all_to_all(self, x) -> ir.Value:
    n = self.plan.layout.group_size
    return hlo.AllToAllOp(
      [x], 0, 0, n, self.em.groups_attr(self.plan.schedule.groups), **self._channel()
    ).results[0]

  def all_gather(self, x, first: int = 0) -> ir.Value:
    """x's copies from every rank of the group, concatenated along dimension 0, starting
    with the rank at position `first` of the group (then first + 1, ...): an all-gather
    concatenates in the order its replica groups list the devices."""
    rows, *rest = shape_of(x)
    n = self.plan.layout.group_size
    kwargs = self._channel()
    if self.partition:
      kwargs["use_global_device_ids"] = True
    element_type = ir.RankedTensorType(x.type).element_type
    groups = [tuple(g[first:]) + tuple(g[:first]) for g in self.plan.schedule.groups]
    return hlo.AllGatherOp(
      [tensor((n * rows, *rest), element_type)], [x], 0, self.em.groups_attr(groups), **kwargs
    ).results[0]


def narrow_float(types) -> ir.Type | None:
  """The operands' common float type if it is 16-bit (bf16, f16), else None."""
  element_types = {t.element_type for t in types}
  if len(element_types) != 1:
    return None
  (element_type,) = element_types
  if isinstance(element_type, (ir.BF16Type, ir.F16Type)):
    return element_type
  return None


def emit_allreduce(
  operands: list[ir.Value], plan: RingPlan, channels: ChannelAllocator
) -> list[ir.Value]:
  """Emit the quantized all-reduce of `plan.scheme` at the current insertion point.

  Returns one value per operand with the operand's type.
  """
  em = Emitter()
  scheme, layout = plan.scheme, plan.layout
  n, c = layout.group_size, layout.chunk
  coll = Collectives(em, plan, channels)

  # Flatten the operands, lay them out as N chunks, rotate.
  types = [ir.RankedTensorType(v.type) for v in operands]
  rotating = scheme.rotation != rotation.NONE
  narrow = narrow_float(types) if not rotating else None
  x = em.flat_padded(operands, narrow or em.f32, layout.padded)
  if rotating:
    x = em.hadamard(x, scheme.resolved_rotation_size)
  chunks = em.reshape(x, (n, c))
  if narrow is not None:
    # Without a rotation, bf16/f16 chunks stay 16-bit and each ring step widens only
    # the row it reads (exact).  Widening up front writes a fresh f32 copy of all N
    # chunks: a quarter of the int8 ring's run time for 32 MiB of bf16 on XLA:CPU.
    # The rows travel as i16 bits because XLA:CPU's float normalization widens a
    # bf16 dynamic-slice's whole operand, and the loop then hoists that widening.
    chunks = em.bitcast(chunks, (n, c), em.i16)
  widen = functools.partial(em.widen, narrow=narrow)

  # The final dequantize also undoes the rotation (on the codes, exactly).
  rotation_size = scheme.resolved_rotation_size if rotating else 0
  if scheme.algorithm == scheme_lib.TWO_SHOT:
    values = _emit_two_shot(em, coll, widen(chunks), layout, scheme.fmt, rotation_size)
  else:
    values = _emit_ring(
      em,
      coll,
      chunks,
      widen,
      group_rank(em, plan, coll),
      layout,
      scheme,
      rotation_size,
      plan.unrolled,
    )

  # values: f32 [N, C], the same bits on every rank of the group.
  return em.unflatten_like(values, types)


def emit_ring_step(payload: ir.Value, local: ir.Value, block: int, fmt: qz.Format) -> ir.Value:
  """One ring step's arithmetic between two permutes: Dq -> f32 add -> Qp1/Qp2.

  payload: int8 [1, P] as received; local: f32 [1, C], this rank's chunk.
  Returns the int8 [1, P] payload the next permute sends.  The reduce-scatter step's
  own ops (Emitter.accumulate, quantize_parts); tools/bench_gpu_step.py times them alone.
  """
  em = Emitter()
  parts = em.accumulate(payload, em.block_parts(local, block, fmt), block, fmt)
  return em.quantize_parts(parts, block, fmt)


def group_rank(em, plan, coll) -> ir.Value:
  """This device's position in its group, an i32 scalar."""
  (rank,) = _per_device(em, coll, [plan.schedule.rank_table(plan.num_devices)])
  return rank


def _per_device(em, coll, tables) -> list[ir.Value]:
  """Each table's entry for this device (partition or replica id), as i32 scalars."""
  device = (hlo.PartitionIdOp() if coll.partition else hlo.ReplicaIdOp()).result
  device = em.reshape(em.convert(device, em.i32), (1,))
  return [
    em.reshape(em.dynamic_slice(em.const(table, em.i32), [em.reshape(device, ())], [1]), ())
    for table in tables
  ]


def _emit_ring(em, coll, chunks, widen, rank, layout, scheme, rotation_size, unrolled) -> ir.Value:
  """Reduce-scatter and all-gather loops over the lanes; returns f32 [N, C].

  chunks: [N, C], f32 or the 16-bit pattern of narrower floats; widen(rows) makes f32.
  unrolled: write the reduce-scatter steps out instead of looping (RingPlan.unrolled).
  """
  n, block, fmt = layout.group_size, layout.block, scheme.fmt
  lanes = scheme.lanes(layout)
  # Counter-clockwise lanes run the clockwise ring over the group reversed:
  # there rank r sits at position N-1-r.
  ccw_rank = hlo.SubtractOp(em.i32_scalar(n - 1), rank).result
  rank_of = {1: rank, -1: ccw_rank}
  k = len(lanes)
  # A lane's partial sum is carried as its block parts (Emitter.block_parts): m values.
  m = _part_count(lanes[0].size, block, fmt)

  def local_parts(chunks_, row, lane):
    return [
      widen(part) for part in em.dynamic_parts(chunks_, row, lane.offset, lane.size, block, fmt)
    ]

  def rs_step(step, *carry):
    partials = [list(carry[i * m : (i + 1) * m]) for i in range(k)]
    chunks_, ranks = carry[k * m], {1: carry[k * m + 1], -1: carry[k * m + 2]}
    new = []
    for lane, partial in zip(lanes, partials):
      received = coll.permute(em.quantize_parts(partial, block, fmt), lane.direction)
      idx = em.mod(em.add_i32(hlo.SubtractOp(ranks[lane.direction], step).result, -1), n)
      new += em.accumulate(received, local_parts(chunks_, idx, lane), block, fmt)
    return new + [chunks_, ranks[1], ranks[-1]]

  partials = [part for lane in lanes for part in local_parts(chunks, rank_of[lane.direction], lane)]
  # A while loop must carry the chunks, and XLA copies all N of them into the loop's
  # buffer on every call; written out, each step slices the operand where it lies.
  loop = _unrolled if unrolled else _while
  carry = loop(partials + [chunks, rank, ccw_rank], n - 1, rs_step)

  # Final quantization, once; then the all-gather forwards bytes unchanged.
  owns = [em.quantize_parts(list(carry[i * m : (i + 1) * m]), block, fmt) for i in range(k)]
  # The gather buffer starts as N copies of this rank's own chunk: its own row is then in
  # place, and the all-gather overwrites every other one.
  gathered = [em.bcast(own, (n, shape_of(own)[1]), [0, 1]) for own in owns]

  def ag_step(step, *carry):
    currents, outs = list(carry[:k]), list(carry[k : 2 * k])
    ranks = {1: carry[2 * k], -1: carry[2 * k + 1]}
    new_cur, new_out = [], []
    for lane, cur, out in zip(lanes, currents, outs):
      cur = coll.permute(cur, lane.direction)
      idx = em.mod(hlo.SubtractOp(ranks[lane.direction], step).result, n)
      new_cur.append(cur)
      new_out.append(em.set_rows(out, idx, cur))
    return new_cur + new_out + [ranks[1], ranks[-1]]

  carry = _while(owns + gathered + [rank, ccw_rank], n - 1, ag_step)
  gathered = carry[k : 2 * k]
  # Every rank dequantizes all N chunks the same way: identical bits everywhere.
  return em.concat(
    [
      em.dequantize_rows(g, lane.size, block, fmt, rotation_size)
      for g, lane in zip(gathered, lanes)
    ],
    1,
  )


def _emit_two_shot(em, coll, chunks, layout, fmt, rotation_size) -> ir.Value:
  """all_to_all -> f32 sum in group order -> quantize once -> all_gather; f32 [N, C]."""
  n, c, block = layout.group_size, layout.chunk, layout.block
  received = coll.all_to_all(em.quantize_rows(chunks, block, fmt))  # row j: from rank j

  def sum_step(j, acc, received_):
    row = em.dynamic_rows(received_, j, 0, 1, shape_of(received_)[1])
    return [
      hlo.AddOp(acc, em.dequantize_rows(row, c, block, fmt, requantized=True)).result,
      received_,
    ]

  acc, _ = _while([em.splat(0, (1, c), em.f32), received], n, sum_step)
  gathered = coll.all_gather(em.quantize_rows(acc, block, fmt))  # row j: rank j's sum
  return em.dequantize_rows(gathered, c, block, fmt, rotation_size)


# --- the calibrated outlier-feature scheme (outlier.py) -----------------------


@dataclasses.dataclass(frozen=True)
class CalibratedPlan:
  """One site's calibrated two-shot: the layout and every group's static scales.

  Tables are indexed by group (group_of_device[device id]) and, for the input
  scales, by the sender's rank in its group; columns are the int4 features in
  wire order (outlier.OutlierLayout.normal).
  """

  layout: outlier.OutlierLayout
  schedule: ring.RingSchedule
  device_kind: str
  num_devices: int
  in_scale: np.ndarray  # f32 [G, N, H - k]
  in_reciprocal: np.ndarray  # f32 [G, N, H - k]
  out_scale: np.ndarray  # f32 [G, H - k]
  out_reciprocal: np.ndarray  # f32 [G, H - k]

  def group_table(self) -> np.ndarray:
    """group_table[device id] = index of the device's group (-1: in none)."""
    table = np.full(self.num_devices, -1, np.int32)
    for g, members in enumerate(self.schedule.groups):
      table[list(members)] = g
    return table


def _take_columns(em: Emitter, x, columns) -> ir.Value:
  """x[:, columns] of a 2-D tensor, `columns` a static index list (one gather)."""
  rows, _ = shape_of(x)
  indices = em.const(np.asarray(columns, np.int32).reshape(-1, 1), em.i32)
  dims = hlo.GatherDimensionNumbers.get(
    offset_dims=[0],
    collapsed_slice_dims=[1],
    operand_batching_dims=[],
    start_indices_batching_dims=[],
    start_index_map=[1],
    index_vector_dim=1,
  )
  return hlo.GatherOp(
    x, indices, dims, ir.DenseI64ArrayAttr.get([rows, 1]), indices_are_sorted=False
  ).result


def _static_quantize(em: Emitter, x, reciprocal) -> ir.Value:
  """outlier.quantize_static: f32 [rows, F] and reciprocals [rows, F] -> int8 codes."""
  shape = shape_of(x)
  clamped = hlo.ClampOp(
    em.splat(-outlier.QMAX, (), em.f32),
    hlo.MulOp(x, reciprocal).result,
    em.splat(outlier.QMAX, (), em.f32),
  ).result
  rounded = hlo.RoundNearestEvenOp(clamped).result
  finite = hlo.IsFiniteOp(x).result
  marked = hlo.SelectOp(finite, rounded, em.splat(outlier.NONFINITE_CODE, shape, em.f32)).result
  return em.convert(marked, em.i8)


def _code_values(em: Emitter, codes) -> ir.Value:
  """outlier.code_values: int8 codes -> f32, NaN for the non-finite marker."""
  shape = shape_of(codes)
  marker = hlo.CompareOp(
    codes, em.splat(outlier.NONFINITE_CODE, shape, em.i8), hlo.ComparisonDirectionAttr.get("EQ")
  ).result
  return hlo.SelectOp(marker, em.splat(np.nan, shape, em.f32), em.convert(codes, em.f32)).result


def _bf16_bytes(em: Emitter, x, rows: int) -> ir.Value:
  """f32 [r, k] -> bf16 (round to nearest even) -> its bytes, int8 [rows, r * k * 2 / rows]."""
  r, k = shape_of(x)
  bf16 = em.convert(x, ir.BF16Type.get())
  return em.reshape(em.bitcast(bf16, (r, k, 2), em.i8), (rows, r * k * 2 // rows))


def _bf16_values(em: Emitter, data, r: int, k: int) -> ir.Value:
  """int8 bytes of r x k bf16 values -> f32 [r, k]."""
  pairs = em.reshape(data, (r, k, 2))
  return em.convert(em.bitcast(pairs, (r, k), ir.BF16Type.get()), em.f32)


def emit_calibrated_allreduce(
  operands: list[ir.Value], plan: CalibratedPlan, channels: ChannelAllocator
) -> list[ir.Value]:
  """Emit the calibrated two-shot (outlier.reference, op for op) for one operand."""
  em = Emitter()
  (operand,) = operands
  t = ir.RankedTensorType(operand.type)
  lay = plan.layout
  n, rows, h = lay.group_size, lay.rows, lay.features
  k = len(lay.outliers)
  hn = h - k
  coll = Collectives(em, plan, channels)

  # [M, H] f32, rows padded to N chunks of R, columns in wire order.
  x = em.reshape(em.convert(operand, em.f32), (lay.num_rows, h))
  if lay.padded_rows > lay.num_rows:
    x = hlo.PadOp(
      x, em.splat(0, (), em.f32), [0, 0], [lay.padded_rows - lay.num_rows, 0], [0, 0]
    ).result
  x = _take_columns(em, x, lay.permutation)

  # This device's group and rank pick its rows of the scale tables.
  group, rank = _per_device(
    em, coll, [plan.group_table(), plan.schedule.rank_table(plan.num_devices)]
  )
  zero = em.i32_scalar(0)
  in_scale = em.reshape(
    em.dynamic_slice(em.const(plan.in_scale, em.f32), [group, zero, zero], [1, n, hn]), (n, hn)
  )
  own_reciprocal = em.reshape(
    em.dynamic_slice(em.const(plan.in_reciprocal, em.f32), [group, rank, zero], [1, 1, hn]), (1, hn)
  )
  out_scale = em.dynamic_slice(em.const(plan.out_scale, em.f32), [group, zero], [1, hn])
  out_reciprocal = em.dynamic_slice(em.const(plan.out_reciprocal, em.f32), [group, zero], [1, hn])

  def payload(values, count: int, reciprocal) -> ir.Value:
    """f32 [count * R, H] in wire order -> int8 [count, P]: int4 codes, then bf16 bytes."""
    normal = em.slice(values, (0, 0), (count * rows, hn))
    codes = _static_quantize(
      em, normal, em.bcast(em.reshape(reciprocal, (hn,)), (count * rows, hn), [1])
    )
    # The nibbles pair within each chunk's row of codes (quantize.pack_int4).
    parts = [em.pack_int4(em.reshape(codes, (count, rows * hn)), rows * hn)]
    if k:
      hot = em.slice(values, (0, hn), (count * rows, h))
      parts.append(_bf16_bytes(em, hot, count))
    return em.concat(parts, 1)

  def unpack(data, count: int, requantized: bool):
    """int8 [count, P] -> (f32 code values [count * R, H - k], bf16 as f32 [count * R, k]).
    requantized: the values feed the sum that is quantized again (unpack_int4's form)."""
    codes = em.slice(data, (0, 0), (count, lay.code_bytes))
    codes = em.unpack_int4(codes, rows * hn, by_broadcast=not requantized)
    values = em.reshape(_code_values(em, codes), (count * rows, hn))
    hot = None
    if k:
      hot = _bf16_values(
        em, em.slice(data, (0, lay.code_bytes), (count, lay.payload_bytes)), count * rows, k
      )
    return values, hot

  received = coll.all_to_all(payload(x, n, own_reciprocal))  # row j: from rank j

  def sum_step(j, acc, acc_hot, received_, in_scale_):
    values, hot = unpack(em.dynamic_rows(received_, j, 0, 1, lay.payload_bytes), 1, True)
    scale = em.bcast(em.reshape(em.dynamic_rows(in_scale_, j, 0, 1, hn), (hn,)), (rows, hn), [1])
    acc = hlo.AddOp(acc, hlo.MulOp(values, scale).result).result  # XLA: one FMA
    if k:
      acc_hot = hlo.AddOp(acc_hot, hot).result
    return [acc, acc_hot, received_, in_scale_]

  acc, acc_hot, _, _ = _while(
    [em.splat(0, (rows, hn), em.f32), em.splat(0, (rows, max(k, 1)), em.f32), received, in_scale],
    n,
    sum_step,
  )
  owned = em.concat([acc, acc_hot], 1) if k else acc
  gathered = coll.all_gather(payload(owned, 1, out_reciprocal))  # row j: rank j's sum

  values, hot = unpack(gathered, n, False)
  normal = hlo.MulOp(values, em.bcast(em.reshape(out_scale, (hn,)), (n * rows, hn), [1])).result
  wire = em.concat([normal, hot], 1) if k else normal
  inverse = np.argsort(lay.permutation)
  out = _take_columns(em, wire, inverse)
  out = em.slice(out, (0, 0), (lay.num_rows, h))
  return [em.convert(em.reshape(out, tuple(t.shape)), t.element_type)]
