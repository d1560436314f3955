"""fp8 codes (e4m3fn, e5m2): the scaled value converted to fp8, round to nearest even."""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_dtypes
import numpy as np
from jax.extend.mlir import ir

from equarx_pass.emission.formats.base import Format
from equarx_pass.ir.hlo_builder import Emitter, shape_of


@dataclasses.dataclass(frozen=True)
class Fp8Format(Format):
  fp8: str = ""  # the ml_dtypes name

  @property
  def numpy_type(self) -> Any:
    return getattr(ml_dtypes, self.fp8)

  def mlir_type(self) -> ir.Type:
    if self.fp8 == "float8_e4m3fn":
      return ir.Float8E4M3FNType.get()
    return ir.Float8E5M2Type.get()

  def encode(self, v: np.ndarray) -> np.ndarray:
    return np.asarray(v, np.float32).astype(self.numpy_type).view(np.int8)

  def decode(self, codes: np.ndarray) -> np.ndarray:
    values: np.ndarray = np.asarray(codes, np.int8).view(self.numpy_type).astype(np.float32)
    return values

  def emit_encode(self, em: Emitter, clamped: ir.Value) -> ir.Value:
    return em.bitcast(em.convert(clamped, self.mlir_type()), shape_of(clamped), em.i8)

  def emit_decode(self, em: Emitter, codes: ir.Value) -> ir.Value:
    return em.convert(em.bitcast(codes, shape_of(codes), self.mlir_type()), em.f32)


FP8_E4M3 = Fp8Format(
  "fp8_e4m3", 8, 448.0, description="fp8 e4m3fn codes, one f32 scale per block", fp8="float8_e4m3fn"
)
FP8_E5M2 = Fp8Format(
  "fp8_e5m2", 8, 57344.0, description="fp8 e5m2 codes, one f32 scale per block", fp8="float8_e5m2"
)
