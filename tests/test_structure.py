"""Structure of the rewritten modules, on the fixtures in hlo_fixtures/.

Each tests/filecheck/NAME.check starts with `// RUN: FIXTURE FLAGS`: the fixture is
rewritten with transform_text under those flags and the check file runs over the
output text with `filecheck` (the Python port of LLVM's FileCheck, a test dependency).  The tests below them cover what reads better in Python: the site
records, modules that must come back unchanged, channel handles and ring pairs
across every fixture.
"""

import collections
import dataclasses
import glob
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo

import equarx_pass
from equarx_pass import report
from equarx_pass.ir import outline, traverse
from equarx_pass.planning import match

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(os.path.dirname(HERE), "hlo_fixtures")
CHECK_FILES = sorted(
  os.path.basename(p) for p in glob.glob(os.path.join(HERE, "filecheck", "*.check"))
)
FIXTURE_FILES = sorted(n for n in os.listdir(FIXTURES) if n.endswith((".mlir", ".txt")))
# Rewrite everything the pass can rewrite, whatever its size.
# Most structure tests here are about the flat ring; the default (tiled two-shot) has its
# own below, and tests/test_tiled_form.py the tiled forms.
# The loop form of the flat ring (what TPU and GPU programs get; on CPU its steps are
# written out, test_cpu_sites_keep_their_collectives_in_the_caller).
RING = "--equarx_enable --equarx_algorithm=ring --equarx_rotation=none --equarx_form=flat --equarx_platform=tpu --equarx_force"
EVERYTHING = RING + " --equarx_min_bytes=0"
# The same flat ring for XLA:CPU, where no loop may hold a collective.
RING_CPU = "--equarx_algorithm=ring --equarx_rotation=none --equarx_form=flat --equarx_platform=cpu --equarx_force"


def read_fixture(name: str) -> str:
  with open(os.path.join(FIXTURES, name)) as f:
    return f.read()


# The fixtures with an all-reduce (scatter_gather_f32.mlir has none: --equarx_ops).
ALL_REDUCE_FIXTURES = [
  n for n in FIXTURE_FILES if "all_reduce" in read_fixture(n) or "all-reduce" in read_fixture(n)
]


def transform(name: str, flags: str):
  return equarx_pass.transform_text(read_fixture(name), equarx_pass.Policy.from_flags(flags), name)


def read_check(check_name: str) -> tuple[str, str, str]:
  """(fixture, flags, check text) of tests/filecheck/CHECK_NAME."""
  with open(os.path.join(HERE, "filecheck", check_name)) as f:
    text = f.read()
  prefix = "// RUN:"
  assert text.startswith(prefix), f"{check_name}: the first line must be '{prefix} FIXTURE FLAGS'"
  fixture, _, flags = text.splitlines()[0][len(prefix) :].strip().partition(" ")
  return fixture, flags, text


def filecheck(check_name: str, text: str) -> subprocess.CompletedProcess:
  """`filecheck tests/filecheck/CHECK_NAME` over `text`."""
  return subprocess.run(
    [sys.executable, "-m", "filecheck", os.path.join(HERE, "filecheck", check_name)],
    input=text,
    capture_output=True,
    text=True,
    timeout=120,
  )


@pytest.mark.parametrize("check_name", CHECK_FILES)
def test_filecheck(check_name):
  fixture, flags, _ = read_check(check_name)
  run = filecheck(check_name, transform(fixture, flags).text)
  assert run.returncode == 0, f"tests/filecheck/{check_name}:\n{run.stdout}{run.stderr}"


@pytest.mark.parametrize("check_name", CHECK_FILES)
def test_check_file_tells_rewritten_from_untouched(check_name):
  # The checks of a rewriting RUN must fail on the module as it was, and those of a
  # RUN that selects nothing must hold for it: no check file passes whatever the pass does.
  fixture, flags, _ = read_check(check_name)
  rewrites = any(r.rewritten for r in transform(fixture, flags).records)
  untouched = str(equarx_pass.parse_bytes(read_fixture(fixture)).module)
  run = filecheck(check_name, untouched)
  assert (run.returncode != 0) == rewrites, run.stdout + run.stderr


