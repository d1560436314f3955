"""The tiled forms (forms.TiledSite, the default on every platform) equal the two-shot
and ring models.

Run on the 8 CPU devices.  On CPU the forward rotation is the model's butterflies, so
every tiled scheme equals scheme.reference bit for bit.  With --equarx_platform=tpu the
forward rotation is a matmul whose rounding differs from the butterflies: there the
test says so and checks the error against the float64 sum instead, and that every rank
holds the same bits (the inverse rotation runs on the codes, exactly).  Without a
rotation both platforms' forms equal the model bit for bit.
"""

import jax
import numpy as np
import pytest
from jax.extend.mlir import ir
from jax.sharding import Mesh
from meshes import psum_program

import equarx_pass
from equarx_pass import _jax_private
from equarx_pass.emission import scheme as scheme_lib
from equarx_pass.ir import traverse
from equarx_pass.planning.policy import Policy

TILED = "--equarx_enable --equarx_min_bytes=0 --equarx_force --equarx_platform=tpu "
EXACT = [
  "--equarx_rotation=none",
  "--equarx_rotation=none --equarx_block_size=256",
  "--equarx_rotation=none --equarx_block_size=2048",
  "--equarx_rotation=none --equarx_block_size=128",
  "--equarx_rotation=none --equarx_block_size=64",  # lanes = the block
  "--equarx_rotation=none --equarx_format=fp8_e4m3",
  "--equarx_rotation=none --equarx_format=mxint8",
  "--equarx_algorithm=ring --equarx_rotation=none --equarx_format=mxint8",
  "--equarx_algorithm=ring --equarx_rotation=none",
  "--equarx_algorithm=ring --equarx_rotation=none --equarx_block_size=128",
  # int4: the halves of each block's rows (S even) or lanes (S = 1) share the bytes.
  "--equarx_algorithm=ring --equarx_rotation=none --equarx_format=int4",
  "--equarx_algorithm=ring --equarx_rotation=none --equarx_format=int4 --equarx_block_size=128",
  "--equarx_rotation=none --equarx_format=int4 --equarx_block_size=256",
  "--equarx_algorithm=one_shot --equarx_rotation=none",
  "--equarx_algorithm=one_shot --equarx_rotation=none --equarx_format=fp8_e4m3",
]
ROTATED = [
  "",
  "--equarx_format=mxint8",
  "--equarx_block_size=128 --equarx_rotation_size=128",
  "--equarx_algorithm=ring --equarx_rotation=hadamard",
  "--equarx_algorithm=one_shot",
  "--equarx_algorithm=one_shot --equarx_format=int4 --equarx_block_size=128",
  "--equarx_algorithm=ring --equarx_format=int4 --equarx_block_size=128 --equarx_rotation=hadamard",
]


@pytest.fixture(scope="module")
def inputs():
  rng = np.random.default_rng(11)
  return rng.standard_normal((8, 6000)).astype(np.float32)


def _run(flags, inputs):
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  fn = equarx_pass.jit(psum_program(mesh, "tp"), flags=TILED + flags)
  out = np.asarray(fn(inputs))
  (record,) = fn.report.records
  assert record.rewritten and record.reason.endswith("tiled form"), record.reason
  return fn, out


@pytest.mark.parametrize("flags", EXACT)
def test_tiled_equals_model_bit_for_bit(flags, inputs):
  fn, out = _run(flags, inputs)
  model = scheme_lib.reference([inputs[i : i + 1] for i in range(8)], fn.policy.scheme)
  for r in range(8):
    np.testing.assert_array_equal(out[r], model[r][0], err_msg=f"rank {r}")


@pytest.mark.parametrize("flags", ROTATED)
def test_tiled_rotation_on_cpu_equals_model_bit_for_bit(flags, inputs):
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  fn = equarx_pass.jit(psum_program(mesh, "tp"), flags=TILED.replace("tpu", "cpu") + flags)
  out = np.asarray(fn(inputs))
  (record,) = fn.report.records
  assert record.reason.endswith("tiled form"), record.reason
  model = scheme_lib.reference([inputs[i : i + 1] for i in range(8)], fn.policy.scheme)
  for r in range(8):
    np.testing.assert_array_equal(out[r], model[r][0], err_msg=f"rank {r}")


@pytest.mark.parametrize("flags", ROTATED)
def test_tiled_rotation_same_bits_on_every_rank_and_accurate(flags, inputs):
  fn, out = _run(flags, inputs)
  for r in range(8):
    np.testing.assert_array_equal(out[r], out[0])
  exact = inputs.astype(np.float64).sum(0)
  model = scheme_lib.reference([inputs[i : i + 1] for i in range(8)], fn.policy.scheme)[0][0]
  err = np.linalg.norm(out[0] - exact) / np.linalg.norm(exact)
  model_err = np.linalg.norm(model - exact) / np.linalg.norm(exact)
  # Not bit for bit (the forward rotation rounds in another order), but as accurate.
  assert err < 1.1 * model_err + 1e-6, (err, model_err)


def test_tiled_form_has_no_loop_and_no_packed_scales(inputs):
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  fn = equarx_pass.jit(psum_program(mesh, "tp"), flags=TILED)
  module = ir.Module.parse(
    fn.lower(inputs).as_text(dialect="stablehlo"), context=_jax_private.make_ir_context()
  )
  names = [op.name for op in traverse.walk(module.operation)]
  assert "stablehlo.while" not in names and "stablehlo.bitcast_convert" not in names
  assert names.count("stablehlo.all_to_all") == 2 and names.count("stablehlo.all_gather") == 2
  assert names.count("stablehlo.dot_general") == 2  # forward and inverse rotation


