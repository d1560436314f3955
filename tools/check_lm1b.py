"""equarx_pass.jit on flax's examples/lm1b Transformer, unchanged, on TP and FSDP meshes.

    python tools/check_lm1b.py --lm1b-dir /tmp/flax_examples/examples/lm1b [--out results/lm1b_check.json]

The model code is flax's own, imported at run time from a flax checkout; nothing of it
is copied here.  Get the example's directory with

    git clone https://github.com/google/flax /tmp/flax        # or any flax checkout
    python tools/check_lm1b.py --lm1b-dir /tmp/flax/examples/lm1b

(or, from a bare mirror: git --git-dir=FLAX.git archive HEAD examples/lm1b | tar -x -C DIR).

What it does, the way the example's train.py does it:
  * config: the example's configs/default.py get_config(), made small (--layers, --emb,
    --mlp, --heads, --vocab, --seq, --batch; max_eval_target_length stays 512, so the
    fixed sinusoidal position table is a 512 x emb NumPy constant: a constant of the kind a
    lossy dump of the partitioned program would drop);
  * model: models.TransformerLM with the TransformerConfig train.train_and_evaluate
    builds (train / eval configs), optimizer train.create_learning_rate_schedule + adamw;
  * state: utils.setup_initial_state, i.e. params and optimizer state sharded by the
    example's own logical axis rules (config.logical_axis_rules: mlp/vocab/heads ->
    'tensor', embed -> 'fsdp') on the example's mesh axes ('data', 'fsdp', 'tensor'),
    here built with jax.make_mesh(..., AxisType.Auto) on 8 virtual CPU devices;
    batch sharded as config.data_sharding says (P(['data'])).
  * meshes (--meshes): "tp" = data 2 x fsdp 1 x tensor 4 (tensor parallel: MLP, vocab
    sharded; the example's rules leave attention replicated), "tp8" = 1 x 1 x 8, "fsdp" = data 1 x fsdp 8 x tensor 1 (the example's default config:
    ici_fsdp_parallelism=-1 fills all devices, embed dim of every param sharded over
    'fsdp'; the example itself has this FSDP rule, nothing is derived).
  * runs: logits = models.TransformerLM(eval_config).apply({'params': p}, inputs) (the
    line of train.eval_step), jitted with eval_step's shardings; train.eval_step itself
    (its metrics); and --train-steps steps of train.train_step (dropout on, donation,
    shardings as in train_and_evaluate).  Each under jax.jit, equarx_pass.jit(--flags)
    and equarx_pass.jit(--flags --equarx_identity).

Synthetic token batches (random ids in [1, vocab), each row padded with 0s after a random
length), since no dataset is needed to compare two compilations of the same program.

train.py imports tensorflow, clu and input_pipeline (tensorflow_datasets) at module level
for its data and logging code, and configs/default.py imports ml_collections; where those
are not installed, inert stand-in modules are put in sys.modules so that train.py imports
(none of the functions used here touch them), and the output says which.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

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
DEFAULT_OUT = os.path.join(benchlib.RESULTS, "lm1b_check.json")
# Imported in this order, each a stand-in where it is not installed (flax_examples.py).
STAND_INS = (
  "tensorflow",
  "clu",
  "clu.metric_writers",
  "clu.periodic_actions",
  "ml_collections",
  "input_pipeline",
)


# ----------------------------------------------------------------------------- imports


def import_example(lm1b_dir: str):
  """(models, train, utils, default config module, names of stand-ins used)."""
  lm1b_dir = os.path.abspath(lm1b_dir)
  for f in ("models.py", "train.py", "utils.py", os.path.join("configs", "default.py")):
    if not os.path.exists(os.path.join(lm1b_dir, f)):
      sys.exit(f"--lm1b-dir {lm1b_dir}: no {f}; pass flax's examples/lm1b directory")
  sys.path.insert(0, lm1b_dir)
  # flax.io asks importlib whether tensorflow is installed: import what train.py and
  # utils.py take from flax before any stand-in exists, so flax sees the truth.
  import flax.training.checkpoints, flax.training.common_utils, flax.training.train_state  # noqa

  stand_ins = install_stand_ins(STAND_INS)
  import models  # the example's
  import train
  import utils
  from configs import default

  for mod in (models, train, utils, default):
    assert os.path.abspath(mod.__file__).startswith(lm1b_dir), mod.__file__
  return models, train, utils, default, stand_ins


# ----------------------------------------------------------------------------- comparisons


def rel_l2(got, want):
  got, want = as64(got), as64(want)
  return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def max_abs(got, want):
  return float(np.max(np.abs(as64(got) - as64(want))))


def bits_equal(a, b):
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  return len(la) == len(lb) and all(
    np.asarray(x).dtype == np.asarray(y).dtype
    and np.asarray(x).tobytes() == np.asarray(y).tobytes()
    for x, y in zip(la, lb)
  )


def tree_rel_l2(got, want):
  g = np.concatenate([as64(x).ravel() for x in jax.tree_util.tree_leaves(got)])
  w = np.concatenate([as64(x).ravel() for x in jax.tree_util.tree_leaves(want)])
  return float(np.linalg.norm(g - w) / np.linalg.norm(w))


def shards_consistent(x):
  """Every device holding the same index of x holds the same bits."""
  seen = {}
  for s in x.addressable_shards:
    key = str(s.index)
    b = np.asarray(s.data).tobytes()
    if seen.setdefault(key, b) != b:
      return False
  return True


def sites(jitted):
  recs = jitted.report.records
  lows = jitted.report.lowerings
  return dict(
    rewritten=sum(r.rewritten for r in recs),
    total=len(recs),
    route="/".join(sorted({low.route for low in lows})),
    note="; ".join(low.note for low in lows if low.note),
    bytes_before=sum(r.bytes_before for r in recs),
    bytes_after=sum(r.bytes_after for r in recs),
    records=[
      dict(
        index=r.index,
        location=r.location,
        shapes=r.shapes,
        dtypes=r.dtypes,
        group=f"{r.group_size}x{r.num_groups}",
        decision=r.decision,
        reason=r.reason,
      )
      for r in recs
    ],
  )


# ----------------------------------------------------------------------------- the check


def build(opts, models, train, utils, default):
  config = default.get_config()
  config.vocab_size = opts.vocab
  config.num_layers = opts.layers
  config.emb_dim = opts.emb
  config.qkv_dim = opts.emb
  config.mlp_dim = opts.mlp
  config.num_heads = opts.heads
  config.max_target_length = opts.seq
  config.per_device_batch_size = opts.batch
  config.use_bfloat16 = opts.dtype == "bfloat16"
  config.warmup_steps = opts.warmup_steps
  vocab_size = config.vocab_size  # int(encoder.vocab_size()) in train_and_evaluate
  # As train.train_and_evaluate builds it.
  train_config = models.TransformerConfig(
    vocab_size=vocab_size,
    output_vocab_size=vocab_size,
    logits_via_embedding=config.logits_via_embedding,
    dtype=jnp.bfloat16 if config.use_bfloat16 else jnp.float32,
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
  learning_rate_fn = train.create_learning_rate_schedule(
    learning_rate=config.learning_rate, warmup_steps=config.warmup_steps
  )
  optimizer = optax.adamw(
    learning_rate_fn, b1=0.9, b2=0.98, eps=1e-9, weight_decay=config.weight_decay
  )
  return config, train_config, eval_config, learning_rate_fn, optimizer


def make_batches(opts, n):
  rng = np.random.default_rng(opts.seed)
  out = []
  for _ in range(n):
    out.append({"inputs": padded_tokens(rng, opts.vocab, opts.batch, opts.seq)})
  return out


def check_mesh(opts, name, shape, ex, variants):
  models, train, utils, default = ex
  config, train_config, eval_config, learning_rate_fn, optimizer = build(opts, *ex)
  mesh = jax.make_mesh(shape, tuple(config.mesh_axes), axis_types=(AxisType.Auto,) * len(shape))
  rng = jax.random.PRNGKey(config.seed)
  rng, init_rng = jax.random.split(rng)
  m = models.TransformerLM(eval_config)
  t0 = time.perf_counter()
  state, state_mesh_annotations = utils.setup_initial_state(m, optimizer, config, init_rng, mesh)
  data_sharding = NamedSharding(mesh, P(config.data_sharding))
  param_specs = {
    "/".join(str(getattr(k, "key", k)) for k in path): str(s.spec)
    for path, s in jax.tree_util.tree_leaves_with_path(state_mesh_annotations.params)
  }
  batches = make_batches(opts, max(1, opts.train_steps))
  eval_batch = jax.device_put(batches[0], data_sharding)
  row = dict(
    mesh=name,
    mesh_shape=dict(zip(config.mesh_axes, shape)),
    param_specs=param_specs,
    init_seconds=time.perf_counter() - t0,
  )
  split = sum(
    1
    for s in jax.tree_util.tree_leaves(state_mesh_annotations.params)
    if any(
      mesh.shape[a] > 1
      for e in s.spec
      if e is not None
      for a in ((e,) if isinstance(e, str) else e)
    )
  )
  print(
    f"\n== mesh {name}: {dict(zip(config.mesh_axes, shape))}; {split} of "
    f"{len(param_specs)} params split over devices (the rest replicated)",
    flush=True,
  )

  # --- logits: the model call of train.eval_step, with eval_step's jit shardings.
  def logits_fn(params, batch, config):
    return models.TransformerLM(config).apply({"params": params}, batch["inputs"])

  eval_kw = dict(
    in_shardings=(state_mesh_annotations.params, data_sharding),
    out_shardings=None,
    static_argnums=(2,),
  )
  metric_kw = dict(eval_kw, static_argnums=(2, 3))
  # One device, no mesh: how far a float reordering alone moves the logits.
  single = jax.jit(logits_fn, static_argnums=(2,))(
    jax.device_get(state.params), batches[0], eval_config
  )
  results = {}
  for label, flags in variants:
    res = results[label] = {}
    t = time.perf_counter()
    if flags is None:
      f_logits = jax.jit(logits_fn, **eval_kw)
      f_eval = jax.jit(train.eval_step, **metric_kw)
    else:
      f_logits = equarx_pass.jit(logits_fn, flags=flags, **eval_kw)
      f_eval = equarx_pass.jit(train.eval_step, flags=flags, **metric_kw)
    logits = f_logits(state.params, eval_batch, eval_config)
    logits.block_until_ready()
    res["logits_seconds"] = time.perf_counter() - t
    res["logits"] = logits
    res["logits_consistent"] = shards_consistent(logits)
    t = time.perf_counter()
    res["metrics"] = jax.device_get(f_eval(state.params, eval_batch, eval_config))
    res["eval_seconds"] = time.perf_counter() - t
    if flags is not None:
      res["sites_logits"] = sites(f_logits)
      res["sites_eval"] = sites(f_eval)
      if opts.dump:
        os.makedirs(opts.dump, exist_ok=True)
        path = os.path.join(opts.dump, f"{name}_{label}_logits.mlir")
        with open(path, "w") as fh:
          fh.write(f_logits.lower(state.params, eval_batch, eval_config).as_text())
    print(
      f"  {label}: logits {res['logits_seconds']:.1f} s, eval_step "
      f"{res['eval_seconds']:.1f} s"
      + (
        f", sites {res['sites_logits']['rewritten']}/{res['sites_logits']['total']} "
        f"({res['sites_logits']['route']})"
        if flags is not None
        else ""
      ),
      flush=True,
    )

    # --- train steps, as train_and_evaluate jits them (donating the state).
    if opts.train_steps:
      train_kw = dict(
        in_shardings=(state_mesh_annotations, data_sharding, None),
        out_shardings=(state_mesh_annotations, None),
        static_argnums=(2, 3, 4),
        donate_argnums=0,
      )
      f_train = (
        jax.jit(train.train_step, **train_kw)
        if flags is None
        else equarx_pass.jit(train.train_step, flags=flags, **train_kw)
      )
      copy = jax.jit(
        lambda s: jax.tree_util.tree_map(jnp.copy, s), out_shardings=state_mesh_annotations
      )
      st = copy(state)
      dropout_rngs = rng
      losses, accs = [], []
      t = time.perf_counter()
      for b in batches[: opts.train_steps]:
        b = jax.tree_util.tree_map(lambda x: jnp.array(x), b)
        st, metrics = f_train(st, b, train_config, learning_rate_fn, 0.0, dropout_rngs)
        metrics = jax.device_get(metrics)
        losses.append(float(metrics["loss"] / metrics["denominator"]))
        accs.append(float(metrics["accuracy"] / metrics["denominator"]))
      res["train_seconds"] = time.perf_counter() - t
      res["train_loss"] = losses
      res["train_acc"] = accs
      res["final_params"] = jax.device_get(st.params)
      if flags is not None:
        res["sites_train"] = sites(f_train)
      print(
        f"  {label}: {opts.train_steps} train steps {res['train_seconds']:.1f} s, loss "
        + " ".join(f"{x:.6f}" for x in losses),
        flush=True,
      )

  # --- compare against jax.jit
  ref = results["jax.jit"]
  want = np.asarray(ref["logits"])
  weights = np.asarray(batches[0]["inputs"]) > 0
  row["single_device_vs_jax_jit_rel_l2"] = rel_l2(want, single)
  row["variants"] = {}
  for label, flags in variants:
    res = results[label]
    got = np.asarray(res["logits"])
    agree = np.argmax(got, -1) == np.argmax(want, -1)
    v = dict(
      flags=flags,
      logits_rel_l2=rel_l2(got, want),
      logits_max_abs=max_abs(got, want),
      logits_max_abs_ref=float(np.max(np.abs(as64(want)))),
      argmax_agreement=float(agree.mean()),
      argmax_agreement_nonpad=float(agree[weights].mean()),
      logits_bit_identical=bits_equal(got, want),
      logits_shards_consistent=res["logits_consistent"],
      eval_metrics={k: float(x) for k, x in res["metrics"].items()},
      eval_metrics_bit_identical=bits_equal(res["metrics"], ref["metrics"]),
      logits_seconds=res["logits_seconds"],
      eval_seconds=res["eval_seconds"],
    )
    v["eval_loss_rel_diff"] = abs(v["eval_metrics"]["loss"] - ref["metrics"]["loss"]) / abs(
      float(ref["metrics"]["loss"])
    )
    for k in ("sites_logits", "sites_eval", "sites_train"):
      if k in res:
        v[k] = res[k]
    if opts.train_steps:
      v.update(
        train_loss=res["train_loss"],
        train_acc=res["train_acc"],
        train_seconds=res["train_seconds"],
        train_loss_max_rel_diff=max(
          abs(a - b) / abs(b) for a, b in zip(res["train_loss"], ref["train_loss"])
        ),
        final_params_rel_l2=tree_rel_l2(res["final_params"], ref["final_params"]),
        train_bit_identical=(
          res["train_loss"] == ref["train_loss"]
          and bits_equal(res["final_params"], ref["final_params"])
        ),
      )
    row["variants"][label] = v
  return row


def table_rows(row, opts):
  out = []
  for label, v in row["variants"].items():
    if v["flags"] is None:
      continue
    s = v["sites_logits"]
    r = {
      "mesh": row["mesh"],
      "run": label,
      "sites rewritten (logits, eval, train)": ", ".join(
        f"{v[k]['rewritten']}/{v[k]['total']}" if k in v else "-"
        for k in ("sites_logits", "sites_eval", "sites_train")
      ),
      "route": s["route"],
      "logits rel L2": f"{v['logits_rel_l2']:.2e}",
      "max abs": f"{v['logits_max_abs']:.2e}",
      "argmax agree %": f"{100 * v['argmax_agreement']:.2f}",
      "bit-identical": "yes" if v["logits_bit_identical"] else "no",
      "eval loss rel diff": f"{v['eval_loss_rel_diff']:.1e}",
    }
    if opts.train_steps:
      r["train loss rel diff (max)"] = f"{v['train_loss_max_rel_diff']:.1e}"
      r["params after train rel L2"] = f"{v['final_params_rel_l2']:.1e}"
      r["train bit-identical"] = "yes" if v["train_bit_identical"] else "no"
    out.append(r)
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--lm1b-dir",
    default=os.environ.get("FLAX_LM1B_DIR"),
    help="flax's examples/lm1b directory (default $FLAX_LM1B_DIR)",
  )
  parser.add_argument("--out", default=DEFAULT_OUT)
  parser.add_argument(
    "--flags",
    default=DEFAULT_FLAGS,
    help=f"equarx flags of the quantized run (default {DEFAULT_FLAGS!r}); "
    "the identity run adds --equarx_identity",
  )
  parser.add_argument(
    "--also",
    action="append",
    default=[],
    metavar="FLAGS",
    help="another quantized run with these flags (write --also='--equarx_...'); "
    "repeatable; labelled 'also1', 'also2', ...",
  )
  parser.add_argument(
    "--meshes",
    default="tp:2x1x4,tp8:1x1x8,fsdp:1x8x1",
    help="NAME:DATAxFSDPxTENSOR,... over the example's mesh axes",
  )
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--emb", type=int, default=256, help="emb_dim = qkv_dim")
  parser.add_argument("--mlp", type=int, default=1024)
  parser.add_argument(
    "--heads",
    type=int,
    default=8,
    help="8 as in the example; the fsdp axis size must divide it (the example's "
    "(embed, kv) annotation lands on the heads dim of 3-D kernels)",
  )
  parser.add_argument("--vocab", type=int, default=2048)
  parser.add_argument("--seq", type=int, default=128, help="max_target_length")
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument(
    "--dtype",
    choices=("float32", "bfloat16"),
    default="float32",
    help="float32 (use_bfloat16=False) or bfloat16 (the example's default)",
  )
  parser.add_argument("--train-steps", type=int, default=3)
  parser.add_argument(
    "--warmup-steps",
    type=int,
    default=1,
    help="config.warmup_steps (the example's 1000 would keep the learning "
    "rate ~0 for the few steps run here)",
  )
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
    "--flax-commit",
    default="",
    help="the flax commit the directory came from (default: git rev-parse "
    "in --lm1b-dir, where it is a work tree; needed for a directory unpacked with git archive)",
  )
  parser.add_argument("--dump", default="", help="write each rewritten logits module here")
  opts = parser.parse_args(argv)
  if not opts.lm1b_dir:
    parser.error("--lm1b-dir is required (flax's examples/lm1b; see the docstring)")

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
  commit = opts.flax_commit or flax_commit(opts.lm1b_dir)
  models, train, utils, default, stand_ins = import_example(opts.lm1b_dir)
  print(
    f"lm1b from {os.path.abspath(opts.lm1b_dir)} (flax commit "
    f"{commit or 'unknown: not a git work tree, see --flax-commit'}); jax {jax.__version__}, "
    f"flax {flax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} devices"
  )
  if stand_ins:
    print(f"stand-in modules (not importable here, unused by the code run): {', '.join(stand_ins)}")
  print(
    f"model: {opts.layers} layers, emb/qkv {opts.emb}, mlp {opts.mlp}, heads {opts.heads}, "
    f"vocab {opts.vocab}, batch {opts.batch} x {opts.seq}, {opts.dtype}; "
    f"quantized flags: {opts.flags!r}"
  )
  variants = [
    ("jax.jit", None),
    ("int8", opts.flags),
    ("identity", opts.flags + " --equarx_identity"),
  ]
  variants += [(f"also{i + 1}", flags) for i, flags in enumerate(opts.also)]
  rows = []
  for spec in opts.meshes.split(","):
    name, dims = spec.split(":")
    shape = tuple(int(d) for d in dims.split("x"))
    rows.append(check_mesh(opts, name, shape, (models, train, utils, default), variants))

  columns = [
    "mesh",
    "run",
    "sites rewritten (logits, eval, train)",
    "route",
    "logits rel L2",
    "max abs",
    "argmax agree %",
    "bit-identical",
    "eval loss rel diff",
  ]
  if opts.train_steps:
    columns += ["train loss rel diff (max)", "params after train rel L2", "train bit-identical"]
  trows = [r for row in rows for r in table_rows(row, opts)]
  print()
  for row in rows:
    print(
      f"mesh {row['mesh']} {row['mesh_shape']}: jax.jit on 1 device vs jax.jit on the "
      f"mesh, logits rel L2 {row['single_device_vs_jax_jit_rel_l2']:.2e}"
    )
  for i, flags in enumerate(opts.also):
    print(f"also{i + 1}: {flags}")
  print(benchlib.table(trows, columns))
  total = time.perf_counter() - start
  print(f"total {total:.0f} s")
  if opts.out:
    benchlib.write_results(
      opts.out,
      rows,
      trows,
      columns,
      flax_commit=commit,
      lm1b_dir=os.path.abspath(opts.lm1b_dir),
      stand_ins=stand_ins,
      model=dict(
        layers=opts.layers,
        emb=opts.emb,
        mlp=opts.mlp,
        heads=opts.heads,
        vocab=opts.vocab,
        seq=opts.seq,
        batch=opts.batch,
        dtype=opts.dtype,
        train_steps=opts.train_steps,
        warmup_steps=opts.warmup_steps,
      ),
      flags=opts.flags,
      total_seconds=total,
    )
  failed = [
    f"{row['mesh']} {lbl}"
    for row in rows
    for lbl, r in row["variants"].items()
    if (
      lbl == "identity"
      and not (
        r["logits_bit_identical"]
        and r["eval_metrics_bit_identical"]
        and r.get("train_bit_identical", True)
      )
    )
    or (
      lbl != "identity"
      and r["flags"] is not None
      and (r["logits_rel_l2"] > 5e-2 or r["argmax_agreement"] < 0.95)
    )
  ]
  if failed:
    print(
      f"FAILED: {len(failed)} run(s) outside expectations ({', '.join(failed)}; identity must "
      "be bit-identical; quantized logits rel L2 <= 5e-2 and argmax agreement >= 95%)"
    )
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
