"""The tiled forms of the two-shot and ring all-reduces: the default on every platform.

The same algorithms as two_shot.py and ring.py (and the same bits, without a rotation),
emitted in shapes an accelerator's compiler lays out without copies:

  x:[N, R, S, W]       the operands, flat and padded (as the flat form), viewed as N
                       chunks of R blocks, each block S rows of W lanes (W = 128 when
                       the block is a multiple of 128: one TPU vreg row; else the block);
                       8-bit codes of one-row blocks eight to a tile, [N, R / 8, 8, 128];
                       16-bit floats stay 16-bit until read
  q, s                 codes int8 [.., R, S, W] (int4: two per byte, [.., R, S/2, W]) and
                       scales f32 [.., R] ([.., R / 8, 8] for one-row blocks): two
                       arrays, each on its own collective (no
                       scale bytes packed into the codes, whose tiny minor dimension a
                       TPU tiles 128 to 1)
  two-shot             all_to_all of every chunk; acc = dq(q_0) + ... + dq(q_N-1) in group
                       order, written out; quantized once; all_gather
  ring                 N-1 reduce-scatter steps written out (no loop that carries every
                       chunk): quantize, permute, dq + this rank's chunk; quantized once;
                       all_gather over the group listed from its last rank, so the chunks
                       arrive in order (the bytes the ring's all-gather steps forward)
  out                  dq of the gathered codes, every rank the same bytes; the operands'
                       shapes and types

The rotation, where the scheme has one, is a dot_general with the +-1 Hadamard matrix
over the last dimension of [..., size]: one small matmul per tile, which TPUs (MXU) and
GPUs (tensor cores) run next to free.  The inverse rotation runs on the codes (small
integers, whose sums f32 holds exactly in any order), so only the forward rotation's
rounding differs from the butterflies of the model (rotation.py); f32 operands use
HIGHEST precision so a TPU does not round them to bf16 first.  On CPU
(plan.matmul_rotation false) the forward rotation is the model's butterflies, so the
whole site equals the model bit for bit.

The flat form (build.py) is emitted for the schemes that have no tiled form and under
--equarx_form=flat; see BUILD_NOTES ("Emitted forms").
"""

from __future__ import annotations

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass import build, rotation
from equarx_pass.build import shape_of
from equarx_pass import quantize as qz
from equarx_pass import scheme as scheme_lib

LANES = 128
SUBLANES = 8  # rows of a TPU tile


def _lanes(block: int) -> int:
  return LANES if block % LANES == 0 else block


def emit(
  operands: list[ir.Value], plan: build.RingPlan, channels: build.ChannelAllocator
) -> list[ir.Value]:
  """The tiled form of plan.scheme's algorithm."""
  emit_algorithm = emit_ring if plan.scheme.algorithm == scheme_lib.RING else emit_two_shot
  return emit_algorithm(operands, plan, channels)


def emit_two_shot(
  operands: list[ir.Value], plan: build.RingPlan, channels: build.ChannelAllocator
) -> list[ir.Value]:
  """The tiled two-shot all-reduce of `plan` at the current insertion point; one value per
  operand, with the operand's type."""
  site = _Site(operands, plan, channels)
  codes, scales = site.codec.quantize(site.em.convert(site.chunks, site.em.f32))
  codes, scales = site.coll.all_to_all(codes), site.coll.all_to_all(scales)  # j: from rank j
  acc = None
  for j in range(site.n):
    term = site.codec.dequantize(_row(site.em, codes, j), _row(site.em, scales, j))
    acc = _plus_zero(site.em, term) if acc is None else _add(term, acc)
  codes, scales = site.codec.quantize(acc)
  return site.finish(site.coll.all_gather(codes), site.coll.all_gather(scales))


def emit_ring(
  operands: list[ir.Value], plan: build.RingPlan, channels: build.ChannelAllocator
) -> list[ir.Value]:
  """The tiled ring all-reduce (ring.py's schedule): N-1 reduce-scatter steps written out,
  each quantize -> permute codes and scales -> dequantize + this rank's chunk; the owned
  chunk quantized once; then one all_gather of the quantized chunks (the bytes the ring's
  all-gather steps would forward, unchanged)."""
  site = _Site(operands, plan, channels)
  em, n = site.em, site.n
  rank = build.group_rank(em, plan, site.coll)

  def local(index):
    """This rank's chunk `index` (a traced i32 scalar), f32 [R, S, W]."""
    zero = em.i32_scalar(0)
    shape = shape_of(site.chunks)
    piece = em.dynamic_slice(site.chunks, [index] + [zero] * (len(shape) - 1), (1, *shape[1:]))
    return em.convert(em.reshape(piece, shape[1:]), em.f32)

  partial = local(rank)
  for step in range(n - 1):
    codes, scales = site.codec.quantize(partial)
    codes, scales = site.coll.permute(codes, 1), site.coll.permute(scales, 1)
    index = em.mod(em.add_i32(rank, -step - 1), n)
    partial = _add(site.codec.dequantize(codes, scales), local(index))
  codes, scales = site.codec.quantize(partial)  # rank r owns chunk (r + 1) mod N
  # Gathered from rank N-1 (which owns chunk 0) on, the chunks arrive in their order: the
  # group listed from its last rank, no reordering afterwards.
  codes, scales = (
    site.coll.all_gather(codes, first=n - 1),
    site.coll.all_gather(scales, first=n - 1),
  )
  return site.finish(codes, scales)


