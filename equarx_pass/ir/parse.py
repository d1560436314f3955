"""parse: StableHLO (MLIR text, MLIR bytecode, portable artifact), a serialized
jax.export.Exported, or XLA HLO text -> ir.Module.

The first stage of parse -> match -> rewrite -> verify -> compile.  Every failure
is a ParseError naming the file and, where the parser says, the line and column.
No input may crash the process: text is checked before MLIR parses it (nesting,
aliases) and the module after (dialects, depth, sizes); bytecode and HLO text,
whose C++ parsers crash on corrupted input, are parsed in a helper process.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, BinaryIO

from jax.extend import mlir as jax_mlir
from jax.extend.mlir import ir

from equarx_pass import _jax_private
from equarx_pass.errors import ParseError

MLIR_BYTECODE_MAGIC = b"ML\xefR"
# "loc("-":3:9)" -> line 3, column 9 (the diagnostic's location, not IR text).
_LOC_LINE_COL = re.compile(r":(\d+):(\d+)")
# HLO parser errors say "was parsing 3:15: error: ...".
_HLO_LINE_COL = re.compile(r"was parsing (\d+):(\d+): error: ([^\n]*)")
# A literal XLA elided from a text dump: `constant({...})`, outside string literals.
_HLO_ELIDED = re.compile(r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"|(\{\.\.\.\})')

# MLIR's and XLA's parsers and MLIR's printer are recursive: a few thousand
# nested brackets, attributes or types overflow the C++ stack and kill the
# process (SIGSEGV) instead of raising.  No real program nests a tenth as deep,
# so deeper input is refused (text before parsing, attributes and types after).
MAX_NESTING = 1000
# Attributes and types are uniqued DAGs, so aliases (`#a1 = [#a0, #a0]`, in
# text or bytecode) make a few bytes that print as 2^N values.  Legitimate
# modules print about as large as they are stored.
MAX_EXPANSION = 32
# Ops nested in regions of ops: the pass walks them recursively, and so does
# MLIR's printer.  JAX programs nest a few levels per lax.scan/cond/while.
MAX_OP_NESTING = 200
# Devices a module may claim (num_partitions x num_replicas); the rewrite emits
# a rank table this long, and a bogus 2^31 would exhaust memory.
MAX_DEVICES = 1 << 20
# Dialects a StableHLO program (as JAX or XLA writes it) is made of.
DIALECTS = ("builtin", "func", "stablehlo", "chlo", "sdy", "mhlo")
# Brackets outside string literals and comments; "->" and "<=" / ">=" are not brackets.
# (The string pattern is unrolled: a 100 MB hex constant must not take minutes.)
_STRING = r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
_BRACKETS = re.compile(_STRING + r"|//[^\n]*|->|[<>]=|[][(){}<>]")
# Alias definitions (`#loc3 = loc(...)`, `!t = tuple<...>`: groups 1 and 2), alias
# uses (group 1), brackets (group 3) and line ends, outside strings and comments.
_ALIAS_TOKENS = re.compile(
  _STRING + r"|//[^\n]*|([#!][\w$.-]+)([ \t]*=(?![=>]))?|->|[<>]=|([][(){}<>])|\n"
)


@dataclasses.dataclass
class ParsedModule:
  module: ir.Module
  # "stablehlo-text", "stablehlo-bytecode", "portable-artifact", "jax-exported" or "hlo-text"
  kind: str
  path: str
  # For "jax-exported": the jax.export.Exported read; `module` is its function's module.
  exported: Any = None


def parse_file(path: str, context: ir.Context | None = None) -> ParsedModule:
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise ParseError(f"cannot read input: {e.strerror}", path) from None
  return parse_bytes(data, path, context)


def parse_bytes(
  data: bytes | str, path: str = "<input>", context: ir.Context | None = None
) -> ParsedModule:
  """Detect the input kind and parse it into `context` (default: a fresh JAX context)."""
  context = context or _jax_private.make_ir_context()
  if isinstance(data, str):
    data = data.encode()
  if not data.strip():
    raise ParseError("empty input: expected StableHLO (MLIR) or XLA HLO text", path)
  if data.startswith(MLIR_BYTECODE_MAGIC):
    text, kind = _HELPER.convert(b"b", data, path)
    return ParsedModule(_parse_converted(text, path, context), kind, path)
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    if MLIR_BYTECODE_MAGIC in data:
      exported = read_exported(data, path)
      module = parse_exported_module(exported, path, context)
      return ParsedModule(module, "jax-exported", path, exported)
    line = data[: e.start].count(b"\n") + 1
    raise ParseError(
      "binary data that is neither MLIR bytecode, a jax.export artifact nor UTF-8 text",
      path,
      line,
    ) from None
  if "\x00" in text:
    raise ParseError("text contains NUL bytes", path, text[: text.index("\x00")].count("\n") + 1)
  _check_nesting(text, path)
  if _first_code_line(text).startswith("HloModule"):
    return ParsedModule(_parse_hlo_text(text, path, context), "hlo-text", path)
  _check_aliases(text, path)
  return ParsedModule(_parse_mlir(text, path, context), "stablehlo-text", path)


def read_exported(data: bytes, path: str):
  """A serialized jax.export.Exported (`Exported.serialize()`, a flatbuffer that holds the
  module as MLIR bytecode, which makes it binary, never UTF-8 text).

  Its reader is JAX's own, in Python: a corrupted artifact raises, it cannot crash the
  process; the module inside is then parsed like any other bytecode (in the helper).
  """
  from jax import export as jax_export

  try:
    return jax_export.deserialize(bytearray(data))
  except ImportError as e:  # JAX's reader needs the flatbuffers package
    raise ParseError(f"cannot read a jax.export artifact here: {e}", path) from None
  except Exception as e:  # flatbuffers raises what a bad offset leads it to
    what = f"{type(e).__name__}: {e}".splitlines()[0][:200]
    raise ParseError(
      "binary data that holds MLIR bytecode but is no jax.export artifact "
      f"(Exported.serialize()) that JAX can read ({what})",
      path,
    ) from None


def parse_exported_module(exported, path: str, context: ir.Context | None = None) -> ir.Module:
  """The module of a jax.export.Exported: a portable artifact, parsed as bytecode (in the
  helper) with every check of any other module."""
  data = exported.mlir_module_serialized
  if not data.startswith(MLIR_BYTECODE_MAGIC):
    raise ParseError("a jax.export artifact whose module is not MLIR bytecode: corrupted", path)
  return parse_bytes(data, path, context).module


def _check_nesting(text: str, path: str) -> None:
  """Bracket depth, counted the way the parsers recurse, before they see the text."""
  depth = 0
  for m in _BRACKETS.finditer(text):
    token = m.group()
    if len(token) != 1:
      continue
    if token in "([{<":
      depth += 1
      if depth > MAX_NESTING:
        line = text.count("\n", 0, m.start()) + 1
        col = m.start() - text.rfind("\n", 0, m.start())
        raise ParseError(
          f"brackets nested more than {MAX_NESTING} deep; the parser would overflow its stack",
          path,
          line,
          col,
        )
    else:
      # Never below 0: stray closers must not pay for deeper nesting later.
      depth = max(depth - 1, 0)


def _check_aliases(text: str, path: str) -> None:
  """Aliases used inside aliases nest and multiply when printed.

  The checks after parsing measure attributes and types, but locations cannot
  be taken apart from Python: this bounds them (and the rest) in the text.  An
  alias definition runs from `#name =` to the end of its line, or further while
  its brackets are open.
  """
  limit = MAX_EXPANSION * len(text) + (1 << 20)
  measured: dict[str, tuple[int, int]] = {}  # alias -> (depth, printed size)
  current: list[Any] | None = None  # [name, offset of the definition, depth, size, open brackets]

  def close(end):
    name, start, depth, size, _ = current
    size += end - start
    if depth > MAX_NESTING or size > limit:
      why = (
        f"nests other aliases more than {MAX_NESTING} deep"
        if depth > MAX_NESTING
        else f"expands to more than {MAX_EXPANSION}x the input's size"
      )
      raise ParseError(f"alias {name} {why}", path, text.count("\n", 0, start) + 1, 1)
    measured[name] = (depth, size)

  for m in _ALIAS_TOKENS.finditer(text):
    name, is_def, bracket = m.group(1), m.group(2), m.group(3)
    if name and is_def:
      if current:
        close(m.start())
      current = [name, m.start(), 1, 0, 0]
    elif current is None:
      continue
    elif name:
      d, n = measured.get(name, (0, 0))
      current[2], current[3] = max(current[2], d + 1), current[3] + n
    elif bracket:
      current[4] += 1 if bracket in "([{<" else -1
    elif m.group() == "\n" and current[4] <= 0:
      close(m.start())
      current = None
  if current:
    close(len(text))


def _first_code_line(text: str) -> str:
  for line in text.splitlines():
    s = line.strip()
    if s and not s.startswith("//"):
      return s
  return ""


def _parse_mlir(source, path: str | None, context: ir.Context) -> ir.Module:
  try:
    module = ir.Module.parse(source, context=context)
  except ir.MLIRError as e:
    diag = e.error_diagnostics[0] if e.error_diagnostics else None
    if diag is None:
      raise ParseError(f"not a valid MLIR module: {e}", path) from None
    m = _LOC_LINE_COL.search(str(diag.location))
    # Bytecode errors come at "-":0:0, which is no position.
    line, col = (int(m.group(1)), int(m.group(2))) if m and m.group(1) != "0" else (None, None)
    raise ParseError(f"MLIR parse error: {diag.message}", path, line, col) from None
  op_names = _check_is_stablehlo(module, path, len(source))
  if "mhlo.all_reduce" in op_names:
    return _mhlo_collectives_to_stablehlo(module, context)
  return module


def _mhlo_collectives_to_stablehlo(module: ir.Module, context: ir.Context) -> ir.Module:
  """A module with an mhlo.all_reduce, converted to StableHLO (MHLO's own legalization),
  so that its all-reduces are sites like any other.  Should the conversion fail, the
  mhlo.all_reduce stays and the match reports it as a skipped site, with the reason."""
  try:
    converted = _jax_private.mhlo_to_stablehlo(module)
    return ir.Module.parse(converted, context=context)
  except Exception:  # jaxlib raises its own runtime errors: keep the module as it is
    return module


def _varint(data: bytes, pos: int) -> tuple[int, int]:
  """MLIR bytecode's prefix varint at `pos`: (value, next position).  IndexError past the end."""
  first = data[pos]
  if first & 1:
    return first >> 1, pos + 1
  if first == 0:
    return int.from_bytes(data[pos + 1 : pos + 9], "little"), pos + 9
  size = (first & -first).bit_length()  # trailing zero bits + 1 = bytes in all
  if pos + size > len(data):
    raise IndexError(pos)
  return int.from_bytes(data[pos : pos + size], "little") >> size, pos + size


def _check_bytecode_strings(data: bytes, path: str | None) -> None:
  """The producer and the string table of MLIR bytecode must be UTF-8.

  The reader quotes them in its diagnostics (every diagnostic gets a note "produced
  by: <producer>"), and the Python bindings abort the process (SIGABRT, a nanobind
  conversion error) on a diagnostic that is not UTF-8.  Anything else malformed
  here is left to the reader, which reports it without quoting raw bytes.
  """

  def bad(what):
    raise ParseError(f"MLIR bytecode whose {what} is not UTF-8 text: corrupted", path)

  try:
    _, pos = _varint(data, len(MLIR_BYTECODE_MAGIC))
    end = data.index(b"\0", pos)
    try:
      data[pos:end].decode("utf-8")
    except UnicodeDecodeError:
      bad("producer string")
    pos = end + 1
    while pos < len(data):
      section, pos = data[pos], pos + 1
      length, pos = _varint(data, pos)
      if section & 0x80:  # aligned: alignment, then padding
        alignment, pos = _varint(data, pos)
        if alignment:
          pos += -pos % alignment
      body = data[pos : pos + length]
      pos += length
      if section & 0x7F != 0:  # 0: the string section
        continue
      count, at = _varint(body, 0)
      end = len(body)
      for _ in range(count):  # lengths in reverse order, strings from the back
        size, at = _varint(body, at)
        if not 0 < size <= end:
          return
        try:
          body[end - size : end - 1].decode("utf-8")
        except UnicodeDecodeError:
          bad("string table")
        end -= size
  except (IndexError, ValueError):
    return


def _parse_hlo_text(text: str, path: str, context: ir.Context) -> ir.Module:
  """HLO text -> HloModuleProto -> StableHLO, carrying over what the conversion drops."""
  _check_no_elided_constants(text, path)
  converted, _ = _HELPER.convert(b"h", text.encode(), path)
  module = _parse_converted(converted, path, context)
  # The conversion loses the partition and replica counts: put them back from the
  # header, or every collective would look like a single-device one.
  header = _hlo_header_fields(text)
  i32 = ir.IntegerType.get_signless(32, context)
  for hlo_key, attr in (
    ("num_partitions", "mhlo.num_partitions"),
    ("replica_count", "mhlo.num_replicas"),
  ):
    value = header.get(hlo_key, "1")
    if not value.isdigit() or not 1 <= int(value) <= MAX_DEVICES:
      raise ParseError(
        f"HLO module header: {hlo_key}={value} is not a device count in [1, {MAX_DEVICES}]", path, 1
      )
    module.operation.attributes[attr] = ir.IntegerAttr.get(i32, int(value))
  _check_device_counts(module, path)
  return module


def _check_no_elided_constants(text: str, path: str) -> None:
  """XLA's text dumps write constants of more than 10 elements as `constant({...})`
  unless told otherwise.  XLA's parser accepts that and makes up the values, so such
  a module would be rewritten and written out with garbage constants: refuse it."""
  for m in _HLO_ELIDED.finditer(text):
    if m.group(1) is None:  # a string literal (metadata), not an operand
      continue
    line = text.count("\n", 0, m.start(1)) + 1
    column = m.start(1) - text.rfind("\n", 0, m.start(1))
    raise ParseError(
      "a constant whose values XLA left out of the dump ({...}); dump the "
      "module again with XLA_FLAGS=--xla_dump_large_constants=true",
      path,
      line,
      column,
    )


def _hlo_header_fields(text: str) -> dict[str, str]:
  """`HloModule name, k1=v1, k2={...}` -> {k1: v1, ...} (top-level commas only)."""
  header = _first_code_line(text)
  fields: dict[str, str] = {}
  depth, item = 0, list[str]()
  for ch in header[len("HloModule") :] + ",":
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


def _check_is_stablehlo(module: ir.Module, path: str | None, source_size: int) -> set[str]:
  """Check the module; return the names of every op in it (nested ones too)."""
  names = {op.operation.name for op in module.body.operations}
  if "func.func" not in names:
    found = ", ".join(sorted(names)) or "nothing"
    raise ParseError(
      f"not a StableHLO program: the module has no func.func (found {found})", path, 1, 1
    )
  _check_device_counts(module, path)
  # Iteratively, with explicit stacks: recursion is what is being guarded against.
  measured: dict[str, tuple[int, int]] = {}
  printed = _measure(module.operation.attributes.values(), measured, path)
  limit = MAX_EXPANSION * source_size + (1 << 20)
  if printed > limit:
    raise ParseError(
      f"module attributes expand to more than {MAX_EXPANSION}x the input's size", path
    )
  op_names = set()
  stack = [(op.operation, 1) for op in module.body.operations]
  while stack:
    op, depth = stack.pop()
    op_names.add(op.name)
    dialect = op.name.partition(".")[0]
    if dialect not in DIALECTS:
      raise ParseError(
        f"not a StableHLO program: {op.name} is an op of the {dialect} dialect "
        f"(expected only {', '.join(DIALECTS)})",
        path,
        *_text_position(op),
      )
    if depth > MAX_OP_NESTING:
      raise ParseError(
        f"ops nested more than {MAX_OP_NESTING} regions deep", path, *_text_position(op)
      )
    printed += _measure(op.attributes.values(), measured, path)
    printed += _measure([r.type for r in op.results], measured, path)
    for region in op.regions:
      for block in region.blocks:
        printed += _measure([a.type for a in block.arguments], measured, path)
        stack.extend((child.operation, depth + 1) for child in block.operations)
    if printed > limit:
      raise ParseError(
        f"attribute and type aliases expand to more than {MAX_EXPANSION}x the input's size",
        path,
        *_text_position(op),
      )
  return op_names


def _parts(node) -> list:
  """The attributes and types directly inside an attribute or type."""
  if isinstance(node, ir.ArrayAttr):
    return list(node)
  if isinstance(node, ir.DictAttr):
    return [node[i].attr for i in range(len(node))]
  if isinstance(node, ir.TypeAttr):
    return [node.value]
  if isinstance(node, ir.TupleType):
    return [node.get_type(i) for i in range(node.num_types)]
  if isinstance(node, ir.FunctionType):
    return list(node.inputs) + list(node.results)
  if isinstance(node, (ir.ShapedType, ir.ComplexType)):
    return [node.element_type]
  return []


def _measure(roots, measured: dict, path: str | None) -> int:
  """Printed size (nodes) of the attributes and types in `roots`.

  Depth and size of each distinct attribute/type are computed once, post-order,
  and kept in `measured`.
  """
  roots = list(roots)
  for root in roots:
    stack = [(root, False)]
    while stack:
      node, ready = stack.pop()
      key = (isinstance(node, ir.Type), node)
      if key in measured:
        continue
      parts = _parts(node)
      if not ready:
        stack.append((node, True))
        stack.extend((p, False) for p in parts)
        continue
      depth, size = 1, 1
      for p in parts:
        d, n = measured[(isinstance(p, ir.Type), p)]
        depth, size = max(depth, d + 1), size + n
      if depth > MAX_NESTING:
        raise ParseError(f"attributes or types nested more than {MAX_NESTING} deep", path)
      # Capped: an alias bomb would otherwise make numbers with millions of digits.
      measured[key] = (depth, min(size, 1 << 62))
  return sum(measured[(isinstance(r, ir.Type), r)][1] for r in roots)


def _check_device_counts(module: ir.Module, path: str | None) -> None:
  """mhlo.num_partitions and mhlo.num_replicas, where given, are sane integers."""
  attrs = module.operation.attributes
  total = 1
  for name in ("mhlo.num_partitions", "mhlo.num_replicas"):
    if name not in attrs:
      continue
    attr = attrs[name]
    value = ir.IntegerAttr(attr).value if isinstance(attr, ir.IntegerAttr) else None
    if value is None or value < 1:
      raise ParseError(f"module attribute {name} must be a positive integer, got {attr}", path)
    total *= value
  if total > MAX_DEVICES:
    raise ParseError(
      f"the module claims {total} devices (mhlo.num_partitions x "
      f"mhlo.num_replicas); at most {MAX_DEVICES} are supported",
      path,
    )


def _text_position(op: ir.Operation) -> tuple[int | None, int | None]:
  """(line, column) of an op in the parsed text, when its location is one ("-":L:C)."""
  m = re.fullmatch(r'loc\("-":(\d+):(\d+)\)', str(op.location))
  return (int(m.group(1)), int(m.group(2))) if m else (None, None)


# --- parsers that can crash, in a helper process -------------------------------
# MLIR's bytecode reader and XLA's HLO text parser are not hardened against
# corrupted input: fuzzing (tests/fuzz.py) found one-byte changes that make them
# corrupt the heap (SIGABRT "malloc(): invalid size"), segfault, or fail an XLA
# CHECK (SIGABRT).  So those inputs are parsed in a helper process, which sends
# the module back as MLIR text with its locations; the text then goes through the
# in-process text parser and every check above.  The helper starts on first use
# (it imports JAX, about 2 s) and serves later calls; a crash costs a restart.

# Generous: the helper's start, then a parse and a print that grow with the size.
# (Fuzzing found bytecode on which the reader loops for good.)
HELPER_SECONDS = 60
HELPER_SECONDS_PER_MB = 10


def _parse_converted(text: str, path: str, context: ir.Context) -> ir.Module:
  """Text the helper printed.  Its lines are not the input's: errors drop them."""
  try:
    _check_nesting(text, path)
    _check_aliases(text, path)
    return _parse_mlir(text, path, context)
  except ParseError as e:
    message = e.message.removeprefix("MLIR parse error: ")
    raise ParseError(
      f"jaxlib's conversion of this input gave a module that MLIR cannot read back: {message}", path
    ) from None


def _convert(kind: bytes, data: bytes, limit: int) -> tuple[str, str]:
  """In the helper: bytecode or HLO text -> (MLIR text, input kind)."""
  context = _jax_private.make_ir_context()
  if kind == b"b":
    _check_bytecode_strings(data, None)
    try:
      module, input_kind = _parse_mlir(data, None, context), "stablehlo-bytecode"
    except ParseError as not_stablehlo:
      # A jax.export portable artifact is VHLO bytecode: upgrade it to StableHLO
      # (into a module of the current context: it needs one).
      try:
        with context:
          module = jax_mlir.deserialize_portable_artifact(data)
      except Exception:
        raise not_stablehlo from None
      _check_is_stablehlo(module, None, len(data))
      input_kind = "portable-artifact"
  else:
    text = data.decode()
    try:
      proto = _jax_private.hlo_text_to_proto(text)
    except Exception as e:  # jaxlib raises JaxRuntimeError (INVALID_ARGUMENT)
      m = _HLO_LINE_COL.search(str(e))
      if m:
        raise ParseError(
          f"HLO parse error: {m.group(3)}", None, int(m.group(1)), int(m.group(2))
        ) from None
      raise ParseError(f"HLO parse error: {str(e).splitlines()[0]}") from None
    try:
      bytecode = jax_mlir.hlo_to_stablehlo(proto)
    except Exception as e:
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise ParseError(f"jaxlib cannot convert this HLO module to StableHLO: {first}") from None
    try:
      module, input_kind = _parse_mlir(bytecode, None, context), "hlo-text"
    except ParseError as e:  # the HLO parsed; what jaxlib made of it does not verify
      raise ParseError(
        f"jaxlib's HLO -> StableHLO conversion gave an invalid module: {e.message}"
      ) from None
  out = _BoundedText(limit)
  module.operation.print(enable_debug_info=True, file=out)
  return "".join(out.parts), input_kind


class _BoundedText:
  """A file for ir printing that stops the helper once the text passes `limit`.

  Raising from inside the printer's callback would abort the process, so the
  helper answers and exits instead.
  """

  def __init__(self, limit: int):
    self.limit, self.size = limit, 0
    self.parts: list[str] = []

  def write(self, part: str) -> None:
    self.size += len(part)
    if self.size > self.limit:
      _reply(
        b"e",
        json.dumps(
          [
            f"prints as more than {MAX_EXPANSION}x the input's size (nested locations or aliases)",
            None,
            None,
          ]
        ).encode(),
      )
      os._exit(0)
    self.parts.append(part)


_PROTOCOL: BinaryIO | None = None  # the helper's reply stream


def _reply(status: bytes, payload: bytes) -> None:
  assert _PROTOCOL is not None, "not in the helper"
  _PROTOCOL.write(status + len(payload).to_bytes(8, "big") + payload)
  _PROTOCOL.flush()


def helper_main() -> None:
  """The helper's loop: requests on stdin, replies on (what was) stdout."""
  global _PROTOCOL
  # A parser stuck in C++ never returns to read stdin again, so the helper must
  # not outlive its parent (which may be killed without a chance to stop it):
  # Linux kills it with its parent, and an alarm ends each request in time.
  try:
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass
  if os.getppid() != int(os.environ.get("EQUARX_PARSE_PARENT", os.getppid())):
    return  # the parent died before prctl
  # Keep the protocol stream to ourselves: anything printed goes to stderr.
  _PROTOCOL = os.fdopen(os.dup(1), "wb")
  os.dup2(2, 1)
  requests = sys.stdin.buffer
  while True:
    header = requests.read(13)
    if len(header) < 13:
      return
    kind, seconds, size = (
      header[:1],
      int.from_bytes(header[1:5], "big"),
      int.from_bytes(header[5:], "big"),
    )
    data = requests.read(size)
    limit = MAX_EXPANSION * size + (1 << 20)
    # SIGALRM's default action ends the process even inside C++ code.
    signal.alarm(seconds + 5)
    try:
      text, input_kind = _convert(kind, data, limit)
    except ParseError as e:
      _reply(b"e", json.dumps([e.message, e.line, e.column]).encode())
    else:
      _reply(b"t", input_kind.encode() + b"\0" + text.encode())
    signal.alarm(0)


class _Helper:
  def __init__(self):
    self.lock = threading.Lock()
    self.proc = None
    self.stderr = None
    self.owner = None  # the pid that started it: a forked child needs its own

  def _start(self) -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu", EQUARX_PARSE_PARENT=str(os.getpid()))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    self.stderr = tempfile.TemporaryFile()
    self.owner = os.getpid()
    self.proc = subprocess.Popen(
      [sys.executable, "-c", "from equarx_pass.ir import parse; parse.helper_main()"],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=self.stderr,
      env=env,
    )

  def stop(self) -> None:
    if self.proc is not None:
      self.proc.kill()
      self.proc.wait()
      self.proc = None

  def convert(self, kind: bytes, data: bytes, path: str) -> tuple[str, str]:
    """Bytecode (b"b") or HLO text (b"h") -> (MLIR text, input kind), in the helper."""
    what = "MLIR bytecode reader" if kind == b"b" else "XLA HLO parser"
    seconds = int(HELPER_SECONDS + HELPER_SECONDS_PER_MB * len(data) / 1e6)
    deadline = time.monotonic() + seconds
    with self.lock:
      if self.proc is None or self.owner != os.getpid() or self.proc.poll() is not None:
        self._start()
      self.stderr.seek(0)
      self.stderr.truncate()
      try:
        self.proc.stdin.write(
          kind + seconds.to_bytes(4, "big") + len(data).to_bytes(8, "big") + data
        )
        self.proc.stdin.flush()
        header = self._read(9, deadline)
        payload = self._read(int.from_bytes(header[1:], "big"), deadline)
      except TimeoutError:
        self.stop()
        raise ParseError(f"the {what} did not finish in time on this input", path) from None
      except (OSError, EOFError):
        code = self.proc.wait()
        self.proc = None
        raise ParseError(
          f"jaxlib's {what} crashed on this input ({self._why(code)}): a "
          "corrupted file, or a construct jaxlib's parser cannot handle",
          path,
        ) from None
    if header[:1] == b"e":
      message, line, column = json.loads(payload)
      if kind == b"b":  # positions in bytecode are not positions in the file
        line = column = None
      raise ParseError(message, path, line, column)
    kind_name, _, text = payload.partition(b"\0")
    return text.decode(), kind_name.decode()

  def _read(self, size: int, deadline: float) -> bytes:
    out = bytearray()
    fd = self.proc.stdout.fileno()
    while len(out) < size:
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([fd], [], [], left)[0]:
        raise TimeoutError
      chunk = os.read(fd, min(size - len(out), 1 << 20))
      if not chunk:
        raise EOFError
      out += chunk
    return bytes(out)

  def _why(self, code: int) -> str:
    """The signal, and XLA's CHECK message if the helper printed one."""
    why = signal.Signals(-code).name if code < 0 else f"exit status {code}"
    self.stderr.seek(0)
    for line in self.stderr.read().decode(errors="replace").splitlines():
      if "Check failed" in line or "malloc()" in line:
        return f"{why}: {line.split('] ', 1)[-1].strip()}"
    return why


_HELPER = _Helper()
atexit.register(_HELPER.stop)
