"""Integer codes: int8 (the paper's) and int4, symmetric, round half to even."""

from __future__ import annotations

import dataclasses

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass.formats.base import Format
from equarx_pass.hlo_builder import Emitter


@dataclasses.dataclass(frozen=True)
class IntegerFormat(Format):
  def encode(self, v: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
      # XLA converts NaN to 0 when casting to an integer; the NaN survives in the scale.
      return np.where(np.isnan(v), np.float32(0), np.rint(v)).astype(np.int8)

  def decode(self, codes: np.ndarray) -> np.ndarray:
    return np.asarray(codes, np.int8).astype(np.float32)

  def emit_encode(self, em: Emitter, clamped: ir.Value) -> ir.Value:
    return em.convert(hlo.RoundNearestEvenOp(clamped).result, em.i8)

  def emit_decode(self, em: Emitter, codes: ir.Value) -> ir.Value:
    return em.convert(codes, em.f32)


INT8 = IntegerFormat("int8", 8, 127, description="8-bit integer codes, one f32 scale per block")
INT4 = IntegerFormat(
  "int4", 4, 7, description="4-bit integer codes, two per byte, one f32 scale per block"
)
