"""The calibrated outlier-feature all-reduce: layout, scales and NumPy model.

This module builds no MLIR: outlier_emit.py emits these operations in this order, and
`reference` is the model the rewritten program equals bit for bit on XLA:CPU.

A site's operand is seen as a matrix [M, H]: M rows (every dimension but the
last, flattened) of H features (the last dimension).  A calibration run
(calibrate.py) recorded, per feature, the range (absmax) of every device's
operand and of the result.  From that, statically:
  outliers   the k = H // 64 features with the largest range (max over the
             devices); they travel as bf16
  in scale   per device and feature: range * f32(1/7); the other H - k features
             travel as int4 codes in [-7, 7], two per byte, no scale bytes
  out scale  per feature: the result's range * f32(1/7)
So a value costs (4 (H - k) + 16 k) / H bits: 4.19 for k = H / 64.

Two-shot, group of N ranks, rows padded with zeros to N chunks of R rows:
  quantize    every rank quantizes its N chunks with its own static scales
  all-to-all  rank r receives chunk r of every rank j (in group order)
  sum         acc = 0; acc = fma(code_j, in_scale[j], acc) for j = 0 .. N-1 (the
              sender's scales, indexed by group rank); bf16 outliers are
              converted to f32 and added in the same order
  quantize    the owned sum with the static output scales (outliers: to bf16)
  all-gather  and every rank dequantizes all N chunks (the same bits everywhere)

Static scales saturate: a value beyond its calibrated range is clamped to +-7
codes, so it comes back as +-range.  Non-finite values are not clamped: int4
code -8 (unused by the symmetric [-7, 7] range) marks a NaN or +-Inf and
dequantizes to NaN, so a non-finite input value makes its output value
non-finite (an Inf may come back as NaN), never a finite wrong one.  bf16
outlier features carry NaN and Inf as they are.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from equarx_pass.emission import quantize as qz
from equarx_pass.emission.formats.base import inverse, reciprocal

QMAX = 7  # int4 symmetric: codes -7 .. 7
NONFINITE_CODE = -8  # the unused int4 code: "this value was NaN or Inf"
FEATURES_PER_OUTLIER = 64  # k = H // 64 features stay in bf16


def outlier_count(features: int) -> int:
  return features // FEATURES_PER_OUTLIER


def outlier_features(ranges: np.ndarray, count: int) -> tuple[int, ...]:
  """The `count` features with the largest range, aggregated over devices by max.

  ranges: [devices, H].  Ties go to the lower feature index.  Sorted ascending.
  """
  aggregated = np.max(np.asarray(ranges, np.float64), axis=0)
  order = np.argsort(-aggregated, kind="stable")
  return tuple(sorted(int(i) for i in order[:count]))


@dataclasses.dataclass(frozen=True)
class OutlierLayout:
  """How a site's [M, H] operand splits into N chunks of R rows, and its features."""

  num_rows: int  # M
  features: int  # H
  group_size: int  # N
  rows: int  # R, rows per chunk
  outliers: tuple[int, ...]  # features sent as bf16, ascending

  @property
  def normal(self) -> tuple[int, ...]:
    """The features sent as int4, ascending."""
    hot = set(self.outliers)
    return tuple(f for f in range(self.features) if f not in hot)

  @property
  def permutation(self) -> np.ndarray:
    """Column order on the wire: int4 features first, then the bf16 ones."""
    return np.array(self.normal + self.outliers, np.int64)

  @property
  def padded_rows(self) -> int:
    return self.group_size * self.rows

  @property
  def code_bytes(self) -> int:
    """int4 codes of one chunk, two per byte."""
    return self.rows * len(self.normal) // 2

  @property
  def payload_bytes(self) -> int:
    """Bytes of one chunk on the wire: int4 codes, then the bf16 outliers."""
    return self.code_bytes + 2 * self.rows * len(self.outliers)

  @property
  def bits_per_value(self) -> float:
    return 8 * self.payload_bytes / (self.rows * self.features)

  def wire_bytes(self) -> int:
    """Bytes one rank sends: N-1 chunks in the all-to-all, N-1 in the all-gather."""
    return 2 * (self.group_size - 1) * self.payload_bytes


def rows_and_features(shape: Sequence[int]) -> tuple[int, int]:
  """A tensor as a matrix: (rows = product of every dimension but the last, features =
  the last dimension); a scalar is one row of one feature."""
  shape = tuple(int(d) for d in shape)
  if not shape:
    return 1, 1
  return int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]


