"""Which all-reduces to rewrite, and how: one frozen Policy, built from Python or flags.

Flags use XLA_FLAGS syntax: `--equarx_enable --equarx_min_bytes=65536`.  Process
defaults come from the EQUARX_FLAGS environment variable; a `flags=` string on
one function is applied on top of them.  Every flag is declared once, in FLAGS.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from typing import Any, Callable, Literal, get_args

from equarx_pass.emission import rotation as rotation_lib
from equarx_pass.emission import scheme as scheme_lib
from equarx_pass.emission.algorithms import ALGORITHMS as ALGORITHM_REGISTRY
from equarx_pass.emission.formats import FORMATS as FORMAT_REGISTRY
from equarx_pass.errors import FlagError
from equarx_pass.planning.settings import DTYPE_BYTES, EmissionSettings, LinkSettings, Selection
from equarx_pass.platforms import PLATFORMS as PLATFORM_RULES
from equarx_pass.platforms import named_by_jax, rules_for
from equarx_pass.site_kind import SITE_KINDS, SiteKind

ENV_VAR = "EQUARX_FLAGS"
DTYPES = tuple(DTYPE_BYTES)
# The collectives the pass may rewrite: float-sum all-reduces (the default), and, when
# named, float-sum reduce-scatters and all-gathers (match.py finds them; each algorithm's
# emit_reduce_scatter, algorithms/, and all_gather.py emit them).
OPS = SITE_KINDS
# What the scheme flags may name: the keys of the registries (formats/, algorithms/).
FORMATS = tuple(FORMAT_REGISTRY)
ALGORITHMS = tuple(ALGORITHM_REGISTRY)
ROTATIONS = rotation_lib.ROTATIONS
ROUNDINGS = scheme_lib.ROUNDINGS
BLOCK_LAYOUTS = scheme_lib.BLOCK_LAYOUTS
# Where equarx_pass.jit looks for all-reduces (partitioned.py): in the lowered
# StableHLO, in the per-device program after SPMD partitioning, or (auto) in the
# latter whenever the partitioner has work to do (match.auto_sharded_ops).
Mode = Literal["auto", "on", "off"]
PARTITIONED_MODES = get_args(Mode)
# Whether each rewritten all-reduce becomes a private function called out of line
# (rewrite.py): on, off, or (auto) only for a program compiled for XLA:CPU, the
# backend where it was measured (BUILD_NOTES, "Compile-time decisions").
OUTLINE_MODES = get_args(Mode)
# The platform the tiled form is emitted for (on CPU its forward rotation is the model's
# butterflies, elsewhere a matmul): auto = where equarx_pass.jit compiles the program;
# for equarx-opt, the platform of --equarx_compile_for (tpu:..., gpu:...), else cpu.
Platform = Literal["auto", "cpu", "tpu", "gpu"]
PLATFORMS = get_args(Platform)
# The emitted form: tiled or flat (forms.py); auto = tiled wherever the
# scheme has a tiled form (it measured faster on XLA:CPU too; BUILD_NOTES, "Emitted forms").
# kernel: tiled, with two-shot's quantize, sum and dequantize as Pallas kernels
# (quantize_kernel.py) on TPU and GPU; opt-in until the kernels run on a device
# (BUILD_NOTES, "The kernel form").
Form = Literal["auto", "tiled", "flat", "kernel"]
FORMS = get_args(Form)
# How the kernel form's two-shot exchanges its chunks: collectives = all-to-all and
# all-gather; permutes = collective-permutes of packed chunks where the platform has them
# (TPU, inside fast links; quantize_kernel.KernelExchange), else the collectives.  The
# permutes by default: they overlap the transfers with the kernels, for 1.6 to 3.4 times
# the collectives' TPU compile, about a second a site (BUILD_NOTES, "collective-permutes
# of packed chunks").
KernelExchangeFlag = Literal["collectives", "permutes"]
KERNEL_EXCHANGES = get_args(KernelExchangeFlag)
Hierarchy = Literal["auto", "flat"]
HIERARCHIES = get_args(Hierarchy)
# Values per scale when --equarx_block_size is not given: 1024, or with a rotation in the
# tiled form one scale per rotation (the most accurate int8 scheme, and no dearer than
# 1024: on XLA:CPU in one process, and by the TPU compiler's estimates).
BLOCK_DEFAULT = 1024
# The tiled form's rotation when --equarx_rotation_size is not given: one 128-lane row,
# a matmul per tile (H_1024 costs 8x the multiplies).
ROTATION_SIZE_TILED = 128


@dataclasses.dataclass(frozen=True)
class Policy:
  """What the pass selects and what it emits.  Nothing is rewritten unless `enable`."""

  enable: bool = False
  min_bytes: int = 131072  # skip all-reduces smaller than this (total operand bytes)
  max_bytes: int = 0  # skip larger ones; 0 = no upper bound
  dtypes: tuple[str, ...] = DTYPES
  ops: tuple[str, ...] = (SiteKind.ALL_REDUCE,)  # the collectives to rewrite
  block_size: int = 0  # values per f32 scale; 0: the form's default (resolved)
  format: str = "int8"
  # Default: the scheme that meets the accuracy targets (README, "Schemes"):
  # two quantizations per value instead of N, and outliers spread by the rotation.
  algorithm: str = "two_shot"
  rotation: str = "hadamard"
  rotation_size: int = 0  # Hadamard block, a power of two (0: see Scheme)
  microshards: int = 1  # independent permutes per ring step
  rounding: str = "nearest"  # or "stochastic": integer codes rounded with a uniform draw
  # Ring schemes: sites with at least this many operand bytes get their reduce-scatter
  # steps written out.  A loop copies all N chunks on every call (about a third of the
  # int8 ring's run time for 32 MiB of bf16 on XLA:CPU); written out, the module grows by
  # N - 2 steps per site, which costs compile time (BUILD_NOTES, "Performance decisions").
  unroll_min_bytes: int = 4 << 20
  block_layout: str = "fixed"  # "grid": the paper's 8 x 128 scales per chunk
  report: bool = False  # print the site table after each rewrite
  compile_for: str = ""  # e.g. "tpu:v5e:2x2": also compile for that topology
  partitioned: Mode = "auto"  # equarx_pass.jit: rewrite the partitioned program
  outline: Mode = "auto"  # each site a function called out of line
  calibration: str = ""  # a calibration file (equarx_pass.calibrate): its sites use
  # static int4 scales with bf16 outlier features
  calibration_clip: float = 0.0  # > 0: static range = min(range, this x rms) per feature
  # A check of the route, not a speed-up: every site the run would rewrite is planned as
  # it would be and rebuilt (the partitioned program around it) with its native
  # collective, so the result must equal plain jax.jit's bit for bit.  It turns the pass
  # on by itself (__post_init__): a check that silently did nothing would pass.
  identity: bool = False
  platform: Platform = "auto"  # where the program runs
  form: Form = "auto"  # the emitted form
  kernel_exchange: KernelExchangeFlag = "permutes"  # the kernel form's exchange
  # Rewrite every site the size and dtype policy selects, whatever the cost model
  # predicts (experiments; measuring the emitted form on fast links).
  force: bool = False
  # Groups that span fast domains evenly: "auto" reduces natively inside each domain and
  # quantizes only across them (hierarchical.py); "flat" quantizes over the whole group.
  hierarchy: Hierarchy = "auto"
  # Fast domains when the devices do not say (equarx-opt), or to override them: this many
  # consecutive device ids per domain, or this many equal domains (0: from the devices;
  # for files, one host per device).
  domain_devices: int = 0
  domains: int = 0
  # Link bandwidths in GB/s per device and direction (0: the platform's default,
  # topology.py).
  fast_link_bandwidth: float = 0.0
  slow_link_bandwidth: float = 0.0
  # The format of what crosses only slow links ("": --equarx_format): the hierarchical
  # route's step across domains, and a group with one member per domain.  int4 there halves
  # the bytes again where links are slowest, while every other rewrite (a group inside one
  # domain, a group that spans domains unevenly) keeps --equarx_format (slow_scheme).
  slow_format: str = ""

  def __post_init__(self):
    if self.identity and not self.enable:
      object.__setattr__(self, "enable", True)  # frozen; identity implies the pass
    if self.min_bytes < 0:
      raise FlagError(f"--equarx_min_bytes must be >= 0, got {self.min_bytes}")
    if self.unroll_min_bytes < 0:
      raise FlagError(f"--equarx_unroll_min_bytes must be >= 0, got {self.unroll_min_bytes}")
    if self.max_bytes < 0:
      raise FlagError(f"--equarx_max_bytes must be >= 0 (0 = no bound), got {self.max_bytes}")
    if not 0 <= self.block_size <= 1 << 20:
      raise FlagError(
        f"--equarx_block_size must be in [1, 1048576] (0: the default), got {self.block_size}"
      )
    if not self.ops or any(o not in OPS for o in self.ops) or len(set(self.ops)) != len(self.ops):
      raise FlagError(
        f"--equarx_ops takes a comma list of {','.join(OPS)}, each once, "
        f"got {repr(','.join(self.ops)) if self.ops else 'nothing'}"
      )
    bad = [d for d in self.dtypes if d not in DTYPES]
    if bad or not self.dtypes:
      raise FlagError(
        f"--equarx_dtypes takes a comma list of {','.join(DTYPES)}, got {self.dtypes}"
      )
    for flag, value, choices in (
      # The registries as they are now: a format or algorithm registered after import
      # (formats.register, algorithms.register) is a valid choice.
      ("format", self.format, tuple(FORMAT_REGISTRY)),
      ("algorithm", self.algorithm, tuple(ALGORITHM_REGISTRY)),
      ("rotation", self.rotation, ROTATIONS),
      ("rounding", self.rounding, ROUNDINGS),
      ("block_layout", self.block_layout, BLOCK_LAYOUTS),
      ("partitioned", self.partitioned, PARTITIONED_MODES),
      ("outline", self.outline, OUTLINE_MODES),
      ("platform", self.platform, ("auto", *PLATFORM_RULES)),
      ("form", self.form, FORMS),
      ("kernel_exchange", self.kernel_exchange, KERNEL_EXCHANGES),
      ("hierarchy", self.hierarchy, HIERARCHIES),
      ("slow_format", self.slow_format or self.format, tuple(FORMAT_REGISTRY)),
    ):
      if value not in choices:
        raise FlagError(f"--equarx_{flag} must be one of {','.join(choices)}, got {value!r}")
    try:
      scheme = self._scheme(self.block_size or self._default_block(), self.rotation_size)
    except ValueError as e:
      raise FlagError(f"inconsistent --equarx_* flags: {e}") from None
    try:
      self.slow_scheme(scheme)
    except ValueError as e:
      raise FlagError(f"--equarx_slow_format={self.slow_format}: {e}") from None
    if self.form in ("tiled", "kernel") and scheme.flat_only():
      built_on = (
        " (the kernel form is the tiled form with kernels)" if self.form == "kernel" else ""
      )
      raise FlagError(f"--equarx_form={self.form}: {scheme.flat_only()}{built_on}")
    if self.rounding == "stochastic" and self._flat_why():
      raise FlagError(f"--equarx_rounding=stochastic needs the tiled form ({self._flat_why()})")
    if self.compile_for:
      parse_compile_target(self.compile_for)
    if self.domain_devices < 0 or self.domains < 0:
      raise FlagError("--equarx_domain_devices and --equarx_domains must be >= 0 (0: auto)")
    if self.domain_devices and self.domains:
      raise FlagError("give --equarx_domain_devices or --equarx_domains, not both")
    if self.fast_link_bandwidth < 0 or self.slow_link_bandwidth < 0:
      raise FlagError("link bandwidths must be >= 0 GB/s (0: the platform's default)")
    if not (self.calibration_clip == 0 or 1 <= self.calibration_clip <= 100):
      raise FlagError(
        f"--equarx_calibration_clip must be 0 (off) or in [1, 100], got {self.calibration_clip}"
      )

  @property
  def scheme(self) -> scheme_lib.Scheme:
    """The quantized all-reduce this policy emits (scheme.Scheme), defaults filled in."""
    policy, _ = self.resolved()
    return policy._scheme(policy.block_size, policy.rotation_size)

  @property
  def selection(self) -> Selection:
    """What match.py reads: the sizes, types and kinds selected, and the resolved scheme
    and platform the sites would be emitted with."""
    policy, flat_why = self.resolved()
    return Selection(
      policy.enable,
      policy.min_bytes,
      policy.max_bytes,
      policy.dtypes,
      policy.ops,
      policy._scheme(policy.block_size, policy.rotation_size),
      flat_why,
      policy.platform,
      policy.slow_scheme(policy._scheme(policy.block_size, policy.rotation_size)),
    )

  @property
  def links(self) -> LinkSettings:
    """What the flags say of the topology (topology.derive)."""
    return LinkSettings(
      self.domain_devices,
      self.domains,
      # A named TPU topology is one slice; a named GPU cluster, nodes of G GPUs.
      self.compile_for.startswith("tpu:"),
      self.fast_link_bandwidth,
      self.slow_link_bandwidth,
      _named_node_size(self.compile_for),
    )

  @property
  def emission(self) -> EmissionSettings:
    """What the rewrite patterns read."""
    return EmissionSettings(self.platform, self.form, self.unroll_min_bytes)

  def slow_scheme(self, scheme: scheme_lib.Scheme) -> scheme_lib.Scheme:
    """`scheme` (the policy's, or a fallback algorithm's) with --equarx_slow_format: what a
    site sends where it crosses only slow links (plan.py).  A format that fixes its block (mxint8)
    gets that block and, rotating, a rotation of one block, as under --equarx_format."""
    if not self.slow_format or self.slow_format == scheme.format:
      return scheme
    fmt = FORMAT_REGISTRY[self.slow_format]
    if not fmt.block:
      return dataclasses.replace(scheme, format=self.slow_format)
    return dataclasses.replace(
      scheme, format=self.slow_format, block_size=fmt.block, block_layout="fixed", rotation_size=0
    )

  def _flat_why(self) -> str | None:
    """Why the flat form is emitted (None: the tiled form is)."""
    scheme = self._scheme(self.block_size or self._default_block(), self.rotation_size)
    return "--equarx_form=flat" if self.form == "flat" else scheme.flat_only()

  def _default_block(self) -> int:
    """Values per scale when --equarx_block_size is not given and nothing else decides:
    the format's own block where it fixes one (mxint8: 32), else BLOCK_DEFAULT."""
    fmt = FORMAT_REGISTRY.get(self.format)
    return fmt.block if fmt is not None and fmt.block else BLOCK_DEFAULT

  def _scheme(self, block_size: int, rotation_size: int) -> scheme_lib.Scheme:
    return scheme_lib.Scheme(
      self.algorithm,
      self.format,
      block_size,
      self.block_layout,
      self.rotation,
      rotation_size,
      self.microshards,
      self.rounding,
    )

  def outlines(self, platform: str | None) -> bool:
    """Whether rewritten sites become out-of-line calls in a program that will be
    compiled for `platform` (a JAX platform name, "cpu"; None: not known)."""
    auto = rules_for(platform).outline_by_default
    return self.outline == "on" or (self.outline == "auto" and auto)

  def target_platform(self, platform: str | None) -> str:
    """The platform whose forms are emitted, given where the program will be compiled
    (`platform`, a JAX platform name; None when not known, as for a file)."""
    if self.platform != "auto":
      return self.platform
    named = named_by_jax(platform)
    if named:
      return named
    # A file compiled for a named topology gets that platform's forms, else CPU's.
    return self.compile_for.partition(":")[0] if self.compile_for else "cpu"

  def resolved(self) -> tuple[Policy, str | None]:
    """This policy with the form's defaults filled in, and why the flat form is emitted
    (None: the tiled form is).

    Tiled: the rotation size defaults to 128 and the block size to one rotation (else
    1024); on CPU the forward rotation is the model's butterflies, elsewhere a matmul
    (rewrite.py).  Flat: block 1024 and the scheme's own rotation size.  A format that
    fixes its block (mxint8) has that block in both forms.
    """
    default = self._default_block()
    why = self._flat_why()
    if why:
      return self.replace(block_size=self.block_size or default), why
    one_rotation = max(ROTATION_SIZE_TILED, self.rotation_size)
    rotating = self.rotation != rotation_lib.NONE
    if FORMAT_REGISTRY[self.format].block:  # the format fixes its block
      block = self.block_size or default
    else:
      block = self.block_size or (one_rotation if rotating else BLOCK_DEFAULT)
    rotation_size = self.rotation_size
    if rotating and not rotation_size and block % ROTATION_SIZE_TILED == 0:
      rotation_size = ROTATION_SIZE_TILED
    return self.replace(block_size=block, rotation_size=rotation_size), None

  @classmethod
  def from_flags(cls, flags: str | None, base: Policy | None = None) -> Policy:
    """`base` (default: Policy()) with the flags in `flags` applied in order."""
    return apply_flags(base or cls(), flags or "")

  @classmethod
  def from_env(cls, environ=None) -> Policy:
    """Process defaults: Policy() with $EQUARX_FLAGS applied."""
    environ = os.environ if environ is None else environ
    try:
      return cls.from_flags(environ.get(ENV_VAR, ""))
    except FlagError as e:
      raise FlagError(f"${ENV_VAR}: {e}") from None

  def replace(self, **changes) -> Policy:
    return dataclasses.replace(self, **changes)

  def to_flags(self) -> str:
    """The flag string that rebuilds this policy from Policy()."""
    default = Policy()
    out = []
    for flag in FLAGS.values():
      value = getattr(self, flag.field)
      if value != getattr(default, flag.field):
        out.append(flag.format(value))
    return " ".join(out)