def test_every_fixture_has_a_check_file():
  covered = {read_check(name)[0] for name in CHECK_FILES}
  assert covered == set(FIXTURE_FILES)


def test_every_scheme_option_has_a_check_file():
  # Each algorithm, wire format, rotation and block layout, and microshards, is selected
  # by some check file's RUN line, so the structure it emits is pinned down.
  from equarx_pass.emission import rotation
  from equarx_pass.emission import scheme as scheme_lib
  from equarx_pass.emission.algorithms import ALGORITHMS
  from equarx_pass.emission.formats import FORMATS

  schemes = [equarx_pass.Policy.from_flags(read_check(name)[1]).scheme for name in CHECK_FILES]
  assert {s.algorithm for s in schemes} >= set(ALGORITHMS)
  assert {s.format for s in schemes} >= set(FORMATS)
  assert {s.rotation for s in schemes} >= set(rotation.ROTATIONS)
  assert {s.block_layout for s in schemes} >= set(scheme_lib.BLOCK_LAYOUTS)
  assert any(s.microshards > 1 for s in schemes)


# --- the site records ------------------------------------------------------------

SKIPPED = [
  ("pmax_f32.mlir", EVERYTHING, "reduction is not add (only sums are quantized)"),
  ("psum_i32.mlir", EVERYTHING, "element type i32 not in --equarx_dtypes=bf16,f16,f32"),
  ("small_psum_f32.mlir", "--equarx_enable", "256 bytes < --equarx_min_bytes=131072"),
  (
    "tp_mlp_bf16.mlir",
    "--equarx_enable --equarx_dtypes=f32",
    "element type bf16 not in --equarx_dtypes=f32",
  ),
  (
    "tp_mlp_f32.mlir",
    "--equarx_enable --equarx_max_bytes=131071",
    "131072 bytes > --equarx_max_bytes=131071",
  ),
]


@pytest.mark.parametrize("fixture,flags,reason", SKIPPED)
def test_skipped_site_is_recorded_and_the_module_is_unchanged(fixture, flags, reason):
  result = transform(fixture, flags)
  [record] = result.records
  assert (record.decision, record.reason) == ("skipped", reason)
  assert not record.rewritten
  assert record.bytes_after == record.bytes_before
  # Nothing selected: the output is the input as the parser reads it, op for op.
  assert result.text == str(equarx_pass.parse_bytes(read_fixture(fixture)).module)


def test_disabled_policy_rewrites_nothing():
  # Policy: "Nothing is rewritten unless `enable`"; the CLI documents that
  # --noequarx_enable only converts and reports.
  data = read_fixture("tp_mlp_f32.mlir")
  result = equarx_pass.transform_text(data, equarx_pass.Policy.from_flags("--noequarx_enable"))
  assert "stablehlo.all_reduce" in result.text
  assert result.text == str(equarx_pass.parse_bytes(data).module)


REWRITTEN = [
  # fixture, [(shape, dtype, group size, groups)] per site, in module order
  ("tp_mlp_f32.mlir", [((64, 512), "f32", 8, 1)]),
  ("tp_mlp_bf16.mlir", [((64, 512), "bf16", 8, 1)]),
  ("tp_mlp_f16.mlir", [((64, 512), "f16", 8, 1)]),
  ("tp_mlp_4dev_f32.mlir", [((64, 512), "f32", 4, 1)]),
  ("tp_attention_f32.mlir", [((64, 512), "f32", 8, 1)]),
  ("scan_layers_f32.mlir", [((64, 512), "f32", 8, 1)]),
  ("while_layers_f32.mlir", [((64, 512), "f32", 8, 1)]),
  ("pmap_psum_f32.mlir", [((64, 512), "f32", 8, 1)]),
  ("subgroups_2x4_f32.mlir", [((64, 512), "f32", 4, 2), ((64, 512), "f32", 2, 4)]),
  ("cond_psum_f32.mlir", [((64, 512), "f32", 8, 1), ((64, 512), "f32", 8, 1)]),
  ("tp_mlp_f32.before_optimizations.txt", [((64, 512), "f32", 8, 1)]),
]


