"""The cost model: what a site sends over each class of link, natively and rewritten, and the
time each takes, so that a site is rewritten only where that is predicted to win.

A prediction is bytes over bandwidth plus a latency per collective step, for each link
class (topology.py), plus the on-chip work the rewrite adds.  The figures are per device:
what one device sends, and on CPU hosts (k devices share a host's link) what its host's
link carries divided by k.  Plain Python.

On-chip cost, beyond the native all-reduce's own: seconds per site plus seconds per value
that enters the quantized all-reduce (on TPU, plus seconds per value and member of its
group).  Per value, not per byte: the added work (rotate, take block maxima, quantize, sum
in f32, dequantize) is f32 arithmetic on every value whatever the operand's type, and the
TPU estimates give about the same time per value for bf16 and f32 operands.
  tpu  2e-5 s, 3e-11 s + 2.6e-12 s a member  the compiled TPU program's schedule
                replayed (frontends/tpu_schedule.py: the compiler's cycles per
                instruction, or its bytes at HBM speed where more) for v5e:2x2, 2x4 and
                4x4 (`python tools/schedule_estimate.py --topology v5e:2x2 v5e:2x4
                v5e:4x4 --sizes 4M 32M --dtypes bf16 f32 --scheme=--equarx_enable
                --out results/schedule_estimate_tiled.json`): the tiled form's work on the core
                39-54 ps a value at 4 and 8 members, 67-100 ps at 16 (its sum over the
                members a loop from 16); this fit is within 0.88x to 1.35x of each of the
                twelve, on the high side at 8 members.  (`optimal_seconds`, the
                compiler's HBM-traffic bound, gives 25.7 ps a value: it leaves out the
                cycles of the arithmetic.)  Blocks of several rows of lanes (no rotation)
                add 15 ps a value for 16-bit operands and 12 ps for f32
                (blocks_of_rows_compute_s; between libtpu 0.0.42.1 and 0.0.50.1,
                BUILD_NOTES; `python tools/schedule_estimate.py --topology
                v5e:2x2 v5e:4x4 --sizes 4M 32M --dtypes bf16 f32 --unforced
                --scheme="--equarx_enable --equarx_rotation=none"
                --out results/schedule_estimate_rows.json`).
  gpu  4.2e-5 s, 1.2e-11 s  an H100: the default site's own work on one device, its
                collectives stood in locally (`python tools/bench_twin.py --platform cuda
                --values 32M`, results/twin_cuda_32M.json): 0.63 ms for 32 Mi bf16 values
                against 0.23 ms for the native all-reduce's sum of 4 (0.75 against 0.36 ms
                for f32), 12 ps a value.  Per site: the ring step's fixed 0.042 ms a call
                (`python tools/bench_gpu_step.py --platform cuda`, results/ring_step_cuda.json;
                dispatch included); the twin at 1 Mi values (`--values 1M`) leaves 0.04 to
                0.07 ms beyond its values.
  cpu  2e-4 s, 1.3e-8 s  XLA:CPU, 4 devices in one process on 2 cores (`python
                tools/bench_ring_cpu.py --values 4M --dtypes bf16 f32 --scheme=--equarx_enable`,
                results/ring_cpu_dtypes.json): the default adds 56.1 ms to the native
                all-reduce for 4 Mi bf16 values per device, 58.9 ms for f32; at 16 Ki
                values (`--values 16K`, results/ring_cpu_small.json) 0.3-0.4 ms, about
                0.2 ms more than its values account for

The kernel form (--equarx_form=kernel, quantize_kernel.py) has its own figure where it
was measured:
  tpu  7e-7 s, 1.14e-11 s  the TPU compiler's estimates, v5e:2x2, with each kernel priced
                by the bytes it reads and writes (its declared cost: the estimates cannot
                see inside a Mosaic kernel) (`python tools/bench_tpu.py --topology v5e:2x2
                --sizes 256K 1M 4M 16M 128M --dtypes bf16 f32
                --scheme="--equarx_enable --equarx_form=kernel"`,
                results/tpu_sizes_kernel.json): 11.3-11.5 ps a value from 16 MiB up
                (11.6-11.9 at 4 MiB), and 0.5-0.7 us a site beyond its values at 1 MiB
                and below.
Elsewhere (GPU: not yet timed) the kernel form is priced as the tiled form.  The figures
are data, each platform's PlatformRules.compute_s and kernel_compute_s (platforms.py).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from equarx_pass.emission.quantize_kernel import KernelExchange
from equarx_pass.platforms import rules_for
from equarx_pass.topology import Topology
from equarx_pass.traffic import Declaration


@dataclasses.dataclass(frozen=True)
class Traffic:
  """Bytes one device sends over each link class, and the collective steps on each."""

  fast: float = 0.0
  slow: float = 0.0
  fast_steps: int = 0
  slow_steps: int = 0

  def __add__(self, other: Traffic) -> Traffic:
    return Traffic(
      self.fast + other.fast,
      self.slow + other.slow,
      self.fast_steps + other.fast_steps,
      self.slow_steps + other.slow_steps,
    )

  def seconds(self, topology: Topology, sharing: int = 1) -> float:
    """`sharing`: devices of a domain that send alike (a shared link divides by them)."""
    return topology.fast.seconds(self.fast, self.fast_steps, sharing) + topology.slow.seconds(
      self.slow, self.slow_steps, sharing
    )

  @property
  def total(self) -> float:
    return self.fast + self.slow


def wire_itemsize(dtype_bytes: int, platform: str) -> int:
  """Bytes per element a native float collective puts on the wire: XLA:CPU widens 16-bit
  floats to f32 on the wire (PlatformRules.widens_16_bit_on_wire)."""
  return 4 if rules_for(platform).widens_16_bit_on_wire and dtype_bytes == 2 else dtype_bytes


def _split(group: Sequence[int], topology: Topology) -> tuple[int, int]:
  """(domains the group spans, members per domain, the largest)."""
  parts = topology.split(group)
  return len(parts), max(len(p) for p in parts)


def native_all_reduce(
  group: Sequence[int], nbytes: int, dtype_bytes: int, topology: Topology
) -> Traffic:
  """The native all-reduce of `nbytes` per device over `group`.

  Inside one domain: 2(N-1)/N of the bytes on fast links, in one collective (TPU, GPU
  and an XLA:CPU process run it as one operation).  Across S domains of k: on TPU and
  GPU the bandwidth-optimal hierarchical form (XLA across TPU slices, NCCL across hosts):
  2(k-1)/k of the bytes inside, 2(S-1)/S of a 1/k piece across, three collectives.  On
  CPU, XLA's collectives across processes (gloo) are one flat ring over the devices, a
  network step each: each host's link carries 2(N-1)/N of one device's bytes, widened to
  f32, per k devices.
  """
  n = len(group)
  domains, k = _split(group, topology)
  wire = nbytes * wire_itemsize(dtype_bytes, topology.platform) // max(dtype_bytes, 1)
  if domains == 1:
    return Traffic(fast=2 * (n - 1) / n * wire, fast_steps=1)
  if rules_for(topology.platform).native_across == "ring":
    return Traffic(
      fast=2 * (n - 1) / n * wire * (k - 1) / k,
      slow=2 * (n - 1) / n * wire / k,
      fast_steps=0,
      slow_steps=2 * (n - 1),
    )
  return Traffic(
    fast=2 * (k - 1) / k * wire,
    slow=2 * (domains - 1) / domains * wire / k,
    fast_steps=2 if k > 1 else 0,
    slow_steps=1,
  )


def native_inside(per_domain: int, nbytes: int, dtype_bytes: int, platform: str) -> Traffic:
  """A native reduce-scatter and all-gather of `nbytes` inside a domain of k devices (an
  all-reduce for the reduce-scatter where the platform takes the pieces so:
  PlatformRules.pieces_by_all_reduce, hierarchical.domain_piece)."""
  k = per_domain
  wire = nbytes * wire_itemsize(dtype_bytes, platform) // max(dtype_bytes, 1)
  passes = 3 if rules_for(platform).pieces_by_all_reduce else 2
  return Traffic(fast=passes * (k - 1) / k * wire, fast_steps=2)


def priced(declared: Declaration) -> Traffic:
  """A declaration as traffic per link class: its crossing share on the slow links, the
  rest on the fast ones, every step on each class it uses."""
  wire_bytes, steps = declared.wire_bytes, declared.steps
  slow = wire_bytes * declared.crossing
  return Traffic(
    fast=wire_bytes - slow,
    slow=slow,
    fast_steps=steps if slow < wire_bytes else 0,
    slow_steps=steps if slow > 0 else 0,
  )


def across(declared: Declaration) -> Traffic:
  """A declaration sent whole across domains (the quantized part of a hierarchical
  site, one member of each domain in its group)."""
  return Traffic(slow=declared.wire_bytes, slow_steps=declared.steps)


@dataclasses.dataclass(frozen=True)
class Prediction:
  native: Traffic
  rewritten: Traffic
  native_s: float
  rewritten_s: float
  compute_s: float

  @property
  def speedup(self) -> float:
    return self.native_s / self.rewritten_s if self.rewritten_s > 0 else float("inf")


def permuted_exposed_share(members: int, itemsize: int) -> float:
  """Of the kernel form's on-chip time, the share its permuted exchange leaves outside
  the transfers (quantize_kernel.KernelExchange.PERMUTES): the first chunk's quantize,
  the sum and the last chunk's dequantize, while the other chunks' kernels run under the
  permutes.  Each kernel's share is the bytes it moves a value, as the TPU compiler
  prices a kernel: the quantize and the dequantize the operand's `itemsize` and a packed
  code's (1 + 4 / 128) each, the sum N + 1 chunks' codes for every N values.  By the
  replay of the compiled schedule (`python tools/schedule_estimate.py --topology v5e:2x2
  v5e:4x4 --sizes 32M --dtypes bf16 f32`: a site's time less its links', over its core's)
  the exposed work is 0.38x (bf16) and 0.33x (f32) of the on-chip time over 4 chips,
  where this gives 0.38x and 0.34x; over 16 chips 0.21x and 0.31x against 0.21x and
  0.15x (f32's transfers are too short there to hide all of the kernels)."""
  code = 1 + 4 / 128
  ends = 2 * (itemsize + code)
  summed = code * (members + 1) / members
  return (ends / members + summed) / (ends + summed)


def predict(
  native: Traffic,
  rewritten: Traffic,
  quantized_values: int,
  topology: Topology,
  sharing: int = 1,
  kernels: KernelExchange | None = None,
  members: int = 0,
  blocks_of_rows: int = 0,
  itemsize: int = 4,
) -> Prediction:
  """Native against rewritten time; `quantized_values` enter the quantized all-reduce
  (none: no on-chip work added) of `members` devices, `itemsize` bytes each; `sharing`
  devices of a domain send alike; `kernels`: the kernel form's exchange, priced with its
  on-chip cost where the platform has one (the permuted exchange's partly under its
  transfers); `blocks_of_rows`: the operand's bytes a value where the tiled form's blocks
  are several rows of lanes (forms.tile_shape), else 0."""
  rules = rules_for(topology.platform)
  per_site, per_value = rules.compute_s
  per_value += members * rules.compute_per_member_s
  if blocks_of_rows:
    narrow, wide = rules.blocks_of_rows_compute_s
    per_value += narrow if blocks_of_rows == 2 else wide
  share = 1.0
  if kernels is not None and rules.kernel_compute_s is not None:
    per_site, per_value = rules.kernel_compute_s
    if kernels is KernelExchange.PERMUTES:
      share = permuted_exposed_share(members, itemsize)
  compute_s = (per_site + quantized_values * per_value) * share if quantized_values else 0.0
  return Prediction(
    native,
    rewritten,
    native.seconds(topology, sharing),
    rewritten.seconds(topology, sharing) + compute_s,
    compute_s,
  )
