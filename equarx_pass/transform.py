"""Files in, files out: the library behind `equarx-opt` (cli.py is a thin absl main).

parse (any input kind) -> rewrite + verify -> StableHLO text, optionally compiled
ahead of time for a TPU topology.  The output is written to a temporary file in
the output's directory and renamed into place only when everything succeeded,
so a failure writes nothing and the input is never touched.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

from equarx_pass import compile as compile_lib
from equarx_pass import parse
from equarx_pass.errors import CompileError, EquarxError, RewriteError, VerifyError
from equarx_pass.policy import Policy
from equarx_pass.rewrite import SiteRecord, rewrite_module


@dataclasses.dataclass
class TransformResult:
  text: str                                   # rewritten StableHLO, MLIR text
  records: list[SiteRecord]
  input_kind: str
  pass_seconds: float
  tpu: compile_lib.TopologyCompile | None = None


def transform_text(data: bytes | str, policy: Policy, path: str = "<input>") -> TransformResult:
  parsed = parse.parse_bytes(data, path)
  try:
    result = rewrite_module(parsed.module, policy)
    text = str(result.module)
    tpu = None
    if policy.compile_for:
      tpu = compile_lib.compile_for_target(text, policy.compile_for)
  except (RewriteError, VerifyError, CompileError) as e:
    # Name the input, as parse errors do: the CLI prints only the message.
    raise type(e)(f"{path}: {e}") from e
  return TransformResult(text, result.records, parsed.kind, result.seconds, tpu)


def transform_file(input_path: str, output_path: str, policy: Policy) -> TransformResult:
  if os.path.exists(output_path) and os.path.exists(input_path) and \
     os.path.samefile(input_path, output_path):
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
  directory = os.path.dirname(os.path.abspath(path))
  try:
    fd, tmp = tempfile.mkstemp(prefix=".equarx-", suffix=".tmp", dir=directory)
  except OSError as e:
    raise EquarxError(f"{path}: cannot write output: {e.strerror}") from None
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
    os.replace(tmp, path)
  except OSError as e:
    os.unlink(tmp)
    raise EquarxError(f"{path}: cannot write output: {e.strerror}") from None
