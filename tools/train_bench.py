"""Training benchmark: a small flax transformer LM trained on real text, jax.jit vs equarx_pass.jit.

    python tools/train_bench.py --quick       # 20 steps, a smoke test (2-3 min on 2 cores)
    python tools/train_bench.py               # 300 steps, 2 meshes x 7 schemes (17 min)
    python tools/train_bench.py --meshes fsdp --steps 100 \\
      --scheme=none --scheme="--equarx_enable --equarx_min_bytes=0"

Data: the docstrings and comments of the Python standard library (tools/data/text_corpus.py:
built offline and deterministically from the running Python's own stdlib, byte-level
tokens, vocab 256, the last 5% held out); its sha256 is in the output, so runs on other
Pythons can be told apart.

Model: a decoder-only transformer LM in flax.linen, as flax users write one: token and
learned position embeddings, --layers pre-LayerNorm blocks (causal
nn.MultiHeadDotProductAttention, a GELU MLP of 4 x --emb), a final LayerNorm and an output
head tied to the token embedding; parameters carry logical axis names
(nn.with_logical_partitioning). Trained with optax (global-norm clipping at 1, adamw,
warmup + cosine schedule) from --seed, in f32; the state is flax's TrainState.

Meshes on 8 virtual CPU devices (--meshes), sharded the way JAX users do it: jax.jit
with NamedSharding in/out shardings, auto axes, so the SPMD partitioner inserts every
collective (no shard_map, no psum):
  dp_tp  data 2 x model 4, Megatron-style: logical rules batch -> data, heads / mlp /
         vocab -> model (attention heads, MLP hidden units and the vocabulary split over
         'model'; the rest replicated), through nn.logical_to_mesh_sharding;
  fsdp   fsdp 8, ZeRO-3 / FSDP: every parameter of at least 4096 values, and its adamw
         moments, sharded on its largest dimension that 8 divides (the recipe of JAX's
         scaling tutorials), the batch sharded too; the partitioner all-gathers the
         weights and all-reduces the gradients (on XLA:CPU a full all-reduce followed by
         a slice, not a reduce-scatter).
  hybrid_tp, hybrid_fsdp  2 emulated hosts of 4 devices (--equarx_domain_devices=4 added
         to every scheme): data parallel across the hosts, tensor parallel (dp_tp's rules)
         or FSDP (on 4) inside; "bytes across hosts" is what each device sends between
         hosts per step, by the site report.

Schemes (--scheme, repeatable; "none" is plain jax.jit): each trains --steps steps from the
same initial state on the same batches; the train step is jax.jit(step, in_shardings=...,
out_shardings=..., donate_argnums=0) for "none" and equarx_pass.jit(step, flags=SCHEME,
...) with the same keyword arguments otherwise (the partitioned route: the all-reduces
the partitioner inserts are rewritten). Default (DEFAULT_SCHEMES): none; the pass's
default scheme (int8 two-shot, block 128, Hadamard 128) on the all-reduces, then also on
the reduce-scatters (--equarx_ops=all_reduce,reduce_scatter: on fsdp the gradients'
all-reduce-and-slice becomes a quantized reduce-scatter), then also on the all-gathers
(the weights), then all three with stochastic rounding; the int4 EQuARX ring on the
all-reduces, and on all three. The pass's
--equarx_min_bytes (default 131072) applies, and with the default model it selects on
both meshes: on dp_tp the 14 tensor-parallel activation all-reduces (1 MiB per device)
and the 5 data-parallel gradient all-reduces of 128 KiB and more (19 of 76 sites), on
fsdp the gradients of every weight matrix, the position table and the embedding (15 of
52); the rest are small (LayerNorm and bias gradients, 64 KiB kernel shards on dp_tp,
the scalars of the global norm and the loss) or not sums (the softmax's max). Add
--equarx_min_bytes=0 to a scheme to quantize every sum. The sites rewritten and the skip
reasons are in the JSON and printed; --print-report prints each site table.

Measured per mesh and scheme: the train loss of every step; the held-out loss (mean over
--eval-batches fixed held-out batches, computed by one plain jax.jit eval program for all
schemes, so it compares the trained parameters) every --eval-every steps and at the end;
median seconds per step (the call and fetching the loss; the first call, which compiles,
is reported apart); wire bytes one rank sends per step by collective kind, counted by
equarx_pass/ir/wire_bytes.py (ring model, logical bytes in the program's element types) on the
per-device program after SPMD partitioning: the module equarx_pass.jit's lower() returns
for a scheme (the rewritten per-device program inside the rebuilt module), and for plain
jax.jit the same route with --equarx_identity (every all-reduce kept native: the program
jax.jit compiles). XLA's later passes merge all-reduces (its combiner) but send the same
bytes; XLA:CPU turns none of fsdp's gradient all-reduces into reduce-scatters. And after
every step, whether each replicated array of the train state (parameters, adamw moments)
holds the same bits on every device that has a copy.

Prints a table and writes results/train_bench.json (or --out) and a PNG of the loss curves
(one panel per mesh, a line per scheme) next to it. A benchmark, not a test: nothing is
asserted, timings move with the machine's load.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The corpus is a data generator: tools/data/, apart from the benchmarks.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))

import benchlib  # noqa: E402
import numpy as np  # noqa: E402
import text_corpus  # noqa: E402

NONE = "none"  # plain jax.jit
INT4_RING = "--equarx_enable --equarx_format=int4 --equarx_algorithm=ring --equarx_rotation=none"
WITH_RS = " --equarx_ops=all_reduce,reduce_scatter"
EVERY_OP = " --equarx_ops=all_reduce,reduce_scatter,all_gather"
DEFAULT_SCHEMES = (
  NONE,
  "--equarx_enable",  # the default scheme on the all-reduces
  "--equarx_enable" + WITH_RS,  # ... and on the reduce-scatters (FSDP's gradients)
  "--equarx_enable" + EVERY_OP,  # ... and the all-gathers (FSDP's weights)
  "--equarx_enable --equarx_rounding=stochastic" + EVERY_OP,
  INT4_RING,
  INT4_RING + EVERY_OP,
)
# The plain jax.jit program through equarx_pass.jit's partitioned route with every
# all-reduce kept native: its per-device program is what jax.jit runs, in StableHLO.
NATIVE_FLAGS = "--equarx_enable --equarx_identity --equarx_min_bytes=0 --equarx_partitioned=on"
MESHES = {
  "dp_tp": (("data", 2), ("model", 4)),
  "fsdp": (("fsdp", 8),),
  # Emulated hosts: 2 hosts of 4 devices (--equarx_domain_devices=4), data parallel across
  # the hosts, tensor parallel or FSDP inside each.
  "hybrid_tp": (("data", 2), ("model", 4)),
  "hybrid_fsdp": (("data", 2), ("fsdp", 4)),
}
# Megatron-style rules of the dp_tp mesh (logical axis -> mesh axis); names not listed
# ('embed', 'kv', 'length') are replicated.
DP_TP_RULES = (("batch", "data"), ("heads", "model"), ("mlp", "model"), ("vocab", "model"))
FSDP_MIN_SIZE = 4096  # smaller arrays (biases, LayerNorm) stay replicated
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "collective_permute")
KIND_LABEL = {
  "all_reduce": "AR",
  "reduce_scatter": "RS",
  "all_gather": "AG",
  "all_to_all": "A2A",
  "collective_permute": "CP",
}


# ----------------------------------------------------------------------------- model


def build_model(opts):
  """The flax.linen LM (the class is made here: flax is imported after the device setup)."""
  part = nn.with_logical_partitioning
  dense_init = nn.initializers.xavier_uniform()
  zeros, ones = nn.initializers.zeros, nn.initializers.ones

  def layer_norm(name=None):
    return nn.LayerNorm(
      scale_init=part(ones, ("embed",)), bias_init=part(zeros, ("embed",)), name=name
    )

  class Block(nn.Module):
    heads: int
    mlp: int

    @nn.compact
    def __call__(self, x):
      mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
      h = nn.MultiHeadDotProductAttention(
        num_heads=self.heads,
        kernel_init=part(dense_init, ("embed", "heads", "kv")),
        bias_init=part(zeros, ("heads", "kv")),
        out_kernel_init=part(dense_init, ("heads", "kv", "embed")),
        out_bias_init=part(zeros, ("embed",)),
        name="attn",
      )(layer_norm("ln_attn")(x), mask=mask)
      x = x + h
      h = layer_norm("ln_mlp")(x)
      h = nn.Dense(
        self.mlp, kernel_init=part(dense_init, ("embed", "mlp")), bias_init=part(zeros, ("mlp",))
      )(h)
      h = nn.gelu(h)
      h = nn.Dense(
        x.shape[-1],
        kernel_init=part(dense_init, ("mlp", "embed")),
        bias_init=part(zeros, ("embed",)),
      )(h)
      return x + h

  class TransformerLM(nn.Module):
    vocab: int
    layers: int
    emb: int
    heads: int
    mlp: int
    max_len: int

    @nn.compact
    def __call__(self, tokens):
      embed = nn.Embed(
        self.vocab,
        self.emb,
        embedding_init=part(nn.initializers.normal(0.02), ("vocab", "embed")),
        name="embed",
      )
      pos = self.param(
        "pos", part(nn.initializers.normal(0.02), ("length", "embed")), (self.max_len, self.emb)
      )
      x = embed(tokens) + pos[: tokens.shape[1]]
      for i in range(self.layers):
        x = Block(self.heads, self.mlp, name=f"block_{i}")(x)
      return embed.attend(layer_norm("ln_final")(x))  # tied output head

  return TransformerLM(
    vocab=256, layers=opts.layers, emb=opts.emb, heads=opts.heads, mlp=opts.mlp, max_len=opts.seq
  )


def make_optimizer(opts):
  schedule = optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=opts.lr,
    warmup_steps=max(1, opts.steps // 10),
    decay_steps=max(2, opts.steps),
    end_value=opts.lr / 10,
  )
  return optax.chain(
    optax.clip_by_global_norm(1.0),
    optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=0.1),
  )


def cross_entropy(logits, targets):
  return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


# ----------------------------------------------------------------------------- sharding


def make_mesh(name):
  axes = MESHES[name]
  return jax.make_mesh(
    tuple(n for _, n in axes),
    tuple(a for a, _ in axes),
    axis_types=(AxisType.Auto,) * len(axes),
  )


def fsdp_sharding(mesh, shape) -> NamedSharding:
  """Shard on the largest dimension that the 'fsdp' axis divides; small arrays replicated."""
  n = mesh.shape["fsdp"]
  if int(np.prod(shape, dtype=np.int64)) >= FSDP_MIN_SIZE:
    for d in sorted(range(len(shape)), key=lambda d: (-shape[d], d)):
      if shape[d] % n == 0:
        return NamedSharding(mesh, P(*[("fsdp" if i == d else None) for i in range(len(shape))]))
  return NamedSharding(mesh, P())


# The fast domains of the hybrid meshes: the devices of one "data" index are a host.
HOSTS = {"hybrid_tp": 4, "hybrid_fsdp": 4}


def state_shardings(name, mesh, abstract_state):
  """The NamedShardings of the (unboxed) train state, from its abstract, boxed form."""
  if name in ("dp_tp", "hybrid_tp"):
    return nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract_state), mesh, DP_TP_RULES)
  return jax.tree.map(
    lambda x: fsdp_sharding(mesh, nn.unbox(x).shape),
    abstract_state,
    is_leaf=lambda x: isinstance(x, nn.Partitioned),
  )


def batch_sharding(name, mesh) -> NamedSharding:
  axes = {"dp_tp": "data", "fsdp": "fsdp", "hybrid_tp": "data", "hybrid_fsdp": ("data", "fsdp")}
  return NamedSharding(mesh, P(axes[name], None))


def across_hosts(fn, native: bool = False) -> float | None:
  """Bytes one device sends between hosts per step, by the report (the sites' slow-link
  bytes: rewritten, or native where the site stayed native); None without a topology."""
  recs = [r for r in fn.report.records if r.traffic_before is not None]
  if not recs:
    return None
  # Sites without traffic (integer or max reductions: a few bytes) are left out.
  return float(
    sum((r.traffic_before if native or not r.rewritten else r.traffic_after).slow for r in recs)
  )


def replicated_mismatches(tree) -> int:
  """Arrays of `tree` some of whose copies (shards covering the same index) differ in bits."""
  bad = 0
  for leaf in jax.tree.leaves(tree):
    groups = collections.defaultdict(list)
    for shard in leaf.addressable_shards:
      key = tuple((s.start, s.stop, s.step) for s in shard.index)
      groups[key].append(shard)
    for shards in groups.values():
      if len(shards) < 2:
        continue
      first = np.asarray(shards[0].data).tobytes()  # bits: NaN and -0.0 compare too
      if any(np.asarray(s.data).tobytes() != first for s in shards[1:]):
        bad += 1
        break
  return bad


# ----------------------------------------------------------------------------- wire bytes


def count_wire(lowered, num_devices: int) -> tuple[dict, int]:
  """({collective kind: bytes one rank sends per step}, loops of unknown trip count)."""
  count = wire_bytes.count_module(lowered.compiler_ir("stablehlo"), num_devices)
  by_kind = count.by_kind()
  return {k: float(by_kind.get(k, 0.0)) for k in KINDS}, count.unknown_trip_counts


def sites_summary(fn) -> dict:
  """The sites of a wrapped function's report: counts, route, and the skip reasons."""
  recs = fn.report.records
  reasons = collections.Counter(
    re.sub(r"\d+ bytes", "N bytes", r.reason) for r in recs if not r.rewritten
  )
  lows = fn.report.lowerings
  return dict(
    rewritten=sum(r.rewritten for r in recs),
    total=len(recs),
    lowerings=len(lows),
    route="/".join(sorted({low.route for low in lows})),
    note="; ".join(low.note for low in lows if low.note),
    bytes_before=sum(r.bytes_before for r in recs),
    bytes_after=sum(r.bytes_after for r in recs),
    skip_reasons=dict(reasons),
    schemes=dict(collections.Counter(r.reason for r in recs if r.rewritten)),
    records=[
      dict(
        location=r.location,
        shape="x".join(map(str, r.shapes[0])) if r.shapes else "",
        dtype=",".join(r.dtypes),
        group=f"{r.group_size}x{r.num_groups}",
        decision=r.decision,
        reason=r.reason,
        bytes_before=r.bytes_before,
        bytes_after=r.bytes_after,
      )
      for r in recs
    ],
  )


