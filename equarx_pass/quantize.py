"""Block-wise symmetric quantization: the NumPy model of what the rewrite emits.

No MLIR here. `build.py` emits exactly these operations, in this order, so the
program's bits can be compared with this model (tests/test_ring_model.py and
the end-to-end tests).

int8, symmetric absmax, one f32 scale per block of B values:
  Qp1 (block metadata):  amax = max|x|,  scale = amax * f32(1/127)
  Qp2 (scale and cast):  q = clamp(round_half_even(x * f32(1 / safe)), -127, 127)
                          where safe = scale if scale > 0 else 1
  Dq:                    x' = f32(q) * scale

Why a multiply by f32(1/127) and not a divide by 127: XLA rewrites a divide by a
constant into that multiply anyway, so writing it so makes every backend and the
model compute the same bits.  Likewise XLA's algebraic simplifier turns the
block-wise x / broadcast(safe) into x * broadcast(1 / safe) (one reciprocal per
block), which rounds differently from a true divide on exact ties (x / safe =
k + 1/2 happens often with bf16 inputs), so the model computes the reciprocal.

Subnormals: the model is IEEE arithmetic, but XLA:CPU runs f32 with subnormals
flushed to zero (and TPUs have none), so bits match the model only while no
scale or partial sum is subnormal: a block's absmax of 0 or at least about
127 * 2^-126 (1.5e-36).  Below that the program's values differ from the model's
by at most the block absmaxes involved, far inside ring.error_bound's slack.

Why `safe`: a block of zeros has scale 0 and 0/0 would be NaN; with safe = 1 the
block quantizes to q = 0 and dequantizes to exactly 0.  A non-finite block has a
non-finite scale (NaN or Inf), so every dequantized value of it is non-finite
(q * NaN = NaN, 0 * Inf = NaN, q * Inf = +-Inf): never a finite wrong value.
"""

from __future__ import annotations

import dataclasses

import numpy as np

INT8_MAX = 127


def inverse(qmax: int) -> np.float32:
  """f32(1/qmax): the constant the scale is multiplied by."""
  return np.float32(1.0 / qmax)


@dataclasses.dataclass(frozen=True)
class Int8Format:
  """int8 payload, one f32 scale per block; the scale bytes ride with the data."""
  name: str = "int8"
  qmax: int = INT8_MAX
  scale_bytes: int = 4

  def payload_bytes(self, num_values: int, num_blocks: int) -> int:
    return num_values + self.scale_bytes * num_blocks


FORMATS = {"int8": Int8Format()}


def block_scales(x: np.ndarray, block_size: int, qmax: int = INT8_MAX) -> np.ndarray:
  """Qp1: one f32 scale per block of the last axis (length divisible by block_size)."""
  x = np.asarray(x, np.float32)
  blocks = x.reshape(x.shape[:-1] + (x.shape[-1] // block_size, block_size))
  with np.errstate(invalid="ignore"):
    # max of |x| with NaN propagating, like stablehlo.maximum on XLA.
    amax = np.max(np.abs(blocks), axis=-1)
  return (amax * inverse(qmax)).astype(np.float32)


def quantize(x: np.ndarray, block_size: int, qmax: int = INT8_MAX):
  """Qp1 + Qp2: returns (q int8 with x's shape, scales f32 [..., blocks])."""
  x = np.asarray(x, np.float32)
  scale = block_scales(x, block_size, qmax)
  with np.errstate(invalid="ignore"):
    safe = np.where(scale > 0, scale, np.float32(1)).astype(np.float32)
  blocks = x.reshape(scale.shape + (block_size,))
  with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
    # 1 / safe overflows to inf for a scale below 2^-128: the block's non-zero
    # values then clamp to +-127, an error below 127 * 2^-128 in absolute terms.
    reciprocal = (np.float32(1) / safe).astype(np.float32)
    q = np.rint(blocks * reciprocal[..., None]).astype(np.float32)
    q = np.clip(q, -qmax, qmax)
    # XLA converts NaN to 0 when casting to an integer; the NaN survives in the scale.
    q = np.where(np.isnan(q), np.float32(0), q)
  return q.astype(np.int8).reshape(x.shape), scale


def dequantize(q: np.ndarray, scale: np.ndarray, block_size: int) -> np.ndarray:
  """Dq: f32(q) * scale, block-wise; returns f32 with q's shape."""
  blocks = np.asarray(q).astype(np.float32).reshape(scale.shape + (block_size,))
  with np.errstate(invalid="ignore", over="ignore"):
    out = blocks * scale[..., None].astype(np.float32)
  return out.astype(np.float32).reshape(np.shape(q))


def fused_multiply_add(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
  """f32 a * b + c rounded once, as the FMA that XLA contracts dequantize + add into.

  a * b is exact in f64 (24 + 24 < 53 bits); the f64 sum is made round-to-odd
  (if it was inexact and its last bit is even, step one ulp towards the exact
  value), and a round-to-odd f64 rounds to f32 exactly like the exact sum would
  (53 >= 2 * 24 + 2).
  """
  a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
  with np.errstate(invalid="ignore", over="ignore"):
    p = a * b
    s = p + c
    # TwoSum: the exact rounding error of s = p + c.
    bp = s - c
    err = (p - bp) + (c - (s - bp))
    bits = s.view(np.int64)
    inexact = (err != 0) & np.isfinite(s) & ((bits & 1) == 0)
    toward = np.where(err > 0, np.inf, -np.inf)
    s = np.where(inexact, np.nextafter(s, toward), s)
    return s.astype(np.float32)
