"""Files in, files out: the library behind `equarx-opt` (cli.py is a thin absl main).

parse (any input kind) -> rewrite + verify -> the output: StableHLO text, XLA's HLO
text, or for a jax.export artifact an artifact (exported.py); optionally compiled
ahead of time for a TPU topology.  The output is written to a temporary file in the
output's directory and renamed into place only when everything succeeded, so a
failure writes nothing and the input is never touched.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import secrets
import stat
from typing import Any

from equarx_pass import _jax_private
from equarx_pass.errors import CompileError, EquarxError, FlagError, RewriteError, VerifyError
from equarx_pass.frontends import exported, tpu_aot
from equarx_pass.ir import parse
from equarx_pass.planning import match
from equarx_pass.planning.policy import Policy
from equarx_pass.rewrite import rewrite_module
from equarx_pass.site_records import SiteRecord

# --output_format: "auto" is "exported" for an artifact, else "stablehlo"; a file's name
# can say it (OUTPUT_SUFFIXES).
OUTPUT_FORMATS = ("auto", "stablehlo", "hlo", "exported")
# XLA's tools read HLO text from .hlo and .txt files (its dumps are .txt); MLIR's are .mlir.
OUTPUT_SUFFIXES = {".hlo": "hlo", ".txt": "hlo", ".mlir": "stablehlo"}


@dataclasses.dataclass
class TransformResult:
  text: str  # the rewritten module (an artifact's function's), StableHLO text
  records: list[SiteRecord]
  input_kind: str
  pass_seconds: float
  tpu: tpu_aot.TopologyCompile | None = None
  topology: Any = None  # the fast domains the sites were planned on (topology.py)
  output_format: str = "stablehlo"  # what `output` is: "stablehlo", "hlo" or "exported"
  output: str | bytes = ""  # what is written: `text`, HLO text, or a serialized artifact
  parts: list[exported.Part] = dataclasses.field(default_factory=list)  # an artifact's modules

  def __post_init__(self):
    if not self.output:
      self.output = self.text


def output_format_for(requested: str, output_path: str | None) -> str:
  """--output_format, with "auto" made what the output file's suffix says, if it says."""
  if requested not in OUTPUT_FORMATS:
    raise FlagError(
      f"--output_format must be one of {', '.join(OUTPUT_FORMATS)}, got {requested!r}"
    )
  if requested == "auto" and output_path not in (None, "-"):
    return OUTPUT_SUFFIXES.get(os.path.splitext(output_path)[1].lower(), "auto")
  return requested


def transform_text(
  data: bytes | str, policy: Policy, path: str = "<input>", output_format: str = "auto"
) -> TransformResult:
  """Parse, rewrite and render `data`; `output_format` as --output_format (auto: an
  artifact for an artifact, else StableHLO text)."""
  output_format_for(output_format, None)
  parsed = parse.parse_bytes(data, path)
  original_text = str(parsed.module) if policy.compile_for else ""
  if output_format == "auto":
    output_format = "exported" if parsed.exported is not None else "stablehlo"
  if output_format == "exported" and parsed.exported is None:
    raise FlagError(
      f"{path}: --output_format=exported needs a jax.export artifact as input "
      "(Exported.serialize()): a module alone has no shardings, platforms or calling "
      "convention to write one with"
    )
  try:
    parts: list[exported.Part] = []
    artifact = b""
    if parsed.exported is not None:
      done = exported.rewrite_exported(parsed.exported, parsed.module, policy, path)
      module, records, seconds = done.module, done.records, done.pass_seconds
      parts, artifact = done.parts, done.data
      topology = parts[0].topology if parts else None
    else:
      result = rewrite_module(parsed.module, policy)
      module, records, seconds = result.module, result.records, result.seconds
      topology = result.topology
    text = str(module)
    output: str | bytes = text
    if output_format == "hlo":
      output = hlo_text(module)
    elif output_format == "exported":
      output = artifact
    tpu = None
    if policy.compile_for:
      tpu = tpu_aot.compare_to_original(text, original_text, policy.compile_for)
  except (RewriteError, VerifyError, CompileError) as e:
    # Name the input, as parse errors do: the CLI prints only the message.
    raise type(e)(f"{path}: {e}") from e
  parts = [dataclasses.replace(p, records=_name_the_file(p.records, path)) for p in parts]
  return TransformResult(
    text,
    _name_the_file(records, path),
    parsed.kind,
    seconds,
    tpu,
    topology,
    output_format,
    output,
    parts,
  )


