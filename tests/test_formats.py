"""Every registered wire format against its own contract, and mxint8's scales.

The NumPy half of each format (formats/): a block of zeros stays zero, the error is at
most half a code step, a non-finite value makes its whole block non-finite and no other,
and the emitted half equals the NumPy half bit for bit on XLA:CPU (one quantize and
dequantize, compiled alone).  A new format registered in formats/ is covered here
without a change.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from equarx_pass.emission import quantize as qz
from equarx_pass.emission.formats import FORMATS, MXINT8
from equarx_pass.emission.formats.integer import uniform_draws
from equarx_pass.ir import traverse

NAMES = sorted(FORMATS)


def _block(fmt, default=64):
  return fmt.block or default


def _draw(rng, fmt, blocks=16, spread=30, default=64):
  """Blocks of Gaussian values, each block scaled by 2^k, k in [-spread, spread]."""
  b = _block(fmt, default)
  x = rng.standard_normal((blocks, b)).astype(np.float32)
  x *= np.exp2(rng.integers(-spread, spread, (blocks, 1))).astype(np.float32)
  return x.reshape(-1)


@pytest.mark.parametrize("name", NAMES)
def test_error_within_half_a_code_step(name):
  fmt, rng = FORMATS[name], np.random.default_rng(1)
  b = _block(fmt)
  x = _draw(rng, fmt)
  codes, scale = qz.quantize(x, b, fmt)
  assert codes.dtype == np.int8 and codes.size == fmt.code_bytes(x.size)
  out = qz.dequantize(codes, scale, b, fmt)
  err = np.abs(out.astype(np.float64) - x).reshape(-1, b)
  values = np.abs(qz.codes_to_f32(codes, fmt, b)).reshape(-1, b)
  assert np.all(values <= fmt.qmax)
  if fmt.bits == 8 and name.startswith("fp8"):
    # fp8: half an fp8 ulp of the scaled value, relative (3 or 2 mantissa bits).
    mantissa = 3 if "e4m3" in name else 2
    bound = np.abs(x.reshape(-1, b)) * 2.0 ** -(mantissa + 1) + scale[:, None] * 2.0**-6
  else:
    bound = scale.astype(np.float64)[:, None] * (0.5 + 2.0**-15)
  assert np.all(err <= bound), name


@pytest.mark.parametrize("name", NAMES)
def test_zero_block_stays_zero_and_non_finite_poisons_its_block(name):
  fmt, rng = FORMATS[name], np.random.default_rng(2)
  b = _block(fmt)
  x = _draw(rng, fmt, blocks=4).reshape(4, b)
  x[0] = 0
  for bad, row in ((np.nan, 1), (np.inf, 2)):
    x[row, 3] = bad
  codes, scale = qz.quantize(x.reshape(-1), b, fmt)
  out = qz.dequantize(codes, scale, b, fmt).reshape(4, b)
  assert np.all(out[0] == 0)
  assert not np.any(np.isfinite(out[1])) and not np.any(np.isfinite(out[2]))
  assert np.all(np.isfinite(out[3]))


@pytest.mark.parametrize("name", NAMES)
def test_emitted_codec_equals_the_numpy_one(name):
  _emitted_equals_numpy(FORMATS[name])


def _emitted_equals_numpy(fmt):
  """One quantize -> dequantize through the tiled form's codec, compiled on XLA:CPU."""
  from jax.extend.mlir import ir

  from equarx_pass import _jax_private
  from equarx_pass.emission.quantize_emit import TileCodec
  from equarx_pass.ir.hlo_builder import Emitter

  b = _block(fmt, 128)
  x = _draw(np.random.default_rng(3), fmt, blocks=32, default=b).reshape(32, b)
  lowered = jax.jit(lambda v: v).lower(jax.ShapeDtypeStruct(x.shape, jnp.float32))
  module = lowered.compiler_ir("stablehlo")
  body = traverse.find_function(module, "main").opview.body.blocks[0]
  for op in list(body.operations):
    op.erase()
  with module.context, ir.Location.unknown(), ir.InsertionPoint(body):
    from jax.extend.mlir.dialects import func

    codec = TileCodec(Emitter(), fmt, 1, -1)
    func.ReturnOp([codec.dequantize(*codec.quantize(body.arguments[0]))])
  out = np.asarray(_jax_private.lowered_with_module(lowered, module).compile()(x))
  codes, scale = qz.quantize(x, b, fmt)
  np.testing.assert_array_equal(out, qz.dequantize(codes, scale, b, fmt))


