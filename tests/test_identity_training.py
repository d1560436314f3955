"""The identity guard on training steps: every gradient, bit for bit, by every route.

Two models written here, each with dropout and trained with optax adamw: a flax linen
encoder-decoder (self-attention, causal self-attention and cross-attention, a tied
embedding, sinusoidal positions) and a flax NNX encoder.  Each step returns the new
parameters and adamw state, the gradients and the loss; under `--equarx_identity` every
leaf must be plain jax.jit's bit for bit (tests/programs.py assert_same: leaf by leaf,
shard by shard).  Meshes and routes:
  * the partitioned route (jax.jit + NamedSharding; the SPMD partitioner inserts the
    collectives) on an FSDP mesh (data 8 x model 1: every array of at least 1024 values,
    parameters and adamw moments, sharded on its largest dimension that 8 divides) and a
    2-D mesh (data 2 x model 4, Megatron-style: attention heads, MLP hidden units and the
    vocabulary over 'model');
  * the lowered route (shard_map): FSDP written by hand on the 8 x 1 mesh (weights
    all-gathered where they are used, so their gradients come back as reduce-scatters)
    and data parallelism over the 2 x 4 mesh (gradients averaged over 'model', then
    over 'data').
The steps run with `--equarx_ops=all_reduce,reduce_scatter,all_gather`, so identity takes
the routes that `--equarx_enable` takes (the partitioner's all-reduce-and-slice of a
gradient as a reduce-scatter, the all-gathers of the weights; the sites, kinds and "found
as" are checked against the quantized run's report on the corpus's FSDP steps), and once
with the default flags.  The sizes (emb 32, 8 heads, batch 16 x 8) make the partitioned
route's old drift show: before the route read XLA's program after its simplification
pipeline (partitioned.py, _pick_dump), the 2 x 4 cases and the default-flags FSDP case
failed here by an ulp (with 4 heads and a batch of 8 they passed).  Last, the guard catches a wrong rebuild:
constants zeroed in the partitioned program, collectives given another device order, a
reduce-scatter route that hands out the wrong pieces; each makes identity differ.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import programs
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from programs import IDENTITY, assert_same

import equarx_pass
from equarx_pass import site_patterns
from equarx_pass.frontends import partitioned
from equarx_pass.ir import traverse

ALL_OPS = "--equarx_ops=all_reduce,reduce_scatter,all_gather"
EMB, HEADS, FFN, VOCAB, BATCH, LENGTH = 32, 8, 64, 64, 16, 8
FSDP_MIN_SIZE = 1024
MESHES = {"fsdp": (8, 1), "dp_tp": (2, 4)}
AUTO = jax.sharding.AxisType.Auto
CORPUS = {p.name: p for p in programs.corpus()}


def make_mesh(name):
  return jax.make_mesh(MESHES[name], ("data", "model"), axis_types=(AUTO, AUTO))


def batch_of_tokens(seed: int) -> dict:
  """Token ids in [1, VOCAB), each row padded with 0s after a random length."""
  rng = np.random.default_rng(seed)
  out = {}
  for key in ("inputs", "targets"):
    ids = rng.integers(1, VOCAB, (BATCH, LENGTH)).astype(np.int32)
    lengths = rng.integers(LENGTH // 2, LENGTH + 1, BATCH)
    ids[np.arange(LENGTH)[None, :] >= lengths[:, None]] = 0
    out[key] = ids
  return out


def weighted_cross_entropy(logits, targets):
  weights = (targets > 0).astype(jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return jnp.sum(losses * weights) / jnp.sum(weights)


# --- the models ------------------------------------------------------------------------


def linen_encoder_decoder():
  """(init(key) -> params, loss(params, batch, dropout key))."""
  import flax.linen as nn

  class Block(nn.Module):
    cross: bool = False

    @nn.compact
    def __call__(self, x, mask, memory=None, memory_mask=None):
      def attend(q, kv, m):
        out = nn.MultiHeadDotProductAttention(
          num_heads=HEADS, dropout_rate=0.1, deterministic=False
        )(q, kv, mask=m)
        return nn.Dropout(0.1, deterministic=False)(out)

      h = nn.LayerNorm()(x)
      x = x + attend(h, h, mask)
      if self.cross:
        x = x + attend(nn.LayerNorm()(x), memory, memory_mask)
      h = nn.Dense(FFN)(nn.LayerNorm()(x))
      h = nn.Dense(EMB)(nn.Dropout(0.1, deterministic=False)(nn.relu(h)))
      return x + nn.Dropout(0.1, deterministic=False)(h)

  class EncoderDecoder(nn.Module):
    @nn.compact
    def __call__(self, inputs, targets):
      embed = nn.Embed(VOCAB, EMB, embedding_init=nn.initializers.normal(1.0))
      positions = programs.sinusoidal(LENGTH, EMB)[None]
      x = embed(inputs) + positions
      x = Block()(x, nn.make_attention_mask(inputs > 0, inputs > 0))
      memory = nn.LayerNorm()(x)
      shifted = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
      self_mask = nn.combine_masks(
        nn.make_attention_mask(targets > 0, targets > 0), nn.make_causal_mask(targets)
      )
      y = embed(shifted) + positions
      y = Block(cross=True)(y, self_mask, memory, nn.make_attention_mask(targets > 0, inputs > 0))
      return embed.attend(nn.LayerNorm()(y))

  model = EncoderDecoder()
  example = jnp.ones((BATCH, LENGTH), jnp.int32)

  def init(key):
    return model.init({"params": key, "dropout": key}, example, example)["params"]

  def loss(params, batch, key):
    logits = model.apply(
      {"params": params}, batch["inputs"], batch["targets"], rngs={"dropout": key}
    )
    return weighted_cross_entropy(logits, batch["targets"])

  return init, loss


def nnx_encoder():
  """The same pair for a flax NNX encoder with a language-model head."""
  from flax import nnx

  class Block(nnx.Module):
    def __init__(self, rngs):
      self.norm1 = nnx.LayerNorm(EMB, rngs=rngs)
      self.attention = nnx.MultiHeadAttention(
        num_heads=HEADS, in_features=EMB, dropout_rate=0.1, decode=False, rngs=rngs
      )
      self.norm2 = nnx.LayerNorm(EMB, rngs=rngs)
      self.up = nnx.Linear(EMB, FFN, rngs=rngs)
      self.down = nnx.Linear(FFN, EMB, rngs=rngs)
      self.dropout = nnx.Dropout(0.1)

    def __call__(self, x, mask, rngs):
      h = self.attention(self.norm1(x), mask=mask, deterministic=False, rngs=rngs)
      x = x + self.dropout(h, rngs=rngs)
      h = self.dropout(nnx.gelu(self.up(self.norm2(x))), rngs=rngs)
      return x + self.dropout(self.down(h), rngs=rngs)

  class Encoder(nnx.Module):
    def __init__(self, rngs):
      self.embed = nnx.Embed(VOCAB, EMB, rngs=rngs)
      self.blocks = nnx.List([Block(rngs)])
      self.norm = nnx.LayerNorm(EMB, rngs=rngs)
      self.head = nnx.Linear(EMB, VOCAB, rngs=rngs)

    def __call__(self, ids, rngs):
      x = self.embed(ids) + programs.sinusoidal(LENGTH, EMB)[None]
      mask = nnx.make_attention_mask(ids > 0, ids > 0)
      for block in self.blocks:
        x = block(x, mask, rngs)
      return self.head(self.norm(x))

  graphdef, state, rest = nnx.split(Encoder(nnx.Rngs(0)), nnx.Param, ...)

  def init(key):
    del key  # the module drew its parameters from nnx.Rngs(0)
    return nnx.to_pure_dict(state)

  def loss(params, batch, key):
    values = jax.tree_util.tree_map(lambda v: v, state)
    nnx.replace_by_pure_dict(values, params)
    model = nnx.merge(graphdef, values, rest)
    logits = model(batch["inputs"], nnx.Rngs(dropout=key))
    return weighted_cross_entropy(logits, batch["targets"])

  return init, loss


MODELS: dict[str, Callable] = {"linen_encdec": linen_encoder_decoder, "nnx_encoder": nnx_encoder}


@dataclasses.dataclass(frozen=True)
class Setup:
  init: Callable
  loss: Callable
  optimizer: optax.GradientTransformation


_SETUPS: dict[str, Setup] = {}


def setup(model: str) -> Setup:
  if model not in _SETUPS:
    init, loss = MODELS[model]()
    _SETUPS[model] = Setup(init, loss, optax.adamw(1e-3, b1=0.9, b2=0.98, weight_decay=1e-4))
  return _SETUPS[model]


# --- shardings ---------------------------------------------------------------------------


def _names(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def fsdp_dimension(shape) -> int | None:
  """The largest dimension that 8 divides, for arrays of at least FSDP_MIN_SIZE values."""
  if int(np.prod(shape, dtype=np.int64)) < FSDP_MIN_SIZE:
    return None
  for d in sorted(range(len(shape)), key=lambda d: (-shape[d], d)):
    if shape[d] % 8 == 0:
      return d
  return None


def megatron_spec(path, shape) -> P:
  """Heads, MLP hidden units and the vocabulary over 'model' (by parameter name)."""
  name = f"/{_names(path)}/"
  attention = any(f"/{q}/" in name for q in ("query", "key", "value"))
  if attention and len(shape) == 3:
    return P(None, "model", None)
  if attention and len(shape) == 2:
    return P("model", None)
  if "/out/" in name and len(shape) == 3:
    return P("model", None, None)
  first = any(f"/{d}/" in name for d in ("Dense_0", "up"))
  if first:
    return P(None, "model") if len(shape) == 2 else P("model")
  if any(f"/{d}/kernel/" in name for d in ("Dense_1", "down")):
    return P("model", None)
  if "/embedding/" in name or ("/head/" in name and len(shape) == 2):
    return P("model", None) if "/embedding/" in name else P(None, "model")
  if "/head/bias/" in name:
    return P("model")
  return P()


def shardings(mesh_name: str, mesh, tree):
  def one(path, leaf):
    shape = np.shape(leaf)
    if mesh_name == "fsdp":
      d = fsdp_dimension(shape)
      spec = P() if d is None else P(*[("data" if i == d else None) for i in range(len(shape))])
    else:
      spec = megatron_spec(path, shape) if shape else P()
    return NamedSharding(mesh, spec)

  return jax.tree_util.tree_map_with_path(one, tree)


# --- the two routes ----------------------------------------------------------------------


def partitioned_step(s: Setup, mesh_name: str):
  """(step, arguments maker, jit keyword arguments): jax.jit + NamedSharding."""
  mesh = make_mesh(mesh_name)
  params = s.init(jax.random.PRNGKey(0))
  # On the host, so that each call gets fresh arrays (the step donates its state).
  state = jax.device_get((params, s.optimizer.init(params)))
  state_shardings = shardings(mesh_name, mesh, state)
  data = NamedSharding(mesh, P("data"))

  def step(state, batch, key):
    params, opt_state = state
    loss, grads = jax.value_and_grad(s.loss)(params, batch, key)
    updates, opt_state = s.optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), grads, loss

  def make_args():
    return (
      jax.device_put(state, state_shardings),
      jax.device_put(batch_of_tokens(1), data),
      jax.random.PRNGKey(7),
    )

  kwargs = dict(
    in_shardings=(state_shardings, data, None),
    out_shardings=(state_shardings, state_shardings[0], None),
    donate_argnums=0,
  )
  return step, make_args, kwargs


def lowered_step(s: Setup, mesh_name: str):
  """The same under shard_map, collectives written by hand (the lowered route)."""
  mesh = make_mesh(mesh_name)
  devices = ("data", "model")
  params = s.init(jax.random.PRNGKey(0))
  if mesh_name == "fsdp":
    # Each weight sharded on its FSDP dimension, gathered where it is used: autodiff
    # turns the gathers into the gradients' reduce-scatters.
    dims = jax.tree_util.tree_map(lambda p: fsdp_dimension(np.shape(p)), params)
  else:
    dims = jax.tree_util.tree_map(lambda p: None, params)

  def spec(d, rank):
    return P() if d is None else P(*[("data" if i == d else None) for i in range(rank)])

  param_specs = jax.tree_util.tree_map(
    lambda d, p: spec(d, np.ndim(p)), dims, params, is_leaf=lambda x: x is None
  )
  opt_state = s.optimizer.init(params)
  opt_specs = jax.tree_util.tree_map(lambda _: P(), opt_state)
  opt_specs = optax.tree_utils.tree_set(opt_specs, mu=param_specs, nu=param_specs)

  def gather(p, d):
    return p if d is None else jax.lax.all_gather(p, "data", axis=d, tiled=True)

  def local(state, batch, keys):
    params, opt_state = state

    def loss_fn(shards):
      full = jax.tree_util.tree_map(gather, shards, dims, is_leaf=lambda x: x is None)
      return s.loss(full, batch, keys[0])

    loss, grads = jax.value_and_grad(loss_fn)(params)
    n = mesh.size
    if mesh_name == "fsdp":
      # A gathered weight's gradient is already summed over the devices (a reduce-scatter);
      # the replicated ones are summed here.
      grads = jax.tree_util.tree_map(
        lambda g, d: (g if d is not None else jax.lax.psum(g, "data")) / n,
        grads,
        dims,
        is_leaf=lambda x: x is None,
      )
    else:
      grads = jax.tree_util.tree_map(
        lambda g: jax.lax.pmean(jax.lax.pmean(g, "model"), "data"), grads
      )
    loss = jax.lax.pmean(loss, devices)
    updates, opt_state = s.optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), grads, loss

  state_specs = (param_specs, opt_specs)
  # check_vma off: the collectives are the ones written here, as under jax.pmap (with it,
  # autodiff would add its own psums for the replicated weights).
  step = jax.shard_map(
    local,
    mesh=mesh,
    in_specs=(state_specs, P(devices), P(devices)),
    out_specs=(state_specs, param_specs, P()),
    check_vma=False,
  )
  state_shardings = jax.tree_util.tree_map(lambda p: NamedSharding(mesh, p), state_specs)
  data = NamedSharding(mesh, P(devices))

  host = jax.device_get((params, opt_state))

  def make_args():
    return (
      jax.device_put(host, state_shardings),
      jax.device_put(batch_of_tokens(1), data),
      jax.device_put(jax.random.split(jax.random.PRNGKey(7), mesh.size), data),
    )

  return step, make_args, dict(donate_argnums=0)


ROUTES = {"partitioned": partitioned_step, "lowered": lowered_step}
CASES = [
  (model, mesh, route)
  for model in MODELS
  for mesh in MESHES
  for route in ("partitioned", "lowered")
]


def run(step, make_args, kwargs, flags: str | None):
  """The step through jax.jit (flags None) or equarx_pass.jit(flags): (outputs, fn)."""
  fn = jax.jit(step, **kwargs) if flags is None else equarx_pass.jit(step, flags=flags, **kwargs)
  return fn(*make_args()), fn


@functools.cache
def case(model: str, mesh: str, route: str):
  """(step, arguments maker, jit keyword arguments, plain jax.jit's outputs)."""
  step, make_args, kwargs = ROUTES[route](setup(model), mesh)
  want, _ = run(step, make_args, kwargs, None)
  return step, make_args, kwargs, want


@pytest.mark.parametrize("model, mesh, route", CASES, ids=["-".join(c) for c in CASES])
def test_identity_gradients_are_bit_for_bit(model, mesh, route):
  step, make_args, kwargs, want = case(model, mesh, route)
  got, fn = run(step, make_args, kwargs, f"{IDENTITY} {ALL_OPS}")
  [low] = fn.report.lowerings
  assert low.route == route, (low.route, low.note)
  kinds = {r.kind for r in low.records if r.rewritten}
  assert "all_reduce" in kinds, str(fn.report)
  if mesh == "fsdp":  # weights gathered, gradients scattered
    assert {"all_gather", "reduce_scatter"} <= kinds, str(fn.report)
  if mesh == "fsdp" and route == "partitioned":  # as the partitioner writes them
    assert any(r.found_as == "all_reduce" != r.kind for r in low.records), str(fn.report)
  (_, _), grads, loss = got
  assert_same(got, want, f"{model} {mesh} {route}")
  assert len(jax.tree_util.tree_leaves(grads)) > 10 and np.isfinite(float(loss))


def test_identity_with_the_default_ops_on_the_fsdp_encoder_decoder():
  """The flags a user checks with: --equarx_enable --equarx_min_bytes=0 --equarx_identity."""
  step, make_args, kwargs, want = case("linen_encdec", "fsdp", "partitioned")
  got, fn = run(step, make_args, kwargs, "--equarx_enable --equarx_min_bytes=0 --equarx_identity")
  assert fn.report.lowerings[0].route == "partitioned"
  assert {r.kind for r in fn.report.records if r.rewritten} == {"all_reduce"}
  assert_same(got, want, "linen_encdec fsdp, default ops")


@pytest.mark.parametrize("name", ["fsdp_train_step", "fsdp_tp_train_step"])
def test_identity_takes_the_routes_the_quantized_run_takes(name):
  """Same sites, kinds and 'found as' as --equarx_enable on the corpus's FSDP steps (the
  partitioned route), and each reason names the route."""
  prog = CORPUS[name]
  # Without --equarx_force: the cost model's decisions must be the same too.
  flags = f"--equarx_enable --equarx_min_bytes=0 {ALL_OPS}"
  quantized = equarx_pass.jit(prog.fn, flags=flags, **prog.jit_kwargs)
  identity = equarx_pass.jit(prog.fn, flags=f"{flags} --equarx_identity", **prog.jit_kwargs)
  quantized.lower(*prog.make_args())
  identity.lower(*prog.make_args())

  def routes(fn):
    return [(r.index, r.kind, r.found_as, r.decision) for r in fn.report.records]

  assert routes(identity) == routes(quantized)
  records = [r for r in identity.report.records if r.rewritten]
  sliced = [r for r in records if r.found_as != r.kind]
  gathers = [r for r in records if r.kind == "all_gather"]
  assert sliced and gathers, str(identity.report)
  pair = "reduce_scatter: an all-reduce and the slice of each rank's piece: "
  own = "identity: the native all-reduce, each rank's piece sliced as recognised"
  assert all(r.reason.startswith(pair + own) for r in sliced)
  assert all(r.reason.startswith("all_gather: identity: the native all-gather") for r in gathers)
  plain = [r for r in records if r.kind == "all_reduce"]
  assert all(r.reason.startswith("identity: the native all-reduce") for r in plain)


# --- small FSDP steps, many batches --------------------------------------------------------

# Each reduce-scatter the partitioner writes here (an all-reduce and the slice of each
# rank's piece) scatters a [out, batch] activation over its last dimension.  Rebuilt as one
# native reduce-scatter, XLA:CPU laid that dimension out major and the loss's fused
# reduction summed in another order: the loss an ulp off on some batches (4 to 6 of these
# 12), the parameters equal.
MLP_STEPS = 12
MLP_CASES = {
  # The program a user reported, as written: 8 devices on one 'batch' axis, the same
  # parameters each step, reduce-scatters alone.
  "batch8": ((8,), 32, "--equarx_ops=reduce_scatter"),
  # FSDP on one axis, every collective kind, the parameters fed back step to step.
  "fsdp8": ((8,), 64, ALL_OPS),
  # Two hosts of four: the hierarchical route's sites, rebuilt native.
  "fsdp2x4": ((2, 4), 64, f"{ALL_OPS} --equarx_domain_devices=4"),
}


def mlp_fsdp_step(mesh_shape, hidden):
  """(step, parameters, batch sharding, the generator to draw batches from): an MLP
  applied per example (jax.vmap), weights sharded on their hidden dimension over the last
  mesh axis, the batch over all axes; drawn as the reported program drew them."""
  names = ("batch",) if len(mesh_shape) == 1 else ("hosts", "batch")
  mesh = jax.make_mesh(mesh_shape, names, axis_types=(AUTO,) * len(names))
  rng = np.random.default_rng(0)
  specs = {"w1": P("batch", None), "b1": P("batch"), "w2": P(None, "batch"), "b2": P()}
  values = {
    "w1": rng.normal(size=(hidden, 4)) / 2,
    "b1": rng.normal(size=(hidden,)) / 10,
    "w2": rng.normal(size=(4, hidden)) / 6,
    "b2": np.zeros(4),
  }
  shard = {k: NamedSharding(mesh, spec) for k, spec in specs.items()}
  params = {k: jax.device_put(v.astype(np.float32), shard[k]) for k, v in values.items()}
  data = NamedSharding(mesh, P(names))

  def mlp(p, xi):
    return p["w2"] @ jax.nn.relu(p["w1"] @ xi + p["b1"]) + p["b2"]

  def loss_fn(p, x, y):
    return jnp.mean((y - jax.vmap(mlp, in_axes=(None, 0))(p, x)) ** 2)

  def step(p, x, y):
    p = jax.lax.with_sharding_constraint(p, shard)
    x = jax.lax.with_sharding_constraint(x, data)
    y = jax.lax.with_sharding_constraint(y, data)
    g = jax.grad(loss_fn)(p, x, y)
    p = jax.lax.with_sharding_constraint(
      jax.tree_util.tree_map(lambda a, b: a - 1e-3 * b, p, g), shard
    )
    return p, loss_fn(p, x, y)

  return step, params, data, rng


@pytest.mark.parametrize("name", list(MLP_CASES))
def test_identity_is_bit_for_bit_on_every_step_of_small_fsdp_mlps(name):
  mesh_shape, hidden, ops = MLP_CASES[name]
  step, params, data, rng = mlp_fsdp_step(mesh_shape, hidden)
  plain = jax.jit(step)
  same = equarx_pass.jit(step, flags=f"{IDENTITY} {ops}")
  feed_back = name != "batch8"
  want_params = got_params = params
  differ = []
  for i in range(MLP_STEPS):
    x = jax.device_put(rng.normal(size=(16, 4)).astype(np.float32), data)
    y = jnp.sin(x)
    want, got = plain(want_params, x, y), same(got_params, x, y)
    try:
      assert_same(got, want, f"step {i}")
    except AssertionError as e:
      differ.append(str(e))
    if feed_back:
      want_params, got_params = want[0], got[0]
  assert not differ, f"{len(differ)} of {MLP_STEPS} steps differ:\n" + "\n".join(differ)
  [low] = same.report.lowerings  # one lowering for every step, the fed-back ones too
  assert low.route == "partitioned", low.note
  rewritten = {(r.kind, r.found_as) for r in low.records if r.rewritten}
  assert ("reduce_scatter", "all_reduce") in rewritten, str(same.report)
  if "all_gather" in ops:
    assert {("all_gather", "all_gather"), ("all_reduce", "all_reduce")} <= rewritten


# --- the guard catches a wrong rebuild ---------------------------------------------------


def _zero_float_constants(module):
  """Every float constant of more than one value made zeros (what a lossy dump did)."""
  from jax.extend.mlir import ir

  with module.context, ir.Location.unknown():
    for op in traverse.walk(module.operation):
      if op.name != "stablehlo.constant":
        continue
      attr = op.attributes["value"]
      if isinstance(attr, ir.DenseFPElementsAttr) and not attr.is_splat:
        t = ir.RankedTensorType(attr.type)
        zeros = np.zeros(t.shape, np.float32)
        op.attributes["value"] = ir.DenseElementsAttr.get(zeros, type=t)  # type: ignore[call-overload]


def _rotate_replica_groups(module):
  """Every collective's groups listed from their second device: another device order."""
  from jax.extend.mlir import ir

  i64 = ir.IntegerType.get_signless(64, module.context)
  with module.context, ir.Location.unknown():
    for op in traverse.walk(module.operation):
      if "replica_groups" not in op.attributes or not op.name.startswith("stablehlo.all_"):
        continue
      attr = op.attributes["replica_groups"]
      shape = ir.ShapedType(attr.type).shape
      groups = np.array([int(v) for v in attr], np.int64).reshape(shape)
      rotated = np.roll(groups, -1, axis=1)
      op.attributes["replica_groups"] = ir.DenseIntElementsAttr.get(  # type: ignore[call-overload]
        rotated, type=ir.RankedTensorType.get(list(shape), i64)
      )


@pytest.mark.parametrize(
  "injection, name",
  [(_zero_float_constants, "constants_many"), (_rotate_replica_groups, "fsdp_tp_train_step")],
  ids=["constants_zeroed", "device_order_rotated"],
)
def test_a_wrong_rebuild_is_caught(monkeypatch, injection, name):
  """The partitioned program, changed after it is read and before it is rewritten: the
  identity run no longer equals jax.jit (without the change it does: test_faithful.py)."""
  prog = CORPUS[name]
  read = partitioned._per_device_module

  def wrong(proto, original, platform):
    module = read(proto, original, platform)
    injection(module)
    return module

  monkeypatch.setattr(partitioned, "_per_device_module", wrong)
  got, want, fn = programs.run_pair(prog, f"{IDENTITY} {ALL_OPS}")
  assert fn.report.lowerings[0].route == "partitioned"
  with pytest.raises(AssertionError, match="not bit-identical"):
    assert_same(got, want, name)


def test_a_reduce_scatter_route_with_the_wrong_pieces_is_caught(monkeypatch):
  """Identity slices each rank's piece as the recognition names it (its groups and
  dimension), not by the partitioner's slice: a recognition that handed each rank another
  rank's piece would show."""
  prog = CORPUS["fsdp_train_step"]
  got, want, fn = programs.run_pair(prog, f"{IDENTITY} {ALL_OPS}")
  assert any(r.found_as != r.kind for r in fn.report.records), str(fn.report)
  assert_same(got, want, "without the injection")
  native = site_patterns.emit_native

  def wrong_pieces(cand, operands):
    """The groups rotated by one for the slice: rank r gets piece r - 1."""
    if cand.slice_op is not None:
      groups = tuple(tuple(np.roll(g, 1).tolist()) for g in cand.site.groups)
      cand = dataclasses.replace(cand, site=dataclasses.replace(cand.site, groups=groups))
    return native(cand, operands)

  monkeypatch.setattr(site_patterns, "emit_native", wrong_pieces)
  got, want, _ = programs.run_pair(prog, f"{IDENTITY} {ALL_OPS}")
  with pytest.raises(AssertionError, match="not bit-identical"):
    assert_same(got, want, "reduce-scatter pieces")
