"""End to end on 8 CPU devices: programs through equarx_pass.jit against the NumPy model.

Every rewritten all-reduce must give, on every device, exactly the bits of
`ring.reference_allreduce` fed with that device's group in ring order (rank r =
the r-th device id of the replica group, which for shard_map is the order along
the reduced mesh axes).  Bit equality with the model implies the rest of the
invariants, but each is also checked directly: identical bits across a group,
run-to-run determinism, error within ring.error_bound, non-finite propagation,
exact zeros, and untouched all-reduces equal to plain jax.jit.
"""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from bitwise import assert_same_bits, bits
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from meshes import ring_groups

import equarx_pass
from equarx_pass import _jax_private
from equarx_pass.emission.algorithms import ring
from equarx_pass.ir import parse
from equarx_pass.planning.policy import Policy

# These tests pin the int8 ring against ring.reference_allreduce; the default
# scheme (two-shot + Hadamard) and the others are in test_schemes_e2e.py.
RING = "--equarx_algorithm=ring --equarx_rotation=none"

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"f32": np.dtype(np.float32), "bf16": BF16, "f16": np.dtype(np.float16)}
# Half an ulp of the output type, relative, and the smallest absolute rounding step.
OUT_ROUNDING = {
  np.dtype(np.float32): (0.0, 0.0),
  BF16: (2.0**-8, 2.0**-134),
  np.dtype(np.float16): (2.0**-11, 2.0**-25),
}

DEVICES = np.array(jax.devices())
MESHES = {
  "8": Mesh(DEVICES.reshape(8), ("x",)),
  "2x4": Mesh(DEVICES.reshape(2, 4), ("a", "b")),
  # Physical devices out of order: ring ranks still follow the mesh axis.
  "8perm": Mesh(DEVICES[[3, 0, 7, 5, 1, 6, 2, 4]], ("x",)),
}


def flags(block: int, extra: str = "") -> str:
  return (
    f"--equarx_enable --equarx_min_bytes=0 --equarx_force --equarx_block_size={block} {RING} {extra}"
  ).strip()


# --- helpers --------------------------------------------------------------------


def model(x: np.ndarray, groups, block: int) -> np.ndarray:
  """What every position of the global output must hold: the model, group by group."""
  out = np.empty_like(x)
  for group in groups:
    results = ring.reference_allreduce([x[pos] for pos in group], block, x.dtype)
    for pos, res in zip(group, results):
      out[pos] = res
  return out


def check_invariants(got: np.ndarray, x: np.ndarray, groups, block: int):
  """Identical bits in each group, error within the bound (plus output rounding)."""
  rel, tiny = OUT_ROUNDING[x.dtype]
  for group in groups:
    first = got[group[0]]
    for pos in group[1:]:
      assert_same_bits(got[pos], first, f"rank {pos} vs rank {group[0]}")
    inputs = [x[pos] for pos in group]
    exact = np.sum([np.asarray(v, np.float64) for v in inputs], axis=0)
    bound = ring.error_bound(inputs, block)
    err = np.abs(first.astype(np.float64) - exact)
    assert np.all(err <= bound + (np.abs(exact) + bound) * rel + tiny), np.max(err - bound)


def gaussian(rng, shape, dtype, lead):
  """Per-rank magnitudes that differ by orders: one loud rank among quiet ones."""
  scales = rng.choice([0.01, 1.0, 30.0], size=lead).reshape(lead + (1,) * len(shape))
  return (rng.standard_normal(lead + tuple(shape)) * scales).astype(dtype)


@functools.cache
def psum_program(mesh_name: str, axes: tuple[str, ...], block: int):
  """shard_map psum over `axes` of a per-device operand of any shape (scalar included)."""
  mesh = MESHES[mesh_name]
  spec = P(*mesh.axis_names)
  lead = len(mesh.axis_names)

  def body(x):
    y = jax.lax.psum(x.reshape(x.shape[lead:]), axes)
    return y.reshape(x.shape)

  g = jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)
  return g, equarx_pass.jit(g, flags=flags(block))


def run_psum(mesh_name, axes, block, x):
  g, w = psum_program(mesh_name, axes, block)
  out = w(x)
  want_aval = jax.eval_shape(g, x)
  assert (out.shape, out.dtype) == (want_aval.shape, want_aval.dtype)
  low = w.report.lowerings[-1]
  assert [r.decision for r in low.records] == ["rewritten"], low.records
  groups = ring_groups(MESHES[mesh_name], axes)
  assert (low.records[0].group_size, low.records[0].num_groups) == (len(groups[0]), len(groups))
  return np.asarray(out), groups, w


