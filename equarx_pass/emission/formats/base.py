"""What every wire format is: codes of a few bits and one scale per block, both halves.

A format is one object.  Its NumPy half (`scales`, `encode`, `decode`) is the model
quantize.py composes into the block codec; its emitted half (`emit_*`) is the same
arithmetic in StableHLO, which quantize_emit.py composes the same way, so the program
equals the model bit for bit.  Which values share a block, how sub-byte codes pair in
a byte, and where scales travel are the codec's business, not the format's.

The absmax rule most formats share, for a largest code QMAX:
  scale = amax * f32(1/QMAX)      (XLA turns a divide by a constant into this multiply)
  reciprocal = min(f32(1 / safe), FLT_MAX), safe = scale if scale > 0 else 1
so a block of zeros quantizes to zeros, a tiny scale cannot make 0 * inf, and a
non-finite block (amax inf, or NaN counted as inf) has a non-finite scale, which makes
every dequantized value of it non-finite.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass.ir.hlo_builder import Emitter, shape_of

FLT_MAX = np.float32(np.finfo(np.float32).max)


def inverse(qmax: float) -> np.float32:
  """f32(1/qmax): the constant the scale is multiplied by."""
  return np.float32(1.0 / qmax)


def reciprocal(scale: np.ndarray) -> np.ndarray:
  """Qp2's multiplier, f32: min(1 / safe, FLT_MAX) with safe = scale where > 0, else 1
  (a zero block divides by 1 and stays 0; a tiny scale cannot make 0 * inf)."""
  scale = np.asarray(scale, np.float32)
  with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
    safe = np.where(scale > 0, scale, np.float32(1)).astype(np.float32)
    return np.minimum((np.float32(1) / safe).astype(np.float32), FLT_MAX).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Format:
  """A wire format: codes of `bits` bits (two per byte when 4), one scale per block of
  `scale_bytes` bytes riding with them.  Subclasses define encode and decode."""

  name: str
  bits: int  # 8, or 4 (two codes per byte)
  qmax: float  # largest code magnitude: values are clamped to [-qmax, qmax] before encode
  scale_bytes: int = 4  # one f32 per block
  block: int = 0  # values per scale when the format fixes it; 0: the policy's block size
  description: str = ""  # one line for --help

  def code_bytes(self, num_values: int) -> int:
    return num_values * self.bits // 8

  def payload_bytes(self, num_values: int, num_blocks: int) -> int:
    return self.code_bytes(num_values) + self.scale_bytes * num_blocks

  # --- the NumPy model ---------------------------------------------------------

  def scales(self, amax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each block's f32 (scale, reciprocal) from its absmax: the absmax rule."""
    amax = np.asarray(amax, np.float32)
    scale = (amax * inverse(self.qmax)).astype(np.float32)
    return scale, reciprocal(scale)

  def encode(self, v: np.ndarray) -> np.ndarray:
    """Scaled, clamped f32 values -> int8 codes (the code bits), one per value."""
    raise NotImplementedError

  def decode(self, codes: np.ndarray) -> np.ndarray:
    """int8 codes, one per value -> their f32 values."""
    raise NotImplementedError

  # --- the emitted codec -------------------------------------------------------

  def emit_scales(self, em: Emitter, amax: ir.Value) -> tuple[ir.Value, ir.Value]:
    """scales(), emitted: f32 amax [...] -> (scale, reciprocal), f32 [...]."""
    lead = shape_of(amax)
    scale = hlo.MulOp(amax, em.splat(float(inverse(self.qmax)), lead, em.f32)).result
    positive = hlo.CompareOp(
      scale, em.splat(0, lead, em.f32), hlo.ComparisonDirectionAttr.get("GT")
    ).result
    safe = hlo.SelectOp(positive, scale, em.splat(1, lead, em.f32)).result
    recip = hlo.MinOp(
      hlo.DivOp(em.splat(1, lead, em.f32), safe).result, em.splat(float(FLT_MAX), lead, em.f32)
    ).result
    return scale, recip

  def emit_encode(self, em: Emitter, clamped: ir.Value) -> ir.Value:
    """encode(), emitted: f32 -> int8 codes of the same shape."""
    raise NotImplementedError

  def emit_decode(self, em: Emitter, codes: ir.Value) -> ir.Value:
    """decode(), emitted: int8 codes -> f32 of the same shape."""
    raise NotImplementedError

  def emit_wire_scales(self, em: Emitter, scale: ir.Value) -> ir.Value:
    """f32 scales [...] -> what travels: here the f32 scales themselves."""
    return scale

  def emit_scales_from_wire(self, em: Emitter, wire: ir.Value) -> ir.Value:
    """emit_wire_scales undone: f32 scales."""
    return wire

  def emit_scale_bytes(self, em: Emitter, scale: ir.Value) -> ir.Value:
    """f32 scales [m] -> their bytes, int8 [m, scale_bytes] (a flat payload's tail)."""
    (m,) = shape_of(scale)
    return em.bitcast(self.emit_wire_scales(em, scale), (m, self.scale_bytes), em.i8)

  def emit_scales_from_bytes(self, em: Emitter, data: ir.Value) -> ir.Value:
    """emit_scale_bytes undone: int8 [m, scale_bytes] -> f32 scales [m]."""
    m = shape_of(data)[0]
    return em.bitcast(data, (m,), em.f32)
