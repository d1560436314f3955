"""The kernel form's packed chunks: a chunk's int8 codes and its f32 scales in one int8
array, so that one collective-permute moves both (quantize_kernel.KernelExchange.PERMUTES).

The kernels run over steps of S tiles of (8, 128) codes, S a multiple of 32.  A packed
chunk is its steps one after the other, each S tiles of codes, then S / 32 tiles of the
step's S * 8 scales as bytes:

  dense[g, 8 (i % 16) + r] = bits of the scale of row r of tile 16 g + i   (int32 [S / 16, 128])
  bytes = concat(dense & 255, dense >> 8 & 255, dense >> 16 & 255, dense >> 24)   ([S / 4, 128])
  as int8 (two's complement), [S / 32, 8, 128]

Each 16 tiles' 128 scales make one row of lanes, so the bytes fill whole tiles.  The
kernels move the scales into lanes and back on their bits as integers (a where over a
broadcast, then a sum with zeros: the diagonal of quantize_kernel.quantize_tiles), so no
float operation touches them (XLA:CPU flushes subnormals in float selects and maxima).
pack and unpack are the kernels' own jnp code; pack_model and unpack_model are the
layout in NumPy.
"""

from __future__ import annotations

import numpy as np

ROWS, LANES = 8, 128
GROUP = LANES // ROWS  # tiles whose scales make one row of lanes
STEP_MULTIPLE = 32  # tiles of a step whose scale bytes fill whole (8, 128) tiles


def scale_tiles(step: int) -> int:
  """(8, 128) int8 tiles of scale bytes after each step of `step` tiles of codes."""
  assert step % STEP_MULTIPLE == 0, step
  return step // STEP_MULTIPLE


def _spots(jax, step: int):
  """Where row r of tile t lies in its group's row of lanes: lane 8 (t % 16) + r."""
  jnp, lax = jax.numpy, jax.lax
  shape = (step, ROWS, LANES)
  tile = lax.broadcasted_iota(jnp.int32, shape, 0)
  row = lax.broadcasted_iota(jnp.int32, shape, 1)
  lane = lax.broadcasted_iota(jnp.int32, shape, 2)
  return lane == jnp.bitwise_and(tile, GROUP - 1) * ROWS + row


def pack(jax, scales):
  """f32 [S, 8] -> int8 [S / 32, 8, 128], in a kernel (jnp)."""
  jnp, lax = jax.numpy, jax.lax
  step = scales.shape[0]
  bits = lax.bitcast_convert_type(scales, jnp.int32)
  shape = (step, ROWS, LANES)
  spread = jnp.where(_spots(jax, step), jnp.broadcast_to(bits[..., None], shape), 0)
  dense = jnp.sum(jnp.sum(spread, axis=1).reshape(step // GROUP, GROUP, LANES), axis=1)
  rows = [jnp.bitwise_and(lax.shift_right_logical(dense, 8 * k), 255) for k in range(4)]
  b = jnp.concatenate(rows, axis=0)
  b = jnp.where(b > 127, b - 256, b).reshape(scale_tiles(step), ROWS, LANES)
  # Through f32, exact for -128 .. 127: Mosaic converts floats to int8.
  return b.astype(jnp.float32).astype(jnp.int8)


def unpack(jax, packed, step: int):
  """pack undone: int8 [S / 32, 8, 128] -> f32 [S, 8, 1], the same bits."""
  jnp, lax = jax.numpy, jax.lax
  w = jnp.bitwise_and(packed.astype(jnp.int32).reshape(step // 4, LANES), 255)
  q = step // GROUP
  dense = w[:q]
  for k in range(1, 4):
    dense = jnp.bitwise_or(dense, lax.shift_left(w[k * q : (k + 1) * q], 8 * k))
  shape = (step, ROWS, LANES)
  spread = jnp.broadcast_to(dense[:, None, None, :], (q, GROUP, ROWS, LANES)).reshape(shape)
  bits = jnp.sum(jnp.where(_spots(jax, step), spread, 0), axis=-1, keepdims=True)
  return lax.bitcast_convert_type(bits, jnp.float32)


def pack_model(codes: np.ndarray, scales: np.ndarray, step: int) -> np.ndarray:
  """Codes int8 [T, 8, 128] and scales f32 [T, 8] -> the packed chunk int8
  [T + T / 32, 8, 128], T a multiple of `step`."""
  tiles = codes.shape[0]
  extra = scale_tiles(step)
  out = []
  for first in range(0, tiles, step):
    bits = scales[first : first + step].view(np.uint32).reshape(step // GROUP, LANES)
    rows = [(bits >> (8 * k)) & 255 for k in range(4)]
    data = np.concatenate(rows).astype(np.uint8).view(np.int8)
    out += [codes[first : first + step], data.reshape(extra, ROWS, LANES)]
  return np.concatenate(out)


def unpack_model(packed: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
  """pack_model undone: (codes int8 [T, 8, 128], scales f32 [T, 8])."""
  extra = scale_tiles(step)
  blocks = packed.reshape(-1, step + extra, ROWS, LANES)
  codes = blocks[:, :step].reshape(-1, ROWS, LANES)
  data = blocks[:, step:].reshape(-1, 4, step // GROUP, LANES).view(np.uint8).astype(np.uint32)
  bits = data[:, 0] | data[:, 1] << 8 | data[:, 2] << 16 | data[:, 3] << 24
  return codes, bits.reshape(-1, ROWS).view(np.float32)
