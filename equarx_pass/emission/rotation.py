"""Block-wise Walsh-Hadamard rotation: the NumPy model of what rotation_emit.py emits.

Rotating every rank's input with the same orthonormal matrix H before the
quantized all-reduce, and rotating the result back, gives the same all-reduce
(sum(H x_i) = H sum(x_i)) while spreading an outlier over its whole rotation
block, so it no longer sets the scale for the values that share its block.

H is the Sylvester Hadamard matrix of size R (a power of two): H H = R I, and D a fixed
pseudo-random +-1 diagonal (`signs`).  The forward rotation is (H / R) D: a multiply by
the constant D / R, exact (a power of two and a sign), then log2(R) butterfly stages of
f32 adds and subtracts (no matmul).  The inverse is D H.  Scaling first
keeps every partial sum within max|x|, so nothing overflows however close to
the f32 maximum the inputs are.  The inverse D H is applied to the codes
(dequantize_rotated).  (H / R) D is orthogonal up to its scale, which absmax
quantization does not see: the errors are those of the orthonormal rotation.
The emitted ops follow exactly this order, so model and program agree bit for bit.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
  from equarx_pass.emission.formats import Format

NONE = "none"
HADAMARD = "hadamard"
ROTATIONS = (NONE, HADAMARD)


def check_size(size: int) -> None:
  if size < 2 or size & (size - 1):
    raise ValueError(f"rotation size must be a power of two >= 2, got {size}")


def norm(size: int) -> np.float32:
  """f32(1/size), exact: the forward rotation's scale."""
  return np.float32(1.0 / size)


@functools.cache
def signs(size: int) -> np.ndarray:
  """The fixed pseudo-random +-1 diagonal D (f32 [size]) applied before H: x -> H D x.

  Without it, data with a large common mean (sums of squares, norm statistics) puts the
  mean of each block into one coefficient, which then sets the block's scale, and every
  other coefficient is quantized relative to it: sqrt(size) times the error of no
  rotation.  With random signs the mean spreads like any other vector.  A fixed linear
  congruential sequence, so the model, every emitter and every NumPy version agree.
  """
  state, out = 0x2545F491, np.empty(size, np.float32)
  for i in range(size):
    state = (state * 1103515245 + 12345) & 0x7FFFFFFF
    out[i] = 1.0 if state >> 30 else -1.0
  # Cached (every rotated site asks for it twice): read-only, so no caller can change it.
  out.flags.writeable = False
  return out


def stages(size: int) -> list[int]:
  """Half-widths of the butterfly stages: 1, 2, 4, ..., size/2."""
  check_size(size)
  return [1 << k for k in range(size.bit_length() - 1)]


def butterflies(x: np.ndarray, size: int) -> np.ndarray:
  """H_size (entries +-1, no scale) on each consecutive block of `size` values."""
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
  """(H_size / size) D applied to each consecutive block of `size` values of a flat f32
  vector: one multiply by the constant D / size (exact: a power of two and a sign), then
  the butterflies."""
  x = np.asarray(x, np.float32).reshape(-1, size)
  with np.errstate(over="ignore", invalid="ignore", under="ignore"):
    scaled = (x * (signs(size) * norm(size))).astype(np.float32)
  return butterflies(scaled.reshape(-1), size)


def dequantize_rotated(
  codes: np.ndarray, scale: np.ndarray, block: int, fmt: Format, size: int
) -> np.ndarray:
  """Dq followed by the inverse rotation H, done as H(q * s) = (H q) * s.

  Each rotation block lies inside one quantization block (size divides block),
  so its values share one scale: the butterflies run on the code values (for
  int8 and int4, sums of at most 127 * 4096 in magnitude: exact in f32), and
  one multiply by the scale finishes.  Besides being exact, it leaves no
  multiply feeding an add, so no backend can contract one into an FMA and the
  bits cannot depend on that choice.
  """
  from equarx_pass.emission import quantize as qz

  code_values = qz.codes_to_f32(codes, fmt, block)
  # D H: the butterflies, then the signs (exact), then the scale.
  unsigned = butterflies(code_values, size).reshape(-1, size) * signs(size)
  blocks = unsigned.reshape(scale.shape + (block,))
  with np.errstate(over="ignore", invalid="ignore"):
    out: np.ndarray = (blocks * scale[..., None]).astype(np.float32)
    return out.reshape(code_values.shape)


def matrix(size: int) -> np.ndarray:
  """The dense H (float64, entries +-1; H H = size I), for tests."""
  check_size(size)
  h = np.array([[1.0]])
  while h.shape[0] < size:
    h = np.block([[h, h], [h, -h]])
  return h
