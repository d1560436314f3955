"""A corpus of programs that carry what real models carry, for tests/test_faithful.py.

Each `Program` is a function, a maker of fresh arguments (fresh: some programs
donate theirs) and the jax.jit keyword arguments to run it with.  Most are plain
jax.jit + NamedSharding programs whose all-reduces the SPMD partitioner inserts
(the partitioned route); the `lowered=True` ones write their psums by hand in a
shard_map (the lowered route).  Together they carry: NumPy constant tables of many
sizes and dtypes (sinusoidal position embeddings, RoPE frequencies, causal masks),
iota, gathers and scatters, RNG with a key argument (raw and typed keys, dropout),
while / cond / fori_loop / scan, LAPACK custom calls, donation, pytree and
multi-output results, bf16/f32 mixes, 1-D and 2-D meshes, tensor-parallel
(Megatron) and FSDP shardings, training steps (SGD, optax adam) and a flax linen
model sharded through flax's logical partitioning.

`run_pair` runs a program through jax.jit and equarx_pass.jit; `assert_same`
compares the results leaf by leaf and shard by shard, bit for bit.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import equarx_pass

AUTO = jax.sharding.AxisType.Auto
# Every all-reduce rewritten, whatever the cost model predicts (the emitted form is
# what these programs test), quantized or, under identity, rebuilt native.
QUANTIZED = "--equarx_enable --equarx_min_bytes=0 --equarx_force"
IDENTITY = QUANTIZED + " --equarx_identity"

D, F, B, S = 64, 256, 16, 16  # hidden, FFN, batch (tokens), sequence


def mesh_1d(name="tp"):
  return jax.make_mesh((8,), (name,), axis_types=(AUTO,))


def mesh_2d(shape=(2, 4), names=("dp", "tp")):
  return jax.make_mesh(shape, names, axis_types=(AUTO, AUTO))


def put(mesh, array, *spec):
  return jax.device_put(array, NamedSharding(mesh, P(*spec)))


def normal(rng, shape, scale=1.0, dtype=np.float32):
  return (rng.standard_normal(shape) * scale).astype(dtype)


@dataclasses.dataclass(frozen=True)
class Program:
  name: str
  fn: Callable
  make_args: Callable[[], tuple]  # fresh arguments on every call
  covers: str
  jit_kwargs: dict = dataclasses.field(default_factory=dict)
  lowered: bool = False  # shard_map + psum: the lowered route
  extra_flags: str = ""  # e.g. --equarx_partitioned=on
  # A program the partitioned route declines (a documented limit): `auto` must run it
  # as plain jax.jit, and the report's note must contain this text.
  fallback: str = ""


# --- comparing ---------------------------------------------------------------------


def _bits(a: np.ndarray) -> np.ndarray:
  a = np.ascontiguousarray(a)
  return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _diff(got: np.ndarray, want: np.ndarray) -> str:
  same = _bits(got) == _bits(want)
  n = int(np.count_nonzero(~same))
  if not n:
    return ""
  i = np.unravel_index(np.flatnonzero(~same)[0], got.shape) if got.shape else ()
  msg = f"{n} of {same.size} values differ; first at {i}: got {got[i]!r}, want {want[i]!r}"
  if np.issubdtype(want.dtype, np.inexact) or want.dtype.name == "bfloat16":
    g, w = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(g) & np.isfinite(w)
    g, w = g[finite], w[finite]
    denom = np.linalg.norm(w)
    msg += (
      f"; over the finite values: max |diff| {np.max(np.abs(g - w), initial=0):.3g}, "
      f"relative L2 {np.linalg.norm(g - w) / denom if denom else float('inf'):.3g}"
    )
  return msg


def _plain(leaf):
  if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(leaf)
  return leaf


def assert_same(got, want, what=""):
  """Bit for bit: tree structure, and per leaf dtype, shape, sharding, the global
  value and every device's shard."""
  got_leaves, got_tree = jax.tree_util.tree_flatten(got)
  want_leaves, want_tree = jax.tree_util.tree_flatten(want)
  assert got_tree == want_tree, f"{what}: tree {got_tree} != {want_tree}"
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(want)[0]]
  problems = []
  for path, g, w in zip(paths, got_leaves, want_leaves):
    where = f"{what} output {path or '<root>'}"
    if g.dtype != w.dtype or g.shape != w.shape:
      problems.append(f"{where}: {g.dtype}{g.shape} != {w.dtype}{w.shape}")
      continue
    if getattr(g, "sharding", None) != getattr(w, "sharding", None):
      problems.append(f"{where}: sharding {g.sharding} != {w.sharding}")
    g, w = _plain(g), _plain(w)
    msg = _diff(np.asarray(g), np.asarray(w))
    if msg:
      problems.append(f"{where} {w.dtype}{w.shape}: {msg}")
      continue
    if isinstance(g, jax.Array) and isinstance(w, jax.Array):
      gs = sorted(g.addressable_shards, key=lambda s: s.device.id)
      ws = sorted(w.addressable_shards, key=lambda s: s.device.id)
      for a, b in zip(gs, ws):
        msg = _diff(np.asarray(a.data), np.asarray(b.data))
        if msg:
          problems.append(f"{where}, shard on device {a.device.id}: {msg}")
          break
  assert not problems, "not bit-identical to jax.jit:\n  " + "\n  ".join(problems)


