"""MaxText, unchanged, under equarx_pass: losses on 8 CPU devices and multislice TPU compiles.

    python tools/check_maxtext.py                  # both parts (about 35 minutes on 2 cores)
    python tools/check_maxtext.py --part cpu       # the CPU training runs only
    python tools/check_maxtext.py --part aot --topologies v5e-8:2

Run it with the Python of an environment that has MaxText 0.2.4 (Python 3.12 or later),
jax[tpu]==0.10.2 (libtpu, for the compile-only TPU topologies) and this checkout
(`pip install -e .`): docs/guides/maxtext.md gives the commands.  Each run is a child
process of that Python (`--python` names another); the pass is turned on without touching
MaxText, by `python -m equarx_pass.frontends.launch`, which makes `jax.jit` equarx_pass.jit for the
process and reads the flags from EQUARX_FLAGS.

Part `cpu`: MaxText's own trainer (`-m maxtext.trainers.pre_train.train`) on 8 CPU
devices, a mesh of data 2 x fsdp 4, a tiny llama2-style model (2 layers, emb 128, vocab
1024, batch 8 x 128), synthetic data, --steps steps (6), three runs: jax.jit, the pass
with --int8-flags, the pass with --identity-flags (--cpu-runs picks), and one more per
--cpu-run NAME=FLAGS.  The losses are read from MaxText's metrics file (full precision):
identity must equal jax.jit's bit for bit at every step, the others be within 1%
(relative) at every step.

Part `aot`: MaxText's `train_compile` (its AOT compile for a TPU topology named like
`v5e-8`, with compile_topology_num_slices slices; no TPU needed) of a llama2-style decoder
of 134.1M parameters (12 layers, emb 768, 12 heads of 64, MLP 2048, vocab 32000, untied
output layer, sequence 2048, 4 sequences per chip; f32 weights, bf16 activations), mesh
dcn_data_parallelism=SLICES x ici_fsdp_parallelism=CHIPS, natively and under the pass
with --aot-flags.  Per compile: the wall time of MaxText's jit_and_compile (jit, lower,
compile), the bytes per chip one train step sends between slices (DCN) and the part of
them that is int8 codes, counted from the compiled program (each computation's host
transfers by equarx_pass.frontends.tpu_aot.cross_slice_bytes, times the runs of that computation in
one step: the scanned layers' loop bodies once per iteration; computations that run only
in a conditional's branch apart, as dcn_bytes_in_branches), and
compiled.memory_analysis() (peak, and MaxText's own total: arguments + outputs +
temporaries - aliased).  Each compiled program's HLO text is kept in --work.

Exit status 1 when a loss check fails or a run fails; the table and the per-run figures go
to results/maxtext_check.json (--out).  A failing run's output is kept in --work and its
tail printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

TRAIN = "maxtext.trainers.pre_train.train"
INT8_FLAGS = "--equarx_enable --equarx_report --equarx_domain_devices=4"
IDENTITY_FLAGS = (
  "--equarx_enable --equarx_report --equarx_identity --equarx_force --equarx_min_bytes=0 "
  "--equarx_ops=all_reduce,reduce_scatter,all_gather"
)
AOT_FLAGS = "--equarx_enable --equarx_report"

# Arguments of every MaxText run: no checkpoints, TensorBoard or persistent compile cache
# (MaxText's jax_cache_dir, default ~/jax_cache: a cached executable would hide the
# compile time and let a run reuse another's program).
COMMON = [
  "dataset_type=synthetic",
  "enable_checkpointing=false",
  "enable_tensorboard=false",
  "jax_cache_dir=",
  "attention=dot_product",
]
CPU_MODEL = [
  "hardware=cpu",
  "skip_jax_distributed_system=true",
  "ici_data_parallelism=2",
  "ici_fsdp_parallelism=4",
  "per_device_batch_size=1",
  "max_target_length=128",
  "base_emb_dim=128",
  "base_num_query_heads=4",
  "base_num_kv_heads=4",
  "head_dim=32",
  "base_mlp_dim=256",
  "base_num_decoder_layers=2",
  "vocab_size=1024",
  "learning_rate=1e-3",
]
# 134.1M parameters: embedding and output layer 2 x 32000 x 768, 12 layers of
# 4 x 768 x 768 (attention) + 3 x 768 x 2048 (SwiGLU MLP) + 2 x 768 (norms), final norm.
AOT_MODEL = [
  "base_emb_dim=768",
  "base_num_query_heads=12",
  "base_num_kv_heads=12",
  "head_dim=64",
  "base_mlp_dim=2048",
  "base_num_decoder_layers=12",
  "vocab_size=32000",
  "max_target_length=2048",
  "per_device_batch_size=4",
]


def aot_args(topology: str, slices: int) -> list[str]:
  return [
    f"compile_topology={topology}",
    f"compile_topology_num_slices={slices}",
    f"dcn_data_parallelism={slices}",
    "ici_fsdp_parallelism=-1",
  ]


# --- DCN bytes of one step, loops counted ------------------------------------------------

# MaxText scans its layers (scan_layers=true): the per-layer gradient all-reduces sit in the
# backward while loop's body (XLA peels one iteration into the caller), so one step sends
# the body's transfers once per iteration; equarx_pass.frontends.tpu_aot.cross_slice_bytes counts so.
# Here the same count is split by computation, with the part that is s8 codes.


def dcn_bytes_per_step(text: str, slices: int) -> tuple[float, float, float, dict]:
  """(bytes per chip one run sends between slices, the part of them that is s8 codes, the
  bytes of computations that run only when a conditional's branch is taken, as if taken
  and not in the first two, {computation: [runs, bytes per run, only in a branch]} for
  the computations that send any)."""
  from equarx_pass.frontends.tpu_aot import cross_slice_bytes
  from equarx_pass.ir.hlo_text import executions, only_in_branches, split_computations

  comps, _ = split_computations(text)
  runs = executions(text)
  taken = only_in_branches(text)
  total, codes, in_branches, where = 0.0, 0.0, 0.0, {}
  for name, lines in comps.items():
    sent = cross_slice_bytes("\n".join(lines), slices)
    if not sent:
      continue
    where[name] = [runs.get(name, 0), sent, name in taken]
    if name in taken:
      in_branches += runs.get(name, 0) * sent
      continue
    total += runs.get(name, 0) * sent
    s8 = [line for line in lines if re.search(r"= \(s8\[", line)]
    codes += runs.get(name, 0) * cross_slice_bytes("\n".join(s8), slices)
  return total, codes, in_branches, where


# --- the child: MaxText's train_compile, measured ----------------------------------------


def aot_child(out_path: str, maxtext_args: list[str]) -> int:
  """Run MaxText's train_compile.main on `maxtext_args`, timing its jit_and_compile and
  writing what the compiled program sends and holds to `out_path` (JSON)."""
  import numpy as np
  from maxtext.trainers.pre_train import train_compile

  from equarx_pass.frontends.tpu_aot import count_collectives, cross_slice_bytes, estimated_cycles

  slices = next(
    int(a.split("=", 1)[1]) for a in maxtext_args if a.startswith("compile_topology_num_slices=")
  )
  original = train_compile.jit_and_compile

  def measured(func, *args, **kwargs):
    start = time.perf_counter()
    compiled = original(func, *args, **kwargs)
    seconds = time.perf_counter() - start
    text = compiled.as_text()
    stats = compiled.memory_analysis()
    get = lambda name: int(getattr(stats, name)) if hasattr(stats, name) else None
    mem = {
      name: get(name)
      for name in (
        "argument_size_in_bytes",
        "output_size_in_bytes",
        "alias_size_in_bytes",
        "temp_size_in_bytes",
        "generated_code_size_in_bytes",
        "host_temp_size_in_bytes",
        "peak_memory_in_bytes",
      )
    }
    total = (
      mem["argument_size_in_bytes"]
      + mem["output_size_in_bytes"]
      + mem["temp_size_in_bytes"]
      - mem["alias_size_in_bytes"]
    )
    hlo_path = os.path.splitext(out_path)[0] + ".hlo.txt"
    with open(hlo_path, "w") as f:
      f.write(text)
    try:
      dcn, dcn_s8, dcn_branches, dcn_where = dcn_bytes_per_step(text, slices)
    except Exception as e:  # a loop this reading does not understand: say so
      dcn, dcn_s8, dcn_branches, dcn_where = None, None, None, f"{type(e).__name__}: {e}"
    params = None
    try:  # the model's parameters: the nnx.Param leaves of the abstract train state
      import jax

      state = args[0][0]
      params = sum(
        int(np.prod(leaf.shape))
        for path, leaf in jax.tree_util.tree_leaves_with_path(state)
        if "model" in jax.tree_util.keystr(path)
        and "rngs" not in jax.tree_util.keystr(path)
        and hasattr(leaf, "shape")
      )
    except Exception:
      pass
    result = dict(
      compile_seconds=seconds,
      dcn_bytes_per_chip=dcn,
      dcn_s8_bytes_per_chip=dcn_s8,
      dcn_bytes_in_branches=dcn_branches,
      dcn_bytes_static=cross_slice_bytes(text, slices),
      dcn_by_computation=dcn_where,
      estimated_cycles=estimated_cycles(text),
      parameters=params,
      host_transfers=sum("is_host_transfer=true" in line for line in text.splitlines()),
      memory=mem,
      maxtext_total_bytes=total,
      jit=f"{type(compiled).__module__}.{type(compiled).__qualname__}",
      hlo=hlo_path,
      **count_collectives(text),
    )
    with open(out_path, "w") as f:
      json.dump(result, f)
    print(
      f"check_maxtext: {json.dumps({k: v for k, v in result.items() if k != 'all_reduce_shapes'})}",
      flush=True,
    )
    return compiled

  train_compile.jit_and_compile = measured
  train_compile.main([train_compile.__file__, *maxtext_args])
  return 0


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "_aot":
  sys.exit(aot_child(sys.argv[2], sys.argv[3:]))


# --- the parent: runs and checks ---------------------------------------------------------


def run_child(
  name: str, argv: list[str], env: dict, work: str, timeout: float
) -> tuple[bool, float, str]:
  """Run one child, its output to WORK/NAME.log: (ok, seconds, log path)."""
  log = os.path.join(work, name + ".log")
  shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k in SHOWN_ENV)
  print(f"[{name}] {shown} {shlex.join(argv)}", flush=True)
  start = time.perf_counter()
  with open(log, "w") as f:
    try:
      proc = subprocess.run(
        argv, env=dict(os.environ, **env), stdout=f, stderr=subprocess.STDOUT, timeout=timeout
      )
      ok = proc.returncode == 0
      why = f"exit code {proc.returncode}"
    except subprocess.TimeoutExpired:
      ok, why = False, f"timed out after {timeout:.0f} s"
  seconds = time.perf_counter() - start
  if not ok:
    with open(log, errors="replace") as f:
      tail = f.read()[-3000:]
    print(f"[{name}] FAILED ({why}, {seconds:.0f} s); the end of {log}:\n{tail}", flush=True)
  else:
    print(f"[{name}] done in {seconds:.0f} s ({log})", flush=True)
  return ok, seconds, log


SHOWN_ENV = ("EQUARX_FLAGS", "XLA_FLAGS", "JAX_PLATFORMS", "ALLOW_MULTIPLE_LIBTPU_LOAD")


def launcher(python: str, flags: str | None) -> tuple[list[str], dict]:
  """The interpreter prefix and environment of a native run (flags None) or a pass run."""
  if flags is None:
    return [python], {}
  return [python, "-m", "equarx_pass.frontends.launch"], {"EQUARX_FLAGS": flags}


def report_summary(log: str) -> str:
  """The launcher's exit summary of a log (its 'equarx-run: ...' lines, one per function
  with collectives), or else the site reports' summary lines."""
  with open(log, errors="replace") as f:
    lines = [line.strip() for line in f]
  found = [line for line in lines if line.startswith("equarx-run:")]
  found = found or [line for line in lines if " sites rewritten" in line]
  return " | ".join(dict.fromkeys(found))


