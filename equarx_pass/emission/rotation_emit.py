"""The rotation of rotation.py, emitted: butterflies in the model's order, or one matmul.

hadamard / butterflies   the model's adds in the model's order (the same bits), the
                         flat forms' rotation and the tiled forms' on CPU
matmul                   one dot_general per tile with the +-1 (scaled) Hadamard matrix:
                         the tiled forms' forward rotation on TPU and GPU, and their
                         inverse rotation everywhere (exact on codes)
"""

from __future__ import annotations

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass.emission import rotation
from equarx_pass.ir.hlo_builder import Emitter, shape_of, tensor, while_loop


def butterflies(em: Emitter, x: ir.Value, size: int) -> ir.Value:
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

  def one_pass(y: ir.Value, radix: int) -> ir.Value:
    q = size // radix
    group = em.reshape(y, (blocks, q, radix))
    outs = [
      em.reshape(em.slice(group, (0, 0, j), (blocks, q, j + 1)), (blocks, 1, q))
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
    return em.reshape(em.concat(outs, 1), (blocks, size))

  y = em.reshape(x, (blocks, size))
  if k // 2 == 1:
    y = one_pass(y, 4)
  elif k // 2:
    y = while_loop(y, k // 2, lambda step, y_: one_pass(y_, 4))
  if k % 2:
    y = one_pass(y, 2)
  return em.reshape(y, (m,))


def hadamard(em: Emitter, x: ir.Value, size: int) -> ir.Value:
  """rotation.hadamard on a flat f32 vector: the exact signs / size, then the stages."""
  return butterflies(
    em, times_per_position(em, x, rotation.signs(size) * rotation.norm(size)), size
  )


def times_per_position(em: Emitter, x: ir.Value, factors: np.ndarray) -> ir.Value:
  """An f32 array times `factors` (f32 [size]) repeated along its flat order.  Where
  its last dimension is `size` no reshape (which a TPU may relayout)."""
  shape = shape_of(x)
  size = factors.shape[0]
  m = int(np.prod(shape, dtype=np.int64))
  rows = x if shape[-1] == size else em.reshape(x, (m // size, size))
  rows_shape = shape_of(rows)
  product = hlo.MulOp(
    rows,
    em.bcast(em.const(factors.astype(np.float32), em.f32), rows_shape, [len(rows_shape) - 1]),
  ).result
  return em.reshape(product, shape)


def matrix(em: Emitter, size: int, forward: bool, element_type: ir.Type) -> ir.Value:
  """matmul's right-hand side, a constant of `element_type`."""
  d = rotation.signs(size).astype(np.float64)
  h = rotation.matrix(size)
  values = d[:, None] * h * rotation.norm(size) if forward else h
  return em.convert(em.const(values.astype(np.float32), em.f32), element_type)


def matmul(
  em: Emitter,
  x: ir.Value,
  size: int,
  exact: bool,
  forward: bool,
  rhs: ir.Value | None = None,
) -> ir.Value:
  """The rotation (forward: (H / size) D; else D H) on each consecutive `size` values of
  x, as one dot_general over [count, size] with an f32 result.  exact: x holds code
  values (small integers), whose products and sums f32 holds exactly, so any precision
  gives the same bits; so do 16-bit floats (x's type).  Else (f32) HIGHEST, so no
  backend rounds x first.  `rhs`: the matrix from an earlier call with the same size,
  direction and x type (one constant in the module, not two)."""
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
  if rhs is None:
    rhs = matrix(em, size, forward, element_type)
  dims = hlo.DotDimensionNumbers.get(
    lhs_batching_dimensions=[],
    rhs_batching_dimensions=[],
    lhs_contracting_dimensions=[rank - 1],
    rhs_contracting_dimensions=[0],
  )
  precision = "DEFAULT" if exact or element_type != em.f32 else "HIGHEST"
  config = ir.ArrayAttr.get([hlo.PrecisionAttr.get(precision)] * 2)
  out = hlo.DotGeneralOp(
    tensor(shape_of(flat), em.f32), flat, rhs, dims, precision_config=config
  ).result
  return em.reshape(out, shape)  # f32
