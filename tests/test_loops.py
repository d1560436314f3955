"""How many times one run of a program executes a site (loops.py), and the report's bytes
per run of the program."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import equarx_pass
from equarx_pass import report
from equarx_pass.planning import loops, match

MESH = jax.make_mesh((8,), ("x",))


def psum(v):
  return jax.shard_map(
    lambda u: jax.lax.psum(u, "x"), mesh=MESH, in_specs=P(), out_specs=P(), check_vma=False
  )(v)


def scanned(x, ws):
  def body(c, w):
    return jnp.tanh(psum(c @ w)), None

  return jax.lax.scan(body, psum(x), ws)[0]


def lowered(fun, *args):
  return jax.jit(fun).lower(*args).compiler_ir("stablehlo")


X = jax.ShapeDtypeStruct((64, 128), jnp.float32, sharding=NamedSharding(MESH, P()))


def test_a_scan_body_runs_once_per_layer():
  module = lowered(scanned, X, jax.ShapeDtypeStruct((7, 128, 128), jnp.float32))
  runs_of = loops.runs_in(module)
  assert sorted(runs_of(op) for op in match.find_all_reduces(module)) == [1, 7]


def test_nested_loops_multiply():
  def twice(x, ws):
    return jax.lax.fori_loop(0, 3, lambda i, v: scanned(v, ws), x)

  module = lowered(twice, X, jax.ShapeDtypeStruct((5, 128, 128), jnp.float32))
  runs_of = loops.runs_in(module)
  assert sorted(runs_of(op) for op in match.find_all_reduces(module)) == [3, 15]


def test_a_loop_of_unknown_trip_count_is_none():
  def until(x):
    return jax.lax.while_loop(lambda v: v.sum() < 100.0, lambda v: psum(v) + 1.0, x)

  module = lowered(until, X)
  runs_of = loops.runs_in(module)
  assert [runs_of(op) for op in match.find_all_reduces(module)] == [None]


def test_the_report_counts_bytes_per_run_of_the_program():
  fn = equarx_pass.jit(scanned, flags="--equarx_enable --equarx_min_bytes=0 --equarx_force")
  x = jax.device_put(np.ones((64, 128), np.float32), NamedSharding(MESH, P()))
  fn(x, jnp.full((7, 128, 128), 0.01, jnp.float32))
  once, looped = sorted(fn.report.records, key=lambda r: r.runs)
  assert (once.runs, looped.runs) == (1, 7)
  text = str(fn.report)
  assert "runs 7x a call (a loop), bytes for all" in text
  # The summary's bytes are the sites' bytes times their runs: 8 times one site's here.
  per_site = once.bytes_before
  assert f"{8 * per_site / 1024:.1f} KiB ->" in text or f"{8 * per_site / 2**20:.1f} MiB ->" in text


def branched(x):
  """A psum every call, and one in a branch of a lax.cond (as MaxText's DiLoCo trainer
  syncs across slices in one branch, every few steps)."""

  def body(u):
    y = jax.lax.psum(u, "x")
    return jax.lax.cond(y[0, 0] > 0, lambda v: jax.lax.psum(v, "x") * 0.5, lambda v: v * 2.0, y)

  return jax.shard_map(body, mesh=MESH, in_specs=P(), out_specs=P(), check_vma=False)(x)


def test_a_site_in_a_conditional_branch_is_marked():
  module = lowered(branched, X)
  facts = match.module_facts(module)
  ops = match.find_all_reduces(module)
  assert [loops.in_branch(op, facts.branch_functions) for op in ops] == [False, True]


def test_a_function_called_only_from_a_branch_is_conditional():
  # The nested jit is a function of its own, called from the branch.
  called = jax.jit(psum)

  def f(x):
    y = called(x)
    return jax.lax.cond(y[0, 0] > 0, called, lambda v: v * 2.0, y + 1.0)

  module = lowered(f, X)
  facts = match.module_facts(module)
  ops = match.find_all_reduces(module)
  # Called from the branch and outside it: it runs every call.
  assert facts.branch_functions == frozenset()
  assert [loops.in_branch(op, facts.branch_functions) for op in ops] == [False]

  def g(x):
    return jax.lax.cond(x[0, 0] > 0, called, lambda v: v * 2.0, x)

  module = lowered(g, X)
  facts = match.module_facts(module)
  [op] = match.find_all_reduces(module)
  assert facts.branch_functions and loops.in_branch(op, facts.branch_functions)


def test_the_report_counts_branch_sites_apart():
  fn = equarx_pass.jit(branched, flags="--equarx_enable --equarx_min_bytes=0 --equarx_force")
  x = jax.device_put(np.ones((64, 128), np.float32), NamedSharding(MESH, P()))
  fn(x)
  every, taken = sorted(fn.report.records, key=lambda r: r.in_branch)
  assert (every.in_branch, taken.in_branch) == (False, True)
  assert every.rewritten and taken.rewritten and taken.runs == 1
  text = str(fn.report)
  rows = [line for line in text.splitlines() if "int8 two_shot" in line]
  assert len(rows) == 2 and "in a conditional branch, runs only when taken; int8" in rows[1]
  assert "conditional" not in rows[0]
  # The totals: the site of every call, then the branch's site apart, each one site's bytes.
  summary = text.splitlines()[-1]
  name = "network"  # each CPU device stands for a host: all the bytes cross hosts
  one = report.fmt_bytes(round(every.traffic_before.slow))
  one_after = report.fmt_bytes(round(every.traffic_after.slow))
  assert summary == (
    f"2 of 2 all-reduce sites rewritten; bytes per device: {name} {one} -> {one_after} "
    f"(3.88x less) + {name} {one} -> {one_after} (3.88x less) in conditional branches, when taken"
  ), summary