# The GPU models --equarx_compile_for=gpu:MODEL:NxG may name, and the file of XLA's
# description of each that frontends/gpu_aot.py compiles with (frontends/gpu_targets/).
GPU_TARGET_CONFIGS = {"h100": "h100_sxm.txtpb"}


@dataclasses.dataclass(frozen=True)
class GpuCluster:
  """N nodes of G GPUs of one model: what --equarx_compile_for=gpu:MODEL:NxG names."""

  model: str
  nodes: int
  gpus_per_node: int

  @property
  def num_devices(self) -> int:
    return self.nodes * self.gpus_per_node

  @property
  def topology(self) -> str:
    """The shape JAX's GPU topology API takes: slices x hosts per slice x devices per
    host.  An H100 node is an NVLink domain of its own, so a slice of one host."""
    return f"{self.nodes}x1x{self.gpus_per_node}"


def parse_cluster(topology: str) -> GpuCluster:
  """'h100:2x8' -> GpuCluster('h100', 2, 8)."""
  model, _, shape = topology.partition(":")
  found = re.fullmatch(r"(\d+)x(\d+)", shape)
  if model not in GPU_TARGET_CONFIGS or not found or min(map(int, found.groups())) < 1:
    models = ", ".join(GPU_TARGET_CONFIGS)
    raise FlagError(
      f"--equarx_compile_for=gpu: takes MODEL:NODESxGPUS with MODEL one of {models} "
      f"(e.g. gpu:h100:2x8, 2 nodes of 8 H100), got {'gpu:' + topology!r}"
    )
  return GpuCluster(model, int(found.group(1)), int(found.group(2)))


