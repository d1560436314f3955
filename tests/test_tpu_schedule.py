"""A compiled TPU program's time by its schedule (tpu_schedule.py): the replay's rules on
hand-written scheduled HLO, and the cost model's prediction for a site against the replay
of the program the TPU compiler makes of it (libtpu, compile-only)."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import equarx_pass
from equarx_pass.emission import quantize_kernel
from equarx_pass.frontends import tpu_aot, tpu_schedule
from equarx_pass.platforms import LinkClass

# 1 GB/s and no latency: a transfer of B bytes takes B ns.  1 GHz: a cycle is 1 ns.
CHIP = tpu_schedule.Chip(1e9, 1e12, LinkClass("ici", 1.0, 0.0))
CYCLES = '"estimated_cycles":"{}"'


def program(body: str) -> str:
  return (
    "HloModule m, is_scheduled=true\n\n"
    "ENTRY %main (p: s8[4000]) -> s8[4000] {\n"
    "  %p = s8[4000]{0} parameter(0)\n" + body + "}\n"
  )


def fusion(name: str, operand: str, cycles: int) -> str:
  return (
    f"  %{name} = s8[4000]{{0}} fusion(%{operand}), kind=kLoop, calls=%f, "
    f"backend_config={{{CYCLES.format(cycles)}}}\n"
  )


GATHER = "replica_groups={{0,1,2,3}}, dimensions={0}"


def test_a_synchronous_transfer_adds_to_the_work():
  text = program(
    fusion("a", "p", 5000)
    + f"  %g = s8[4000]{{0}} all-gather(%a), {GATHER}\n"
    + fusion("b", "g", 2000)
  )
  est = tpu_schedule.estimate(text, CHIP)
  # All-gather: 3/4 of its 4000-byte result leaves each chip.
  assert est.wire_seconds == pytest.approx(3000e-9)
  assert est.seconds == pytest.approx((5000 + 3000 + 2000) * 1e-9)
  assert est.hidden_seconds == 0


def test_an_asynchronous_transfer_runs_under_the_work_scheduled_inside_it():
  text = program(
    fusion("a", "p", 1000)
    + f"  %s = (s8[1000]{{0}}, s8[4000]{{0}}) all-gather-start(%a), {GATHER}\n"
    + fusion("b", "p", 2000)
    + "  %d = s8[4000]{0} all-gather-done(%s)\n"
    + fusion("c", "d", 500)
  )
  est = tpu_schedule.estimate(text, CHIP)
  [transfer] = est.transfers
  assert transfer.asynchronous and transfer.wire_bytes == 3000
  # The 3 us transfer starts after a (1 us); b's 2 us hide 2 of them; c after it ends.
  assert transfer.hidden_seconds == pytest.approx(2000e-9)
  assert est.seconds == pytest.approx((1000 + 3000 + 500) * 1e-9)
  assert est.core_seconds == pytest.approx(3500e-9)


def test_the_links_carry_one_transfer_at_a_time():
  text = program(
    "  %s1 = (s8[4000]{0}, s8[4000]{0}) all-reduce-start(%p), replica_groups={{0,1}}, to_apply=%r\n"
    "  %s2 = (s8[4000]{0}, s8[4000]{0}) all-reduce-start(%p), replica_groups=[1,2]<=[2], "
    "to_apply=%r\n" + fusion("a", "p", 1000) + "  %d1 = s8[4000]{0} all-reduce-done(%s1)\n"
    "  %d2 = s8[4000]{0} all-reduce-done(%s2)\n"
  )
  est = tpu_schedule.estimate(text, CHIP)
  # Each all-reduce over 2 sends 2 (1/2) 4000 bytes: 4 us each, one after the other.
  assert [t.wire_bytes for t in est.transfers] == [4000, 4000]
  assert est.seconds == pytest.approx(8000e-9)


def test_a_kernel_is_priced_by_its_bytes_and_a_loop_by_its_trips():
  chip = tpu_schedule.Chip(1e9, 8e9, LinkClass("ici", 1.0, 0.0))
  text = """HloModule m, is_scheduled=true

%body (b: (s32[], s8[4000])) -> (s32[], s8[4000]) {
  %b = (s32[], s8[4000]{0}) parameter(0)
  %x = s8[4000]{0} get-tuple-element(%b), index=1
  %k = s8[4000]{0} custom-call(%x), custom_call_target="tpu_custom_call"
  %i = s32[] get-tuple-element(%b), index=0
  ROOT %t = (s32[], s8[4000]{0}) tuple(%i, %k)
}

