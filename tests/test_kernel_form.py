"""The kernel form (--equarx_form=kernel, quantize_kernel.py): two-shot's quantize, sum and
dequantize as Pallas kernels.

Run on the 8 CPU devices with --equarx_platform=tpu, so the kernels run in Pallas's
interpreter: the same kernel bodies that JAX lowers to Mosaic or Triton, as plain ops.
Their bits equal the tiled form's (which is itself checked against the model in
test_tiled_form.py), and without a rotation the NumPy model's.  The codec alone
(quantize_tiles) is checked against quantize.py's model on its hard values.  Lowered for
TPU and GPU the site calls the kernels' custom calls; with libtpu they compile for TPU.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from meshes import psum_program

import equarx_pass
from equarx_pass.emission import quantize as qz
from equarx_pass.emission import quantize_kernel
from equarx_pass.emission import scheme as scheme_lib
from equarx_pass.errors import FlagError

TPU_FORM = "--equarx_enable --equarx_min_bytes=0 --equarx_force --equarx_platform=tpu "
SCHEMES = ["", "--equarx_rotation=none --equarx_block_size=128"]
ALL_KERNELS = "kernel form (Pallas quantize + sum + dequantize, Pallas interpreter"


def kept(why: str) -> str:
  """The end of the report of a site that keeps the all-to-all and all-gather where the
  permuted exchange (the default) was asked for."""
  return f", all-to-all and all-gather: {why})"


@pytest.fixture(scope="module")
def values():
  """Per rank [64, 256]: whole (8, 128) tiles, with a loud block, an inf, a NaN, a zero
  block and exact halves (ties for the rounding)."""
  rng = np.random.default_rng(7)
  x = rng.standard_normal((8, 64, 256)).astype(np.float32)
  x[3, 2, :128] *= 300.0
  x[2, 9, 3] = np.inf
  x[1, 5, 7] = np.nan
  x[:, 40, :128] = 0.0
  x[4, 11, :128] = np.arange(128) - 63.5
  return x


def _psum(flags: str, x: np.ndarray, dtype) -> tuple[np.ndarray, str]:
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  fn = equarx_pass.jit(psum_program(mesh, "tp"), flags=TPU_FORM + flags)
  out = np.asarray(fn(jnp.asarray(x, dtype)).astype(jnp.float32))
  (record,) = fn.report.records
  assert record.rewritten, record.reason
  return out, record.reason


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
  np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
  np.testing.assert_array_equal(np.where(np.isnan(a), 0, a), np.where(np.isnan(b), 0, b))


def _lowered_psum(platform: str, dtype=jnp.bfloat16, devices: int = 4, rows: int = 64) -> str:
  """A psum of [rows, 1024] per device over `devices` CPU devices, lowered for `platform`."""
  mesh = Mesh(np.array(jax.devices()[:devices]), ("tp",))
  x = jax.ShapeDtypeStruct((devices * rows, 1024), dtype)
  return jax.jit(psum_program(mesh, "tp")).trace(x).lower(lowering_platforms=(platform,)).as_text()


def _kernel_form(text: str, flags: str):
  """equarx-opt's rewrite of `text` with the kernel form forced, and `flags`."""
  policy = equarx_pass.Policy.from_flags(
    "--equarx_enable --equarx_force --equarx_form=kernel " + flags
  )
  return equarx_pass.transform_text(text, policy)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_kernel_form_equals_tiled_form_bit_for_bit(scheme, dtype, values):
  tiled, tiled_reason = _psum(scheme + " --equarx_form=tiled", values, dtype)
  kernel, reason = _psum(scheme + " --equarx_form=kernel", values, dtype)
  assert tiled_reason.endswith("; tiled form")
  assert ALL_KERNELS in reason, reason
  _same_bits(kernel, tiled)
  assert np.isnan(kernel).any() and np.isfinite(kernel).mean() > 0.9


