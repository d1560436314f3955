"""Foreign modules: the pass on HLO and StableHLO written by XLA's, StableHLO's and
Shardy's own developers (their test files), not by us.

tests/data/foreign/ holds modules cut verbatim out of those repositories by
tests/cut_foreign_modules.py; manifest.json says where each comes from (repo,
commit, path, line) and how many devices its test harness runs it on.  For every
module, the pipeline `equarx-opt --equarx_enable --equarx_min_bytes=0` runs
(parse -> rewrite -> verify -> print), in process, and:

  * it raises nothing but the pass's own errors, each a one-line message; a
    VerifyError (the pass made an invalid module) is a failure, and so is a parser
    crash called a corrupted file (these files are upstream's own, uncorrupted);
  * the output verifies, and its printed text parses again;
  * every all-reduce in the input (HLO all-reduce / all-reduce-start, stablehlo.,
    mhlo. and sdy.all_reduce) has exactly one SiteRecord, rewritten or skipped with
    a reason; none has two, and no record stands for an op that is not there;
  * a rewritten site keeps its result type: every op that used the all-reduce's
    result sees the same type afterwards (a bf16 -> f32 all-reduce stays f32), and
    every function keeps its signature.

A subset of the modules that run on the 8 CPU devices (static float/int inputs,
no custom calls) is compiled and run before and after the rewrite on the same
random inputs: integer and untouched outputs must match exactly, float outputs
within 3e-2 of the output's largest magnitude.  32 modules by default (async and
variadic all-reduces first); EQUARX_FOREIGN_NUMERIC=all runs every eligible one
(about a minute more on 2 cores), EQUARX_FOREIGN_NUMERIC=N runs N of them.

The device counts of a module that does not state them in its text (the HLO
header, mhlo.num_partitions/num_replicas) come from the manifest and are set as
module attributes after parsing: upstream's harness passes them on the command
line or in C++, which is where the cutter found them.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import re

import cut_foreign_modules as cut
import jax
import ml_dtypes
import numpy as np
import pytest
from jax.extend import backend as jax_backend
from jax.extend.mlir import ir

from equarx_pass import _jax_private, rewrite
from equarx_pass.errors import EquarxError, ParseError, VerifyError
from equarx_pass.ir import parse, traverse
from equarx_pass.planning import match
from equarx_pass.planning import policy as policy_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CORPUS = os.path.join(ROOT, "tests", "data", "foreign")
with open(os.path.join(CORPUS, "manifest.json")) as _f:
  MANIFEST = json.load(_f)["modules"]
NAMES = sorted(MANIFEST)

# What `equarx-opt --equarx_enable --equarx_min_bytes=0` runs with (cli.py:
# Policy(enable=True), then $EQUARX_FLAGS, which tests leave unset, then the flags).
POLICY = policy_lib.apply_flags(
  policy_lib.Policy(enable=True), "--equarx_enable --equarx_min_bytes=0"
)

TAG = "equarx_test.uses"  # discardable attribute: which all-reduce results an op uses


# --- the pipeline, once per module ---------------------------------------------


class Outcome:
  """What the pipeline made of one module."""

  def __init__(self, name: str):
    self.name = name
    self.entry = MANIFEST[name]
    with open(os.path.join(CORPUS, name), "rb") as f:
      self.data = f.read()
    self.text = self.data.decode()
    self.error: BaseException | None = None
    self.input: ir.Module | None = None  # parsed, device counts set, users tagged
    self.result: rewrite.RewriteResult | None = None
    self.expected_types: dict[str, str] = {}  # tag -> the type the user saw
    self.signatures: dict[str, str] = {}
    self.output_text: str | None = None


def _set_devices(module: ir.Module, entry: dict) -> None:
  """Device counts from the manifest, where the module's text does not state them."""
  devices = entry["devices"]
  if devices["source"] in ("header", "module attributes"):
    return
  with module.context:
    i32 = ir.IntegerType.get_signless(32)
    attrs = module.operation.attributes
    attrs["mhlo.num_replicas"] = ir.IntegerAttr.get(i32, devices["replicas"])
    attrs["mhlo.num_partitions"] = ir.IntegerAttr.get(i32, devices["partitions"])


def _tag_users(module: ir.Module) -> dict[str, str]:
  """Mark every op that uses an all-reduce result: TAG lists "site:result:operand",
  and the returned dict maps each to the type the op sees there."""
  expected = {}
  with module.context:
    for index, op in enumerate(match.find_all_reduces(module)):
      for r, result in enumerate(op.results):
        for use in result.uses:
          user = use.owner
          key = f"{index}:{r}:{use.operand_number}"
          expected[key] = str(result.type)
          old = (
            [ir.StringAttr(a).value for a in ir.ArrayAttr(user.attributes[TAG])]
            if TAG in user.attributes
            else []
          )
          user.attributes[TAG] = ir.ArrayAttr.get([ir.StringAttr.get(k) for k in old + [key]])
  return expected


