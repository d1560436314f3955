"""What every all-reduce algorithm is: one object with its model, its bytes and its emitters.

An algorithm module defines an `Algorithm` and registers it (algorithms/__init__.py).
Its NumPy half (`reference`, `wire_bytes`) uses no MLIR; its emitters build the same
all-reduce in StableHLO, in the flat form (every algorithm has one) and, where the
algorithm has one, the tiled form (forms.py says what the two are).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
from jax.extend.mlir import ir

from equarx_pass.emission.formats import Format
from equarx_pass.emission.forms import FlatSite, Pieces, SitePlan, TiledSite
from equarx_pass.ir.hlo_builder import ChannelAllocator
from equarx_pass.ir.layout import ChunkLayout
from equarx_pass.traffic import Declaration

if TYPE_CHECKING:
  from equarx_pass.emission.scheme import Scheme

# finish(codes, scales): the values of N quantized chunks, f32 [N, C] (dequantized, and
# rotated back where the scheme rotates).
Finish = Callable[[np.ndarray, np.ndarray], np.ndarray]


class Algorithm:
  name: str = ""
  description: str = ""  # one line for --help
  directions: int = 1  # ring directions: each microshard is split into this many lanes
  takes_microshards: bool = True  # whether --equarx_microshards applies
  has_tiled_form: bool = False
  emits_reduce_scatter: bool = False  # has a reduce-scatter half (--equarx_ops)
  # Whether a block's result is the same whichever chunk it is in (two-shot: every chunk
  # summed in group order), so the tiled form may take blocks in the operand's own tile
  # order (forms.TiledSite).
  chunk_order_free: bool = False
  # Whether the tiled form quantizes the operand's chunks once, all together, before
  # any exchange (TiledSite.quantize_chunks): that quantize can be the kernel form's
  # Pallas kernel (quantize_kernel.py).
  quantizes_chunks_once: bool = False
  # Whether the kernel form may exchange the chunks by collective-permutes of packed
  # chunks (emit_permuted; quantize_kernel.KernelExchange.PERMUTES).
  has_permuted_exchange: bool = False

  def wire_bytes(self, layout: ChunkLayout, fmt: Format) -> int:
    """Bytes one rank sends for a site of `layout`: what the report prices and
    equarx_pass/ir/wire_bytes.py counts from the emitted collectives."""
    raise NotImplementedError

  def reference(
    self, x: list[np.ndarray], scheme: Scheme, layout: ChunkLayout, finish: Finish
  ) -> list[np.ndarray]:
    """The NumPy model: x[r] is rank r's f32 [N, C] (rotated where the scheme rotates);
    returns each rank's f32 [N, C] result."""
    raise NotImplementedError

  def collective_steps(self, group_size: int) -> int:
    """Collective steps one all-reduce takes, one after the other (what a link's latency
    is paid for): a ring's 2(N-1)."""
    return 2 * (group_size - 1)

  def crossing_share(self, domains: Sequence[int]) -> float:
    """The share of its wire bytes a rank sends across domains, `domains[r]` the domain of
    the group's member r (what the cost model prices on slow links): a ring sends
    everything to its neighbour in group order."""
    n = len(domains)
    return sum(domains[r] != domains[(r + 1) % n] for r in range(n)) / n

  def traffic(self, layout: ChunkLayout, fmt: Format, domains: Sequence[int]) -> Declaration:
    """What one all-reduce of `layout` sends over a group whose member r is in domain
    `domains[r]`: the one declaration the cost model prices (cost.priced), from
    wire_bytes, collective_steps and crossing_share."""
    n = len(domains)
    return Declaration(
      self.wire_bytes(layout, fmt), self.collective_steps(n), self.crossing_share(domains)
    )

  def reduce_scatter_traffic(
    self, layout: ChunkLayout, fmt: Format, domains: Sequence[int]
  ) -> Declaration:
    """The reduce-scatter half's: its bytes, half the all-reduce's steps (at least one),
    the same share across domains."""
    steps = max(1, self.collective_steps(len(domains)) // 2)
    return Declaration(
      self.reduce_scatter_wire_bytes(layout, fmt), steps, self.crossing_share(domains)
    )

  def reduce_scatter_wire_bytes(self, layout: ChunkLayout, fmt: Format) -> int:
    """Bytes one rank sends for the reduce-scatter half: N-1 quantized chunks."""
    return (layout.group_size - 1) * fmt.payload_bytes(layout.chunk, layout.blocks)

  def reduce_scatter_reference(
    self, x: list[np.ndarray], scheme: Scheme, layout: ChunkLayout
  ) -> list[np.ndarray]:
    """The NumPy model of the reduce-scatter half: x[r] is rank r's f32 [N, C] (rotated
    where the scheme rotates), row c the piece rank c gets; returns rank r's f32 [C]
    sum of row r, before any final quantization."""
    raise NotImplementedError

  def emit_reduce_scatter(self, site: TiledSite) -> ir.Value:
    """The reduce-scatter half, tiled: this rank's f32 sum of its row [*tile]."""
    raise NotImplementedError

  def emit_flat(self, site: FlatSite) -> ir.Value:
    """The flat form at the current insertion point: f32 [N, C], the same bits on
    every rank."""
    raise NotImplementedError

  def emit_tiled(self, site: TiledSite) -> tuple[ir.Value, ir.Value]:
    """The tiled form: the codes and scales of all N reduced chunks, in chunk order."""
    raise NotImplementedError

  def emit_permuted(self, site: TiledSite) -> ir.Value:
    """The kernel form with the permuted exchange (quantize_kernel.KernelExchange): all
    the values, in the layout the site took them in."""
    raise NotImplementedError(f"{self.name} has no permuted exchange")

  def emit(
    self, operands: list[ir.Value], plan: SitePlan, channels: ChannelAllocator, tiled: bool
  ) -> list[ir.Value]:
    """The all-reduce of `plan.scheme` at the current insertion point, in the tiled form
    or the flat one; one value per operand, with the operand's type."""
    if tiled:
      site = TiledSite(operands, plan, channels)
      if site.permuted:
        return site.finish_permuted(lambda: self.emit_permuted(site))
      if site.parts > 1:
        return site.finish_parts(lambda: self.emit_tiled(site))
      return site.finish(*self.emit_tiled(site))
    flat = FlatSite(operands, plan, channels)
    return flat.finish(self.emit_flat(flat))

  def emit_pieces(
    self, operand: ir.Value, plan: SitePlan, channels: ChannelAllocator, pieces: Pieces
  ) -> list[ir.Value]:
    """A reduce-scatter at the current insertion point (tiled): the result, one value."""
    site = TiledSite([operand], plan, channels, pieces)
    return site.finish_own(self.emit_reduce_scatter(site))