def relative_error(got, want) -> float:
  g = np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree_util.tree_leaves(got)])
  w = np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree_util.tree_leaves(want)])
  return float(np.linalg.norm(g - w) / np.linalg.norm(w))


@dataclasses.dataclass
class Pair:
  got: object  # equarx_pass.jit's result
  want: object  # jax.jit's
  fn: object  # the equarx_pass.jit object (its .report)
  got_args: tuple  # the arguments each was called with (donated ones are deleted)
  want_args: tuple

  def __iter__(self):
    return iter((self.got, self.want, self.fn))


def run_pair(prog: Program, flags: str = IDENTITY) -> Pair:
  """Run `prog` through jax.jit and equarx_pass.jit(flags), each on fresh arguments."""
  want_args = prog.make_args()
  want = jax.jit(prog.fn, **prog.jit_kwargs)(*want_args)
  fn = equarx_pass.jit(prog.fn, flags=f"{flags} {prog.extra_flags}".strip(), **prog.jit_kwargs)
  got_args = prog.make_args()
  got = fn(*got_args)
  return Pair(got, want, fn, got_args, want_args)


def donated_leaves(prog: Program, args) -> list:
  nums = prog.jit_kwargs.get("donate_argnums", ())
  nums = (nums,) if isinstance(nums, int) else nums
  return jax.tree_util.tree_leaves([args[i] for i in nums])


# --- building blocks --------------------------------------------------------------


def sinusoidal(length: int, dim: int) -> np.ndarray:
  """The Transformer's sinusoidal position embeddings, a NumPy constant."""
  pos = np.arange(length, dtype=np.float64)[:, None]
  inv = 1.0 / 10000 ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
  table = np.zeros((length, dim))
  table[:, 0::2] = np.sin(pos * inv)
  table[:, 1::2] = np.cos(pos * inv)
  return table.astype(np.float32)


def rope_tables(seq: int, head_dim: int):
  inv = 1.0 / 10000 ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
  angles = np.outer(np.arange(seq, dtype=np.float32), inv)
  return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(t, cos, sin):
  """t: (b, s, h, d); cos, sin: (s, d/2) NumPy constants."""
  t1, t2 = t[..., 0::2], t[..., 1::2]
  c, s = cos[None, :, None, :], sin[None, :, None, :]
  out = jnp.stack([t1 * c - t2 * s, t1 * s + t2 * c], axis=-1)
  return out.reshape(t.shape)


def layer_norm(x, eps=1e-5):
  mean = jnp.mean(x, axis=-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(jnp.var(x, axis=-1, keepdims=True) + eps)


def mlp(x, w1, w2):
  return jax.nn.relu(x @ w1) @ w2


def attention(x, wq, wk, wv, wo, heads, *, rope=False, causal=True):
  """Multi-head self-attention with NumPy-constant RoPE tables and causal mask."""
  b, s, _ = x.shape
  split = lambda t: t.reshape(b, s, heads, -1)
  q, k, v = split(x @ wq), split(x @ wk), split(x @ wv)
  if rope:
    cos, sin = rope_tables(s, q.shape[-1])
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
  scores = jnp.einsum("bshd,bthd->bhst", q, k) / np.float32(np.sqrt(q.shape[-1]))
  if causal:
    mask = np.tril(np.ones((s, s), bool))  # a boolean NumPy constant
    scores = jnp.where(mask, scores, np.float32(-1e9))
  o = jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(scores, axis=-1), v)
  return o.reshape(b, s, -1) @ wo


def mlp_args(
  mesh, seed=0, x_spec=(), tokens=B, d=D, f=F, dtype=np.float32, col=(None, "tp"), row=("tp", None)
):
  rng = np.random.default_rng(seed)
  return (
    put(mesh, normal(rng, (tokens, d), 1.0, dtype), *x_spec),
    put(mesh, normal(rng, (d, f), d**-0.5, dtype), *col),
    put(mesh, normal(rng, (f, d), f**-0.5, dtype), *row),
  )


# --- the corpus ----------------------------------------------------------------------


