"""Bad input, through the library and equarx-opt: the project's own errors, never a crash.

Every bad input gets a ParseError (or an EquarxError for files) naming the file,
with the line and column where the parser gives them; nothing is written and the
input is untouched.  Inputs that used to crash the C++ parsers (tests/data/bad_input,
found by tests/fuzz.py, and generated deep nesting) run in a child process, so a
crash shows up as a failed test with the child's exit status, not a dead pytest.
tests/test_cli.py covers the CLI's empty, junk, garbled, unrelated-dialect,
bad-HLO, missing-input and unwritable-output cases; these add the rest.
"""

import io
import json
import os
import subprocess
import sys

import pytest
from jax.extend.mlir import ir
from jax_startup import without_jax_startup

import equarx_pass
from equarx_pass import _jax_private
from equarx_pass.errors import EquarxError, ParseError
from equarx_pass.ir import parse
from equarx_pass.planning.policy import Policy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "hlo_fixtures")
DATA = os.path.join(ROOT, "tests", "data", "bad_input")
POLICY = Policy(enable=True, min_bytes=0)
ENV = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
ENV.pop("EQUARX_FLAGS", None)


def fixture(name: str) -> bytes:
  with open(os.path.join(FIXTURES, name), "rb") as f:
    return f.read()


def position(text: bytes, needle: bytes) -> tuple[int, int]:
  """1-based line and column of `needle` in `text`."""
  at = text.index(needle)
  return text.count(b"\n", 0, at) + 1, at - text.rfind(b"\n", 0, at)


def bytecode(text: str) -> bytes:
  """Bytecode of a module parsed straight by MLIR (none of parse.py's checks)."""
  module = ir.Module.parse(text, context=_jax_private.make_ir_context())
  buffer = io.BytesIO()
  module.operation.write_bytecode(buffer)
  return buffer.getvalue()


