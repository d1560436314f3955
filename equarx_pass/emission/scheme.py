"""A quantized all-reduce scheme: algorithm x format x blocks x rotation x microshards.

This module builds no MLIR (the format and algorithm objects it names carry their
emitters, so importing it imports JAX's MLIR bindings).  `Scheme` decides the chunk
layout and the lanes (microshards and ring directions) that the algorithms' emitters
(algorithms/) emit through forms.py, and `reference` is the NumPy model of the whole
all-reduce for any scheme, which the emitted program is tested against bit for bit.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
from numpy.typing import DTypeLike

from equarx_pass.emission import quantize as qz
from equarx_pass.emission import rotation
from equarx_pass.emission.algorithms import ALGORITHMS, Algorithm
from equarx_pass.emission.formats import FORMATS, Format
from equarx_pass.ir.layout import GRID_SCALES, ChunkLayout, chunk_layout, pad_chunks, unpad
from equarx_pass.site_kind import SiteKind
from equarx_pass.traffic import Declaration

BLOCK_LAYOUTS = ("fixed", "grid")
ROUNDINGS = ("nearest", "stochastic")
GRID_ROTATION_SIZE = 128


@dataclasses.dataclass(frozen=True)
class Lane:
  """A slice of every chunk, [offset, offset + size), that travels on its own
  permutes in one ring direction (+1: to rank r + 1; -1: to rank r - 1)."""

  direction: int
  offset: int
  size: int


@dataclasses.dataclass(frozen=True)
class Scheme:
  algorithm: str = "ring"
  format: str = "int8"
  block_size: int = 1024
  block_layout: str = "fixed"  # "grid": 8 x 128 scales per chunk (the paper's)
  rotation: str = rotation.NONE
  rotation_size: int = 0  # 0: the default for the block layout (resolved_rotation_size)
  microshards: int = 1
  rounding: str = "nearest"  # or "stochastic" (integer formats, formats/integer.py)

  def __post_init__(self) -> None:
    if self.algorithm not in ALGORITHMS:
      raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
    if self.format not in FORMATS:
      raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")
    if self.block_layout not in BLOCK_LAYOUTS:
      raise ValueError(f"block layout must be fixed or grid, got {self.block_layout!r}")
    if self.rotation not in rotation.ROTATIONS:
      raise ValueError(f"rotation must be none or hadamard, got {self.rotation!r}")
    if self.rounding not in ROUNDINGS:
      raise ValueError(f"rounding must be one of {', '.join(ROUNDINGS)}, got {self.rounding!r}")
    if self.rounding == "stochastic" and not hasattr(FORMATS[self.format], "stochastic"):
      raise ValueError(f"stochastic rounding is for integer formats, not {self.format}")
    fixed = self.fmt.block
    if fixed and (self.block_layout != "fixed" or self.block_size != fixed):
      raise ValueError(
        f"{self.format} has one scale per {fixed} values: the block size must be {fixed} "
        f"(or left to the default) and the block layout fixed"
      )
    if self.rotation != rotation.NONE:
      size = self.resolved_rotation_size
      rotation.check_size(size)
      if self.block_layout == "fixed" and self.block_size % size:
        raise ValueError(
          f"the rotation size ({size}) must divide the block size "
          f"({self.block_size}): a rotation block must share one scale"
        )
    if self.microshards < 1 or GRID_SCALES % self.microshards:
      raise ValueError(f"microshards must divide {GRID_SCALES}, got {self.microshards}")
    if self.microshards > 1 and not self.algo.takes_microshards:
      raise ValueError(f"microshards apply to the ring algorithms, not {self.algorithm}")
    if self.fmt.bits == 4 and self.block_layout == "fixed" and self.block_size % 2:
      raise ValueError(
        f"int4 packs two values per byte: the block size must be even, got {self.block_size}"
      )
    if self.block_layout == "grid":
      # A grid chunk is 1024 blocks of chunk / 1024 values, which may be odd: each lane
      # needs whole blocks, and for int4 an even number of values, so two blocks or more.
      lanes = self.microshards * self.directions
      most = GRID_SCALES // (2 if self.fmt.bits == 4 else 1)
      if lanes > most:
        raise ValueError(
          f"the grid layout's {GRID_SCALES} blocks per chunk allow at most "
          f"{most} lanes ({'two blocks' if most < GRID_SCALES else 'one block'}"
          f" each) for {self.format}; microshards x directions = {lanes}"
        )

  @property
  def resolved_rotation_size(self) -> int:
    """The given size, else the largest power of two dividing the block (at most
    4096), or 128 for the grid layout (whose block is chunk / 1024)."""
    if self.rotation_size:
      return self.rotation_size
    if self.block_layout == "grid":
      return GRID_ROTATION_SIZE
    return min(self.block_size & -self.block_size, 4096)

  @property
  def fmt(self) -> Format:
    fmt = FORMATS[self.format]
    if self.rounding == "stochastic":
      return dataclasses.replace(fmt, stochastic=True)  # type: ignore[call-arg]
    return fmt

  @property
  def algo(self) -> Algorithm:
    return ALGORITHMS[self.algorithm]

  @property
  def directions(self) -> int:
    return self.algo.directions

  def layout(self, num_values: int, group_size: int) -> ChunkLayout:
    rot = self.resolved_rotation_size if self.rotation != rotation.NONE else 0
    return chunk_layout(
      num_values,
      group_size,
      self.block_size,
      self.microshards * self.directions,
      rot,
      self.block_layout == "grid",
    )

  def lanes(self, layout: ChunkLayout) -> list[Lane]:
    """Chunk slices in order: the first half clockwise, the second counter-clockwise."""
    count = self.microshards * self.directions
    size = layout.chunk // count
    return [Lane(1 if i < self.microshards else -1, i * size, size) for i in range(count)]

  def traffic(self, layout: ChunkLayout, kind: SiteKind, domains: Sequence[int]) -> Declaration:
    """What a site of `kind` sends over a group whose member r is in domain `domains[r]`:
    the algorithm's declaration (an all-reduce, a reduce-scatter's half), or an
    all-gather's, which is one quantization and one all_gather whatever the algorithm:
    N-1 pieces, moved across domains as the two-shot's all-gather moves them.  Its steps
    are half the algorithm's all-reduce's (at least one), as the plan has always priced
    them."""
    if kind == SiteKind.ALL_REDUCE:
      return self.algo.traffic(layout, self.fmt, domains)
    if kind == SiteKind.REDUCE_SCATTER:
      return self.algo.reduce_scatter_traffic(layout, self.fmt, domains)
    steps = max(1, self.algo.collective_steps(len(domains)) // 2)
    crossing = ALGORITHMS["two_shot"].crossing_share(domains)
    return Declaration(self.wire_bytes(layout, kind), steps, crossing)

  def wire_bytes(self, layout: ChunkLayout, kind: SiteKind = SiteKind.ALL_REDUCE) -> int:
    """Bytes one rank sends for a site of `layout`, as the algorithm sends them: what
    the report prices and equarx_pass/ir/wire_bytes.py counts from the emitted collectives.  A
    reduce-scatter sends the algorithm's first half; an all-gather, N-1 quantized pieces
    whatever the algorithm."""
    if kind == SiteKind.REDUCE_SCATTER:
      return self.algo.reduce_scatter_wire_bytes(layout, self.fmt)
    if kind == SiteKind.ALL_GATHER:
      return (layout.group_size - 1) * self.fmt.payload_bytes(layout.chunk, layout.blocks)
    return self.algo.wire_bytes(layout, self.fmt)

  def flat_only(self) -> str | None:
    """Why this scheme has no tiled form, so the flat one is emitted (forms.py); None
    when it has one."""
    if not self.algo.has_tiled_form:
      tiled = " and ".join(f"{name}'s" for name, a in ALGORITHMS.items() if a.has_tiled_form)
      return f"the tiled form is {tiled}; {self.algorithm} is emitted flat"
    if self.microshards > 1:
      return "the tiled ring has one lane; microshards are emitted flat"
    if self.block_layout != "fixed":
      return "the tiled form has fixed blocks; the grid layout is emitted flat"
    return None

  def describe(self, algorithm: bool = True) -> str:
    """'int8 two_shot, block 128, hadamard 128', ...; without the algorithm for what does
    not use it (an all-gather)."""
    parts = [f"{self.format} {self.algorithm}" if algorithm else self.format]
    parts.append("grid 8x128" if self.block_layout == "grid" else f"block {self.block_size}")
    if self.rotation != rotation.NONE:
      parts.append(f"{self.rotation} {self.resolved_rotation_size}")
    if self.microshards > 1:
      parts.append(f"{self.microshards} microshards")
    if self.rounding != "nearest":
      parts.append(f"{self.rounding} rounding")
    return ", ".join(parts)

  def bits_per_value(self, layout: ChunkLayout) -> float:
    return 8 * self.fmt.payload_bytes(layout.chunk, layout.blocks) / layout.chunk


def reference(
  inputs: Sequence[np.ndarray], scheme: Scheme, out_dtype: DTypeLike | None = None
) -> list[np.ndarray]:
  """Per-rank results of `scheme` over one group, ranks in group order.

  inputs[r] is rank r's operand (any shape, all equal); each result has that
  shape and `out_dtype` (default: the input dtype).  The calibrated
  outlier-feature scheme (--equarx_calibration) needs its calibration too: its
  model is outlier.reference.
  """
  n = len(inputs)
  shape = np.shape(inputs[0])
  out_dtype = out_dtype or np.asarray(inputs[0]).dtype
  layout = scheme.layout(int(np.prod(shape, dtype=np.int64)), n)
  x = [pad_chunks(v, layout) for v in inputs]
  rotating = scheme.rotation != rotation.NONE
  if rotating:
    x = [rotation.hadamard(v, scheme.resolved_rotation_size).reshape(v.shape) for v in x]

  def finish(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    if rotating:
      return rotation.dequantize_rotated(
        codes, scales, layout.block, scheme.fmt, scheme.resolved_rotation_size
      )
    return qz.dequantize(codes, scales, layout.block, scheme.fmt)

  out = scheme.algo.reference(x, scheme, layout, finish)
  return [unpad(v, layout, shape, out_dtype) for v in out]


def _piece_rows(x: np.ndarray, dimension: int, rows: int, chunk: int) -> np.ndarray:
  """An operand as `rows` pieces along `dimension` (moved to the front), f32 [rows, chunk],
  each zero-padded: what the tiled form's reduce-scatter and all-gather start from."""
  moved = np.moveaxis(np.asarray(x), dimension, 0).astype(np.float32)
  flat = moved.reshape(rows, -1)
  out = np.zeros((rows, chunk), np.float32)
  out[:, : flat.shape[1]] = flat
  return out


