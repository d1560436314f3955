"""equarx-opt's outputs run: jax.export artifacts in and out, and HLO text for XLA's tools.

An artifact goes export -> equarx-opt -> jax.export.deserialize -> call, and the call
must equal equarx_pass.jit of the same function bit for bit (the quantized program),
and with --equarx_identity plain jax.jit bit for bit, for shard_map psums, a flax model
sharded by jax.jit (whose all-reduces the SPMD partitioner inserts: the CLI compiles the
artifact on CPU devices to reach them), and functions of several inputs, outputs and
shardings.  The HLO output parses in XLA's HLO parser and computes what
the StableHLO output computes.  Artifacts that cannot be rewritten faithfully are
refused with the reason, and nothing is written.
"""

import dataclasses
import os
import subprocess
import sys

import jax
import numpy as np
import programs
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax_startup import without_jax_startup
from run_module import run_per_device

import equarx_pass
from equarx_pass import _jax_private
from equarx_pass.ir import parse

ENV = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
ENV.pop("EQUARX_FLAGS", None)
ENV.pop("XLA_FLAGS", None)  # the CLI starts as many CPU devices as an artifact names
QUANTIZED = "--equarx_enable --equarx_min_bytes=0"
IDENTITY = "--equarx_enable --equarx_min_bytes=0 --equarx_force --equarx_identity"
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hlo_fixtures")


def equarx_opt(*commands: list, text: bool = True) -> list[subprocess.CompletedProcess]:
  """Run equarx-opt once per argument list, side by side (each spends its time starting
  JAX); return their results in order."""
  procs = [
    subprocess.Popen(
      [sys.executable, "-m", "equarx_pass.frontends.cli", *map(str, args)],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=text,
      env=ENV,
    )
    for args in commands
  ]
  done = []
  for proc in procs:
    out, err = proc.communicate(timeout=300)
    if text:
      err = without_jax_startup(err)
    done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
  return done


def flags_of(flags: str) -> list[str]:
  """The command-line flags of a flag string (the CLI enables the pass itself)."""
  return [f for f in flags.split() if f != "--equarx_enable"]


def shard_map_psum() -> programs.Program:
  mesh = programs.mesh_1d()
  f = jax.shard_map(lambda x: jax.lax.psum(x, "tp"), mesh=mesh, in_specs=P("tp"), out_specs=P())
  x = np.random.default_rng(40).standard_normal((64, 4096), np.float32)
  return programs.Program(
    "shard_map_psum", f, lambda: (programs.put(mesh, x, "tp"),), "a psum", lowered=True
  )


CORPUS = {p.name: p for p in programs.corpus()}


def flax_lm_apply() -> programs.Program:
  """The corpus's flax LM (jax.jit + NamedSharding through flax's logical partitioning:
  no psum in the program), its parameters unboxed as one exports them: flax's
  LogicallyPartitioned boxes are pytree nodes that jax.export cannot serialize."""
  import flax.linen as nn

  prog = CORPUS["flax_lm_apply"]

  def make_args():
    variables, ids = prog.make_args()
    return nn.unbox(variables), ids

  return dataclasses.replace(prog, make_args=make_args)


PROGRAMS = {
  "flax_lm_apply": flax_lm_apply,
  # shard_map psums, with several inputs and outputs sharded differently over a 2x4 mesh
  # (one psum over tp within each dp row, one over both axes)...
  "psum_2d_mesh_sub_axis": lambda: CORPUS["psum_2d_mesh_sub_axis"],
  # ... and a pytree of outputs with shardings of their own (auto-sharded).
  "pytree_outputs": lambda: CORPUS["pytree_outputs"],
}


def export(prog: programs.Program, args, path, **export_kwargs):
  exp = jax.export.export(jax.jit(prog.fn, **prog.jit_kwargs), **export_kwargs)(*args)
  path.write_bytes(exp.serialize())
  return exp


def assert_same_artifact(got: bytes, want: bytes, same_module: bool):
  """Every field of the artifact `got` is `want`'s, and its module is or is not the same."""
  got_exp = jax.export.deserialize(bytearray(got))
  want_exp = jax.export.deserialize(bytearray(want))
  for field in dataclasses.fields(want_exp):
    if field.name not in ("mlir_module_serialized", "_get_vjp"):
      assert getattr(got_exp, field.name) == getattr(want_exp, field.name), field.name
  assert got_exp.has_vjp() == want_exp.has_vjp()
  same = got_exp.mlir_module_serialized == want_exp.mlir_module_serialized
  assert same == same_module


