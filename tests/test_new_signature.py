"""A step whose state changes pytree after the first call, as MaxText's DiLoCo trainer's.

Its DiLoCoTrainState holds the step count as the optimizer's wrapped counter (a pytree
node with one leaf) at the first call and as the bare array the step returns after: two
input signatures that lower to the same program.  equarx_pass.jit shares a rewrite
between signatures of one program; the executable of the first must not serve the
second, which jax.jit's stages refuse ("Function compiled with input pytree does not
match ...").  The step also syncs in a conditional branch, as DiLoCo's outer step does
(`jax.lax.cond(step % period == 0, sync, ...)`): match.Site.in_branch says so.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import equarx_pass
from equarx_pass.planning import match

MESH = jax.make_mesh((2, 4), ("hosts", "local"))
DATA = P("hosts", "local")
WEIGHTS = P(None, "local")

IDENTITY = "--equarx_enable --equarx_identity --equarx_force --equarx_min_bytes=0"
INT8 = "--equarx_enable --equarx_domain_devices=4 --equarx_force --equarx_min_bytes=0"
NOTHING = "--equarx_enable --equarx_domain_devices=4"  # every site under min_bytes


@jax.tree_util.register_pytree_node_class
class Counter:
  """A wrapped step count, like optax's/nnx's: one leaf, its own node type."""

  def __init__(self, value):
    self.value = value

  def tree_flatten(self):
    return (self.value,), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls(*children)


def _count(state):
  n = state["step"]
  return n.value if isinstance(n, Counter) else n


def _manual_step(state, g):
  """shard_map over both axes: the lowered route."""

  def body(n, w, g):
    return n + 1, w - 0.1 * jax.lax.psum(g, "hosts")

  n, w = jax.shard_map(body, mesh=MESH, in_specs=(P(), WEIGHTS, DATA), out_specs=(P(), WEIGHTS))(
    _count(state), state["w"], g
  )
  return {"step": n, "w": w}


def _auto_step(state, g):
  """The step count outside shard_map: the partitioned route."""

  def body(w, g):
    return w - 0.1 * jax.lax.psum(g, "hosts")

  w = jax.shard_map(body, mesh=MESH, in_specs=(WEIGHTS, DATA), out_specs=WEIGHTS)(state["w"], g)
  return {"step": _count(state) + 1, "w": w}


def _inputs():
  rng = np.random.default_rng(0)
  g = jax.device_put(rng.standard_normal((2, 1024), np.float32), NamedSharding(MESH, DATA))
  w = jax.device_put(np.zeros((1, 1024), np.float32), NamedSharding(MESH, WEIGHTS))
  n = jax.device_put(np.int32(0), NamedSharding(MESH, P()))
  return {"step": Counter(n), "w": w}, g


def _run(step, calls=3):
  state, g = _inputs()
  for _ in range(calls):
    state = step(state, g)
  return state


@pytest.mark.parametrize("fun", [_manual_step, _auto_step], ids=["manual", "auto_sharded"])
@pytest.mark.parametrize("flags", [IDENTITY, INT8, NOTHING], ids=["identity", "int8", "nothing"])
def test_new_pytree_same_program(fun, flags):
  want = _run(jax.jit(fun))
  jitted = equarx_pass.jit(fun, flags=flags)
  got = _run(jitted)  # crashed at the second call: the wrapped count's executable reused
  assert int(got["step"]) == 3
  if flags == INT8:
    np.testing.assert_allclose(np.asarray(got["w"]), np.asarray(want["w"]), atol=0.05)
  else:
    np.testing.assert_array_equal(np.asarray(got["w"]), np.asarray(want["w"]))
  # One lowering per signature: the wrapped count, then the bare one.
  assert len(jitted.report.lowerings) == 2


@jax.jit
def _outer_sum(x):
  """A function only a branch calls (the partitioned program's branch computations)."""
  return jax.lax.psum(x * 2, "hosts")


def test_psum_in_a_branch():
  def body(n, g):
    g = jax.lax.psum(g, "local")  # every step
    return jax.lax.cond(
      n % 4 == 0, lambda x: jax.lax.psum(x, "hosts") + _outer_sum(x), lambda x: x, g
    )

  f = jax.jit(jax.shard_map(body, mesh=MESH, in_specs=(P(), DATA), out_specs=DATA, check_vma=False))
  module = f.lower(
    jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(MESH, P())),
    jax.ShapeDtypeStruct((2, 1024), jnp.float32, sharding=NamedSharding(MESH, DATA)),
  ).compiler_ir("stablehlo")
  facts = match.module_facts(module)
  assert facts.branch_functions == frozenset({"_outer_sum"})
  sites = [match.describe(op, i, facts)[0] for i, op in enumerate(match.find_all_reduces(module))]
  # The psum over "local" runs every call; the branch's own and the one in _outer_sum
  # only when the branch is taken.
  assert [s.in_branch for s in sites] == [False, True, True]
