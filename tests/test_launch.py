"""equarx-run / python -m equarx_pass.frontends.launch: a program's own jax.jit through the pass,
the program unedited."""

import os
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent(
  """
  import jax, jax.numpy as jnp, numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P

  mesh = jax.make_mesh((2, 4), ("hosts", "local"))
  S = lambda *s: NamedSharding(mesh, P(*s))

  @jax.jit
  def helper(x):  # jitted, called inside the step: traced there, no warning
    return x * 2

  def loss(w, x):
    return jnp.mean(helper(x @ w) ** 2)

  step = jax.jit(jax.grad(loss), out_shardings=S())
  w = jax.device_put(np.ones((512, 512), np.float32), S())
  x = jax.device_put(
    np.random.default_rng(0).normal(size=(64, 512)).astype(np.float32), S(("hosts", "local"))
  )
  print("STEP", type(step).__name__, float(jnp.linalg.norm(step(w, x))))
  """
)


def run(tmp_path, flags, *launch_args, program=PROGRAM):
  script = tmp_path / "train.py"
  script.write_text(program)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  # `-m MODULE` finds the module as `python -m` would: from the working directory, or
  # (under PYTHONSAFEPATH, as CI runs) from PYTHONPATH.
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
  env.pop("EQUARX_FLAGS", None)
  if flags is not None:
    env["EQUARX_FLAGS"] = flags
  args = launch_args or (str(script),)
  return subprocess.run(
    [sys.executable, "-m", "equarx_pass.frontends.launch", *args],
    capture_output=True,
    text=True,
    timeout=300,
    env=env,
    cwd=tmp_path,
  )


def test_the_programs_jit_goes_through_the_pass(tmp_path):
  proc = run(tmp_path, "--equarx_enable --equarx_domain_devices=4")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "STEP Jitted" in proc.stdout
  assert "EquarxWarning" not in proc.stderr  # the helper traced inside the step says nothing
  [line] = [line for line in proc.stderr.splitlines() if line.startswith("equarx-run: loss(")]
  assert "1 of 1 all-reduce sites rewritten" in line


def test_results_match_plain_jax_jit_under_identity(tmp_path):
  plain = subprocess.run(
    [sys.executable, "-c", PROGRAM],
    capture_output=True,
    text=True,
    timeout=300,
    env=dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8"),
  )
  flags = "--equarx_enable --equarx_identity --equarx_force --equarx_min_bytes=0"
  launched = run(tmp_path, flags + " --equarx_domain_devices=4")
  assert launched.returncode == 0, launched.stderr[-2000:]
  norm = lambda out: [w for w in out.split() if w[0].isdigit()]  # noqa: E731
  assert norm(launched.stdout) == norm(plain.stdout)


def test_module_form(tmp_path):
  (tmp_path / "trainer").mkdir()
  (tmp_path / "trainer" / "__init__.py").write_text("")
  (tmp_path / "trainer" / "train.py").write_text(PROGRAM)
  proc = run(tmp_path, "--equarx_enable --equarx_domain_devices=4", "-m", "trainer.train")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "STEP Jitted" in proc.stdout


def test_without_enable_the_program_runs_as_it_is(tmp_path):
  proc = run(tmp_path, "--equarx_report")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "STEP PjitFunction" in proc.stdout
  assert "does not say --equarx_enable" in proc.stderr


@pytest.mark.parametrize(
  "flags, args, message",
  [
    ("--equarx_enable --equarx_bogus=1", (), "EQUARX_FLAGS"),
    ("--equarx_enable", ("missing.py",), "missing.py: no such file"),
    ("--equarx_enable", ("-m",), "usage"),
  ],
)
def test_usage_errors_exit_2(tmp_path, flags, args, message):
  proc = run(tmp_path, flags, *args)
  assert proc.returncode == 2
  assert message in proc.stderr