def _constants(mesh):
  progs = []
  # Sinusoidal position embeddings of many sizes (constants of 64 .. 16448 values),
  # added before and after a tensor-parallel MLP.
  for length in (1, 3, 11, 100, 257):

    def f(x, w1, w2, length=length):
      pe = sinusoidal(length, D)
      h = x[:length] + pe
      return mlp(h, w1, w2) + pe

    progs.append(
      Program(
        f"pos_embed_{length}",
        f,
        lambda length=length: mlp_args(mesh, tokens=max(length, 8)),
        f"sinusoidal table {length}x{D} (NumPy constant), TP MLP",
      )
    )

  # Constants after an all-reduce: several small ones of odd sizes and dtypes.
  def f(x, w1, w2):
    y = mlp(x, w1, w2)
    out = {}
    for n in (1, 5, 10, 11, 16, 64):
      out[f"c{n}"] = y[:, :n] + (np.arange(n, dtype=np.float32) + 1) * 100.0
    out["bf16"] = y.astype(jnp.bfloat16) + jnp.asarray(np.linspace(-3, 3, D), jnp.bfloat16)
    out["i32"] = jnp.argmax(y, axis=-1).astype(jnp.int32) + np.arange(B, dtype=np.int32) * 7
    out["scalar"] = jnp.sum(y) * np.float32(3.25) + np.float32(1e30)
    return out

  progs.append(
    Program(
      "constants_many",
      f,
      lambda: mlp_args(mesh),
      "constants of 1..64 values, bf16 and int32 constants, dict output",
    )
  )
  return progs


def _attention(mesh):
  heads, hd = 8, 16

  def args(seed=1, batch_spec=None):
    rng = np.random.default_rng(seed)
    w = lambda shape: normal(rng, shape, shape[0] ** -0.5)
    x = put(mesh, normal(rng, (2, S, D)), batch_spec)
    return (
      x,
      put(mesh, w((D, heads * hd)), None, "tp"),
      put(mesh, w((D, heads * hd)), None, "tp"),
      put(mesh, w((D, heads * hd)), None, "tp"),
      put(mesh, w((heads * hd, D)), "tp", None),
    )

  def rope_block(x, wq, wk, wv, wo):
    x = x + attention(layer_norm(x), wq, wk, wv, wo, heads, rope=True)
    return x + sinusoidal(S, D)[None]

  if "dp" in mesh.axis_names:
    return [
      Program(
        "tp_attention_dp_batch",
        rope_block,
        lambda: args(2, "dp"),
        "attention on a 2-D mesh, batch on dp, heads on tp",
      )
    ]
  return [
    Program(
      "tp_attention_rope_causal",
      rope_block,
      args,
      "Megatron attention (heads on tp), RoPE tables, causal mask constant",
    )
  ]


