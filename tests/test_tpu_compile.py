"""Rewritten fixtures compile for real TPU topologies (libtpu, ahead of time, no TPU needed).

Each compile runs in a child process (equarx_pass.frontends.tpu_aot) and takes a few seconds, so
there are only five: the 4-device MLP for v5e:2x2 rewritten and as it was, two 8-device
fixtures for v4:2x2x1 (subgroups, and the psum in a function called from a while
body), and one module of the wrong device count.
"""

import os

import pytest

import equarx_pass
from equarx_pass.errors import CompileError
from equarx_pass.frontends.tpu_aot import compile_for_target

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hlo_fixtures")


def read_fixture(name: str) -> str:
  with open(os.path.join(FIXTURES, name)) as f:
    return f.read()


pytestmark = pytest.mark.libtpu  # skipped without libtpu (pip install 'equarx-pass[tpu]')

RING = " --equarx_force --equarx_algorithm=ring --equarx_rotation=none"


def rewrite(name: str, flags: str = "--equarx_enable" + RING):
  return equarx_pass.transform_text(read_fixture(name), equarx_pass.Policy.from_flags(flags), name)


def test_v5e_compiles_the_rewritten_4_device_mlp():
  # Through the policy, as `equarx-opt --equarx_compile_for` does it.
  result = rewrite(
    "tp_mlp_4dev_f32.mlir",
    "--equarx_enable --equarx_force --equarx_compile_for=tpu:v5e:2x2" + RING,
  )
  tpu = result.tpu
  assert tpu.target == "tpu:v5e:2x2" and tpu.num_devices == 4
  # The tiled ring (what a TPU gets): 3 reduce-scatter steps written out, each permuting
  # int8 codes and f32 scales; the all-gather of the codes moves int8 too, and the TPU
  # compiler makes the all-gather of the tiny scales an all-reduce, the only one left.
  assert result.records[0].reason.endswith("tiled form")
  assert (tpu.quantized_permutes, tpu.permutes, tpu.all_reduces) == (3, 6, 1)
  assert tpu.quantized_collectives == 4
  assert "source_target_pairs={{0,1},{1,2},{2,3},{3,0}}" in tpu.hlo_text
  assert tpu.cost.get("flops", 0) > 0


def test_v5e_compiles_the_original_4_device_mlp():
  original = str(equarx_pass.parse_bytes(read_fixture("tp_mlp_4dev_f32.mlir")).module)
  tpu = compile_for_target(original, "tpu:v5e:2x2")
  assert tpu.all_reduces >= 1
  assert tpu.quantized_permutes == 0


def test_v4_compiles_subgroup_rings():
  result = rewrite(
    "subgroups_2x4_f32.mlir", "--equarx_enable --equarx_form=flat --equarx_platform=tpu" + RING
  )
  assert [r.rewritten for r in result.records] == [True, True]
  tpu = compile_for_target(result.text, "tpu:v4:2x2x1")
  assert tpu.num_devices == 8
  assert (tpu.quantized_permutes, tpu.permutes, tpu.all_reduces) == (4, 4, 0)
  # The rings stay inside their groups on the TPU too.
  assert "source_target_pairs={{0,1},{1,2},{2,3},{3,0},{4,5},{5,6},{6,7},{7,4}}" in tpu.hlo_text
  assert "source_target_pairs={{0,4},{4,0},{1,5},{5,1},{2,6},{6,2},{3,7},{7,3}}" in tpu.hlo_text


def test_v4_compiles_the_ring_inside_a_scan():
  result = rewrite(
    "scan_layers_f32.mlir", "--equarx_enable --equarx_form=flat --equarx_platform=tpu" + RING
  )
  tpu = compile_for_target(result.text, "tpu:v4:2x2x1")
  assert (tpu.quantized_permutes, tpu.all_reduces) == (2, 0)