@pytest.mark.parametrize("fixture,sites", REWRITTEN)
def test_rewritten_sites_are_recorded(fixture, sites):
  result = transform(fixture, RING + " --equarx_min_bytes=65536")  # 64 KiB bf16 sites
  got = [(r.shapes, r.dtypes, r.group_size, r.num_groups) for r in result.records]
  assert got == [((shape,), (dtype,), n, groups) for shape, dtype, n, groups in sites]
  for r in result.records:
    assert r.decision == "rewritten"
    # Forced: where a file's default topology (one host per device) would leave a small
    # site native, the record says so between the scheme and the form.
    forced = r"(; forced \(--equarx_force\): [^;]+)?"
    assert re.fullmatch(
      rf"int8 ring, block 1024{forced}; flat form \(--equarx_form=flat\)", r.reason
    ), r.reason
    assert "make_fixtures.py:" in r.location  # the psum's source line, from debug info
    # int8 plus one f32 scale per 1024 values against the original dtype's ring.
    bits = 8 + 32 / 1024
    ratio = 8 * {"f32": 4, "bf16": 2, "f16": 2}[r.dtypes[0]] / bits
    assert r.bytes_before / r.bytes_after == pytest.approx(ratio, rel=1e-3)
  assert result.input_kind == ("hlo-text" if fixture.endswith(".txt") else "stablehlo-text")


# --- collectives across every fixture --------------------------------------------


@dataclasses.dataclass
class Collective:
  name: str  # "stablehlo.all_reduce" or "stablehlo.collective_permute"
  handle: int | None  # channel handle
  devices: np.ndarray  # replica groups (rows) or source-target pairs


def collectives(text: str, name: str) -> list[Collective]:
  """The all_reduces or collective_permutes of a module text, in walk order, as plain data
  (IR objects must not outlive their module)."""
  module = equarx_pass.parse_bytes(text).module
  out = []
  for op in traverse.walk(module.operation):
    if op.name != name:
      continue
    attrs = op.attributes
    handle = (
      stablehlo.ChannelHandle(attrs["channel_handle"]).handle if "channel_handle" in attrs else None
    )
    key = "source_target_pairs" if name == "stablehlo.collective_permute" else "replica_groups"
    dense = ir.DenseIntElementsAttr(attrs[key])
    shape = ir.ShapedType(dense.type).shape
    out.append(Collective(name, handle, np.array([int(v) for v in dense], np.int64).reshape(shape)))
  return out


def all_reduces(text):
  return collectives(text, "stablehlo.all_reduce")


def permutes(text):
  return collectives(text, "stablehlo.collective_permute")


@pytest.mark.parametrize("fixture", ALL_REDUCE_FIXTURES)
def test_permutes_have_fresh_handles_and_stay_in_groups(fixture):
  source = read_fixture(fixture)
  result = transform(fixture, EVERYTHING)
  before, after, rings = all_reduces(source), all_reduces(result.text), permutes(result.text)
  rewritten = [r for r in result.records if r.rewritten]
  # Two permutes per rewritten site (reduce-scatter, all-gather); the rest stay all_reduces.
  assert len(rings) == 2 * len(rewritten)
  assert len(after) == len(result.records) - len(rewritten)
  # Fresh channel handles: distinct, and above every handle of the input.
  old = max(op.handle for op in before)
  new = [op.handle for op in rings]
  assert len(set(new)) == len(new)
  assert all(h > old for h in new)
  # Every permute is a ring within the groups of one of the input's all-reduces: each
  # device sends once and receives once, and only inside its own group.
  group_sets = [[set(row) for row in op.devices.tolist()] for op in before]
  for op in rings:
    pairs = op.devices
    assert sorted(pairs[:, 0]) == sorted(set(pairs[:, 0])) == sorted(set(pairs[:, 1]))
    assert any(
      all(any({s, t} <= g for g in groups) for s, t in pairs.tolist())
      and set().union(*groups) == set(pairs[:, 0].tolist())
      for groups in group_sets
    ), pairs


