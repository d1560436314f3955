"""A TPU stores arrays in (8, 128) tiles, and the native all-reduce sends the stored
buffer: the report's native bytes count the padding where the compiled program sends it
(platforms.TileRule), checked against the compiled program's cross-slice transfers
(libtpu, compile-only, two v5e:2x2 slices).  Without libtpu only the rule's own figures
are checked."""

import json
import math
import os
import subprocess
import sys

import pytest

from equarx_pass.platforms import TileRule, rules_for

TPU = TileRule()


@pytest.mark.parametrize(
  "shape, itemsize, default_layout, stored",
  [
    ((4096, 64), 4, False, 4096 * 64),  # N on the lanes: unpadded
    ((4096, 64), 4, True, 4096 * 128),  # in a branch: 64 lanes of 128
    ((4096, 128), 4, True, 4096 * 128),
    ((3, 100), 4, False, 4 * 128),  # three rows take a (4, 128) tile
    ((5, 7, 64), 2, False, 5 * 8 * 128),
    ((1, 262144), 4, False, 262144),  # one row of f32: (1, 128) tiles
    ((1, 262144), 2, False, 2 * 262144),  # bf16 packs two rows in a word
    ((1000,), 4, False, 1024),  # a vector: rows of 128 lanes
  ],
)
def test_tpu_tiles(shape, itemsize, default_layout, stored):
  assert TPU.stored_size(shape, itemsize, default_layout) == stored
  assert rules_for("tpu").stored_size(shape, itemsize, default_layout) == stored
  assert rules_for("cpu").stored_size(shape, itemsize, default_layout) == math.prod(shape)


@pytest.mark.libtpu
def test_report_native_bytes_are_the_compiled_programs():
  child = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tile_bytes_child.py")
  env = dict(os.environ, JAX_PLATFORMS="")
  proc = subprocess.run(
    [sys.executable, child], capture_output=True, text=True, timeout=600, env=env
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  for key, row in got.items():
    assert row["in_branch"] == key.endswith("branch") and row["rewritten"], (key, row)
    assert row["report_native"] == pytest.approx(row["native"], rel=0.05), (key, row)
    assert row["report_int8"] == pytest.approx(row["int8"], rel=0.05), (key, row)
  # f32 [4096, 64] in a branch, or read by one, keeps 64 of 128 lanes: twice its bytes;
  # plainly, none more.
  assert got["64:branch"]["native"] == 2 * got["64:plain"]["native"] == 2 * 4096 * 64 * 4
  assert got["64:feeds"]["native"] == got["64:branch"]["native"]
  assert got["128:branch"]["native"] == got["128:plain"]["native"] == 4096 * 128 * 4