def _from_rows(
  values: np.ndarray, moved_shape: Sequence[int], dimension: int, out_dtype: DTypeLike
) -> np.ndarray:
  """f32 [rows, chunk] -> the pieces, padding cut, in `moved_shape`, dimension put back."""
  rows = values.shape[0]
  size = int(np.prod(moved_shape, dtype=np.int64)) // rows
  moved = values[:, :size].reshape(moved_shape)
  with np.errstate(over="ignore", invalid="ignore"):
    return np.moveaxis(moved, 0, dimension).astype(out_dtype)


def reduce_scatter_reference(
  inputs: Sequence[np.ndarray],
  scheme: Scheme,
  dimension: int = 0,
  out_dtype: DTypeLike | None = None,
) -> list[np.ndarray]:
  """Per-rank results of the scheme's quantized reduce-scatter (--equarx_ops), ranks in
  group order: rank r gets piece r of the sum along `dimension`.

  Each rank's pieces are quantized on the way (the algorithm's reduce-scatter half:
  Algorithm.reduce_scatter_reference) and summed in f32; the sum is not quantized again.
  With a rotation, the sums are rotated back in f32 (butterflies, then the signs).
  """
  n = len(inputs)
  first = np.asarray(inputs[0])
  out_dtype = out_dtype or first.dtype
  layout = scheme.layout(first.size, n)
  x = [_piece_rows(v, dimension, n, layout.chunk) for v in inputs]
  size = scheme.resolved_rotation_size if scheme.rotation != rotation.NONE else 0
  if size:
    x = [rotation.hadamard(v, size).reshape(v.shape) for v in x]
  sums = scheme.algo.reduce_scatter_reference(x, scheme, layout)
  moved = [first.shape[dimension] // n] + [d for i, d in enumerate(first.shape) if i != dimension]
  out = []
  for s in sums:
    if size:
      s = (rotation.butterflies(s, size).reshape(-1, size) * rotation.signs(size)).reshape(-1)
    out.append(_from_rows(np.asarray(s, np.float32)[None], moved, dimension, out_dtype))
  return out


def all_gather_reference(
  inputs: Sequence[np.ndarray],
  scheme: Scheme,
  dimension: int = 0,
  out_dtype: DTypeLike | None = None,
) -> np.ndarray:
  """The scheme's quantized all-gather (--equarx_ops): every rank's piece quantized once
  (rotated first where the scheme rotates) and dequantized by every rank, concatenated
  along `dimension` in group order.  The same result on every rank."""
  n = len(inputs)
  first = np.asarray(inputs[0])
  out_dtype = out_dtype or first.dtype
  layout = scheme.layout(n * first.size, n)
  size = scheme.resolved_rotation_size if scheme.rotation != rotation.NONE else 0
  rows = []
  for v in inputs:
    x = _piece_rows(v, dimension, 1, layout.chunk)
    if size:
      x = rotation.hadamard(x, size).reshape(x.shape)
    codes, scales = qz.quantize(x, layout.block, scheme.fmt)
    if size:
      rows.append(rotation.dequantize_rotated(codes, scales, layout.block, scheme.fmt, size))
    else:
      rows.append(qz.dequantize(codes, scales, layout.block, scheme.fmt))
  moved = [n * first.shape[dimension]] + [d for i, d in enumerate(first.shape) if i != dimension]
  return _from_rows(np.concatenate(rows), moved, dimension, out_dtype)
