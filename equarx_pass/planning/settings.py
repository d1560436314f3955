"""The policy by concern: each stage gets the part of it that it reads, and no more.

`Policy` (policy.py) is the one public face, built from Python or flags; these views
are what it hands the stages: match.py reads a Selection, the topology the
LinkSettings, the rewrite patterns the EmissionSettings.  The planner (plan.py), which
weighs all of them, and the front ends take the Policy itself.
"""

from __future__ import annotations

import dataclasses

from equarx_pass.emission.scheme import Scheme

# Bytes per element of each element type the pass may select (MLIR spelling).
DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4}


@dataclasses.dataclass(frozen=True)
class Selection:
  """Which collectives are rewritten: all that match.py reads.

  The scheme the sites would get and the platform they are emitted for are part of it:
  a site that the scheme cannot emit faithfully there (no reduce-scatter half, a loop
  the platform cannot hold collectives in) is not selected.
  """

  enable: bool
  min_bytes: int
  max_bytes: int  # 0: no upper bound
  dtypes: tuple[str, ...]
  ops: tuple[str, ...]
  scheme: Scheme
  flat_why: str | None  # why the flat form is emitted (None: the tiled form is)
  platform: str
  # What crosses only slow links is sent with (--equarx_slow_format; else `scheme`).
  slow_scheme: Scheme


@dataclasses.dataclass(frozen=True)
class LinkSettings:
  """What the flags say of the fast domains and the links (topology.derive)."""

  domain_devices: int  # consecutive device ids per domain (0: from the devices)
  domains: int  # this many equal domains (0: from the devices)
  one_slice: bool  # compiled for a named topology, which is one slice
  fast_link_bandwidth: float  # GB/s per device and direction (0: the platform's)
  slow_link_bandwidth: float
  node_size: int  # compiled for a named GPU cluster: its GPUs per node (else 0)


@dataclasses.dataclass(frozen=True)
class EmissionSettings:
  """How rewritten sites are written out (site_patterns.py)."""

  platform: str  # the platform whose forms are emitted
  form: str  # auto, tiled, flat or kernel
  unroll_min_bytes: int  # ring sites this large get their steps written out