MLP = fixture("tp_mlp_f32.mlir")
HLO = fixture("tp_mlp_f32.before_optimizations.txt")
# A dump made without --xla_dump_large_constants: XLA's parser would invent the values.
ELIDED_HLO = HLO.replace(b"\nENTRY", b"\nc {\n  ROOT k = f32[64]{0} constant({...})\n}\n\nENTRY", 1)
# The fixture cut in half, mid-instruction: XLA's parser stops at the cut-off word (the
# position follows the fixture, which regenerating it shifts).
TRUNCATED_HLO = HLO[: len(HLO) // 2]
_last_line = TRUNCATED_HLO.split(b"\n")[-1]
TRUNCATED_AT = (TRUNCATED_HLO.count(b"\n") + 1, _last_line.rindex(b" ") + 2)
ARITH = b"""module {
  func.func @f(%a: f32) -> f32 {
    %0 = arith.addf %a, %a : f32
    return %0 : f32
  }
}
"""
VHLO = b"""module {
  func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = "vhlo.add_v1"(%a, %a) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""
TOSA = b"""module {
  func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = tosa.abs %a : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""
BAD_HLO_OP = b"HloModule m\n\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT r = f32[2] bogus(p)\n}\n"


def alias_chain(n: int, body: str) -> str:
  """`#a0 = body(#a1)`, ..., innermost last-defined-first, used as a module attribute."""
  lines = [f"#a{n} = [1]"] + [f"#a{i} = {body.format(f'#a{i + 1}')}" for i in reversed(range(n))]
  return (
    "\n".join(lines)
    + "\nmodule attributes {mhlo.x = #a0} {\n  func.func @f() {\n    return\n  }\n}\n"
  )


# name: (input, words the message must contain, line, column); None: not given.
PARSE_CASES = {
  "empty": (b"", "empty input", None, None),
  "blank": (b"  \n\t\n", "empty input", None, None),
  "junk": (
    bytes(range(256)) * 4,
    "neither MLIR bytecode, a jax.export artifact nor UTF-8 text",
    2,
    None,
  ),
  "nul": (b"module {\n}\x00\n", "NUL bytes", 2, None),
  "truncated_mlir": (MLP[: MLP.index(b"stablehlo.all_reduce") + 10], "MLIR parse error", 31, 24),
  "garbled_mlir": (
    MLP.replace(b"stablehlo.add %", b"stablehlo.addd %"),
    "custom op 'stablehlo.addd'",
    *position(MLP, b"stablehlo.add %"),
  ),
  "arith": (ARITH, "arith.addf is an op of the arith dialect", 3, 10),
  "vhlo_text": (VHLO, "vhlo.add_v1 is an op of the vhlo dialect", 3, 10),
  "tosa": (TOSA, "tosa", 3, 10),
  "llvm_only": (b"module {\n  llvm.func @f() {\n    llvm.return\n  }\n}\n", "no func.func", 1, 1),
  "not_mlir": (b"def f(x):\n  return x\n", "MLIR parse error", 1, 1),
  "bad_hlo_op": (BAD_HLO_OP, "HLO parse error", 5, 19),
  "truncated_hlo": (TRUNCATED_HLO, "HLO parse error", *TRUNCATED_AT),
  "hlo_header_only": (HLO.split(b"\n")[0] + b"\n", "HLO parse error", 2, 1),
  "hlo_elided_constant": (
    ELIDED_HLO,
    "--xla_dump_large_constants=true",
    *position(ELIDED_HLO, b"{...}"),
  ),
  "hlo_no_devices": (
    HLO.replace(b"num_partitions=8", b"num_partitions=0", 1),
    "num_partitions=0 is not a device count",
    1,
    None,
  ),
  "partitions_string": (
    MLP.replace(b"mhlo.num_partitions = 8 : i32", b'mhlo.num_partitions = "8"'),
    "mhlo.num_partitions must be a positive integer",
    None,
    None,
  ),
  "partitions_zero": (
    MLP.replace(b"mhlo.num_partitions = 8 : i32", b"mhlo.num_partitions = 0 : i32"),
    "mhlo.num_partitions must be a positive integer",
    None,
    None,
  ),
  "partitions_huge": (
    MLP.replace(b"mhlo.num_partitions = 8 : i32", b"mhlo.num_partitions = 2147483647 : i32"),
    "claims 2147483647 devices",
    None,
    None,
  ),
  "nested_modules": (b"module {\n" * 5000 + b"}\n" * 5000, "nested more than 1000 deep", 1001, 8),
  "nested_tuple_type": (
    b"module {\n  func.func @f(%a: "
    + b"tuple<" * 20000
    + b"f32"
    + b">" * 20000
    + b") {\n    return\n  }\n}\n",
    "nested more than 1000 deep",
    2,
    None,
  ),
  "nested_hlo_tuple": (
    b"HloModule m\n\nENTRY e {\n  p = "
    + b"(" * 20000
    + b"f32[]"
    + b")" * 20000
    + b" parameter(0)\n  ROOT r = f32[] constant(0)\n}\n",
    "nested more than 1000 deep",
    4,
    None,
  ),
  "alias_chain": (
    alias_chain(30000, "[{}]").encode(),
    "nests other aliases more than 1000 deep",
    None,
    1,
  ),
  "alias_bomb": (alias_chain(60, "[{0}, {0}]").encode(), "expands to more than 32x", None, 1),
  "location_bomb": (
    MLP.replace(
      b"return %0 : tensor<64x512xf32> loc(#loc37)", b"return %0 : tensor<64x512xf32> loc(#z0)"
    )
    + b"\n".join(
      [b'#z60 = loc("a":1:1)']
      + [b"#z%d = loc(callsite(#z%d at #z%d))" % (i, i + 1, i + 1) for i in reversed(range(60))]
    )
    + b"\n",
    "expands to more than 32x",
    None,
    1,
  ),
}


def _parse_error(data: bytes, name: str) -> ParseError:
  with pytest.raises(ParseError) as info:
    parse.parse_bytes(data, name)
  return info.value


@pytest.mark.parametrize("name", sorted(PARSE_CASES))
def test_parse_bytes_raises_parse_error_with_position(name):
  data, words, line, column = PARSE_CASES[name]
  e = _parse_error(data, name)
  assert words in str(e)
  assert e.path == name and str(e).startswith(name + ":")
  assert (line is None or e.line == line) and (column is None or e.column == column), (
    e.line,
    e.column,
  )
  where = name + "".join(f":{v}" for v in (e.line, e.column) if v is not None)
  assert str(e) == f"{where}: {e.message}"


@pytest.mark.parametrize(
  "error", [equarx_pass.RewriteError, equarx_pass.VerifyError, equarx_pass.CompileError]
)
def test_errors_after_parsing_name_the_input(error, monkeypatch):
  """The CLI prints only the message: a failed rewrite must say which file."""
  from equarx_pass.frontends import transform

  def fail(module, policy):
    raise error("all-reduce #0 at f.py:3: cannot emit the quantized ring")

  monkeypatch.setattr(transform, "rewrite_module", fail)
  with pytest.raises(error) as info:
    equarx_pass.transform_text(MLP, POLICY, "model.mlir")
  assert str(info.value) == "model.mlir: all-reduce #0 at f.py:3: cannot emit the quantized ring"


def test_unrelated_dialect_is_not_printed_as_stablehlo():
  """An arith module used to come back 'rewritten' (unchanged) and printed as the output."""
  with pytest.raises(ParseError, match="arith"):
    equarx_pass.transform_text(ARITH, POLICY, "arith.mlir")


def test_bytecode_deeply_nested_attribute():
  """Bytecode has no brackets to count: the depth is measured after parsing."""
  data = bytecode(alias_chain(5000, "[{}]"))
  e = _parse_error(data, "deep.mlirbc")
  assert "attributes or types nested more than 1000 deep" in str(e)
  assert (e.path, e.line) == ("deep.mlirbc", None)


def test_bytecode_location_bomb():
  """Locations cannot be taken apart from Python: the helper prints them (as aliases,
  with a bound on the size) and the text check measures the aliases."""
  text = (
    MLP.decode().replace("loc(#loc37)", "loc(#z0)")
    + "\n".join(
      ['#z40 = loc("a":1:1)']
      + [f"#z{i} = loc(callsite(#z{i + 1} at #z{i + 1}))" for i in reversed(range(40))]
    )
    + "\n"
  )
  e = _parse_error(bytecode(text), "bomb.mlirbc")
  assert "expands to more than 32x the input's size" in str(e) and e.path == "bomb.mlirbc"


def test_truncated_and_corrupted_bytecode_never_crash():
  """Every prefix length class and flipped bytes of a real module's bytecode."""
  good = bytecode(MLP.decode())
  assert parse.parse_bytes(good, "good.mlirbc").kind == "stablehlo-bytecode"
  bad = [good[:n] for n in (4, 5, 8, 20, 100, len(good) // 2, len(good) - 1)]
  bad += [good[:n] + bytes([good[n] ^ 0xFF]) + good[n + 1 :] for n in range(6, len(good), 97)]
  for i, data in enumerate(bad):
    with pytest.raises(ParseError) as info:
      parse.parse_bytes(data, f"bad{i}.mlirbc")
    assert info.value.path == f"bad{i}.mlirbc"


def test_portable_artifact_and_its_truncations():
  """A jax.export (VHLO) artifact parses (it never did before: deserializing needs an
  MLIR context), and its truncations are ParseErrors."""
  from jax.extend import mlir as jax_mlir

  artifact = jax_mlir.serialize_portable_artifact(bytecode(MLP.decode()), "1.0.0")
  assert parse.parse_bytes(artifact, "a.bin").kind == "portable-artifact"
  for n in (10, len(artifact) // 3, len(artifact) - 3):
    with pytest.raises(ParseError, match="a.bin"):
      parse.parse_bytes(artifact[:n], "a.bin")


def test_exported_artifact_and_its_corruptions():
  """A serialized jax.export.Exported parses to its module; truncated or with bytes
  changed, it is a ParseError or (a change in a name, say) still an artifact, never
  another exception."""
  import jax
  import numpy as np
  from jax.sharding import PartitionSpec as P

  mesh = jax.make_mesh((8,), ("tp",), (jax.sharding.AxisType.Auto,))
  f = jax.shard_map(lambda x: jax.lax.psum(x, "tp"), mesh=mesh, in_specs=P("tp"), out_specs=P())
  x = jax.ShapeDtypeStruct((8, 256), np.float32)
  good = bytes(jax.export.export(jax.jit(f))(x).serialize(vjp_order=1))
  parsed = parse.parse_bytes(good, "f.exported")
  assert parsed.kind == "jax-exported" and parsed.exported.nr_devices == 8
  assert "stablehlo.all_reduce" in str(parsed.module)
  bad = [good[:n] for n in (8, 64, len(good) // 2, len(good) - 1)]
  bad += [good[:n] + bytes([good[n] ^ 0xFF]) + good[n + 1 :] for n in range(0, len(good), 61)]
  outcomes = set()
  for i, data in enumerate(bad):
    try:
      outcomes.add(parse.parse_bytes(data, f"bad{i}.exported").kind)
    except ParseError as e:
      assert e.path == f"bad{i}.exported"
      outcomes.add("ParseError")
  assert "ParseError" in outcomes


# --- inputs that crashed the C++ parsers: in a child process ---------------------

CHILD = r"""
import json, sys
from equarx_pass.ir import parse
from equarx_pass.errors import EquarxError
out = []
for arg in sys.argv[1:]:
  seconds, path = arg.split(":", 1)
  parse.HELPER_SECONDS = float(seconds)
  try:
    out.append(["parsed", parse.parse_file(path).kind])
  except EquarxError as e:
    out.append([type(e).__name__, str(e)])
print(json.dumps(out))
"""


def test_inputs_that_crash_or_hang_the_parsers_are_parse_errors(tmp_path):
  """One byte changed in bytecode: heap corruption (SIGABRT) and SIGSEGV in MLIR's
  reader; an HLO parameter number out of range: an XLA CHECK failure (SIGABRT); a
  portable artifact with three bytes changed: the reader loops for good, and the
  helper is stopped after HELPER_SECONDS (3 here, 60 by default)."""
  hlo = tmp_path / "param.txt"
  hlo.write_bytes(
    HLO.replace(
      b'parameter(0), metadata={op_name="psum_invariant"}',
      b'parameter(65536), metadata={op_name="psum_invariant"}',
    )
  )
  assert hlo.read_bytes() != HLO
  good = tmp_path / "good.mlirbc"
  good.write_bytes(bytecode(MLP.decode()))
  producer = tmp_path / "producer.mlirbc"
  end = good.read_bytes().index(b"\0", 5)
  producer.write_bytes(good.read_bytes()[:6] + b"\xff" * (end - 6) + good.read_bytes()[end:])
  paths = [
    good,  # starts the helper before any clock is short
    os.path.join(DATA, "artifact_endless_loop.mlirbc"),
    os.path.join(DATA, "bytecode_heap_corruption.mlirbc"),
    os.path.join(DATA, "bytecode_segfault.mlirbc"),
    hlo,
    producer,
    os.path.join(FIXTURES, "tp_mlp_f32.before_optimizations.txt"),
  ]
  args = [f"{3 if i == 1 else 60}:{p}" for i, p in enumerate(paths)]
  proc = subprocess.run(
    [sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=ENV, timeout=600
  )
  assert proc.returncode == 0, f"the process died ({proc.returncode}): {proc.stderr[-2000:]}"
  results = json.loads(proc.stdout.splitlines()[-1])
  assert [r[0] for r in results] == ["parsed"] + ["ParseError"] * 5 + ["parsed"], results
  _, stuck, heap, segv, check, utf8, _ = (r[1] for r in results)
  assert stuck == f"{paths[1]}: the MLIR bytecode reader did not finish in time on this input"
  assert heap.startswith(
    f"{paths[2]}: jaxlib's MLIR bytecode reader crashed on this input (SIGABRT"
  )
  assert segv.startswith(
    f"{paths[3]}: jaxlib's MLIR bytecode reader crashed on this input (SIGSEGV"
  )
  assert check.startswith(
    f"{hlo}: jaxlib's XLA HLO parser crashed on this input (SIGABRT: Check failed: param_no >= 0"
  )
  assert utf8 == f"{producer}: MLIR bytecode whose producer string is not UTF-8 text: corrupted"


# --- files ------------------------------------------------------------------------


def test_unreadable_inputs(tmp_path):
  """What fails to read even for root: a missing file, a directory, a path through a file."""
  plain = tmp_path / "plain.mlir"
  plain.write_bytes(MLP)
  cases = [
    (tmp_path / "missing.mlir", "No such file or directory"),
    (tmp_path, "Is a directory"),
    (plain / "inner.mlir", "Not a directory"),
  ]
  for path, why in cases:
    for call in (
      lambda: parse.parse_file(str(path)),
      lambda: equarx_pass.transform_file(str(path), str(tmp_path / "out.mlir"), POLICY),
    ):
      with pytest.raises(ParseError) as info:
        call()
      assert str(info.value) == f"{path}: cannot read input: {why}"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.mlir"]


def test_unwritable_outputs_write_nothing(tmp_path):
  src = tmp_path / "in.mlir"
  src.write_bytes(MLP)
  (tmp_path / "outdir").mkdir()
  (tmp_path / "outdir" / "keep").write_text("x")
  outputs = [
    tmp_path / "no" / "such" / "out.mlir",  # missing directory
    tmp_path / "outdir",  # an existing directory
    src / "out.mlir",  # a path through a file
    "/proc/equarx-out.mlir",
  ]  # a file system that takes no new files
  for out in outputs:
    with pytest.raises(EquarxError, match="cannot write output"):
      equarx_pass.transform_file(str(src), str(out), POLICY)
  assert src.read_bytes() == MLP
  assert sorted(p.name for p in tmp_path.iterdir()) == ["in.mlir", "outdir"]
  assert [p.name for p in (tmp_path / "outdir").iterdir()] == ["keep"]


def test_outputs_that_are_not_plain_files(tmp_path):
  """A FIFO (like /dev/null, which as root used to be replaced by a regular file)
  is written through; a symlink keeps pointing at its target, which gets the text;
  a file gets the usual mode (the temporary's 0600 used to stay), or keeps its own."""
  import stat
  import threading

  src = tmp_path / "in.mlir"
  src.write_bytes(MLP)
  fifo = tmp_path / "fifo"
  os.mkfifo(fifo)
  received = []
  reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
  reader.start()
  equarx_pass.transform_file(str(src), str(fifo), POLICY)
  reader.join(60)
  assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and received[0].startswith("module @jit_mlp")

  target, link = tmp_path / "target.mlir", tmp_path / "link.mlir"
  target.write_text("old")
  os.chmod(target, 0o640)
  link.symlink_to(target)
  equarx_pass.transform_file(str(src), str(link), POLICY)
  assert link.is_symlink() and target.read_text().startswith("module @jit_mlp")
  assert stat.S_IMODE(os.stat(target).st_mode) == 0o640

  fresh = tmp_path / "fresh.mlir"
  umask = os.umask(0o022)
  try:
    equarx_pass.transform_file(str(src), str(fresh), POLICY)
  finally:
    os.umask(umask)
  assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o644
  assert sorted(p.name for p in tmp_path.iterdir()) == [
    "fifo",
    "fresh.mlir",
    "in.mlir",
    "link.mlir",
    "target.mlir",
  ]


def test_cli_full_standard_output(tmp_path):
  with open("/dev/full", "w") as full:
    proc = subprocess.run(
      [
        sys.executable,
        "-m",
        "equarx_pass.frontends.cli",
        os.path.join(FIXTURES, "tp_mlp_f32.mlir"),
      ],
      stdout=full,
      stderr=subprocess.PIPE,
      text=True,
      env=ENV,
      timeout=600,
    )
  assert proc.returncode == 2
  assert without_jax_startup(proc.stderr) == (
    "equarx-opt: error: cannot write to standard output: No space left on device\n"
  )


def test_bad_input_to_transform_file_writes_nothing(tmp_path):
  for i, name in enumerate(["garbled_mlir", "bad_hlo_op", "nested_modules", "arith"]):
    src = tmp_path / f"in{i}"
    src.write_bytes(PARSE_CASES[name][0])
    with pytest.raises(ParseError, match=f"in{i}"):
      equarx_pass.transform_file(str(src), str(tmp_path / "out.mlir"), POLICY)
    assert src.read_bytes() == PARSE_CASES[name][0]
  assert sorted(p.name for p in tmp_path.iterdir()) == [f"in{i}" for i in range(4)]


# --- the CLI, for what tests/test_cli.py does not cover -------------------------


def equarx_opt(*args):
  proc = subprocess.run(
    [sys.executable, "-m", "equarx_pass.frontends.cli", *map(str, args)],
    capture_output=True,
    text=True,
    env=ENV,
    timeout=600,
  )
  proc.stderr = without_jax_startup(proc.stderr)
  return proc


def test_cli_reports_a_parser_crash_as_bad_input(tmp_path):
  src = tmp_path / "x.mlirbc"
  with open(os.path.join(DATA, "bytecode_segfault.mlirbc"), "rb") as f:
    src.write_bytes(f.read())
  words = "MLIR bytecode reader crashed on this input (SIGSEGV)"
  out = tmp_path / "out.mlir"
  proc = equarx_opt(src, "-o", out)
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.startswith(f"equarx-opt: error: {src}") and words in proc.stderr
  assert proc.stderr.count("\n") == 1, proc.stderr  # one line: no dump, no traceback
  assert proc.stdout == "" and not out.exists()