def test_kernel_form_under_an_explicit_mesh(values):
  # jax.set_mesh with explicit axes (jax.make_mesh's default), as flax's gemma runs: the
  # kernels are lowered with no mesh in scope, else JAX shards them over it.
  mesh = jax.make_mesh((8,), ("t",))
  x = jax.device_put(jnp.asarray(values, jnp.bfloat16), jax.NamedSharding(mesh, P("t")))
  outs = {}
  with jax.set_mesh(mesh):
    for form in ("tiled", "kernel"):
      fn = equarx_pass.jit(lambda a: jnp.sum(a, axis=0), flags=TPU_FORM + "--equarx_form=" + form)
      outs[form] = np.asarray(fn(x).astype(jnp.float32))
      (record,) = fn.report.records
  assert ALL_KERNELS in record.reason, record.reason
  _same_bits(outs["kernel"], outs["tiled"])
  quantize_kernel.sum_module.cache_clear()  # lowered here, not by an earlier test
  for platform in ("tpu", "cuda"):
    with jax.set_mesh(mesh):
      text = quantize_kernel.sum_module(platform, 8, 64 + (platform == "cuda") * 64)
    assert "sdy.mesh" not in text and "sharding_constraint" not in text


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_kernel_form_without_rotation_equals_model(dtype, values):
  scheme = SCHEMES[1]
  kernel, _ = _psum(scheme + " --equarx_form=kernel", values, dtype)
  inputs = np.asarray(jnp.asarray(values, dtype).astype(jnp.float32))
  policy = equarx_pass.Policy.from_flags(TPU_FORM + scheme)
  model = scheme_lib.reference([inputs[r].reshape(1, -1) for r in range(8)], policy.scheme)
  for r in range(8):
    got = kernel[r].reshape(1, -1)
    want = np.asarray(jnp.asarray(model[r], dtype).astype(jnp.float32))
    _same_bits(got, want)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_large_operand_in_parts_equals_the_tiled_form(scheme, dtype, monkeypatch):
  # Parts of 256 KiB: a [256, 1024] operand per rank goes through the kernels in 4 (f32)
  # or 2 (bf16) parts, each written into the result in place.
  monkeypatch.setattr(quantize_kernel, "PART_BYTES", 256 << 10)
  rng = np.random.default_rng(5)
  x = rng.standard_normal((8, 256, 1024)).astype(np.float32)
  x[2, 100, :128] *= 1e4
  x[6, 255, 1023] = np.inf
  tiled, _ = _psum(scheme + " --equarx_form=tiled", x, dtype)
  flags = scheme + " --equarx_form=kernel --equarx_kernel_exchange=collectives"
  kernel, reason = _psum(flags, x, dtype)
  parts = 4 if dtype == jnp.float32 else 2
  assert reason.endswith(f"Pallas interpreter, in {parts} parts)"), reason
  _same_bits(kernel, tiled)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_permuted_exchange_in_parts_equals_the_tiled_form(scheme, dtype, monkeypatch):
  # Parts of 512 KiB: a [512, 1024] operand per rank over 4 ranks goes through the
  # permuted exchange in 4 (f32) or 2 (bf16) parts of 4 chunks of 32 or 64 tiles.
  monkeypatch.setattr(quantize_kernel, "PART_BYTES", 512 << 10)
  rng = np.random.default_rng(7)
  x = rng.standard_normal((4, 512, 1024)).astype(np.float32)
  x[1, 300, :128] *= 1e4
  x[3, 511, 1023] = np.inf
  x[2, 17, 5] = np.nan
  mesh = Mesh(np.array(jax.devices()[:4]), ("tp",))
  outs, reasons = {}, {}
  for form in ("tiled", "kernel"):
    fn = equarx_pass.jit(psum_program(mesh, "tp"), flags=f"{TPU_FORM}{scheme} --equarx_form={form}")
    outs[form] = np.asarray(fn(jnp.asarray(x.reshape(-1, 1024), dtype)).astype(jnp.float32))
    (record,) = fn.report.records
    reasons[form] = record.reason
  parts = 4 if dtype == jnp.float32 else 2
  assert reasons["kernel"].endswith(f"interpreter, in {parts} parts, {PERMUTED.split(', ')[1]}")
  _same_bits(outs["kernel"], outs["tiled"])
  assert np.isnan(outs["kernel"]).any()