def _signatures(module: ir.Module) -> dict[str, str]:
  out = {}
  for op in module.body.operations:
    op = op.operation
    if op.name == "func.func":
      out[ir.StringAttr(op.attributes["sym_name"]).value] = str(op.attributes["function_type"])
  return out


@functools.lru_cache(maxsize=None)
def run_pipeline(name: str) -> Outcome:
  out = Outcome(name)
  try:
    parsed = parse.parse_bytes(out.data, name)
    _set_devices(parsed.module, out.entry)
    out.expected_types = _tag_users(parsed.module)
    out.signatures = _signatures(parsed.module)
    out.input = parsed.module
    out.result = rewrite.rewrite_module(parsed.module, POLICY)
    out.output_text = str(out.result.module)
  except Exception as e:  # judged by the tests below
    out.error = e
  return out


# --- expected sites ------------------------------------------------------------


def expected_sites(outcome: Outcome) -> list[tuple[str, str]]:
  """(form, key) of each all-reduce in the input text: key is the HLO instruction
  name, or the MLIR line."""
  if outcome.entry["kind"] == "hlo":
    return [(form, name) for form, name in cut.hlo_sites(outcome.text)]
  return [(form, str(line)) for form, line in cut.mlir_sites(outcome.text)]


_QUOTED = re.compile(r'"([^"]+)"')
_MLIR_LINE = re.compile(r'^-:(\d+)\b|loc\("-":(\d+):\d+\)')


def record_key(outcome: Outcome, record: rewrite.SiteRecord) -> str | None:
  """The key of expected_sites a record stands for, read off its location."""
  if outcome.entry["kind"] == "hlo":
    m = _QUOTED.search(record.location)
    if m:
      return m.group(1)
    return record.location.split()[-1] if record.location else None
  m = _MLIR_LINE.search(record.location)
  return (m.group(1) or m.group(2)) if m else None


def _summary(records) -> str:
  return "; ".join(f"#{r.index} {r.location} {r.decision} ({r.reason})" for r in records)


# --- the tests -----------------------------------------------------------------


def _check_error(outcome: Outcome) -> None:
  e = outcome.error
  if e is None:
    return
  where = f"{outcome.name} ({outcome.entry['path']}:{outcome.entry['line']})"
  if not isinstance(e, EquarxError):
    raise AssertionError(f"{where}: unexpected {type(e).__name__}: {e}") from e
  message = str(e)
  assert "\n" not in message.strip(), (
    f"{where}: {type(e).__name__} message is {len(message.splitlines())} lines, "
    f"not one: {message[:300]!r}"
  )
  assert not isinstance(e, VerifyError), f"{where}: the rewrite made an invalid module: {message}"
  if isinstance(e, ParseError):
    assert "the file is corrupted" not in message, (
      f"{where}: an upstream test module called corrupted: {message}"
    )


@pytest.mark.parametrize("name", NAMES)
def test_pipeline(name):
  outcome = run_pipeline(name)
  _check_error(outcome)
  if outcome.error is not None:
    return  # rejected with one line, as a bad input should be
  result = outcome.result
  where = f"{name} ({outcome.entry['path']}:{outcome.entry['line']})"

  # The output verifies, and its text parses again (what the CLI writes).
  assert result.module.operation.verify(), f"{where}: output does not verify"
  reparsed = ir.Module.parse(outcome.output_text, context=_jax_private.make_ir_context())
  assert reparsed.operation.verify()

  # Every all-reduce of the input: one record each.
  sites = expected_sites(outcome)
  records = result.records
  assert [r.index for r in records] == list(range(len(records))), f"{where}: record indices"
  for r in records:
    assert r.decision in ("rewritten", "skipped"), r
    assert r.decision == "rewritten" or r.reason, f"{where}: skipped without a reason: {r}"
  forms = collections.Counter(form for form, _ in sites)
  assert len(records) == len(sites), (
    f"{where}: {len(sites)} all-reduces in the input ({dict(forms)}), "
    f"{len(records)} site records: {_summary(records)[:400]}"
  )
  # Where the records' locations name the input's all-reduces (MLIR: the line, as
  # parsed; HLO: the instruction name, as converted), each must be named once.  Some
  # locations name something else (HLO metadata, a converted text's lines); then the
  # count above is the check.
  keys = [record_key(outcome, r) for r in records]
  want = collections.Counter(key for _, key in sites)
  if None not in keys and set(keys) <= set(want):
    got = collections.Counter(keys)
    assert got == want, (
      f"{where}: records at {dict(got)} vs all-reduces in the input at "
      f"{dict(want)}: {_summary(records)[:400]}"
    )

  # Rewritten sites keep their result types, seen from every user.
  seen = {}
  for op in traverse.walk(result.module.operation):
    if TAG in op.attributes:
      for key in (ir.StringAttr(a).value for a in ir.ArrayAttr(op.attributes[TAG])):
        _, _, operand = key.split(":")
        seen[key] = str(op.operands[int(operand)].type)
  for key, want in outcome.expected_types.items():
    if key in seen:
      index = int(key.split(":")[0])
      assert seen[key] == want, (
        f"{where}: all-reduce #{index} ({records[index].decision}, "
        f"{','.join(records[index].dtypes)}) had result type {want}; its user now gets "
        f"{seen[key]}"
      )
  after = _signatures(result.module)
  for fname, sig in outcome.signatures.items():
    assert after.get(fname) == sig, f"{where}: @{fname} was {sig}, now {after.get(fname)}"