# --- psum through shard_map: the model, bit for bit -----------------------------

SHAPES = [(), (3,), (1001,), (7, 13, 5), (8 * 4096 + 77,)]


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)) or "scalar")
def test_psum_matches_model_8_devices(dtype, shape):
  x = gaussian(np.random.default_rng(len(shape)), shape, DTYPES[dtype], (8,))
  got, groups, w = run_psum("8", ("x",), 1024, x)
  assert_same_bits(got, model(x, groups, 1024), "vs model")
  assert_same_bits(np.asarray(w(x)), got, "second run")
  check_invariants(got, x, groups, 1024)


@pytest.mark.parametrize("block", [128, 4096])
@pytest.mark.parametrize("shape", [(1001,), (8 * 4096 + 77,)], ids=str)
def test_psum_block_sizes(block, shape):
  x = gaussian(np.random.default_rng(block), shape, np.float32, (8,))
  got, groups, _ = run_psum("8", ("x",), block, x)
  assert_same_bits(got, model(x, groups, block), "vs model")
  check_invariants(got, x, groups, block)


@pytest.mark.parametrize(
  "mesh_name, axes, dtype",
  [
    ("2x4", ("a",), "f32"),  # 4 groups of 2: {0,4}, {1,5}, ...
    ("2x4", ("b",), "bf16"),  # 2 groups of 4: {0..3}, {4..7}
    ("2x4", ("b",), "f32"),
    ("2x4", ("a", "b"), "f16"),  # one group of 8 in row-major mesh order
    ("8perm", ("x",), "f32"),  # devices shuffled under the mesh
  ],
)
def test_psum_group_layouts(mesh_name, axes, dtype):
  lead = MESHES[mesh_name].devices.shape
  x = gaussian(np.random.default_rng(7), (7, 13, 5), DTYPES[dtype], lead)
  got, groups, w = run_psum(mesh_name, axes, 128, x)
  assert_same_bits(got, model(x, groups, 128), "vs model")
  assert_same_bits(np.asarray(w(x)), got, "second run")
  check_invariants(got, x, groups, 128)


def test_ring_order_matters_so_the_comparison_can_fail():
  """The model is not symmetric in rank order: feeding it another order changes bits."""
  x = gaussian(np.random.default_rng(7), (7, 13, 5), np.float32, (8,))
  got, groups, _ = run_psum("8", ("x",), 128, x)
  shuffled = [[g[i] for i in (1, 0, 2, 3, 4, 5, 6, 7)] for g in groups]
  assert not np.array_equal(bits(got), bits(model(x, shuffled, 128)))


@settings(max_examples=25, deadline=None)
@given(
  seed=st.integers(0, 2**32 - 1),
  scales=st.lists(st.sampled_from([0.0, 1e-30, 1e-3, 1.0, 1e3, 1e30]), min_size=8, max_size=8),
  sparsity=st.sampled_from([0.0, 0.5, 0.99]),
)
def test_psum_matches_model_on_drawn_data(seed, scales, sparsity):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((8, 1001)) * np.array(scales)[:, None]
  x[rng.random(x.shape) < sparsity] = 0
  x = x.astype(np.float32)
  got, groups, _ = run_psum("8", ("x",), 128, x)  # one compile, shared by every example
  assert_same_bits(got, model(x, groups, 128), "vs model")
  check_invariants(got, x, groups, 128)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_quantization_ties_round_like_the_model(dtype):
  """Blocks full of exact ties: x / scale = k + 1/2 with a scale of 7.

  XLA computes x * (1 / scale), which moves some ties up (see quantize.py); a
  program and model that disagreed on the division would differ here.
  """
  rng = np.random.default_rng(12)
  ties = (np.arange(127) + 0.5) * 7
  blocks = []
  for _ in range(8 * 4):
    b = rng.permutation(np.concatenate([[889.0], ties]))
    blocks.append(b * rng.choice([-1, 1], size=b.size))
  x = np.stack(blocks).reshape(8, 4 * 128).astype(DTYPES[dtype])
  got, groups, _ = run_psum("8", ("x",), 128, x)
  assert_same_bits(got, model(x, groups, 128), "vs model")