def _named_node_size(compile_for: str) -> int:
  """GPUs per node of --equarx_compile_for=gpu:MODEL:NxG (0 for any other target)."""
  platform, _, cluster = compile_for.partition(":")
  return parse_cluster(cluster).gpus_per_node if platform == "gpu" else 0


def parse_compile_target(spec: str) -> tuple[str, str]:
  """'tpu:v5e:2x2' -> ('tpu', 'v5e:2x2'); 'gpu:h100:2x8' -> ('gpu', 'h100:2x8'), checked
  (parse_cluster)."""
  platform, _, topology = spec.partition(":")
  if platform not in ("tpu", "gpu") or not topology:
    raise FlagError(
      "--equarx_compile_for takes tpu:TOPOLOGY (e.g. tpu:v5e:2x2) or gpu:MODEL:NODESxGPUS "
      f"(e.g. gpu:h100:2x8), got {spec!r}"
    )
  if platform == "gpu":
    parse_cluster(topology)
  return platform, topology


# --- flag declarations -------------------------------------------------------


def _parse_bool(name: str, text: str | None) -> bool:
  if text is None:
    return True
  low = text.lower()
  if low in ("1", "true", "yes"):
    return True
  if low in ("0", "false", "no"):
    return False
  raise FlagError(f"--{name} takes true or false, got {text!r}")


