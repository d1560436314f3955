"""The quantized ring all-reduce (EQuARX): layout, schedule and NumPy reference.

No MLIR here: `build.py` turns a `RingPlan` into StableHLO ops, and this module's
`reference_allreduce` is the model the emitted program is tested against bit for bit.

Group of N ranks, each with a flat f32 vector of L values (all operands of the
all-reduce, converted to f32 and concatenated):

  layout    pad with zeros to N chunks of C values, C a multiple of the block B
  RS step s (s = 0 .. N-2), on rank r:
            send  quantize(partial)            to rank r+1
            recv  from rank r-1, partial = dequantize(recv) + x[(r - s - 1) mod N]
            (partial starts as x[r]; rank r ends owning chunk (r + 1) mod N)
  final     own = quantize(partial), once
  AG step s (s = 0 .. N-2), on rank r:
            forward the quantized chunk (own at s = 0) to rank r+1 unchanged,
            recv chunk (r - s) mod N from rank r-1
  output    every rank dequantizes all N quantized chunks (its own included, so
            all ranks hold the same bits), casts to the original dtype, un-pads.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from equarx_pass import quantize as qz


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
class RingSchedule:
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

  def reduce_scatter_chunk(self, rank: int, step: int) -> int:
    """Index of the local chunk that rank adds at RS step `step`."""
    return (rank - step - 1) % self.group_size

  def all_gather_chunk(self, rank: int, step: int) -> int:
    """Index of the quantized chunk that rank receives at AG step `step`."""
    return (rank - step) % self.group_size

  def owned_chunk(self, rank: int) -> int:
    return (rank + 1) % self.group_size


def make_schedule(groups: Sequence[Sequence[int]]) -> RingSchedule:
  groups = tuple(tuple(int(d) for d in g) for g in groups)
  if not groups or not groups[0]:
    raise ValueError("a ring needs at least one non-empty group")
  if len({len(g) for g in groups}) != 1:
    raise ValueError(f"groups must have equal sizes, got {[len(g) for g in groups]}")
  flat = [d for g in groups for d in g]
  if len(set(flat)) != len(flat):
    raise ValueError(f"a device appears in two groups: {groups}")
  if min(flat) < 0:
    raise ValueError(f"negative device id in {groups}")
  return RingSchedule(groups)


@dataclasses.dataclass(frozen=True)
class WireBytes:
  """Bytes one rank sends for one all-reduce."""

  before: int  # an unquantized ring all-reduce in the original dtype
  after: int  # the quantized ring

  @property
  def ratio(self) -> float:
    return self.before / self.after if self.after else float("inf")


def ring_wire_bytes(
  layout: ChunkLayout, itemsize_before: float, fmt: qz.Format = qz.INT8
) -> WireBytes:
  """2(N-1) chunk transfers per rank, in both schemes (two-shot sends the same)."""
  steps = 2 * (layout.group_size - 1)
  unpadded_chunk = -(-layout.num_values // layout.group_size)
  before = int(steps * unpadded_chunk * itemsize_before)
  after = steps * fmt.payload_bytes(layout.chunk, layout.blocks)
  return WireBytes(before, after)


def pad_chunks(x: np.ndarray, layout: ChunkLayout) -> np.ndarray:
  """A rank's operand as f32 [N, C]: flattened, zero-padded, one row per chunk."""
  flat = np.zeros(layout.padded, np.float32)
  flat[: layout.num_values] = np.asarray(x, np.float32).reshape(-1)
  return flat.reshape(layout.group_size, layout.chunk)


def ring_chunks(x: Sequence[np.ndarray], block: int, fmt: qz.Format = qz.INT8) -> list[np.ndarray]:
  """The quantized ring on chunk matrices: x[r] is rank r's f32 [N, s] (ranks in
  ring order: r sends to r + 1).  Returns what every rank holds at the end: the
  codes [N, code bytes] and scales [N, blocks] of all N reduced chunks."""
  n = len(x)
  sched = RingSchedule((tuple(range(n)),))
  # Reduce-scatter: partial[r] is what rank r sends at the next step.
  partial = [x[r][r].copy() for r in range(n)]
  for step in range(n - 1):
    sent = [qz.quantize(partial[r], block, fmt) for r in range(n)]
    for r in range(n):
      q, s = sent[(r - 1) % n]
      # Dequantize and add in one rounding: XLA contracts the multiply and the add.
      values = qz.codes_to_f32(q, fmt, block).reshape(s.shape + (block,))
      local = x[r][sched.reduce_scatter_chunk(r, step)].reshape(values.shape)
      partial[r] = qz.fused_multiply_add(values, s[:, None], local).reshape(-1)

  # Final quantization once; the all-gather forwards the bytes unchanged.
  own = [qz.quantize(partial[r], block, fmt) for r in range(n)]
  gathered = [[None] * n for _ in range(n)]
  for r in range(n):
    gathered[r][sched.owned_chunk(r)] = own[r]
  cur = own
  for step in range(n - 1):
    cur = [cur[(r - 1) % n] for r in range(n)]
    for r in range(n):
      gathered[r][sched.all_gather_chunk(r, step)] = cur[r]
  # Every rank holds every chunk's quantized bytes, its own included.
  return [
    (np.stack([q for q, _ in gathered[r]]), np.stack([s for _, s in gathered[r]])) for r in range(n)
  ]


def reference_allreduce(
  inputs: Sequence[np.ndarray], block_size: int, out_dtype=None
) -> list[np.ndarray]:
  """Per-rank results of the int8 ring over one group, ranks in ring order.

  inputs[r] is rank r's operand (any shape, all equal); the result of rank r has
  the same shape and `out_dtype` (default: the input dtype).  Every other scheme:
  equarx_pass.scheme.reference.
  """
  n = len(inputs)
  shape = np.shape(inputs[0])
  out_dtype = out_dtype or np.asarray(inputs[0]).dtype
  layout = chunk_layout(int(np.prod(shape, dtype=np.int64)), n, block_size)
  out = ring_chunks([pad_chunks(v, layout) for v in inputs], layout.block)
  return [unpad(qz.dequantize(q, s, layout.block), layout, shape, out_dtype) for q, s in out]


def unpad(chunks: np.ndarray, layout: ChunkLayout, shape, out_dtype) -> np.ndarray:
  flat = np.asarray(chunks, np.float32).reshape(-1)[: layout.num_values]
  with np.errstate(over="ignore", invalid="ignore"):
    return flat.astype(out_dtype).reshape(shape)


def error_bound(inputs: Sequence[np.ndarray], block_size: int) -> float:
  """A loose upper bound on max |result - exact sum| for the int8 ring.

  Each quantization of a block with absmax m adds at most m / 254 per value
  (half a step).  A partial sum's absmax is at most the sum of the absmaxes of its
  terms, so every one of the N quantizations in a value's path adds at most
  S / 254, S = sum over ranks of max|x_r|.
  """
  n = len(inputs)
  s = sum(float(np.max(np.abs(np.asarray(v, np.float64)))) for v in inputs)
  return n * s / (2 * qz.INT8_MAX) * (1 + 1e-5) + 1e-30