def test_permuted_parts_are_chained_and_written_in_place(monkeypatch):
  # 4 ranks of 256 tiles of bf16 in parts of 256 KiB: 2 parts of 4 chunks of 32 tiles.
  monkeypatch.setattr(quantize_kernel, "PART_BYTES", 256 << 10)
  result = _kernel_form(_lowered_psum("tpu", rows=256), "--equarx_platform=tpu --equarx_domains=1")
  reason = result.records[0].reason
  assert reason.endswith("Mosaic, in 2 parts, collective-permutes of packed chunks)"), reason
  text = result.text
  assert text.count('"stablehlo.collective_permute"') == 2 * 6
  calls = [line.strip() for line in text.splitlines() if "func.call @equarx_" in line]
  stages = [c.split("@equarx_")[1].split("_")[0] for c in calls]
  assert stages == (["quantize"] * 4 + ["sum"] + ["dequantize"] * 4) * 2
  # The second part's quantizes take the first part's values (an order, not an input);
  # its first dequantize writes into them.
  written = [c for c in calls if "@equarx_dequantize" in c][3].split(" = ")[0]
  for call in calls[9:13]:
    assert call.split("(")[1].split(")")[0].split(", ")[-1] == written
  assert calls[14].split("(")[1].split(")")[0].split(", ")[-1] == written


def test_parts_are_chained_and_written_in_place(monkeypatch):
  monkeypatch.setattr(quantize_kernel, "PART_BYTES", 256 << 10)
  result = _kernel_form(_lowered_psum("tpu", jnp.float32, rows=256), "--equarx_platform=tpu")
  assert result.records[0].reason.endswith(
    "(Pallas quantize + sum + dequantize, Mosaic, in 4 parts" + kept("links between domains")
  ), result.records[0].reason
  out = result.text
  calls = [line.strip() for line in out.splitlines() if "func.call @equarx_" in line]
  quantizes = [c for c in calls if "@equarx_quantize" in c]
  dequantizes = [c for c in calls if "@equarx_dequantize" in c]
  assert len(quantizes) == len(dequantizes) == 4
  # Part k's quantize takes what part k - 1's dequantize wrote (an order, not an input),
  # and part k's dequantize writes into it: its kernel's result aliases that operand.
  for k in range(1, 4):
    written = dequantizes[k - 1].split(" = ")[0]
    assert quantizes[k].split("(")[1].rstrip(")").split(", ")[-1].startswith(written)
    assert dequantizes[k].split("(")[1].split(")")[0].split(", ")[-1] == written
  assert out.count("output_operand_aliases") == 3


PERMUTED = "Pallas interpreter, collective-permutes of packed chunks)"


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("shape", [(256, 1024), (262144,)])
def test_the_permuted_exchange_equals_the_tiled_form_bit_for_bit(shape, scheme, dtype):
  # 4 ranks of 256 tiles: chunks of 64 tiles, the permuted exchange (a 2-D operand read
  # in its columns of tiles, a flat one in order).
  rng = np.random.default_rng(11)
  x = rng.standard_normal((4, *shape)).astype(np.float32)
  flat = x.reshape(4, -1)
  flat[1, 300:428] *= 1e4
  flat[2, 5000] = np.inf
  flat[3, 70000] = np.nan
  flat[0, 1024:1152] = 0.0
  mesh = Mesh(np.array(jax.devices()[:4]), ("tp",))
  outs, reasons = {}, {}
  for form in ("tiled", "kernel"):
    flags = f"{TPU_FORM}{scheme} --equarx_form={form} --equarx_kernel_exchange=permutes"
    fn = equarx_pass.jit(psum_program(mesh, "tp"), flags=flags)
    outs[form] = np.asarray(fn(jnp.asarray(x.reshape(-1, *shape[1:]), dtype)).astype(jnp.float32))
    (record,) = fn.report.records
    reasons[form] = record.reason
  assert reasons["kernel"].endswith(PERMUTED), reasons["kernel"]
  assert reasons["tiled"].endswith("; tiled form")
  _same_bits(outs["kernel"], outs["tiled"])
  assert np.isnan(outs["kernel"]).any() and np.isfinite(outs["kernel"]).mean() > 0.9