def _parse_int(name: str, text: str | None) -> int:
  if text is None:
    raise FlagError(f"--{name} needs a value: --{name}=N")
  try:
    return int(text.replace("_", ""), 0)
  except ValueError:
    raise FlagError(f"--{name} takes an integer, got {text!r}") from None


def _parse_float(name: str, text: str | None) -> float:
  if text is None:
    raise FlagError(f"--{name} needs a value: --{name}=X")
  try:
    return float(text)
  except ValueError:
    raise FlagError(f"--{name} takes a number, got {text!r}") from None


def _parse_list(name: str, text: str | None) -> tuple[str, ...]:
  if text is None:
    raise FlagError(f"--{name} needs a value: --{name}=A,B")
  return tuple(t.strip() for t in text.split(",") if t.strip())


def _parse_str(name: str, text: str | None) -> str:
  if text is None:
    raise FlagError(f"--{name} needs a value: --{name}=VALUE")
  return text


@dataclasses.dataclass(frozen=True)
class Flag:
  """One --equarx_* flag.  Everything a user reads about it comes from here: the
  `equarx-opt --help` text, the flag table of README.md and the docs' flag reference
  (flags_markdown), so the three cannot disagree (tests/test_flag_docs.py)."""

  name: str  # without the leading --
  field: str  # Policy field it sets
  parse: Callable[[str, str | None], Any]
  help: str  # what it does; Markdown (backticks), one paragraph
  metavar: str = ""  # the value's placeholder (--name=METAVAR); "" for a switch
  # The default as users read it, where the Policy field's own value does not say it
  # (0 meaning "the form decides", "" meaning "none").
  default: str = ""

  @property
  def is_bool(self) -> bool:
    """A switch (--name / --noname) rather than --name=VALUE."""
    return self.parse is _parse_bool

  @property
  def syntax(self) -> str:
    """How the flag is written: --name or --name=METAVAR."""
    return f"--{self.name}" if self.is_bool else f"--{self.name}={self.metavar or 'VALUE'}"

  def default_text(self) -> str:
    """The default as the flag table and --help print it."""
    if self.default:
      return self.default
    value = getattr(Policy(), self.field)
    if isinstance(value, bool):
      return "on" if value else "off"
    if isinstance(value, tuple):
      return ",".join(value)
    return str(value) if value != "" else "none"

  def format(self, value) -> str:
    if isinstance(value, bool):
      return f"--{self.name}" if value else f"--no{self.name}"
    if isinstance(value, tuple):
      value = ",".join(value)
    # Quoted, so that from_flags(to_flags()) survives a file name with spaces.
    return f"--{self.name}={shlex.quote(str(value))}"


