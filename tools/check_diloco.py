"""MaxText's DiLoCo trainer, unchanged, under equarx_pass: losses at every sync on 8 CPU devices.

    python tools/check_diloco.py                          # the four runs (about 5 minutes)
    python tools/check_diloco.py --python venv-maxtext/bin/python --steps 65

Run it with the Python of an environment that has MaxText 0.2.5 (Python 3.12 or later) and
this checkout, as tools/check_maxtext.py (docs/guides/maxtext.md); `--python` names another
interpreter for the runs, each a child process.

MaxText's own trainer (`-m maxtext.trainers.pre_train.train`) with DiLoCo
(`enable_diloco=true`): 2 replicas of 4 CPU devices (ici_diloco_parallelism=2 x
ici_fsdp_parallelism=4), each training its copy of tools/check_maxtext.py's tiny model on
its half of the batch and syncing every --sync-period steps: the outer step all-reduces
the replicas' parameter deltas across the two groups of 4 devices, in a branch of a
`jax.lax.cond` of the train step.  With `--equarx_domain_devices=4` each replica is a fast
domain, and the sync is what crosses the slow link.  Four runs:

- native: `python -m maxtext.trainers.pre_train.train` (plain jax.jit);
- int8: `python -m equarx_pass.frontends.launch` (equarx-run) with --int8-flags;
- int4: --int8-flags plus `--equarx_slow_format=int4`;
- identity: --identity-flags (every all-reduce through the pass's identity rewrite).

--steps (33) runs 8 syncs at the default period of 4 (after steps 4, 8, ..., 32; a loss is
the loss of the parameters before its step's update, so the loss at the step after a sync
is the first one of the synced parameters, and the last step's that of the 8th sync).
The losses are MaxText's metrics file's `learning/loss` (full precision; replica 0's).

Exit status 1 when a run fails, a loss is NaN or infinite, identity's losses are not
native's bit for bit at every step, or the final loss of int8 is more than 0.5% (relative)
from native's, of int4 more than 1%.  The table and the per-run figures go to
results/maxtext_diloco.json (--out); each run's log is kept in --work.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import benchlib  # noqa: E402
import check_maxtext  # noqa: E402

INT8_FLAGS = check_maxtext.INT8_FLAGS  # --equarx_enable --equarx_report --equarx_domain_devices=4
INT4_FLAGS = INT8_FLAGS + " --equarx_slow_format=int4"
IDENTITY_FLAGS = (
  "--equarx_enable --equarx_report --equarx_identity --equarx_force --equarx_min_bytes=0"
)
# Largest relative difference of the final loss from native's.
TOLERANCE = {"int8": 5e-3, "int4": 1e-2}

# check_maxtext's CPU model, its data-parallel axis made the DiLoCo replicas.
MODEL = [a for a in check_maxtext.CPU_MODEL if not a.startswith("ici_data_parallelism=")]
DILOCO = ["enable_diloco=true", "ici_diloco_parallelism=2"]


def sync_steps(steps: int, period: int) -> list[int]:
  """The metrics-file steps whose update ends with a sync (MaxText syncs when the inner
  step count it has just reached is a multiple of the period)."""
  return [i for i in range(steps) if (i + 1) % period == 0]


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument(
    "--python",
    default=sys.executable,
    help="the interpreter of the environment with MaxText and equarx_pass (default: this one)",
  )
  parser.add_argument("--steps", type=int, default=33, help="training steps (default 33)")
  parser.add_argument(
    "--sync-period", type=int, default=4, help="MaxText's diloco_sync_period (default 4)"
  )
  parser.add_argument("--int8-flags", default=INT8_FLAGS, help="EQUARX_FLAGS of the int8 run")
  parser.add_argument("--int4-flags", default=INT4_FLAGS, help="EQUARX_FLAGS of the int4 run")
  parser.add_argument(
    "--identity-flags", default=IDENTITY_FLAGS, help="EQUARX_FLAGS of the identity run"
  )
  parser.add_argument(
    "--runs",
    nargs="+",
    choices=("int8", "int4", "identity"),
    default=["int8", "int4", "identity"],
    help="the pass runs beside native (default all three)",
  )
  check_maxtext.add_run_arguments(
    parser, "/tmp/check_diloco", "maxtext_diloco.json", "logs and metrics files"
  )
  args = parser.parse_args()
  os.makedirs(args.work, exist_ok=True)
  check_maxtext.check_environment(args.python)

  env = {
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": (
      os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip(),
  }
  flags_of = {"int8": args.int8_flags, "int4": args.int4_flags, "identity": args.identity_flags}
  runs = [("native", None)] + [(name, flags_of[name]) for name in args.runs]
  syncs = sync_steps(args.steps, args.sync_period)
  rows, ok_all = [], True
  for name, flags in runs:
    metrics = os.path.join(args.work, f"diloco_{name}.metrics.jsonl")
    if os.path.exists(metrics):
      os.remove(metrics)
    prefix, extra = check_maxtext.launcher(args.python, flags)
    argv = [
      *prefix,
      "-m",
      check_maxtext.TRAIN,
      f"run_name=check_diloco_{name}",
      f"base_output_directory={args.work}",
      f"metrics_file={metrics}",
      f"steps={args.steps}",
      f"diloco_sync_period={args.sync_period}",
      *check_maxtext.COMMON,
      *MODEL,
      *DILOCO,
      *args.maxtext_arg,
    ]
    ok, seconds, log = check_maxtext.run_child(
      f"diloco_{name}", argv, dict(env, **extra), args.work, args.timeout
    )
    losses = check_maxtext.read_losses(metrics)
    why = [] if ok else ["run failed"]
    if ok and len(losses) < args.steps:
      why.append(f"only {len(losses)} of {args.steps} steps")
    finite = all(math.isfinite(x) for x in losses)
    if not finite:
      why.append("NaN or inf")
    row = dict(run=name, flags=flags or "", seconds=seconds, losses=losses, log=log)
    if flags:
      row["report"] = check_maxtext.report_summary(log)
    row["finite"] = finite
    row["why"] = why
    rows.append(row)

  native = rows[0]["losses"]
  for row in rows[1:]:
    got = row["losses"]
    if len(got) < args.steps or len(native) < args.steps:
      row["why"].append("no losses to compare")
      continue
    rel = [abs(g - w) / abs(w) for g, w in zip(got, native)]
    row["final_relative_difference"] = rel[args.steps - 1]
    row["largest_relative_difference"] = max(rel)
    if row["run"] == "identity":
      row["bit_for_bit"] = got[: args.steps] == native[: args.steps]
      if not row["bit_for_bit"]:
        row["why"].append(f"not bit for bit (largest {max(rel):.2e})")
    elif row["run"] in TOLERANCE and rel[args.steps - 1] > TOLERANCE[row["run"]]:
      row["why"].append(f"final loss more than {TOLERANCE[row['run']]:.1%} from native's")
  for row in rows:
    row["ok"] = not row["why"]
    ok_all &= row["ok"]

  # Per run: the loss at each sync step (the last loss of the parameters before the
  # sync) and after it (the first of the synced ones), the final loss, the comparison.
  def cell(losses, i):
    return f"{losses[i]:.6f}" if i < len(losses) else "-"

  columns = ["run", *(f"s{i}" for i in syncs), "final", "rel. diff final", "largest"]
  columns += ["finite", "wall s", "check"]
  table_rows = []
  for row in rows:
    got = row["losses"]
    t = {"run": row["run"]}
    for i in syncs:
      t[f"s{i}"] = cell(got, i)
    t["final"] = cell(got, args.steps - 1)
    if "final_relative_difference" in row:
      t["rel. diff final"] = f"{row['final_relative_difference']:.2e}"
      t["largest"] = f"{row['largest_relative_difference']:.2e}"
    else:
      t["rel. diff final"] = t["largest"] = "-" if row["run"] != "native" else ""
    t["finite"] = "yes" if row["finite"] else "NO"
    t["wall s"] = f"{row['seconds']:.0f}"
    if row["run"] == "identity" and "bit_for_bit" in row:
      verdict = "bit for bit" if row["bit_for_bit"] else "DIFFERS"
    elif row["run"] in TOLERANCE and "final_relative_difference" in row:
      verdict = f"<= {TOLERANCE[row['run']]:.1%}"
    else:
      verdict = ""
    t["check"] = "FAILED: " + "; ".join(row["why"]) if row["why"] else (verdict or "ran")
    table_rows.append(t)
  print()
  title = (
    f"MaxText DiLoCo, 2 replicas x fsdp 4 (8 CPU devices), sync every {args.sync_period} "
    f"steps, {args.steps} steps; loss (learning/loss) at step sN, whose update ends with a "
    "sync, and at the last step"
  )
  print(benchlib.table(table_rows, columns, title))
  # The first loss of the synced parameters: the step after each sync.
  after = [i + 1 for i in syncs if i + 1 < args.steps]
  print()
  print(f"loss at the step after each sync ({', '.join(map(str, after))}):")
  for row in rows:
    print(f"  {row['run']:>8}: " + " ".join(cell(row["losses"], i) for i in after))
  for row in rows:
    if row.get("report"):
      print(f"{row['run']}: {row['report']}")
  benchlib.write_result(
    args.out,
    rows,
    mesh="diloco 2 x fsdp 4",
    model=MODEL,
    diloco=DILOCO,
    steps=args.steps,
    sync_period=args.sync_period,
    sync_steps=syncs,
    tolerance=TOLERANCE,
    maxtext_common=check_maxtext.COMMON,
    maxtext_extra=args.maxtext_arg,
    table_markdown=benchlib.markdown_table(table_rows, columns),
  )
  print("PASSED" if ok_all else "FAILED")
  return 0 if ok_all else 1


if __name__ == "__main__":
  sys.exit(main())
