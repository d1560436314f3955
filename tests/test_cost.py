"""The cost model on its own: traffic per link class, the native collective's, a declared
rewrite's, and the prediction (cost.py)."""

import pytest

from equarx_pass import platforms
from equarx_pass import topology as topology_lib
from equarx_pass.emission.quantize_kernel import KernelExchange
from equarx_pass.planning import cost
from equarx_pass.traffic import Declaration


def _topology(platform: str, per_domain: int, devices: int = 8) -> topology_lib.Topology:
  return topology_lib.from_size(devices, platform, domain_devices=per_domain)


def test_traffic_adds_per_link_class_and_prices_each_on_its_link():
  a = cost.Traffic(fast=100, slow=10, fast_steps=1, slow_steps=2)
  b = cost.Traffic(fast=1, slow=2, fast_steps=3, slow_steps=4)
  assert a + b == cost.Traffic(101, 12, 4, 6)
  assert (a + b).total == 113
  topology = _topology("tpu", 4)
  fast, slow = topology.fast, topology.slow
  assert a.seconds(topology) == pytest.approx(fast.seconds(100, 1) + slow.seconds(10, 2))


def test_xla_cpu_widens_16_bit_floats_on_the_wire():
  assert cost.wire_itemsize(2, "cpu") == 4
  assert cost.wire_itemsize(2, "tpu") == 2
  assert cost.wire_itemsize(4, "cpu") == 4


def test_native_all_reduce_inside_one_domain_is_one_fast_step():
  group = tuple(range(8))
  native = cost.native_all_reduce(group, 1 << 20, 4, _topology("tpu", 8))
  assert native == cost.Traffic(fast=2 * 7 / 8 * (1 << 20), fast_steps=1)


def test_native_all_reduce_across_tpu_slices_is_hierarchical():
  group = tuple(range(8))  # 2 domains of 4
  native = cost.native_all_reduce(group, 1 << 20, 2, _topology("tpu", 4))
  assert native.fast == 2 * 3 / 4 * (1 << 20)
  assert native.slow == 2 * 1 / 2 * (1 << 20) / 4  # a 1/k piece across
  assert (native.fast_steps, native.slow_steps) == (2, 1)


def test_native_all_reduce_across_cpu_processes_is_one_ring_in_f32():
  group = tuple(range(8))
  native = cost.native_all_reduce(group, 1 << 20, 2, _topology("cpu", 4))
  wire = 2 << 20  # bf16 widened to f32
  assert native.slow == pytest.approx(2 * 7 / 8 * wire / 4)
  assert (native.fast_steps, native.slow_steps) == (0, 14)


@pytest.mark.parametrize(
  "crossing, fast, slow, steps",
  [(0.0, 1000, 0, (3, 0)), (1.0, 0, 1000, (0, 3)), (0.25, 750, 250, (3, 3))],
)
def test_a_declaration_is_priced_by_its_share_across_domains(crossing, fast, slow, steps):
  traffic = cost.priced(Declaration(1000, 3, crossing))
  assert (traffic.fast, traffic.slow) == (fast, slow)
  assert (traffic.fast_steps, traffic.slow_steps) == steps


def test_across_sends_a_declaration_whole_on_the_slow_links():
  assert cost.across(Declaration(1000, 2, 0.5)) == cost.Traffic(slow=1000, slow_steps=2)


def test_prediction_adds_the_on_chip_work_per_site_and_per_value():
  topology = _topology("cpu", 4)
  native = cost.Traffic(slow=1 << 20, slow_steps=14)
  rewritten = cost.Traffic(slow=1 << 18, slow_steps=2)
  per_site, per_value = platforms.rules_for("cpu").compute_s
  prediction = cost.predict(native, rewritten, 1000, topology)
  assert prediction.compute_s == pytest.approx(per_site + 1000 * per_value)
  assert prediction.rewritten_s == pytest.approx(rewritten.seconds(topology) + prediction.compute_s)
  assert prediction.speedup == pytest.approx(prediction.native_s / prediction.rewritten_s)
  # No value quantized (the identity route): no work added.
  assert cost.predict(native, native, 0, topology).speedup == 1


def test_the_kernel_form_has_its_own_figure_where_measured():
  native = cost.Traffic(slow=1 << 20, slow_steps=1)
  tpu = _topology("tpu", 4)
  collectives = KernelExchange.COLLECTIVES
  kernels = cost.predict(native, native, 1 << 20, tpu, kernels=collectives).compute_s
  tiled = cost.predict(native, native, 1 << 20, tpu).compute_s
  assert kernels < tiled
  gpu = _topology("gpu", 4)  # not timed there: priced as the tiled form
  assert cost.predict(native, native, 10, gpu, kernels=collectives).compute_s == pytest.approx(
    cost.predict(native, native, 10, gpu).compute_s
  )


def test_the_permuted_exchange_leaves_part_of_the_kernels_outside_its_transfers():
  native = cost.Traffic(fast=1 << 20, fast_steps=1)
  tpu = _topology("tpu", 4)
  whole = cost.predict(native, native, 1 << 20, tpu, kernels=KernelExchange.COLLECTIVES)
  permuted = cost.predict(
    native, native, 1 << 20, tpu, kernels=KernelExchange.PERMUTES, members=4, itemsize=2
  )
  share = cost.permuted_exposed_share(4, 2)
  assert permuted.compute_s == pytest.approx(whole.compute_s * share)
  # One chunk's quantize and dequantize and the sum, by the bytes each moves a value:
  # 2 (2 + 1.03125) / 4 + 1.03125 * 5 / 4 of 2 (2 + 1.03125) + 1.03125 * 5 / 4.
  assert share == pytest.approx(2.80469 / 7.35156, rel=1e-4)
  # More members: smaller chunks outside the transfers; wider values: more of the work in
  # the chunks' kernels.
  assert cost.permuted_exposed_share(16, 2) < share < cost.permuted_exposed_share(2, 2)
  assert cost.permuted_exposed_share(4, 4) < share
