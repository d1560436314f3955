"""A compile for a named topology, run in a child process: its one JSON line, or an error.

The compile-only clients (libtpu's, JAX's CUDA plugin's) run with JAX_PLATFORMS=cpu in a
process of their own, so that a crash or a hang in them cannot take the caller down and
the caller's JAX keeps its own backends.  tpu_aot.py and gpu_aot.py both call `run`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from equarx_pass.errors import CompileError


def run(
  child: str, module_text: str, target: str, argv: list[str], env: dict[str, str], timeout: float
) -> dict:
  """Run `python -m CHILD TARGET ARGV...` with `module_text` on its stdin and return the
  JSON object of its last line of stdout; CompileError naming `target` if it fails."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", **env)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  try:
    proc = subprocess.run(
      [sys.executable, "-m", child, target, *argv],
      input=module_text.encode(),
      capture_output=True,
      timeout=timeout,
      env=env,
    )
  except subprocess.TimeoutExpired:
    raise CompileError(f"compiling for {target} took longer than {timeout:.0f} s") from None
  return _result(proc, target)


def _result(proc: subprocess.CompletedProcess, target: str) -> dict:
  lines = proc.stdout.decode(errors="replace").strip().splitlines()
  if proc.returncode != 0 or not lines:
    err = proc.stderr.decode(errors="replace").strip().splitlines()
    tail = " | ".join(line for line in err if "error" in line.lower())[-800:] or " | ".join(
      err[-3:]
    )
    how = (
      f"killed by signal {-proc.returncode}"
      if proc.returncode < 0
      else f"exit code {proc.returncode}"
    )
    raise CompileError(f"compiling for {target} failed ({how}): {tail}")
  data = json.loads(lines[-1])
  if "error" in data:
    raise CompileError(f"compiling for {target} failed: {data['error']}")
  return data
