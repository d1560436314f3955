"""How an all-reduce's operands are laid out as chunks, and who talks to whom: NumPy only.

Every algorithm works on the same layout: all operands of the all-reduce, converted
to f32 and concatenated, padded with zeros to N chunks of C values, C a multiple of
the block (one scale per block).  Chunk c is reduced by one rank and gathered by all.
A `GroupSchedule` lists the groups (device ids, by rank) and derives the
source-target pairs of a ring step and each device's rank.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Sequence

import numpy as np
from numpy.typing import DTypeLike

# How a site's devices are addressed: partitions (the collectives carry a channel: SPMD,
# shard_map) or replicas (pmap-style and cross-replica all-reduces).
DeviceKind = Literal["partition", "replica"]


@dataclasses.dataclass(frozen=True)
class ChunkLayout:
  """How L values split into N chunks of `chunk` values, `blocks` blocks of `block`."""

  num_values: int  # L, before padding
  group_size: int  # N
  chunk: int  # C, values per chunk, a multiple of `block`
  block: int  # B, values per scale

  @property
  def blocks(self) -> int:
    return self.chunk // self.block

  @property
  def padded(self) -> int:
    return self.group_size * self.chunk


GRID_SCALES = 8 * 128  # the paper's layout: one TPU vector register of scales per chunk


def chunk_layout(
  num_values: int,
  group_size: int,
  block_size: int,
  lanes: int = 1,
  rotation_size: int = 0,
  grid: bool = False,
) -> ChunkLayout:
  """Chunks of ceil(L/N) values rounded up to what the scheme needs.

  Fixed blocks: a chunk is a whole number of blocks, split evenly into `lanes`
  (microshards x directions) of whole blocks; a rotation block must lie inside
  one quantization block (see rotation.dequantize_rotated).  A plain chunk
  (one lane, no rotation) smaller than one block is one block of its own length
  (rounded up to a multiple of 4, never past the block size): padding a
  100-value psum to 8 x 1024 values would be absurd.
  Grid (the paper's layout): 8 x 128 = 1024 scales per chunk whatever its size,
  so the block is chunk / 1024 values.
  """
  if group_size < 1:
    raise ValueError(f"group size must be >= 1, got {group_size}")
  if block_size < 1:
    raise ValueError(f"block size must be >= 1, got {block_size}")
  per_rank = max(1, -(-num_values // group_size))
  if grid:
    # The block (chunk / 1024) must be a multiple of the rotation size.
    unit = GRID_SCALES * (rotation_size or 1)
    chunk = -(-per_rank // unit) * unit
    return ChunkLayout(num_values, group_size, chunk, chunk // GRID_SCALES)
  if rotation_size and block_size % rotation_size:
    raise ValueError(
      f"the rotation size ({rotation_size}) must divide the block size "
      f"({block_size}): a rotation block must share one scale"
    )
  unit = block_size * lanes
  if unit == block_size and not rotation_size and per_rank <= block_size:
    block = min(-(-per_rank // 4) * 4, block_size)
    return ChunkLayout(num_values, group_size, block, block)
  chunk = -(-per_rank // unit) * unit
  return ChunkLayout(num_values, group_size, chunk, block_size)


@dataclasses.dataclass(frozen=True)
class GroupSchedule:
  """Who sends to whom: `groups[g][r]` is the device id of rank r in group g."""

  groups: tuple[tuple[int, ...], ...]

  @property
  def group_size(self) -> int:
    return len(self.groups[0])

  def source_target_pairs(self, direction: int = 1) -> list[tuple[int, int]]:
    """Each rank sends to rank r + direction of its own group."""
    n = self.group_size
    return [(g[r], g[(r + direction) % n]) for g in self.groups for r in range(n)]

  def rank_table(self, num_devices: int) -> np.ndarray:
    """rank_table[device id] = that device's position in its group (-1: in no group)."""
    table = np.full(num_devices, -1, np.int32)
    for g in self.groups:
      for r, d in enumerate(g):
        table[d] = r
    return table


def make_schedule(device_groups: Sequence[Sequence[int]]) -> GroupSchedule:
  groups = tuple(tuple(int(d) for d in g) for g in device_groups)
  if not groups or not groups[0]:
    raise ValueError("a schedule needs at least one non-empty group")
  if len({len(g) for g in groups}) != 1:
    raise ValueError(f"groups must have equal sizes, got {[len(g) for g in groups]}")
  flat = [d for g in groups for d in g]
  if len(set(flat)) != len(flat):
    raise ValueError(f"a device appears in two groups: {groups}")
  if min(flat) < 0:
    raise ValueError(f"negative device id in {groups}")
  return GroupSchedule(groups)


def pad_chunks(x: np.ndarray, layout: ChunkLayout) -> np.ndarray:
  """A rank's operand as f32 [N, C]: flattened, zero-padded, one row per chunk."""
  flat = np.zeros(layout.padded, np.float32)
  flat[: layout.num_values] = np.asarray(x, np.float32).reshape(-1)
  return flat.reshape(layout.group_size, layout.chunk)


def unpad(
  chunks: np.ndarray, layout: ChunkLayout, shape: Sequence[int], out_dtype: DTypeLike
) -> np.ndarray:
  flat = np.asarray(chunks, np.float32).reshape(-1)[: layout.num_values]
  with np.errstate(over="ignore", invalid="ignore"):
    return flat.astype(out_dtype).reshape(shape)
