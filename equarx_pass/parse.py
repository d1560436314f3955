"""parse: StableHLO (MLIR text, MLIR bytecode, portable artifact) or XLA HLO text -> ir.Module.

The first stage of parse -> match -> rewrite -> verify -> compile.  Every failure
is a ParseError naming the file and, where the parser says, the line and column.
"""

from __future__ import annotations

import dataclasses
import re

from jax.extend import mlir as jax_mlir
from jax.extend.mlir import ir

from equarx_pass import _jax_private
from equarx_pass.errors import ParseError

MLIR_BYTECODE_MAGIC = b"ML\xefR"
# "loc("-":3:9)" -> line 3, column 9 (the diagnostic's location, not IR text).
_LOC_LINE_COL = re.compile(r':(\d+):(\d+)')
# HLO parser errors say "was parsing 3:15: error: ...".
_HLO_LINE_COL = re.compile(r'was parsing (\d+):(\d+): error: ([^\n]*)')


@dataclasses.dataclass
class ParsedModule:
  module: ir.Module
  kind: str        # "stablehlo-text", "stablehlo-bytecode", "portable-artifact" or "hlo-text"
  path: str


def parse_file(path: str, context: ir.Context | None = None) -> ParsedModule:
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise ParseError(f"cannot read input: {e.strerror}", path) from None
  return parse_bytes(data, path, context)


def parse_bytes(data: bytes | str, path: str = "<input>",
                context: ir.Context | None = None) -> ParsedModule:
  """Detect the input kind and parse it into `context` (default: a fresh JAX context)."""
  context = context or _jax_private.make_ir_context()
  if isinstance(data, str):
    data = data.encode()
  if not data.strip():
    raise ParseError("empty input: expected StableHLO (MLIR) or XLA HLO text", path)
  if data.startswith(MLIR_BYTECODE_MAGIC):
    return _parse_bytecode(data, path, context)
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data[:e.start].count(b"\n") + 1
    raise ParseError("binary data that is neither MLIR bytecode nor UTF-8 text",
                     path, line) from None
  if "\x00" in text:
    raise ParseError("text contains NUL bytes", path, text[:text.index("\x00")].count("\n") + 1)
  if _first_code_line(text).startswith("HloModule"):
    return ParsedModule(_parse_hlo_text(text, path, context), "hlo-text", path)
  return ParsedModule(_parse_mlir(text, path, context), "stablehlo-text", path)


def _first_code_line(text: str) -> str:
  for line in text.splitlines():
    s = line.strip()
    if s and not s.startswith("//"):
      return s
  return ""


def _parse_mlir(source, path: str, context: ir.Context) -> ir.Module:
  try:
    module = ir.Module.parse(source, context=context)
  except ir.MLIRError as e:
    diag = e.error_diagnostics[0] if e.error_diagnostics else None
    if diag is None:
      raise ParseError(f"not a valid MLIR module: {e}", path) from None
    m = _LOC_LINE_COL.search(str(diag.location))
    line, col = (int(m.group(1)), int(m.group(2))) if m else (None, None)
    raise ParseError(f"MLIR parse error: {diag.message}", path, line, col) from None
  _check_is_stablehlo(module, path)
  return module


def _parse_bytecode(data: bytes, path: str, context: ir.Context) -> ParsedModule:
  try:
    return ParsedModule(_parse_mlir(data, path, context), "stablehlo-bytecode", path)
  except ParseError as first:
    # A jax.export portable artifact is VHLO bytecode: upgrade it to StableHLO.
    try:
      stablehlo = jax_mlir.deserialize_portable_artifact(data)
    except Exception:
      raise first from None
    return ParsedModule(_parse_mlir(stablehlo, path, context), "portable-artifact", path)


def _parse_hlo_text(text: str, path: str, context: ir.Context) -> ir.Module:
  """HLO text -> HloModuleProto -> StableHLO, carrying over what the conversion drops."""
  try:
    proto = _jax_private.hlo_text_to_proto(text)
  except Exception as e:  # jaxlib raises JaxRuntimeError (INVALID_ARGUMENT)
    m = _HLO_LINE_COL.search(str(e))
    if m:
      raise ParseError(f"HLO parse error: {m.group(3)}", path,
                       int(m.group(1)), int(m.group(2))) from None
    raise ParseError(f"HLO parse error: {str(e).splitlines()[0]}", path) from None
  try:
    bytecode = jax_mlir.hlo_to_stablehlo(proto)
  except Exception as e:
    raise ParseError(f"cannot convert HLO to StableHLO: {e}", path) from None
  module = _parse_mlir(bytecode, path, context)
  # The conversion loses the partition and replica counts: put them back from the
  # header, or every collective would look like a single-device one.
  header = _hlo_header_fields(text)
  i32 = ir.IntegerType.get_signless(32, context)
  for hlo_key, attr in (("num_partitions", "mhlo.num_partitions"),
                        ("replica_count", "mhlo.num_replicas")):
    value = int(header.get(hlo_key, "1"))
    module.operation.attributes[attr] = ir.IntegerAttr.get(i32, value)
  return module


def _hlo_header_fields(text: str) -> dict[str, str]:
  """`HloModule name, k1=v1, k2={...}` -> {k1: v1, ...} (top-level commas only)."""
  header = _first_code_line(text)
  fields, depth, item = {}, 0, []
  for ch in header[len("HloModule"):] + ",":
    if ch in "{(":
      depth += 1
    elif ch in "})":
      depth -= 1
    if ch == "," and depth == 0:
      key, eq, value = "".join(item).strip().partition("=")
      if eq:
        fields[key] = value
      item = []
    else:
      item.append(ch)
  return fields


def _check_is_stablehlo(module: ir.Module, path: str) -> None:
  names = {op.operation.name for op in module.body.operations}
  if "func.func" not in names:
    found = ", ".join(sorted(names)) or "nothing"
    raise ParseError(f"not a StableHLO program: the module has no func.func (found {found})",
                     path, 1, 1)
