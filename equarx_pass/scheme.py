"""A quantized all-reduce scheme: algorithm x format x blocks x rotation x microshards.

No MLIR here.  `Scheme` decides the chunk layout and the lanes (microshards and
ring directions) that build.py emits, and `reference` is the NumPy model of
the whole all-reduce for any scheme, which the emitted program is tested
against bit for bit.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from equarx_pass import quantize as qz
from equarx_pass import ring, rotation, two_shot

RING = "ring"
TWO_SHOT = "two_shot"
BIDIRECTIONAL = "bidirectional"
ALGORITHMS = (RING, TWO_SHOT, BIDIRECTIONAL)
BLOCK_LAYOUTS = ("fixed", "grid")
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
  algorithm: str = RING
  format: str = "int8"
  block_size: int = 1024
  block_layout: str = "fixed"  # "grid": 8 x 128 scales per chunk (the paper's)
  rotation: str = rotation.NONE
  rotation_size: int = 0  # 0: the default for the block layout (resolved_rotation_size)
  microshards: int = 1

  def __post_init__(self):
    if self.algorithm not in ALGORITHMS:
      raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
    if self.format not in qz.FORMATS:
      raise ValueError(f"format must be one of {', '.join(qz.FORMATS)}, got {self.format!r}")
    if self.block_layout not in BLOCK_LAYOUTS:
      raise ValueError(f"block layout must be fixed or grid, got {self.block_layout!r}")
    if self.rotation not in rotation.ROTATIONS:
      raise ValueError(f"rotation must be none or hadamard, got {self.rotation!r}")
    if self.rotation != rotation.NONE:
      size = self.resolved_rotation_size
      rotation.check_size(size)
      if self.block_layout == "fixed" and self.block_size % size:
        raise ValueError(
          f"the rotation size ({size}) must divide the block size "
          f"({self.block_size}): a rotation block must share one scale"
        )
    if self.microshards < 1 or ring.GRID_SCALES % self.microshards:
      raise ValueError(f"microshards must divide {ring.GRID_SCALES}, got {self.microshards}")
    if self.microshards > 1 and self.algorithm == TWO_SHOT:
      raise ValueError("microshards apply to the ring algorithms, not two_shot")
    if self.format == "int4" and self.block_layout == "fixed" and self.block_size % 2:
      raise ValueError(
        f"int4 packs two values per byte: the block size must be even, got {self.block_size}"
      )
    if self.block_layout == "grid":
      # A grid chunk is 1024 blocks of chunk / 1024 values, which may be odd: each lane
      # needs whole blocks, and for int4 an even number of values, so two blocks or more.
      lanes = self.microshards * self.directions
      most = ring.GRID_SCALES // (2 if self.format == "int4" else 1)
      if lanes > most:
        raise ValueError(
          f"the grid layout's {ring.GRID_SCALES} blocks per chunk allow at most "
          f"{most} lanes ({'two blocks' if most < ring.GRID_SCALES else 'one block'}"
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
  def fmt(self) -> qz.Format:
    return qz.FORMATS[self.format]

  @property
  def directions(self) -> int:
    return 2 if self.algorithm == BIDIRECTIONAL else 1

  def layout(self, num_values: int, group_size: int) -> ring.ChunkLayout:
    rot = self.resolved_rotation_size if self.rotation != rotation.NONE else 0
    return ring.chunk_layout(
      num_values,
      group_size,
      self.block_size,
      self.microshards * self.directions,
      rot,
      self.block_layout == "grid",
    )

  def lanes(self, layout: ring.ChunkLayout) -> list[Lane]:
    """Chunk slices in order: the first half clockwise, the second counter-clockwise."""
    count = self.microshards * self.directions
    size = layout.chunk // count
    return [Lane(1 if i < self.microshards else -1, i * size, size) for i in range(count)]

  def wire_bytes(self, layout: ring.ChunkLayout) -> int:
    """Bytes one rank sends for a site of `layout`: what the report prices and
    tools/wire_bytes.py counts from the emitted collectives.  The ring forwards 2(N-1)
    quantized chunks (bidirectional: each direction a share of every chunk); two-shot
    sends N-1 in its all-to-all and N-1 in its all-gather, the same bytes."""
    n = layout.group_size
    chunk_bytes = self.fmt.payload_bytes(layout.chunk, layout.blocks)
    if self.algorithm == TWO_SHOT:
      return (n - 1) * chunk_bytes + (n - 1) * chunk_bytes
    return 2 * (n - 1) * chunk_bytes

  def flat_only(self) -> str | None:
    """Why this scheme has no tiled form (tiled.py), so the flat one (build.py) is
    emitted; None when it has one."""
    if self.algorithm not in (TWO_SHOT, RING):
      return f"the tiled form is two_shot's and ring's; {self.algorithm} is emitted flat"
    if self.microshards > 1:
      return "the tiled ring has one lane; microshards are emitted flat"
    if self.block_layout != "fixed":
      return "the tiled form has fixed blocks; the grid layout is emitted flat"
    return None

  def describe(self) -> str:
    parts = [f"{self.format} {self.algorithm}"]
    parts.append("grid 8x128" if self.block_layout == "grid" else f"block {self.block_size}")
    if self.rotation != rotation.NONE:
      parts.append(f"{self.rotation} {self.resolved_rotation_size}")
    if self.microshards > 1:
      parts.append(f"{self.microshards} microshards")
    return ", ".join(parts)

  def bits_per_value(self, layout: ring.ChunkLayout) -> float:
    return 8 * self.fmt.payload_bytes(layout.chunk, layout.blocks) / layout.chunk


def reference(inputs: Sequence[np.ndarray], scheme: Scheme, out_dtype=None) -> list[np.ndarray]:
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
  x = [ring.pad_chunks(v, layout) for v in inputs]
  rotating = scheme.rotation != rotation.NONE
  if rotating:
    x = [rotation.hadamard(v, scheme.resolved_rotation_size).reshape(v.shape) for v in x]

  def finish(codes, scales):
    if rotating:
      return rotation.dequantize_rotated(
        codes, scales, layout.block, scheme.fmt, scheme.resolved_rotation_size
      )
    return qz.dequantize(codes, scales, layout.block, scheme.fmt)

  if scheme.algorithm == TWO_SHOT:
    out = [finish(q, s) for q, s in two_shot.two_shot_chunks(x, layout.block, scheme.fmt)]
  else:
    out = [np.zeros_like(v) for v in x]
    for lane in scheme.lanes(layout):
      cols = slice(lane.offset, lane.offset + lane.size)
      # Counter-clockwise is the clockwise ring over the ranks in reverse order.
      order = list(range(n)) if lane.direction == 1 else list(range(n))[::-1]
      res = ring.ring_chunks([x[r][:, cols] for r in order], layout.block, scheme.fmt)
      for pos, r in enumerate(order):
        out[r][:, cols] = finish(*res[pos])
  return [ring.unpad(v, layout, shape, out_dtype) for v in out]