# --- non-finite values and zeros ------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_non_finite_inputs_never_give_finite_results(dtype):
  rng = np.random.default_rng(3)
  x = gaussian(rng, (1001,), DTYPES[dtype], (8,))
  x[2, 10] = np.nan
  x[5, 500] = np.inf
  x[0, 900], x[7, 900] = np.inf, -np.inf  # exact sum NaN
  x[4, 1000] = -np.inf
  got, groups, _ = run_psum("8", ("x",), 128, x)
  with np.errstate(invalid="ignore"):
    exact = np.sum(x.astype(np.float64), axis=0)
  for r in range(8):
    assert not np.any(np.isfinite(got[r][~np.isfinite(exact)]))
  assert_same_bits(got, model(x, groups, 128), "vs model")
  # Chunks without a non-finite value are unaffected: 1001 values over 8 ranks
  # make chunks of one 128-value block, and the bad values sit in chunks 0, 3, 7.
  assert np.isfinite(got[:, 128:384].astype(np.float32)).all()
  assert np.isfinite(got[:, 512:896].astype(np.float32)).all()


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_zero_input_stays_exactly_zero(dtype):
  x = np.zeros((8, 1001), DTYPES[dtype])
  got, _, _ = run_psum("8", ("x",), 1024, x)
  assert np.all(bits(got) == 0)  # +0 everywhere, not just == 0
  # Positions that are zero on every rank stay zero inside non-zero blocks too.
  x = gaussian(np.random.default_rng(1), (1001,), DTYPES[dtype], (8,))
  x[:, ::3] = 0
  got, _, _ = run_psum("8", ("x",), 1024, x)
  assert np.all(got[:, ::3].astype(np.float32) == 0)


def test_subnormal_range_is_flushed_but_within_the_bound():
  """Values so small that block scales are subnormal.

  XLA:CPU flushes subnormals to zero and the model does not (see quantize.py),
  so bits are not compared here; everything else must still hold.
  """
  rng = np.random.default_rng(13)
  x = (
    rng.standard_normal((8, 1001))
    * np.array([1e-36, 1e-38, 1e-40, 0, 1e-36, 1e-39, 1e-37, 1e-38])[:, None]
  ).astype(np.float32)
  got, groups, w = run_psum("8", ("x",), 128, x)
  assert np.isfinite(got).all()
  check_invariants(got, x, groups, 128)
  assert_same_bits(np.asarray(w(x)), got, "second run")


# --- other program forms --------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_pmap_psum(dtype):
  pm = jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")
  w = equarx_pass.jit(pm, flags=flags(128))
  x = gaussian(np.random.default_rng(11), (5, 77), DTYPES[dtype], (8,))
  got = w(x)
  want_aval = jax.eval_shape(pm, x)
  assert (got.shape, got.dtype) == (want_aval.shape, want_aval.dtype)
  assert [r.decision for r in w.report.records] == ["rewritten"]
  groups = [[(r,) for r in range(8)]]  # pmap: device i holds x[i]
  assert_same_bits(np.asarray(got), model(x, groups, 128), "vs model")
  check_invariants(np.asarray(got), x, groups, 128)


@pytest.mark.parametrize("outline", ["auto", "off"])
def test_psum_in_scan_body(outline):
  """Outlined (the CPU default) and inline (what GPU and TPU programs get): the model's bits."""
  mesh = MESHES["8"]

  def body(xs):  # xs: [1, T, K] on each device
    def step(carry, xt):
      s = jax.lax.psum(xt + carry, "x")
      # x 0.5 is exact, so a contraction of it with the next add changes nothing.
      return jax.lax.pcast(s * 0.5, "x", to="varying"), s

    _, ys = jax.lax.scan(step, jnp.zeros_like(xs[0, 0]), xs[0])
    return ys[None]

  g = jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  w = equarx_pass.jit(g, flags=flags(128) + f" --equarx_outline={outline}")
  xs = gaussian(np.random.default_rng(5), (4, 300), np.float32, (8,))
  got = np.asarray(w(xs))
  assert [r.decision for r in w.report.records] == ["rewritten"]
  text = w.lower(xs).as_text()
  assert "stablehlo.all_reduce" not in text
  assert ("call @equarx_allreduce_0_0(" in text) == (outline == "auto")

  carry = [np.zeros(300, np.float32) for _ in range(8)]
  for t in range(4):
    inputs = [xs[r, t] + carry[r] for r in range(8)]
    results = ring.reference_allreduce(inputs, 128)
    for r in range(8):
      assert_same_bits(got[r, t], results[r], f"step {t} rank {r}")
    carry = [res * np.float32(0.5) for res in results]
  assert_same_bits(np.asarray(w(xs)), got, "second run")


