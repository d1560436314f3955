"""The identity guard on op patterns that XLA compiles differently once rebuilt.

The partitioned route reads XLA:CPU's program after its `simplification` pipeline
(partitioned.py, `_pick_dump`) and hands it back to XLA through StableHLO, so every pass
XLA runs before that point runs a second time, on a program it has already seen.  Each
pattern here is one where such a pass decided otherwise the second time, found on a real
model; a plain JAX program that has it is run under `--equarx_identity` (every selected
collective rebuilt native) against plain jax.jit, bit for bit.

* A bf16 dot whose operand XLA's `dot_decomposer` transposes into the canonical order
  (activations of 3 dimensions against a weight contracted on its last one, `x @ w.T`; a
  weight against activations).  dot_decomposer writes the transpose in the default
  layout, and XLA:CPU's `float-normalization-bf16` keeps the dot in bf16 (the library dot
  reads row-major operands).  The conversion to StableHLO drops that layout and the
  StableHLO -> HLO translation gives the transpose the one that makes it a bitcast
  (column-major for 2-D), so the second compile's float normalization computed the dot in
  f32 and skipped the bf16 rounding of its result (MaxText 0.2.5 on JAX 0.12: the output
  layer's and the MLP's backward dots; the raw gradient norm 2.5e-05 off at step 0, the loss
  from step 1 on).  The route now
  folds such transposes into the dots (equarx_pass/ir/dot_transposes.py); without it the
  identity tests below fail on JAX 0.12 (the loss off at every step, by up to 8.2e-05
  relative); on JAX 0.10.2 they pass either way.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import mlir as jax_mlir
from jax.extend.mlir import ir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from programs import IDENTITY, assert_same
from run_module import run_per_device

import equarx_pass
from equarx_pass import _jax_private
from equarx_pass.ir import dot_transposes, traverse

AUTO = jax.sharding.AxisType.Auto
ALL_OPS = "--equarx_ops=all_reduce,reduce_scatter,all_gather"
BATCH, LENGTH, EMB, OUT = 8, 16, 128, 256
STEPS = 3

# The bf16 dots: each has an operand that dot_decomposer transposes.
PATTERNS = {
  # activations [batch, length, emb] against a weight [out, emb] (x @ w.T): the weight
  # is transposed to [emb, out]
  "x_wT": lambda x, w: jnp.einsum("bld,od->blo", x, w),
}


def step_of(dot):
  def loss_fn(w, x):
    y = dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16))
    return jnp.mean(jnp.square(y.astype(jnp.float32)))

  def step(w, x):
    loss, grad = jax.value_and_grad(loss_fn)(w, x)
    return w - 0.1 * grad, loss, grad

  return step


def data_fsdp_arguments(seed: int):
  """A mesh of data 2 x fsdp 4 (MaxText's CPU check has the same), the weight sharded over
  fsdp (so it is all-gathered where it is used and its gradient reduce-scattered), the
  activations over both."""
  mesh = jax.make_mesh((2, 4), ("data", "fsdp"), axis_types=(AUTO, AUTO))
  rng = np.random.default_rng(seed)
  w = rng.standard_normal((OUT, EMB)).astype(np.float32) / np.sqrt(EMB)
  w = jax.device_put(w, NamedSharding(mesh, P("fsdp", None)))
  batches = [
    jax.device_put(
      rng.standard_normal((BATCH, LENGTH, EMB)).astype(np.float32),
      NamedSharding(mesh, P(("data", "fsdp"))),
    )
    for _ in range(STEPS)
  ]
  return w, batches


@pytest.mark.parametrize("ops", ["", ALL_OPS], ids=["all_reduce", "all_ops"])
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_identity_is_bit_for_bit_through_bf16_dots_that_xla_transposes(pattern, ops):
  step = step_of(PATTERNS[pattern])
  plain = jax.jit(step)
  same = equarx_pass.jit(step, flags=f"{IDENTITY} {ops}".strip())
  w, batches = data_fsdp_arguments(0)
  want_w = got_w = w
  differ = []
  for i, x in enumerate(batches):
    want, got = plain(want_w, x), same(got_w, x)
    try:
      assert_same(got, want, f"step {i}")
    except AssertionError as e:
      differ.append(str(e))
    want_w, got_w = want[0], got[0]
  assert not differ, f"{len(differ)} of {STEPS} steps differ:\n" + "\n".join(differ)
  [low] = same.report.lowerings
  assert low.route == "partitioned", low.note
  assert any(r.rewritten for r in low.records), str(same.report)


# --- the fold itself, on XLA HLO as the route reads it ----------------------------------

# t: a transpose in the default layout (what dot_decomposer writes); u: one in the layout
# that makes it a bitcast (what the StableHLO -> HLO translation writes); v: a transpose
# that reorders the dot's free dimensions; t is also read by an add; w: both operands of
# one dot.
FOLD_HLO = """
HloModule m, entry_computation_layout={(f32[4,6]{1,0}, f32[3,6]{1,0}, f32[2,3,6]{2,1,0})->(f32[3,4]{1,0}, f32[3,4]{1,0}, f32[2,3,4]{2,1,0}, f32[6,4]{1,0}, f32[4,2,3]{2,1,0}, f32[4,4]{1,0})}

ENTRY main {
  a = f32[4,6]{1,0} parameter(0)
  b = f32[3,6]{1,0} parameter(1)
  c = f32[2,3,6]{2,1,0} parameter(2)
  t = f32[6,4]{1,0} transpose(a), dimensions={1,0}
  u = f32[6,4]{0,1} transpose(a), dimensions={1,0}
  d0 = f32[3,4]{1,0} dot(b, t), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  d1 = f32[3,4]{1,0} dot(b, u), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  s = f32[6,4]{1,0} add(t, t)
  ct = f32[2,6,3]{2,1,0} transpose(c), dimensions={0,2,1}
  d2 = f32[2,3,4]{2,1,0} dot(ct, t), lhs_batch_dims={}, lhs_contracting_dims={1}, rhs_contracting_dims={0}
  v = f32[6,3,2]{2,1,0} transpose(c), dimensions={2,1,0}
  d3 = f32[4,3,2]{2,1,0} dot(a, v), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  d4 = f32[4,2,3]{2,1,0} transpose(d3), dimensions={0,2,1}
  w = f32[6,4]{1,0} transpose(a), dimensions={1,0}
  d5 = f32[4,4]{1,0} dot(w, w), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  ROOT r = (f32[3,4]{1,0}, f32[3,4]{1,0}, f32[2,3,4]{2,1,0}, f32[6,4]{1,0}, f32[4,2,3]{2,1,0}, f32[4,4]{1,0}) tuple(d0, d1, d2, s, d4, d5)
}
"""


def _converted(text: str) -> ir.Module:
  """XLA HLO text -> StableHLO as the route's conversion writes it (before the fold)."""
  context = _jax_private.make_ir_context()
  module = ir.Module.parse(
    jax_mlir.hlo_to_stablehlo(_jax_private.hlo_text_to_proto(text)), context=context
  )
  for name in ("mhlo.num_partitions", "mhlo.num_replicas"):
    module.operation.attributes[name] = ir.IntegerAttr.get(
      ir.IntegerType.get_signless(32, context), 1
    )
  return module


def _dot_operands(module: ir.Module) -> list[tuple[str, str]]:
  """Each dot's operands, by what defines them: an op's name, or "arg"."""

  def source(value):
    owner = value.owner
    return "arg" if isinstance(owner, ir.Block) else owner.name

  return sorted(
    (source(op.operands[0]), source(op.operands[1]))
    for op in traverse.walk(module.operation)
    if op.name in dot_transposes.DOTS
  )


def test_the_fold_takes_default_layout_transposes_into_dots_and_keeps_the_values():
  module = _converted(FOLD_HLO)
  T = "stablehlo.transpose"
  # d0 (b, t), d1 (b, u), d2 (ct, t), d3 (a, v), d5 (w, w)
  assert _dot_operands(module) == sorted([("arg", T), ("arg", T), (T, T), ("arg", T), (T, T)])
  assert dot_transposes.fold_default_layout_transposes(module) == 3  # d0, d2, d5
  # d0, d2 and d5 read the parameters; d1 keeps u (the bitcast layout, which the
  # translation writes again), d3 keeps v (its free dimensions would come in another order)
  assert _dot_operands(module) == sorted(
    [("arg", "arg"), ("arg", T), ("arg", "arg"), ("arg", T), ("arg", "arg")]
  )
  transposes = [op for op in traverse.walk(module.operation) if op.name == T]
  # t stays for the add, u and v for their dots, d4 is no dot's; ct and w are gone
  assert len(transposes) == 4
  rng = np.random.default_rng(0)
  # small integers: every sum exact, in whatever order a dot adds
  a, b, c = (rng.integers(-4, 5, shape).astype(np.float32) for shape in ((4, 6), (3, 6), (2, 3, 6)))
  want = [
    b @ a.T,
    b @ a.T,
    np.einsum("bdk,nk->bdn", c, a),
    2 * a.T,
    np.einsum("nk,bdk->nbd", a, c),
    a @ a.T,
  ]
  got = run_per_device(module, [a[None], b[None], c[None]])
  assert len(got) == len(want)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g[0], w)
