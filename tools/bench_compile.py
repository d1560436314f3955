"""Pass time and compile time on a model-sized module: a 64-layer tensor-parallel transformer.

    python tools/bench_compile.py              # about 15 minutes on 2 cores
    (each --scheme given goes to every program; without one, the unrolled programs get
    the default scheme only, and the scan also the int8 ring)
    python tools/bench_compile.py --quick      # 16 layers, about 1.5 minutes
    python tools/bench_compile.py --programs forward --layers 128 --tpu '' \
      --exchanges all_gather all_to_all all_to_all+all_gather   # the floor of a form

The model is a Megatron-style transformer on 8 CPU devices with a psum after
attention and after the MLP of every layer.  Three programs:

  train, unrolled   one training step (value_and_grad), the layers a Python loop:
                    two more psums per layer in the backward pass (gradients of
                    the replicated inputs of the column-parallel matmuls), so 64
                    layers give 256 all-reduce sites in the module
  train, scan       the same under jax.lax.scan: 4 sites in the loop body
  forward, unrolled the forward pass alone: 128 sites, a much smaller original

Each compile runs in a fresh child process (no shared compile cache; XLA_FLAGS
can differ): lowering time, pass time (rewrite_module, best of 3), XLA:CPU
compile time of the original and of the rewritten module, the compiler phases
XLA:CPU reports to the profiler, and what the optimized HLO holds.  The forward
program is compiled once more with LLVM's optimisation off
(--xla_backend_optimization_level=0), and the scanned one ahead of time for a
TPU (v4:2x2x1, libtpu; a rewritten unrolled module takes seconds per site there).

--exchanges: the forward program again with each psum replaced by a bare exchange of
int8 values in plain jnp, nothing quantized and the pass off: what XLA:CPU's compile
costs for the collectives alone of a form (the two-shot's all_to_all and all_gather).

Writes results/compile.json (or --out) and a PNG plot next to it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

DEVICES = 8
TOKENS, HIDDEN, FFN, HEADS = 64, 256, 1024, 8


def bare_exchange(jax, name: str, n: int):
  """A psum stand-in (x, axis) made of the named collectives on int8 values, nothing
  quantized (its result is not a sum of x): the collectives of a form, alone."""
  import jax.numpy as jnp

  def all_gather(x, axis):  # one collective: every member's values, summed here
    g = jax.lax.all_gather(x.astype(jnp.int8), axis).astype(jnp.float32).sum(0)
    return g.astype(x.dtype)

  def all_to_all(x, axis):  # the two-shot's first half: a chunk from every member
    parts = jax.lax.all_to_all(x.astype(jnp.int8).reshape(n, -1), axis, 0, 0, tiled=True)
    chunk = parts.reshape(n, -1).astype(jnp.float32).sum(0)
    return jnp.tile(chunk, n).reshape(x.shape).astype(x.dtype)

  def two_shot(x, axis):  # both halves
    parts = jax.lax.all_to_all(x.astype(jnp.int8).reshape(n, -1), axis, 0, 0, tiled=True)
    chunk = parts.reshape(n, -1).astype(jnp.float32).sum(0).astype(jnp.int8)
    return jax.lax.all_gather(chunk, axis, tiled=True).reshape(x.shape).astype(x.dtype)

  return {"all_gather": all_gather, "all_to_all": all_to_all, "all_to_all+all_gather": two_shot}[
    name
  ]


EXCHANGES = ("all_gather", "all_to_all", "all_to_all+all_gather")


def build_step(jax, mesh, layers: int, scanned: bool, train: bool = True, exchange: str = ""):
  """(step, example args): loss + grads (train) or the forward pass of a TP transformer;
  `exchange`: a bare_exchange in place of every psum."""
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import PartitionSpec as P

  n = mesh.shape["tp"]
  heads = HEADS // n if HEADS >= n else 1
  psum = bare_exchange(jax, exchange, n) if exchange else jax.lax.psum

  def norm(x):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)

  def layer(x, p):
    qkv = norm(x) @ p["wqkv"]
    q, k, v = jnp.split(qkv, 3, axis=-1)
    d = q.shape[-1] // heads
    q, k, v = (a.reshape(TOKENS, heads, d).transpose(1, 0, 2) for a in (q, k, v))
    att = jax.nn.softmax(q @ k.transpose(0, 2, 1) / np.sqrt(d)) @ v
    x = x + psum(att.transpose(1, 0, 2).reshape(TOKENS, -1) @ p["wo"], "tp")
    h = jax.nn.gelu(norm(x) @ p["w1"]) @ p["w2"]
    return x + psum(h, "tp")

  def loss(params, x):
    if scanned:
      x, _ = jax.lax.scan(lambda c, p: (layer(c, p), None), x, params)
    else:
      for p in params:
        x = layer(x, p)
    return (x**2).mean()

  f32 = jnp.float32
  shapes = dict(wqkv=(HIDDEN, 3 * HIDDEN), wo=(HIDDEN, HIDDEN), w1=(HIDDEN, FFN), w2=(FFN, HIDDEN))
  split = dict(wqkv=1, wo=0, w1=1, w2=0)  # column- or row-parallel

  def pspec(name, stacked):
    dims = [None, None]
    dims[split[name]] = "tp"
    return P(*([None] * stacked + dims))

  # Scan: stacked weights [layers, ...].  Unrolled: one dict per layer (slicing a
  # stacked array per layer would make the gradient add `layers` full-size
  # zero-padded copies: quadratic, and not what a real model does).
  if scanned:
    spec = {k: pspec(k, 1) for k in shapes}
    params = {k: jax.ShapeDtypeStruct((layers,) + v, f32) for k, v in shapes.items()}
  else:
    spec = [{k: pspec(k, 0) for k in shapes}] * layers
    params = [{k: jax.ShapeDtypeStruct(v, f32) for k, v in shapes.items()} for _ in range(layers)]
  if train:
    # Gradients for the input too (as for a pipeline stage), so that every layer
    # has its backward all-reduces: 4 sites per layer.
    step = jax.shard_map(
      jax.value_and_grad(loss, argnums=(0, 1)),
      mesh=mesh,
      in_specs=(spec, P()),
      out_specs=(P(), (spec, P())),
    )
  else:
    # A bare exchange's result is not replicated as a psum's is: no check of it.
    step = jax.shard_map(
      loss, mesh=mesh, in_specs=(spec, P()), out_specs=P(), check_vma=not exchange
    )
  return step, (params, jax.ShapeDtypeStruct((TOKENS, HIDDEN), f32))


def hlo_stats(text: str) -> dict:
  lines = [l for l in text.splitlines() if " = " in l]
  return {
    "instructions": len(lines),
    "fusions": sum(1 for l in lines if re.search(r"\bfusion\(", l)),
    "whiles": sum(1 for l in lines if re.search(r"\bwhile\(", l)),
    "permutes": sum(1 for l in lines if "collective-permute" in l),
    "all_to_alls": sum(1 for l in lines if re.search(r"all-to-all(-start)?\(", l)),
    "all_gathers": sum(1 for l in lines if re.search(r"all-gather(-start)?\(", l)),
    "all_reduces": sum(1 for l in lines if re.search(r"all-reduce(-start)?\(", l)),
    "computations": len(re.findall(r"^(?:ENTRY )?%\S+ .*\{$", text, re.M)),
  }


# Compiler phases that XLA:CPU reports to the profiler (TraceMe events).  Their
# time is summed over threads, so parallel codegen can add up past the wall time.
PHASES = (
  "PjRtCpuClient::Compile",
  "spmd-partitioner",
  "HLO passes through layout assignment",
  "HLO passes after layout assignment",
  "CpuCompiler::RunBackend",
  "ThunkEmitter::EmitEntryComputation",
  "FusionCompiler::Compile",
  "JitCompiler::Compile",
)


@contextlib.contextmanager
def profiled():
  """Collect the seconds of each compiler phase in PHASES into the yielded dict."""
  import glob
  import tempfile

  import jax

  phases: dict[str, float] = {}
  trace_dir = tempfile.mkdtemp(prefix="bench-compile-trace-")
  options = jax.profiler.ProfileOptions()
  options.python_tracer_level = 0  # C++ compiler events only: cheap and small
  options.enable_hlo_proto = False
  jax.profiler.start_trace(trace_dir, profiler_options=options)
  try:
    yield phases
  finally:
    jax.profiler.stop_trace()
    files = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    if files:
      data = jax.profiler.ProfileData.from_file(files[0])
      for plane in data.planes:
        for line in plane.lines:
          for ev in line.events:
            for name in PHASES:
              if ev.name.startswith(name):
                phases[name] = phases.get(name, 0.0) + ev.duration_ns / 1e9
    shutil.rmtree(trace_dir, ignore_errors=True)


def child(cfg: dict) -> dict:
  """One measurement in this (fresh) process."""
  os.environ["JAX_PLATFORMS"] = "cpu"
  import jax

  jax.config.update("jax_num_cpu_devices", DEVICES)
  import numpy as np
  from jax.sharding import Mesh

  import equarx_pass

  mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("tp",))
  step, args = build_step(
    jax, mesh, cfg["layers"], cfg["scanned"], cfg["model"] == "train", cfg.get("exchange", "")
  )
  out = {}
  start = time.perf_counter()
  lowered = jax.jit(step).lower(*args)
  module = lowered.compiler_ir("stablehlo")
  out["lower_s"] = time.perf_counter() - start
  if cfg["scheme"]:
    policy = equarx_pass.Policy.from_flags(cfg["scheme"] + " --equarx_min_bytes=0")
    times = []
    for _ in range(3):  # the pass alone, best of 3
      result = equarx_pass.rewrite_module(module, policy, platform="cpu")
      times.append(result.seconds)
    out["pass_s"] = min(times)
    out["sites"] = len(result.records)
    out["rewritten"] = sum(r.rewritten for r in result.records)
    from equarx_pass import _jax_private

    lowered = _jax_private.lowered_with_module(lowered, result.module)
    module = result.module
  else:
    from equarx_pass.planning import match

    out["sites"] = len(match.find_all_reduces(module))
  out["module_ops"] = str(module).count(" = ")
  with profiled() as phases:
    start = time.perf_counter()
    compiled = lowered.compile()
    out["compile_s"] = time.perf_counter() - start
  out["phases_s"] = phases
  out.update(hlo_stats(compiled.as_text()))
  if cfg.get("tpu"):
    from equarx_pass.frontends import tpu_aot

    try:
      tpu = tpu_aot.compile_for_target(str(module), cfg["tpu"])
      out["tpu_compile_s"] = tpu.seconds
    except Exception as e:
      out["tpu_error"] = f"{type(e).__name__}: {str(e)[:200]}"
  return out


def run_child(cfg: dict, timeout: float = 900) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("XLA_FLAGS", None)
  if cfg.get("xla_flags"):
    env["XLA_FLAGS"] = cfg["xla_flags"]
  try:
    proc = subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--child", json.dumps(cfg)],
      capture_output=True,
      text=True,
      timeout=timeout,
      env=env,
    )
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout:.0f} s"}
  lines = proc.stdout.strip().splitlines()
  if proc.returncode or not lines:
    return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
  return json.loads(lines[-1])


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  benchlib.add_scheme_argument(ap)
  ap.add_argument("--layers", type=int, default=64)
  ap.add_argument("--quick", action="store_true", help="16 layers, fewer variants")
  ap.add_argument(
    "--programs",
    nargs="+",
    default=["train", "scan", "forward", "forward-O0"],
    help="which programs: train (unrolled), scan, forward, forward-O0",
  )
  ap.add_argument("--tpu", default="tpu:v4:2x2x1", help="also compile for this topology ('' off)")
  ap.add_argument(
    "--exchanges",
    nargs="*",
    default=[],
    choices=EXCHANGES,
    help="also the forward program with each psum a bare exchange (the pass off)",
  )
  ap.add_argument("--out", default=os.path.join(benchlib.RESULTS, "compile.json"))
  ap.add_argument("--child", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.child:
    print("\n" + json.dumps(child(json.loads(args.child))))
    return 0
  if args.quick:
    args.layers = 16
  # Every program gets every --scheme.  Without --scheme: the default scheme, and under
  # scan also the int8 ring (the unrolled programs take minutes per compile).
  ok, missing = benchlib.split_schemes(args.scheme or ["--equarx_enable", benchlib.RING])
  unrolled_schemes = ok if args.scheme else ok[:1]
  # Which compiles, and why each.  A TPU compile of the rewritten unrolled model
  # takes many minutes (seconds per site), so TPU compiles are done for the scan.
  configs = []

  def add(model, scanned, schemes_, tpu="", xla_flags=""):
    for s in [""] + list(schemes_):
      configs.append(
        dict(
          model=model, layers=args.layers, scanned=scanned, scheme=s, tpu=tpu, xla_flags=xla_flags
        )
      )

  if "train" in args.programs:
    add("train", False, unrolled_schemes)  # the 256-site module
  if "scan" in args.programs:
    add("train", True, ok, tpu=args.tpu)  # the same model under scan: 4 sites
  if "forward" in args.programs and not args.quick:
    add("forward", False, unrolled_schemes)  # a small original: 128 sites
  if "forward-O0" in args.programs and not args.quick:
    # Where the time goes: the same compiles with LLVM's optimisation off.
    add("forward", False, unrolled_schemes, xla_flags="--xla_backend_optimization_level=0")
  for exchange in args.exchanges:
    configs.append(
      dict(
        model="forward",
        layers=args.layers,
        scanned=False,
        scheme="",
        tpu="",
        xla_flags="",
        exchange=exchange,
      )
    )
  print(
    f"{len(configs)} compiles of a {args.layers}-layer model in child processes "
    f"(about {args.layers * 0.16 + 1:.0f} min on 2 cores)",
    flush=True,
  )
  rows = []
  for cfg in configs:
    res = run_child(cfg)
    row = dict(cfg, **res)
    rows.append(row)
    print(
      "  " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}),
      flush=True,
    )

  # Ratios against the original of the same form and flags.
  def original(r):
    return next(
      (
        o
        for o in rows
        if not o["scheme"]
        and not o.get("exchange")
        and o["scanned"] == r["scanned"]
        and o["model"] == r["model"]
        and o.get("xla_flags") == r.get("xla_flags")
        and "compile_s" in o
      ),
      None,
    )

  cols = [
    "model",
    "form",
    "scheme",
    "XLA flags",
    "sites",
    "pass s",
    "pass ms/site",
    "compile s",
    "x original",
    "HLO passes s",
    "backend s",
    "fusion emitters s",
    "LLVM JIT s",
    "TPU compile s",
    "TPU x original",
    "HLO instrs",
    "fusions",
    "whiles",
  ]
  table_rows = []
  for r in rows:
    o = original(r)
    t = {
      "model": f"{r['layers']}-layer {r['model']}",
      "form": "scan" if r["scanned"] else "unrolled",
      "scheme": _what(r),
      "XLA flags": r.get("xla_flags", "").replace("--xla_", "") or "-",
      "sites": r.get("sites"),
    }
    if "error" in r:
      t["compile s"] = r["error"][:60]
      table_rows.append(t)
      continue
    if r["scheme"]:
      t["pass s"] = f"{r['pass_s']:.3f}"
      t["pass ms/site"] = f"{r['pass_s'] * 1e3 / max(r['rewritten'], 1):.2f}"
    t["compile s"] = f"{r['compile_s']:.2f}"
    if o and (r["scheme"] or r.get("exchange")):
      r["compile_ratio"] = r["compile_s"] / o["compile_s"]
      t["x original"] = f"{r['compile_ratio']:.2f}"
      if "tpu_compile_s" in r and "tpu_compile_s" in o:
        r["tpu_ratio"] = r["tpu_compile_s"] / o["tpu_compile_s"]
        t["TPU x original"] = f"{r['tpu_ratio']:.2f}"
    ph = r.get("phases_s", {})
    if ph:
      t["HLO passes s"] = (
        f"{ph.get(PHASES[2], 0) + ph.get(PHASES[3], 0) + ph.get(PHASES[1], 0):.2f}"
      )
      t["backend s"] = f"{ph.get('CpuCompiler::RunBackend', 0):.2f}"
      t["fusion emitters s"] = f"{ph.get('FusionCompiler::Compile', 0):.2f}"
      t["LLVM JIT s"] = f"{ph.get('JitCompiler::Compile', 0):.2f}"
    if "tpu_compile_s" in r:
      t["TPU compile s"] = f"{r['tpu_compile_s']:.2f}"
    t.update({"HLO instrs": r["instructions"], "fusions": r["fusions"], "whiles": r["whiles"]})
    table_rows.append(t)
  print(benchlib.table(table_rows, cols))
  if missing:
    print("not available in this checkout: " + ", ".join(benchlib.scheme_label(s) for s in missing))
  benchlib.write_results(
    args.out,
    rows,
    table_rows,
    cols,
    layers=args.layers,
    model=dict(tokens=TOKENS, hidden=HIDDEN, ffn=FFN, heads=HEADS, devices=DEVICES),
    unavailable=missing,
  )
  plot(rows, os.path.splitext(args.out)[0] + ".png")
  return 0


def _what(row: dict) -> str:
  """What a row compiled: the scheme's name, "bare EXCHANGE" or "original"."""
  if row["scheme"]:
    return benchlib.scheme_label(row["scheme"])
  return f"bare {row['exchange']}" if row.get("exchange") else "original"


def plot(rows, path) -> None:
  plt = benchlib.pyplot()
  if plt is None:
    return
  rs = [r for r in rows if "compile_s" in r and not r.get("xla_flags")]
  fig, ax = plt.subplots(figsize=(7, 3))
  labels = [
    r["model"] + ", " + ("scan" if r["scanned"] else "unrolled") + "\n" + _what(r) for r in rs
  ]
  xs = range(len(rs))
  ax.bar([x - 0.2 for x in xs], [r["compile_s"] for r in rs], 0.4, label="XLA:CPU compile")
  ax.bar(
    [x + 0.2 for x in xs],
    [r.get("tpu_compile_s", 0) for r in rs],
    0.4,
    label="TPU (libtpu AOT) compile",
  )
  ax.set_xticks(list(xs), labels, fontsize=7)
  ax.set_ylabel("seconds")
  ax.set_title(f"{rows[0]['layers']}-layer TP transformer: compile time", fontsize=9)
  ax.legend(fontsize=7)
  benchlib.save_plot(fig, path)


if __name__ == "__main__":
  sys.exit(main())
