"""The cost model's on-chip term against the TPU compiler's own estimates (libtpu,
compile-only, v5e:2x2).

The compiler gives two estimates, and they disagree: cost_analysis()'s optimal_seconds
(the bytes the program moves through HBM over its bandwidth), and the sum of the
per-instruction estimated cycles (at v5e's 1.5 GHz), 1.4x to 2x higher for the tiled form.
The tiled form's figure is fitted to the compiled schedule's replay, which takes the
larger of the two per instruction (tests/test_tpu_schedule.py): its added time for a
rewritten psum must lie above the first and within 30% of the second.  The kernel form's
Pallas kernels carry no estimated cycles; its figure is fitted to, and checked against,
optimal_seconds alone, with its exchange by all-to-all and all-gather: optimal_seconds
also counts the bytes of collective-permutes, whose exchange the replay checks instead
(tests/test_tpu_schedule.py)."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import equarx_pass
from equarx_pass import platforms
from equarx_pass.frontends import tpu_aot

pytestmark = pytest.mark.libtpu  # skipped without libtpu (pip install 'equarx-pass[tpu]')

CLOCK_HZ = 1.5e9  # v5e
MIB = 1 << 20


def psum_module(nbytes: int, dtype) -> str:
  mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
  f = jax.jit(
    jax.shard_map(lambda v: jax.lax.psum(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  )
  values = 4 * nbytes // np.dtype(dtype).itemsize
  return str(f.lower(jax.ShapeDtypeStruct((values,), dtype)).compiler_ir("stablehlo"))


@pytest.mark.parametrize("form", ["tiled", "kernel"])
@pytest.mark.parametrize("dtype", [jax.numpy.float32, jax.numpy.bfloat16])
def test_added_on_chip_time_agrees_with_the_compiler(form, dtype):
  nbytes = 4 * MIB
  flags = "--equarx_enable --equarx_force --equarx_platform=tpu --equarx_compile_for=tpu:v5e:2x2"
  if form == "kernel":
    flags += " --equarx_form=kernel --equarx_kernel_exchange=collectives"
  result = equarx_pass.transform_text(
    psum_module(nbytes, dtype), equarx_pass.Policy.from_flags(flags)
  )
  [record] = result.records
  assert record.rewritten
  tpu, native = result.tpu, result.tpu.original
  rules = platforms.rules_for("tpu")
  per_site, per_value = rules.kernel_compute_s if form == "kernel" else rules.compute_s
  if form == "tiled":
    per_value += record.group_size * rules.compute_per_member_s
  model = per_site + nbytes // np.dtype(dtype).itemsize * per_value
  optimal = tpu.on_chip_seconds - native.on_chip_seconds
  if form == "kernel":
    assert 0.7 < model / optimal < 1.3, (model, optimal)
  else:
    cycles = tpu_aot.estimated_cycles(tpu.hlo_text) - tpu_aot.estimated_cycles(native.hlo_text)
    cycles /= CLOCK_HZ
    assert model > optimal and 0.7 < model / cycles < 1.3, (model, optimal, cycles)