%cond (c: (s32[], s8[4000])) -> pred[] {
  %c = (s32[], s8[4000]{0}) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (p: s8[4000]) -> (s32[], s8[4000]) {
  %p = s8[4000]{0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], s8[4000]{0}) tuple(%zero, %p)
  ROOT %w = (s32[], s8[4000]{0}) while(%init), condition=%cond, body=%body
}
"""
  est = tpu_schedule.estimate(text, chip)
  # The kernel reads and writes 4000 bytes each at 8 GB/s: 1 us, three times.
  assert est.seconds == pytest.approx(3e-6)


def test_what_it_cannot_price_is_an_error():
  send = "  %s = (s8[4000]{0}, u32[], token[]) send(%p, %t), channel_id=1, is_host_transfer=true\n"
  with pytest.raises(tpu_schedule.ScheduleError, match="host transfer"):
    tpu_schedule.estimate(program(send), CHIP)
  with pytest.raises(tpu_schedule.ScheduleError, match="not scheduled"):
    tpu_schedule.estimate(program("").replace(", is_scheduled=true", ""), CHIP)
  with pytest.raises(tpu_schedule.ScheduleError, match="no clock"):
    tpu_schedule.clock_for("v9x:2x2")


def psum_module(n: int, values: int, dtype):
  mesh = Mesh(np.array(jax.devices()[:n]), ("x",))
  f = jax.jit(
    jax.shard_map(lambda v: jax.lax.psum(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  )
  return f.lower(jax.ShapeDtypeStruct((n * values,), dtype)).compiler_ir("stablehlo")


# The cost model's time for a rewritten site (its wire time plus its on-chip figure)
# against the compiled program's replay (tpu_schedule.estimate), both estimates: within
# 15%.  The native psum is the same sum on both sides.
MODEL_OVER_SCHEDULE = (0.85, 1.15)


@pytest.fixture(scope="module")
def v5e():
  """v5e:2x2's Chip (one compile of the probe)."""
  return tpu_schedule.chip_for("v5e:2x2", 4)


FLAGS = "--equarx_enable --equarx_min_bytes=0 --equarx_platform=tpu --equarx_domains=1"


def scheduled_seconds(module, chip) -> float:
  compiled = tpu_aot.compile_for_target(str(module), "tpu:v5e:2x2")
  return tpu_schedule.estimate(compiled.hlo_text, chip).seconds


def model_seconds(result) -> tuple[float, float]:
  """The cost model's (native, rewritten) seconds for the one site of `result`."""
  [record] = result.records
  assert record.rewritten
  native = record.traffic_before.seconds(result.topology)
  return native, native / record.speedup


@pytest.mark.libtpu
@pytest.mark.parametrize(
  "dtype,scheme",
  [
    (jax.numpy.float32, ""),  # blocks of one row of lanes, rotated
    # Blocks of 8 rows of lanes (PlatformRules.blocks_of_rows_compute_s).
    (jax.numpy.float32, " --equarx_rotation=none"),
    (jax.numpy.bfloat16, " --equarx_rotation=none"),
  ],
)
def test_the_tiled_form_agrees_with_the_schedule_and_stays_native_where_it_loses(
  v5e, dtype, scheme
):
  """4 MiB a chip inside v5e:2x2: the model's time for the forced rewrite is the
  replay's within 15%, the replay is slower than the native psum's, and the default
  leaves the site native."""
  module = psum_module(4, (4 << 20) // np.dtype(dtype).itemsize, dtype)
  native_s = scheduled_seconds(module, v5e)
  forced = equarx_pass.rewrite_module(
    module, equarx_pass.Policy.from_flags(FLAGS + scheme + " --equarx_force")
  )
  model_native, model = model_seconds(forced)
  assert native_s == pytest.approx(model_native, rel=1e-3)
  scheduled = scheduled_seconds(forced.module, v5e)
  low, high = MODEL_OVER_SCHEDULE
  assert low < model / scheduled < high, (model, scheduled)
  assert scheduled > native_s
  policy = equarx_pass.Policy.from_flags(FLAGS + scheme)
  [record] = equarx_pass.rewrite_module(module, policy).records
  assert not record.rewritten and "fast links only" in record.reason


@pytest.mark.libtpu
def test_the_permuted_exchange_in_parts_agrees_with_the_schedule(v5e, monkeypatch):
  """8 MiB of bf16 a chip inside v5e:2x2 in parts of 2 MiB: the permuted exchange runs
  4 times, one part after the other, each part's transfers priced as a whole site's."""
  monkeypatch.setattr(quantize_kernel, "PART_BYTES", 2 << 20)
  module = psum_module(4, 4 << 20, jax.numpy.bfloat16)
  result = equarx_pass.rewrite_module(
    module, equarx_pass.Policy.from_flags(FLAGS + " --equarx_force --equarx_form=kernel")
  )
  assert result.records[0].reason.endswith("in 4 parts, collective-permutes of packed chunks)")
  _, model = model_seconds(result)
  scheduled = scheduled_seconds(result.module, v5e)
  low, high = MODEL_OVER_SCHEDULE
  assert low < model / scheduled < high, (model, scheduled)


@pytest.mark.libtpu
def test_the_kernel_form_agrees_with_the_schedule(v5e):
  """8 MiB of bf16 a chip inside v5e:2x2, the kernel form forced: its chunks exchanged by
  collective-permutes, partly under the kernels."""
  module = psum_module(4, 4 << 20, jax.numpy.bfloat16)
  flags = FLAGS + " --equarx_force --equarx_form=kernel --equarx_kernel_exchange=permutes"
  result = equarx_pass.rewrite_module(module, equarx_pass.Policy.from_flags(flags))
  assert result.records[0].reason.endswith("collective-permutes of packed chunks)")
  model_native, model = model_seconds(result)
  assert scheduled_seconds(module, v5e) == pytest.approx(model_native, rel=1e-3)
  scheduled = scheduled_seconds(result.module, v5e)
  low, high = MODEL_OVER_SCHEDULE
  assert low < model / scheduled < high, (model, scheduled)