def hlo_text(module) -> str:
  """XLA's HLO text of a (verified) StableHLO module, with its device counts in the
  header, where XLA's dumps have them: the translation keeps only the program."""
  try:
    text = _jax_private.stablehlo_to_hlo_text(module)
  except Exception as e:  # jaxlib raises its own runtime errors
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise RewriteError(f"XLA cannot translate the rewritten module to HLO: {first}") from None
  facts = match.module_facts(module)
  header, newline, rest = text.partition("\n")
  name, comma, fields = header.partition(",")
  counts = [("replica_count", facts.num_replicas), ("num_partitions", facts.num_partitions)]
  extra = "".join(f", {k}={v}" for k, v in counts if v > 1 and f" {k}=" not in header)
  return name + extra + comma + fields + newline + rest


def _name_the_file(records: list[SiteRecord], path: str) -> list[SiteRecord]:
  """Locations in the input text itself read "-:LINE" (MLIR's name for a parsed string):
  give them the input's file name."""
  name = os.path.basename(path)
  return [
    dataclasses.replace(r, location=name + r.location[1:]) if r.location.startswith("-:") else r
    for r in records
  ]


def transform_file(
  input_path: str, output_path: str, policy: Policy, output_format: str = "auto"
) -> TransformResult:
  """transform_text of a file, written to `output_path` whole or not at all;
  `output_format` "auto" takes the output's suffix (OUTPUT_SUFFIXES), else the input's kind."""
  output_format = output_format_for(output_format, output_path)
  if (
    os.path.exists(output_path)
    and os.path.exists(input_path)
    and os.path.samefile(input_path, output_path)
  ):
    raise EquarxError(f"{output_path}: output is the input file; refusing to overwrite it")
  try:
    with open(input_path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise parse.ParseError(f"cannot read input: {e.strerror}", input_path) from None
  result = transform_text(data, policy, input_path, output_format)
  write_atomically(output_path, result.output)
  return result


def write_atomically(path: str, text: str | bytes) -> None:
  """Write `text` (or bytes) to `path`: a file whole or not at all, a device or pipe directly.

  A file is written to a temporary next to it and renamed into place.  Renaming
  over anything else would replace the node itself: as root, `-o /dev/null`
  left a regular file in /dev.  So devices and FIFOs are written through, and a
  symlink's target is replaced, not the link.
  """

  def fail(e: OSError):
    return EquarxError(f"{path}: cannot write output: {e.strerror}")

  try:
    mode = os.stat(path).st_mode  # follows symlinks
  except FileNotFoundError:
    mode = None
  except OSError as e:
    raise fail(e) from None
  if mode is not None and stat.S_ISDIR(mode):
    raise fail(IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR)))
  if mode is not None and not stat.S_ISREG(mode):
    try:
      with open(path, "wb" if isinstance(text, bytes) else "w") as f:
        f.write(text)
    except OSError as e:
      raise fail(e) from None
    return
  target = os.path.realpath(path)
  tmp = os.path.join(
    os.path.dirname(target),
    f".{os.path.basename(target)}.equarx-{os.getpid()}-{secrets.token_hex(4)}.tmp",
  )
  try:
    # Like a new file's: 0666 less the umask, or the mode of the file it replaces.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
  except OSError as e:
    raise fail(e) from None
  try:
    if mode is not None:
      os.chmod(fd, stat.S_IMODE(mode))
    with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
      f.write(text)
    os.replace(tmp, target)
  except OSError as e:
    os.unlink(tmp)
    raise fail(e) from None