def test_corpus_covers_every_form():
  """The corpus keeps every form of all-reduce, so a pass that loses one is seen."""
  forms = collections.Counter()
  for entry in MANIFEST.values():
    forms.update(entry["counts"])
  for form in ("hlo", "hlo_async", "stablehlo", "mhlo", "sdy"):
    assert forms[form] > 0, (form, dict(forms))
  assert len(MANIFEST) >= 100


# --- numeric: original vs rewritten on the CPU devices -------------------------

_NOT_RUNNABLE = re.compile(
  r"custom[-_]call|sdy\.|infeed|outfeed|\bsend\b|\brecv\b|send-done|recv-done|"
  r"rng|token|dynamic|\?x|stablehlo\.async|partition_id|partition-id|replica-id|"
  r"replica_id|after-all|domain|collective-permute|collective_permute|"
  r"all-to-all|all_to_all|sharding|fusion|tuple|while|conditional|case|call\(|"
  r"c64|c128|complex|f8|f4|s4|u4|i4|ui4|opt-barrier|optimization_barrier|bitcast|"
  r"copy-start|get-tuple"
)


def _statically_runnable(name: str) -> bool:
  entry = MANIFEST[name]
  if entry["negative"] or entry["parses"] != "ok" or not entry["counts"]:
    return False
  if set(entry["counts"]) - {"hlo", "hlo_async", "stablehlo"}:
    return False
  devices = entry["devices"]["replicas"] * entry["devices"]["partitions"]
  if not 2 <= devices <= 8:
    return False
  with open(os.path.join(CORPUS, name)) as f:
    code = f.read()
  if entry["kind"] == "mlir":
    code = cut.strip_mlir_comments(code)
  return not _NOT_RUNNABLE.search(code)


# Forms a rewrite gets wrong most easily: async (all-reduce-start, async-start of an
# all-reduce computation) and variadic all-reduces (several operands, one reduction).
_HARD_FORMS = re.compile(
  r"async|all-reduce-start|=\s*\([^)]*\)\s*all-reduce\(|"
  r'all_reduce"?\(%[\w#]+\s*,'
)


def _numeric_names() -> list[str]:
  """The modules test_numeric runs: by default 32, the hard forms first (up to half),
  the rest spread evenly over the corpus, the same ones every run."""
  eligible = [n for n in NAMES if _statically_runnable(n)]
  want = os.environ.get("EQUARX_FOREIGN_NUMERIC", "32")
  if want == "all":
    return eligible
  count = int(want)
  if count >= len(eligible):
    return eligible

  def hard(n):
    with open(os.path.join(CORPUS, n)) as f:
      return bool(_HARD_FORMS.search(f.read()))

  first = [n for n in eligible if hard(n)][: count // 2]
  rest = [n for n in eligible if n not in first]
  step = len(rest) / (count - len(first))
  return sorted(first + [rest[int(i * step)] for i in range(count - len(first))])


NUMERIC = _numeric_names()

_NP_TYPES = {
  "f32": np.float32,
  "f64": np.float64,
  "f16": np.float16,
  "bf16": ml_dtypes.bfloat16,
  "i1": np.bool_,
  "i8": np.int8,
  "i16": np.int16,
  "i32": np.int32,
  "i64": np.int64,
  "ui8": np.uint8,
  "ui16": np.uint16,
  "ui32": np.uint32,
  "ui64": np.uint64,
}


def _main_function(module: ir.Module):
  publics = []
  for op in module.body.operations:
    op = op.operation
    if op.name != "func.func":
      continue
    if (
      "sym_visibility" in op.attributes
      and ir.StringAttr(op.attributes["sym_visibility"]).value == "private"
    ):
      continue
    publics.append(op)
  named = [op for op in publics if ir.StringAttr(op.attributes["sym_name"]).value == "main"]
  return named[0] if named else (publics[0] if len(publics) == 1 else None)


def _runnable_text(module: ir.Module) -> tuple[str, list] | None:
  """Module text with its entry function named main and without the test's tags, and
  the argument types; None when it cannot run here."""
  module = rewrite.copy_module(module)
  main = _main_function(module)
  if main is None:
    return None
  with module.context:
    main.attributes["sym_name"] = ir.StringAttr.get("main")
    for op in traverse.walk(module.operation):
      if TAG in op.attributes:
        del op.attributes[TAG]
  types = []
  for t in ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value).inputs:
    if not isinstance(t, ir.RankedTensorType) or not t.has_static_shape:
      return None
    element = str(t.element_type)
    if element not in _NP_TYPES:
      return None
    types.append((tuple(t.shape), element))
  return str(module), types