@pytest.mark.parametrize("fixture", ALL_REDUCE_FIXTURES)
def test_default_two_shot_collectives_use_the_sites_groups(fixture):
  """The default scheme (tiled, CPU): per rewritten site one all_to_all and one
  all_gather (codes and scale bytes in one payload: every fixture's sites are below
  --equarx_unroll_min_bytes), with fresh channel handles and exactly the replica groups
  of the all-reduce they replace."""
  source = read_fixture(fixture)
  result = transform(fixture, "--equarx_enable --equarx_min_bytes=0")
  before = all_reduces(source)
  rewritten = [i for i, r in enumerate(result.records) if r.rewritten]
  a2a = collectives(result.text, "stablehlo.all_to_all")
  gathers = collectives(result.text, "stablehlo.all_gather")
  assert len(a2a) == len(gathers) == len(rewritten)
  assert not permutes(result.text)
  old = max(op.handle for op in before)
  handles = [op.handle for op in a2a + gathers]
  assert len(set(handles)) == len(handles) and all(h > old for h in handles)
  for k, i in enumerate(rewritten):
    for op in (a2a[k], gathers[k]):
      np.testing.assert_array_equal(op.devices, before[i].devices)


def test_subgroup_rings_never_cross_groups():
  rings = permutes(transform("subgroups_2x4_f32.mlir", RING).text)
  assert len(rings) == 4
  for op in rings[:2]:  # tp: within {0..3} and within {4..7}
    assert all((s < 4) == (t < 4) and s != t for s, t in op.devices.tolist())
  for op in rings[2:]:  # dp: between d and d + 4 only
    assert all(abs(s - t) == 4 for s, t in op.devices.tolist())


@pytest.mark.parametrize(
  "fixture", ["tp_mlp_f32.mlir", "subgroups_2x4_f32.mlir", "tp_mlp_f32.before_optimizations.txt"]
)
def test_output_reparses_and_is_deterministic(fixture):
  first = transform(fixture, "--equarx_enable").text
  assert transform(fixture, "--equarx_enable").text == first
  # The printed module is valid StableHLO text on its own (what equarx-opt writes).
  assert str(equarx_pass.parse_bytes(first).module) == first


def test_hlo_text_fixture_keeps_the_partition_count():
  result = transform("tp_mlp_f32.before_optimizations.txt", "--equarx_enable")
  facts = match.module_facts(equarx_pass.parse_bytes(result.text).module)
  assert (facts.num_partitions, facts.num_replicas) == (8, 1)


def test_padding_that_costs_bytes_is_left_native_unless_forced():
  """Grid layout + rotation pads each 4096-value chunk to 131072 values: the rewrite would
  send more than the native all-reduce, so the site stays native with the reason; forced,
  it is rewritten and the report says what it costs, once, with no model speed-up beside
  it (the latency of fewer steps would read as a win for a rewrite that sends more)."""
  grid = "--equarx_enable --equarx_block_layout=grid"
  (record,) = transform("tp_mlp_f32.mlir", grid).records
  assert record.decision == "skipped" and record.speedup is None
  assert record.reason.startswith("sends 8.25x the native bytes across domains (padding to")
  (forced,) = transform("tp_mlp_f32.mlir", grid + " --equarx_force").records
  assert forced.rewritten and forced.bytes_after > forced.bytes_before
  assert "; forced (--equarx_force): sends 8.25x the native bytes across domains" in forced.reason
  assert forced.reason.count("the native bytes") == 1 and forced.speedup is None
  forced_run = transform("tp_mlp_f32.mlir", grid + " --equarx_force")
  lines = report.format_table(forced_run.records, topology=forced_run.topology).splitlines()
  header, row = lines[1], lines[3]
  assert row[header.index(report.MODEL_COLUMN) :].startswith("- ")
  plain = transform("tp_mlp_f32.mlir", "--equarx_enable").records[0]
  assert "sends" not in plain.reason and plain.bytes_after < plain.bytes_before


