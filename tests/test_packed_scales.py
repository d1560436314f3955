"""packed_scales.py: the kernels' packing of a chunk's scales among its codes, against the
layout's NumPy model, bit for bit (subnormals, zeros, inf and the largest float
included)."""

import jax
import numpy as np
import pytest

from equarx_pass.emission import packed_scales


def scales_with_extremes(tiles: int) -> np.ndarray:
  rng = np.random.default_rng(1)
  s = np.abs(rng.standard_normal((tiles, 8)) * np.exp(rng.uniform(-80, 80, (tiles, 8))))
  s = s.astype(np.float32)
  s[0, 0], s[1, 3], s[2, 2] = np.inf, 0.0, np.float32(1e-45)
  s[3, 1] = np.finfo(np.float32).max
  return s


@pytest.mark.parametrize("step", [32, 64])
def test_pack_is_the_model_and_unpack_undoes_it(step):
  scales = scales_with_extremes(step)
  codes = np.random.default_rng(2).integers(-127, 128, (step, 8, 128)).astype(np.int8)
  model = packed_scales.pack_model(codes, scales, step)
  assert model.shape == (step + step // 32, 8, 128)
  packed = np.asarray(jax.jit(lambda s: packed_scales.pack(jax, s))(scales))
  np.testing.assert_array_equal(packed, model[step:])
  back = np.asarray(jax.jit(lambda b: packed_scales.unpack(jax, b, step))(packed))[..., 0]
  np.testing.assert_array_equal(back.view(np.uint32), scales.view(np.uint32))


def test_the_model_round_trips_steps_in_order():
  step, steps = 32, 3
  scales = scales_with_extremes(step * steps)
  codes = np.arange(step * steps * 8 * 128).reshape(-1, 8, 128).astype(np.int8)
  packed = packed_scales.pack_model(codes, scales, step)
  assert packed.shape == (steps * (step + 1), 8, 128)
  np.testing.assert_array_equal(packed[step + 1 : 2 * step + 1], codes[step : 2 * step])
  back_codes, back_scales = packed_scales.unpack_model(packed, step)
  np.testing.assert_array_equal(back_codes, codes)
  np.testing.assert_array_equal(back_scales.view(np.uint32), scales.view(np.uint32))


def test_a_step_must_fill_whole_tiles_of_scale_bytes():
  with pytest.raises(AssertionError):
    packed_scales.scale_tiles(16)
