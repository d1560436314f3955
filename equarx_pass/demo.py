"""Demo: a Megatron-style tensor-parallel transformer on 8 CPU devices, with and without the pass.

    python -m equarx_pass.demo [FLAGS]    (or: equarx-demo [FLAGS])

Runs the same program through jax.jit and through equarx_pass.jit, and prints
the site report, the error of each against a float64 NumPy run of the model,
whether every device holds the same bits, and the wire bytes saved.  On one CPU
the "network" is a memory copy, so times here say nothing about speed on a real
link (see README, Performance).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

NUM_DEVICES = 8


def _start_jax():
  """8 virtual CPU devices; must run before JAX initialises its backend.

  The demo runs on the CPU unless JAX_PLATFORMS says otherwise: where libtpu is
  installed but there is no TPU, JAX would otherwise probe for one and print libtpu's
  warnings first.  JAX read the environment when `equarx_pass` imported it, so the
  default goes into JAX's config as well as the environment (for child processes).
  """
  import jax

  if not os.environ.get("JAX_PLATFORMS"):
    os.environ["JAX_PLATFORMS"] = "cpu"
    try:
      jax.config.update("jax_platforms", "cpu")
    except RuntimeError:
      pass  # backend already up: use what is there
  try:
    jax.config.update("jax_num_cpu_devices", NUM_DEVICES)
  except RuntimeError:
    pass  # backend already up (e.g. imported from a test): use what is there
  if jax.device_count() < NUM_DEVICES:
    sys.exit(
      f"the demo needs {NUM_DEVICES} devices, JAX has {jax.device_count()}; "
      "run it in a fresh process"
    )
  return jax


def init_params(rng, layers, hidden, ffn, heads):
  """Weights scaled so activations stay O(1) through the residual stack."""

  def dense(shape):
    return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

  return [
    dict(
      wqkv=dense((hidden, 3 * hidden)),
      wo=dense((hidden, hidden)),
      w1=dense((hidden, ffn)),
      w2=dense((ffn, hidden)),
    )
    for _ in range(layers)
  ]


def _layer_norm(x, xp):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / xp.sqrt(var + 1e-5)


def _attention(x, wqkv, wo, heads_here, xp, softmax):
  """x:[T,H] -> this rank's share of the output projection (heads_here heads)."""
  t = x.shape[0]
  qkv = _layer_norm(x, xp) @ wqkv  # [T, 3 * heads_here * d]
  q, k, v = xp.split(qkv, 3, axis=-1)
  d = q.shape[-1] // heads_here
  q, k, v = (a.reshape(t, heads_here, d).transpose(1, 0, 2) for a in (q, k, v))
  scores = q @ k.transpose(0, 2, 1) / np.sqrt(d)
  out = (softmax(scores) @ v).transpose(1, 0, 2).reshape(t, heads_here * d)
  return out @ wo


def _mlp(x, w1, w2, xp, gelu):
  return gelu(_layer_norm(x, xp) @ w1) @ w2


def make_tp_forward(jax, mesh, heads, layers):
  """The shard_map program: heads and FFN split over 'tp', a psum after each block."""
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P

  n = mesh.shape["tp"]

  def forward(params, x):
    for p in params:
      x = x + jax.lax.psum(_attention(x, p["wqkv"], p["wo"], heads // n, jnp, jax.nn.softmax), "tp")
      x = x + jax.lax.psum(_mlp(x, p["w1"], p["w2"], jnp, jax.nn.gelu), "tp")
    return x

  spec = dict(wqkv=P(None, "tp"), wo=P("tp", None), w1=P(None, "tp"), w2=P("tp", None))
  return jax.shard_map(forward, mesh=mesh, in_specs=([spec] * layers, P()), out_specs=P())


def shard_qkv(params, n):
  """Reorder wqkv columns so that a contiguous 1/n of them is [q|k|v] of n's heads."""
  out = []
  for p in params:
    h3 = p["wqkv"].shape[1]
    q, k, v = np.split(p["wqkv"], 3, axis=1)
    per = h3 // 3 // n
    cols = [
      np.concatenate([a[:, r * per : (r + 1) * per] for a in (q, k, v)], axis=1) for r in range(n)
    ]
    out.append(dict(p, wqkv=np.concatenate(cols, axis=1)))
  return out


def numpy_forward(params, x):
  """The same model in float64 NumPy, all heads on one 'device': the exact reference."""

  def softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)

  def gelu(z):  # tanh approximation, as jax.nn.gelu's default
    return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))

  x = x.astype(np.float64)
  heads = _HEADS
  for p in params:
    p = {k: v.astype(np.float64) for k, v in p.items()}
    x = x + _attention(x, p["wqkv"], p["wo"], heads, np, softmax)
    x = x + _mlp(x, p["w1"], p["w2"], np, gelu)
  return x


