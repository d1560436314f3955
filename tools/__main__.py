"""The benchmark suite's one entry point, run from the repository root:

    python -m tools                      # lists the subcommands
    python -m tools SUBCOMMAND [ARGS]    # the same as python tools/SUBCOMMAND.py [ARGS]
    python -m tools SUBCOMMAND --help    # that subcommand's own options

Each subcommand is one script in this folder.  The data generators (fixtures, corpora,
reference embeddings) are not subcommands: they are scripts in tools/data/.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Subcommand -> one line.  The subcommand runs tools/<subcommand>.py.
BENCHMARKS = {
  "bench_auto_sharded": "extra compile cost of the partitioned route (compiler-inserted all-reduces)",
  "bench_compile": "pass time and compile time on a 64-layer tensor-parallel transformer",
  "bench_first_call": "first call and lower+compile against jax.jit, nothing or something to rewrite",
  "bench_dispatch": "per-call Python dispatch overhead of equarx_pass.jit against jax.jit",
  "bench_gpu_aot": "multi-node H100 clusters, compile-only: bytes across nodes, compile time",
  "bench_gpu_step": "the ring step's arithmetic on one device, against copy bandwidth",
  "bench_kernel": "the quantize stage as one Pallas kernel against XLA's, on one device",
  "bench_multislice": "multislice TPU, compile-only: DCN bytes, on-chip time, compile time",
  "bench_ring_cpu": "the all-reduce's own compute on P virtual CPU devices in one process",
  "bench_tpu": "the TPU compiler's estimates for the native and the rewritten all-reduce",
  "bench_tpu_partitioned": "an auto-sharded FSDP step compiled for multislice TPU: DCN, compile",
  "bench_twin": "the emitted all-reduce's local work on one device, no transfers",
  "bench_wire": "wire bytes per rewritten all-reduce, counted from the rewritten module",
  "schedule_estimate": "TPU, compile-only: a psum's time by its compiled schedule, ICI priced",
  "netbench": "all-reduce speed on emulated hosts behind a rate-limited network (root)",
  "train_bench": "a small flax LM trained on real text, jax.jit against equarx_pass.jit",
}
CHECKS = {
  "bf16_ring": "self-check of the bf16 ring baseline on 8 CPU devices",
  "check_diloco": "MaxText's DiLoCo trainer under equarx-run: losses at every sync on 8 CPUs",
  "time_maxtext_compile": "MaxText before its first step: init, lower, compile, natively and under the pass",
  "check_gemma": "flax's gemma example's train step under equarx_pass.jit (a flax checkout)",
  "check_lm1b": "flax's lm1b example's train step under equarx_pass.jit (a flax checkout)",
  "check_maxtext": "MaxText's train step under equarx-run: CPU losses, multislice TPU AOT",
  "check_wmt": "flax's wmt example's train step under equarx_pass.jit (a flax checkout)",
  "emit_digest": "a digest of everything the pass emits, to compare before and after a change",
  "error_table": "relative error and bits per value of every scheme, from the NumPy models",
  "int8_reference": "self-check of the hand-written hierarchical int8 baseline on 8 CPU devices",
  "netns": "smoke test of the emulated network of netbench (root)",
  "outline_bits": "what --equarx_outline changes in the bits of a quantized psum",
  "predict": "the cost model's decision for one psum on a cluster you describe",
  "tp_mlp_report": "figures of a tensor-parallel MLP on 8 CPU devices, per scheme",
}
SUBCOMMANDS = {**BENCHMARKS, **CHECKS}


def usage() -> str:
  width = max(map(len, SUBCOMMANDS))
  lines = ["usage: python -m tools SUBCOMMAND [ARGS]  (python -m tools SUBCOMMAND --help)", ""]
  for title, group in (("benchmarks", BENCHMARKS), ("checks and reports", CHECKS)):
    lines.append(f"{title}:")
    lines += [f"  {name:<{width}}  {what}" for name, what in group.items()]
    lines.append("")
  lines.append("Results (JSON, PNG) go to results/ by default; see tools/README.md.")
  return "\n".join(lines)


def main(argv: list[str]) -> int:
  if not argv or argv[0] in ("-h", "--help"):
    print(usage())
    return 0
  name, args = argv[0], argv[1:]
  if name not in SUBCOMMANDS:
    print(f"unknown subcommand {name!r}\n\n{usage()}", file=sys.stderr)
    return 2
  script = os.path.join(HERE, name + ".py")
  if script.startswith(os.getcwd() + os.sep):
    script = os.path.relpath(script)  # recorded in the results' "command": keep it short
  # A fresh interpreter on the script, exactly as `python tools/NAME.py ARGS` runs it: the
  # tools set XLA_FLAGS and JAX_PLATFORMS before JAX starts, and some run their own file
  # again in child processes.
  os.execv(sys.executable, [sys.executable, script, *args])


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