@pytest.mark.parametrize(
  "flags,why",
  [
    ("--equarx_algorithm=bidirectional", "bidirectional is emitted flat"),
    ("--equarx_algorithm=ring --equarx_microshards=2", "microshards are emitted flat"),
    ("--equarx_block_layout=grid", "the grid layout is emitted flat"),
  ],
)
def test_schemes_without_a_tiled_form_say_so(flags, why, inputs):
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  fn = equarx_pass.jit(psum_program(mesh, "tp"), flags=TILED + flags)
  fn(inputs)
  reason = fn.report.records[0].reason
  assert "; flat form (" in reason and reason.endswith(why + ")"), reason
  with pytest.raises(equarx_pass.FlagError, match=why):
    Policy.from_flags("--equarx_form=tiled " + flags)


def test_platform_choice():
  policy = Policy()
  assert policy.target_platform("cpu") == "cpu"
  assert policy.target_platform("tpu") == "tpu"
  assert policy.target_platform("cuda") == "gpu"
  assert policy.target_platform(None) == "cpu"
  assert policy.replace(compile_for="tpu:v5e:2x2").target_platform(None) == "tpu"
  assert policy.replace(platform="gpu").target_platform("cpu") == "gpu"
  assert policy.scheme.flat_only() is None


def test_defaults_of_the_forms():
  # Tiled, rotating: one scale per rotated row of 128.
  policy = Policy.from_flags("--equarx_enable")
  assert (policy.scheme.block_size, policy.scheme.rotation_size) == (128, 128)
  assert policy.resolved()[1] is None
  # Flat: blocks of 1024 and the largest rotation dividing them.
  flat = Policy.from_flags("--equarx_enable --equarx_form=flat")
  assert flat.scheme.block_size == 1024 and flat.scheme.resolved_rotation_size == 1024
  assert flat.resolved()[1] == "--equarx_form=flat"
  # Explicit flags win; without a rotation the block is 1024.
  assert Policy.from_flags("--equarx_block_size=512").scheme.block_size == 512
  assert Policy.from_flags("--equarx_block_size=512").scheme.rotation_size == 128
  assert Policy.from_flags("--equarx_rotation_size=256").scheme.block_size == 256
  assert Policy.from_flags("--equarx_rotation=none").scheme.block_size == 1024


@pytest.mark.parametrize("algorithm", ["two_shot", "ring", "one_shot"])
@pytest.mark.parametrize("block", [128, 1024])
def test_tiled_equals_model_subgroups_bf16(block, algorithm, inputs):
  """2x4 mesh, groups of 4, bf16 in and out."""
  mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("dp", "tp"))
  x = inputs.astype(jax.numpy.bfloat16)
  fn = equarx_pass.jit(
    psum_program(mesh, "tp"),
    flags=TILED + f"--equarx_rotation=none --equarx_block_size={block} "
    f"--equarx_algorithm={algorithm}",
  )
  out = np.asarray(fn(x))
  for group in range(2):
    ranks = range(4 * group, 4 * group + 4)
    model = scheme_lib.reference([x[r : r + 1] for r in ranks], fn.policy.scheme)
    for i, r in enumerate(ranks):
      np.testing.assert_array_equal(out[r], model[i][0], err_msg=f"rank {r}")


@pytest.mark.parametrize(
  "flags",
  [
    "--equarx_rotation=none",
    "--equarx_algorithm=ring --equarx_rotation=none",
    "--equarx_algorithm=one_shot",
    "",  # the default, its forward rotation a matmul (TPU's)
  ],
)
def test_large_groups_loop_with_the_same_bits(monkeypatch, inputs, flags):
  """From LOOP_FROM_MEMBERS members on, the steps that repeat per member are a loop
  (the emitted size stays the same whatever the group); lowered here to 4 so that the 8
  CPU devices run the loop form: the model's bits, as written out."""
  from equarx_pass.emission.algorithms import one_shot, ring, two_shot

  written = _run(flags, inputs)[1]
  monkeypatch.setattr(two_shot, "LOOP_FROM_MEMBERS", 4)
  monkeypatch.setattr(ring, "LOOP_FROM_MEMBERS", 4)
  monkeypatch.setattr(one_shot, "LOOP_FROM_MEMBERS", 4)
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  fn = equarx_pass.jit(psum_program(mesh, "tp"), flags=TILED + flags)
  looped = np.asarray(fn(inputs))
  assert "stablehlo.while" in fn.lower(inputs).as_text()
  np.testing.assert_array_equal(looped, written)


@pytest.mark.parametrize("flags", ["", "--equarx_algorithm=ring --equarx_rotation=none"])
def test_packed_and_separate_scales_give_the_same_bits(flags, inputs):
  """On CPU the codes and scales of a small site travel in one payload per collective
  (TiledSite.exchange); from --equarx_unroll_min_bytes on, each on its own: the same bits,
  half the collectives."""
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  cpu = TILED.replace("tpu", "cpu") + flags
  packed = equarx_pass.jit(psum_program(mesh, "tp"), flags=cpu)
  separate = equarx_pass.jit(psum_program(mesh, "tp"), flags=cpu + " --equarx_unroll_min_bytes=0")
  np.testing.assert_array_equal(np.asarray(packed(inputs)), np.asarray(separate(inputs)))

  def collectives(fn):
    text = fn.lower(inputs).as_text()
    return sum(
      text.count(f"stablehlo.{op}") for op in ("all_to_all", "all_gather", "collective_permute")
    )

  assert 2 * collectives(packed) == collectives(separate)