def test_the_permuted_exchange_sends_each_chunk_by_one_permute():
  # One slice: fast links only.  The permutes are the kernel form's default exchange.
  flags = "--equarx_platform=tpu --equarx_domains=1"
  result = _kernel_form(_lowered_psum("tpu", rows=256), flags)
  assert result.records[0].reason.endswith(
    "(Pallas quantize + sum + dequantize, Mosaic, collective-permutes of packed chunks)"
  ), result.records[0].reason
  text = result.text
  # 3 permutes each way over 4 devices, nothing else on the wire; a quantize and a
  # dequantize call a chunk, one sum, each dequantize after the first in place.
  assert text.count('"stablehlo.collective_permute"') == 6
  assert "all_to_all" not in text and "all_gather" not in text
  calls = [line for line in text.splitlines() if "func.call @equarx_" in line]
  stages = [c.split("@equarx_")[1].split("_")[0] for c in calls]
  assert stages == ["quantize"] * 4 + ["sum"] + ["dequantize"] * 4
  # Four kernels, not one a chunk (the chunk is their scalar operand): the quantize,
  # the sum, the dequantize that makes the values and the one that writes into them.
  callees = [c.split("func.call @")[1].split("(")[0] for c in calls]
  assert len(set(callees)) == 4, sorted(set(callees))
  assert len(set(callees[-3:])) == 1
  assert text.count("output_operand_aliases") == 1


@pytest.mark.parametrize(
  "platform,flags,ends",
  [
    # No scalar operands in Triton.
    (
      "cuda",
      "--equarx_platform=gpu --equarx_domains=1 --equarx_kernel_exchange=permutes",
      "Triton)",
    ),
    # Each device a domain of its own.
    ("tpu", "--equarx_platform=tpu", "Mosaic" + kept("links between domains")),
    # Asked for.
    (
      "tpu",
      "--equarx_platform=tpu --equarx_domains=1 --equarx_kernel_exchange=collectives",
      "Mosaic)",
    ),
  ],
)
def test_the_collectives_stay_on_gpu_across_domains_and_when_asked(platform, flags, ends):
  result = _kernel_form(_lowered_psum(platform, rows=256), flags)
  assert result.records[0].reason.endswith(ends), result.records[0].reason
  assert "collective_permute" not in result.text and "all_to_all" in result.text


def test_a_site_that_keeps_the_collectives_says_why():
  # One slice, steps of 8 tiles (bf16): the packed scales need steps of 32.
  text = _lowered_psum("tpu", rows=64)
  result = _kernel_form(text, "--equarx_platform=tpu --equarx_domains=1")
  ends = "Mosaic" + kept("steps of 8 tiles, not a multiple of 32")
  assert result.records[0].reason.endswith(ends), result.records[0].reason
  assert "collective_permute" not in result.text
  # Asked for, the collectives need no reason.
  flags = "--equarx_platform=tpu --equarx_domains=1 --equarx_kernel_exchange=collectives"
  assert _kernel_form(text, flags).records[0].reason.endswith("Mosaic)")


@pytest.mark.parametrize(
  "tiles,members,columns,why",
  [
    (256, 4, 0, ""),
    (256, 4, 8, ""),  # 32 tiles a column: steps of 32
    (64, 4, 0, "steps of 16 tiles"),
    (4096, 32, 0, "32 members, not 2 to 16"),
  ],
)
def test_where_the_permuted_exchange_applies(tiles, members, columns, why):
  got = quantize_kernel.permuted_why_not("tpu", tiles, members, columns)
  assert (why in got) if why else not got, got
  assert quantize_kernel.permuted_why_not("cuda", tiles, members, columns)


