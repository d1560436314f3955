"""tools/schedule_estimate.py --pieces-probe: the stand-in of the kernel form's two-shot with
N - 1 ppermutes a phase, run in Pallas's interpreter on CPU devices.

The probe's TPU figures are only as good as the program is the all-reduce it stands for:
here packed and apart its scales give the same bits, and every rank ends with the psum
within int8 two-shot's error, its pieces in the right places.
"""

import os
import sys

import jax
import numpy as np
import pytest

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
pytestmark = pytest.mark.skipif(
  not os.path.isdir(TOOLS), reason="tools/ is not in the sdist: run from a checkout"
)


@pytest.fixture(scope="module")
def probe():
  sys.path.insert(0, TOOLS)
  try:
    import schedule_estimate
  finally:
    sys.path.remove(TOOLS)
  return schedule_estimate


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_stand_in_is_a_psum(probe, dtype):
  n, piece_tiles = 4, 64
  values = n * piece_tiles * 8 * 128
  rng = np.random.default_rng(0)
  x = rng.standard_normal(n * values).astype(dtype)
  x[values + 7] = np.inf  # rank 1's first chunk: block 0 of every rank's result
  outs = [
    np.asarray(probe.pieces_stand_in(jax, n, values, dtype, s, interpret=True)(x))
    for s in ("packed", "apart")
  ]
  out, apart = (o.astype(np.float32).reshape(n, values) for o in outs)
  np.testing.assert_array_equal(out, apart)  # the same codes, scales and sums
  for r in range(1, n):
    np.testing.assert_array_equal(out[r], out[0])
  want = x.astype(np.float32).reshape(n, values).sum(0)
  nan = np.isnan(out[0])
  assert nan[:128].all() and not nan[128:].any()
  err = np.max(np.abs(out[0][128:] - want[128:])) / np.max(np.abs(want[128:]))
  assert err < 0.02, err