def test_wrong_device_count_is_a_compile_error():
  result = rewrite("tp_mlp_f32.mlir")  # 8 devices; v5e:2x2 has 4
  with pytest.raises(CompileError, match="runs on 8 devices .* but v5e:2x2 has 4"):
    compile_for_target(result.text, "tpu:v5e:2x2")


def test_default_scheme_compiles_for_v5e():
  """The default two-shot scheme, tiled (what a TPU gets): its all-to-all and all-gather
  move s8 data on TPU, the f32 scales (eight to a row) their own; no all-reduce left."""
  result = rewrite(
    "tp_mlp_4dev_f32.mlir", "--equarx_enable --equarx_force --equarx_compile_for=tpu:v5e:2x2"
  )
  tpu = result.tpu
  assert [r.decision for r in result.records] == ["rewritten"]
  assert result.records[0].reason.endswith("tiled form")
  assert tpu.all_reduces == 0 and tpu.permutes == 0
  assert tpu.quantized_collectives >= 2


def test_multislice_report_bytes_are_what_the_program_sends():
  """Two v5e:2x2 slices (compile-only): a psum over both mesh axes is hierarchical, and the
  report's bytes across slices equal those counted from the compiled program's
  cross-slice transfers, natively, hierarchical and flat; a psum inside a slice stays
  native (fast links only)."""
  import json
  import subprocess
  import sys

  child = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multislice_child.py")
  env = dict(os.environ, JAX_PLATFORMS="")
  proc = subprocess.run(
    [sys.executable, child], capture_output=True, text=True, timeout=600, env=env
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  native = got["dcn,ici:native"]["counted"]
  hier, flat = got["dcn,ici:default"], got["dcn,ici:flat"]
  assert hier["route"] == "hierarchical" and hier["before"] == pytest.approx(native, rel=0.05)
  assert hier["after"] == pytest.approx(hier["counted"], rel=0.05)
  assert hier["counted"] <= 0.55 * native
  assert flat["after"] == pytest.approx(flat["counted"], rel=0.05) and flat["counted"] > native
  assert "sends 1.29x the native bytes across domains" in flat["reason"]
  inside = got["ici:default"]
  assert inside["decision"] == "skipped" and inside["reason"].startswith("fast links only")


def test_one_slice_is_fast_links_only():
  """A file compiled for a named TPU topology (one slice, ICI only): the cost model leaves
  the all-reduce native, and the module compiles as it was."""
  result = rewrite("tp_mlp_4dev_f32.mlir", "--equarx_enable --equarx_compile_for=tpu:v5e:2x2")
  [record] = result.records
  assert record.decision == "skipped" and record.reason.startswith("fast links only")
  assert result.topology.source == "one TPU slice" and result.tpu.all_reduces >= 1


def test_compile_for_never_stops_the_run():
  """--equarx_compile_for is an inspection: a target the program cannot compile for (8
  devices, v5e:2x2 has 4) is reported and warned about, and the call runs as it would
  without the flag."""
  import jax
  import numpy as np
  from jax.sharding import NamedSharding

  import equarx_pass
  from equarx_pass.errors import EquarxWarning

  mesh = jax.make_mesh((8,), ("x",))
  spec = jax.sharding.PartitionSpec("x")
  f = jax.shard_map(lambda v: jax.lax.psum(v, "x"), mesh=mesh, in_specs=spec, out_specs=spec)
  flags = "--equarx_enable --equarx_min_bytes=0 --equarx_compile_for=tpu:v5e:2x2"
  fn = equarx_pass.jit(f, flags=flags)
  x = jax.device_put(np.arange(8 * 4096, dtype=np.float32), NamedSharding(mesh, spec))
  with pytest.warns(EquarxWarning, match="not compiled: .*runs on 8 devices"):
    out = fn(x)
  np.testing.assert_allclose(out, jax.jit(f)(x), rtol=0.05, atol=0.05 * float(np.abs(x).max()))
  [low] = fn.report.lowerings
  assert low.tpu is None and "not compiled" in str(fn.report)
