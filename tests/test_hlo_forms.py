"""All-reduces in the forms XLA's and MHLO's programs hold, not only the ones JAX writes:
async pairs, type-promoting all-reduces, mhlo.all_reduce, and the unused copies of
called computations that the HLO -> StableHLO conversion keeps.  Each is rewritten
faithfully (checked by running it) or skipped with a reason, and counted once."""

import ml_dtypes
import numpy as np
import pytest
from run_module import run_per_device

from equarx_pass.ir import parse, traverse
from equarx_pass.planning import match
from equarx_pass.planning.policy import Policy
from equarx_pass.rewrite import rewrite_module

POLICY = Policy(enable=True, min_bytes=0)
DEVICES = 4

ADD_F32 = """
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT add = f32[] add(x, y)
}
"""

ASYNC = f"""HloModule async, replica_count={DEVICES}
{ADD_F32}
ENTRY main {{
  p = f32[4096] parameter(0)
  start = f32[4096] all-reduce-start(p), replica_groups={{{{0,1,2,3}}}}, to_apply=add
  ROOT done = f32[4096] all-reduce-done(start)
}}
"""

PROMOTING = f"""HloModule promoting, replica_count={DEVICES}
{ADD_F32}
ENTRY main {{
  p = bf16[4096] parameter(0)
  ROOT ar = f32[4096] all-reduce(p), replica_groups={{{{0,1,2,3}}}}, to_apply=add
}}
"""

# The while body becomes the stablehlo.while's region and stays a private function too.
WHILE = f"""HloModule loop, replica_count={DEVICES}
{ADD_F32}
body {{
  t = (s32[], f32[4096]) parameter(0)
  i = s32[] get-tuple-element(t), index=0
  v = f32[4096] get-tuple-element(t), index=1
  one = s32[] constant(1)
  next = s32[] add(i, one)
  ar = f32[4096] all-reduce(v), replica_groups={{{{0,1,2,3}}}}, to_apply=add
  ROOT r = (s32[], f32[4096]) tuple(next, ar)
}}

cond {{
  t = (s32[], f32[4096]) parameter(0)
  i = s32[] get-tuple-element(t), index=0
  n = s32[] constant(2)
  ROOT lt = pred[] compare(i, n), direction=LT
}}

ENTRY main {{
  p = f32[4096] parameter(0)
  z = s32[] constant(0)
  t = (s32[], f32[4096]) tuple(z, p)
  w = (s32[], f32[4096]) while(t), condition=cond, body=body
  ROOT o = f32[4096] get-tuple-element(w), index=1
}}
"""

MHLO = f"""module attributes {{mhlo.num_replicas = {DEVICES} : i32}} {{
  func.func @main(%a: tensor<4096xf32>, %b: tensor<4096xf32>) -> (tensor<4096xf32>, tensor<4096xf32>) {{
    %0:2 = "mhlo.all_reduce"(%a, %b) ({{
    ^bb0(%x: tensor<f32>, %y: tensor<f32>):
      %s = mhlo.add %x, %y : tensor<f32>
      mhlo.return %s : tensor<f32>
    }}) {{replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>}} :
        (tensor<4096xf32>, tensor<4096xf32>) -> (tensor<4096xf32>, tensor<4096xf32>)
    return %0#0, %0#1 : tensor<4096xf32>, tensor<4096xf32>
  }}
}}
"""


def _inputs(module, seed=0):
  main = traverse.find_function(module, "main").opview
  rng = np.random.default_rng(seed)
  dtypes = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}
  return [
    rng.normal(size=(DEVICES, *t.shape)).astype(dtypes[str(t.element_type)])
    for t in main.type.inputs
  ]


def _rewrite_and_run(text: str):
  parsed = parse.parse_bytes(text, "module")
  result = rewrite_module(parsed.module, POLICY)
  inputs = _inputs(parsed.module)
  want = run_per_device(parsed.module, inputs)
  got = run_per_device(result.module, inputs)
  return result, got, want


def _relative_error(got, want) -> float:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("text", [ASYNC, WHILE, MHLO], ids=["async", "while", "mhlo"])
def test_rewritten_once_and_within_quantization_error(text):
  result, got, want = _rewrite_and_run(text)
  assert [r.decision for r in result.records] == ["rewritten"], result.records
  assert not any(
    op.name in ("stablehlo.all_reduce", "mhlo.all_reduce", "stablehlo.async_start")
    for f in traverse.called_functions(result.module)
    for op in traverse.walk(f)
  )
  for g, w in zip(got, want):
    assert g.dtype == w.dtype and g.shape == w.shape
    # Two all-reduces in a row (the while runs twice) compound two quantizations.
    assert _relative_error(g, w) < 3e-2


def test_promoting_all_reduce_keeps_its_result_type():
  parsed = parse.parse_bytes(PROMOTING, "promoting")
  result = rewrite_module(parsed.module, POLICY)
  (record,) = result.records
  assert record.rewritten and record.dtypes == ("f32",)
  assert "bf16 summed as f32" in record.reason
  main = traverse.find_function(result.module, "main").opview
  assert [str(t) for t in main.type.results] == ["tensor<4096xf32>"]
  inputs = _inputs(parsed.module)
  (got,) = run_per_device(result.module, inputs)
  assert got.dtype == np.float32
  want = np.sum(inputs[0].astype(np.float32), axis=0)
  assert _relative_error(got, np.broadcast_to(want, got.shape)) < 2e-2


def test_promoting_to_an_unselected_type_is_skipped():
  text = (
    PROMOTING.replace("bf16[4096]", "f32[4096]")
    .replace("ROOT ar = f32", "ROOT ar = f64")
    .replace("f32[] parameter", "f64[] parameter")
    .replace("ROOT add = f32[]", "ROOT add = f64[]")
  )
  result = rewrite_module(parse.parse_bytes(text, "f64").module, POLICY)
  (record,) = result.records
  assert not record.rewritten and "element type f64" in record.reason


DYNAMIC = """
module @m attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 8 : i32} {
  func.func public @main(%arg0: tensor<?xf32>) -> tensor<?xf32> {
    %0 = "stablehlo.all_reduce"(%arg0) <{replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %1 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %1 : tensor<f32>
    }) : (tensor<?xf32>) -> tensor<?xf32>
    return %0 : tensor<?xf32>
  }
}
"""


def test_dynamic_shape_is_skipped_as_such():
  result = rewrite_module(parse.parse_bytes(DYNAMIC, "dynamic").module, POLICY)
  (record,) = result.records
  assert not record.rewritten and record.reason == "dynamic shape"
  assert record.dtypes == ("f32",) and record.shapes == (None,)


def test_unused_function_copies_are_not_sites():
  module = parse.parse_bytes(WHILE, "while").module
  assert match.unused_all_reduces(module) == 1  # the private copy of `body`
  assert len(match.find_all_reduces(module)) == 1
