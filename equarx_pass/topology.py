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

The link classes and each platform's rules are data in platforms.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from equarx_pass.platforms import LinkClass, rules_for


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
  rules = rules_for(platform)
  fast, slow = rules.links_for(kind)
  domains = tuple(int(getattr(d, rules.domain_attribute, 0) or 0) for d in devices)
  source = rules.domain_source
  if rules.one_process_is_hosts and len(set(domains)) == 1 and len(devices) > 1:
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
  fast, slow = rules_for(platform).links
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
  named_node_size: int = 0,
) -> Topology:
  """The one rule for a module's topology, in order: domains the flags give
  (--equarx_domain_devices, --equarx_domains); else the devices' own, where the program's
  devices are known (from_devices: TPU slices, processes); else one TPU slice for a named
  TPU topology (--equarx_compile_for=tpu:TOPOLOGY), or nodes of `named_node_size` GPUs for
  a named GPU cluster (--equarx_compile_for=gpu:MODEL:NxG); else one host per device.
  Raises ValueError where the devices do not split into `num_domains` equal domains."""
  if devices is not None and not domain_devices and not num_domains:
    return from_devices(devices, platform, fast_bandwidth, slow_bandwidth)
  if not num_domains and not domain_devices and named_tpu_topology:
    num_domains = 1
  if not num_domains and not domain_devices and named_node_size:
    nodes = from_size(num_devices, platform, named_node_size, 0, fast_bandwidth, slow_bandwidth)
    return dataclasses.replace(
      nodes, source=f"nodes of {named_node_size} GPUs, --equarx_compile_for"
    )
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