def _gather_scatter_iota(mesh):
  vocab = 512
  rng = np.random.default_rng(3)
  ids_np = rng.integers(0, vocab, (2, S)).astype(np.int32)

  def args():
    r = np.random.default_rng(4)
    return (
      put(mesh, ids_np),
      put(mesh, normal(r, (vocab, D), 0.02), "tp", None),
      *mlp_args(mesh, seed=5)[1:],
    )

  def embed(ids, table, w1, w2):
    # Vocab-parallel embedding: a gather from a table sharded on its rows.
    h = jnp.take(table, ids, axis=0) + sinusoidal(S, D)[None]
    return h + mlp(layer_norm(h), w1, w2)

  def onehot(ids, table, w1, w2):
    # Embedding as a one-hot matmul built from iota; an iota position bias.
    hot = (ids[..., None] == jnp.arange(vocab, dtype=jnp.int32)).astype(jnp.float32)
    h = hot @ table
    h = h + jax.lax.broadcasted_iota(jnp.float32, h.shape, 1) * 0.01
    return mlp(h, w1, w2)

  def scatter(ids, table, w1, w2):
    # Scatter-add of sharded activations into a vocab-sized buffer (an embedding
    # gradient), then a row-parallel matmul.
    x = jnp.take(table, ids, axis=0).reshape(-1, D)
    h = jax.nn.relu(x @ w1)  # columns on tp
    acc = jnp.zeros((vocab // 4, F), jnp.float32).at[ids.reshape(-1) % (vocab // 4)].add(h)
    counts = jnp.zeros((vocab // 4,), jnp.int32).at[ids.reshape(-1) % (vocab // 4)].add(1)
    return acc @ w2, counts

  def vocab_parallel_loss(ids, table, w1, w2):
    # Tied embeddings: logits over a vocab-sharded table, softmax cross entropy
    # (max and sum all-reduces), one-hot labels from iota.
    h = jnp.take(table, ids, axis=0)
    h = h + mlp(h, w1, w2)
    logits = h @ table.T
    labels = jnp.roll(ids, -1, axis=1)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    return jnp.mean(nll), jnp.argmax(logits, axis=-1)

  return [
    Program(
      "embed_gather_vocab_parallel",
      embed,
      args,
      "gather from a row-sharded table, constants, TP MLP",
    ),
    Program("embed_onehot_iota", onehot, args, "iota one-hot matmul, broadcasted_iota"),
    Program("scatter_add", scatter, args, "scatter-add (.at[].add) f32 and int32"),
    Program(
      "vocab_parallel_loss",
      vocab_parallel_loss,
      args,
      "tied-embedding logits, log_softmax over a sharded vocab, take_along_axis",
    ),
  ]


def _rng(mesh):
  def dropout_mlp(key, x, w1, w2):
    k1, k2 = jax.random.split(key)
    x = x + 0.1 * jax.random.normal(k1, x.shape)
    h = jax.nn.relu(x @ w1)
    keep = jax.random.bernoulli(k2, 0.9, h.shape)
    h = jnp.where(keep, h / 0.9, 0.0)
    return h @ w2, jax.random.uniform(k2, (3,))

  def typed_key(key, x, w1, w2):
    key, sub = jax.random.split(key)
    w = w1 * jax.random.bernoulli(sub, 0.5, w1.shape)
    return mlp(x, w, w2), key

  raw = lambda: (jax.random.PRNGKey(42), *mlp_args(mesh, seed=6))
  typed = lambda: (jax.random.key(7), *mlp_args(mesh, seed=7))
  return [
    Program(
      "rng_dropout",
      dropout_mlp,
      raw,
      "jax.random normal/bernoulli/uniform from a raw key argument, dropout",
    ),
    Program(
      "rng_typed_key",
      typed_key,
      typed,
      "typed key argument and output, random mask on a sharded weight",
    ),
  ]


def _control_flow(mesh):
  layers = 3

  def stacked():
    # Stacked layers for scan: (L, D, F) on columns, (L, F, D) on rows.
    rng = np.random.default_rng(8)
    return (
      put(mesh, normal(rng, (B, D))),
      put(mesh, normal(rng, (layers, D, F), D**-0.5), None, None, "tp"),
      put(mesh, normal(rng, (layers, F, D), F**-0.5), None, "tp", None),
    )

  def scan_layers(x, w1s, w2s):
    def body(h, ws):
      y = h + mlp(layer_norm(h), *ws)
      return y, jnp.sum(y)

    return jax.lax.scan(body, x, (w1s, w2s))

  def fori(x, w1, w2):
    return jax.lax.fori_loop(0, 3, lambda i, h: h + 0.5 * mlp(h, w1, w2) * i, x)

  def while_cond(x, w1, w2, p):
    def body(state):
      i, h = state
      return i + 1, layer_norm(h + mlp(h, w1, w2))

    i, h = jax.lax.while_loop(lambda s: (s[0] < 4) & (jnp.max(s[1]) < 1e6), body, (0, x))
    branch = jax.lax.cond(p > 0, lambda h: mlp(h, w1, w2), lambda h: mlp(h * 2, w1, w2) - 1, h)
    return i, branch, jax.lax.switch(jnp.clip(p, 0, 2), [jnp.sin, jnp.cos, jnp.tanh], branch)

  return [
    Program(
      "scan_over_layers",
      scan_layers,
      stacked,
      "lax.scan over stacked TP layers (all-reduce in the loop body)",
    ),
    Program(
      "fori_loop", fori, lambda: mlp_args(mesh, seed=9), "fori_loop with an all-reduce inside"
    ),
    Program(
      "while_cond_switch",
      while_cond,
      lambda: (*mlp_args(mesh, seed=10), put(mesh, np.int32(1))),
      "while_loop with a data-dependent exit, cond and switch on an argument",
    ),
  ]


def _reshapes(mesh):
  def interleave(x, w1, w2):
    # A reshape/transpose across the sharded feature dimension (heads interleaved):
    # the partitioner moves data with all-gathers over sub-axes of tp.
    h = x @ w1
    mixed = h.reshape(B, 2, F // 2).transpose(0, 2, 1).reshape(B, F)
    return jax.nn.relu(h) @ w2, mixed

  return [
    Program(
      "sharded_reshape_transpose",
      interleave,
      lambda: mlp_args(mesh, seed=23),
      "reshape/transpose across a sharded dim (all-gathers over tp sub-axes)",
    )
  ]


def _linalg(mesh):
  def f(x, w1, w2):
    y = mlp(x, w1, w2)  # (B, D), all-reduced
    g = y.T @ y / B + jnp.eye(D, dtype=jnp.float32)
    chol = jnp.linalg.cholesky(g)
    q, r = jnp.linalg.qr(y)
    evals, evecs = jnp.linalg.eigh(g)
    return chol, q, r, evals, jnp.abs(evecs[:, -1])

  return [
    Program(
      "lapack_custom_calls",
      f,
      lambda: mlp_args(mesh, seed=11),
      "cholesky / qr / eigh: LAPACK custom calls on CPU after an all-reduce",
    )
  ]


def _dtypes(mesh):
  def mixed(x, w1, w2):
    # bf16 weights and activations, f32 accumulation, outputs in both.
    h = jax.nn.gelu(jnp.dot(x, w1, preferred_element_type=jnp.float32))
    y = jnp.dot(h.astype(jnp.bfloat16), w2, preferred_element_type=jnp.float32)
    z = h.astype(jnp.bfloat16) @ w2  # a bf16 all-reduce
    return y, z, (y + z.astype(jnp.float32)).astype(jnp.bfloat16)

  bf = lambda: mlp_args(mesh, seed=12, dtype=jnp.bfloat16)
  return [
    Program(
      "bf16_f32_mix",
      mixed,
      bf,
      "bf16 weights, f32 accumulation, bf16 and f32 all-reduces and outputs",
    )
  ]


def _meshes_2d():
  progs = []
  for shape in ((2, 4), (4, 2)):
    mesh = mesh_2d(shape)
    tag = f"{shape[0]}x{shape[1]}"
    progs.append(
      Program(
        f"megatron_mlp_dp_tp_{tag}",
        lambda x, w1, w2: x + mlp(layer_norm(x), w1, w2),
        lambda mesh=mesh: mlp_args(mesh, seed=13, x_spec=("dp",)),
        f"TP MLP on a {tag} mesh, batch on dp",
      )
    )
    progs.append(
      Program(
        f"megatron_mlp_tp_only_{tag}",
        mlp,
        lambda mesh=mesh: mlp_args(mesh, seed=13),
        f"TP MLP on a {tag} mesh, x replicated: dp unused (minor-axis replica groups)",
      )
    )
  mesh = mesh_2d((2, 4))
  progs.extend(_attention(mesh))
  # 2-D sharded weights: both axes on the contracting dimension.
  progs.append(
    Program(
      "mlp_2d_sharded_weights",
      mlp,
      lambda: mlp_args(mesh, seed=14, col=(None, ("dp", "tp")), row=(("dp", "tp"), None)),
      "weights sharded over both axes of a 2x4 mesh",
    )
  )
  return progs


def _steps(mesh):
  import optax

  def loss_fn(params, x, y):
    out = x + mlp(layer_norm(x), params["w1"], params["w2"])
    return jnp.mean((out - y) ** 2)

  def sgd_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss

  def tp_params(seed):
    _, w1, w2 = mlp_args(mesh, seed=seed)
    return {"w1": w1, "w2": w2}

  def data(seed, spec=()):
    rng = np.random.default_rng(seed)
    return put(mesh, normal(rng, (B, D)), *spec), put(mesh, normal(rng, (B, D)), *spec)

  shardings = {"w1": NamedSharding(mesh, P(None, "tp")), "w2": NamedSharding(mesh, P("tp", None))}
  progs = [
    Program(
      "train_step_sgd_donated",
      sgd_step,
      lambda: (tp_params(15), *data(16)),
      "value_and_grad + SGD on TP params, params donated",
      dict(donate_argnums=(0,), out_shardings=(shardings, None)),
    )
  ]

  opt = optax.adam(1e-2)

  def adam_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  def adam_args(eager=False):
    params = tp_params(17)
    state = opt.init(params)
    if not eager:  # the scalar step count on the mesh too (replicated)
      state = jax.tree.map(
        lambda a: a if isinstance(a.sharding, NamedSharding) else put(mesh, a), state
      )
    return (params, state, *data(18))

  progs.append(
    Program(
      "train_step_adam",
      adam_step,
      adam_args,
      "value_and_grad + optax adam, params and state donated",
      dict(donate_argnums=(0, 1)),
    )
  )
  # As optax's examples write it: opt.init eagerly, so the step count is a
  # single-device array, which lowers to a second mesh of no axes (@empty_mesh).
  progs.append(
    Program(
      "train_step_adam_eager_init",
      adam_step,
      lambda: adam_args(eager=True),
      "optax adam with an eagerly initialised state (an empty second mesh)",
      dict(donate_argnums=(0, 1)),
    )
  )

  # FSDP: parameters sharded over the data axis, gathered in the step, batch on it too.
  fsdp_mesh = mesh_1d("dp")

  def fsdp_args():
    rng = np.random.default_rng(19)
    params = {
      "w1": put(fsdp_mesh, normal(rng, (D, F), D**-0.5), "dp", None),
      "w2": put(fsdp_mesh, normal(rng, (F, D), F**-0.5), "dp", None),
    }
    x, y = normal(rng, (B, D)), normal(rng, (B, D))
    return params, put(fsdp_mesh, x, "dp"), put(fsdp_mesh, y, "dp")

  fsdp_sh = {k: NamedSharding(fsdp_mesh, P("dp", None)) for k in ("w1", "w2")}
  progs.append(
    Program(
      "fsdp_train_step",
      sgd_step,
      fsdp_args,
      "FSDP: params and batch on dp, donated, params keep their sharding",
      dict(
        in_shardings=(
          fsdp_sh,
          NamedSharding(fsdp_mesh, P("dp")),
          NamedSharding(fsdp_mesh, P("dp")),
        ),
        out_shardings=(fsdp_sh, NamedSharding(fsdp_mesh, P())),
        donate_argnums=(0,),
      ),
    )
  )

  # FSDP x TP on a 2x4 mesh.
  m2 = mesh_2d((2, 4))

  def fsdp_tp_args():
    rng = np.random.default_rng(20)
    params = {
      "w1": put(m2, normal(rng, (D, F), D**-0.5), "dp", "tp"),
      "w2": put(m2, normal(rng, (F, D), F**-0.5), "tp", "dp"),
    }
    return params, put(m2, normal(rng, (B, D)), "dp"), put(m2, normal(rng, (B, D)), "dp")

  progs.append(
    Program(
      "fsdp_tp_train_step",
      sgd_step,
      fsdp_tp_args,
      "FSDP over dp and TP over tp on a 2x4 mesh, SGD step",
    )
  )
  return progs


def _pytree(mesh):
  def f(x, w1, w2):
    y = mlp(x, w1, w2)
    h = x @ w1
    return {
      "out": y,
      "stats": (jnp.mean(y, 0), jnp.var(y)),
      "hidden": h,
      "list": [y.astype(jnp.bfloat16), jnp.sum(y > 0)],
    }

  return [
    Program(
      "pytree_outputs",
      f,
      lambda: mlp_args(mesh, seed=21),
      "dict / tuple / list outputs, sharded and replicated, f32/bf16/int",
      dict(
        out_shardings={
          "out": NamedSharding(mesh, P("tp")),
          "stats": NamedSharding(mesh, P()),
          "hidden": NamedSharding(mesh, P(None, "tp")),
          "list": NamedSharding(mesh, P()),
        }
      ),
    )
  ]


# --- flax linen ----------------------------------------------------------------------

FLAX_RULES = (
  ("batch", None),
  ("vocab", "tp"),
  ("embed", None),
  ("heads", "tp"),
  ("kv", None),
  ("mlp", "tp"),
)


def _flax(mesh):
  import flax.linen as nn
  import optax

  vocab, heads = 256, 8
  part = nn.with_logical_partitioning
  dense_init = nn.initializers.lecun_normal()

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x, mask, train: bool = False):
      h = nn.LayerNorm(
        scale_init=part(nn.initializers.ones, ("embed",)),
        bias_init=part(nn.initializers.zeros, ("embed",)),
      )(x)
      h = nn.MultiHeadDotProductAttention(
        num_heads=heads,
        qkv_features=D,
        dropout_rate=0.1,
        deterministic=not train,
        kernel_init=part(dense_init, ("embed", "heads", "kv")),
        bias_init=part(nn.initializers.zeros, ("heads", "kv")),
        out_kernel_init=part(dense_init, ("heads", "kv", "embed")),
        out_bias_init=part(nn.initializers.zeros, ("embed",)),
      )(h, h, mask=mask)
      x = x + h
      h = nn.LayerNorm(
        scale_init=part(nn.initializers.ones, ("embed",)),
        bias_init=part(nn.initializers.zeros, ("embed",)),
      )(x)
      h = nn.Dense(
        F,
        kernel_init=part(dense_init, ("embed", "mlp")),
        bias_init=part(nn.initializers.zeros, ("mlp",)),
      )(h)
      h = nn.Dropout(0.1, deterministic=not train)(nn.gelu(h))
      h = nn.Dense(
        D,
        kernel_init=part(dense_init, ("mlp", "embed")),
        bias_init=part(nn.initializers.zeros, ("embed",)),
      )(h)
      return x + h

  class LM(nn.Module):
    layers: int = 2

    @nn.compact
    def __call__(self, ids, train: bool = False):
      embed = nn.Embed(
        vocab, D, embedding_init=part(nn.initializers.normal(0.02), ("vocab", "embed"))
      )
      x = embed(ids) + sinusoidal(ids.shape[1], D)[None]
      mask = nn.make_causal_mask(ids)
      for _ in range(self.layers):
        x = Block()(x, mask, train)
      x = nn.LayerNorm(
        scale_init=part(nn.initializers.ones, ("embed",)),
        bias_init=part(nn.initializers.zeros, ("embed",)),
      )(x)
      return embed.attend(x)  # tied output embedding

  ids_np = np.random.default_rng(22).integers(0, vocab, (2, S)).astype(np.int32)
  ids_sharding = NamedSharding(mesh, P())

  def sharded_init(model):
    """Init as flax users do: logical axes -> mesh shardings via rules -> jit(init)."""
    abstract = jax.eval_shape(model.init, jax.random.PRNGKey(0), ids_np)
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, FLAX_RULES)
    init = jax.jit(model.init, out_shardings=shardings)
    return shardings, lambda: init(jax.random.PRNGKey(0), put(mesh, ids_np))

  model = LM(layers=2)
  shardings, params = sharded_init(model)

  def apply(variables, ids):
    return model.apply(variables, ids)

  small = LM(layers=1)
  small_shardings, small_params = sharded_init(small)
  opt = optax.sgd(0.1)

  def train_step(variables, ids, key):
    def loss_fn(v):
      logits = small.apply(v, ids, train=True, rngs={"dropout": key})
      return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], ids[:, 1:]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(variables)
    updates, _ = opt.update(grads, opt.init(variables), variables)
    return optax.apply_updates(variables, updates), loss

  return [
    Program(
      "flax_lm_apply",
      apply,
      lambda: (params(), put(mesh, ids_np)),
      "flax linen LM, 2 blocks (Embed, LayerNorm, MultiHeadDotProductAttention, "
      "Dense), logical partitioning rules",
      dict(in_shardings=(shardings, ids_sharding)),
    ),
    Program(
      "flax_lm_train_step",
      train_step,
      lambda: (small_params(), put(mesh, ids_np), jax.random.PRNGKey(3)),
      "flax LM train step (1 block): dropout rng, cross entropy, grads, optax SGD, donated",
      dict(
        in_shardings=(small_shardings, ids_sharding, None),
        out_shardings=(small_shardings, None),
        donate_argnums=(0,),
      ),
    ),
  ]


# --- shard_map + psum: the lowered route -------------------------------------------------


def _lowered(mesh, mesh2):
  smap = jax.shard_map
  col, row = P(None, "tp"), P("tp", None)

  def by_hand(x, w1, w2):
    y = jax.lax.psum(mlp(x + sinusoidal(B, D), w1, w2), "tp")
    return y + (np.arange(D, dtype=np.float32) + 1) * 100.0

  mlp_psum = smap(by_hand, mesh=mesh, in_specs=(P(), col, row), out_specs=P())

  def looped(x, w1, w2):
    def body(h, _):
      return h + jax.lax.psum(mlp(h, w1, w2), "tp"), jnp.max(h)

    return jax.lax.scan(body, x, None, length=3)

  scan_psum = smap(looped, mesh=mesh, in_specs=(P(), col, row), out_specs=(P(), P()))

  def tree_psum(x, w1, w2):
    y = mlp(x, w1, w2)
    a, b, c = jax.lax.psum((y, y.astype(jnp.bfloat16), jnp.sum(y > 0)), "tp")
    return a, b, c

  tree = smap(tree_psum, mesh=mesh, in_specs=(P(), col, row), out_specs=P())

  def sub_axis(x, w1, w2):
    part = mlp(x, w1, w2)
    y = jax.lax.psum(part, "tp")  # within each dp row
    return y, jax.lax.psum(jnp.sum(part, 0), ("dp", "tp"))

  two_d = smap(sub_axis, mesh=mesh2, in_specs=(P("dp"), col, row), out_specs=(P("dp"), P()))

  return [
    Program(
      "psum_mlp_constants",
      mlp_psum,
      lambda: mlp_args(mesh, seed=30),
      "shard_map psum, constants around it",
      lowered=True,
    ),
    Program(
      "psum_in_scan",
      scan_psum,
      lambda: mlp_args(mesh, seed=31),
      "psum inside a scan body",
      lowered=True,
    ),
    Program(
      "psum_pytree_mixed_dtypes",
      tree,
      lambda: mlp_args(mesh, seed=32),
      "one psum over f32, bf16 and int32 operands",
      lowered=True,
    ),
    Program(
      "psum_2d_mesh_sub_axis",
      two_d,
      lambda: mlp_args(mesh2, seed=33, x_spec=("dp",)),
      "psum over tp within dp rows, and over both axes",
      lowered=True,
    ),
    Program(
      "psum_mlp_partitioned_on",
      mlp_psum,
      lambda: mlp_args(mesh, seed=34),
      "an explicit psum taken through the partitioned route (=on)",
      extra_flags="--equarx_partitioned=on",
    ),
  ]


def corpus() -> list[Program]:
  mesh = mesh_1d()
  mesh2 = mesh_2d((2, 4))
  progs = []
  progs += _constants(mesh)
  progs += _attention(mesh)
  progs += _gather_scatter_iota(mesh)
  progs += _rng(mesh)
  progs += _control_flow(mesh)
  progs += _reshapes(mesh)
  progs += _linalg(mesh)
  progs += _dtypes(mesh)
  progs += _meshes_2d()
  progs += _pytree(mesh)
  progs += _steps(mesh)
  progs += _flax(mesh)
  progs += _lowered(mesh, mesh2)
  names = [p.name for p in progs]
  assert len(set(names)) == len(names), names
  return progs


# --- drawn programs (the property test) ----------------------------------------------

MESHES = {"8": ((8,), ("tp",)), "2x4": ((2, 4), ("dp", "tp")), "4x2": ((4, 2), ("dp", "tp"))}


@dataclasses.dataclass(frozen=True)
class Spec:
  """A layered program: mesh, dtype, x batch-sharded over dp or not, and layers:
  ("col", f) x @ w, w (width, f) on columns;  ("row", d) x @ w, w (width, d) on rows;
  ("act", name);  ("const", n, kind) x[:, :n] + a NumPy constant of n values;
  ("reduce", kind);  ("gather", vocab) x + table[ids], table on rows;
  ("reshape",) a reshape/transpose/reshape of the features."""

  mesh: str
  dtype: str
  batch_sharded: bool
  layers: tuple


def spec_program(spec: Spec) -> Program:
  """The Program a Spec describes, followed by a column-parallel and a row-parallel
  layer; a column layer goes before each row layer whose input width the tp axis
  does not divide."""
  shape, names = MESHES[spec.mesh]
  mesh = jax.make_mesh(shape, names, axis_types=(AUTO,) * len(shape))
  tp = mesh.shape["tp"]
  dtype = jnp.bfloat16 if spec.dtype == "bf16" else jnp.float32
  # A Megatron pair last, so that there is a compiler-inserted all-reduce whatever
  # was drawn (a lone row layer on a replicated input may be partitioned with an
  # all-gather of the weight instead).
  layers = list(spec.layers) + [("col", 64), ("act", "relu"), ("row", 32)]
  # Shapes and weights, in order.
  width, plan, weights = D // 2, [], []  # x: (B, 32)
  for layer in layers:
    kind = layer[0]
    if kind == "row" and width % tp:
      plan.append(("col", 8 * tp))
      weights.append(((width, 8 * tp), (None, "tp")))
      width = 8 * tp
    plan.append(layer)
    if kind == "col":
      weights.append(((width, layer[1]), (None, "tp")))
      width = layer[1]
    elif kind == "row":
      weights.append(((width, layer[1]), ("tp", None)))
      width = layer[1]
    elif kind == "gather":
      weights.append(((layer[1], width), ("tp", None)))
    elif kind == "const":
      width = layer[1]

  def fn(x, ids, *ws):
    ws = iter(ws)
    for layer in plan:
      kind = layer[0]
      if kind in ("col", "row"):
        x = x @ next(ws)
      elif kind == "act":
        x = {"relu": jax.nn.relu, "gelu": jax.nn.gelu, "tanh": jnp.tanh, "silu": jax.nn.silu}[
          layer[1]
        ](x)
      elif kind == "const":
        n, what = layer[1], layer[2]
        c = (
          (np.arange(n, dtype=np.float32) + 1) * 100.0
          if what == "arange"
          else np.sin(np.arange(n, dtype=np.float32) * 0.37)
          if what == "sin"
          else np.random.default_rng(n).standard_normal(n).astype(np.float32)
        )
        if n > x.shape[1]:
          x = jnp.tile(x, (1, -(-n // x.shape[1])))
        x = x[:, :n] + jnp.asarray(c, x.dtype)
      elif kind == "reduce":
        x = {
          "ln": layer_norm,
          "softmax": lambda v: jax.nn.softmax(v, axis=-1),
          "center": lambda v: v - jnp.mean(v, axis=0, keepdims=True),
          "scale": lambda v: v * jax.lax.rsqrt(jnp.mean(v * v, axis=-1, keepdims=True) + 1),
        }[layer[1]](x).astype(x.dtype)
      elif kind == "gather":
        x = x + jnp.take(next(ws), ids, axis=0)
      elif kind == "reshape":
        b, w = x.shape
        x = x.reshape(b, 2, w // 2).transpose(0, 2, 1).reshape(b, w) if w % 2 == 0 else x[:, ::-1]
    return x

  def make_args():
    rng = np.random.default_rng(zlib.crc32(repr(spec).encode()))
    x_spec = ("dp",) if spec.batch_sharded and "dp" in names else ()
    vocab = max([layer[1] for layer in plan if layer[0] == "gather"] or [8])
    ids = rng.integers(0, vocab, (B,)).astype(np.int32)
    ws = [put(mesh, normal(rng, s, s[0] ** -0.5, dtype), *p) for s, p in weights]
    return (put(mesh, normal(rng, (B, D // 2), 1.0, dtype), *x_spec), put(mesh, ids), *ws)

  fn.__name__ = "drawn"
  return Program(f"drawn_{spec.mesh}_{spec.dtype}", fn, make_args, repr(spec))