_HEADS = 16


def rel_err(a, exact) -> float:
  a = np.asarray(a, np.float64)
  return float(np.linalg.norm(a - exact) / np.linalg.norm(exact))


def main(
  flags: str = "--equarx_enable",
  layers: int = 2,
  tokens: int = 256,
  hidden: int = 1024,
  ffn: int = 4096,
) -> dict:
  jax = _start_jax()
  from jax.sharding import Mesh

  import equarx_pass

  mesh = Mesh(np.array(jax.devices()[:NUM_DEVICES]), ("tp",))
  rng = np.random.default_rng(0)
  params = init_params(rng, layers, hidden, ffn, _HEADS)
  x = rng.standard_normal((tokens, hidden)).astype(np.float32)
  tp_params = shard_qkv(params, NUM_DEVICES)
  forward = make_tp_forward(jax, mesh, _HEADS, layers)

  print(
    f"equarx-pass demo: {layers}-layer tensor-parallel transformer, hidden {hidden}, "
    f"FFN {ffn}, {_HEADS} heads, {tokens} tokens, over {NUM_DEVICES} CPU devices "
    f"(jax {jax.__version__})"
  )
  print(f"flags: {flags}\n")

  plain = jax.jit(forward)
  quantized = equarx_pass.jit(forward, flags=flags)
  t0 = time.perf_counter()
  plain_compiled = plain.lower(tp_params, x).compile()
  t1 = time.perf_counter()
  lowered = quantized.lower(tp_params, x)
  t2 = time.perf_counter()
  quantized_compiled = lowered.compile()
  t3 = time.perf_counter()

  out_plain = plain_compiled(tp_params, x)
  out_quant = quantized_compiled(tp_params, x)
  exact = numpy_forward(params, x)

  print(quantized.report)
  shards = [np.asarray(s.data) for s in out_quant.addressable_shards]
  identical = all(np.array_equal(shards[0], s) for s in shards[1:])
  records = quantized.report.records
  done = [r for r in records if r.rewritten]
  before = sum(r.bytes_before for r in done)
  after = sum(r.bytes_after for r in done)
  summary = dict(
    sites=len(records),
    rewritten=len(done),
    err_plain=rel_err(out_plain, exact),
    err_quantized=rel_err(out_quant, exact),
    err_quantized_vs_plain=rel_err(out_quant, np.asarray(out_plain, np.float64)),
    identical_on_all_devices=identical,
    bytes_before=before,
    bytes_after=after,
    pass_seconds=quantized.report.lowerings[-1].pass_seconds,
    compile_plain_s=t1 - t0,
    lower_and_pass_s=t2 - t1,
    compile_quantized_s=t3 - t2,
  )
  print()
  print(
    f"relative L2 error vs float64 NumPy:  jax.jit {summary['err_plain']:.2e}   "
    f"equarx_pass.jit {summary['err_quantized']:.2e}   "
    f"(quantized vs jax.jit {summary['err_quantized_vs_plain']:.2e})"
  )
  print(f"all {len(shards)} devices hold bit-identical results: {identical}")
  if done:
    n = done[0].group_size
    bits = 8 * after / (2 * (n - 1) * sum(np.prod(r.shapes[0]) for r in done) / n)
    print(
      f"wire bytes per device for the {len(done)} rewritten all-reduces: "
      f"{before / 2**20:.2f} MiB -> {after / 2**20:.2f} MiB "
      f"({before / after:.2f}x less; {bits:.2f} bits per value on the wire, "
      f"{16 / bits:.2f}x less than a bf16 ring)"
    )
  print(
    f"pass time {summary['pass_seconds'] * 1e3:.1f} ms; compile: jax.jit "
    f"{summary['compile_plain_s']:.2f} s, rewritten {summary['compile_quantized_s']:.2f} s"
  )
  return summary


def run() -> None:
  """Console-script entry point: equarx-demo [FLAGS] (python -m equarx_pass.demo [FLAGS])."""
  args = sys.argv[1:]
  if args in (["-h"], ["--help"]):
    print(
      "usage: python -m equarx_pass.demo [--equarx_* FLAGS]\n\n"
      "Runs a 2-layer tensor-parallel transformer through jax.jit and equarx_pass.jit\n"
      "(default flags: --equarx_enable); equarx-opt --help lists the flags."
    )
    return
  from equarx_pass.errors import FlagError
  from equarx_pass.planning.policy import Policy

  flags = " ".join(args) or "--equarx_enable"
  try:
    Policy.from_flags(flags)
  except FlagError as e:
    print(f"equarx-demo: error: {e}", file=sys.stderr)
    raise SystemExit(2) from None
  main(flags)


if __name__ == "__main__":
  run()
