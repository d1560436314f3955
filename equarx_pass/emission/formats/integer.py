"""Integer codes: int8 (the paper's) and int4, symmetric, round half to even; or, with
--equarx_rounding=stochastic, rounded down after adding a uniform draw in [0, 1).

The draw is stateless, so the pass needs no new inputs (no key, no step counter): a
hash (murmur3's 32-bit finalizer) of the value's own bits and its position in the
array being quantized, u = (hash >> 8) * 2^-24.  The same value at the same position
rounds the same way (so every run, and every rank that quantizes it, agrees); values
that change from step to step draw afresh.  E[floor(v + u)] = v: no bias.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass.emission.formats.base import Format
from equarx_pass.ir.hlo_builder import Emitter, shape_of, tensor

GOLDEN = 0x9E3779B9  # spreads consecutive positions over the 32 bits
MIX_1, MIX_2 = 0x85EBCA6B, 0xC2B2AE35  # murmur3's finalizer


def uniform_draws(v: np.ndarray) -> np.ndarray:
  """f32 in [0, 1), one per value of v (f32), from its bits and its flat position."""
  bits = np.ascontiguousarray(v, np.float32).view(np.uint32).reshape(-1)
  h = bits ^ (np.arange(bits.size, dtype=np.uint32) * np.uint32(GOLDEN))
  h ^= h >> np.uint32(16)
  h *= np.uint32(MIX_1)
  h ^= h >> np.uint32(13)
  h *= np.uint32(MIX_2)
  h ^= h >> np.uint32(16)
  return ((h >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)).reshape(np.shape(v))


def emit_uniform_draws(em: Emitter, v: ir.Value) -> ir.Value:
  """uniform_draws, emitted on f32 `v`: the same draws."""
  shape = shape_of(v)
  u32 = ir.IntegerType.get_unsigned(32)
  size = int(np.prod(shape, dtype=np.int64))

  def const(value: int) -> ir.Value:
    return em.splat(value, shape, u32)

  index = em.reshape(hlo.IotaOp(tensor((size,), u32), 0).result, shape)
  h = hlo.XorOp(em.bitcast(v, shape, u32), hlo.MulOp(index, const(GOLDEN)).result).result
  for shift, factor in ((16, MIX_1), (13, MIX_2), (16, None)):
    h = hlo.XorOp(h, hlo.ShiftRightLogicalOp(h, const(shift)).result).result
    if factor is not None:
      h = hlo.MulOp(h, const(factor)).result
  top = em.convert(hlo.ShiftRightLogicalOp(h, const(8)).result, em.f32)
  return hlo.MulOp(top, em.splat(2.0**-24, shape, em.f32)).result  # type: ignore[no-any-return]


@dataclasses.dataclass(frozen=True)
class IntegerFormat(Format):
  stochastic: bool = False  # round with uniform_draws instead of to nearest even

  def encode(self, v: np.ndarray) -> np.ndarray:
    if self.stochastic:
      with np.errstate(invalid="ignore", over="ignore"):
        v = np.floor((v + uniform_draws(v)).astype(np.float32))
    with np.errstate(invalid="ignore"):
      # XLA converts NaN to 0 when casting to an integer; the NaN survives in the scale.
      return np.where(np.isnan(v), np.float32(0), np.rint(v)).astype(np.int8)

  def decode(self, codes: np.ndarray) -> np.ndarray:
    return np.asarray(codes, np.int8).astype(np.float32)

  def emit_encode(self, em: Emitter, clamped: ir.Value) -> ir.Value:
    if self.stochastic:
      noisy = hlo.AddOp(clamped, emit_uniform_draws(em, clamped)).result
      return em.convert(hlo.FloorOp(noisy).result, em.i8)
    return em.convert(hlo.RoundNearestEvenOp(clamped).result, em.i8)

  def emit_decode(self, em: Emitter, codes: ir.Value) -> ir.Value:
    return em.convert(codes, em.f32)


INT8 = IntegerFormat("int8", 8, 127, description="8-bit integer codes, one f32 scale per block")
INT4 = IntegerFormat(
  "int4", 4, 7, description="4-bit integer codes, two per byte, one f32 scale per block"
)