@pytest.mark.parametrize("scales_by_diagonal", [False, True])
def test_quantize_tiles_is_the_int8_model(scales_by_diagonal):
  rng = np.random.default_rng(3)
  y = rng.standard_normal((6, 8, 128)).astype(np.float32) * 10
  y[0, 0] = np.arange(128) - 63.5  # scale 0.5: every value a tie
  y[0, 1] = 0.0
  y[0, 2, 5] = np.inf
  y[0, 3, 9] = np.nan
  y[0, 4] = 1e-30  # a tiny scale: the reciprocal capped at FLT_MAX
  y[0, 5, :64] = -3e38
  codes, scales = jax.jit(lambda v: quantize_kernel.quantize_tiles(jnp, v, scales_by_diagonal))(y)
  want_codes, want_scales = qz.quantize(y.reshape(-1), 128)
  np.testing.assert_array_equal(np.asarray(codes).reshape(-1), want_codes)
  np.testing.assert_array_equal(np.asarray(scales).reshape(-1), want_scales)


@pytest.mark.parametrize(
  "flags,why",
  [
    ("--equarx_algorithm=ring --equarx_rotation=none", "the algorithm quantizes in its steps"),
    ("--equarx_format=int4 --equarx_block_size=128", "int8 with rounding to nearest only"),
    ("--equarx_rotation=none", "blocks of one 128-value row"),
    ("--equarx_rounding=stochastic", "not int8 with stochastic rounding"),
  ],
)
def test_sites_the_kernels_cannot_take_say_why(flags, why, values):
  _, reason = _psum(flags + " --equarx_form=kernel", values, jnp.float32)
  assert "; tiled form (no kernel: " in reason and why in reason, reason


def test_the_cpu_form_has_no_kernel(values):
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  flags = TPU_FORM.replace("tpu", "cpu") + "--equarx_form=kernel"
  fn = equarx_pass.jit(psum_program(mesh, "tp"), flags=flags)
  fn(values)
  (record,) = fn.report.records
  assert record.reason.endswith(
    "; tiled form (no kernel: the cpu form's rotation is the model's butterflies)"
  ), record.reason


def test_kernel_form_needs_a_tiled_scheme():
  with pytest.raises(FlagError, match="--equarx_form=kernel: "):
    equarx_pass.Policy.from_flags("--equarx_enable --equarx_form=kernel --equarx_block_layout=grid")


@pytest.mark.parametrize(
  "platform,form,call",
  [("tpu", "tpu", "@tpu_custom_call"), ("cuda", "gpu", "@__gpu$xla.gpu.triton")],
)
def test_lowered_for_a_device_the_site_calls_its_kernels(platform, form, call):
  result = _kernel_form(_lowered_psum(platform), f"--equarx_platform={form}")
  text = result.text
  where = {"tpu": "Mosaic", "gpu": "Triton"}[form]
  # Each CPU device a domain of its own: the permutes stay inside fast links.
  ends = f"kernel form (Pallas quantize + sum + dequantize, {where}"
  ends += kept("links between domains") if form == "tpu" else ")"
  assert result.records[0].reason.endswith(ends), result.records[0].reason
  assert text.count(f"stablehlo.custom_call {call}") == 3
  for stage in ("quantize", "sum", "dequantize"):
    assert f"func.call @equarx_{stage}_" in text
  # The rest of the site is the tiled form's exchanges.
  assert text.count('"stablehlo.all_to_all"') == 2 and text.count('"stablehlo.all_gather"') == 2


@pytest.mark.parametrize("platform,form", [("tpu", "tpu"), ("cuda", "gpu")])
def test_lowered_for_a_device_the_parts_alias_the_result(platform, form, monkeypatch):
  monkeypatch.setattr(quantize_kernel, "PART_BYTES", 64 << 10)
  result = _kernel_form(_lowered_psum(platform), f"--equarx_platform={form}")
  ends = " in 2 parts" + (kept("links between domains") if form == "tpu" else ")")
  assert result.records[0].reason.endswith(ends), result.records[0].reason
  # The second part's dequantize writes into the first's result.
  assert result.text.count("output_operand_aliases") == 1


