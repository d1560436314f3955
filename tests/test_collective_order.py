"""One order of collectives on every device: the rewrite never makes a program hang.

Every device must enter a program's collectives in one order.  XLA:CPU orders the
collectives of one computation by their launch, the same on every device, but a call or
a loop that holds collectives is launched before the collectives inside it, so a
collective after it could start first on some devices and last on others; with XLA:CPU's
bounded thread pool that deadlocked a flax train step (BUILD_NOTES, "One order of
collectives").  The rewrite therefore keeps every collective it emits where the
all-reduce was: outlined functions hold compute only, and on CPU no loop it emits holds
a collective.

Checked three ways: the compiled program itself (what XLA runs: no collective in a
computation that a call runs); the program corpus of test_faithful.py with every
all-reduce rewritten, in each outline mode; and a flax NNX model trained with optax on
FSDP and TP meshes in a child process whose collective timeouts are lowered, so that a
hang fails the test in seconds instead of waiting for XLA's abort.
"""

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import programs
import pytest
from programs import QUANTIZED

import equarx_pass

ORDER_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "order_program.py")
# A collective that waits this long aborts the child (XLA:CPU's defaults: 40 s).
WATCHDOG = (
  "--xla_cpu_collective_call_terminate_timeout_seconds=20 "
  "--xla_cpu_collective_call_warn_stuck_timeout_seconds=10"
)
COLLECTIVE = re.compile(
  r"= \S+ (all-reduce|all-gather|all-to-all|reduce-scatter|collective-permute)(-start)?\("
)
CALL = re.compile(r" call\([^)]*\), to_apply=%([\w.\-]+)")
LOOP = re.compile(r" while\(.*body=%([\w.\-]+)")


def called_computations_with_collectives(hlo_text: str, loops: bool = False) -> list[str]:
  """Computations of a compiled program that a `call` (with `loops`, also a `while`)
  runs and that hold a collective."""
  bodies: dict[str, list[str]] = {}
  name = None
  for line in hlo_text.splitlines():
    head = re.match(r"^(?:ENTRY )?%([\w.\-]+) ", line)
    if head and line.rstrip().endswith("{"):
      name = head.group(1)
      bodies[name] = []
    elif name is not None:
      bodies[name].append(line)
  patterns = (CALL, LOOP) if loops else (CALL,)
  called = {
    m.group(1)
    for lines in bodies.values()
    for line in lines
    for pattern in patterns
    for m in pattern.finditer(line)
  }
  return sorted(c for c in called if any(COLLECTIVE.search(line) for line in bodies.get(c, [])))


def psum_sites(x, y, z):
  """Independent sites of several sizes next to a native collective, as XLA may order
  them any way: a scalar, a vector and a matrix psum, and an int32 all-to-all."""
  a = jax.lax.psum(jax.numpy.sum(x), "x")
  b = jax.lax.psum(x * 2.0, "x")
  c = jax.lax.all_to_all(z, "x", 0, 0, tiled=True)
  d = jax.lax.psum(y @ y.T, "x")
  return a, b, c, d


def psum_program():
  mesh = jax.make_mesh((8,), ("x",))
  spec = jax.sharding.PartitionSpec("x")
  fn = jax.shard_map(
    psum_sites,
    mesh=mesh,
    in_specs=spec,
    out_specs=(jax.sharding.PartitionSpec(),) * 2 + (spec,) * 2,
    check_vma=False,
  )
  rng = np.random.default_rng(0)
  args = (
    rng.standard_normal((8 * 1024,), np.float32),
    rng.standard_normal((8 * 64, 128), np.float32),
    np.arange(8 * 64, dtype=np.int32),
  )
  return fn, tuple(jax.device_put(a, jax.sharding.NamedSharding(mesh, spec)) for a in args)


@pytest.mark.parametrize(
  "scheme",
  [
    "",
    "--equarx_algorithm=ring --equarx_rotation=none",
    "--equarx_algorithm=ring --equarx_form=flat",
    "--equarx_algorithm=bidirectional --equarx_rotation=none",
    "--equarx_algorithm=two_shot --equarx_form=flat",
  ],
)
@pytest.mark.parametrize("outline", ["auto", "on", "off"])
def test_compiled_program_runs_no_collective_inside_a_call(outline, scheme):
  fn, args = psum_program()
  w = equarx_pass.jit(fn, flags=f"{QUANTIZED} --equarx_outline={outline} {scheme}")
  compiled = w.lower(*args).compile()
  assert sum(r.rewritten for r in w.report.records) == 3
  text = compiled.as_text()
  # The program has no loop of its own: any loop holding a collective would be ours.
  assert called_computations_with_collectives(text, loops=True) == []
  if outline != "off":
    assert CALL.search(text), "outlined sites must stay calls"
  jax.block_until_ready(compiled(*args))


CORPUS = programs.corpus()


@pytest.mark.parametrize("outline", ["auto", "off"])
@pytest.mark.parametrize("prog", CORPUS, ids=lambda p: p.name)
def test_corpus_with_every_all_reduce_rewritten_runs(prog, outline):
  """Every real program of the corpus, every all-reduce rewritten (--equarx_min_bytes=0),
  compiles to a program that runs no collective inside a call, and runs."""
  flags = f"{QUANTIZED} --equarx_outline={outline} {prog.extra_flags}".strip()
  fn = equarx_pass.jit(prog.fn, flags=flags, **prog.jit_kwargs)
  args = prog.make_args()
  compiled = fn.lower(*args).compile()
  assert called_computations_with_collectives(compiled.as_text()) == []
  out = jax.block_until_ready(compiled(*args))
  for leaf in jax.tree_util.tree_leaves(out):
    if jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating):
      assert np.isfinite(np.asarray(leaf, np.float32)).all()


def run_child(flags: str, *options: str) -> dict:
  """tests/order_program.py in a child process with XLA's collective timeouts lowered."""
  env = dict(os.environ, XLA_FLAGS=WATCHDOG, JAX_PLATFORMS="cpu")
  try:
    proc = subprocess.run(
      [sys.executable, ORDER_PROGRAM, flags, *options],
      capture_output=True,
      text=True,
      timeout=300,
      env=env,
    )
  except subprocess.TimeoutExpired:
    pytest.fail(f"{flags} {options}: the program did not finish in 300 s (a hang)")
  if proc.returncode != 0:
    stuck = [line for line in proc.stderr.splitlines() if "rendezvous" in line]
    pytest.fail(
      f"{flags} {options}: exit {proc.returncode}"
      + (f"; devices waited at different collectives: {stuck[-1][:300]}" if stuck else "")
      + f"\n{proc.stderr[-2000:]}"
    )
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
  "mesh, outline", [("fsdp", "auto"), ("fsdp", "off"), ("tp", "auto")], ids=str
)
def test_nnx_train_step_never_hangs_and_trains_like_jax_jit(mesh, outline):
  out = run_child(f"{QUANTIZED} --equarx_outline={outline}", "--mesh", mesh)
  assert out["routes"] and set(out["routes"]) == {"partitioned"}
  assert out["rewritten"] >= 10, out
  for got, want in zip(out["equarx"], out["jax_jit"], strict=True):
    assert abs(got - want) <= 1e-2 * abs(want), (out["equarx"], out["jax_jit"])