def _op_counts(text: str):
  module = equarx_pass.parse_bytes(text).module
  return collections.Counter(op.name for op in traverse.walk(module.operation))


@pytest.mark.parametrize(
  "fixture", ["tp_mlp_f32.mlir", "cond_psum_f32.mlir", "while_layers_f32.mlir"]
)
@pytest.mark.parametrize("scheme", ["", RING_CPU])
def test_outlined_sites_hold_the_same_ops_as_inline_ones(fixture, scheme):
  """--equarx_outline=on moves the compute between each site's collectives into functions
  and adds only the functions, their returns and the calls: the same program, its
  compute one nesting level down, its collectives where they were."""
  inline = transform(fixture, f"--equarx_enable --equarx_outline=off {scheme}")
  outlined = transform(fixture, f"--equarx_enable --equarx_outline=on {scheme}")
  sites = sum(r.rewritten for r in outlined.records)
  assert sites >= 1 and inline.records == outlined.records
  extra = _op_counts(outlined.text)
  extra.subtract(_op_counts(inline.text))
  calls = extra["func.call"]
  assert calls >= sites
  assert +extra == {"func.func": calls, "func.call": calls, "func.return": calls}
  assert -extra == {}
  assert_collectives_in_place(outlined.text)
  # The CLI does not know the backend, so auto leaves the sites inline there.
  assert transform(fixture, f"--equarx_enable {scheme}").text == inline.text


def assert_collectives_in_place(text: str) -> None:
  """No function the pass made holds a collective, and no loop holds one unless the
  program had it there (the fixtures' own loops hold their all-reduces)."""
  module = equarx_pass.parse_bytes(text).module
  for function in traverse.called_functions(module):
    name = function.attributes["sym_name"].value
    inside = [op.name for op in traverse.walk(function) if op.name in outline.COLLECTIVES]
    assert not (name.startswith("equarx_") and inside), (name, inside)


@pytest.mark.parametrize(
  "fixture", ["tp_mlp_f32.mlir", "cond_psum_f32.mlir", "tp_mlp_4dev_f32.mlir"]
)
def test_cpu_sites_keep_their_collectives_in_the_caller(fixture):
  """On CPU the flat ring's loops are written out: every permute sits where the all-reduce
  was (2(N-1) per site), none inside a loop (outline.py says why)."""
  result = transform(fixture, f"--equarx_enable {RING_CPU}")
  module = equarx_pass.parse_bytes(result.text).module
  loops = [op for op in traverse.walk(module.operation) if op.name == "stablehlo.while"]
  assert not any(outline.holds_collective(loop) for loop in loops)
  sites = [r for r in result.records if r.rewritten]
  assert sites and len(permutes(result.text)) == sum(2 * (r.group_size - 1) for r in sites)
  assert_collectives_in_place(result.text)


def test_outlined_function_names_do_not_clash():
  text = read_fixture("tp_mlp_f32.mlir")
  main = text.index("  func.func public @main")
  text = (
    text[:main] + "  func.func private @equarx_allreduce_0() {\n    return\n  }\n" + text[main:]
  )
  result = equarx_pass.transform_text(
    text, equarx_pass.Policy.from_flags("--equarx_enable --equarx_outline=on")
  )
  assert "func.call @equarx_allreduce_0_2(" in result.text
  assert "func.func private @equarx_allreduce_0()" in result.text
