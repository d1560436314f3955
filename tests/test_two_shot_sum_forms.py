"""Two-shot sums the N received rows straight-line up to build.TWO_SHOT_UNROLL ranks and
in a while loop above; both forms equal the NumPy model bit for bit (zeros, -0 codes of
fp8, NaN/Inf blocks included), so the loop form is checked here with the limit lowered."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import equarx_pass
from equarx_pass import build
from equarx_pass import scheme as scheme_lib


def _inputs():
  rng = np.random.default_rng(11)
  x = rng.standard_normal((8, 6000)).astype(np.float32)
  x[:, :1024] = 0                    # a zero block
  x[:, 1024:2048] *= 1e-3            # fp8 flushes some of these to -0 codes
  x[3, 2100] = np.inf                # a non-finite block
  x[5, 3100] = np.nan
  return x


@pytest.mark.parametrize("unroll", [build.TWO_SHOT_UNROLL, 0])
@pytest.mark.parametrize("flags", ["", "--equarx_block_size=128",
                                   "--equarx_format=fp8_e5m2 --equarx_rotation=none"])
def test_two_shot_sum_forms_equal_the_model(flags, unroll, monkeypatch):
  monkeypatch.setattr(build, "TWO_SHOT_UNROLL", unroll)
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  program = jax.shard_map(lambda x: jax.lax.psum(x, "tp"), mesh=mesh,
                          in_specs=P("tp"), out_specs=P("tp"))
  fn = equarx_pass.jit(program, flags="--equarx_enable --equarx_min_bytes=0 " + flags)
  assert fn.policy.scheme.algorithm == scheme_lib.TWO_SHOT
  x = _inputs()
  out = np.asarray(fn(x))
  model = scheme_lib.reference([x[i:i + 1] for i in range(8)], fn.policy.scheme)
  for r in range(8):
    np.testing.assert_array_equal(out[r].view(np.uint32), model[r][0].view(np.uint32),
                                  err_msg=f"rank {r}")
