"""Block-wise Walsh-Hadamard rotation: the NumPy model of what build.py emits.

Rotating every rank's input with the same orthonormal matrix H before the
quantized all-reduce, and rotating the result back, gives the same all-reduce
(sum(H x_i) = H sum(x_i)) while spreading an outlier over its whole rotation
block, so it no longer sets the scale for the values that share its block.

H is the Sylvester Hadamard matrix of size R (a power of two), scaled by
1/sqrt(R): symmetric and orthonormal, so it is its own inverse.  It is applied
as log2(R) butterfly stages of f32 adds and subtracts (no matmul), then one
multiply by f32(1/sqrt(R)); the emitted ops follow exactly this order, so the
model and the program agree bit for bit.
"""

from __future__ import annotations

import numpy as np

NONE = "none"
HADAMARD = "hadamard"
ROTATIONS = (NONE, HADAMARD)


def check_size(size: int) -> None:
  if size < 2 or size & (size - 1):
    raise ValueError(f"rotation size must be a power of two >= 2, got {size}")


def norm(size: int) -> np.float32:
  return np.float32(1.0 / np.sqrt(size))


def stages(size: int) -> list[int]:
  """Half-widths of the butterfly stages: 1, 2, 4, ..., size/2."""
  check_size(size)
  return [1 << k for k in range(size.bit_length() - 1)]


def butterflies(x: np.ndarray, size: int) -> np.ndarray:
  """sqrt(size) * H_size on each consecutive block of `size` values (no normalisation)."""
  x = np.asarray(x, np.float32).reshape(-1)
  if x.size % size:
    raise ValueError(f"{x.size} values do not split into blocks of {size}")
  for h in stages(size):
    pairs = x.reshape(-1, 2, h)
    a, b = pairs[:, 0, :], pairs[:, 1, :]
    with np.errstate(over="ignore", invalid="ignore"):
      x = np.stack([a + b, a - b], axis=1).reshape(-1)
  return x


def hadamard(x: np.ndarray, size: int) -> np.ndarray:
  """H_size applied to each consecutive block of `size` values of a flat f32 vector."""
  with np.errstate(over="ignore", invalid="ignore"):
    return (butterflies(x, size) * norm(size)).astype(np.float32)


def dequantize_rotated(codes: np.ndarray, scale: np.ndarray, block: int, fmt,
                       size: int) -> np.ndarray:
  """Dq followed by the inverse rotation, done as H(q * s) = (H q) * s.

  Each rotation block lies inside one quantization block (size divides block),
  so its values share one scale: the butterflies run on the code values (for
  int8 and int4, sums of at most 127 * 4096 in magnitude: exact in f32), and
  one multiply by scale * norm finishes.  Besides being exact, it leaves no
  multiply feeding an add, so no backend can contract one into an FMA and the
  bits cannot depend on that choice.
  """
  from equarx_pass import quantize as qz
  code_values = qz.codes_to_f32(codes, fmt)
  blocks = butterflies(code_values, size).reshape(scale.shape + (block,))
  with np.errstate(over="ignore", invalid="ignore"):
    factor = (scale * norm(size)).astype(np.float32)
    return (blocks * factor[..., None]).astype(np.float32).reshape(code_values.shape)


def matrix(size: int) -> np.ndarray:
  """The dense orthonormal H (float64), for tests."""
  check_size(size)
  h = np.array([[1.0]])
  while h.shape[0] < size:
    h = np.block([[h, h], [h, -h]])
  return h / np.sqrt(size)