#: Every --equarx_* flag by name (without the leading --): the one table the parser,
#: `equarx-opt --help`, README.md and the docs' flag reference read.
FLAGS = {
  f.name: f
  for f in [
    Flag(
      "equarx_enable",
      "enable",
      _parse_bool,
      "rewrite the matching all-reduces (`--noequarx_enable` turns it off); nothing is "
      "rewritten without it",
    ),
    Flag(
      "equarx_min_bytes",
      "min_bytes",
      _parse_int,
      "skip sites with fewer operand bytes (an all-gather: bytes of the gathered result)",
      metavar="N",
    ),
    Flag(
      "equarx_max_bytes",
      "max_bytes",
      _parse_int,
      "skip sites with more operand bytes (likewise)",
      metavar="N",
      default="0 (none)",
    ),
    Flag(
      "equarx_dtypes",
      "dtypes",
      _parse_list,
      "element types to rewrite, a comma list of " + ",".join(DTYPES),
      metavar="LIST",
    ),
    Flag(
      "equarx_ops",
      "ops",
      _parse_list,
      "collectives to rewrite, a comma list of " + ", ".join(f"`{o}`" for o in OPS) + " "
      "(float sums and float gathers)",
      metavar="LIST",
    ),
    Flag(
      "equarx_block_size",
      "block_size",
      _parse_int,
      "values per scale (0: the default)",
      metavar="N",
      default="one rotation (128, or `--equarx_rotation_size`) with a rotation in the tiled "
      "form, else 1024; `mxint8`: 32",
    ),
    Flag(
      "equarx_format",
      "format",
      _parse_str,
      "the wire format: `int8`, `int4` (two per byte), `fp8_e4m3`, `fp8_e5m2` (one f32 "
      "scale per block), `mxint8` (int8 codes, a one-byte power-of-two scale per 32 values)",
      metavar="F",
    ),
    Flag(
      "equarx_algorithm",
      "algorithm",
      _parse_str,
      "the collective: `ring` (EQuARX), `two_shot`, `bidirectional` (the ring, half of each "
      "chunk each way), `one_shot` (one all-gather; under the default `two_shot`, a site "
      "where the two-shot is predicted to lose and the one-shot to win gets the one-shot)",
      metavar="A",
    ),
    Flag(
      "equarx_rotation",
      "rotation",
      _parse_str,
      "`none` or `hadamard` (a block-wise randomized Walsh-Hadamard rotation before quantizing)",
      metavar="R",
    ),
    Flag(
      "equarx_rounding",
      "rounding",
      _parse_str,
      "integer codes: `nearest` (half to even) or `stochastic` (rounded down after adding a "
      "stateless uniform draw; tiled form)",
      metavar="R",
    ),
    Flag(
      "equarx_rotation_size",
      "rotation_size",
      _parse_int,
      "the Hadamard block, a power of two that divides the block size",
      metavar="N",
      default="128 in the tiled form; `mxint8`: 32 (one per block); flat form: the largest "
      "power of 2 dividing the block, at most 4096 (the grid layout: 128)",
    ),
    Flag(
      "equarx_microshards",
      "microshards",
      _parse_int,
      "independent permutes per ring step (pipelining; flat form)",
      metavar="K",
    ),
    Flag(
      "equarx_unroll_min_bytes",
      "unroll_min_bytes",
      _parse_int,
      "all-reduces with at least N operand bytes get the forms that run faster and compile "
      "slower: the flat ring's reduce-scatter steps written out instead of looped (a loop "
      "copies all N chunks into its buffer on every call), and on CPU the tiled form's "
      "codes and scales on collectives of their own instead of one payload",
      metavar="N",
    ),
    Flag(
      "equarx_block_layout",
      "block_layout",
      _parse_str,
      "`fixed` (`--equarx_block_size` values per scale) or `grid` (8x128 scales per chunk, "
      "the paper's)",
      metavar="L",
    ),
    Flag("equarx_report", "report", _parse_bool, "print the site table after each rewrite"),
    Flag(
      "equarx_compile_for",
      "compile_for",
      _parse_str,
      "also compile the result ahead of time, beside the original, for a TPU topology (e.g. "
      "`tpu:v5e:2x2`, `tpu:v4:2x2x1`; needs the `tpu` extra, no TPU: the report gives both "
      "programs' on-chip estimates and temporary memory) or a GPU cluster of NODES nodes "
      "of GPUS GPUs (`gpu:h100:2x8`; needs the `cuda-aot` extra, no GPU: the report gives "
      "the bytes per GPU both programs send between nodes, counted from the compiled "
      "programs); for `equarx-opt` the target also says where the program runs and, for a "
      "GPU cluster, its nodes",
      metavar="T",
    ),
    Flag(
      "equarx_partitioned",
      "partitioned",
      _parse_str,
      "rewrite the all-reduces the SPMD partitioner inserts into an auto-sharded program: in "
      "`equarx_pass.jit`, and in `equarx-opt` for a `jax.export` artifact (compiled on CPU "
      "devices); `auto` when any part of the program is auto-sharded (not inside a "
      "`shard_map` manual over every mesh axis), `on` always, `off` never",
      metavar="M",
    ),
    Flag(
      "equarx_outline",
      "outline",
      _parse_str,
      "the compute of each rewritten site between its collectives becomes private "
      "functions that XLA keeps as calls, which compiles large programs much faster on "
      "XLA:CPU; the collectives stay where the all-reduce was. `auto`: when "
      "`equarx_pass.jit` compiles for CPU; `on`; `off` (inline, as `equarx-opt` writes "
      "them unless told `on`). The same ops either way; bits can differ at a site's edges, "
      "where inline XLA:CPU may fuse the site's last multiply into a following add",
      metavar="M",
    ),
    Flag(
      "equarx_calibration",
      "calibration",
      _parse_str,
      "a file written by `equarx_pass.calibrate`: its sites get the calibrated "
      "outlier-feature scheme (static int4 scales, H/64 features in bf16, 4.19 bits); the "
      "others the scheme of the other flags, and the report says why",
      metavar="FILE",
    ),
    Flag(
      "equarx_calibration_clip",
      "calibration_clip",
      _parse_float,
      "with a calibration file: clip each feature's static range at C times its calibrated "
      "rms (2.55: MSE-optimal for Gaussian data at 4 bits)",
      metavar="C",
      default="0 (off)",
    ),
    Flag(
      "equarx_platform",
      "platform",
      _parse_str,
      "where the program runs: `cpu` (the tiled form's forward rotation is the model's "
      "butterflies, so a site equals the NumPy model bit for bit), `tpu` or `gpu` (a "
      "matmul); `auto`: where `equarx_pass.jit` compiles, and for `equarx-opt` the "
      "platform of `--equarx_compile_for` (`tpu:...`, `gpu:...`), else `cpu`",
      metavar="P",
    ),
    Flag(
      "equarx_form",
      "form",
      _parse_str,
      "the emitted form: `tiled` (two-shot and the ring with one lane and fixed blocks), "
      "`flat` (one int8 payload per row with the scale bytes packed in, loops over "
      "chunks), `kernel` (tiled, with two-shot's quantize, sum and dequantize as Pallas "
      "kernels: Mosaic on TPU, Triton on CUDA GPUs, Pallas's interpreter where a TPU or "
      "GPU form runs on CPU; opt-in, not yet run on a device; the report says where a "
      "site keeps the tiled form and why); `auto`: tiled wherever the scheme has a tiled "
      "form",
      metavar="F",
    ),
    Flag(
      "equarx_kernel_exchange",
      "kernel_exchange",
      _parse_str,
      "how the kernel form's two-shot moves its chunks: `permutes` (the default: on TPU "
      "inside fast links, N - 1 collective-permutes each way of chunks with their scales "
      "packed in, so that the transfers run under the kernels; elsewhere the collectives) "
      "or `collectives` (an all-to-all and an all-gather each of codes and of scales)",
      metavar="E",
    ),
    Flag(
      "equarx_force",
      "force",
      _parse_bool,
      "rewrite every site the size and dtype flags select, even where the cost model "
      "predicts the native collective is faster (experiments, fast links)",
    ),
    Flag(
      "equarx_hierarchy",
      "hierarchy",
      _parse_str,
      "a group that spans fast domains evenly: auto (native inside each domain, quantized "
      "only across them) or flat (quantized over the whole group)",
    ),
    Flag(
      "equarx_domain_devices",
      "domain_devices",
      _parse_int,
      "devices per fast domain (a TPU slice, a host), as consecutive device ids "
      "(0: from the devices; equarx-opt: one host per device)",
    ),
    Flag(
      "equarx_domains",
      "domains",
      _parse_int,
      "the devices split into this many equal fast domains (0: see --equarx_domain_devices)",
    ),
    Flag(
      "equarx_fast_link_bandwidth",
      "fast_link_bandwidth",
      _parse_float,
      "GB/s per device inside a fast domain (ICI, NVLink; 0: the platform's default)",
    ),
    Flag(
      "equarx_slow_link_bandwidth",
      "slow_link_bandwidth",
      _parse_float,
      "GB/s per device between fast domains (DCN, InfiniBand, Ethernet; 0: the platform's default)",
    ),
    Flag(
      "equarx_slow_format",
      "slow_format",
      _parse_str,
      "the wire format of what crosses only slow links, one of `--equarx_format`'s: the "
      "hierarchical route's step between slices or hosts, and a group with one member per "
      "fast domain. `int4` halves the bytes on the slowest links again while every other "
      "rewritten site keeps `--equarx_format`; the report adds each site's format per link "
      "class",
      metavar="F",
      default="`--equarx_format`",
    ),
    Flag(
      "equarx_identity",
      "identity",
      _parse_bool,
      "a faithfulness check, which turns the pass on by itself: every route as usual, but "
      "each site the run would rewrite stays the native op, so results equal plain "
      "`jax.jit`'s bit for bit; with `--equarx_force --equarx_min_bytes=0` it checks every "
      "site `--equarx_ops` selects, whatever the cost model predicts",
    ),
  ]
}