def _random(rng, shape, element):
  dtype = np.dtype(_NP_TYPES[element])
  if element == "i1":
    return rng.integers(0, 2, shape).astype(np.bool_)
  if np.issubdtype(dtype, np.integer):
    return rng.integers(0 if element.startswith("ui") else -4, 5, shape).astype(dtype)
  return rng.standard_normal(shape).astype(dtype)


def _run(text: str, types, replicas: int, partitions: int, inputs):
  devices = jax.devices()[: replicas * partitions]
  options = jax_backend.get_compile_options(
    num_replicas=replicas,
    num_partitions=partitions,
    device_assignment=np.array([d.id for d in devices]).reshape(replicas, partitions),
  )
  client = devices[0].client
  exe = client.compile_and_load(text, _jax_private.device_list(devices), options)
  order = exe.local_devices()
  mesh = jax.sharding.Mesh(np.array(order), ("d",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  args = []
  for (shape, _), per_device in zip(types, inputs):
    args.append(
      jax.make_array_from_single_device_arrays(
        shape, replicated, [jax.device_put(per_device[i], d) for i, d in enumerate(order)]
      )
    )
  results = exe.execute_sharded(args).disassemble_into_single_device_arrays()
  return [[np.asarray(x) for x in per_output] for per_output in results]


@pytest.mark.parametrize("name", NUMERIC)
def test_numeric(name):
  outcome = run_pipeline(name)
  if outcome.error is not None or not any(r.rewritten for r in outcome.result.records):
    pytest.skip("nothing rewritten (test_pipeline judges why)")
  entry = outcome.entry
  replicas, partitions = entry["devices"]["replicas"], entry["devices"]["partitions"]
  original = _runnable_text(outcome.input)
  rewritten = _runnable_text(outcome.result.module)
  if original is None or rewritten is None:
    pytest.skip("entry function has dynamic or unsupported argument types")
  text, types = original
  assert rewritten[1] == types
  rng = np.random.default_rng(0)
  n = replicas * partitions
  inputs = [[_random(rng, shape, element) for _ in range(n)] for shape, element in types]
  try:
    want = _run(text, types, replicas, partitions, inputs)
  except Exception as e:
    pytest.skip(f"XLA:CPU does not run the original: {str(e).splitlines()[0][:200]}")
  try:
    got = _run(rewritten[0], types, replicas, partitions, inputs)
  except Exception as e:
    raise AssertionError(
      f"{name}: XLA:CPU runs the original but not the rewritten module: "
      f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
    ) from None
  assert len(got) == len(want)
  # A variadic all-reduce is quantized as one vector (BUILD_NOTES, "Selection"): its
  # operands share the block at each boundary, so errors are relative to the largest
  # value of any float output on the device, not of each output alone.
  scales = [
    max(
      (
        np.max(np.abs(w.astype(np.float64)[np.isfinite(w.astype(np.float64))]), initial=0.0)
        for w_out in want
        for w in [w_out[device]]
        if np.issubdtype(w.dtype, np.floating) or w.dtype == ml_dtypes.bfloat16
      ),
      default=0.0,
    )
    or 1.0
    for device in range(n)
  ]
  for k, (g_out, w_out) in enumerate(zip(got, want)):
    for device, (g, w) in enumerate(zip(g_out, w_out)):
      assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype, g.shape, w.shape)
      if np.issubdtype(w.dtype, np.floating) or w.dtype == ml_dtypes.bfloat16:
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        finite = np.isfinite(w64)
        assert np.array_equal(np.isfinite(g64), finite), f"output {k} device {device}: non-finite"
        scale = scales[device]
        err = np.max(np.abs(g64[finite] - w64[finite]), initial=0.0)
        assert err <= 3e-2 * scale, (
          f"{name}: output {k} on device {device}: error {err:.3g} > 3e-2 x {scale:.3g}"
        )
      else:
        np.testing.assert_array_equal(g, w, err_msg=f"{name}: output {k} on device {device}")
