"""Which devices share a fast link, and what each class of link moves: what the per-site plan
decides from.  Plain Python; no MLIR, no JAX.

A *fast domain* is a set of devices joined by a fast interconnect: a TPU slice (ICI), the
GPUs of one host (NVLink), the CPU devices of one process (memory).  Between domains the
links are slow: the data-center network between TPU slices (DCN), InfiniBand or Ethernet
between hosts.  Quantizing pays on the slow links and loses on the fast ones, so a group
that spans several domains is reduced natively inside each domain and quantized only across
them (hierarchical.py), and a group inside one domain is left native unless told otherwise.

Device ids are the logical ids the module's replica groups name (partition ids on the jit
routes), so `domains[i]` is the domain of the device at position i of the program's device
assignment.

Link figures are defaults from public sources, per device and direction (docs/topology.md
cites them); `--equarx_fast_link_bandwidth` and `--equarx_slow_link_bandwidth` override them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence


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


def default_links(platform: str, device_kind: str = "") -> tuple[LinkClass, LinkClass]:
  """(fast, slow) link classes for a platform ("cpu", "gpu", "tpu") and device kind."""
  if platform == "tpu":
    for prefix, links in TPU_LINKS.items():
      if device_kind.startswith(prefix):
        return links
    return TPU_LINKS["TPU v5 lite"]
  if platform == "gpu":
    return GPU_LINKS
  return CPU_LINKS


@dataclasses.dataclass(frozen=True)
class Topology:
  """The fast domain of every device id, the two link classes, and how it was found."""

  domains: tuple[int, ...]
  fast: LinkClass
  slow: LinkClass
  platform: str = "cpu"
  source: str = ""  # "TPU slices", "processes", "--equarx_domain_devices=4", ...

  @property
  def num_domains(self) -> int:
    return len(set(self.domains))

  def domain_of(self, device: int) -> int:
    return self.domains[device] if device < len(self.domains) else device

  def split(self, group: Sequence[int]) -> list[tuple[int, ...]]:
    """The group's members by fast domain, domains in order of first appearance, members
    in group order."""
    by_domain: dict[int, list[int]] = {}
    for device in group:
      by_domain.setdefault(self.domain_of(device), []).append(device)
    return [tuple(members) for members in by_domain.values()]

  def describe(self) -> str:
    count = self.num_domains
    what = f"{count} fast domain{'s' if count != 1 else ''} ({self.source})"
    return (
      f"{what}; {self.fast.name} {self.fast.gbytes_per_s:g} GB/s inside, "
      f"{self.slow.name} {self.slow.gbytes_per_s:g} GB/s "
      f"{'per device' if self.slow.per_device else 'per domain'} across"
    )


def from_devices(
  devices: Sequence[Any], platform: str, fast_bandwidth: float = 0, slow_bandwidth: float = 0
) -> Topology:
  """The topology of a device assignment (jax devices, position = logical id).

  TPU: a slice is a fast domain (`slice_index`; compile-only topologies have it too).
  GPU and CPU: a process is one (`process_index`), except a single-process CPU program,
  which is how tests, demos and experiments emulate a cluster: there each device stands
  for a host of its own.
  """
  kind = getattr(devices[0], "device_kind", "") if devices else ""
  fast, slow = default_links(platform, kind)
  if platform == "tpu":
    domains = tuple(int(getattr(d, "slice_index", 0) or 0) for d in devices)
    source = "TPU slices"
  else:
    domains = tuple(int(getattr(d, "process_index", 0)) for d in devices)
    source = "processes"
    if platform == "cpu" and len(set(domains)) == 1 and len(devices) > 1:
      domains, source = tuple(range(len(devices))), "one host per CPU device (one process)"
  return Topology(
    domains,
    fast.with_bandwidth(fast_bandwidth),
    slow.with_bandwidth(slow_bandwidth),
    platform,
    source,
  )


def from_size(
  num_devices: int,
  platform: str,
  domain_devices: int = 0,
  num_domains: int = 0,
  fast_bandwidth: float = 0,
  slow_bandwidth: float = 0,
) -> Topology:
  """Consecutive device ids in domains of `domain_devices` (or `num_domains` equal ones);
  neither: every device a domain of its own (a host per device)."""
  fast, slow = default_links(platform)
  if num_domains:
    if num_devices % num_domains:
      raise ValueError(f"{num_devices} devices do not split into {num_domains} equal domains")
    domain_devices = num_devices // num_domains
    source = f"--equarx_domains={num_domains}" if num_domains > 1 else "one TPU slice"
  elif domain_devices:
    source = f"--equarx_domain_devices={domain_devices}"
  else:
    domain_devices, source = 1, "one host per device"
  return Topology(
    tuple(i // domain_devices for i in range(num_devices)),
    fast.with_bandwidth(fast_bandwidth),
    slow.with_bandwidth(slow_bandwidth),
    platform,
    source,
  )


def derive(
  num_devices: int,
  platform: str,
  devices: Sequence[Any] | None = None,
  domain_devices: int = 0,
  num_domains: int = 0,
  named_tpu_topology: bool = False,
  fast_bandwidth: float = 0,
  slow_bandwidth: float = 0,
) -> Topology:
  """The one rule for a module's topology, in order: domains the flags give
  (--equarx_domain_devices, --equarx_domains); else the devices' own, where the program's
  devices are known (from_devices: TPU slices, processes); else one TPU slice for a named
  TPU topology (--equarx_compile_for=tpu:TOPOLOGY); else one host per device.  Raises
  ValueError where the devices do not split into `num_domains` equal domains."""
  if devices is not None and not domain_devices and not num_domains:
    return from_devices(devices, platform, fast_bandwidth, slow_bandwidth)
  if not num_domains and not domain_devices and named_tpu_topology:
    num_domains = 1
  return from_size(
    num_devices, platform, domain_devices, num_domains, fast_bandwidth, slow_bandwidth
  )


@dataclasses.dataclass(frozen=True)
class Levels:
  """A site's groups split by fast domain: `inner` (one per group and domain: the k
  members of the group in that domain, in group order) and `outer` (one per group and
  position j: the S members at position j of their domain, domains in order)."""

  inner: tuple[tuple[int, ...], ...]
  outer: tuple[tuple[int, ...], ...]

  @property
  def per_domain(self) -> int:
    return len(self.inner[0])

  @property
  def domains(self) -> int:
    return len(self.outer[0])


def split_groups(groups: Sequence[Sequence[int]], topology: Topology) -> Levels | str:
  """The levels of `groups` on `topology`, or why the group cannot be split: it lies in
  one domain, or its domains hold different numbers of its members."""
  inner: list[tuple[int, ...]] = []
  outer: list[tuple[int, ...]] = []
  shapes = set()
  for group in groups:
    parts = topology.split(group)
    if len(parts) < 2:
      return "inside one fast domain"
    sizes = {len(p) for p in parts}
    if len(sizes) != 1:
      counts = ", ".join(str(len(p)) for p in parts)
      return f"spans {len(parts)} fast domains unevenly ({counts} members)"
    shapes.add((len(parts), len(parts[0])))
    inner.extend(parts)
    outer.extend(tuple(p[j] for p in parts) for j in range(len(parts[0])))
  if len(shapes) != 1:
    return "its groups split into domains differently"
  return Levels(tuple(inner), tuple(outer))
