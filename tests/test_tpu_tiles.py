"""The TPU form's blocks in the operand's own (8, 128) tiles (forms.tile_grid), and its
NaN guard in the block maximum's combiner (quantize_emit.block_max).

Run on the 8 CPU devices with --equarx_platform=tpu, the form a TPU gets.  Two-shot sums
every block alike whichever chunk holds it, so taking the blocks in tile order must give
the bits of the flattened form: the same values, the same blocks, the same sums.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from meshes import psum_program

import equarx_pass
from equarx_pass.emission import scheme as scheme_lib

TPU = "--equarx_enable --equarx_min_bytes=0 --equarx_force --equarx_platform=tpu "
SCHEMES = ["", "--equarx_rotation=none --equarx_block_size=128"]


def _psum(flags, x):
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  fn = equarx_pass.jit(psum_program(mesh, "tp"), flags=TPU + flags)
  out = np.array(fn(x).astype(jnp.float32))
  (record,) = fn.report.records
  assert record.rewritten, record.reason
  return fn, out, record.reason


@pytest.fixture(scope="module")
def values():
  rng = np.random.default_rng(5)
  x = rng.standard_normal((8, 64, 256)).astype(np.float32)
  x[3, 2, :128] *= 300.0  # one loud block
  return x


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("flags", SCHEMES)
def test_tile_order_gives_the_flattened_bits(flags, dtype, values):
  tiled_fn, tiled, tiled_reason = _psum(flags, jnp.asarray(values.reshape(512, 256), dtype))
  _, flat, flat_reason = _psum(flags, jnp.asarray(values.reshape(8, 16384), dtype))
  assert "blocks in the operand's tiles; tiled form" in tiled_reason, tiled_reason
  assert "blocks in flat order: shape [1, 16384] is not whole (8, 128) tiles" in flat_reason, (
    flat_reason
  )
  np.testing.assert_array_equal(tiled.reshape(8, 16384), flat)
  module = str(tiled_fn.lower(jnp.zeros((512, 256), dtype)).compiler_ir())
  assert "dims = [0, 1, 3, 2, 4]" in module  # the tiles taken where they lie


def test_tile_order_without_rotation_equals_the_model(values):
  fn, out, _ = _psum(SCHEMES[1], jnp.asarray(values.reshape(512, 256)))
  flat = [values[r].reshape(1, 16384) for r in range(8)]
  model = scheme_lib.reference(flat, fn.policy.scheme)
  for r in range(8):
    np.testing.assert_array_equal(out[64 * r : 64 * (r + 1)].reshape(16384), model[r][0])


def test_the_ring_keeps_the_flat_order_and_says_why(values):
  _, _, reason = _psum("--equarx_algorithm=ring", jnp.asarray(values.reshape(512, 256)))
  assert "blocks in flat order: ring sums each chunk in its own order" in reason, reason


@pytest.mark.parametrize("flags", SCHEMES)
def test_a_nan_block_comes_back_non_finite(flags, values):
  x = values.reshape(512, 256).copy()
  x[65, 130] = np.nan  # device 1, row 1: the second block of that row
  _, out, _ = _psum(flags, jnp.asarray(x))
  sums = out.reshape(8, 64, 2, 128)  # every device holds the sum [64, 256]
  assert not np.isfinite(sums[:, 1, 1]).any()
  sums[:, 1, 1] = 0.0
  assert np.isfinite(sums).all()


def test_the_rings_block_maxima_in_stages_keep_the_models_bits(values):
  """On TPU the tiled ring takes each block's maximum over its rows, then its lanes
  (quantize_emit.block_max): two reductions in the module, the model's bits, and a NaN
  block still non-finite."""
  flags = "--equarx_algorithm=ring --equarx_rotation=none"
  x = values.reshape(512, 256).copy()
  fn, out, reason = _psum(flags, jnp.asarray(x))
  assert "tiled form" in reason, reason
  module = str(fn.lower(jnp.zeros((512, 256), jnp.float32)).compiler_ir())
  # A block maximum at each of the 7 steps and at the final quantization, each in two.
  assert module.count("across dimensions = [1, 2]") == 0
  assert module.count("stablehlo.reduce") == 2 * 8, module.count("stablehlo.reduce")
  model = scheme_lib.reference(
    [x[64 * r : 64 * (r + 1)].reshape(1, -1) for r in range(8)], fn.policy.scheme
  )
  for r in range(8):
    np.testing.assert_array_equal(out[64 * r : 64 * (r + 1)].reshape(-1), model[r][0])

  x[65, 130] = np.nan  # device 1: value 386 of its 16384, in the first block of 1024
  _, out, _ = _psum(flags, jnp.asarray(x))
  sums = out.reshape(8, 16, 1024)  # every device holds the sum, 16 blocks of 1024
  assert not np.isfinite(sums[:, 0]).any()
  assert np.isfinite(sums[:, 1:]).all()
