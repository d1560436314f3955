"""The partitioned route compiled for multislice TPU topologies (libtpu, compile-only).

Auto-sharded programs, as TPU trainers write them (jax.jit, NamedSharding,
with_sharding_constraint; no shard_map): an FSDP + data-parallel SGD step in f32 and
bf16 and a weight gradient, on two v5e:2x2 slices.  The bytes across slices are counted
from the compiled programs' cross-slice transfers (tests/partitioned_tpu_child.py)."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.libtpu  # skipped without libtpu (pip install 'equarx-pass[tpu]')


@pytest.fixture(scope="module")
def measured():
  child = os.path.join(os.path.dirname(os.path.abspath(__file__)), "partitioned_tpu_child.py")
  proc = subprocess.run(
    [sys.executable, child], capture_output=True, text=True, timeout=600, env=dict(os.environ)
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("program, most", [("fsdp_f32", 0.30), ("fsdp_bf16", 0.55)])
def test_fsdp_step_sends_less_across_slices(measured, program, most):
  got = measured[program]
  assert got["route"] == "partitioned" and not got["note"]
  assert got["counted"] <= most * got["native"]
  # The report's bytes are what the compiled programs send (the scalar loss's all-reduce
  # is a few bytes either way).
  assert got["before"] == pytest.approx(got["native"], abs=1024)
  assert got["after"] == pytest.approx(got["counted"], abs=1024)


@pytest.mark.parametrize("program", ["fsdp_f32", "fsdp_bf16"])
def test_reduce_scatters_inside_a_slice_stay_native(measured, program):
  """The gradient all-reduces inside a slice, each followed by the slice of the device's
  own piece, are reduce-scatters in the compiled program and priced as such: a quantized
  all-reduce does not pay over ICI."""
  inside = [s for s in measured[program]["sites"] if s["slow"] == 0]
  assert len(inside) == 2
  assert all(s["decision"] == "skipped" for s in inside), [s["reason"] for s in inside]


def test_with_sharding_constraint_copies(measured):
  """TPU's partitioner leaves copies where with_sharding_constraint pins a value; the
  rebuilt program must hold none (StableHLO has no copy)."""
  got = measured["weight_gradient"]
  assert got["route"] == "partitioned" and not got["note"]
  assert got["counted"] <= 0.55 * got["native"]
  assert got["after"] == pytest.approx(got["counted"], abs=1024)


@pytest.mark.parametrize("program", ["fsdp_f32", "fsdp_bf16", "weight_gradient"])
def test_cheap_read_gives_the_same_partitioned_program(measured, program):
  """The read compile runs at the lowest optimization effort: the partitioned program
  it exposes is the default compile's, instruction for instruction (names aside)."""
  assert measured[program]["same_text"] and measured[program]["same_collectives"]


def test_cheap_read_of_a_scanned_program_sends_the_same(measured):
  """At the default effort libtpu's partitioner pipeline peels one iteration out of a
  scanned backward loop, at the lowest it does not: the programs differ, but run the
  same collectives, with the same groups, the same number of times per step."""
  got = measured["scanned"]
  assert got["same_collectives"]


def test_scanned_sites_count_once_per_iteration(measured):
  """Sites inside a scan's loop send their bytes once per iteration: the report's totals
  are per run of the program, and equal what the compiled programs send."""
  got = measured["scanned"]
  assert got["runs"] == [6, 6]
  assert got["before"] == pytest.approx(got["native"], abs=1024)
  assert got["after"] == pytest.approx(got["counted"], abs=1024)
  assert got["counted"] <= 0.30 * got["native"]
