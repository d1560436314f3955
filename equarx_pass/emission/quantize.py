"""Block-wise symmetric quantization: the NumPy model of what the rewrite emits.

This module builds no MLIR (its format objects, from formats/, also hold their
emitters, so importing it imports JAX's MLIR bindings). `quantize_emit.py` emits
exactly these operations, in this order, so the program's bits can be compared with this model (tests/test_ring_model.py
and the end-to-end tests).  What differs between formats (the scale from the absmax,
values to codes and back, the scale's bytes) is the format object's (formats/); this
is the block codec around it: blocks, the absmax, the clamp, int4 nibble pairing.

Symmetric absmax, one scale per block of B values, for a format whose largest code is
QMAX (int8: 127, int4: 7, fp8 e4m3: 448, fp8 e5m2: 57344; mxint8 has its own
power-of-two scales, formats/mx.py):
  Qp1 (block metadata):  amax = max|x| (NaN counted as inf),  scale = amax * f32(1/QMAX)
  Qp2 (scale and cast):  v = clamp(x * min(f32(1 / safe), FLT_MAX), -QMAX, QMAX)
                          where safe = scale if scale > 0 else 1
                          int:  q = round_half_even(v) as int8 (int4: two per byte,
                                see pack_int4)
                          fp8:  q = v converted to fp8 (round to nearest even)
  Dq:                    x' = f32(q) * scale

The min with FLT_MAX keeps 1/safe finite when a scale is tiny, so a zero value
never becomes 0 * inf = NaN.

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
by at most the block absmaxes involved, far inside the error bound's slack (ring.error_bound).

Why `safe`: a block of zeros has scale 0 and 0/0 would be NaN; with safe = 1 the
block quantizes to q = 0 and dequantizes to exactly 0.  A non-finite block has a
non-finite scale (NaN or Inf), so every dequantized value of it is non-finite
(q * NaN = NaN, 0 * Inf = NaN, q * Inf = +-Inf): never a finite wrong value.
"""

from __future__ import annotations

import numpy as np

from equarx_pass.emission.formats import INT8, Format


def block_amax(x: np.ndarray, block_size: int) -> np.ndarray:
  """Qp1's reduction: each block's absmax, f32 [..., blocks] (last axis in blocks)."""
  x = np.asarray(x, np.float32)
  blocks = x.reshape(x.shape[:-1] + (x.shape[-1] // block_size, block_size))
  # NaN counts as +inf: XLA:CPU may run a large max-reduction in a kernel
  # (YNNPACK) whose max drops NaN, but every max keeps an inf; an infinite scale
  # makes every dequantized value of the block non-finite all the same.
  magnitude = np.where(np.isnan(blocks), np.float32(np.inf), np.abs(blocks))
  amax: np.ndarray = np.max(magnitude, axis=-1)
  return amax


def _scaled(x: np.ndarray, block_size: int, fmt: Format) -> tuple[np.ndarray, np.ndarray]:
  """Qp1 and the scale-and-clamp half of Qp2: (v f32 [..., blocks, B], scale)."""
  x = np.asarray(x, np.float32)
  scale, recip = fmt.scales(block_amax(x, block_size))
  blocks = x.reshape(scale.shape + (block_size,))
  with np.errstate(invalid="ignore", over="ignore"):
    v = (blocks * recip[..., None]).astype(np.float32)
    v = np.clip(v, np.float32(-fmt.qmax), np.float32(fmt.qmax))
  return v, scale


def pairs_row_halves(block_size: int, row: int) -> bool:
  """Whether int4 rows of `row` values pair their two halves: an even number of blocks,
  so each half is whole blocks (the emitter then carries the halves apart)."""
  return (row // block_size) % 2 == 0


def nibble_group(block_size: int, row: int) -> int:
  """The int4 pairing group of rows of `row` values (a multiple of the block).

  The whole row when it holds an even number of blocks: its two halves are then
  whole blocks, each contiguous and with its own scales, and XLA:CPU vectorizes
  a ring step that reads them.  Otherwise the block, which is then even (a row of
  an odd number of odd blocks has an odd number of values: no int4 layout makes
  one; scheme.py refuses the flags that would).
  """
  return row if pairs_row_halves(block_size, row) else block_size


def pack_int4(q: np.ndarray, group: int) -> np.ndarray:
  """int8 codes in [-8, 7] [..., S] -> bytes [..., S/2], S a multiple of `group`.

  Within each group of G values along the last axis, value j goes to the low
  nibble and value j + G/2 to the high nibble of byte j: both halves of a group
  are contiguous, so packing and unpacking are slices and broadcasts, not the
  stride-2 interleave that neighbouring pairs need (the int4 ring spent its
  extra time there on XLA:CPU).  quantize pairs within nibble_group (the two
  halves of a row, as a rule); the calibrated scheme within a whole chunk row.
  """
  q = np.asarray(q, np.int8)
  halves = q.reshape(q.shape[:-1] + (q.shape[-1] // group, 2, group // 2)).astype(np.int32)
  packed = (halves[..., 0, :] & 0xF) | (halves[..., 1, :] << 4)
  return packed.astype(np.uint8).view(np.int8).reshape(q.shape[:-1] + (q.shape[-1] // 2,))


def unpack_int4(codes: np.ndarray, group: int) -> np.ndarray:
  """pack_int4's inverse: bytes [..., S/2] -> int8 [..., S], each nibble sign-extended."""
  codes = np.asarray(codes, np.int8)
  halves = codes.reshape(codes.shape[:-1] + (codes.shape[-1] * 2 // group, 1, group // 2))
  low = (halves.astype(np.int32) << 28) >> 28  # sign-extend the low nibble
  high = halves.astype(np.int32) >> 4  # arithmetic shift: the high one
  both = np.concatenate([low, high], axis=-2)
  return both.astype(np.int8).reshape(codes.shape[:-1] + (codes.shape[-1] * 2,))


def quantize(x: np.ndarray, block_size: int, fmt: Format = INT8) -> tuple[np.ndarray, np.ndarray]:
  """Qp1 + Qp2: (codes, scales f32 [..., blocks]).

  Codes are int8: one per value (int8, fp8 bits), or for int4 two per byte,
  packed by pack_int4 within groups of nibble_group(block_size, S), along the last axis
  (S values).  The int4 pairing depends on S: quantize a whole row at once, as the
  emitter does (a [N, S] array is N rows), and decode it whole (codes_to_f32).
  """
  x = np.asarray(x, np.float32)
  v, scale = _scaled(x, block_size, fmt)
  q = fmt.encode(v).reshape(x.shape)
  if fmt.bits == 4:
    q = pack_int4(q, nibble_group(block_size, x.shape[-1]))
  return q, scale


def codes_to_f32(codes: np.ndarray, fmt: Format, block_size: int) -> np.ndarray:
  """Unpack codes (int8 array, as quantize made them with this block size) into
  f32 code values, one per value."""
  codes = np.asarray(codes, np.int8)
  if fmt.bits == 4:
    codes = unpack_int4(codes, nibble_group(block_size, 2 * codes.shape[-1]))
  return fmt.decode(codes)


def dequantize(q: np.ndarray, scale: np.ndarray, block_size: int, fmt: Format = INT8) -> np.ndarray:
  """Dq: f32(q) * scale, block-wise; returns f32 with one value per code value."""
  values = codes_to_f32(q, fmt, block_size)
  blocks = values.reshape(scale.shape + (block_size,))
  with np.errstate(invalid="ignore", over="ignore"):
    out = blocks * scale[..., None].astype(np.float32)
  return out.astype(np.float32).reshape(values.shape)


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
