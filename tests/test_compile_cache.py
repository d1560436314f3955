"""The partitioned route with JAX's persistent compilation cache on: the read of the
partitioned program is never served from the cache (a cached executable comes with no
dump of the partitioned program), so a second process rewrites what the first did."""

import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
  """
  import json, sys
  import jax, numpy as np
  jax.config.update("jax_compilation_cache_dir", sys.argv[1])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  import equarx_pass
  from equarx_pass.examples import auto_sharded as ex

  mesh = ex.tp_mesh()
  args = ex.mlp_inputs(mesh)
  fn = equarx_pass.jit(ex.mlp, flags="--equarx_enable --equarx_min_bytes=0 --equarx_force")
  out, plain = np.asarray(fn(*args)), np.asarray(jax.jit(ex.mlp)(*args))
  [low] = fn.report.lowerings
  print(json.dumps({
    "route": low.route,
    "rewritten": sum(r.rewritten for r in low.records),
    "differs": bool((out != plain).any()),
    "error": float(np.linalg.norm(out - plain) / np.linalg.norm(plain)),
  }))
  """
)


def test_second_process_rewrites_what_the_first_did(tmp_path):
  cache = tmp_path / "jax_cache"
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  runs = []
  for _ in range(2):
    proc = subprocess.run(
      [sys.executable, "-c", CHILD, str(cache)],
      capture_output=True,
      text=True,
      timeout=300,
      env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
  first, second = runs
  assert first["route"] == "partitioned" and first["rewritten"] == 1 and first["differs"]
  assert first["error"] < 0.05
  # Not jax.jit's bits from a cache hit: the same rewritten program, and so the same result.
  assert second == first
  assert any(cache.iterdir())  # the cache is in use (jax.jit's and the rewritten program)
