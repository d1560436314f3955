"""equarx-opt end to end, as a user runs it: exit codes, messages, files written or not."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from jax_startup import without_jax_startup

import equarx_pass
from equarx_pass.report import fmt_bytes

ENV = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
ENV.pop("EQUARX_FLAGS", None)


def equarx_opt(*args, env=None):
  proc = subprocess.run(
    [sys.executable, "-m", "equarx_pass.frontends.cli", *map(str, args)],
    capture_output=True,
    text=True,
    env=env or ENV,
    timeout=300,
  )
  proc.stderr = without_jax_startup(proc.stderr)
  return proc


# The MLP's psum is 64 KiB, below the default threshold.
SMALL = "--equarx_min_bytes=65536"


@pytest.fixture(scope="module")
def mlp_mlir(tmp_path_factory):
  """A TP MLP's StableHLO, as `jitted.lower(...).as_text()` gives it."""
  mesh = Mesh(np.array(jax.devices()), ("tp",))

  def mlp(x, w1, w2):
    return jax.lax.psum(jax.nn.relu(x @ w1) @ w2, "tp")

  f = jax.jit(
    jax.shard_map(mlp, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P())
  )
  args = (
    jax.ShapeDtypeStruct((64, 256), np.float32),
    jax.ShapeDtypeStruct((256, 1024), np.float32),
    jax.ShapeDtypeStruct((1024, 256), np.float32),
  )
  path = tmp_path_factory.mktemp("in") / "mlp.mlir"
  path.write_text(f.lower(*args).as_text(debug_info=True))
  return path


def test_rewrites_and_reports(mlp_mlir, tmp_path):
  out = tmp_path / "out.mlir"
  before = mlp_mlir.read_bytes()
  proc = equarx_opt(mlp_mlir, "-o", out, "--report", SMALL)
  assert proc.returncode == 0, proc.stderr
  assert "1 of 1 all-reduce sites rewritten" in proc.stdout
  # The default scheme: int8 two-shot with a Hadamard rotation.
  assert (
    "rewritten" in proc.stdout
    and "int8 two_shot, block 128, hadamard 128; tiled form" in proc.stdout
  )
  text = out.read_text()
  assert "stablehlo.all_reduce" not in text
  assert "stablehlo.all_to_all" in text and "stablehlo.all_gather" in text
  # The output parses and verifies, and the input is untouched.
  equarx_pass.parse_bytes(text, str(out))
  assert mlp_mlir.read_bytes() == before


