"""Replica groups in every form the pass accepts expand to the right device ids."""

import numpy as np
import pytest
from jax.extend.mlir import ir

import equarx_pass
from equarx_pass import _jax_private
from equarx_pass.ir import traverse
from equarx_pass.planning import match

MODULE = """module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["dp"=2, "tp"=4], device_ids=[7,6,5,4,3,2,1,0]>
  func.func @main(%arg0: tensor<40000xf32>) -> tensor<40000xf32> {
    %0 = "stablehlo.all_reduce"(%arg0) <{ATTRS}> ({
      ^bb0(%a: tensor<f32>, %b: tensor<f32>):
        %3 = stablehlo.add %a, %b : tensor<f32>
        stablehlo.return %3 : tensor<f32>
      }) : (tensor<40000xf32>) -> tensor<40000xf32>
    return %0 : tensor<40000xf32>
  }
}"""
CHANNEL = "channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, "
INLINE_MESH = '#stablehlo.mesh<axes=[<name = "dp", size = 2>, <name = "tp", size = 4>]>'


def _axes(*names):
  return ", ".join(f'#stablehlo.axis_ref<name = "{n}">' for n in names)


CASES = [
  (
    "dense",
    CHANNEL + "replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, "
    "use_global_device_ids",
    ((0, 1, 2, 3), (4, 5, 6, 7)),
  ),
  ("empty means all", CHANNEL + "replica_groups = dense<> : tensor<0x0xi64>", (tuple(range(8)),)),
  (
    "mesh axes tp, symbol, device_ids",
    CHANNEL + "replica_groups = "
    f"#stablehlo.replica_group_mesh_axes<mesh = @mesh, axes = [{_axes('tp')}]>, use_global_device_ids",
    ((7, 6, 5, 4), (3, 2, 1, 0)),
  ),
  (
    "mesh axes dp",
    CHANNEL + "replica_groups = "
    f"#stablehlo.replica_group_mesh_axes<mesh = @mesh, axes = [{_axes('dp')}]>, use_global_device_ids",
    ((7, 3), (6, 2), (5, 1), (4, 0)),
  ),
  (
    "inline mesh, two axes in reverse",
    CHANNEL + "replica_groups = "
    f"#stablehlo.replica_group_mesh_axes<mesh = {INLINE_MESH}, axes = [{_axes('tp', 'dp')}]>, "
    "use_global_device_ids",
    ((0, 4, 1, 5, 2, 6, 3, 7),),
  ),
  (
    "channel without global ids: all partitions",
    CHANNEL + "replica_groups = dense<[[0]]> : tensor<1x1xi64>",
    (tuple(range(8)),),
  ),
]


def _parse(attrs):
  ctx = _jax_private.make_ir_context()
  return ir.Module.parse(MODULE.replace("ATTRS", attrs), context=ctx)


@pytest.mark.parametrize("name,attrs,groups", CASES, ids=[c[0] for c in CASES])
def test_groups_expand(name, attrs, groups):
  module = _parse(attrs)
  site, problem = match.describe(match.find_all_reduces(module)[0], 0, match.module_facts(module))
  assert problem is None
  assert site.groups == groups


@pytest.mark.parametrize("name,attrs,groups", CASES, ids=[c[0] for c in CASES])
def test_rewrite_permutes_stay_inside_groups(name, attrs, groups):
  module = _parse(attrs)
  # The loop form (GPU, TPU): one permute per ring half.
  ring = equarx_pass.Policy(
    enable=True, force=True, algorithm="ring", rotation="none", form="flat", platform="tpu"
  )
  result = equarx_pass.rewrite_module(module, ring)
  assert [r.decision for r in result.records] == ["rewritten"]
  member = {d: i for i, g in enumerate(groups) for d in g}
  permutes = [
    op for op in traverse.walk(result.module.operation) if op.name == "stablehlo.collective_permute"
  ]
  assert len(permutes) == 2
  for op in permutes:
    pairs = np.array([int(v) for v in op.attributes["source_target_pairs"]]).reshape(-1, 2)
    assert len(pairs) == 8
    assert all(member[s] == member[t] for s, t in pairs)
    # Each rank sends to the next one of its own group, in group order.
    for g in groups:
      for r, d in enumerate(g):
        assert [t for s, t in pairs if s == d] == [g[(r + 1) % len(g)]]


def test_global_ids_with_several_replicas_is_skipped():
  module = _parse(
    CHANNEL + "replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids"
  )
  module.operation.attributes["mhlo.num_replicas"] = ir.IntegerAttr.get(
    ir.IntegerType.get_signless(32, module.context), 2
  )
  result = equarx_pass.rewrite_module(module, equarx_pass.Policy(enable=True))
  assert result.records[0].decision == "skipped"
  assert "several replicas" in result.records[0].reason


@pytest.mark.parametrize("replicas,decision", [(1, "skipped"), (8, "rewritten")])
def test_channel_handle_zero_is_cross_replica(replicas, decision):
  """Handle 0 is no channel: the groups name replicas.  With 8 partitions and one replica,
  [[0]] is a group of one device (XLA returns each device's own input), not every
  partition; with 8 replicas it is an ordinary replica group of all of them."""
  groups = "[[0]]" if replicas == 1 else "[[0, 1, 2, 3, 4, 5, 6, 7]]"
  module = _parse(
    "channel_handle = #stablehlo.channel_handle<handle = 0, type = 0>, "
    f"replica_groups = dense<{groups}> : tensor<1x{1 if replicas == 1 else 8}xi64>"
  )
  if replicas > 1:
    for name, value in (("mhlo.num_replicas", replicas), ("mhlo.num_partitions", 1)):
      module.operation.attributes[name] = ir.IntegerAttr.get(
        ir.IntegerType.get_signless(32, module.context), value
      )
  site, _ = match.describe(match.find_all_reduces(module)[0], 0, match.module_facts(module))
  assert site.device_kind == "replica"
  result = equarx_pass.rewrite_module(module, equarx_pass.Policy(enable=True))
  assert result.records[0].decision == decision, result.records[0]