def assert_bits(got, want, what: str):
  """Same tree, and per leaf the same dtype, shape, placement and bits on every device.

  Shardings are compared by the devices and indices they give each shard: JAX can write
  one placement as two specs (P() and P(None,))."""
  got_leaves, got_tree = jax.tree_util.tree_flatten(got)
  want_leaves, want_tree = jax.tree_util.tree_flatten(want)
  assert got_tree == want_tree, what
  for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
    where = f"{what}, leaf {i}"
    assert (g.dtype, g.shape) == (w.dtype, w.shape), where
    assert g.sharding.is_equivalent_to(w.sharding, w.ndim), (where, g.sharding, w.sharding)
    np.testing.assert_array_equal(bits(g), bits(w), err_msg=where)
    by_device = lambda a: sorted(a.addressable_shards, key=lambda s: s.device.id)  # noqa: E731
    for a, b in zip(by_device(g), by_device(w)):
      assert a.index == b.index, (where, a.device)
      np.testing.assert_array_equal(bits(a.data), bits(b.data), err_msg=f"{where}, {a.device}")


def bits(array) -> np.ndarray:
  return programs._bits(np.asarray(array))


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_round_trip_runs_the_rewritten_program(name, tmp_path):
  """export -> equarx-opt -> deserialize -> call: equarx_pass.jit's program bit for bit,
  and with --equarx_identity plain jax.jit's."""
  prog = PROGRAMS[name]()
  src = tmp_path / f"{name}.exported"
  export(prog, prog.make_args(), src)
  before = src.read_bytes()
  outs = {flags: tmp_path / f"{name}.{i}.exported" for i, flags in enumerate((QUANTIZED, IDENTITY))}
  procs = equarx_opt(*[[src, "-o", out, "--report", *flags_of(f)] for f, out in outs.items()])
  for proc in procs:
    assert proc.returncode == 0, proc.stderr
    route = "main: pass" if prog.lowered else "main: partitioned program"
    assert route in proc.stdout, proc.stdout
    assert " 0 of " not in proc.stdout, proc.stdout  # a site was rewritten: not vacuous
  assert src.read_bytes() == before
  runs = {flags: jax.export.deserialize(bytearray(out.read_bytes())) for flags, out in outs.items()}
  quantized = runs[QUANTIZED]
  assert_same_artifact(outs[QUANTIZED].read_bytes(), before, same_module=False)

  want = equarx_pass.jit(prog.fn, flags=QUANTIZED, **prog.jit_kwargs)(*prog.make_args())
  assert_bits(quantized.call(*prog.make_args()), want, f"{name}: equarx_pass.jit")
  plain = jax.jit(prog.fn, **prog.jit_kwargs)(*prog.make_args())
  assert_bits(runs[IDENTITY].call(*prog.make_args()), plain, f"{name}: identity vs jax.jit")
  # The quantized program is not the plain one (else the first comparison proves nothing).
  assert programs.relative_error(want, plain) > 0


def test_artifact_to_standard_output_and_its_vjp(tmp_path):
  """An artifact serialized with its VJP: both modules are rewritten (the VJP's psum is
  the one of the replicated input's gradient), each listed in the report, and the
  gradient runs through the rewritten VJP."""
  prog = CORPUS["psum_mlp_constants"]
  args = prog.make_args()
  src = tmp_path / "mlp_vjp.exported"
  src.write_bytes(jax.export.export(jax.jit(prog.fn))(*args).serialize(vjp_order=1))
  (proc,) = equarx_opt([src, "--report", "--equarx_min_bytes=0"], text=False)
  assert proc.returncode == 0, proc.stderr.decode()
  report = proc.stderr.decode()
  assert "main: pass" in report and "vjp: pass" in report, report
  assert report.count("1 of 1 all-reduce sites rewritten") == 2, report
  rewritten = jax.export.deserialize(bytearray(proc.stdout))
  assert rewritten.has_vjp() and not rewritten.vjp().has_vjp()

  def loss(call):
    return lambda *a: (call(*a) ** 2).sum()

  grads = jax.jit(jax.grad(loss(rewritten.call), argnums=(0, 1, 2)))(*args)
  want = jax.jit(jax.grad(loss(prog.fn), argnums=(0, 1, 2)))(*args)
  assert 0 < programs.relative_error(grads, want) < 2e-2