# ----------------------------------------------------------------------------- data


def train_batches(corpus, opts) -> np.ndarray:
  """int32 [steps, batch, seq + 1]: random windows of the train split, from --seed."""
  rng = np.random.default_rng(opts.seed)
  starts = rng.integers(0, corpus.train.size - opts.seq - 1, size=(opts.steps, opts.batch))
  return corpus.train[starts[..., None] + np.arange(opts.seq + 1)].astype(np.int32)


def heldout_batches(corpus, opts) -> np.ndarray:
  """int32 [eval_batches, batch, seq + 1]: windows spread evenly over the held-out split."""
  n = opts.eval_batches * opts.batch
  starts = np.linspace(0, corpus.heldout.size - opts.seq - 1, n).astype(np.int64)
  windows = corpus.heldout[starts[:, None] + np.arange(opts.seq + 1)].astype(np.int32)
  return windows.reshape(opts.eval_batches, opts.batch, opts.seq + 1)


# ----------------------------------------------------------------------------- one mesh


def run_mesh(name, opts, model, batches, eval_data, schemes):
  mesh = make_mesh(name)
  tx = make_optimizer(opts)
  example = jnp.zeros((opts.batch, opts.seq), jnp.int32)

  def init(rng):
    params = model.init(rng, example)["params"]
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)

  abstract = jax.eval_shape(init, jax.random.key(opts.seed))
  shardings = state_shardings(name, mesh, abstract)
  data_sharding = batch_sharding(name, mesh)
  replicated = NamedSharding(mesh, P())
  init_state = jax.jit(lambda rng: nn.unbox(init(rng)), out_shardings=shardings)
  specs = {
    jax.tree_util.keystr(path): str(s.spec)
    for path, s in jax.tree_util.tree_leaves_with_path(shardings.params)
  }
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(abstract.params)))
  print(
    f"\n== mesh {name} {dict(mesh.shape)}: {n_params:,} parameters, "
    f"{sum(1 for s in jax.tree.leaves(shardings.params) if any(s.spec))} of {len(specs)} "
    "parameter arrays split over devices",
    flush=True,
  )

  def train_step(state, batch):
    def loss_fn(params):
      logits = state.apply_fn({"params": params}, batch[:, :-1])
      return cross_entropy(logits, batch[:, 1:])

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss

  def eval_step(params, batch):
    return cross_entropy(model.apply({"params": params}, batch[:, :-1]), batch[:, 1:])

  jit_kwargs = dict(
    in_shardings=(shardings, data_sharding),
    out_shardings=(shardings, replicated),
    donate_argnums=0,
  )
  evaluate = jax.jit(eval_step, in_shardings=(shardings.params, data_sharding))
  eval_on_device = [jax.device_put(b, data_sharding) for b in eval_data]

  def heldout_loss(params) -> float:
    return float(np.mean([float(evaluate(params, b)) for b in eval_on_device]))

  # Wire bytes of plain jax.jit's per-device program (see NATIVE_FLAGS).
  state = init_state(jax.random.key(opts.seed))
  first = jax.device_put(batches[0], data_sharding)
  hosts = f" --equarx_domain_devices={HOSTS[name]}" if name in HOSTS else ""
  native = equarx_pass.jit(train_step, flags=NATIVE_FLAGS + hosts, **jit_kwargs)
  native_wire, native_unknown = count_wire(native.lower(state, first), mesh.size)
  native_across = across_hosts(native, native=True) if hosts else None
  initial_heldout = heldout_loss(state.params)
  del state

  runs = []
  for flags in schemes:
    label = "jax.jit" if flags == NONE else benchlib.scheme_label(flags)
    min_bytes = re.findall(r"--equarx_min_bytes=(\S+)", flags)
    if min_bytes:  # not in scheme_label, and it changes which sites a scheme takes
      label += f" min_bytes={min_bytes[-1]}"
    print(f"  {label} ({flags})", flush=True)
    if flags == NONE:
      step_fn = jax.jit(train_step, **jit_kwargs)
    else:
      step_fn = equarx_pass.jit(train_step, flags=flags + hosts, **jit_kwargs)
    state = init_state(jax.random.key(opts.seed))
    t = time.perf_counter()
    lowered = step_fn.lower(state, first)
    if flags == NONE:
      wire, unknown, sites = native_wire, native_unknown, None
    else:
      sites = sites_summary(step_fn)
      if sites["rewritten"]:
        wire, unknown = count_wire(lowered, mesh.size)
      else:  # nothing rewritten: equarx_pass.jit runs plain jax.jit's executable
        wire, unknown = native_wire, native_unknown
      print(
        f"    sites rewritten: {sites['rewritten']}/{sites['total']} ({sites['route']} route)"
        + (f"; skipped: {sites['skip_reasons']}" if sites["skip_reasons"] else "")
        + (f"; note: {sites['note']}" if sites["note"] else ""),
        flush=True,
      )
      if opts.print_report:
        print(step_fn.report)
    losses, seconds, evals, mismatches = [], [], [(0, initial_heldout)], []
    first_call = None
    for i in range(opts.steps):
      batch = jax.device_put(batches[i], data_sharding)
      start = time.perf_counter()
      state, loss = step_fn(state, batch)
      loss = float(loss)
      elapsed = time.perf_counter() - start
      if first_call is None:
        first_call = time.perf_counter() - t  # lower + compile + the first step
      else:
        seconds.append(elapsed)
      losses.append(loss)
      bad = replicated_mismatches(state.params), replicated_mismatches(state.opt_state)
      mismatches.append(bad)
      step = i + 1
      if (opts.eval_every and step % opts.eval_every == 0) or step == opts.steps:
        evals.append((step, heldout_loss(state.params)))
        print(
          f"    step {step}: train loss {loss:.4f}, held-out {evals[-1][1]:.4f}, "
          f"{np.median(seconds) if seconds else elapsed:.3f} s/step",
          flush=True,
        )
    if flags != NONE:
      sites = sites_summary(step_fn)  # lowerings after the run: 1 unless shardings drifted
    params_bad = sum(1 for b in mismatches if b[0])
    opt_bad = sum(1 for b in mismatches if b[1])
    runs.append(
      dict(
        scheme=flags,
        label=label,
        train_loss=losses,
        heldout=evals,
        final_train_loss=float(np.mean(losses[-opts.final_window :])),
        final_heldout=evals[-1][1],
        seconds_per_step=float(np.median(seconds)) if seconds else None,
        seconds_per_step_mean=float(np.mean(seconds)) if seconds else None,
        first_call_seconds=first_call,
        wire_bytes=wire,
        wire_bytes_total=sum(wire.values()),
        bytes_across_hosts=(native_across if flags == NONE else across_hosts(step_fn))
        if hosts
        else None,
        unknown_trip_counts=unknown,
        params_mismatch_steps=params_bad,
        opt_state_mismatch_steps=opt_bad,
        first_mismatch_step=next((i + 1 for i, b in enumerate(mismatches) if any(b)), None),
        sites=sites,
      )
    )
    del state
  ref = next((r for r in runs if r["scheme"] == NONE), None)
  for r in runs:
    r["heldout_vs_jax_jit_pct"] = (
      100 * (r["final_heldout"] - ref["final_heldout"]) / ref["final_heldout"] if ref else None
    )
  return dict(
    mesh=name,
    mesh_shape=dict(mesh.shape),
    parameters=n_params,
    param_specs=specs,
    initial_heldout=initial_heldout,
    runs=runs,
  )


