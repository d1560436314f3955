"""Platform rules as data (platforms.py): a platform registered after import, and a link
class for a device kind, are used by the topology, the cost model, the policy and the
emitters' site plans without a change to any of them."""

import dataclasses
from types import SimpleNamespace

import pytest

from equarx_pass import platforms, site_patterns
from equarx_pass import topology as topology_lib
from equarx_pass.ir.hlo_builder import ChannelAllocator
from equarx_pass.ir.layout import make_schedule
from equarx_pass.planning import cost, plan
from equarx_pass.planning.match import Candidate, Operand, Site
from equarx_pass.planning.policy import Policy
from equarx_pass.platforms import LinkClass, PlatformRules

TOY_LINKS = (LinkClass("toy_fast", 10.0, 1e-6), LinkClass("toy_slow", 1.0, 1e-4))


@pytest.fixture
def toy():
  rules = platforms.register(
    PlatformRules(
      "toy",
      TOY_LINKS,
      links_by_device_kind=(("Toy X", (LinkClass("x_fast", 5.0, 1e-6), TOY_LINKS[1])),),
      domain_attribute="slice_index",
      domain_source="toy pods",
      widens_16_bit_on_wire=True,
      native_across="ring",
      compute_s=(1e-3, 1e-9),
      matmul_rotation=False,
      tile_order=True,
      collectives_in_loops=False,
      outline_by_default=True,
    )
  )
  yield rules
  del platforms.PLATFORMS[rules.name]


def test_the_topology_takes_a_registered_platforms_links_and_domains(toy):
  by_size = topology_lib.from_size(8, "toy", domain_devices=4)
  assert (by_size.fast, by_size.slow) == TOY_LINKS
  devices = [SimpleNamespace(device_kind="Toy X1", slice_index=i // 4) for i in range(8)]
  by_devices = topology_lib.from_devices(devices, "toy")
  assert by_devices.domains == (0, 0, 0, 0, 1, 1, 1, 1)
  assert by_devices.fast.name == "x_fast"  # the device kind's link class
  assert by_devices.source == "toy pods"


def test_the_cost_model_prices_by_a_registered_platforms_rules(toy):
  topology = topology_lib.from_size(8, "toy", domain_devices=4)
  assert cost.wire_itemsize(2, "toy") == 4
  native = cost.native_all_reduce(tuple(range(8)), 1 << 20, 2, topology)
  assert native.slow_steps == 14  # one flat ring over every device
  prediction = cost.predict(native, native, 1000, topology)
  assert prediction.compute_s == pytest.approx(1e-3 + 1000 * 1e-9)


def test_the_policy_and_the_site_plan_follow_a_registered_platform(toy):
  policy = Policy(enable=True, min_bytes=0, platform="toy").resolved()[0]
  assert policy.outlines("toy") and not policy.outlines("gpu")
  groups = (tuple(range(8)),)
  site = Site(0, "here", (Operand((1 << 16,), "f32"),), groups, "partition", 8)
  layout = policy.scheme.layout(1 << 16, 8)
  cand = Candidate(site, None, layout, make_schedule(groups))
  no_traffic = cost.Traffic()
  cand = dataclasses.replace(
    cand, route=plan.FlatRoute(no_traffic, no_traffic, 0, scheme=policy.scheme, layout=layout)
  )
  topology = topology_lib.from_size(8, "toy")
  ctx = site_patterns.RewriteContext(policy.emission, ChannelAllocator(0), topology, "toy", True)
  site_plan = ctx.site_plan(cand, layout, cand.schedule)
  assert not site_plan.matmul_rotation and site_plan.tile_order
  assert not site_plan.collectives_in_loops and site_plan.nan_in_combiner


def test_the_builtin_platforms_keep_their_rules():
  cpu, tpu, gpu = (platforms.rules_for(p) for p in ("cpu", "tpu", "gpu"))
  assert cpu.one_process_is_hosts and cpu.native_across == "ring" and cpu.pieces_by_all_reduce
  assert tpu.domain_attribute == "slice_index" and tpu.tile_order and tpu.kernel_compute_s
  assert gpu.links == platforms.GPU_LINKS and gpu.collectives_in_loops
  assert platforms.rules_for("TPU?").links == platforms.CPU_LINKS  # no rule: CPU links
  assert platforms.rules_for("TPU?").compute_s == tpu.compute_s  # and the TPU's figure


def test_jax_names_kernels_and_the_partitioned_route_follow_the_rules(toy):
  """The names JAX gives a platform, where the kernel form's kernels run, and the
  partitioned route's choices are fields: a registered platform sets them."""
  from equarx_pass.emission import quantize_kernel

  aliased = platforms.register(
    dataclasses.replace(toy, name="toy2", jax_aliases=("toyjax",), kernel_target="tpu")
  )
  try:
    assert platforms.named_by_jax("toyjax") == "toy2" and platforms.named_by_jax("cuda") == "gpu"
    assert Policy().target_platform("toyjax") == "toy2"
    assert Policy().target_platform(None) == "cpu"
    assert Policy(compile_for="tpu:v5e:2x2").target_platform(None) == "tpu"
    # toy2 rotates by the model's butterflies (toy's rules): no kernels for its forms.
    assert "butterflies" in quantize_kernel.target_for("toyjax", "toy2")
    matmul = platforms.register(dataclasses.replace(aliased, name="toy3", matmul_rotation=True))
    try:
      assert quantize_kernel.target_for("toy3", "toy3") == "tpu"
      assert quantize_kernel.target_for("toy3", "gpu").startswith("no kernel")
    finally:
      del platforms.PLATFORMS[matmul.name]
  finally:
    del platforms.PLATFORMS[aliased.name]
  assert quantize_kernel.target_for("cpu", "tpu") == "interpret"
  assert quantize_kernel.target_for("cuda", "gpu") == "cuda"
  assert quantize_kernel.target_for("tpu", "tpu") == "tpu"
  assert platforms.rules_for("cpu").read_after_simplification
  assert platforms.rules_for("cpu").compiles_mhlo and not platforms.rules_for("tpu").compiles_mhlo
