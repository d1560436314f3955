"""What equarx_pass.jit costs before a program runs, against jax.jit: first call and
lower-then-compile, where there is nothing to rewrite and where there is.

    python tools/bench_first_call.py               # about 4 minutes on 2 cores
    python tools/bench_first_call.py --repeats 1 --layers 4   # a quick look

Programs (8 CPU devices, mesh data 2 x fsdp 4, an MLP of --layers layers of 512 x 2048):
  init        the parameters' initialisation, auto-sharded (out_shardings): no collective
              after partitioning, so nothing to rewrite
  step        a training step that mixes both kinds of program: a loss reduced by an
              explicit psum inside shard_map, in an auto-sharded step whose gradient
              all-reduces the partitioner inserts
Timings per program:
  first call  the first call, compile included, to the result
  lower       .lower() alone; compile: the .compile() of that Lowered, later
The pass runs with --equarx_enable (one fast domain: every site is priced native and
nothing is rewritten; the route is read all the same) and, for the step, with
--equarx_domain_devices=4 too (two domains: the gradient all-reduces are rewritten).

Each measurement is a fresh child process (no compile cache shared), jax.jit and the
pass interleaved, --repeats times; the table gives medians and each ratio to jax.jit's.
Writes results/first_call.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

# Runs in the child: one program, one mode, one timing; prints a JSON line.
CHILD = r"""
import json, os, sys, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import equarx_pass

program, flags, timing, layers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
mesh = jax.make_mesh((2, 4), ("data", "fsdp"), axis_types=(AxisType.Auto,) * 2)
D, F = 512, 2048
specs = {f"l{i}": {"w1": P("fsdp", None), "w2": P(None, "fsdp"), "scale": P()} for i in range(layers)}
shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)

def init(key):
  params = {}
  for i in range(layers):
    k1, k2, key = jax.random.split(key, 3)
    params[f"l{i}"] = {
      "w1": jax.random.normal(k1, (D, F)) * 0.02,
      "w2": jax.random.normal(k2, (F, D)) * 0.02,
      "scale": jnp.ones((D,)),
    }
  return params

def loss(params, x):
  for i in range(layers):
    p = params[f"l{i}"]
    x = x + jnp.tanh(x @ p["w1"]) @ p["w2"] * p["scale"]
  def local(h):  # the trainer's own reduction: an explicit psum
    return jax.lax.psum(jnp.mean(h * h), ("data", "fsdp")) / 8
  return jax.shard_map(local, mesh=mesh, in_specs=P(("data", "fsdp")), out_specs=P())(x)

def step(params, x):
  value, grads = jax.value_and_grad(loss)(params, x)
  return value, jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)

def jit(fun, **kw):
  return jax.jit(fun, **kw) if flags == "jax.jit" else equarx_pass.jit(fun, flags=flags, **kw)

key = jax.random.key(0)
if program == "init":
  fun, args = jit(init, out_shardings=shardings), (key,)
else:
  params = jax.jit(init, out_shardings=shardings)(key)
  x = jax.device_put(np.ones((64, D), np.float32), NamedSharding(mesh, P(("data", "fsdp"))))
  fun, args = jit(step), (params, x)
jax.block_until_ready(args)
out = {}
if timing == "first call":
  start = time.perf_counter()
  jax.block_until_ready(fun(*args))
  out["first call"] = time.perf_counter() - start
else:
  start = time.perf_counter()
  lowered = fun.lower(*args)
  out["lower"] = time.perf_counter() - start
  start = time.perf_counter()
  compiled = lowered.compile()
  out["compile"] = time.perf_counter() - start
  jax.block_until_ready(compiled(*args))
report = getattr(fun, "report", None)
out["rewritten"] = sum(r.rewritten for r in report.records) if report is not None else 0
out["sites"] = len(report.records) if report is not None else 0
print("RESULT " + json.dumps(out))
"""

PASS_NOTHING = "--equarx_enable"
# One fast domain of all 8 devices: every site is priced native, nothing is rewritten.
PASS_ONE_HOST = "--equarx_enable --equarx_domain_devices=8"
PASS_REWRITE = "--equarx_enable --equarx_domain_devices=4"
CASES = [
  ("init", "first call", PASS_NOTHING),
  ("init", "lower+compile", PASS_NOTHING),
  ("step", "first call", PASS_ONE_HOST),
  ("step", "lower+compile", PASS_ONE_HOST),
  ("step", "first call", PASS_REWRITE),
  ("step", "lower+compile", PASS_REWRITE),
]


def run_child(program: str, flags: str, timing: str, layers: int, python: str) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  done = subprocess.run(
    [python, "-c", CHILD, program, flags, timing, str(layers)],
    capture_output=True,
    text=True,
    env=env,
    timeout=900,
  )
  for line in done.stdout.splitlines():
    if line.startswith("RESULT "):
      return json.loads(line[len("RESULT ") :])
  raise RuntimeError(f"{program} {timing} {flags!r} failed:\n{done.stderr[-3000:]}")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--layers", type=int, default=8)
  parser.add_argument("--python", default=sys.executable)
  parser.add_argument("--out", default=os.path.join(benchlib.RESULTS, "first_call.json"))
  args = parser.parse_args(argv)

  samples: dict[tuple, list[dict]] = {}
  for _ in range(args.repeats):
    for program, timing, flags in CASES:
      for mode in ("jax.jit", flags):  # interleaved: the machine's load hits both alike
        got = run_child(program, mode, timing, args.layers, args.python)
        samples.setdefault((program, timing, mode, flags), []).append(got)

  rows = []
  for program, timing, flags in CASES:
    base = samples[(program, timing, "jax.jit", flags)]
    mine = samples[(program, timing, flags, flags)]
    keys = ["first call"] if timing == "first call" else ["lower", "compile"]
    row = {"program": program, "timing": timing, "pass flags": flags}
    total_base = statistics.median(sum(s[k] for k in keys) for s in base)
    total_mine = statistics.median(sum(s[k] for k in keys) for s in mine)
    for k in keys:
      row[f"jax.jit {k} s"] = round(statistics.median(s[k] for s in base), 2)
      row[f"pass {k} s"] = round(statistics.median(s[k] for s in mine), 2)
    row["jax.jit s"] = round(total_base, 2)
    row["pass s"] = round(total_mine, 2)
    row["ratio"] = round(total_mine / total_base, 2)
    row["sites rewritten"] = f"{mine[0]['rewritten']} of {mine[0]['sites']}"
    rows.append(row)
  columns = [
    "program",
    "timing",
    "pass flags",
    "jax.jit s",
    "pass s",
    "ratio",
    "jax.jit lower s",
    "pass lower s",
    "jax.jit compile s",
    "pass compile s",
    "sites rewritten",
  ]
  for row in rows:
    for c in columns:
      row.setdefault(c, "")
  print(
    benchlib.table(
      rows,
      columns,
      f"first call and lower+compile, median of {args.repeats} fresh processes each "
      f"({args.layers} layers, 8 CPU devices)",
    )
  )
  benchlib.write_result(args.out, rows, layers=args.layers, repeats=args.repeats)
  return 0


if __name__ == "__main__":
  start = time.perf_counter()
  code = main()
  print(f"({time.perf_counter() - start:.0f} s)")
  sys.exit(code)
