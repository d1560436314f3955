"""--equarx_identity on flax's examples/wmt train step, unchanged, on FSDP, 2-D and TP meshes.

    python tools/check_wmt.py --wmt-dir /tmp/flax/examples/wmt [--out results/wmt_check.json]

The model and the train step are flax's own, imported at run time from a flax checkout;
nothing of them is copied here.  Get the example's directory with

    git clone https://github.com/google/flax /tmp/flax        # or any flax checkout
    python tools/check_wmt.py --wmt-dir /tmp/flax/examples/wmt

(or, from a bare mirror: git --git-dir=FLAX.git archive HEAD examples/wmt | tar -x -C DIR).

What it does, the way the example's train.py does it:
  * config: the example's configs/default.py get_config(), made small (--layers encoder
    and decoder layers, --emb = qkv_dim, --mlp, --heads, --vocab, batch --batch x --seq),
    f32 (what train.preferred_dtype gives on CPU), --dropout for dropout_rate and
    attention_dropout_rate; models.Transformer with the TransformerConfig that
    train.train_and_evaluate builds, params from jax.jit(m.init), train.TrainState with
    optax.adamw(train.create_learning_rate_schedule(...), b1=0.9, b2=0.98, eps=1e-9);
  * the partitioned route: train.train_step itself, jitted with NamedSharding over 8 CPU
    devices, with the example's `jax.lax.pmean`/`psum` over its pmap axis "batch" made the
    identity while it is traced (train.py's global `jax` is swapped for a view of jax whose
    lax has no-op pmean/psum, and put back), so the SPMD partitioner inserts the
    collectives.  Meshes (--meshes) over axes ("data", "model"): "fsdp" 8 x 1 (every
    parameter and adamw moment of at least 4096 values sharded over "data" on its largest
    dimension that 8 divides; the batch over "data"), "dp_tp" 2 x 4 (Megatron-style:
    attention heads, MLP hidden units and the vocabulary over "model", the batch over
    "data"), "tp8" 1 x 8 (the same rules, all devices on "model");
  * the lowered route: the unchanged pmap-style train_step under jax.shard_map over a mesh
    ("batch",) of 8 (state replicated, batch and per-device dropout keys split), with
    shard_map's defaults: autodiff returns the gradient of each use of a replicated
    parameter through a psum of its own (a parameter used three times, such as wmt's
    shared embedding, gets the sum of three), then the step's pmean and psum run.
Runs, each under jax.jit and equarx_pass.jit(--flags --equarx_identity): one step's
gradients (the state's optimizer is a transformation that keeps the gradients as its
state, so the step returns them exactly), compared leaf by leaf with the step's loss; and
--train-steps steps of the adamw step, compared on losses and parameters.  Every output
must be bit for bit jax.jit's.  With --outline, the lowered route also runs the quantized
program (--flags, f32) with --equarx_outline=off and =auto, and says how many parameters
differ between the two after --train-steps steps and where (see the flag reference, docs/flags.md).

Synthetic token batches (random ids in [1, vocab), each row padded with 0s after a random
length), since no dataset is needed to compare two compilations of the same program.

train.py imports tensorflow, clu, orbax and input_pipeline at module level for its data,
logging and checkpoint code, and configs/default.py imports ml_collections; where those
are not installed, inert stand-in modules are put in sys.modules so that train.py imports
(none of the functions used here touch them), and the output says which.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import types

os.environ["JAX_PLATFORMS"] = os.environ.get("JAX_PLATFORMS") or "cpu"
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402
import numpy as np  # noqa: E402
from flax_examples import as64, flax_commit, install_stand_ins, padded_tokens  # noqa: E402

DEFAULT_FLAGS = "--equarx_enable --equarx_min_bytes=0"
DEFAULT_OUT = os.path.join(benchlib.RESULTS, "wmt_check.json")
STAND_INS = (
  "tensorflow",
  "clu",
  "clu.metric_writers",
  "clu.periodic_actions",
  "orbax",
  "orbax.checkpoint",
  "input_pipeline",
  "ml_collections",
)
FSDP_MIN_SIZE = 4096  # smaller arrays (biases, LayerNorm) stay replicated


# ----------------------------------------------------------------------------- imports


def import_example(wmt_dir: str):
  """(models, train, default config module, names of stand-ins used)."""
  wmt_dir = os.path.abspath(wmt_dir)
  for f in ("models.py", "train.py", os.path.join("configs", "default.py")):
    if not os.path.exists(os.path.join(wmt_dir, f)):
      sys.exit(f"--wmt-dir {wmt_dir}: no {f}; pass flax's examples/wmt directory")
  sys.path.insert(0, wmt_dir)
  # flax.io asks importlib whether tensorflow is installed: import what train.py takes
  # from flax before any stand-in exists, so flax sees the truth.
  import flax.training.checkpoints, flax.training.common_utils, flax.training.train_state  # noqa

  stand_ins = install_stand_ins(STAND_INS)
  import models  # the example's
  import train
  from configs import default

  for mod in (models, train, default):
    assert os.path.abspath(mod.__file__).startswith(wmt_dir), mod.__file__
  return models, train, default, stand_ins


class _LaxWithoutBatchCollectives(types.ModuleType):
  """jax.lax, but pmean and psum over the pmap axis are the identity."""

  def __init__(self, lax):
    super().__init__("jax.lax")
    self._lax = lax

  def __getattr__(self, name):
    if name in ("pmean", "psum"):
      return lambda x, axis_name=None, **kw: x
    return getattr(self._lax, name)


class _JaxWithoutBatchCollectives(types.ModuleType):
  """The jax module as train.py sees it while the jit-sharded step is traced."""

  def __init__(self, jax_module):
    super().__init__("jax")
    self._jax = jax_module
    self.lax = _LaxWithoutBatchCollectives(jax_module.lax)

  def __getattr__(self, name):
    return getattr(self._jax, name)


@contextlib.contextmanager
def without_batch_collectives(train):
  saved = train.jax
  train.jax = _JaxWithoutBatchCollectives(saved)
  try:
    yield
  finally:
    train.jax = saved


# ----------------------------------------------------------------------------- comparisons


def leaf_diffs(got, want) -> dict:
  """Leaf by leaf, bit for bit: how many differ, relative L2 over all, worst leaves."""
  g_leaves = jax.tree_util.tree_leaves_with_path(got)
  w_leaves = jax.tree_util.tree_leaves_with_path(want)
  assert len(g_leaves) == len(w_leaves)
  differ, worst = [], []
  num = den = 0.0
  for (path, g), (_, w) in zip(g_leaves, w_leaves):
    g, w = np.asarray(g), np.asarray(w)
    name = jax.tree_util.keystr(path)
    if g.tobytes() != w.tobytes():
      differ.append(name)
      d = float(np.linalg.norm(as64(g) - as64(w)))
      n = float(np.linalg.norm(as64(w)))
      worst.append((d / n if n else float("inf"), name))
    num += float(np.sum((as64(g) - as64(w)) ** 2))
    den += float(np.sum(as64(w) ** 2))
  worst.sort(reverse=True)
  return dict(
    leaves=len(w_leaves),
    differ=len(differ),
    rel_l2=(num / den) ** 0.5 if den else 0.0,
    worst=[dict(leaf=name, rel_l2=r) for r, name in worst[:4]],
  )


def describe(d: dict) -> str:
  if not d["differ"]:
    return f"all {d['leaves']} bit for bit"
  worst = ", ".join(f"{w['leaf']} {w['rel_l2']:.1e}" for w in d["worst"][:2])
  return f"{d['differ']} of {d['leaves']} differ, rel L2 {d['rel_l2']:.1e} (worst {worst})"


# ----------------------------------------------------------------------------- the model


def build(opts, models, train, default, dropout: float):
  config = default.get_config()
  config.vocab_size = opts.vocab
  config.num_layers = opts.layers
  config.emb_dim = opts.emb
  config.qkv_dim = opts.emb
  config.mlp_dim = opts.mlp
  config.num_heads = opts.heads
  config.max_target_length = opts.seq
  config.max_eval_target_length = opts.seq
  config.per_device_batch_size = opts.batch
  config.dropout_rate = dropout
  config.attention_dropout_rate = dropout
  config.warmup_steps = opts.warmup_steps
  dtype = train.preferred_dtype(config)
  # As train.train_and_evaluate builds it.
  train_config = models.TransformerConfig(
    vocab_size=config.vocab_size,
    output_vocab_size=config.vocab_size,
    share_embeddings=config.share_embeddings,
    logits_via_embedding=config.logits_via_embedding,
    dtype=dtype,
    emb_dim=config.emb_dim,
    num_heads=config.num_heads,
    num_layers=config.num_layers,
    qkv_dim=config.qkv_dim,
    mlp_dim=config.mlp_dim,
    max_len=max(config.max_target_length, config.max_eval_target_length),
    dropout_rate=config.dropout_rate,
    attention_dropout_rate=config.attention_dropout_rate,
    deterministic=False,
    decode=False,
    kernel_init=nn.initializers.xavier_uniform(),
    bias_init=nn.initializers.normal(stddev=1e-6),
  )
  eval_config = train_config.replace(deterministic=True)
  rng = jax.random.key(config.seed)
  rng, init_rng = jax.random.split(rng)
  shape = (config.per_device_batch_size, config.max_target_length)
  m = models.Transformer(eval_config)
  params = jax.jit(m.init)(init_rng, jnp.ones(shape, jnp.float32), jnp.ones(shape, jnp.float32))[
    "params"
  ]
  learning_rate_fn = train.create_learning_rate_schedule(
    learning_rate=config.learning_rate, warmup_steps=config.warmup_steps
  )
  adamw = optax.adamw(
    learning_rate=learning_rate_fn, b1=0.9, b2=0.98, eps=1e-9, weight_decay=config.weight_decay
  )
  return dict(
    config=config,
    train_config=train_config,
    learning_rate_fn=learning_rate_fn,
    params=params,
    rng=rng,
    adamw=adamw,
    label_smoothing=config.label_smoothing,
    m=m,
  )


def keep_gradients() -> optax.GradientTransformation:
  """An optimizer whose state is the last gradients: the step returns them exactly."""
  return optax.GradientTransformation(
    lambda params: jax.tree_util.tree_map(jnp.zeros_like, params),
    lambda updates, state, params=None: (updates, updates),
  )


def make_batches(opts, n):
  rng = np.random.default_rng(opts.seed)
  out = []
  for _ in range(n):
    batch = {}
    for key in ("inputs", "targets"):
      batch[key] = padded_tokens(rng, opts.vocab, opts.batch, opts.seq)
    out.append(batch)
  return out


# ----------------------------------------------------------------------------- shardings


def _names(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def megatron_spec(path, shape) -> P:
  """Attention heads, MLP hidden units and the vocabulary over 'model'."""
  name = _names(path)
  if any(f"/{q}/" in f"/{name}" for q in ("query", "key", "value")):
    return P(None, "model", None) if len(shape) == 3 else P("model", None)
  if "/out/" in f"/{name}" and len(shape) == 3:
    return P("model", None, None)
  if "MlpBlock_0/Dense_0/" in name:
    return P(None, "model") if len(shape) == 2 else P("model")
  if "MlpBlock_0/Dense_1/kernel" in name:
    return P("model", None)
  if "embedding" in name and len(shape) == 2:
    return P("model", None)
  return P()


def fsdp_spec(shape, n: int) -> P:
  """The largest dimension that the 'data' axis divides; small arrays replicated."""
  if int(np.prod(shape, dtype=np.int64)) >= FSDP_MIN_SIZE:
    for d in sorted(range(len(shape)), key=lambda d: (-shape[d], d)):
      if shape[d] % n == 0:
        return P(*[("data" if i == d else None) for i in range(len(shape))])
  return P()


def state_shardings(kind: str, mesh, state):
  def one(path, leaf):
    shape = np.shape(leaf)
    if not shape:
      return NamedSharding(mesh, P())
    spec = fsdp_spec(shape, mesh.shape["data"]) if kind == "fsdp" else megatron_spec(path, shape)
    return NamedSharding(mesh, spec)

  return jax.tree_util.tree_map_with_path(one, state)


# ----------------------------------------------------------------------------- the runs


def identity_flags(opts) -> str:
  return f"{opts.flags} --equarx_identity"


def jitted(fn, flags, **kw):
  return jax.jit(fn, **kw) if flags is None else equarx_pass.jit(fn, flags=flags, **kw)


def site_summary(fn) -> str:
  recs = fn.report.records
  routes = "/".join(sorted({low.route for low in fn.report.lowerings}))
  return f"{sum(r.rewritten for r in recs)}/{len(recs)} sites, {routes}"


def run_partitioned(opts, ex, mesh_name, shape, dropout, batches):
  models, train, default = ex
  b = build(opts, *ex, dropout)
  kind = "fsdp" if mesh_name.startswith("fsdp") else "megatron"
  mesh = jax.make_mesh(shape, ("data", "model"), axis_types=(AxisType.Auto,) * 2)
  data = NamedSharding(mesh, P("data"))
  tc, lr_fn, smoothing = b["train_config"], b["learning_rate_fn"], b["label_smoothing"]

  def step(state, batch, dropout_rng):
    with without_batch_collectives(train):
      return train.train_step(state, batch, tc, lr_fn, smoothing, dropout_rng)

  out = dict(mesh=mesh_name, mesh_shape=shape, dropout=dropout, route="partitioned")
  variants = [("jax.jit", None), ("identity", identity_flags(opts))]
  if opts.quantized:
    variants.append(("int8", opts.flags))
  for what, tx in (("grads", keep_gradients()), ("train", b["adamw"])):
    state0 = train.TrainState.create(
      apply_fn=b["m"].apply, params=b["params"], tx=tx, dynamic_scale=None
    )
    shardings = state_shardings(kind, mesh, state0)
    steps = 1 if what == "grads" else opts.train_steps
    results = {}
    for label, flags in variants:
      fn = jitted(
        step,
        flags,
        in_shardings=(shardings, data, None),
        out_shardings=(shardings, None),
        donate_argnums=0,
      )
      st = jax.device_put(jax.tree_util.tree_map(jnp.copy, state0), shardings)
      losses = []
      t = time.perf_counter()
      for batch in batches[:steps]:
        st, metrics = fn(st, jax.device_put(batch, data), b["rng"])
        metrics = jax.device_get(metrics)
        losses.append(np.float32(metrics["loss"] / metrics["denominator"]))
      seconds = time.perf_counter() - t
      kept = st.opt_state if what == "grads" else st.params
      results[label] = (jax.device_get(kept), losses, metrics)
      sites = "" if flags is None else f", {site_summary(fn)}"
      print(f"    {what} {label}: {steps} step(s) {seconds:.1f} s{sites}", flush=True)
    want = results["jax.jit"]
    for label, _ in variants[1:]:
      got = results[label]
      row = out.setdefault(label, {})
      row[what] = leaf_diffs(got[0], want[0])
      row[f"{what}_loss_bit_identical"] = [
        bool(np.asarray(g).tobytes() == np.asarray(w).tobytes()) for g, w in zip(got[1], want[1])
      ]
      row[f"{what}_metrics"] = leaf_diffs(got[2], want[2])
      row[f"{what}_losses"] = [float(x) for x in got[1]]
      row[f"{what}_losses_jax_jit"] = [float(x) for x in want[1]]
  return out


def run_shard_map(opts, ex, dropout, batches):
  """The unchanged pmap-style step, under shard_map: the lowered route."""
  models, train, default = ex
  b = build(opts, *ex, dropout)
  mesh = jax.make_mesh((8,), ("batch",), axis_types=(AxisType.Explicit,))
  tc, lr_fn, smoothing = b["train_config"], b["learning_rate_fn"], b["label_smoothing"]
  rep, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("batch"))

  def per_device(state, batch, dropout_rngs):
    return train.train_step(state, batch, tc, lr_fn, smoothing, dropout_rngs[0])

  step = jax.shard_map(
    per_device, mesh=mesh, in_specs=(P(), P("batch"), P("batch")), out_specs=(P(), P())
  )
  # As train_and_evaluate: one dropout key per device.
  rngs = jax.device_put(jax.random.split(b["rng"], 8), split)
  out = dict(mesh="batch", mesh_shape=(8,), dropout=dropout, route="lowered")
  variants = [("jax.jit", None), ("identity", identity_flags(opts))]
  if opts.outline:
    variants += [
      ("outline_off", f"{opts.flags} --equarx_outline=off"),
      ("outline_auto", f"{opts.flags} --equarx_outline=auto"),
    ]
  for what, tx in (("grads", keep_gradients()), ("train", b["adamw"])):
    state0 = train.TrainState.create(
      apply_fn=b["m"].apply, params=b["params"], tx=tx, dynamic_scale=None
    )
    steps = 1 if what == "grads" else opts.train_steps
    results = {}
    for label, flags in variants:
      fn = jitted(step, flags, donate_argnums=0)
      st = jax.device_put(jax.tree_util.tree_map(jnp.copy, state0), rep)
      losses = []
      t = time.perf_counter()
      for batch in batches[:steps]:
        st, metrics = fn(st, jax.device_put(batch, split), rngs)
        metrics = jax.device_get(metrics)
        losses.append(np.float32(metrics["loss"] / metrics["denominator"]))
      seconds = time.perf_counter() - t
      kept = st.opt_state if what == "grads" else st.params
      results[label] = (jax.device_get(kept), losses)
      sites = "" if flags is None else f", {site_summary(fn)}"
      print(f"    {what} {label}: {steps} step(s) {seconds:.1f} s{sites}", flush=True)
    want = results["jax.jit"]
    for label, _ in variants[1:]:
      ref = results["outline_auto"] if label == "outline_off" else want
      if label == "outline_auto":
        continue
      got = results[label]
      row = out.setdefault(label, {})
      row[what] = leaf_diffs(got[0], ref[0])
      row[f"{what}_loss_bit_identical"] = [
        bool(np.asarray(g).tobytes() == np.asarray(w).tobytes()) for g, w in zip(got[1], ref[1])
      ]
      row[f"{what}_losses"] = [float(x) for x in got[1]]
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--wmt-dir",
    default=os.environ.get("FLAX_WMT_DIR"),
    help="flax's examples/wmt directory (default $FLAX_WMT_DIR)",
  )
  parser.add_argument("--out", default=DEFAULT_OUT, help="JSON results ('' for none)")
  parser.add_argument(
    "--flags",
    default=DEFAULT_FLAGS,
    help=f"equarx flags (default {DEFAULT_FLAGS!r}); the identity runs add --equarx_identity",
  )
  parser.add_argument(
    "--meshes",
    default="fsdp:8x1,dp_tp:2x4,tp8:1x8",
    help="NAME:DATAxMODEL,... ('fsdp...' names take the FSDP rules, others Megatron's)",
  )
  parser.add_argument("--dropouts", default="0.1,0", help="dropout rates to run, comma-separated")
  parser.add_argument("--shard-map", action=argparse.BooleanOptionalAction, default=True)
  parser.add_argument(
    "--outline",
    action=argparse.BooleanOptionalAction,
    default=True,
    help="also compare the quantized pmap-style step with --equarx_outline=off and auto",
  )
  parser.add_argument("--quantized", action="store_true", help="also run --flags on the meshes")
  parser.add_argument("--layers", type=int, default=2, help="encoder and decoder layers")
  parser.add_argument("--emb", type=int, default=256, help="emb_dim = qkv_dim")
  parser.add_argument("--mlp", type=int, default=1024)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--vocab", type=int, default=2048)
  parser.add_argument("--seq", type=int, default=64)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--train-steps", type=int, default=4)
  parser.add_argument(
    "--warmup-steps",
    type=int,
    default=1,
    help="config.warmup_steps (the example's 1000 keeps the learning rate ~0 for a few steps)",
  )
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
    "--flax-commit",
    default="",
    help="the flax commit the directory came from (default: git rev-parse in --wmt-dir, "
    "where it is a work tree; needed for a directory unpacked with git archive)",
  )
  opts = parser.parse_args(argv)
  if not opts.wmt_dir:
    parser.error("--wmt-dir is required (flax's examples/wmt; see the docstring)")

  global jax, jnp, nn, optax, equarx_pass, AxisType, NamedSharding, P
  import flax
  import jax
  import jax.numpy as jnp
  import optax
  from flax import linen as nn
  from jax.sharding import AxisType, NamedSharding
  from jax.sharding import PartitionSpec as P

  import equarx_pass

  start = time.perf_counter()
  commit = opts.flax_commit or flax_commit(opts.wmt_dir)
  models, train, default, stand_ins = import_example(opts.wmt_dir)
  ex = (models, train, default)
  print(
    f"wmt from {os.path.abspath(opts.wmt_dir)} (flax commit {commit or 'unknown'}); "
    f"jax {jax.__version__}, flax {flax.__version__}, {len(jax.devices())} "
    f"{jax.devices()[0].platform} devices"
  )
  if stand_ins:
    print(f"stand-in modules (not importable here, unused by the code run): {', '.join(stand_ins)}")
  print(
    f"model: {opts.layers}+{opts.layers} layers, emb/qkv {opts.emb}, mlp {opts.mlp}, heads "
    f"{opts.heads}, vocab {opts.vocab}, batch {opts.batch} x {opts.seq}, f32; "
    f"flags {opts.flags!r}"
  )
  batches = make_batches(opts, max(1, opts.train_steps))
  rows = []
  for dropout in (float(d) for d in opts.dropouts.split(",")):
    for spec in opts.meshes.split(",") if opts.meshes else []:
      name, dims = spec.split(":")
      shape = tuple(int(d) for d in dims.split("x"))
      print(f"\n== {name} {shape}, dropout {dropout}: jax.jit + NamedSharding", flush=True)
      rows.append(run_partitioned(opts, ex, name, shape, dropout, batches))
    if opts.shard_map:
      print(f"\n== pmap-style step under shard_map (8), dropout {dropout}", flush=True)
      rows.append(run_shard_map(opts, ex, dropout, batches))

  print()
  failed = []
  for row in rows:
    where = f"{row['mesh']} {row['mesh_shape']} dropout {row['dropout']} ({row['route']})"
    for label in ("identity", "int8", "outline_off"):
      if label not in row:
        continue
      r = row[label]
      for what in ("grads", "train"):
        if what not in r:
          continue
        loss = "loss bit for bit" if all(r[f"{what}_loss_bit_identical"]) else "loss differs"
        vs = "outline auto" if label == "outline_off" else "jax.jit"
        print(f"{where} {label} {what} vs {vs}: {loss}; {describe(r[what])}")
        if label == "identity" and (r[what]["differ"] or not all(r[f"{what}_loss_bit_identical"])):
          failed.append(f"{where} {what}")
  total = time.perf_counter() - start
  print(f"total {total:.0f} s")
  if opts.out:
    benchlib.write_result(
      opts.out,
      rows,
      flax_commit=commit,
      wmt_dir=os.path.abspath(opts.wmt_dir),
      stand_ins=stand_ins,
      model=dict(
        layers=opts.layers,
        emb=opts.emb,
        mlp=opts.mlp,
        heads=opts.heads,
        vocab=opts.vocab,
        seq=opts.seq,
        batch=opts.batch,
        train_steps=opts.train_steps,
      ),
      flags=opts.flags,
      total_seconds=total,
    )
  if failed:
    print(f"FAILED: identity is not bit for bit in {len(failed)} run(s): {'; '.join(failed)}")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