# ----------------------------------------------------------------------------- output


def table_rows(results, kinds) -> list[dict]:
  out = []
  for res in results:
    for r in res["runs"]:
      row = {
        "mesh": res["mesh"],
        "scheme": r["label"],
        "sites": f"{r['sites']['rewritten']}/{r['sites']['total']}" if r["sites"] else "-",
        "train loss": f"{r['final_train_loss']:.4f}",
        "held-out loss": f"{r['final_heldout']:.4f}",
        "vs jax.jit": (
          "(ref)"
          if r["scheme"] == NONE
          else f"{r['heldout_vs_jax_jit_pct']:+.2f}%"
          if r["heldout_vs_jax_jit_pct"] is not None
          else "-"
        ),
      }
      for k in kinds:
        row[f"{KIND_LABEL[k]}/step"] = benchlib.fmt_bytes(r["wire_bytes"][k])
      row["total/step"] = benchlib.fmt_bytes(r["wire_bytes_total"])
      across = r.get("bytes_across_hosts")
      row["across hosts/step"] = benchlib.fmt_bytes(across) if across is not None else "-"
      row["mismatches"] = f"{r['params_mismatch_steps']}/{r['opt_state_mismatch_steps']}"
      row["s/step"] = f"{r['seconds_per_step']:.3f}" if r["seconds_per_step"] else "-"
      out.append(row)
  return out


