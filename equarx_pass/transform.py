"""Files in, files out: the library behind `equarx-opt` (cli.py is a thin absl main).

parse (any input kind) -> rewrite + verify -> StableHLO text, optionally compiled
ahead of time for a TPU topology.  The output is written to a temporary file in
the output's directory and renamed into place only when everything succeeded,
so a failure writes nothing and the input is never touched.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import secrets
import stat
from typing import Any

from equarx_pass import tpu_aot
from equarx_pass import parse
from equarx_pass.errors import CompileError, EquarxError, RewriteError, VerifyError
from equarx_pass.policy import Policy
from equarx_pass.rewrite import SiteRecord, rewrite_module


@dataclasses.dataclass
class TransformResult:
  text: str  # rewritten StableHLO, MLIR text
  records: list[SiteRecord]
  input_kind: str
  pass_seconds: float
  tpu: tpu_aot.TopologyCompile | None = None
  topology: Any = None  # the fast domains the sites were planned on (topology.py)


def transform_text(data: bytes | str, policy: Policy, path: str = "<input>") -> TransformResult:
  parsed = parse.parse_bytes(data, path)
  try:
    result = rewrite_module(parsed.module, policy)
    text = str(result.module)
    tpu = None
    if policy.compile_for:
      tpu = tpu_aot.compile_for_target(text, policy.compile_for)
  except (RewriteError, VerifyError, CompileError) as e:
    # Name the input, as parse errors do: the CLI prints only the message.
    raise type(e)(f"{path}: {e}") from e
  return TransformResult(
    text, _name_the_file(result.records, path), parsed.kind, result.seconds, tpu, result.topology
  )


def _name_the_file(records: list[SiteRecord], path: str) -> list[SiteRecord]:
  """Locations in the input text itself read "-:LINE" (MLIR's name for a parsed string):
  give them the input's file name."""
  name = os.path.basename(path)
  return [
    dataclasses.replace(r, location=name + r.location[1:]) if r.location.startswith("-:") else r
    for r in records
  ]


def transform_file(input_path: str, output_path: str, policy: Policy) -> TransformResult:
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
  result = transform_text(data, policy, input_path)
  write_atomically(output_path, result.text)
  return result


def write_atomically(path: str, text: str) -> None:
  """Write `text` to `path`: a file whole or not at all, a device or pipe directly.

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
      with open(path, "w") as f:
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
    with os.fdopen(fd, "w") as f:
      f.write(text)
    os.replace(tmp, target)
  except OSError as e:
    os.unlink(tmp)
    raise fail(e) from None
