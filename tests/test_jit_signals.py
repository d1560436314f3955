"""What equarx_pass.jit tells its user, and how it behaves under JAX's transformations.

Warnings: an EquarxWarning, once per wrapped function and reason, when the pass is
enabled and nothing was rewritten, or the partitioned route was not taken, or the
function is called under jax.grad, jax.vmap or an outer jax.jit.  Under those
transformations it works as jax.jit does (the same bits as jax.jit of the same function)
and rewrites nothing; inside another equarx_pass.jit function's lowering it is traced
silently and the outer function's pass rewrites its collectives.
"""

import warnings

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import equarx_pass
from equarx_pass.examples import auto_sharded as ex
from equarx_pass.frontends import partitioned

ON = "--equarx_enable --equarx_min_bytes=0"


def _mlp_fn():
  mesh = Mesh(np.array(jax.devices()), ("tp",))

  def mlp(x, w1, w2):
    return jax.lax.psum(jax.nn.relu(x @ w1) @ w2, "tp")

  return jax.shard_map(mlp, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P())


def _inputs():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((64, 256), np.float32)
  w1 = rng.standard_normal((256, 1024), np.float32) / 16
  w2 = rng.standard_normal((1024, 256), np.float32) / 32
  return x, w1, w2


def _bits(tree):
  return [np.asarray(leaf).tobytes() for leaf in jax.tree_util.tree_leaves(tree)]


def _equarx_warnings(record):
  return [str(w.message) for w in record if issubclass(w.category, equarx_pass.EquarxWarning)]


def _run(fn):
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    out = fn()
  return out, _equarx_warnings(record)


TRANSFORMS = {
  "grad": lambda f, x, w1, w2: jax.grad(lambda x: f(x, w1, w2).sum())(x),
  "vmap": lambda f, x, w1, w2: jax.vmap(f, in_axes=(0, None, None))(np.stack([x, -x]), w1, w2),
  "outer jit": lambda f, x, w1, w2: jax.jit(f)(x, w1, w2),
  "jvp": lambda f, x, w1, w2: jax.jvp(lambda x: f(x, w1, w2), (x,), (x,)),
}


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_under_a_transformation_it_is_jax_jit_and_says_so(name):
  fn = _mlp_fn()
  args = _inputs()
  step = equarx_pass.jit(fn, flags=ON)
  transform = TRANSFORMS[name]
  got, warned = _run(lambda: transform(step, *args))
  want = transform(jax.jit(fn), *args)
  assert _bits(got) == _bits(want)
  assert len(warned) == 1 and "under a JAX transformation" in warned[0], warned
  assert warned[0].startswith("equarx_pass.jit(mlp): ")
  assert len(step.report.lowerings) == 0  # nothing lowered, compiled or rewritten
  # Once per function and reason: the same call again says nothing.
  _, again = _run(lambda: transform(step, *args))
  assert again == []
  # A concrete call afterwards is rewritten as usual.
  step(*args)
  assert [r.decision for r in step.report.records] == ["rewritten"]


def test_grad_of_the_disabled_pass_is_jax_jit_without_a_warning():
  fn = _mlp_fn()
  args = _inputs()
  got, warned = _run(lambda: TRANSFORMS["grad"](equarx_pass.jit(fn), *args))
  assert _bits(got) == _bits(TRANSFORMS["grad"](jax.jit(fn), *args)) and warned == []


def test_inside_another_equarx_function_the_outer_pass_rewrites_it():
  fn = _mlp_fn()
  args = _inputs()
  inner = equarx_pass.jit(fn, flags=ON)
  outer = equarx_pass.jit(lambda x, w1, w2: inner(x, w1, w2) * 2.0, flags=ON)
  same = equarx_pass.jit(lambda x, w1, w2: fn(x, w1, w2) * 2.0, flags=ON)
  got, warned = _run(lambda: outer(*args))
  assert warned == []
  assert [r.decision for r in outer.report.records] == ["rewritten"]
  assert _bits(got) == _bits(same(*args))


def test_training_step_wrapped_outermost_rewrites_forward_and_backward():
  """The documented way to train: equarx_pass.jit around the step that calls jax.grad;
  the forward psum and the backward one (x's cotangent, summed over the devices that
  share x) are both rewritten."""
  fn = _mlp_fn()
  args = _inputs()
  loss = lambda x, w1, w2: (fn(x, w1, w2) ** 2).sum()
  value_and_grad = jax.value_and_grad(loss, argnums=(0, 1, 2))
  step = equarx_pass.jit(value_and_grad, flags=ON)
  got, warned = _run(lambda: step(*args))
  want = jax.jit(value_and_grad)(*args)
  assert warned == []
  assert [r.decision for r in step.report.records] == ["rewritten", "rewritten"]
  for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    assert np.linalg.norm(np.asarray(g) - w) / np.linalg.norm(w) < 5e-2


def test_nothing_rewritten_warns_once_with_the_sites_reasons():
  fn = _mlp_fn()
  x, w1, w2 = _inputs()
  step = equarx_pass.jit(fn, flags="--equarx_enable")  # this 64 KiB psum is below 128 KiB
  _, warned = _run(lambda: step(x, w1, w2))
  assert len(warned) == 1, warned
  assert "--equarx_enable is set but nothing was rewritten in mlp(float32[64, 256]" in warned[0]
  assert "all 1 sites skipped" in warned[0] and "--equarx_min_bytes" in warned[0]
  # Another signature skipped for another size is another reason; the same one is not.
  _, warned = _run(lambda: step(x, w1, w2))
  assert warned == []


def test_no_collective_at_all_warns_once_per_function():
  step = equarx_pass.jit(lambda x: x * 2.0, flags=ON)
  _, first = _run(lambda: step(np.ones(4, np.float32)))
  _, second = _run(lambda: step(np.ones(8, np.float32)))  # a new lowering, the same reason
  assert len(first) == 1 and "the lowered program holds no all_reduce" in first[0], first
  assert second == []


def test_a_rewrite_and_a_disabled_pass_say_nothing():
  fn = _mlp_fn()
  args = _inputs()
  _, warned = _run(lambda: equarx_pass.jit(fn, flags=ON)(*args))
  assert warned == []
  _, warned = _run(lambda: equarx_pass.jit(fn)(*args))
  assert warned == []


def test_partitioned_route_not_taken_warns_with_the_reason(monkeypatch):
  def refuse(lowered, policy, topology=None):
    raise partitioned.NotPartitionable("a reason the route gives")

  monkeypatch.setattr(partitioned, "rewrite_partitioned", refuse)
  mesh = ex.tp_mesh()
  x, w1, w2 = ex.mlp_inputs(mesh)
  step = equarx_pass.jit(ex.mlp, flags=ON)
  _, warned = _run(lambda: step(x, w1, w2))
  assert len(warned) == 1, warned
  assert "the partitioned route was not taken (a reason the route gives)" in warned[0]


def test_the_warning_points_at_the_callers_line():
  step = equarx_pass.jit(lambda x: x + 1.0, flags=ON)
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    step(np.ones(4, np.float32))  # this line
  [w] = [w for w in record if issubclass(w.category, equarx_pass.EquarxWarning)]
  assert w.filename == __file__, w.filename