def test_hlo_output_parses_and_computes_the_stablehlo_outputs_result(tmp_path):
  """An XLA dump in, HLO text out (by suffix): XLA's parser reads it, it keeps the device
  count, and compiled on CPU devices it gives the StableHLO output's bits."""
  dump = os.path.join(FIXTURES, "tp_mlp_f32.before_optimizations.txt")
  names = ("out.hlo", "out.mlir")
  for proc in equarx_opt(*[[dump, "-o", tmp_path / n, "--equarx_min_bytes=0"] for n in names]):
    assert proc.returncode == 0, proc.stderr
  outputs = {name: (tmp_path / name).read_text() for name in names}
  hlo = outputs["out.hlo"]
  assert hlo.startswith("HloModule jit_tp_mlp_dumped, num_partitions=8,")
  assert "all-to-all" in hlo and "all-reduce(" not in hlo
  assert "{...}" not in hlo  # every constant written out
  _jax_private.hlo_text_to_proto(hlo)  # XLA's own HLO parser
  from_hlo = parse.parse_bytes(hlo, "out.hlo")
  from_mlir = parse.parse_bytes(outputs["out.mlir"], "out.mlir")
  assert from_hlo.kind == "hlo-text"

  # The program's per-device arguments: x replicated, the weights split over 8 devices.
  rng = np.random.default_rng(5)
  x = rng.standard_normal((64, 512), np.float32)
  w_up = rng.standard_normal((512, 1024), np.float32) / 23
  w_down = rng.standard_normal((1024, 512), np.float32) / 32
  inputs = [
    np.stack([x] * 8),
    np.stack(np.split(w_up, 8, axis=1)),
    np.stack(np.split(w_down, 8, axis=0)),
  ]
  (got,) = run_per_device(from_hlo.module, inputs)
  (want,) = run_per_device(from_mlir.module, inputs)
  assert got.shape == (8, 64, 512)
  np.testing.assert_array_equal(got, want)
  (plain,) = run_per_device(parse.parse_file(dump).module, inputs)
  assert 0 < programs.relative_error(got, plain) < 2e-2  # quantized, and close


def test_hlo_output_of_an_artifact_by_flag(tmp_path):
  prog = shard_map_psum()
  src = tmp_path / "psum.exported"
  export(prog, prog.make_args(), src)
  (proc,) = equarx_opt([src, "--output_format=hlo", "--equarx_min_bytes=0"])
  assert proc.returncode == 0, proc.stderr
  first = proc.stdout.splitlines()[0]
  assert first.startswith("HloModule jit_") and "num_partitions=8" in first
  _jax_private.hlo_text_to_proto(proc.stdout)


# --- refused, with the reason, nothing written -----------------------------------------


def refused(proc, src, out) -> str:
  """The refusal's message, after checking that it is one and wrote nothing."""
  assert proc.returncode == 2, (proc.stdout, proc.stderr)
  assert proc.stderr.startswith(f"equarx-opt: error: {src}") or "--output_format" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert not out.exists()
  return proc.stderr


def test_refused_platforms(tmp_path):
  prog = shard_map_psum()
  args = prog.make_args()
  multi = tmp_path / "multi.exported"
  export(prog, args, multi, platforms=("cpu", "tpu"))
  exp = jax.export.export(jax.jit(prog.fn))(*args)
  unknown = tmp_path / "unknown.exported"
  unknown.write_bytes(dataclasses.replace(exp, platforms=("metal",)).serialize())
  out, told = tmp_path / "out.exported", tmp_path / "multi.q.exported"
  multi_refused, multi_told, unknown_refused = equarx_opt(
    [multi, "-o", out],
    [multi, "-o", told, "--equarx_platform=cpu", "--equarx_min_bytes=0"],
    [unknown, "-o", out],
  )
  message = refused(multi_refused, multi, out)
  assert "exported for cpu, tpu, whose forms differ" in message
  assert "--equarx_platform" in message
  message = refused(unknown_refused, unknown, out)
  assert "exported for metal; the pass emits its forms for cpu, cuda, rocm, tpu only" in message
  # Told which form to emit, it is rewritten; the CPU half still runs here.
  assert multi_told.returncode == 0, multi_told.stderr
  got = jax.export.deserialize(bytearray(told.read_bytes())).call(*args)
  assert 0 < programs.relative_error(got, prog.fn(*args)) < 2e-2


