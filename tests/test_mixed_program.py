"""Programs that mix shard_map and auto-sharding, as most trainers are written: a loss
reduced by an explicit psum inside shard_map, in a training step whose gradient
all-reduces XLA's SPMD partitioner inserts.  The default route must see both kinds of
all-reduce in one plan, and the report must say which route it read and what it left out.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import equarx_pass
from equarx_pass.planning import match
from equarx_pass.site_kind import SiteKind

AUTO = jax.sharding.AxisType.Auto
LAYERS, D, F = 2, 256, 512
# name -> (mesh shape, axis names, parameter sharding axis, domain flag)
MESHES = {
  "dp": ((8,), ("data",), None, "--equarx_domain_devices=4"),
  "fsdp": ((2, 4), ("data", "fsdp"), "fsdp", "--equarx_domain_devices=4"),
}
IDENTITY = "--equarx_enable --equarx_identity --equarx_force --equarx_min_bytes=0"


def mixed_step(mesh_name: str):
  """(step, params, batch) of the mesh named: a residual MLP whose loss is a psum in
  shard_map over every axis; the parameters replicated (dp) or FSDP-sharded (fsdp)."""
  shape, names, shard_axis, _ = MESHES[mesh_name]
  mesh = jax.make_mesh(shape, names, axis_types=(AUTO,) * len(shape))
  every = names if len(names) > 1 else names[0]

  def loss(params, x):
    for p in params:
      x = x + jnp.tanh(x @ p["w1"]) @ p["w2"]

    def local(h):
      return jax.lax.psum(jnp.mean(h * h), every) / mesh.size

    return jax.shard_map(local, mesh=mesh, in_specs=P(every), out_specs=P())(x)

  def step(params, x):
    value, grads = jax.value_and_grad(loss)(params, x)
    return value, jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)

  rng = np.random.default_rng(0)
  params = [
    {
      "w1": jax.device_put(
        (rng.standard_normal((D, F)) * 0.05).astype(np.float32),
        NamedSharding(mesh, P(shard_axis, None)),
      ),
      "w2": jax.device_put(
        (rng.standard_normal((F, D)) * 0.05).astype(np.float32),
        NamedSharding(mesh, P(None, shard_axis)),
      ),
    }
    for _ in range(LAYERS)
  ]
  x = jax.device_put(rng.standard_normal((64, D)).astype(np.float32), NamedSharding(mesh, P(every)))
  return step, params, x


def train(step_fn, params, x, steps: int):
  losses = []
  for _ in range(steps):
    value, params = step_fn(params, x)
    losses.append(np.asarray(value))
  return losses, params


def compiled_all_reduce_operands(step, params, x) -> int:
  """The arrays plain jax.jit's compiled program all-reduces: XLA's combiner merges
  all-reduces into one of several operands, so each operand counts (one per all-reduce
  the program writes or the partitioner inserts)."""
  text = jax.jit(step).lower(params, x).compile().as_text()
  count = 0
  for m in re.finditer(r"= (.*?) all-reduce(?:-start)?\(", text):
    result = m.group(1)
    if not result.startswith("("):
      count += 1
      continue
    depth, elements = 0, 1
    for ch in result[1:-1]:
      depth += ch in "[{(" and 1 or (ch in "]})" and -1 or 0)
      elements += ch == "," and depth == 0
    count += elements
  return count


@pytest.mark.parametrize("mesh_name", sorted(MESHES))
def test_default_route_sees_every_all_reduce(mesh_name):
  step, params, x = mixed_step(mesh_name)
  module = jax.jit(step).lower(params, x).compiler_ir("stablehlo")
  assert match.find_sites(module), "the lowered program holds the loss's own psum"
  assert match.auto_sharded_ops(module), "and an auto-sharded part"

  f = equarx_pass.jit(step, flags=f"--equarx_enable {MESHES[mesh_name][3]}")
  f(params, x)
  (low,) = f.report.lowerings
  assert low.route == "partitioned"
  sites = [r for r in low.records if r.found_as == SiteKind.ALL_REDUCE]
  assert len(sites) == compiled_all_reduce_operands(step, params, x)
  assert any("shard_map" in r.location for r in sites), "the loss's psum is a site"
  gradients = [r for r in sites if "transpose" in r.location]
  assert gradients and any(r.rewritten for r in gradients)
  text = str(f.report)
  assert "route: the partitioned program (auto-sharded" in text
  assert "not considered" not in text


@pytest.mark.parametrize("mesh_name", sorted(MESHES))
def test_identity_is_jax_jit_bit_for_bit(mesh_name):
  step, params, x = mixed_step(mesh_name)
  want, want_params = train(jax.jit(step), params, x, 3)
  f = equarx_pass.jit(step, flags=f"{IDENTITY} {MESHES[mesh_name][3]}")
  got, got_params = train(f, params, x, 3)
  assert sum(r.rewritten for r in f.report.records) >= 3
  for a, b in zip(got, want):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(jax.tree.leaves(got_params), jax.tree.leaves(want_params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("mesh_name", sorted(MESHES))
def test_int8_trains_within_one_percent(mesh_name):
  step, params, x = mixed_step(mesh_name)
  want, _ = train(jax.jit(step), params, x, 4)
  f = equarx_pass.jit(step, flags=f"--equarx_enable {MESHES[mesh_name][3]}")
  got, _ = train(f, params, x, 4)
  assert any(r.rewritten for r in f.report.records)
  for a, b in zip(got, want):
    assert abs(float(a) - float(b)) <= 0.01 * abs(float(b))


def test_off_says_what_it_left_out():
  step, params, x = mixed_step("fsdp")
  f = equarx_pass.jit(step, flags="--equarx_enable --equarx_partitioned=off")
  f(params, x)
  (low,) = f.report.lowerings
  assert low.route == "lowered" and len(low.records) == 1
  text = str(f.report)
  assert "route: the lowered program (--equarx_partitioned=off)" in text
  assert re.search(r"not considered: the collectives XLA's SPMD partitioner inserts", text)
  assert "--equarx_partitioned=auto" in text


def test_manual_throughout_stays_lowered():
  """shard_map over every axis is all the program: the partitioner adds nothing, and the
  lowered route needs no compile to read it."""
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AUTO, AUTO))
  spec = P(("a", "b"))
  psum = jax.shard_map(
    lambda g: jax.lax.psum(g, ("a", "b")), mesh=mesh, in_specs=spec, out_specs=P()
  )
  g = jax.device_put(np.ones((8, 1 << 16), np.float32), NamedSharding(mesh, spec))
  f = equarx_pass.jit(psum, flags="--equarx_enable --equarx_domain_devices=4")
  f(g)
  (low,) = f.report.lowerings
  assert low.route == "lowered" and low.records[0].rewritten
  assert "manual throughout" in str(f.report) and "not considered" not in str(f.report)


def test_shard_maps_output_constraint_is_not_auto_sharded():
  """shard_map's lowering restates its sharded output's sharding after it
  (sdy.sharding_constraint, over a mesh of Explicit axes): nothing for the partitioner to
  do."""
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
  spec = P(("a", "b"))
  f = jax.shard_map(
    lambda g: jax.lax.psum(g, ("a", "b")), mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False
  )
  g = jax.device_put(np.ones((8, 64), np.float32), NamedSharding(mesh, spec))
  module = jax.jit(f).lower(g).compiler_ir("stablehlo")
  # JAX 0.11 and later write the constraint (0.10 does not): inert either way.
  assert match.auto_sharded_ops(module) == []


def test_partly_manual_shard_map_takes_the_partitioned_route():
  """A shard_map manual over one axis leaves the other to the partitioner."""
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AUTO, AUTO))
  f = jax.shard_map(
    lambda g: jax.lax.psum(g, "b"), mesh=mesh, in_specs=P("b"), out_specs=P(), axis_names={"b"}
  )
  g = jax.device_put(np.ones((8, 64), np.float32), NamedSharding(mesh, P(("a", "b"))))
  module = jax.jit(f).lower(g).compiler_ir("stablehlo")
  assert match.auto_sharded_ops(module) == ["sdy.manual_computation"]


def test_nothing_to_rewrite_reuses_the_compile():
  """An auto-sharded initialisation holds no collective: the read compile is plain
  jax.jit's, and lower().compile() hands that executable back, not a second compile."""
  mesh = jax.make_mesh((2, 4), ("data", "fsdp"), axis_types=(AUTO, AUTO))
  out = NamedSharding(mesh, P("fsdp", None))
  init = equarx_pass.jit(
    lambda k: jax.random.normal(k, (256, 128)), out_shardings=out, flags="--equarx_enable"
  )
  key = jax.random.key(0)
  lowered = init.lower(key)
  (low,) = init.report.lowerings
  assert low.route == "partitioned" and not low.records
  assert lowered.compile()._executable is lowered.compile({})._executable  # as MaxText asks
  want = jax.jit(lambda k: jax.random.normal(k, (256, 128)), out_shardings=out)(key)
  np.testing.assert_array_equal(np.asarray(init(key)), np.asarray(want))
  assert "no collective in it" in str(init.report)


def test_unsharded_arguments_take_the_partitioned_route(recwarn):
  """NumPy arguments: XLA chooses their shardings (GSPMD shardings, no mesh), which the
  rebuilt program names over the mesh; no fallback, identity bit for bit."""
  mesh = jax.make_mesh((8,), ("tp",), axis_types=(AUTO,))

  def mlp(x, w1, w2):
    return jax.lax.psum(jax.nn.relu(x @ w1) @ w2, "tp")

  f = jax.shard_map(mlp, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P())
  rng = np.random.default_rng(0)
  args = (
    rng.standard_normal((64, 256), np.float32),
    rng.standard_normal((256, 1024), np.float32) / 16,
    rng.standard_normal((1024, 256), np.float32) / 32,
  )
  step = lambda x, w1, w2: f(x, w1, w2) * 2.0  # an op outside the shard_map
  same = equarx_pass.jit(step, flags=IDENTITY)
  np.testing.assert_array_equal(np.asarray(same(*args)), np.asarray(jax.jit(step)(*args)))
  (low,) = same.report.lowerings
  assert low.route == "partitioned" and not low.note and low.records[0].rewritten
  assert not [w for w in recwarn if issubclass(w.category, equarx_pass.EquarxWarning)]