def test_psum_in_cond_branches():
  mesh = MESHES["8"]

  def body(flag, x):
    # The predicate is replicated (in_specs P()): uniform across devices.
    return jax.lax.cond(
      flag > 0, lambda v: jax.lax.psum(v * 2, "x"), lambda v: jax.lax.psum(-v, "x"), x
    )

  g = jax.shard_map(body, mesh=mesh, in_specs=(P(), P("x")), out_specs=P("x"))
  w = equarx_pass.jit(g, flags=flags(128))
  x = gaussian(np.random.default_rng(9), (1, 513), np.float32, (8,)).reshape(8, 513)
  groups = [[(r,) for r in range(8)]]
  for flag, scaled in ((1, x * np.float32(2)), (0, -x)):
    got = np.asarray(w(np.int32(flag), x))
    assert_same_bits(got, model(scaled, groups, 128), f"flag {flag}")
  assert len(w.report.lowerings) == 1
  assert [r.decision for r in w.report.records] == ["rewritten", "rewritten"]


def test_psum_of_a_tuple():
  """psum of several operands (JAX emits one all-reduce per operand); mixed types."""
  mesh = MESHES["8"]
  g = jax.shard_map(
    lambda a, b, c: jax.lax.psum((a, b, c), "x"), mesh=mesh, in_specs=P("x"), out_specs=P("x")
  )
  w = equarx_pass.jit(g, flags=flags(128))
  rng = np.random.default_rng(2)
  args = (
    gaussian(rng, (1001,), np.float32, (8,)),
    gaussian(rng, (7, 13), BF16, (8,)),
    gaussian(rng, (5,), np.float16, (8,)),
  )
  outs = w(*args)
  avals = jax.eval_shape(g, *args)
  groups = [[(r,) for r in range(8)]]
  for out, aval, x in zip(outs, avals, args):
    assert (out.shape, out.dtype) == (aval.shape, aval.dtype)
    assert_same_bits(np.asarray(out), model(x, groups, 128), str(x.dtype))
  assert [r.decision for r in w.report.records] == ["rewritten"] * 3


MULTI_OPERAND = """
module @jit_body attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=8]>
  func.func public @main(%arg0: tensor<8x1001xbf16>, %arg1: tensor<8x7x13xbf16>) -> (tensor<8x1001xbf16>, tensor<8x7x13xbf16>) {
    %0:2 = sdy.manual_computation(%arg0, %arg1) in_shardings=[<@mesh, [{"x"}, {}]>, <@mesh, [{"x"}, {}, {}]>] out_shardings=[<@mesh, [{"x"}, {}]>, <@mesh, [{"x"}, {}, {}]>] manual_axes={"x"} (%arg2: tensor<1x1001xbf16>, %arg3: tensor<1x7x13xbf16>) {
      %1:2 = "stablehlo.all_reduce"(%arg2, %arg3) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> ({
      ^bb0(%a: tensor<bf16>, %b: tensor<bf16>):
        %s = stablehlo.add %a, %b : tensor<bf16>
        stablehlo.return %s : tensor<bf16>
      }) : (tensor<1x1001xbf16>, tensor<1x7x13xbf16>) -> (tensor<1x1001xbf16>, tensor<1x7x13xbf16>)
      sdy.return %1#0, %1#1 : tensor<1x1001xbf16>, tensor<1x7x13xbf16>
    } : (tensor<8x1001xbf16>, tensor<8x7x13xbf16>) -> (tensor<8x1001xbf16>, tensor<8x7x13xbf16>)
    return %0#0, %0#1 : tensor<8x1001xbf16>, tensor<8x7x13xbf16>
  }
}
"""


