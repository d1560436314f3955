"""Compiler-inserted all-reduces: jax.jit + NamedSharding programs, no shard_map, no psum.

The SPMD partitioner inserts the all-reduces while compiling, so equarx_pass.jit
rewrites the per-device program after partitioning (partitioned.py).  Each
program is checked against the same computation written by hand with shard_map
and psum, which takes the lowered route and is pinned to the NumPy model bit for
bit by test_schemes_e2e.py: equal bits here mean the compiler-inserted sites got
exactly the algorithm.  Also: error against float64, identical bits on every
device, output shardings equal to plain jax.jit's, and the site report.
"""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import equarx_pass
from equarx_pass.emission import scheme as scheme_lib
from equarx_pass.examples import auto_sharded as ex
from equarx_pass.frontends import partitioned
from equarx_pass.planning.policy import Policy

MESH = ex.tp_mesh()
ON = "--equarx_enable --equarx_min_bytes=65536"  # the default scheme; these sites are 64 KiB
mlp, block = ex.mlp, ex.block


def mlp_inputs(x_spec=P()):
  return ex.mlp_inputs(MESH, x_spec=x_spec)


# --- helpers --------------------------------------------------------------------


def shards_identical(array) -> bool:
  shards = [np.asarray(s.data).tobytes() for s in array.addressable_shards]
  return all(s == shards[0] for s in shards)


def relative_error(got, want) -> float:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def f64(args):
  return [np.asarray(a, np.float64) for a in args]


# --- tests -------------------------------------------------------------------------


@pytest.mark.parametrize("x_spec", [P(), P("tp")], ids=["x_replicated", "x_batch_sharded"])
def test_tp_mlp_compiler_inserted_all_reduce_is_rewritten(x_spec):
  args = mlp_inputs(x_spec=x_spec)
  plain = jax.jit(mlp)
  assert "all_reduce" not in plain.lower(*args).as_text()  # the partitioner adds it
  fn = equarx_pass.jit(mlp, flags=ON)
  got = fn(*args)

  [low] = fn.report.lowerings
  assert low.route == "partitioned"
  assert [r.decision for r in low.records] == ["rewritten"]
  assert low.records[0].shapes == ((64, 256),) and low.records[0].group_size == 8
  assert "mlp" in str(fn.report)

  # The same bits as the hand-written shard_map + psum through the lowered route.
  by_hand = equarx_pass.jit(ex.mlp_by_hand(MESH, x_spec), flags=ON)
  want = by_hand(*args)
  assert by_hand.report.lowerings[0].route == "lowered"
  assert np.asarray(got).tobytes() == np.asarray(want).tobytes()

  assert got.sharding == plain(*args).sharding
  assert shards_identical(got)
  # Outlined on CPU (auto), through the move into the rebuilt module; inline, the same bits.
  assert "call @equarx_per_device_equarx_allreduce_0_0(" in fn.lower(*args).as_text()
  inline = equarx_pass.jit(mlp, flags=ON + " --equarx_outline=off")
  assert "equarx_allreduce" not in inline.lower(*args).as_text()
  assert np.asarray(inline(*args)).tobytes() == np.asarray(got).tobytes()
  exact = mlp(*f64(args))
  err = relative_error(got, exact)
  assert err > 1e-4  # it did quantize
  # Within the scheme's own error on these operands: the NumPy model fed with
  # each device's partial product (computed here in float64, rounded to f32).
  partials = ex.mlp_partials(args)
  model = scheme_lib.reference(
    [p.astype(np.float32) for p in partials], Policy.from_flags(ON).scheme
  )[0]
  assert err <= 1.1 * relative_error(model, exact)


def test_transformer_block_compiler_inserted_all_reduces_are_rewritten():
  args = ex.block_inputs(MESH)
  plain = jax.jit(block)
  assert "all_reduce" not in plain.lower(*args).as_text()
  fn = equarx_pass.jit(block, flags=ON)
  got = fn(*args)

  [low] = fn.report.lowerings
  assert low.route == "partitioned"
  rewritten = [r for r in low.records if r.rewritten]
  assert len(rewritten) == 2  # after attention, after the MLP
  assert all(r.shapes == ((2, 64, 256),) and r.group_size == 8 for r in rewritten)

  by_hand = equarx_pass.jit(ex.block_by_hand(MESH), flags=ON)
  want = by_hand(*args)
  assert sum(r.rewritten for r in by_hand.report.records) == 2
  assert np.asarray(got).tobytes() == np.asarray(want).tobytes()

  plain_out = plain(*args)
  assert got.sharding == plain_out.sharding
  assert shards_identical(got)
  exact = np.asarray(jax.jit(block)(*[np.asarray(a) for a in args]), np.float64)
  err = relative_error(got, exact)
  assert 1e-5 < err < 1e-2, err  # the residual stream dominates the quantized parts


