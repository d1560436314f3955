"""Which all-reduces to rewrite, and how: one frozen Policy, built from Python or flags.

Flags use XLA_FLAGS syntax: `--equarx_enable --equarx_min_bytes=65536`.  Process
defaults come from the EQUARX_FLAGS environment variable; a `flags=` string on
one function is applied on top of them.  Every flag is declared once, in FLAGS.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from typing import Any, Callable, Literal, get_args

from equarx_pass import rotation as rotation_lib
from equarx_pass import scheme as scheme_lib
from equarx_pass.algorithms import ALGORITHMS as ALGORITHM_REGISTRY
from equarx_pass.formats import FORMATS as FORMAT_REGISTRY
from equarx_pass.errors import FlagError

ENV_VAR = "EQUARX_FLAGS"
DTYPES = ("bf16", "f16", "f32")
# The collectives the pass may rewrite: float-sum all-reduces (the default), and, when
# named, float-sum reduce-scatters and all-gathers (match.py finds them; each algorithm's
# emit_reduce_scatter, algorithms/, and all_gather.py emit them).
Op = Literal["all_reduce", "reduce_scatter", "all_gather"]
OPS = get_args(Op)
# What the scheme flags may name: the keys of the registries (formats/, algorithms/).
FORMATS = tuple(FORMAT_REGISTRY)
ALGORITHMS = tuple(ALGORITHM_REGISTRY)
ROTATIONS = rotation_lib.ROTATIONS
ROUNDINGS = scheme_lib.ROUNDINGS
BLOCK_LAYOUTS = scheme_lib.BLOCK_LAYOUTS
# Where equarx_pass.jit looks for all-reduces (partitioned.py): in the lowered
# StableHLO, in the per-device program after SPMD partitioning, or (auto) in the
# latter only when the former has none.
Mode = Literal["auto", "on", "off"]
PARTITIONED_MODES = get_args(Mode)
# Whether each rewritten all-reduce becomes a private function called out of line
# (rewrite.py): on, off, or (auto) only for a program compiled for XLA:CPU, the
# backend where it was measured (BUILD_NOTES, "Compile-time decisions").
OUTLINE_MODES = get_args(Mode)
# The platform the tiled form is emitted for (on CPU its forward rotation is the model's
# butterflies, elsewhere a matmul): auto = where equarx_pass.jit compiles the program;
# for equarx-opt, tpu with --equarx_compile_for=tpu:..., else cpu.
Platform = Literal["auto", "cpu", "tpu", "gpu"]
PLATFORMS = get_args(Platform)
# The emitted form: tiled or flat (forms.py); auto = tiled wherever the
# scheme has a tiled form (it measured faster on XLA:CPU too; BUILD_NOTES, "Emitted forms").
Form = Literal["auto", "tiled", "flat"]
FORMS = get_args(Form)
# Values per scale when --equarx_block_size is not given: 1024, or with a rotation in the
# tiled form one scale per rotation (the most accurate int8 scheme, and no dearer than
# 1024: on XLA:CPU in one process, and by the TPU compiler's estimates).
BLOCK_DEFAULT = 1024
# The tiled form's rotation when --equarx_rotation_size is not given: one 128-lane row,
# a matmul per tile (H_1024 costs 8x the multiplies).
ROTATION_SIZE_TILED = 128
# Bytes per element of each selectable element type (MLIR spelling).
DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4}


@dataclasses.dataclass(frozen=True)
class Policy:
  """What the pass selects and what it emits.  Nothing is rewritten unless `enable`."""

  enable: bool = False
  min_bytes: int = 131072  # skip all-reduces smaller than this (total operand bytes)
  max_bytes: int = 0  # skip larger ones; 0 = no upper bound
  dtypes: tuple[str, ...] = DTYPES
  ops: tuple[Op, ...] = ("all_reduce",)  # the collectives to rewrite
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
  # A check of the route, not a speed-up: every selected site is rebuilt (outlined,
  # the partitioned program rebuilt around it) but stays the native all-reduce, so the
  # result must equal plain jax.jit's bit for bit.
  identity: bool = False
  platform: Platform = "auto"  # where the program runs
  form: Form = "auto"  # the emitted form

  def __post_init__(self):
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
      ("format", self.format, FORMATS),
      ("algorithm", self.algorithm, ALGORITHMS),
      ("rotation", self.rotation, ROTATIONS),
      ("rounding", self.rounding, ROUNDINGS),
      ("block_layout", self.block_layout, BLOCK_LAYOUTS),
      ("partitioned", self.partitioned, PARTITIONED_MODES),
      ("outline", self.outline, OUTLINE_MODES),
      ("platform", self.platform, PLATFORMS),
      ("form", self.form, FORMS),
    ):
      if value not in choices:
        raise FlagError(f"--equarx_{flag} must be one of {','.join(choices)}, got {value!r}")
    try:
      scheme = self._scheme(self.block_size or self._default_block(), self.rotation_size)
    except ValueError as e:
      raise FlagError(f"inconsistent --equarx_* flags: {e}") from None
    if self.form == "tiled" and scheme.flat_only():
      raise FlagError(f"--equarx_form=tiled: {scheme.flat_only()}")
    if self.rounding == "stochastic" and self._flat_why():
      raise FlagError(f"--equarx_rounding=stochastic needs the tiled form ({self._flat_why()})")
    if self.compile_for:
      parse_compile_target(self.compile_for)
    if not (self.calibration_clip == 0 or 1 <= self.calibration_clip <= 100):
      raise FlagError(
        f"--equarx_calibration_clip must be 0 (off) or in [1, 100], got {self.calibration_clip}"
      )

  @property
  def scheme(self) -> scheme_lib.Scheme:
    """The quantized all-reduce this policy emits (scheme.Scheme), defaults filled in."""
    policy, _ = self.resolved()
    return policy._scheme(policy.block_size, policy.rotation_size)

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
    return self.outline == "on" or (self.outline == "auto" and platform == "cpu")

  def target_platform(self, platform: str | None) -> str:
    """The platform whose forms are emitted, given where the program will be compiled
    (`platform`, a JAX platform name; None when not known, as for a file)."""
    if self.platform != "auto":
      return self.platform
    if platform in ("cpu", "tpu", "gpu"):
      return platform
    if platform == "cuda" or platform == "rocm":
      return "gpu"
    return "tpu" if self.compile_for.startswith("tpu:") else "cpu"

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


def parse_compile_target(spec: str) -> tuple[str, str]:
  """'tpu:v5e:2x2' -> ('tpu', 'v5e:2x2')."""
  platform, _, topology = spec.partition(":")
  if platform != "tpu" or not topology:
    raise FlagError(f"--equarx_compile_for takes tpu:TOPOLOGY (e.g. tpu:v5e:2x2), got {spec!r}")
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
  name: str  # without the leading --
  field: str  # Policy field it sets
  parse: Callable[[str, str | None], Any]
  help: str

  @property
  def is_bool(self) -> bool:
    """A switch (--name / --noname) rather than --name=VALUE."""
    return self.parse is _parse_bool

  def format(self, value) -> str:
    if isinstance(value, bool):
      return f"--{self.name}" if value else f"--no{self.name}"
    if isinstance(value, tuple):
      value = ",".join(value)
    # Quoted, so that from_flags(to_flags()) survives a file name with spaces.
    return f"--{self.name}={shlex.quote(str(value))}"


FLAGS = {
  f.name: f
  for f in [
    Flag("equarx_enable", "enable", _parse_bool, "rewrite matching all-reduces (default off)"),
    Flag(
      "equarx_min_bytes",
      "min_bytes",
      _parse_int,
      "skip all-reduces with fewer operand bytes (an all-gather: result bytes)",
    ),
    Flag(
      "equarx_max_bytes",
      "max_bytes",
      _parse_int,
      "skip all-reduces with more operand bytes (0: no bound)",
    ),
    Flag(
      "equarx_dtypes",
      "dtypes",
      _parse_list,
      "element types to rewrite, comma list of bf16,f16,f32",
    ),
    Flag(
      "equarx_ops",
      "ops",
      _parse_list,
      "collectives to rewrite, comma list of " + ",".join(OPS) + " (default all_reduce)",
    ),
    Flag(
      "equarx_block_size",
      "block_size",
      _parse_int,
      "values per scale (default: one rotation, 128, in the tiled form with a rotation; "
      "else 1024; mxint8: its own 32)",
    ),
    Flag("equarx_format", "format", _parse_str, "wire format: " + ",".join(FORMATS)),
    Flag("equarx_algorithm", "algorithm", _parse_str, "collective: " + ",".join(ALGORITHMS)),
    Flag("equarx_rotation", "rotation", _parse_str, "rotation before quantizing: none,hadamard"),
    Flag(
      "equarx_rounding",
      "rounding",
      _parse_str,
      "integer codes: nearest (even), or stochastic (a stateless uniform draw; tiled form)",
    ),
    Flag(
      "equarx_rotation_size",
      "rotation_size",
      _parse_int,
      "Hadamard block, a power of two dividing the block size (default: 128 in the tiled "
      "form; flat: the largest such, <= 4096)",
    ),
    Flag("equarx_microshards", "microshards", _parse_int, "independent permutes per ring step"),
    Flag(
      "equarx_unroll_min_bytes",
      "unroll_min_bytes",
      _parse_int,
      "ring schemes: write out the reduce-scatter loop of all-reduces with at least this "
      "many operand bytes (faster: no copy of the operand into the loop; larger module)",
    ),
    Flag(
      "equarx_block_layout",
      "block_layout",
      _parse_str,
      "fixed (--equarx_block_size values per scale) or grid (8x128 scales per chunk)",
    ),
    Flag("equarx_report", "report", _parse_bool, "print the site table after each rewrite"),
    Flag(
      "equarx_compile_for", "compile_for", _parse_str, "also compile for tpu:TOPOLOGY ahead of time"
    ),
    Flag(
      "equarx_partitioned",
      "partitioned",
      _parse_str,
      "equarx_pass.jit: rewrite the all-reduces the SPMD partitioner inserts: "
      "auto (when the lowered program has none), on, off",
    ),
    Flag(
      "equarx_outline",
      "outline",
      _parse_str,
      "emit each rewritten all-reduce as a private function called out of line (a nested "
      "computation for XLA, which compiles large programs faster on XLA:CPU): auto (when "
      "equarx_pass.jit compiles for CPU), on, off",
    ),
    Flag(
      "equarx_calibration",
      "calibration",
      _parse_str,
      "calibration file of equarx_pass.calibrate: its sites get static int4 scales and "
      "bf16 outlier features; the others the dynamic scheme",
    ),
    Flag(
      "equarx_calibration_clip",
      "calibration_clip",
      _parse_float,
      "with --equarx_calibration: clip each feature's static range at this many times its "
      "calibrated rms (2.55: MSE-optimal for Gaussian data at 4 bits; 0: off, the absmax)",
    ),
    Flag(
      "equarx_platform",
      "platform",
      _parse_str,
      "where the program runs: auto (where equarx_pass.jit compiles; for equarx-opt tpu "
      "with --equarx_compile_for=tpu:..., else cpu), cpu (the tiled form's forward "
      "rotation as the model's butterflies: the same bits), tpu or gpu (as a matmul)",
    ),
    Flag(
      "equarx_form",
      "form",
      _parse_str,
      "the emitted form: auto (tiled where the scheme has one), tiled ([rows, 128] "
      "tiles, scales on their own collectives, the inverse rotation as a matmul and the "
      "forward one per --equarx_platform; two_shot and ring, one lane, fixed blocks) or "
      "flat (one payload per row with the scales packed in, butterflies both ways)",
    ),
    Flag(
      "equarx_identity",
      "identity",
      _parse_bool,
      "a faithfulness check: take every route as usual but keep each selected all-reduce "
      "exact (the native op), so results must equal plain jax.jit bit for bit",
    ),
  ]
}


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
  return dataclasses.replace(policy, **changes)  # type: ignore[arg-type]  # per-flag types
