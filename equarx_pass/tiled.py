"""The tiled form of the two-shot all-reduce: what TPUs and GPUs get.

The same algorithm as two_shot.py (and the same bits, without a rotation), emitted in
shapes an accelerator's compiler lays out without copies:

  x:[N, R, S, W] f32   the operands, flat and padded (as the flat form), viewed as N
                       chunks of R blocks, each block S rows of W lanes (W = 128 when
                       the block is a multiple of 128: one TPU vreg row; else the block)
  q, s                 codes int8 [N, R, S, W], scales f32 [N, R]: two arrays, each with
                       its own all_to_all (no scale bytes packed into the codes, whose
                       tiny minor dimension a TPU tiles 128 to 1)
  acc:[R, S, W] f32    dq(q_0) + dq(q_1) + ... + dq(q_N-1), in group order, written out
                       (no loop that carries every chunk)
  q', s'               quantized once; all_gather of each: [N R, S, W], [N R]
  out                  dq, every rank the same bytes; then the operands' shapes and types

The rotation, where the scheme has one, is a dot_general with the +-1 Hadamard matrix
over the last dimension of [..., size]: one small matmul per tile, which TPUs (MXU) and
GPUs (tensor cores) run next to free.  The inverse rotation runs on the codes (small
integers, whose sums f32 holds exactly in any order), so only the forward rotation's
rounding differs from the butterflies of the flat form (rotation.py); its precision is
HIGHEST so a TPU does not round the values to bf16 first.

The flat form (build.py) is what XLA:CPU runs fastest; see BUILD_NOTES ("Emitted forms").
"""

from __future__ import annotations

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass import build, rotation
from equarx_pass import quantize as qz
from equarx_pass import scheme as scheme_lib

LANES = 128


def unsupported(scheme: scheme_lib.Scheme) -> str | None:
  """Why `scheme` has no tiled form (then the flat form is emitted), or None."""
  if scheme.algorithm != scheme_lib.TWO_SHOT:
    return f"the tiled form is two_shot's; {scheme.algorithm} is emitted flat"
  if scheme.fmt.bits != 8:
    return f"the tiled form has 8-bit codes; {scheme.format} is emitted flat"
  if scheme.block_layout != "fixed":
    return "the tiled form has fixed blocks; the grid layout is emitted flat"
  return None


def policy_for_tiles(policy):
  """`policy` with the rotation size the tiled form defaults to: the lane width, 128.

  A rotation is a matmul here, and H_1024 (the flat form's default, for a block of
  1024) costs 8 times the multiplies of H_128; by the TPU compiler's estimates it
  turned the site's on-chip time from 7x the native all-reduce's into a cost it
  could not estimate.  An explicit --equarx_rotation_size is kept.
  """
  if policy.rotation == rotation.NONE or policy.rotation_size or policy.block_size % LANES:
    return policy
  return policy.replace(rotation_size=LANES)


def _lanes(block: int) -> int:
  return LANES if block % LANES == 0 else block