def read_losses(path: str) -> list[float]:
  """MaxText's metrics file: one JSON object per step, in order."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    records = [json.loads(line) for line in f if line.strip()]
  records.sort(key=lambda r: r["step"])
  return [float(r["learning/loss"]) for r in records]


def cpu_part(args, work: str) -> tuple[list[dict], bool]:
  env = {
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": (
      os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip(),
  }
  runs = [("jax.jit", None)]
  runs += [
    (name, {"int8": args.int8_flags, "identity": args.identity_flags}[name])
    for name in args.cpu_runs
  ]
  for text in args.cpu_run:  # NAME=FLAGS: one more pass run, checked as int8 is
    name, _, flags = text.partition("=")
    if not name or not flags or name in dict(runs):
      sys.exit(f"--cpu-run takes NAME=FLAGS with a new NAME, got {text!r}")
    runs.append((name, flags))
  losses, rows, ok_all = {}, [], True
  for name, flags in runs:
    metrics = os.path.join(work, f"cpu_{name}.metrics.jsonl")
    if os.path.exists(metrics):
      os.remove(metrics)
    prefix, extra = launcher(args.python, flags)
    argv = [
      *prefix,
      "-m",
      TRAIN,
      f"run_name=check_maxtext_cpu_{name.replace('.', '_')}",
      f"base_output_directory={work}",
      f"metrics_file={metrics}",
      f"steps={args.steps}",
      *COMMON,
      *CPU_MODEL,
      *args.maxtext_arg,
    ]
    ok, seconds, log = run_child(f"cpu_{name}", argv, dict(env, **extra), work, args.timeout)
    got = read_losses(metrics)
    if ok and len(got) < args.steps:
      print(f"[cpu_{name}] only {len(got)} of {args.steps} steps in {metrics}")
      ok = False
    ok_all &= ok
    losses[name] = got
    row = dict(run=name, flags=flags or "", seconds=seconds, ok=ok, losses=got, log=log)
    if flags:
      row["report"] = report_summary(log)
    rows.append(row)
  want = losses["jax.jit"]
  print()
  header = f"{'step':>4}  " + "  ".join(f"{name:>18}" for name, _ in runs)
  print(header)
  for i in range(args.steps):
    cells = [
      f"{losses[name][i]:18.9g}" if i < len(losses[name]) else f"{'-':>18}" for name, _ in runs
    ]
    print(f"{i:>4}  " + "  ".join(cells))
  for row in rows[1:]:
    got = row["losses"]
    if not want or len(got) < args.steps or len(want) < args.steps:
      row["check"] = "no losses to compare"
      ok_all = False
      continue
    rel = [abs(g - w) / abs(w) for g, w in zip(got, want)]
    row["largest_relative_difference"] = max(rel)
    if row["run"] == "identity":
      same = all(g == w for g, w in zip(got, want))
      row["check"] = "bit for bit" if same else f"DIFFERS (largest {max(rel):.2e})"
      ok_all &= same
    else:
      passed = max(rel) <= 1e-2
      row["check"] = ("within 1%" if passed else "MORE THAN 1% OFF") + f" (largest {max(rel):.2e})"
      ok_all &= passed
    print(f"{row['run']}: {row['check']} against jax.jit over {args.steps} steps")
    if row.get("report"):
      print(f"  {row['report']}")
  return rows, ok_all


def parse_topology(text: str) -> tuple[str, int]:
  name, _, slices = text.partition(":")
  return name, int(slices or 2)


def aot_part(args, work: str) -> tuple[list[dict], bool]:
  env = {
    "JAX_PLATFORMS": "cpu",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    "TPU_SKIP_MDS_QUERY": "1",
    "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1"),
  }
  runs = [("jax.jit", None)] * ("native" in args.runs) + [("equarx", args.aot_flags)] * (
    "pass" in args.runs
  )
  rows, ok_all = [], True
  for text in args.topologies:
    topology, slices = parse_topology(text)
    for name, flags in runs:
      tag = f"aot_{topology}x{slices}_{'native' if flags is None else 'pass'}"
      out = os.path.join(work, tag + ".json")
      if os.path.exists(out):
        os.remove(out)
      prefix, extra = launcher(args.python, flags)
      argv = [
        *prefix,
        os.path.abspath(__file__),
        "_aot",
        out,
        f"run_name=check_maxtext_{tag}",
        f"base_output_directory={work}",
        *COMMON,
        *AOT_MODEL,
        *aot_args(topology, slices),
        *args.maxtext_arg,
      ]
      ok, seconds, log = run_child(tag, argv, dict(env, **extra), work, args.timeout)
      row = dict(topology=topology, slices=slices, run=name, flags=flags or "", ok=ok, log=log)
      row["process_seconds"] = seconds
      if os.path.exists(out):
        with open(out) as f:
          row.update(json.load(f))
      else:
        ok = False
      if flags:
        row["report"] = report_summary(log)
      ok_all &= ok
      rows.append(row)
  return rows, ok_all


CLOCK_HZ = 1.5e9  # v5e's clock, at which the compiler's estimated cycles are read


def mib(n) -> str:
  return "" if n is None else f"{n / 2**20:.1f}"


def added_over_saved(run: dict, native: dict) -> str:
  """The on-chip time the rewrite adds (the TPU compiler's estimated cycles at 1.5 GHz,
  loop bodies times their runs) over the DCN time it saves at the cost model's figure for
  v5e (3.125 GB/s a chip): the target is at most 1/4."""
  from equarx_pass.platforms import rules_for

  keys = ("estimated_cycles", "dcn_bytes_per_chip")
  if run is native or any(run.get(k) is None or native.get(k) is None for k in keys):
    return ""
  dcn = rules_for("tpu").links_for("TPU v5 lite")[1]
  added = (run["estimated_cycles"] - native["estimated_cycles"]) / CLOCK_HZ
  saved = (native["dcn_bytes_per_chip"] - run["dcn_bytes_per_chip"]) / (dcn.gbytes_per_s * 1e9)
  return f"{added / saved:.2f}" if saved > 0 else ""


def aot_table(rows: list[dict]) -> tuple[list[dict], list[str]]:
  columns = [
    "topology x slices",
    "run",
    "compile s",
    "DCN MiB/chip/step",
    "vs native",
    "peak MiB",
    "MaxText total MiB",
    "of it s8",
    "on-chip added / DCN saved",
    "all-reduces left",
  ]
  native = {(r["topology"], r["slices"]): r for r in rows if r["run"] == "jax.jit"}
  table_rows = []
  for r in rows:
    base = native.get((r["topology"], r["slices"]), {})
    dcn, base_dcn = r.get("dcn_bytes_per_chip"), base.get("dcn_bytes_per_chip")
    mem = r.get("memory") or {}
    table_rows.append(
      {
        "topology x slices": f"{r['topology']} x {r['slices']}",
        "run": r["run"] if r.get("ok") else r["run"] + " (FAILED)",
        "compile s": f"{r['compile_seconds']:.1f}" if "compile_seconds" in r else "",
        "DCN MiB/chip/step": mib(dcn),
        "vs native": f"{dcn / base_dcn:.3f}" if dcn is not None and base_dcn else "",
        "peak MiB": mib(mem.get("peak_memory_in_bytes")),
        "MaxText total MiB": mib(r.get("maxtext_total_bytes")),
        "of it s8": mib(r.get("dcn_s8_bytes_per_chip")),
        "on-chip added / DCN saved": added_over_saved(r, base),
        "all-reduces left": r.get("all_reduces", ""),
      }
    )
  return table_rows, columns


def add_run_arguments(parser, work: str, result: str, work_help: str) -> None:
  """The options of every MaxText run a tool makes: extra MaxText arguments, the time
  limit, the work folder and the result file (under results/)."""
  parser.add_argument(
    "--maxtext-arg",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="one more MaxText argument for every run (repeat; overrides the tool's)",
  )
  parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
  parser.add_argument("--work", default=work, help=work_help)
  parser.add_argument("--out", default=os.path.join(ROOT, "results", result), help="result JSON")


def check_environment(python: str) -> None:
  """Exit with a clear message unless `python` imports MaxText, JAX and equarx_pass."""
  probe = subprocess.run(
    [python, "-c", "import maxtext, jax, equarx_pass; print(jax.__version__)"],
    capture_output=True,
    text=True,
  )
  if probe.returncode != 0:
    sys.exit(
      f"{python} cannot import maxtext, jax and equarx_pass (see docs/guides/maxtext.md):\n"
      + probe.stderr[-1500:]
    )


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--part", choices=("cpu", "aot", "all"), default="all")
  parser.add_argument(
    "--python",
    default=sys.executable,
    help="the interpreter of the environment with MaxText, jax[tpu] and equarx_pass "
    "(default: this one)",
  )
  parser.add_argument("--steps", type=int, default=6, help="CPU training steps (default 6)")
  parser.add_argument("--int8-flags", default=INT8_FLAGS, help="EQUARX_FLAGS of the CPU int8 run")
  parser.add_argument(
    "--identity-flags", default=IDENTITY_FLAGS, help="EQUARX_FLAGS of the CPU identity run"
  )
  parser.add_argument(
    "--cpu-runs",
    nargs="*",
    choices=("int8", "identity"),
    default=["int8", "identity"],
    help="CPU: the built-in pass runs beside jax.jit (default both)",
  )
  parser.add_argument(
    "--cpu-run",
    action="append",
    default=[],
    metavar="NAME=FLAGS",
    help="CPU: one more pass run with these EQUARX_FLAGS, within 1%% of jax.jit at every "
    "step (repeat)",
  )
  parser.add_argument("--aot-flags", default=AOT_FLAGS, help="EQUARX_FLAGS of the AOT pass runs")
  parser.add_argument(
    "--topologies",
    nargs="+",
    default=["v5e-8:2", "v5e-16:4"],
    help="MaxText compile_topology:slices pairs (default v5e-8:2 v5e-16:4)",
  )
  parser.add_argument(
    "--runs",
    nargs="+",
    choices=("native", "pass"),
    default=["native", "pass"],
    help="AOT: which compiles of each topology (default both)",
  )
  add_run_arguments(parser, "/tmp/check_maxtext", "maxtext_check.json", "logs, metrics, HLO texts")
  args = parser.parse_args()
  os.makedirs(args.work, exist_ok=True)
  check_environment(args.python)

  sys.path.insert(0, HERE)
  import benchlib

  fields, results, ok = {}, [], True
  if args.part in ("cpu", "all"):
    rows, passed = cpu_part(args, args.work)
    ok &= passed
    results += [dict(part="cpu", **r) for r in rows]
    fields.update(cpu_mesh="data 2 x fsdp 4", cpu_model=CPU_MODEL, steps=args.steps)
  if args.part in ("aot", "all"):
    rows, passed = aot_part(args, args.work)
    ok &= passed
    table_rows, columns = aot_table(rows)
    print()
    print(benchlib.table(table_rows, columns, "MaxText train step, compiled for TPU (no TPU)"))
    for r in rows:
      if r.get("report"):
        print(f"{r['topology']} x {r['slices']}: {r['report']}")
    results += [
      dict(part="aot", **{k: v for k, v in r.items() if k != "all_reduce_shapes"}) for r in rows
    ]
    fields.update(
      aot_model=AOT_MODEL,
      aot_parameters=next((r["parameters"] for r in rows if r.get("parameters")), None),
      table_markdown=benchlib.markdown_table(table_rows, columns),
    )
  fields.update(maxtext_common=COMMON, maxtext_extra=args.maxtext_arg)
  benchlib.write_result(args.out, results, **fields)
  print("PASSED" if ok else "FAILED")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
