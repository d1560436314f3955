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
import time
from typing import Any

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


def compile_here(module_text: str, devices: list, where: str) -> tuple[Any, float] | dict:
  """In the child: compile `module_text` for `devices` (compile-only, their position is
  the logical id), as (executable, seconds), or {"error": ...} when the module's replica
  and partition counts do not match the devices of `where`."""
  import numpy as np
  from jax.extend import backend as jax_backend
  from jax.extend.mlir import ir

  from equarx_pass import _jax_private
  from equarx_pass.planning import match

  module = ir.Module.parse(module_text, context=_jax_private.make_ir_context())
  facts = match.module_facts(module)
  needed = facts.num_partitions * facts.num_replicas
  if needed != len(devices):
    return {
      "error": f"the module runs on {needed} devices ({facts.num_replicas} replicas x "
      f"{facts.num_partitions} partitions) but {where} has {len(devices)}"
    }
  assignment = np.array([d.id for d in devices]).reshape(facts.num_replicas, facts.num_partitions)
  options = jax_backend.get_compile_options(
    num_replicas=facts.num_replicas,
    num_partitions=facts.num_partitions,
    device_assignment=assignment,
  )
  start = time.perf_counter()
  executable = devices[0].client.compile(
    module, executable_devices=_jax_private.device_list(devices), compile_options=options
  )
  return executable, time.perf_counter() - start


def child_main(argv: list[str], usage: str, arities: tuple[int, ...], compile_fn) -> int:
  """A child's entry point: `compile_fn(module text on stdin, *argv[1:])`'s dict as one
  JSON line on stdout, or {"error": ...}, which the parent (run) raises as CompileError."""
  if len(argv) not in arities:
    print(json.dumps({"error": usage}))
    return 2
  try:
    result = compile_fn(sys.stdin.read(), *argv[1:])
  except Exception as e:  # reported to the parent, which raises CompileError
    result = {"error": f"{type(e).__name__}: {str(e).strip()[:2000]}"}
  sys.stdout.write("\n" + json.dumps(result) + "\n")
  return 0