def test_stdout_when_no_output(mlp_mlir):
  proc = equarx_opt(
    mlp_mlir, "--equarx_block_size=256", "--equarx_algorithm=ring", "--equarx_force", SMALL
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.startswith("module @jit_mlp")
  assert "collective_permute" in proc.stdout


def test_flags_select_nothing(mlp_mlir, tmp_path):
  out = tmp_path / "out.mlir"
  proc = equarx_opt(mlp_mlir, "-o", out, "--report", "--equarx_dtypes=bf16")
  assert proc.returncode == 0, proc.stderr
  assert "0 of 1 all-reduce sites rewritten" in proc.stdout
  assert "element type f32 not in --equarx_dtypes=bf16" in proc.stdout
  assert "stablehlo.all_reduce" in out.read_text()


def test_env_flags_then_command_line(mlp_mlir, tmp_path):
  out = tmp_path / "out.mlir"
  env = dict(ENV, EQUARX_FLAGS="--equarx_min_bytes=1000000000")
  proc = equarx_opt(mlp_mlir, "-o", out, "--report", env=env)
  assert "0 of 1" in proc.stdout and "--equarx_min_bytes=1000000000" in proc.stdout
  proc = equarx_opt(mlp_mlir, "-o", out, "--report", "--equarx_min_bytes=0", env=env)
  assert "1 of 1" in proc.stdout


BAD_INPUTS = {
  "empty.mlir": (b"", "empty input"),
  "junk.bin": (
    bytes(range(256)) * 4,
    "neither MLIR bytecode, a jax.export artifact nor UTF-8 text",
  ),
  "garbled.mlir": (
    b"module {\n  func.func @f() {\n    %0 = stablehlo.bogus\n  }\n}\n",
    "garbled.mlir:3:",
  ),
  "unrelated.mlir": (b"module {\n  llvm.func @f() {\n    llvm.return\n  }\n}\n", "unrelated.mlir"),
  "bad_hlo.txt": (
    b"HloModule m\n\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT r = f32[2] bogus(p)\n}\n",
    "bad_hlo.txt:5:",
  ),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_exits_2_and_writes_nothing(name, tmp_path):
  data, expected = BAD_INPUTS[name]
  src = tmp_path / name
  src.write_bytes(data)
  out = tmp_path / "out.mlir"
  proc = equarx_opt(src, "-o", out)
  assert proc.returncode == 2, (proc.stdout, proc.stderr)
  assert expected in proc.stderr
  assert proc.stderr.startswith("equarx-opt: error: ")
  assert "Traceback" not in proc.stderr
  assert not out.exists()
  assert src.read_bytes() == data
  assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary left behind


def test_missing_input(tmp_path):
  proc = equarx_opt(tmp_path / "nope.mlir", "-o", tmp_path / "out.mlir")
  assert proc.returncode == 2
  assert "nope.mlir: cannot read input: No such file or directory" in proc.stderr


def test_unwritable_output(mlp_mlir, tmp_path):
  proc = equarx_opt(mlp_mlir, "-o", tmp_path / "no" / "such" / "dir" / "out.mlir")
  assert proc.returncode == 2
  assert "cannot write output" in proc.stderr


def test_refuses_to_overwrite_input(mlp_mlir):
  before = mlp_mlir.read_bytes()
  proc = equarx_opt(mlp_mlir, "-o", mlp_mlir)
  assert proc.returncode == 2
  assert "refusing to overwrite" in proc.stderr
  assert mlp_mlir.read_bytes() == before


@pytest.mark.parametrize(
  "flag,message",
  [
    ("--equarx_bogus=1", "Unknown command line flag 'equarx_bogus'"),
    ("--equarx_block_size=abc", "--equarx_block_size takes an integer, got 'abc'"),
    ("--equarx_format=int3", "--equarx_format must be one of"),
    ("--equarx_dtypes=f64", "--equarx_dtypes takes a comma list"),
  ],
)
def test_bad_flags_exit_2(mlp_mlir, tmp_path, flag, message):
  out = tmp_path / "out.mlir"
  proc = equarx_opt(mlp_mlir, "-o", out, flag)
  assert proc.returncode == 2
  assert message in proc.stderr
  assert not out.exists()


def test_no_input_is_a_usage_error():
  proc = equarx_opt()
  assert proc.returncode == 2
  assert "expected exactly one INPUT" in proc.stderr


@pytest.mark.libtpu
def test_compile_for_tpu_topology(mlp_mlir, tmp_path):
  """No TPU here: libtpu compiles for a v4 2x2x1 topology (8 devices) ahead of time."""
  out = tmp_path / "out.mlir"
  # One TPU slice: fast links only, so the cost model would leave the site native;
  # forced, the emitted form is what compiles.
  force = "--equarx_force"
  proc = equarx_opt(mlp_mlir, "-o", out, "--equarx_compile_for=tpu:v4:2x2x1", force, SMALL)
  assert proc.returncode == 0, proc.stderr
  assert "compiled for tpu:v4:2x2x1" in proc.stdout
  # The tiled form: int8 codes on an all-to-all and an all-gather, the f32 scales (eight
  # to a row) on their own; no all-reduce left.
  assert "2 s8 collectives" in proc.stdout and "0 all-reduces left" in proc.stdout
  # Beside the input program compiled for the same topology.
  assert "against the original's" in proc.stdout and "temporary memory" in proc.stdout
  assert "peak memory" in proc.stdout
  # Blocks of 1024 have one scale each, a 1-D array: the TPU compiler makes its small
  # all-gather an all-reduce, and the summary says so.
  b1024 = equarx_opt(
    mlp_mlir,
    "-o",
    out,
    "--equarx_compile_for=tpu:v4:2x2x1",
    "--equarx_block_size=1024",
    force,
    SMALL,
  )
  assert b1024.returncode == 0 and "1 all-reduce left (f32[16])" in b1024.stdout, b1024.stdout
  assert "the TPU compiler makes small all-gathers (the f32 scales') all-reduces" in b1024.stdout


@pytest.mark.libtpu
def test_compile_for_wrong_topology_size(mlp_mlir, tmp_path):
  out = tmp_path / "out.mlir"
  proc = equarx_opt(mlp_mlir, "-o", out, "--equarx_compile_for=tpu:v5e:2x2")
  assert proc.returncode == 2
  assert "runs on 8 devices" in proc.stderr and "v5e:2x2 has 4" in proc.stderr
  assert not out.exists()


@pytest.mark.libtpu
def test_decorator_compile_for_tpu_topology():
  """equarx_pass.jit with --equarx_compile_for also compiles the rewritten module for TPU."""
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  f = equarx_pass.jit(
    jax.shard_map(lambda x: jax.lax.psum(x, "tp"), mesh=mesh, in_specs=P("tp"), out_specs=P("tp")),
    flags="--equarx_enable --equarx_compile_for=tpu:v4:2x2x1",
  )
  f.lower(jax.ShapeDtypeStruct((8, 32768), np.float32))
  tpu = f.report.lowerings[-1].tpu
  assert tpu is not None and tpu.target == "tpu:v4:2x2x1" and tpu.num_devices == 8
  assert tpu.quantized_collectives >= 2 and tpu.all_reduces == 0
  assert "compiled for tpu:v4:2x2x1" in str(f.report)
  # The program before the rewrite, compiled for the same topology: one all-reduce and
  # no s8 collective; the summary sets the estimates side by side.
  original = tpu.original
  assert original is not None and original.all_reduces == 1 and original.quantized_collectives == 0
  assert tpu.temp_bytes is not None and original.temp_bytes is not None
  assert f"temporary memory {fmt_bytes(tpu.temp_bytes)} against the original's" in str(f.report)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_this_commands_flags(flag):
  proc = equarx_opt(flag)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.startswith("equarx-opt: rewrite the all-reduces")
  assert "--equarx_identity" in proc.stdout and "--report" in proc.stdout
  assert "on here; --noequarx_enable" in proc.stdout
  assert "--output_format=F" in proc.stdout
  # Shown: it applies to equarx_pass.jit and to jax.export artifacts.
  assert "--equarx_partitioned=M" in proc.stdout and "jax.export artifact" in proc.stdout