def test_multi_operand_all_reduce_is_one_ring():
  """One all-reduce of two operands (as XLA's combiner makes): one ring over both.

  JAX never emits one, so the module is written out and compiled in place of the
  lowering of a tuple psum with the same signature.
  """
  mesh = MESHES["8"]
  g = jax.shard_map(
    lambda a, b: jax.lax.psum((a, b), "x"), mesh=mesh, in_specs=P("x"), out_specs=P("x")
  )
  rng = np.random.default_rng(4)
  a, b = gaussian(rng, (1001,), BF16, (8,)), gaussian(rng, (7, 13), BF16, (8,))
  lowered = jax.jit(g).lower(a, b)
  module = parse.parse_bytes(MULTI_OPERAND, context=lowered.compiler_ir("stablehlo").context).module
  result = equarx_pass.rewrite_module(
    module,
    Policy(enable=True, min_bytes=0, force=True, block_size=128, algorithm="ring", rotation="none"),
  )
  assert [(r.decision, r.shapes) for r in result.records] == [
    ("rewritten", ((1, 1001), (1, 7, 13)))
  ]
  got_a, got_b = _jax_private.lowered_with_module(lowered, result.module).compile()(a, b)

  # The model sees each rank's operands as one f32 vector, concatenated in order.
  flat = [
    np.concatenate([a[r].astype(np.float32), b[r].astype(np.float32).reshape(-1)]) for r in range(8)
  ]
  for r, res in enumerate(ring.reference_allreduce(flat, 128, BF16)):
    assert_same_bits(np.asarray(got_a)[r], res[:1001], f"rank {r} operand 0")
    assert_same_bits(np.asarray(got_b)[r], res[1001:].reshape(7, 13), f"rank {r} operand 1")


# --- all-reduces the policy does not select stay exactly as they were -----------


def test_unselected_all_reduces_equal_plain_jit():
  mesh = MESHES["2x4"]

  def body(big, ints, small, m):
    return (
      jax.lax.psum(big, "b"),  # rewritten
      jax.lax.psum(ints, "b"),  # integer: not a selected type
      jax.lax.psum(small, "a"),  # 64 bytes < --equarx_min_bytes=1024
      jax.lax.pmax(m, "b"),
    )  # not a sum

  spec = P("a", "b")
  g = jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)
  w = equarx_pass.jit(
    g, flags="--equarx_enable --equarx_min_bytes=1024 --equarx_block_size=128 " + RING
  )
  rng = np.random.default_rng(8)
  args = (
    gaussian(rng, (2000,), np.float32, (2, 4)),
    rng.integers(-1000, 1000, (2, 4, 300), dtype=np.int32),
    rng.standard_normal((2, 4, 16)).astype(np.float32),
    rng.standard_normal((2, 4, 500)).astype(np.float32),
  )
  got = [np.asarray(v) for v in w(*args)]
  plain = [np.asarray(v) for v in jax.jit(g)(*args)]

  decisions = [(r.decision, r.reason) for r in w.report.records]
  assert [d for d, _ in decisions] == ["rewritten", "skipped", "skipped", "skipped"]
  assert "i32" in decisions[1][1] and "min_bytes" in decisions[2][1]
  assert "not add" in decisions[3][1]
  for i in (1, 2, 3):
    assert_same_bits(got[i], plain[i], f"output {i}")
  assert_same_bits(got[0], model(args[0], ring_groups(mesh, ("b",)), 128), "rewritten output")


def test_dtype_excluded_by_flag_equals_plain_jit():
  mesh = MESHES["8"]
  g = jax.shard_map(
    lambda a, b: (jax.lax.psum(a, "x"), jax.lax.psum(b, "x")),
    mesh=mesh,
    in_specs=P("x"),
    out_specs=P("x"),
  )
  w = equarx_pass.jit(g, flags=flags(128, "--equarx_dtypes=f32,f16"))
  rng = np.random.default_rng(6)
  a = gaussian(rng, (1001,), BF16, (8,))
  b = gaussian(rng, (1001,), np.float32, (8,))
  got_a, got_b = w(a, b)
  plain_a, _ = jax.jit(g)(a, b)
  assert [r.decision for r in w.report.records] == ["skipped", "rewritten"]
  assert "--equarx_dtypes" in w.report.records[0].reason
  assert_same_bits(np.asarray(got_a), np.asarray(plain_a), "bf16 psum left alone")
  assert_same_bits(np.asarray(got_b), model(b, [[(r,) for r in range(8)]], 128), "f32 psum")