def make_layout(shape: Sequence[int], group_size: int, outliers: Sequence[int]) -> OutlierLayout:
  """Rows = every dimension but the last; R = ceil(M / N), even when the int4 part
  of a row has an odd number of values (codes pack two per byte)."""
  num_rows, features = rows_and_features(shape)
  rows = max(1, -(-num_rows // group_size))
  if (features - len(outliers)) % 2 and rows % 2:
    rows += 1
  return OutlierLayout(num_rows, features, group_size, rows, tuple(sorted(outliers)))


def static_scales(ranges) -> tuple[np.ndarray, np.ndarray]:
  """(scale, reciprocal), f32: scale = range * f32(1/7); reciprocal =
  min(1 / safe, FLT_MAX), safe = scale where > 0, else 1 (quantize.py's Qp2).

  Both are constants of the emitted program, computed here once.  A feature
  whose range is 0 has scale 0: it always comes back as 0.
  """
  scale = (np.asarray(ranges, np.float32) * inverse(QMAX)).astype(np.float32)
  return scale, reciprocal(scale)


def quantize_static(x: np.ndarray, reciprocal: np.ndarray) -> np.ndarray:
  """f32 [..., F] -> int8 codes [..., F]: round(clamp(x * reciprocal, -7, 7)), and
  NONFINITE_CODE where x is NaN or +-Inf."""
  x = np.asarray(x, np.float32)
  with np.errstate(invalid="ignore", over="ignore"):
    v = np.clip((x * reciprocal).astype(np.float32), np.float32(-QMAX), np.float32(QMAX))
    q = np.rint(v)
  q = np.where(np.isfinite(x), q, np.float32(NONFINITE_CODE))
  return q.astype(np.int8)


def code_values(codes: np.ndarray) -> np.ndarray:
  """int8 codes -> f32 code values, NaN for NONFINITE_CODE."""
  codes = np.asarray(codes, np.int8)
  return np.where(codes == NONFINITE_CODE, np.float32(np.nan), codes.astype(np.float32)).astype(
    np.float32
  )


def to_bf16(x: np.ndarray) -> np.ndarray:
  import ml_dtypes

  return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16)


@dataclasses.dataclass(frozen=True)
class GroupScales:
  """The static numbers of one site for one group, ranks in group order."""

  in_ranges: np.ndarray  # [N, H]: each rank's operand range per feature
  out_ranges: np.ndarray  # [H]: the result's range per feature
  outliers: tuple[int, ...]


def reference(
  inputs: Sequence[np.ndarray], scales: GroupScales, out_dtype=None
) -> list[np.ndarray]:
  """Per-rank results of the calibrated two-shot over one group, ranks in group order.

  inputs[r]: rank r's operand (any shape, last dimension = features, all equal).
  """
  n = len(inputs)
  shape = np.shape(inputs[0])
  out_dtype = out_dtype or np.asarray(inputs[0]).dtype
  layout = make_layout(shape, n, scales.outliers)
  perm = layout.permutation
  k = len(layout.outliers)
  hn = layout.features - k
  rows = layout.rows
  in_ranges = np.asarray(scales.in_ranges, np.float32)[:, perm[:hn]]
  in_scale, in_recip = static_scales(in_ranges)
  out_scale, out_recip = static_scales(np.asarray(scales.out_ranges, np.float32)[perm[:hn]])

  codes, hot = [], []
  for r in range(n):
    x = np.zeros((layout.padded_rows, layout.features), np.float32)
    x[: layout.num_rows] = np.asarray(inputs[r], np.float32).reshape(layout.num_rows, -1)
    x = x[:, perm]
    codes.append(quantize_static(x[:, :hn], in_recip[r]))
    hot.append(to_bf16(x[:, hn:]))

  own_codes, own_hot = [], []
  for c in range(n):
    chunk = slice(c * rows, (c + 1) * rows)
    acc = np.zeros((rows, hn), np.float32)
    acc_hot = np.zeros((rows, k), np.float32)
    for j in range(n):
      acc = qz.fused_multiply_add(code_values(codes[j][chunk]), in_scale[j], acc)
      acc_hot = (acc_hot + hot[j][chunk].astype(np.float32)).astype(np.float32)
    own_codes.append(quantize_static(acc, out_recip))
    own_hot.append(to_bf16(acc_hot))

  with np.errstate(invalid="ignore", over="ignore"):
    normal = (code_values(np.concatenate(own_codes)) * out_scale).astype(np.float32)
  values = np.concatenate([normal, np.concatenate(own_hot).astype(np.float32)], axis=1)
  out = np.empty_like(values)
  out[:, perm] = values
  flat = out[: layout.num_rows].reshape(-1)
  with np.errstate(over="ignore", invalid="ignore"):
    result = flat.astype(out_dtype).reshape(shape)
  return [result.copy() for _ in range(n)]


def clipped_range(ranges, mean_squares, clip: float) -> np.ndarray:
  """min(range, clip x rms) per feature; clip = 0 keeps the range (the absmax).

  A static int4 grid spread over the absmax wastes most of its 15 levels on
  rare tails; for Gaussian data the mean squared error of a 15-level uniform
  quantizer is smallest near 2.55 sigma (Banner et al., ACIQ).  Values beyond
  the clipped range saturate, like values beyond the calibrated absmax.
  """
  ranges = np.asarray(ranges, np.float64)
  if not clip:
    return ranges
  return np.minimum(ranges, clip * np.sqrt(np.asarray(mean_squares, np.float64)))


def ema_update(previous, batch, decay: float):
  """Exponential moving average of per-batch statistics (the first batch starts it)."""
  batch = np.asarray(batch, np.float64)
  if previous is None:
    return batch
  return decay * np.asarray(previous, np.float64) + (1 - decay) * batch
