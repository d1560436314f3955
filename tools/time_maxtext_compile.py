"""What MaxText's trainer spends before its first step, natively and under equarx_pass.

    python tools/time_maxtext_compile.py --repeats 3            # the driver: runs and table
    python tools/time_maxtext_compile.py --child MAXTEXT_ARGS   # one native run, timed
    python -m equarx_pass.frontends.launch tools/time_maxtext_compile.py --child MAXTEXT_ARGS

The driver runs the CPU run of tools/check_maxtext.py (8 CPU devices, data 2 x fsdp 4, the
tiny model, --steps steps) once per configuration and repeat, interleaved (native, int8,
one-domain, native, ...), each a child process under `timeout`, and prints a table of
medians and ratios to native:

  - init first call: the state's initialisation (MaxText's setup_initial_state jits a
    lambda with out_shardings and calls it once), the call and its result ready;
  - lower: the train step's `p_train_step.lower(*lower_args)`;
  - compile: that Lowered's `.compile(compiler_options=...)`;
  - step 0: MaxText's own `completed step: 0, seconds: ...`.

The child (--child) installs its timers and then runs MaxText's trainer in the process
(`runpy.run_module("maxtext.trainers.pre_train.train", run_name="__main__")`).  It wraps
whatever `jax.jit` is when it starts: jax.jit natively, equarx_pass.jit under the
launcher (which replaced jax.jit before running this script), so the same timers sit
around both.  Each jitted object is a thin proxy whose `lower` and first concrete call are
timed; `jax.stages.Lowered.compile` is timed at the class.  JAX's own monitoring events
(jaxpr tracing, lowering to MLIR, backend compiles) are collected with the timed region
they fell in, so a compile inside `lower` (the pass's partitioned read) or a second
compile at the first call shows up.  The child prints one line `TIMINGS {json}`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRAIN = "maxtext.trainers.pre_train.train"

CONFIGS = {
  "native": None,
  "int8 (dd=4)": "--equarx_enable --equarx_domain_devices=4",
  "one domain (dd=8)": "--equarx_enable --equarx_domain_devices=8",
}


# --- the child -------------------------------------------------------------------------


def child(maxtext_args: list[str]) -> int:
  import contextlib
  import runpy

  import jax
  from jax._src import dispatch

  start_all = time.perf_counter()
  stack: list[str] = []
  regions: list[dict] = []
  events: list[dict] = []
  short = {
    dispatch.JAXPR_TRACE_EVENT: "trace",
    dispatch.JAXPR_TO_MLIR_MODULE_EVENT: "to_mlir",
    dispatch.BACKEND_COMPILE_EVENT: "backend_compile",
  }

  def listener(event, duration, **kw):
    if event in short:
      events.append(
        dict(
          event=short[event],
          seconds=round(duration, 4),
          region="/".join(stack),
          fun=str(kw.get("fun_name", "")),
        )
      )

  jax.monitoring.register_event_duration_secs_listener(listener)

  @contextlib.contextmanager
  def region(name: str):
    stack.append(name)
    t = time.perf_counter()
    entry = dict(name=name, parent="/".join(stack[:-1]), at=round(t - start_all, 3))
    try:
      yield entry
    finally:
      entry["seconds"] = round(time.perf_counter() - t, 4)
      regions.append(entry)
      stack.pop()

  def is_traced(args, kwargs) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kwargs)))

  def fun_name(fun) -> str:
    name = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None)
    if name is None and hasattr(fun, "func"):  # functools.partial
      name = getattr(fun.func, "__qualname__", None) or getattr(fun.func, "__name__", "?")
    return str(name or type(fun).__name__)

  class Timed:
    """A jitted object (jax.jit's or equarx_pass.jit's), its lower() and first call timed."""

    def __init__(self, jitted, name: str):
      object.__setattr__(self, "_t_jitted", jitted)
      object.__setattr__(self, "_t_name", name)
      object.__setattr__(self, "_t_called", False)

    def __call__(self, *args, **kwargs):
      if self._t_called or is_traced(args, kwargs):
        return self._t_jitted(*args, **kwargs)
      object.__setattr__(self, "_t_called", True)
      with region(f"first_call:{self._t_name}") as entry:
        out = self._t_jitted(*args, **kwargs)
        entry["dispatch_seconds"] = round(time.perf_counter() - start_all - entry["at"], 4)
        if "setup_initial_state" in self._t_name:  # the init: its result ready too
          jax.block_until_ready(out)
      return out

    def lower(self, *args, **kwargs):
      with region(f"lower:{self._t_name}"):
        return self._t_jitted.lower(*args, **kwargs)

    def __getattr__(self, name):
      return getattr(self._t_jitted, name)

    def __setattr__(self, name, value):
      setattr(self._t_jitted, name, value)

  jit_types: set[str] = set()
  inner_jit = jax.jit  # jax.jit natively; the launcher's equarx_pass.jit under it

  def timed_jit(fun=None, /, **kwargs):
    if fun is None:
      return lambda f: timed_jit(f, **kwargs)
    jitted = inner_jit(fun, **kwargs)
    jit_types.add(f"{type(jitted).__module__}.{type(jitted).__qualname__}")
    return Timed(jitted, fun_name(fun))

  jax.jit = timed_jit

  plain_compile = jax.stages.Lowered.compile

  def timed_compile(self, *args, **kwargs):
    name = getattr(getattr(self, "_lowering", None), "_name", "?")
    with region(f"compile:{name}"):
      return plain_compile(self, *args, **kwargs)

  jax.stages.Lowered.compile = timed_compile

  sys.argv = [TRAIN, *maxtext_args]
  code = 0
  try:
    runpy.run_module(TRAIN, run_name="__main__", alter_sys=True)
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  finally:
    out = dict(
      jit_types=sorted(jit_types),
      total_seconds=round(time.perf_counter() - start_all, 3),
      regions=sorted(regions, key=lambda r: r["at"]),
      events=events,
    )
    print("TIMINGS " + json.dumps(out), flush=True)
  return code


# --- the driver ------------------------------------------------------------------------


STEP = re.compile(r"completed step: (\d+), seconds: ([0-9.]+)")


def parse(log_text: str) -> dict:
  """A child's figures from its output: the timed regions and MaxText's step 0."""
  line = next((l for l in reversed(log_text.splitlines()) if l.startswith("TIMINGS ")), None)
  if line is None:
    raise ValueError("no TIMINGS line")
  t = json.loads(line[len("TIMINGS ") :])
  steps = {int(m.group(1)): float(m.group(2)) for m in STEP.finditer(log_text)}
  regions = t["regions"]

  def one(prefix: str, contains: str = "") -> dict | None:
    found = [r for r in regions if r["name"].startswith(prefix) and contains in r["name"]]
    return found[0] if found else None

  lower = one("lower:", "train_step")
  # The compile of the train step's Lowered: the first top-level compile after its lower.
  compile_ = next(
    (
      r
      for r in regions
      if r["name"].startswith("compile:") and r["parent"] == "" and lower and r["at"] >= lower["at"]
    ),
    None,
  )
  init = one("first_call:", "setup_initial_state")
  step_call = one("first_call:", "train_step")

  def backend(region_prefix: str) -> list[float]:
    return [
      e["seconds"]
      for e in t["events"]
      if e["event"] == "backend_compile" and e["region"].startswith(region_prefix)
    ]

  return dict(
    lower=lower and lower["seconds"],
    compile=compile_ and compile_["seconds"],
    init=init and init["seconds"],
    init_dispatch=init and init.get("dispatch_seconds"),
    step0=steps.get(0),
    step1=steps.get(1),
    step0_call=step_call and step_call["seconds"],
    backend_in_lower=backend(lower["name"]) if lower else [],
    backend_in_compile=backend(compile_["name"]) if compile_ else [],
    backend_in_step0_call=backend(step_call["name"]) if step_call else [],
    backend_in_init=backend(init["name"]) if init else [],
    nested_compiles_in_lower=[
      r["seconds"] for r in regions if lower and r["parent"].startswith(lower["name"])
    ],
    lower_less_nested_compile=lower
    and round(
      lower["seconds"]
      - sum(r["seconds"] for r in regions if r["parent"].startswith(lower["name"])),
      4,
    ),
    train_step_backend_compiles=[
      e["seconds"]
      for e in t["events"]
      if e["event"] == "backend_compile" and e["fun"] == "jit(train_step)"
    ],
    total=t["total_seconds"],
    jit_types=t["jit_types"],
  )


def main() -> int:
  if len(sys.argv) > 1 and sys.argv[1] == "--child":
    return child(sys.argv[2:])
  sys.path.insert(0, HERE)
  from check_maxtext import COMMON, CPU_MODEL

  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--steps", type=int, default=3)
  p.add_argument("--timeout", type=int, default=600, help="seconds per run (`timeout`)")
  p.add_argument("--python", default=sys.executable)
  p.add_argument("--work", default="/tmp/time_maxtext_compile")
  p.add_argument(
    "--configs", nargs="*", default=list(CONFIGS), help="which of: " + ", ".join(CONFIGS)
  )
  p.add_argument(
    "--out", default=None, help="result file (default results/time_maxtext_compile.json)"
  )
  args = p.parse_args()
  os.makedirs(args.work, exist_ok=True)
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=(
      os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip(),
  )
  env.pop("EQUARX_FLAGS", None)
  script = os.path.abspath(__file__)
  runs: dict[str, list[dict]] = {c: [] for c in args.configs}
  for rep in range(args.repeats):
    for name in args.configs:
      flags = CONFIGS[name]
      tag = re.sub(r"[^a-z0-9]+", "_", name).strip("_") + f"_{rep}"
      prefix = (
        [args.python] if flags is None else [args.python, "-m", "equarx_pass.frontends.launch"]
      )
      argv = [
        "timeout",
        str(args.timeout),
        *prefix,
        script,
        "--child",
        f"run_name=time_compile_{tag}",
        f"base_output_directory={args.work}",
        f"metrics_file={os.path.join(args.work, tag + '.metrics.jsonl')}",
        f"steps={args.steps}",
        *COMMON,
        *CPU_MODEL,
      ]
      run_env = dict(env, **({"EQUARX_FLAGS": flags} if flags else {}))
      log = os.path.join(args.work, tag + ".log")
      print(
        f"[{tag}] {'EQUARX_FLAGS=' + repr(flags) + ' ' if flags else ''}{' '.join(argv)}",
        flush=True,
      )
      start = time.perf_counter()
      with open(log, "w") as f:
        rc = subprocess.run(argv, env=run_env, stdout=f, stderr=subprocess.STDOUT).returncode
      wall = time.perf_counter() - start
      text = open(log, errors="replace").read()
      try:
        got = parse(text)
      except Exception as e:  # noqa: BLE001
        print(f"[{tag}] rc {rc}, no figures ({e}); the end of {log}:\n{text[-3000:]}", flush=True)
        continue
      got.update(rc=rc, wall=round(wall, 1), log=log)
      runs[name].append(got)
      print(f"[{tag}] rc {rc} wall {wall:.0f} s: " + json.dumps(got), flush=True)

  cols = [
    ("lower", "lower s"),
    ("compile", "compile s"),
    ("lower+compile", "lower+compile s"),
    ("init", "init first call s"),
    ("step0", "step 0 s"),
  ]

  def med(rows, key):
    vals = [
      (r["lower"] + r["compile"]) if key == "lower+compile" else r[key]
      for r in rows
      if (r["lower"] is not None and r["compile"] is not None) or key != "lower+compile"
    ]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None

  medians = {n: {k: med(rows, k) for k, _ in cols} for n, rows in runs.items() if rows}
  base = medians.get("native")
  print()
  print("| program | n | " + " | ".join(h for _, h in cols) + " |")
  print("|---|---|" + "---|" * len(cols))
  for n, m in medians.items():
    cells = []
    for k, _ in cols:
      v = m[k]
      if v is None:
        cells.append("-")
      elif base and n != "native" and base.get(k):
        cells.append(f"{v:.2f} ({v / base[k]:.2f}x)")
      else:
        cells.append(f"{v:.2f}")
    print(f"| {n} | {len(runs[n])} | " + " | ".join(cells) + " |")
  out = args.out or os.path.join(benchlib.RESULTS, "time_maxtext_compile.json")
  rows = [dict(config=n, **m) for n, m in medians.items()]
  benchlib.write_result(out, rows, configs=CONFIGS, runs=runs, repeats=args.repeats)
  print(
    "\n| program | lower less the compile inside it s | XLA compiles of train_step (median s each) |"
  )
  print("|---|---|---|")
  for n, rows in runs.items():
    if not rows:
      continue
    less = statistics.median(r["lower_less_nested_compile"] for r in rows)
    counts = sorted({len(r["train_step_backend_compiles"]) for r in rows})
    each = [statistics.median(c) for c in zip(*(r["train_step_backend_compiles"] for r in rows))]
    print(
      f"| {n} | {less:.2f} | {'/'.join(map(str, counts))}: "
      + ", ".join(f"{x:.2f}" for x in each)
      + " |"
    )
  print(f"\nper-run figures: {out}")
  return 0 if all(len(r) == args.repeats for r in runs.values()) else 1


if __name__ == "__main__":
  sys.exit(main())
