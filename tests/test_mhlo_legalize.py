"""The partitioned program's MHLO ops written in StableHLO (mhlo_legalize.py)."""

import numpy as np
import pytest
from jax.extend import mlir as jax_mlir
from jax.extend.mlir import ir

from equarx_pass import _jax_private
from equarx_pass.ir import mhlo_legalize, traverse

TUPLE_ALL_TO_ALL = """HloModule m, num_partitions=4
ENTRY e {
  a = f32[2,3] parameter(0)
  b = f32[2,3] parameter(1)
  c = f32[2,3] parameter(2)
  d = f32[2,3] parameter(3)
  t = (f32[2,3], f32[2,3], f32[2,3], f32[2,3]) all-to-all(a, b, c, d), replica_groups={{0,1,2,3}}, channel_id=1
  x = f32[2,3] get-tuple-element(t), index=0
  y = f32[2,3] get-tuple-element(t), index=3
  z = f32[2,3] copy(x)
  ROOT r = (f32[2,3], f32[2,3]) tuple(z, y)
}"""


def converted(text: str) -> ir.Module:
  context = _jax_private.make_ir_context()
  proto = _jax_private.hlo_text_to_proto(text)
  return ir.Module.parse(jax_mlir.hlo_to_stablehlo(proto), context=context)


def test_copies_and_tuple_all_to_alls_become_stablehlo():
  module = converted(TUPLE_ALL_TO_ALL)
  assert mhlo_legalize.remaining(module) == ["mhlo.all_to_all", "mhlo.copy"]
  assert mhlo_legalize.legalize(module) == []
  module.operation.verify()
  [a2a] = [op for op in traverse.walk(module.operation) if op.name == "stablehlo.all_to_all"]
  assert ir.RankedTensorType(a2a.operands[0].type).shape == [4, 2, 3]
  assert int(ir.IntegerAttr(a2a.attributes["split_count"])) == 4


def test_tuple_all_to_all_exchanges_what_the_tuple_form_does():
  """Run both forms on 4 CPU devices (as replicas: no channel) and compare: device i's
  result j is device j's operand i."""
  import jax

  devices = jax.devices()[:4]
  inputs = np.arange(4 * 4 * 6, dtype=np.float32).reshape(4, 4, 2, 3)  # [device, operand]
  text = TUPLE_ALL_TO_ALL.replace(", channel_id=1", "").replace(", num_partitions=4", "")
  results = {}
  for name in ("tuple", "array"):
    module = converted(text)
    if name == "array":
      mhlo_legalize.legalize(module)
    results[name] = _run_per_device(module, devices, inputs)
  np.testing.assert_array_equal(results["tuple"], results["array"])
  np.testing.assert_array_equal(results["array"][:, 1], inputs[3, :])  # result y: from device 3


def _run_per_device(module: ir.Module, devices, inputs):
  """Compile the per-device module for len(devices) replicas and run it."""
  import jax
  from jax.extend import backend as jax_backend

  backend = devices[0].client
  n = len(devices)
  options = jax_backend.get_compile_options(
    num_replicas=n, num_partitions=1, device_assignment=np.arange(n).reshape(n, 1)
  )
  executable = backend.compile_and_load(str(module), _jax_private.device_list(devices), options)
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  sharding = NamedSharding(Mesh(np.asarray(devices), ("d",)), PartitionSpec("d"))
  args = [
    jax.make_array_from_single_device_arrays(
      (n * 2, 3), sharding, [jax.device_put(inputs[d, j], devices[d]) for d in range(n)]
    )
    for j in range(4)
  ]
  out = executable.execute_sharded(args)
  arrays = [
    [np.asarray(x) for x in per_result]
    for per_result in out.disassemble_into_single_device_arrays()
  ]
  return np.stack([np.stack([np.asarray(a[d]) for a in arrays]) for d in range(n)])


if __name__ == "__main__":
  pytest.main([__file__])