def emit_two_shot(operands: list[ir.Value], plan: build.RingPlan,
                  channels: build.ChannelAllocator) -> list[ir.Value]:
  """Emit the tiled two-shot all-reduce of `plan` at the current insertion point; one
  value per operand, with the operand's type."""
  em = build.Emitter()
  coll = build.Collectives(em, plan, channels)
  scheme, layout, fmt = plan.scheme, plan.layout, plan.scheme.fmt
  n, c, block = layout.group_size, layout.chunk, layout.block
  w = _lanes(block)
  tile = (c // block, block // w, w)           # one chunk: R blocks of S x W

  types = [ir.RankedTensorType(v.type) for v in operands]
  sizes = [int(np.prod(t.shape, dtype=np.int64)) for t in types]
  size = scheme.resolved_rotation_size if scheme.rotation != rotation.NONE else 0
  # Rotated 16-bit floats enter the matmul as they are: their products with +-1 are
  # exact and the sums are f32, so nothing is lost and the matmul is one pass.
  entry = build.narrow_float(types) if size else None
  entry = entry or em.f32
  x = em.concat([em.reshape(em.convert(v, entry), (size_,)) for v, size_ in zip(operands, sizes)],
                0)
  pad = layout.padded - layout.num_values
  if pad:
    x = hlo.PadOp(x, em.splat(0, (), entry), [0], [pad], [0]).result
  x = em.reshape(x, (n, *tile))
  if size:
    # (H / size) x in one matmul: the power-of-two scale is exact in the matrix, and the
    # products with it too (the same value as scaling first, unless a sum overflows).
    x = _rotate(em, x, size, exact=False, scale=rotation.norm(size))
  codes, scales = _quantize(em, em.convert(x, em.f32), fmt)
  codes, scales = coll.all_to_all(codes), coll.all_to_all(scales)   # index j: from rank j
  acc = None
  for j in range(n):
    term = _dequantize(em, _row(em, codes, j), _row(em, scales, j), fmt)
    # The new term first: XLA:CPU contracts a multiply and an add into an FMA, and where
    # both operands of the first add are products, LLVM fuses its first operand's.  So
    # the sum is fma(q_1, s_1, q_0 s_0), ... as quantize.fused_multiply_add has it.
    acc = term if acc is None else hlo.AddOp(term, acc).result
  codes, scales = _quantize(em, acc, fmt)
  codes, scales = coll.all_gather(codes), coll.all_gather(scales)   # [N R, S, W], [N R]
  if size:
    values = _rotate(em, _code_values(em, codes, fmt), size, exact=True)
    values = hlo.MulOp(values, em.bcast(scales, _shape(values), [0])).result
  else:
    values = _dequantize(em, codes, scales, fmt)

  flat = em.reshape(values, (n * c,))
  results, offset = [], 0
  for t, count in zip(types, sizes):
    piece = em.slice(flat, (offset,), (offset + count,))
    results.append(em.convert(em.reshape(piece, t.shape), t.element_type))
    offset += count
  return results


def _shape(x) -> tuple[int, ...]:
  return tuple(ir.RankedTensorType(x.type).shape)


def _row(em: build.Emitter, x, j: int) -> ir.Value:
  """x[j] of an array with a leading dimension, that dimension dropped."""
  shape = _shape(x)
  start = (j,) + (0,) * (len(shape) - 1)
  return em.reshape(em.slice(x, start, (j + 1,) + shape[1:]), shape[1:])


def _quantize(em: build.Emitter, x, fmt: qz.Format) -> tuple[ir.Value, ir.Value]:
  """f32 [..., R, S, W] -> codes int8 [..., R, S, W] and scales f32 [..., R]: quantize.py's
  ops and order, one scale per block of S x W values."""
  shape = _shape(x)
  lead = shape[:-2]
  amax = build.reduce(em.magnitude(x), em.splat(0, (), em.f32), em.f32,
                      (len(shape) - 2, len(shape) - 1), hlo.MaxOp)
  scale = hlo.MulOp(amax, em.splat(qz.inverse(fmt.qmax), lead, em.f32)).result
  positive = hlo.CompareOp(scale, em.splat(0, lead, em.f32),
                           hlo.ComparisonDirectionAttr.get("GT")).result
  safe = hlo.SelectOp(positive, scale, em.splat(1, lead, em.f32)).result
  reciprocal = hlo.MinOp(hlo.DivOp(em.splat(1, lead, em.f32), safe).result,
                         em.splat(qz.FLT_MAX, lead, em.f32)).result
  return em.codes(x, reciprocal, fmt), scale


def _code_values(em: build.Emitter, codes, fmt: qz.Format) -> ir.Value:
  if fmt.fp8:
    return em.convert(em.bitcast(codes, _shape(codes), build.fp8_type(fmt)), em.f32)
  return em.convert(codes, em.f32)


def _dequantize(em: build.Emitter, codes, scales, fmt: qz.Format) -> ir.Value:
  """codes [..., R, S, W] times their block's scale [..., R]: f32."""
  values = _code_values(em, codes, fmt)
  lead = len(_shape(scales))
  return hlo.MulOp(values, em.bcast(scales, _shape(values), list(range(lead)))).result


def _rotate(em: build.Emitter, x, size: int, exact: bool, scale: float = 1.0) -> ir.Value:
  """The +-1 Hadamard H_size on each consecutive `size` values of x, as one dot_general
  over [count, size] with an f32 result.  exact: x holds code values (small integers),
  whose products and sums f32 holds exactly, so any precision gives the same bits; so
  do 16-bit floats (x's type).  Else (f32) HIGHEST, so no backend rounds x first."""
  shape = _shape(x)
  # Over the tiles' last dimension when the rotation is as wide (no reshape, so no
  # relayout on a TPU); else over [count, size].
  flat = x if shape[-1] == size else em.reshape(
      x, (int(np.prod(shape, dtype=np.int64)) // size, size))
  rank = len(_shape(flat))
  element_type = ir.RankedTensorType(x.type).element_type
  h = em.convert(em.const((rotation.matrix(size) * scale).astype(np.float32), em.f32),
                 element_type)
  dims = hlo.DotDimensionNumbers.get(lhs_batching_dimensions=[], rhs_batching_dimensions=[],
                                     lhs_contracting_dimensions=[rank - 1],
                                     rhs_contracting_dimensions=[0])
  precision = "DEFAULT" if exact or element_type != em.f32 else "HIGHEST"
  config = ir.ArrayAttr.get([hlo.PrecisionAttr.get(precision)] * 2)
  out = hlo.DotGeneralOp(build.tensor(_shape(flat), em.f32), flat, h, dims,
                         precision_config=config).result
  return em.reshape(out, shape)  # f32
