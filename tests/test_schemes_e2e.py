"""Every scheme the pass emits equals its NumPy model (scheme.reference) bit for bit.

On 8 CPU devices, through equarx_pass.jit: algorithms x formats x rotation x
microshards x block layouts, over one group of 8 and over 2x4 subgroups, in f32
and bf16; every rank of a group bit-identical, repeated runs identical, and the
error against the float64 sum inside what the scheme's format allows.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from meshes import psum_program

import equarx_pass
from equarx_pass.emission import scheme as scheme_lib

SCHEMES = [
  "",  # the default: int8 two-shot, Hadamard 1024
  "--equarx_algorithm=ring --equarx_rotation=none",
  "--equarx_block_size=128",
  "--equarx_algorithm=two_shot",
  "--equarx_algorithm=bidirectional",
  "--equarx_algorithm=one_shot",
  "--equarx_algorithm=one_shot --equarx_rotation=none",
  "--equarx_algorithm=one_shot --equarx_format=int4 --equarx_block_size=128",
  "--equarx_algorithm=ring --equarx_microshards=4",
  "--equarx_algorithm=bidirectional --equarx_microshards=2",
  "--equarx_rotation=hadamard",
  "--equarx_algorithm=two_shot --equarx_rotation=hadamard",
  "--equarx_rotation=hadamard --equarx_rotation_size=256",
  "--equarx_format=int4 --equarx_block_size=128",
  "--equarx_format=int4 --equarx_block_size=128 --equarx_rotation=hadamard",
  "--equarx_format=fp8_e4m3",
  "--equarx_format=fp8_e5m2 --equarx_algorithm=two_shot",
  "--equarx_format=mxint8",
  "--equarx_rounding=stochastic",
  "--equarx_rounding=stochastic --equarx_format=int4 --equarx_algorithm=ring",
  "--equarx_format=mxint8 --equarx_algorithm=ring --equarx_rotation=none",
  "--equarx_format=mxint8 --equarx_algorithm=bidirectional --equarx_microshards=2",
  "--equarx_block_layout=grid",
  "--equarx_block_layout=grid --equarx_rotation=hadamard",
  # Reduce-scatter written out instead of looped (the default for sites >= 4 MiB).
  "--equarx_algorithm=ring --equarx_rotation=none --equarx_unroll_min_bytes=0",
  "--equarx_algorithm=bidirectional --equarx_microshards=2 --equarx_unroll_min_bytes=0",
  "--equarx_algorithm=ring --equarx_format=int4 --equarx_block_size=128 "
  "--equarx_unroll_min_bytes=0",
]
# Loose ceilings on the relative L2 error for Gaussian data, per format (the
# measured values are 2-10x lower; see tools/error_table.py).
MAX_REL_ERR = {"int8": 3e-2, "int4": 4e-1, "fp8_e4m3": 1e-1, "fp8_e5m2": 2e-1, "mxint8": 3e-2}


@pytest.fixture(scope="module")
def inputs():
  rng = np.random.default_rng(7)
  return rng.standard_normal((8, 6000)).astype(np.float32)


@pytest.mark.parametrize("flags", SCHEMES)
def test_scheme_equals_model_one_group(flags, inputs):
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  fn = equarx_pass.jit(
    psum_program(mesh, "tp"), flags="--equarx_enable --equarx_min_bytes=0 --equarx_force " + flags
  )
  out = np.asarray(fn(inputs))
  again = np.asarray(fn(inputs))
  assert [r.decision for r in fn.report.records] == ["rewritten"]
  scheme = fn.policy.scheme
  model = scheme_lib.reference([inputs[i : i + 1] for i in range(8)], scheme)
  for r in range(8):
    np.testing.assert_array_equal(out[r], model[r][0], err_msg=f"rank {r}, {scheme.describe()}")
    np.testing.assert_array_equal(out[r], out[0])
  np.testing.assert_array_equal(out, again)
  exact = inputs.astype(np.float64).sum(0)
  err = np.linalg.norm(out[0] - exact) / np.linalg.norm(exact)
  assert err < MAX_REL_ERR[scheme.format], (scheme.describe(), err)


@pytest.mark.parametrize(
  "flags",
  [
    "--equarx_algorithm=two_shot --equarx_rotation=hadamard",
    "--equarx_algorithm=one_shot",
    "--equarx_algorithm=bidirectional --equarx_microshards=2 --equarx_format=int4 "
    "--equarx_block_size=256",
    "--equarx_algorithm=ring --equarx_rotation=none --equarx_unroll_min_bytes=0",
  ],
)
@pytest.mark.parametrize("axis", ["tp", "dp"])
def test_scheme_equals_model_subgroups_bf16(flags, axis, inputs):
  """2x4 mesh: groups of 4 (tp) or of 2 (dp); bf16 in and out."""
  mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("dp", "tp"))
  x = inputs.astype(jnp.bfloat16)
  fn = equarx_pass.jit(
    psum_program(mesh, axis), flags="--equarx_enable --equarx_min_bytes=0 --equarx_force " + flags
  )
  out = np.asarray(fn(x))
  assert out.dtype == jnp.bfloat16
  ids = np.arange(8).reshape(2, 4)
  groups = ids if axis == "tp" else ids.T
  for group in groups:
    model = scheme_lib.reference([x[d : d + 1] for d in group], fn.policy.scheme, jnp.bfloat16)
    for pos, d in enumerate(group):
      np.testing.assert_array_equal(out[d], model[pos][0])


def test_zero_and_nonfinite_for_every_format():
  """Zero blocks stay zero; a NaN or Inf on one rank never gives a finite result there."""
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  x = np.random.default_rng(3).standard_normal((8, 4096)).astype(np.float32)
  x[:, :1024] = 0.0
  x[2, 2000] = np.nan
  x[5, 3000] = np.inf
  for flags in (
    "--equarx_format=int4 --equarx_block_size=128",
    "--equarx_format=fp8_e4m3 --equarx_rotation=hadamard",
    "--equarx_algorithm=two_shot",
  ):
    fn = equarx_pass.jit(
      psum_program(mesh, "tp"), flags="--equarx_enable --equarx_min_bytes=0 --equarx_force " + flags
    )
    out = np.asarray(fn(x))
    assert np.all(out[:, :1024] == 0), flags
    assert not np.isfinite(out[:, 2000]).any() and not np.isfinite(out[:, 3000]).any(), flags