class _Site:
  """What both algorithms share: the operands as N chunks of tiles (rotated, where the
  scheme rotates), and the way back from the gathered codes to the operands' values."""

  def __init__(self, operands, plan: build.RingPlan, channels: build.ChannelAllocator):
    em = self.em = build.Emitter()
    self.coll = build.Collectives(em, plan, channels)
    scheme, layout = plan.scheme, plan.layout
    self.fmt = scheme.fmt
    self.n, c, block = layout.group_size, layout.chunk, layout.block
    w = _lanes(block)
    # One chunk: R blocks of S x W; 8-bit codes of one-row blocks of 128 lanes eight to
    # a tile [R / 8, 8, 128], with scales [R / 8, 8]; else [R, W].  Never a size-1
    # dimension above the lanes.  By the TPU compiler's estimates (v5e:2x2, 32 MiB of
    # bf16) int8 two-shot with block 128 and H_128 costs 6.80x the native all-reduce's
    # on-chip time so, 11.15x as [R, 128] (whose scales a TPU lays out along lanes and
    # relayouts); the int4 ring with block 128 6.03x as [R, 128], 7.03x (nibbles paired
    # across lanes) and 7.25x (across rows) as [R / 8, 8, 128].
    rows = block // w
    if rows > 1:
      self.tile, block_dims = (c // block, rows, w), 2
    elif w == LANES and (c // block) % SUBLANES == 0 and self.fmt.bits == 8:
      self.tile, block_dims = (c // block // SUBLANES, SUBLANES, w), 1
    else:
      self.tile, block_dims = (c // block, w), 1
    # int4 bytes pair the halves of a block's rows where it has an even number of them,
    # else the halves of its lanes.
    pair_rows = block_dims == 2 and rows % 2 == 0
    self.codec = _Codec(em, self.fmt, block_dims, -2 if pair_rows else -1)
    self.types = [ir.RankedTensorType(v.type) for v in operands]
    self.size = scheme.resolved_rotation_size if scheme.rotation != rotation.NONE else 0
    # 16-bit floats stay 16-bit until a step reads them (exact), and enter the rotation's
    # matmul as they are: their products with +-1 are exact and the sums f32.
    entry = build.narrow_float(self.types) or em.f32
    x = em.reshape(em.flat_padded(operands, entry, layout.padded), (self.n, *self.tile))
    if self.size and plan.matmul_rotation:
      # (H / size) x in one matmul: the power-of-two scale is exact in the matrix and in
      # the products (the same value as scaling first, unless a sum overflows).
      x = _rotate(em, x, self.size, exact=False, forward=True)
    elif self.size:
      # The model's butterflies, in its order: the same bits as the model.
      shape = shape_of(x)
      flat = em.reshape(em.convert(x, em.f32), (int(np.prod(shape, dtype=np.int64)),))
      x = em.reshape(em.hadamard(flat, self.size), shape)
    self.chunks = x

  def finish(self, codes, scales) -> list[ir.Value]:
    """All N chunks' codes [N R, ...] and scales [N R, ...], in chunk order -> the results."""
    em = self.em
    if self.size:
      values = _rotate(em, self.codec.values(codes), self.size, exact=True, forward=False)
      # The signs after H, as the model flips them: a zero sum at a flipped position is
      # -0 there (folded into the matrix it would come out +0).
      shape = shape_of(values)
      flat = em.reshape(values, (int(np.prod(shape, dtype=np.int64)),))
      values = em.reshape(em.times_per_position(flat, rotation.signs(self.size)), shape)
      lead = list(range(len(shape_of(scales))))
      values = hlo.MulOp(values, em.bcast(scales, shape_of(values), lead)).result
    else:
      values = self.codec.dequantize(codes, scales)
    return em.unflatten_like(values, self.types)


def _plus_zero(em: build.Emitter, x) -> ir.Value:
  """x + 0, as the model's sum starts (-0 becomes +0; fp8 codes have a signed zero).
  Written as a select: XLA simplifies an add of 0 away."""
  zero = em.splat(0, shape_of(x), em.f32)
  is_zero = hlo.CompareOp(x, zero, hlo.ComparisonDirectionAttr.get("EQ")).result
  return hlo.SelectOp(is_zero, zero, x).result


def _add(term, acc) -> ir.Value:
  """term + acc, the new term first: XLA:CPU contracts a multiply feeding an add into an
  FMA, and where both operands of an add are products LLVM fuses the first one's.  So
  the sum is fma(q, s, acc), as quantize.fused_multiply_add has it."""
  return hlo.AddOp(term, acc).result


def _row(em: build.Emitter, x, j: int) -> ir.Value:
  """x[j] of an array with a leading dimension, that dimension dropped."""
  shape = shape_of(x)
  start = (j,) + (0,) * (len(shape) - 1)
  return em.reshape(em.slice(x, start, (j + 1,) + shape[1:]), shape[1:])


class _Codec:
  """quantize.py's block codec on tiles [..., R, S, W] (or [..., R, W]): one scale per block
  of the last `block_dims` dimensions.

  int4 codes travel two per byte: the first and second half of the tiles along
  `pack_axis` (-2: rows, -1: lanes) share the bytes.  Which values share a byte changes
  nothing but the bytes: the dequantized values are the model's.
  """

  def __init__(self, em: build.Emitter, fmt: qz.Format, block_dims: int, pack_axis: int):
    self.em, self.fmt, self.block_dims = em, fmt, block_dims
    self.pack_axis = None if fmt.bits == 8 else pack_axis

  def quantize(self, x) -> tuple[ir.Value, ir.Value]:
    """f32 [..., R, S, W] -> codes (int8 bytes) and scales f32 [..., R], quantize.py's ops
    in its order."""
    em, fmt = self.em, self.fmt
    shape = shape_of(x)
    lead = shape[: -self.block_dims]
    axes = tuple(range(len(shape) - self.block_dims, len(shape)))
    amax = build.reduce(em.magnitude(x), em.splat(0, (), em.f32), em.f32, axes, hlo.MaxOp)
    scale = hlo.MulOp(amax, em.splat(qz.inverse(fmt.qmax), lead, em.f32)).result
    positive = hlo.CompareOp(
      scale, em.splat(0, lead, em.f32), hlo.ComparisonDirectionAttr.get("GT")
    ).result
    safe = hlo.SelectOp(positive, scale, em.splat(1, lead, em.f32)).result
    reciprocal = hlo.MinOp(
      hlo.DivOp(em.splat(1, lead, em.f32), safe).result, em.splat(qz.FLT_MAX, lead, em.f32)
    ).result
    codes = em.codes(x, reciprocal, fmt)
    return (codes if self.pack_axis is None else self._pack(codes)), scale

  def values(self, codes) -> ir.Value:
    """The codes' values, f32 [..., R, S, W]."""
    em, fmt = self.em, self.fmt
    if self.pack_axis is not None:
      codes = self._unpack(codes)
    if fmt.fp8:
      return em.convert(em.bitcast(codes, shape_of(codes), build.fp8_type(fmt)), em.f32)
    return em.convert(codes, em.f32)

  def dequantize(self, codes, scales) -> ir.Value:
    """codes times their block's scale [..., R]: f32 [..., R, S, W]."""
    values = self.values(codes)
    lead = len(shape_of(scales))
    return hlo.MulOp(values, self.em.bcast(scales, shape_of(values), list(range(lead)))).result

  def _pack(self, codes) -> ir.Value:
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
    return self.em.or_nibbles(low, high)

  def _unpack(self, packed) -> ir.Value:
    """Each nibble sign-extended, the halves back in place."""
    axis = len(shape_of(packed)) + self.pack_axis
    return self.em.concat(self.em.nibbles(packed), axis)


def _rotate(em: build.Emitter, x, size: int, exact: bool, forward: bool) -> ir.Value:
  """The rotation (forward: (H / size) D; else D H) on each consecutive `size` values of
  x, as one dot_general
  over [count, size] with an f32 result.  exact: x holds code values (small integers),
  whose products and sums f32 holds exactly, so any precision gives the same bits; so
  do 16-bit floats (x's type).  Else (f32) HIGHEST, so no backend rounds x first."""
  shape = shape_of(x)
  # Over the tiles' last dimension when the rotation is as wide (no reshape, so no
  # relayout on a TPU); else over [count, size].
  flat = (
    x if shape[-1] == size else em.reshape(x, (int(np.prod(shape, dtype=np.int64)) // size, size))
  )
  rank = len(shape_of(flat))
  element_type = ir.RankedTensorType(x.type).element_type
  # x @ M for a row x: forward M = D H / size ((H / size) D x as rotation.hadamard has it),
  # inverse M = H (the caller flips the signs after it, D H q).  Both exact in f32 and
  # bf16: entries +-1 or +-2^-k.
  d = rotation.signs(size).astype(np.float64)
  h = rotation.matrix(size)
  matrix = d[:, None] * h * rotation.norm(size) if forward else h
  h = em.convert(em.const(matrix.astype(np.float32), em.f32), element_type)
  dims = hlo.DotDimensionNumbers.get(
    lhs_batching_dimensions=[],
    rhs_batching_dimensions=[],
    lhs_contracting_dimensions=[rank - 1],
    rhs_contracting_dimensions=[0],
  )
  precision = "DEFAULT" if exact or element_type != em.f32 else "HIGHEST"
  config = ir.ArrayAttr.get([hlo.PrecisionAttr.get(precision)] * 2)
  out = hlo.DotGeneralOp(
    build.tensor(shape_of(flat), em.f32), flat, h, dims, precision_config=config
  ).result
  return em.reshape(out, shape)  # f32