def test_off_and_explicit_psum_keep_the_lowered_route():
  args = mlp_inputs()
  off = equarx_pass.jit(mlp, flags=ON + " --equarx_partitioned=off")
  assert np.asarray(off(*args)).tobytes() == np.asarray(jax.jit(mlp)(*args)).tobytes()
  assert off.report.lowerings[0].route == "lowered" and not off.report.records
  # auto: a program with its own psum keeps the lowered route (no extra compile).
  by_hand = equarx_pass.jit(ex.mlp_by_hand(MESH), flags=ON)
  by_hand.lower(*args)
  assert by_hand.report.lowerings[0].route == "lowered"


def test_on_also_covers_explicit_psums():
  args = mlp_inputs()
  fn = equarx_pass.jit(ex.mlp_by_hand(MESH), flags=ON + " --equarx_partitioned=on")
  got = fn(*args)
  assert fn.report.lowerings[0].route == "partitioned"
  assert [r.decision for r in fn.report.records] == ["rewritten"]
  lowered_route = equarx_pass.jit(ex.mlp_by_hand(MESH), flags=ON)
  assert np.asarray(got).tobytes() == np.asarray(lowered_route(*args)).tobytes()


def test_nothing_selected_reuses_the_first_compile():
  args = mlp_inputs()
  fn = equarx_pass.jit(mlp, flags=ON + " --equarx_min_bytes=1000000000")
  got = fn(*args)
  [low] = fn.report.lowerings
  assert low.route == "partitioned" and [r.decision for r in low.records] == ["skipped"]
  assert np.asarray(got).tobytes() == np.asarray(jax.jit(mlp)(*args)).tobytes()


def test_aot_stages_and_output_sharding_of_a_sharded_result():
  # Output left sharded on columns: the rebuilt module must keep that sharding.
  def up(x, w1, w2):
    return jax.nn.relu(mlp(x, w1, w2) @ w1)

  args = mlp_inputs()
  fn = equarx_pass.jit(up, flags=ON)
  compiled = fn.lower(*args).compile()
  got = compiled(*args)
  plain = jax.jit(up)(*args)
  assert got.sharding == plain.sharding
  assert fn.report.records[0].rewritten
  assert relative_error(got, plain) < 5e-2


def test_sdy_sharding_text():
  from equarx_pass.planning import match

  mesh = match.Mesh(("tp",), (8,), tuple(range(8)))
  text = partitioned.sdy_sharding_text(NamedSharding(MESH, P(None, "tp")), "mesh", mesh, 3)
  assert text == '#sdy.sharding<@mesh, [{}, {"tp"}, {}]>'
  other = Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
  with pytest.raises(partitioned.NotPartitionable):
    partitioned.sdy_sharding_text(NamedSharding(other, P("a")), "mesh", mesh, 1)


def test_small_site_skipped_next_to_a_rewritten_one():
  # Two compiler-inserted all-reduces: 64 KiB (rewritten) and 8 KiB (below
  # --equarx_min_bytes): the skipped one keeps plain jax.jit's bits.
  def two(x, w1, w2):
    return mlp(x, w1, w2), mlp(x[:8], w1, w2)

  args = mlp_inputs()
  fn = equarx_pass.jit(two, flags=ON)
  big, small = fn(*args)
  assert sorted(r.decision for r in fn.report.records) == ["rewritten", "skipped"]
  plain_big, plain_small = jax.jit(two)(*args)
  assert np.asarray(small).tobytes() == np.asarray(plain_small).tobytes()
  assert relative_error(big, plain_big) < 5e-2 and shards_identical(big)