def test_auto_sharded_artifact_the_route_cannot_compile(tmp_path):
  """An auto-sharded artifact for a TPU: its all-reduces appear only when a TPU compiles
  it, so it is refused with the reason and the ways on; told off, it is written back."""
  mesh = programs.mesh_1d()
  args = programs.mlp_args(mesh, seed=41)
  src = tmp_path / "tpu.exported"
  src.write_bytes(jax.export.export(jax.jit(programs.mlp), platforms=("tpu",))(*args).serialize())
  out, off = tmp_path / "out.exported", tmp_path / "off.exported"
  auto, told = equarx_opt(
    [src, "-o", out], [src, "-o", off, "--equarx_partitioned=off", "--report"]
  )
  message = refused(auto, src, out)
  assert "holds no all-reduce of its own: an auto-sharded program" in message, message
  assert "it is exported for tpu, and the route compiles on CPU devices" in message
  assert "--equarx_partitioned=off" in message and "equarx_pass.jit" in message
  assert told.returncode == 0, told.stderr
  assert "no collective site in the program" in told.stdout
  assert "not considered: the collectives XLA's SPMD partitioner inserts" in told.stdout
  assert_same_artifact(off.read_bytes(), src.read_bytes(), same_module=True)


def test_corrupted_artifacts_and_wrong_formats(tmp_path):
  prog = shard_map_psum()
  good = tmp_path / "good.exported"
  export(prog, prog.make_args(), good)
  data = good.read_bytes()
  bad = {"truncated": data[: len(data) // 2], "zeroed": bytes(64) + data[64:]}
  for name, content in bad.items():
    (tmp_path / f"{name}.exported").write_bytes(content)
  mlir = tmp_path / "psum.mlir"
  mlir.write_text(jax.jit(prog.fn).lower(*prog.make_args()).as_text())
  out = tmp_path / "out.bin"
  procs = equarx_opt(
    *[[tmp_path / f"{name}.exported", "-o", out] for name in bad],
    [mlir, "-o", out, "--output_format=exported"],
    [mlir, "-o", out, "--output_format=proto"],
  )
  for name, proc in zip(bad, procs):
    message = refused(proc, tmp_path / f"{name}.exported", out)
    assert "jax.export artifact" in message or "MLIR" in message, message
    assert (tmp_path / f"{name}.exported").read_bytes() == bad[name]
  message = refused(procs[2], mlir, out)
  assert "--output_format=exported needs a jax.export artifact as input" in message
  message = refused(procs[3], mlir, out)
  assert "--output_format must be one of auto, stablehlo, hlo, exported" in message


def test_library_needs_the_devices_an_auto_sharded_artifact_names(tmp_path):
  """In a process with fewer CPU devices than the artifact names, the library says how
  many it needs; it does not start JAX's backends itself."""
  mesh = jax.make_mesh((4,), ("tp",), (programs.AUTO,), devices=jax.devices()[:4])
  exp = jax.export.export(jax.jit(programs.mlp))(*programs.mlp_args(mesh, seed=42))
  assert exp.nr_devices == 4
  data = bytes(exp.serialize())
  result = equarx_pass.transform_text(data, equarx_pass.Policy.from_flags(QUANTIZED), "a.bin")
  assert result.parts[0].route == "partitioned" and result.records[0].rewritten
  mesh2 = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("dp", "tp"))
  args = programs.mlp_args(mesh2, seed=43, x_spec=("dp",))
  exp = jax.export.export(jax.jit(programs.mlp, out_shardings=NamedSharding(mesh2, P("dp"))))(*args)
  exp16 = dataclasses.replace(exp, nr_devices=16)
  with pytest.raises(equarx_pass.RewriteError, match="this process has 8 CPU devices"):
    equarx_pass.transform_text(
      bytes(exp16.serialize()), equarx_pass.Policy.from_flags(QUANTIZED), "a.bin"
    )
