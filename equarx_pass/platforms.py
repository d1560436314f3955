"""What the pass knows of each platform, as data: one PlatformRules per platform name.

JAX's lowering registry keys its rules by (primitive, platform); here the rules the planner,
the cost model and the emitters follow are fields of one PlatformRules per platform, looked
up by name (rules_for), never `if platform == ...` in the modules that use them.  A new
platform is one `register(PlatformRules(...))`; a new kind of link for a platform or a
device kind is a LinkClass in its `links` or `links_by_device_kind`.  Plain Python.

Link figures are defaults from public sources, per device and direction (docs/topology.md
cites them); `--equarx_fast_link_bandwidth` and `--equarx_slow_link_bandwidth` override them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from equarx_pass import registry


@dataclasses.dataclass(frozen=True)
class LinkClass:
  """One class of link: its name, what one device sends over it per second (one
  direction), and what each collective step costs before any byte moves."""

  name: str
  gbytes_per_s: float
  latency_s: float
  # The bandwidth is per device (a TPU chip's DCN share, a GPU's own NIC), or per fast
  # domain, shared by its devices (a CPU host's network interface).
  per_device: bool = True

  def seconds(self, nbytes: float, steps: int, sharing: int = 1) -> float:
    """Time for one device to send `nbytes` in `steps` steps while `sharing` devices of
    its domain send as much (it matters only where the link is the domain's)."""
    share = 1 if self.per_device else sharing
    return nbytes * share / (self.gbytes_per_s * 1e9) + steps * self.latency_s

  def with_bandwidth(self, gbytes_per_s: float) -> LinkClass:
    return dataclasses.replace(self, gbytes_per_s=gbytes_per_s) if gbytes_per_s else self


# (fast, slow) per TPU generation, by the start of the device's device_kind.
#   ICI: v5e ~45 GB/s per link one way, v5p and v6e ~90; a ring all-reduce drives at
#   least two links of a chip (both directions of a bidirectional ring), so twice that.
#   DCN: a v5e pod's 6.4 Tbit/s over 256 chips, 25 Gbit/s = 3.1 GB/s per chip; v5p 50 Gbit/s
#   per chip.  v4 and v6e publish no per-chip DCN figure: v5e's is used.
# Longest prefix first: v5p's device kind is "TPU v5", v5e's "TPU v5 lite".
TPU_LINKS = {
  "TPU v5 lite": (LinkClass("ici", 90.0, 1e-6), LinkClass("dcn", 3.125, 2e-5)),
  "TPU v6 lite": (LinkClass("ici", 180.0, 1e-6), LinkClass("dcn", 3.125, 2e-5)),
  "TPU v5": (LinkClass("ici", 180.0, 1e-6), LinkClass("dcn", 6.25, 2e-5)),
  "TPU v4": (LinkClass("ici", 90.0, 1e-6), LinkClass("dcn", 3.125, 2e-5)),
}
# H100: NVLink 4 ~450 GB/s per GPU one way; one 400 Gbit/s InfiniBand NIC per GPU, 50 GB/s.
GPU_LINKS = (LinkClass("nvlink", 450.0, 5e-6), LinkClass("network", 50.0, 1e-5))
# CPU: the devices of one process share memory; between processes, the network.  The
# default network is 100 Mbit/s, the emulated hosts of tools/netbench.py at which the
# default --equarx_min_bytes was measured; set the real figure with
# --equarx_slow_link_bandwidth.  Latency: about 1 ms per collective step over TCP there.
# Inside a process XLA:CPU's collectives move about 2.7 GB/s in all: the native all-reduce
# of 8 MiB of bf16 (f32 on the wire) over 4 devices took 37.4 ms on 2 cores
# (`python tools/bench_ring_cpu.py --values 4M --dtypes bf16`), 4 x 1.5 x 16 MiB.
CPU_LINKS = (
  LinkClass("memory", 2.7, 1e-5, per_device=False),
  LinkClass("network", 0.0125, 1e-3, per_device=False),
)


@dataclasses.dataclass(frozen=True)
class TileRule:
  """How a platform stores an array: in tiles of rows of lanes over its two minor
  dimensions, each padded to whole tiles.  A collective sends the stored buffer, padding
  included, so its bytes are the tiles' (the native collective's bytes: plan.py).

  TPU (libtpu 0.0.50.1, v5e; tests/test_tpu_tile_bytes.py): 128 lanes, and 8 rows, or for
  fewer rows the power of two that holds them (a row of f32 takes (1, 128) tiles, three
  rows (4, 128)), at least the rows one 32-bit word packs (2 of bf16, 4 of int8); a vector
  is stored as rows of 128 lanes.  The compiler picks which two dimensions are the minor
  ones: the pair that pads least (an f32[N, 64] is stored with N on the lanes, unpadded).
  Where a conditional's branch holds the collective or uses its result, the operand keeps
  the default layout, its last dimension on the lanes: there an f32[N, 64] takes N x 128
  values, and the compiler zero-pads it to f32[N, 128] before it sends it.
  """

  rows: int = 8
  lanes: int = 128

  def stored_size(self, shape: tuple[int, ...], itemsize: int, default_layout: bool) -> int:
    """Values an array of `shape` takes in whole tiles; `default_layout`: its last two
    dimensions are the minor ones (else the two that pad least)."""
    size = math.prod(shape)
    if size == 0 or len(shape) == 0:
      return size
    if len(shape) == 1:
      return self._tiles(-(-size // self.lanes), self.lanes, itemsize)
    last = len(shape) - 1
    pairs = [(last - 1, last)]
    if not default_layout:
      pairs = [(r, c) for r in range(len(shape)) for c in range(len(shape)) if r != c]
    return min(
      size // (shape[r] * shape[c]) * self._tiles(shape[r], shape[c], itemsize) for r, c in pairs
    )

  def _tiles(self, rows: int, lanes: int, itemsize: int) -> int:
    """Values `rows` x `lanes` take in whole tiles."""
    packed = max(1, 4 // max(itemsize, 1))  # rows that one 32-bit word holds
    tile = min(self.rows, max(packed, 1 << (rows - 1).bit_length()))
    return -(-rows // tile) * tile * -(-lanes // self.lanes) * self.lanes


@dataclasses.dataclass(frozen=True)
class PlatformRules:
  """The rules of one platform (a name policy.target_platform gives: "cpu", "gpu", "tpu").

  The defaults are those of an accelerator: the matmul rotation, collectives inside loops,
  the native collective across domains in its hierarchical form.
  """

  name: str
  # Topology (topology.py): the (fast, slow) links, by the longest prefix of the device
  # kind that `links_by_device_kind` names, else `links`.
  links: tuple[LinkClass, LinkClass]
  links_by_device_kind: tuple[tuple[str, tuple[LinkClass, LinkClass]], ...] = ()
  # The device attribute that names a device's fast domain, and what the report calls it.
  domain_attribute: str = "process_index"
  domain_source: str = "processes"
  # Whether the devices of a single-process program each stand for a host (how tests,
  # demos and users emulate a cluster on CPU).
  one_process_is_hosts: bool = False
  # Cost model (cost.py): the native collective's 16-bit floats go as f32 on the wire;
  # across domains the native all-reduce is one flat ring over every device ("ring") or
  # the bandwidth-optimal hierarchical form ("hierarchical").
  widens_16_bit_on_wire: bool = False
  native_across: Literal["hierarchical", "ring"] = "hierarchical"
  # On-chip cost the rewrite adds, (seconds per site, seconds per value); the kernel
  # form's where it was measured (cost.py gives each figure's command).
  compute_s: tuple[float, float] = (2e-5, 3e-11)
  # and, in the tiled form, seconds per value per member of the quantized all-reduce's
  # group (the sum over the members; from 16 of them a loop).
  compute_per_member_s: float = 2.6e-12
  # and, in the tiled form with blocks of several rows of lanes (no rotation's default),
  # seconds per value more than with blocks of one row: for 16-bit operands, for f32.
  blocks_of_rows_compute_s: tuple[float, float] = (0.0, 0.0)
  kernel_compute_s: tuple[float, float] | None = None
  # The kernel form's two-shot by collective-permutes of packed chunks inside fast
  # links (quantize_kernel.KernelExchange.PERMUTES), else by all-to-all and all-gather.
  kernel_permutes: bool = False
  # Emission (forms.SitePlan, hierarchical.py): the forward rotation as one matmul (else
  # the model's butterflies, its bits); NaN propagated inside the combiner; the tiled
  # form's blocks in the operand's (8, 128) tiles; small sites' codes and scales packed
  # in one payload per exchange; collectives inside loops (else every step written out);
  # the pieces inside a domain from an all-reduce (else a reduce-scatter);
  # the tiled form's block maxima over the rows, then the lanes (else in one reduction).
  matmul_rotation: bool = True
  nan_in_combiner: bool = True
  block_max_in_stages: bool = False
  tile_order: bool = False
  pack_small_scales: bool = False
  collectives_in_loops: bool = True
  pieces_by_all_reduce: bool = False
  # --equarx_outline=auto outlines the rewritten sites (rewrite.py, outline.py).
  outline_by_default: bool = False
  # The other names JAX gives the platform (a device's `platform`, a lowering's).
  jax_aliases: tuple[str, ...] = ()
  # The kernel form (quantize_kernel.py): where its Pallas kernels run for a program
  # compiled for this platform ("tpu": Mosaic, "cuda": Triton, "interpret": Pallas's
  # interpreter; "": none), and whether that needs this platform's own forms.
  kernel_target: str = ""
  kernel_needs_own_forms: bool = True
  # The partitioned route (partitioned.py): the per-device program is read after the
  # simplification passes that follow the SPMD partitioner (else right after it), and
  # the compiler takes MHLO left in the rebuilt program (else StableHLO only).
  read_after_simplification: bool = False
  compiles_mhlo: bool = False
  # Memory (cost.py): the tiles the platform stores arrays in, padded to whole tiles; None:
  # stored as they are (CPU, GPU).
  tiles: TileRule | None = None

  def stored_size(self, shape: tuple[int, ...], itemsize: int, default_layout: bool) -> int:
    """Values an array of `shape` takes in this platform's memory (TileRule)."""
    if self.tiles is None:
      return math.prod(shape)
    return self.tiles.stored_size(shape, itemsize, default_layout)

  def links_for(self, device_kind: str = "") -> tuple[LinkClass, LinkClass]:
    for prefix, links in self.links_by_device_kind:
      if device_kind.startswith(prefix):
        return links
    return self.links


PLATFORMS: dict[str, PlatformRules] = {}


def register(rules: PlatformRules) -> PlatformRules:
  return registry.add(PLATFORMS, rules, "platform")


register(
  PlatformRules(
    "cpu",
    CPU_LINKS,
    one_process_is_hosts=True,
    # XLA:CPU's collectives across processes (gloo): one flat ring, 16-bit floats as f32.
    widens_16_bit_on_wire=True,
    native_across="ring",
    compute_s=(2e-4, 1.3e-8),
    compute_per_member_s=0.0,
    # The model's butterflies (its bits), and no collective inside a loop.
    matmul_rotation=False,
    nan_in_combiner=False,
    # One payload per exchange compiles faster where many small sites sit in one
    # program; large sites run faster without the packing copies (forms.py).
    pack_small_scales=True,
    collectives_in_loops=False,
    # hierarchical.domain_piece says why.
    pieces_by_all_reduce=True,
    outline_by_default=True,
    # The kernels run in Pallas's interpreter whatever forms the program was given.
    kernel_target="interpret",
    kernel_needs_own_forms=False,
    read_after_simplification=True,
    compiles_mhlo=True,
  )
)
register(
  PlatformRules(
    "tpu",
    TPU_LINKS["TPU v5 lite"],
    tuple(TPU_LINKS.items()),
    domain_attribute="slice_index",
    domain_source="TPU slices",
    compute_s=(2e-5, 3e-11),
    compute_per_member_s=2.6e-12,
    blocks_of_rows_compute_s=(1.5e-11, 1.2e-11),
    kernel_compute_s=(7e-7, 1.14e-11),
    kernel_permutes=True,
    tile_order=True,
    # libtpu writes one reduction of (8, 128) blocks out block by block: its compile
    # time grows with the chunk (quantize_emit.block_max).
    block_max_in_stages=True,
    kernel_target="tpu",
    tiles=TileRule(),
  )
)
register(
  PlatformRules(
    "gpu",
    GPU_LINKS,
    compute_s=(4.2e-5, 1.2e-11),
    compute_per_member_s=0.0,
    jax_aliases=("cuda", "rocm"),
    kernel_target="cuda",
  )
)

# A name no rule is registered for (none reaches the pass: policy.target_platform gives a
# registered one): an accelerator's rules with the CPU's links and the TPU's compute.
_UNKNOWN = PlatformRules("", CPU_LINKS)


def rules_for(platform: str | None) -> PlatformRules:
  return PLATFORMS.get(platform or "", _UNKNOWN)


def named_by_jax(jax_platform: str | None) -> str | None:
  """The registered platform JAX calls `jax_platform` ("cuda" -> "gpu"), or None."""
  for rules in PLATFORMS.values():
    if jax_platform == rules.name or jax_platform in rules.jax_aliases:
      return rules.name
  return None