@pytest.mark.parametrize("order", ["permuted", "dp_x_tp"])
def test_other_meshes(order):
  devices = np.array(jax.devices())
  if order == "permuted":
    mesh = Mesh(devices[[3, 0, 7, 5, 1, 6, 2, 4]], ("tp",))
    x_spec = P()
  else:
    mesh = Mesh(devices.reshape(2, 4), ("dp", "tp"))
    x_spec = P("dp")
  args = ex.mlp_inputs(mesh, x_spec=x_spec)
  fn = equarx_pass.jit(mlp, flags=ON + " --equarx_min_bytes=0")
  got = fn(*args)
  plain = jax.jit(mlp)(*args)
  assert got.sharding == plain.sharding
  assert [r.decision for r in fn.report.records] == ["rewritten"]
  assert fn.report.records[0].group_size == mesh.shape["tp"]
  assert relative_error(got, plain) < 5e-2
  # Devices that hold the same part of the output hold the same bits.
  by_index = {}
  for s in got.addressable_shards:
    by_index.setdefault(str(s.index), set()).add(np.asarray(s.data).tobytes())
  assert all(len(v) == 1 for v in by_index.values())


def test_auto_falls_back_to_plain_jit_with_the_reason(monkeypatch):
  # When the partitioned route cannot take a program, `auto` runs it as plain
  # jax.jit (same bits) and the report says why; `on` raises instead.
  def refuse(lowered, policy, topology=None):
    raise partitioned.NotPartitionable("a reason the route gives")

  monkeypatch.setattr(partitioned, "rewrite_partitioned", refuse)
  args = mlp_inputs()
  fn = equarx_pass.jit(mlp, flags=ON)
  got = fn(*args)
  [low] = fn.report.lowerings
  assert low.route != "partitioned" and low.note == "a reason the route gives"
  assert low.records == ()
  assert np.asarray(got).tobytes() == np.asarray(jax.jit(mlp)(*args)).tobytes()
  strict = equarx_pass.jit(mlp, flags=ON + " --equarx_partitioned=on")
  with pytest.raises(equarx_pass.RewriteError, match="a reason the route gives"):
    strict(*args)


# --- device order of the partitioned program's meshes ------------------------------


@pytest.mark.parametrize("shape", [(2, 1, 4), (1, 2, 4), (4, 1, 2)])
def test_mesh_device_order_survives_the_round_trip(shape):
  """An embedding lookup over a table sharded on the minor mesh axis: XLA writes the
  all-reduce's groups over a mesh whose device ids are transposed, and the conversion
  to StableHLO drops those ids; the route puts them back (else the groups are the
  wrong devices and the result is wrong with no error)."""
  mesh = jax.make_mesh(
    shape, ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3
  )
  rng = np.random.default_rng(0)
  table = jax.device_put(
    rng.normal(size=(512, 128)).astype(np.float32), NamedSharding(mesh, P("tensor", None))
  )
  ids = jax.device_put(
    rng.integers(0, 512, (8, 64)).astype(np.int32), NamedSharding(mesh, P("data"))
  )
  f = lambda t, i: t[i]
  want = np.asarray(jax.jit(f)(table, ids))
  same = equarx_pass.jit(f, flags="--equarx_enable --equarx_min_bytes=0 --equarx_identity")
  np.testing.assert_array_equal(np.asarray(same(table, ids)), want)
  assert same.report.lowerings[0].route == "partitioned" and same.report.records
  quantized = equarx_pass.jit(f, flags="--equarx_enable --equarx_min_bytes=0")
  assert relative_error(np.asarray(quantized(table, ids)), want) < 2e-2


def test_mesh_device_ids_forms():
  text = (
    "all-reduce(%x), replica_groups=mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], "
    "device_ids=([2,4]T(1,0)) {'axis_0'}, to_apply=%add\n"
    "all-reduce(%y), replica_groups=mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], "
    "device_ids=([2,4]T(1,0)) {'axis_2'}, to_apply=%add\n"
    "all-reduce(%z), replica_groups=mesh['a'=2,'b'=2] {'a'}, to_apply=%add\n"
  )
  ids = partitioned.mesh_device_ids(text)
  assert ids[(("axis_0", 4), ("axis_1", 1), ("axis_2", 2))] == (0, 4, 1, 5, 2, 6, 3, 7)
  assert ids[(("a", 2), ("b", 2))] == (0, 1, 2, 3)
  clash = text + text.replace("[2,4]T(1,0)", "[8]")
  with pytest.raises(partitioned.NotPartitionable, match="two ways"):
    partitioned.mesh_device_ids(clash)