def flags_markdown() -> str:
  """The flag reference as a Markdown table: the docs site renders it (docs/flags.md), and
  `equarx-opt --help` prints the same text (tests/test_flag_docs.py)."""
  lines = ["| flag | default | meaning |", "|---|---|---|"]
  for flag in FLAGS.values():
    cell = lambda text: text.replace("|", "\\|")
    lines.append(f"| `{flag.syntax}` | {cell(flag.default_text())} | {cell(flag.help)} |")
  return "\n".join(lines) + "\n"


def apply_flags(policy: Policy, flags: str) -> Policy:
  """Apply an XLA_FLAGS-style string to `policy`; later flags win."""
  try:
    tokens = shlex.split(flags)
  except ValueError as e:
    raise FlagError(f"cannot split flag string {flags!r}: {e}") from None
  changes = {}
  for token in tokens:
    if not token.startswith("--"):
      raise FlagError(f"expected --equarx_NAME[=VALUE], got {token!r}")
    name, eq, value = token[2:].partition("=")
    text = value if eq else None
    negated = name.startswith("noequarx_") and name[2:] in FLAGS
    if negated:
      name = name[2:]
    flag = FLAGS.get(name)
    if flag is None:
      known = ", ".join("--" + n for n in FLAGS)
      raise FlagError(f"unknown flag --{name}; known flags: {known}")
    if negated:
      if flag.parse is not _parse_bool or eq:
        raise FlagError(f"--no{name} is only for boolean flags, without a value")
      changes[flag.field] = False
    else:
      changes[flag.field] = flag.parse(name, text)
  if changes.get("enable") is False and changes.get("identity", policy.identity):
    raise FlagError(
      "--noequarx_enable with --equarx_identity: the identity check turns the pass on; "
      "add --noequarx_identity to turn both off"
    )
  return dataclasses.replace(policy, **changes)  # type: ignore[arg-type]  # per-flag types