@pytest.mark.parametrize("name", ["int8", "int4", "mxint8"])
def test_stochastic_rounding_is_unbiased(name):
  """Values 0.3 of a step above a code: round-to-nearest is 0.3 steps low on every one,
  stochastic rounding picks the code above 30% of the time, which is unbiased."""
  fmt = dataclasses.replace(FORMATS[name], stochastic=True)
  b = _block(fmt, 128)
  rng = np.random.default_rng(7)
  step = 2.0 if name == "mxint8" else 1.0  # mxint8: the power of two at or above 127/127
  codes_wanted = rng.integers(-int(fmt.qmax) + 1, int(fmt.qmax) - 1, (4096, b))
  x = ((codes_wanted + 0.3) * step).astype(np.float32)
  x[:, 0] = fmt.qmax * step  # fixes every block's scale
  codes, scale = qz.quantize(x.reshape(-1), b, fmt)
  assert np.all(scale == step)
  error = (qz.codes_to_f32(codes, fmt, b).reshape(x.shape) - x / step)[:, 1:]
  assert np.all(np.isclose(error, -0.3, atol=1e-4) | np.isclose(error, 0.7, atol=1e-4))
  # 4096 x (b - 1) draws of a two-point error (variance 0.21): the mean is within
  # 5 standard deviations of 0; round-to-nearest's would be -0.3.
  assert abs(float(error.mean())) < 5 * np.sqrt(0.21 / error.size)
  draws = uniform_draws(x)
  assert draws.min() >= 0 and draws.max() < 1 and abs(float(draws.mean()) - 0.5) < 2e-3


@pytest.mark.parametrize("name", ["int8", "int4", "mxint8"])
def test_stochastic_codec_emitted_equals_numpy(name):
  fmt = dataclasses.replace(FORMATS[name], stochastic=True)
  _emitted_equals_numpy(fmt)


@settings(max_examples=200, deadline=None)
@given(
  exponent=st.integers(-149, 127),
  mantissa=st.floats(1, 2, exclude_max=True, width=32),
  seed=st.integers(0, 2**16),
)
def test_mxint8_scales_are_powers_of_two_that_fit_the_absmax(exponent, mantissa, seed):
  amax = np.float32(np.ldexp(np.float64(mantissa), exponent))
  x = np.random.default_rng(seed).uniform(-1, 1, 32).astype(np.float32) * amax
  x[seed % 32] = amax
  scale, reciprocal = MXINT8.scales(qz.block_amax(x, 32))
  (s,) = scale
  assert np.frexp(s)[0] == 0.5  # a power of two
  assert reciprocal[0] * s == 1
  if 2.0**-119 <= amax <= 127 * 2.0**121:  # between the smallest and the largest scale
    assert 63.5 <= amax / s <= 127 * (1 + 2.0**-23)
  codes, _ = qz.quantize(x, 32, MXINT8)
  out = qz.dequantize(codes, scale, 32, MXINT8)
  assert np.all(np.isfinite(out))
  # Within 1% of the f32 maximum the block saturates at 127 codes: one step at most.
  bound = s if amax > 127 * 2.0**121 else s / 2
  assert np.all(np.abs(out.astype(np.float64) - x) <= bound)


def test_mxint8_travels_one_byte_per_32_values():
  assert MXINT8.block == 32 and MXINT8.payload_bytes(1024, 32) == 1024 + 32
  assert 8 * MXINT8.payload_bytes(1024, 32) / 1024 == 8.25


def test_a_format_registered_after_import_is_a_choice():
  """The registries stay open: a format registered by a user after import is accepted by
  the flags and emitted like the built-in ones (here a copy of int8 under a new name)."""
  import equarx_pass
  from equarx_pass.emission import formats
  from equarx_pass.emission import scheme as scheme_lib

  mine = dataclasses.replace(formats.INT8, name="int8_mine")
  formats.register(mine)
  try:
    flags = "--equarx_enable --equarx_min_bytes=0 --equarx_force --equarx_format=int8_mine"
    policy = equarx_pass.Policy.from_flags(flags)
    assert policy.scheme.fmt.name == "int8_mine"
    mesh = jax.make_mesh((8,), ("x",))
    fn = jax.shard_map(
      lambda v: jax.lax.psum(v, "x"),
      mesh=mesh,
      in_specs=jax.sharding.PartitionSpec("x"),
      out_specs=jax.sharding.PartitionSpec("x"),
    )
    x = np.random.default_rng(0).standard_normal((8, 1000)).astype(np.float32)
    sharded = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
    got = np.asarray(equarx_pass.jit(fn, flags=flags)(sharded))
    want = scheme_lib.reference(list(x), policy.scheme)
    np.testing.assert_array_equal(got[0], want[0])
  finally:
    del formats.FORMATS["int8_mine"]
