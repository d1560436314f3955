"""mxint8: int8 codes with a shared power-of-two scale per 32 values, one byte on the wire.

The OCP Microscaling (MX) idea for 8-bit integers: a block of 32 values shares an
E8M0 scale, an exponent byte (2^(E - 127); 255 is NaN).  Here the scale is the
smallest power of two at or above int8's scale, amax * f32(1/127), so the absmax is
at most 127 codes and no value saturates (the OCP rule, 2^(floor(log2 amax) - 6),
clips values in the top half code step to 127):

  t     = amax * f32(1/127)            (NaN counts as inf, quantize.block_amax)
  E     = 255 if t is inf, else clamp(exponent field of t, +1 if t is not a power of
          two, to [1, MAX_EXPONENT])
  scale = 2^(E - 127)  (E = 255: NaN)      reciprocal = 2^(127 - E)  (E = 255: 0)
  code  = round_half_even(clamp(x * reciprocal, -127, 127))

MAX_EXPONENT = 248 keeps every code finite: a block within 1% of the f32 maximum (absmax
above 127 * 2^121) saturates at 127 codes of 2^121, an error of at most one step, where
a scale of 2^122 would round its largest values up to 2^128 = inf.
Both are normal f32 for every finite amax, so scaling is exact and the
error is at most half a code step, as int8's; the step is up to twice int8's (a power
of two at or above amax / 127), the price of the one-byte scale.  Per value: 8 bits +
8 / 32 = 8.25, as int8 with one f32 scale per 128 values, with blocks four times
smaller.  A non-finite block has a NaN scale, so all of its dequantized values are
NaN: never a finite wrong value.  Codes are int8's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass.emission.formats.base import inverse
from equarx_pass.emission.formats.integer import IntegerFormat
from equarx_pass.ir.hlo_builder import Emitter, shape_of

NAN_EXPONENT = 255
MAX_EXPONENT = 248  # the largest finite scale, 2^121 (see above)
QUIET_NAN_BITS = 0x7FC00000
MANTISSA_BITS = 0x7FFFFF


def _exponents(amax: np.ndarray) -> np.ndarray:
  """E, int32, from f32 absmaxes (>= 0 or inf)."""
  with np.errstate(over="ignore"):
    t = (np.asarray(amax, np.float32) * inverse(127)).astype(np.float32)
  bits = t.view(np.int32)
  e = ((bits >> 23) & 0xFF) + ((bits & MANTISSA_BITS) != 0)
  return np.where(e == NAN_EXPONENT, NAN_EXPONENT, np.clip(e, 1, MAX_EXPONENT)).astype(np.int32)


def _power_of_two(exponent: np.ndarray, nan_exponent_bits: int) -> np.ndarray:
  """f32 2^(exponent - 127), or the given bits where exponent is 255."""
  bits = np.where(exponent == NAN_EXPONENT, nan_exponent_bits, exponent << 23)
  return bits.astype(np.int32).view(np.float32)


def _emit_power_of_two(em: Emitter, exponent: ir.Value, nan_exponent_bits: int) -> ir.Value:
  """_power_of_two, emitted: i32 exponents -> f32."""
  shape = shape_of(exponent)
  is_nan = hlo.CompareOp(
    exponent, em.splat(NAN_EXPONENT, shape, em.i32), hlo.ComparisonDirectionAttr.get("EQ")
  ).result
  shifted = hlo.ShiftLeftOp(exponent, em.splat(23, shape, em.i32)).result
  bits = hlo.SelectOp(is_nan, em.splat(nan_exponent_bits, shape, em.i32), shifted).result
  return em.bitcast(bits, shape, em.f32)


@dataclasses.dataclass(frozen=True)
class MxIntFormat(IntegerFormat):
  def scales(self, amax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    exponent = _exponents(amax)
    scale = _power_of_two(exponent, QUIET_NAN_BITS)
    reciprocal = _power_of_two(np.where(exponent == NAN_EXPONENT, 255, 254 - exponent), 0)
    return scale, reciprocal

  def emit_scales(self, em: Emitter, amax: ir.Value) -> tuple[ir.Value, ir.Value]:
    shape = shape_of(amax)

    def i32(value: int) -> ir.Value:
      return em.splat(value, shape, em.i32)

    t = hlo.MulOp(amax, em.splat(float(inverse(127)), shape, em.f32)).result
    bits = em.bitcast(t, shape, em.i32)
    e = hlo.AndOp(hlo.ShiftRightLogicalOp(bits, i32(23)).result, i32(0xFF)).result
    inexact = hlo.CompareOp(
      hlo.AndOp(bits, i32(MANTISSA_BITS)).result, i32(0), hlo.ComparisonDirectionAttr.get("NE")
    ).result
    up = hlo.AddOp(e, em.convert(inexact, em.i32)).result
    clamped = hlo.ClampOp(i32(1), up, i32(MAX_EXPONENT)).result
    is_nan = hlo.CompareOp(up, i32(NAN_EXPONENT), hlo.ComparisonDirectionAttr.get("EQ")).result
    exponent = hlo.SelectOp(is_nan, up, clamped).result
    return _emit_power_of_two(em, exponent, QUIET_NAN_BITS), _emit_power_of_two(
      em, hlo.SelectOp(is_nan, exponent, hlo.SubtractOp(i32(254), exponent).result).result, 0
    )

  def emit_wire_scales(self, em: Emitter, scale: ir.Value) -> ir.Value:
    """f32 scales -> their exponent bytes E (as int8 bits): the f32 exponent field."""
    shape = shape_of(scale)
    bits = em.bitcast(scale, shape, em.i32)
    exponent = hlo.AndOp(
      hlo.ShiftRightLogicalOp(bits, em.splat(23, shape, em.i32)).result,
      em.splat(0xFF, shape, em.i32),
    ).result
    u8 = ir.IntegerType.get_unsigned(8)
    return em.bitcast(em.convert(exponent, u8), shape, em.i8)

  def emit_scales_from_wire(self, em: Emitter, wire: ir.Value) -> ir.Value:
    shape = shape_of(wire)
    u8 = ir.IntegerType.get_unsigned(8)
    return _emit_power_of_two(em, em.convert(em.bitcast(wire, shape, u8), em.i32), QUIET_NAN_BITS)

  def emit_scale_bytes(self, em: Emitter, scale: ir.Value) -> ir.Value:
    (m,) = shape_of(scale)
    return em.reshape(self.emit_wire_scales(em, scale), (m, 1))

  def emit_scales_from_bytes(self, em: Emitter, data: ir.Value) -> ir.Value:
    return self.emit_scales_from_wire(em, em.reshape(data, (shape_of(data)[0],)))


MXINT8 = MxIntFormat(
  "mxint8",
  8,
  127,
  scale_bytes=1,
  block=32,
  description="8-bit integer codes, a shared power-of-two scale (one byte) per 32 values",
)