def smooth(values, window: int) -> np.ndarray:
  """Trailing mean over `window` steps (fewer at the start)."""
  v = np.asarray(values, np.float64)
  c = np.concatenate([[0.0], np.cumsum(v)])
  i = np.arange(1, v.size + 1)
  lo = np.maximum(0, i - window)
  return (c[i] - c[lo]) / (i - lo)


def plot(results, path, opts) -> None:
  plt = benchlib.pyplot()
  if plt is None:
    return
  fig, axes = plt.subplots(
    1, len(results), figsize=(6 * len(results), 4.6), squeeze=False, sharey=True
  )
  # The y axis from step steps/10 on: the first steps (from 5.5 nats) would flatten the rest.
  skip = max(1, opts.steps // 10)
  shown, handles = [], []
  for ax, res in zip(axes[0], results):
    handles = []
    for j, r in enumerate(res["runs"]):
      color = f"C{j}"
      steps = np.arange(1, len(r["train_loss"]) + 1)
      window = max(1, min(opts.smooth, len(steps) // 4 or 1))
      curve = smooth(r["train_loss"], window)
      (line,) = ax.plot(steps, curve, color=color, lw=1.0, alpha=0.6, label=r["label"])
      hs, hl = zip(*r["heldout"])
      ax.plot(hs, hl, "o--", color=color, ms=3, lw=1.0)
      handles.append(line)
      shown += list(curve[skip:]) + [h for s, h in r["heldout"] if s >= skip]
    ax.set_title(f"{res['mesh']} {res['mesh_shape']}")
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  if shown:
    lo, hi = min(shown), max(shown)
    pad = 0.05 * (hi - lo) or 0.05
    axes[0][0].set_ylim(lo - pad, hi + pad)
  axes[0][0].set_ylabel(f"loss (nats per byte; axis from step {skip})")
  fig.suptitle(
    f"{opts.layers} layers, emb {opts.emb}, {opts.heads} heads, batch {opts.batch} x "
    f"{opts.seq} bytes; stdlib docstrings and comments. Lines: train loss (mean of "
    f"{opts.smooth} steps); dashed with dots: held-out loss",
    fontsize=9,
  )
  fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
  fig.subplots_adjust(bottom=0.30, top=0.86)
  benchlib.save_plot(fig, path)


def replot(path: str) -> int:
  """Draw the PNG of an earlier run's JSON again (the plot's layout changed, not the run)."""
  import json
  import types

  with open(path) as f:
    data = json.load(f)
  model, training = data["model"], data["training"]
  opts = types.SimpleNamespace(
    steps=training["steps"],
    smooth=training.get("smooth", 10),
    layers=model["layers"],
    emb=model["emb"],
    heads=model["heads"],
    batch=model["batch"],
    seq=model["seq"],
  )
  plot(data["results"], os.path.splitext(path)[0] + ".png", opts)
  return 0


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  benchlib.add_scheme_argument(ap)
  ap.add_argument("--steps", type=int, default=300)
  ap.add_argument(
    "--meshes",
    nargs="+",
    choices=sorted(MESHES),
    default=["dp_tp", "fsdp"],
    help="default: dp_tp fsdp; hybrid_tp and hybrid_fsdp emulate 2 hosts of 4 devices",
  )
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--emb", type=int, default=256)
  ap.add_argument("--heads", type=int, default=8, help="dp_tp needs a multiple of 4")
  ap.add_argument("--mlp", type=int, default=0, help="MLP width (default 4 x --emb)")
  ap.add_argument("--seq", type=int, default=128, help="tokens (bytes) per sequence")
  ap.add_argument("--batch", type=int, default=16, help="global batch; a multiple of 8")
  ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--eval-every", type=int, default=50, help="0: at the end only")
  ap.add_argument("--eval-batches", type=int, default=8)
  ap.add_argument(
    "--final-window", type=int, default=20, help="final train loss: mean of the last N steps"
  )
  ap.add_argument("--smooth", type=int, default=10, help="plot: train loss mean over N steps")
  ap.add_argument("--print-report", action="store_true", help="print each scheme's site table")
  ap.add_argument(
    "--out", help="JSON to write (default results/train_bench.json; with --quick, a temp file)"
  )
  ap.add_argument("--quick", action="store_true", help="a smoke test: 20 steps, 2 eval batches")
  ap.add_argument("--replot", metavar="JSON", help="only draw the PNG of an earlier run's JSON")
  opts = ap.parse_args(argv)
  if opts.replot:
    return replot(opts.replot)
  if opts.quick:
    opts.steps, opts.eval_every, opts.eval_batches = 20, 10, 2
  if opts.out is None:  # a smoke test never replaces the published results
    import tempfile

    folder = tempfile.gettempdir() if opts.quick else benchlib.RESULTS
    opts.out = os.path.join(folder, "train_bench_quick.json" if opts.quick else "train_bench.json")
  opts.mlp = opts.mlp or 4 * opts.emb
  if "dp_tp" in opts.meshes and opts.heads % 4:
    ap.error("--heads must be a multiple of 4 (the dp_tp mesh's model axis)")
  if opts.batch % 8:
    ap.error("--batch must be a multiple of 8 (the fsdp mesh)")
  if opts.emb % opts.heads:
    ap.error("--emb must be a multiple of --heads")

  global jax, jnp, nn, optax, train_state, equarx_pass, wire_bytes, AxisType, NamedSharding, P
  import jax

  jax.config.update("jax_num_cpu_devices", 8)
  import flax.linen as nn
  import jax.numpy as jnp
  import optax
  from flax.training import train_state
  from jax.sharding import AxisType, NamedSharding
  from jax.sharding import PartitionSpec as P

  import equarx_pass
  from equarx_pass.ir import wire_bytes

  start = time.perf_counter()
  schemes, missing = benchlib.split_schemes(
    [s for s in (opts.scheme or DEFAULT_SCHEMES) if s != NONE]
  )
  if NONE in (opts.scheme or DEFAULT_SCHEMES):
    schemes.insert(0, NONE)
  for s, why in missing.items():
    print(f"scheme {s!r}: {why}")

  corpus = text_corpus.build()
  info = corpus.describe()
  print(
    f"corpus: {info['bytes']:,} bytes ({info['train_bytes']:,} train, "
    f"{info['heldout_bytes']:,} held out) from {info['files']} files, sha256 "
    f"{info['sha256'][:16]}...; {info['source']}"
  )
  model = build_model(opts)
  batches = train_batches(corpus, opts)
  eval_data = heldout_batches(corpus, opts)
  print(
    f"model: {opts.layers} layers, emb {opts.emb}, {opts.heads} heads, mlp {opts.mlp}, "
    f"vocab 256, batch {opts.batch} x {opts.seq}; {opts.steps} steps, lr {opts.lr}, seed "
    f"{opts.seed}; jax {jax.__version__}, {len(jax.devices())} "
    f"{jax.devices()[0].platform} devices"
  )
  results = [run_mesh(m, opts, model, batches, eval_data, schemes) for m in opts.meshes]
  total = time.perf_counter() - start

  kinds = [k for k in KINDS if any(r["wire_bytes"][k] for res in results for r in res["runs"])]
  columns = ["mesh", "scheme", "sites", "train loss", "held-out loss", "vs jax.jit"]
  columns += [f"{KIND_LABEL[k]}/step" for k in kinds] + ["total/step"]
  if any(r.get("bytes_across_hosts") is not None for res in results for r in res["runs"]):
    columns.append("across hosts/step")
  columns += ["mismatches", "s/step"]
  rows = table_rows(results, kinds)
  print()
  print(
    benchlib.table(
      rows,
      columns,
      f"{opts.steps} steps; train loss: mean of the last {min(opts.final_window, opts.steps)}; "
      "held-out: after the last step; vs jax.jit: held-out loss relative to plain jax.jit's; "
      "bytes: one rank per step (AR all-reduce, RS reduce-scatter, AG all-gather, A2A "
      "all-to-all, CP collective-permute); mismatches: P/O = the number of steps after "
      "which a replicated parameter (P) or optimizer-state (O) array differed between its "
      "copies; s/step: median",
    )
  )
  unknown = sum(r["unknown_trip_counts"] for res in results for r in res["runs"])
  if unknown:
    print(f"note: {unknown} loops of unknown trip count were counted once")
  print(f"total {total:.0f} s")
  if opts.out:
    benchlib.write_results(
      opts.out,
      results,
      rows,
      columns,
      corpus=info,
      model=dict(
        layers=opts.layers,
        emb=opts.emb,
        heads=opts.heads,
        mlp=opts.mlp,
        vocab=256,
        seq=opts.seq,
        batch=opts.batch,
        tied_head=True,
        dtype="float32",
      ),
      training=dict(
        steps=opts.steps,
        lr=opts.lr,
        seed=opts.seed,
        optimizer="clip_by_global_norm(1) + adamw(b1 0.9, b2 0.95, wd 0.1), "
        "warmup 10% + cosine to lr/10",
        eval_every=opts.eval_every,
        eval_batches=opts.eval_batches,
        final_window=opts.final_window,
      ),
      schemes=schemes,
      unavailable_schemes=missing,
      total_seconds=total,
    )
    plot(results, os.path.splitext(opts.out)[0] + ".png", opts)
  return 0


if __name__ == "__main__":
  sys.exit(main())