def test_two_sites_share_one_function_per_kernel():
  mesh = Mesh(np.array(jax.devices()[:4]), ("tp",))

  def two(x, y):
    return jax.lax.psum(x, "tp"), jax.lax.psum(y, "tp")

  program = jax.jit(jax.shard_map(two, mesh=mesh, in_specs=(P("tp"), P("tp")), out_specs=P("tp")))
  x = jax.ShapeDtypeStruct((4 * 64, 1024), jnp.bfloat16)
  text = program.trace(x, x).lower(lowering_platforms=("tpu",)).as_text()
  out = _kernel_form(text, "--equarx_platform=tpu").text
  assert out.count("stablehlo.custom_call @tpu_custom_call") == 3
  assert out.count("func.call @equarx_quantize_") == 2


@pytest.mark.libtpu  # skipped without libtpu (pip install 'equarx-pass[tpu]')
@pytest.mark.parametrize("target", ["tpu:v5e:2x2", "tpu:v4:2x2x1"])
def test_the_kernels_compile_for_tpu(target):
  devices = 8 if target.startswith("tpu:v4") else 4
  text = _lowered_psum("tpu", devices=devices)
  result = _kernel_form(text, f"--equarx_compile_for={target}")
  assert "Mosaic" in result.records[0].reason
  # Mosaic compiles each kernel for the chip: a kernel it cannot build fails the compile.
  assert result.tpu.hlo_text.count('custom_call_target="tpu_custom_call"') == 3
  assert result.tpu.quantized_collectives >= 2


@pytest.mark.libtpu
@pytest.mark.parametrize("target", ["tpu:v5e:2x2", "tpu:v4:2x2x1"])
def test_the_permuted_kernels_compile_for_tpu(target):
  devices = 8 if target.startswith("tpu:v4") else 4
  text = _lowered_psum("tpu", devices=devices, rows=256)
  result = _kernel_form(text, f"--equarx_compile_for={target} --equarx_kernel_exchange=permutes")
  assert "collective-permutes of packed chunks" in result.records[0].reason
  hlo = result.tpu.hlo_text
  assert hlo.count('custom_call_target="tpu_custom_call"') == 2 * devices + 1
  assert "all-to-all" not in hlo and "all-gather" not in hlo


@pytest.mark.libtpu
@pytest.mark.parametrize(
  "exchange,ends,kernels",
  [("collectives", "in 2 parts)", 6), ("permutes", "in 2 parts, " + PERMUTED.split(", ")[1], 18)],
)
def test_parts_compile_for_tpu(monkeypatch, exchange, ends, kernels):
  monkeypatch.setattr(quantize_kernel, "PART_BYTES", 256 << 10)
  flags = f"--equarx_compile_for=tpu:v5e:2x2 --equarx_kernel_exchange={exchange}"
  result = _kernel_form(_lowered_psum("tpu", rows=256), flags)
  reason = result.records[0].reason
  assert reason.endswith("Mosaic, " + ends), reason
  assert result.tpu.hlo_text.count('custom_call_target="tpu_custom_call"') == kernels
  # Nothing copies the operand or the result for the parts written in place.
  copies = [
    line
    for line in result.tpu.hlo_text.splitlines()
    if " copy(" in line and "bf16[256,1024]" in line.split("=")[1]
  ]
  assert not copies, copies


def _predicted_speedup(values: int, form: str) -> float:
  mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
  program = jax.jit(
    jax.shard_map(lambda v: jax.lax.psum(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  )
  module = str(program.lower(jax.ShapeDtypeStruct((4 * values,), jnp.float32)).as_text())
  flags = TPU_FORM + f"--equarx_form={form}"
  (record,) = equarx_pass.transform_text(module, equarx_pass.Policy.from_flags(flags)).records
  assert record.rewritten and record.speedup is not None, record.reason
  return record.speedup


def test_a_site_the_kernels_decline_is_priced_as_the_tiled_form():
  # 256 values a device: chunks below one tile of (8, 128), which the kernels decline.
  small = _predicted_speedup(256, "kernel")
  assert small == _predicted_speedup(256, "tiled")
  # 1 Mi values: the kernels take it, at their own (lower) on-chip figure.
  assert _predicted_speedup(1 << 20, "kernel") > _predicted_speedup(1 << 20, "tiled")
