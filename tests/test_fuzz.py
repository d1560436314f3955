"""tests/fuzz.py: a short run in the suite, and the harness's own checks.

The harness is run as users run it (python tests/fuzz.py --cases N >= 1000 for the
real thing); here 40 cases keep the suite fast.  The harness tests show that a
crash and an invalid module would be counted, so the zero counts mean something.
"""

import collections
import json
import os
import random
import subprocess
import sys

import fuzz
import pytest

from equarx_pass.frontends import transform
from equarx_pass.ir import parse
from equarx_pass.planning.policy import Policy

TOOL = fuzz.__file__
ENV = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")


@pytest.fixture(scope="module")
def bases():
  return fuzz.base_inputs()


def test_fuzz_run_has_no_crash_and_no_invalid_module(tmp_path):
  proc = subprocess.run(
    [sys.executable, TOOL, "--cases", "40", "--seed", "2024", "--json", "--save", str(tmp_path)],
    capture_output=True,
    text=True,
    env=ENV,
    timeout=600,
  )
  counts = json.loads(proc.stdout.splitlines()[-1])
  assert proc.returncode == 0, counts
  assert counts["crashes"] == 0 and counts["invalid_modules"] == 0, counts["failures"]
  assert counts["base_inputs_ok"] == counts["base_inputs"] > 0, counts["base_failures"]
  assert (
    counts["cases"]
    == 40
    == (counts["clean_errors"] + counts["internal_errors"] + counts["rewrites"])
  )
  # Both paths were exercised: inputs refused, and mutants rewritten.
  assert counts["clean_errors"] > 0 and counts["rewrites_with_sites_rewritten"] > 0


def test_harness_counts_a_crash_and_goes_on(bases):
  good = dict(bases)["tp_mlp_f32.mlir"]
  flags = "--equarx_enable --equarx_min_bytes=0"
  cases = [
    fuzz.Case("good", good, flags),
    fuzz.Case("abort", fuzz.ABORT_MARKER, flags),
    fuzz.Case("good again", good, flags),
  ]
  results = fuzz.run_cases(cases, jobs=1, timeout=120)
  assert [r.outcome for r in results] == ["rewritten", "crash", "rewritten"]
  assert results[1].detail == "worker killed by SIGABRT" and results[1].reproduced is True
  assert fuzz.summarize(results)["crashes"] == 1


def test_check_rewrite_catches_invalid_outputs(bases):
  data = dict(bases)["subgroups_2x4_f32.mlir"]
  policy = Policy.from_flags("--equarx_enable --equarx_min_bytes=0")
  result = transform.transform_text(data, policy, "in.mlir")
  assert fuzz.check_rewrite(data, "in.mlir", result, policy) is None
  broken = {
    "does not parse": result.text[: len(result.text) // 2],
    "left in the output": data.decode(),  # nothing rewritten after all
  }
  for words, text in broken.items():
    doctored = transform.TransformResult(text, result.records, result.input_kind, 0.0)
    assert words in fuzz.check_rewrite(data, "in.mlir", doctored, policy)
  doctored = transform.TransformResult(result.text, result.records[1:], result.input_kind, 0.0)
  assert "1 records for 2 all-reduces" in fuzz.check_rewrite(data, "in.mlir", doctored, policy)


def test_cases_are_reproducible_and_mutated(bases):
  a = [fuzz.make_case(bases, 5, i) for i in range(200)]
  b = [fuzz.make_case(bases, 5, i) for i in range(200)]
  assert [(c.name, c.data, c.flags) for c in a] == [(c.name, c.data, c.flags) for c in b]
  originals = {data for _, data in bases}
  assert sum(c.data not in originals for c in a) >= 190
  kinds = collections.Counter(k.rstrip("0123456789") for c in a for k in c.name.split("+")[1:])
  assert set(kinds) >= {
    "delete",
    "delete_line",
    "swap",
    "swap_lines",
    "duplicate_line",
    "truncate",
    "random_bytes",
    "insert_bytes",
    "repeat",
    "number",
    "word",
    "number_everywhere",
    "word_everywhere",
  }, kinds
  for case in a:
    Policy.from_flags(case.flags)  # every drawn scheme is one the pass accepts


def test_every_scheme_option_is_drawn():
  from equarx_pass.planning import policy

  rng = random.Random(0)
  seen = collections.defaultdict(set)
  for _ in range(300):
    for token in fuzz.random_flags(rng).split():
      name, _, value = token.partition("=")
      seen[name].add(value)
  assert seen["--equarx_algorithm"] == set(policy.ALGORITHMS)
  assert seen["--equarx_format"] == set(policy.FORMATS)
  assert seen["--equarx_rotation"] == set(policy.ROTATIONS)
  assert seen["--equarx_block_layout"] == set(policy.BLOCK_LAYOUTS)
  assert seen["--equarx_rounding"] == set(policy.ROUNDINGS)


def test_unmutated_inputs_cover_every_input_kind(bases):
  kinds = collections.Counter(parse.parse_bytes(data, name).kind for name, data in bases)
  assert set(kinds) == {"stablehlo-text", "stablehlo-bytecode", "portable-artifact", "hlo-text"}
