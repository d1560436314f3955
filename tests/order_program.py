"""A program whose collectives XLA may run in either order, run in a child process.

    python tests/order_program.py FLAGS [--steps N] [--mesh fsdp|tp] [--batch B]

A small flax NNX language model (token embedding, grouped-query attention, gated MLP,
RMS norms) trained with optax adamw, sharded with NamedSharding on 8 CPU devices
(parameters by their out_sharding metadata, the batch and the activations over "fsdp"),
so that the SPMD partitioner inserts its collectives: the
FSDP mesh puts gathers, all-to-alls and gradient all-reduces in one program, and the
loss's weight count and the loss metric are scalar all-reduces that depend on almost
nothing, which XLA may schedule anywhere.  Each step runs under jax.jit and under
equarx_pass.jit(FLAGS); the child prints one JSON line with both runs' losses.

tests/test_collective_order.py runs it with XLA's collective timeouts lowered, so that a
program whose devices enter their collectives in different orders aborts in seconds
instead of hanging.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import AxisType  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import equarx_pass  # noqa: E402

VOCAB, EMB, HEADS, HEAD_DIM, FFN, LAYERS = 512, 128, 4, 32, 256, 2
DTYPE = jnp.bfloat16  # activations; parameters stay f32, as in flax's examples


class Block(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    fsdp = {"out_sharding": P("fsdp", "tensor")}
    self.norm1 = nnx.RMSNorm(EMB, dtype=DTYPE, rngs=rngs)
    self.q = nnx.Linear(
      EMB, HEADS * HEAD_DIM, use_bias=False, kernel_metadata=fsdp, dtype=DTYPE, rngs=rngs
    )
    self.kv = nnx.Linear(
      EMB, 2 * HEAD_DIM, use_bias=False, kernel_metadata=fsdp, dtype=DTYPE, rngs=rngs
    )
    out = {"out_sharding": P("tensor", "fsdp")}
    self.o = nnx.Linear(
      HEADS * HEAD_DIM, EMB, use_bias=False, kernel_metadata=out, dtype=DTYPE, rngs=rngs
    )
    self.norm2 = nnx.RMSNorm(EMB, dtype=DTYPE, rngs=rngs)
    self.gate = nnx.Linear(EMB, FFN, use_bias=False, kernel_metadata=fsdp, dtype=DTYPE, rngs=rngs)
    self.up = nnx.Linear(EMB, FFN, use_bias=False, kernel_metadata=fsdp, dtype=DTYPE, rngs=rngs)
    self.down = nnx.Linear(FFN, EMB, use_bias=False, kernel_metadata=out, dtype=DTYPE, rngs=rngs)

  def __call__(self, x, mask):
    b, t, _ = x.shape
    x = jax.lax.with_sharding_constraint(x, P("fsdp"))
    h = self.norm1(x)
    q = self.q(h).reshape(b, t, HEADS, HEAD_DIM)
    k, v = jnp.split(self.kv(h), 2, axis=-1)
    logits = jnp.einsum("btnh,bsh->bnts", q, k) / np.sqrt(HEAD_DIM)
    logits = jnp.where(mask[:, None], logits, -1e9)
    attn = jnp.einsum("bnts,bsh->btnh", jax.nn.softmax(logits, axis=-1), v)
    # Heads over the devices, then the batch again: the partitioner's all-to-alls, native
    # collectives that sit between the rewritten all-reduces.
    attn = jax.lax.with_sharding_constraint(attn, P(None, None, "fsdp"))
    x = x + self.o(attn.reshape(b, t, -1))
    h = self.norm2(x)
    ff = nnx.gelu(self.gate(h))
    ff = ff * self.up(h)
    return x + self.down(ff)


class LM(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.embed = nnx.Embed(
      VOCAB,
      EMB,
      embedding_metadata={"out_sharding": P("tensor", "fsdp")},
      dtype=DTYPE,
      rngs=rngs,
    )
    self.blocks = nnx.List([Block(rngs) for _ in range(LAYERS)])
    self.norm = nnx.RMSNorm(EMB, dtype=DTYPE, rngs=rngs)

  def __call__(self, tokens):
    t = tokens.shape[1]
    mask = jnp.tril(jnp.ones((t, t), bool))[None] & (tokens > 0)[:, None, :]
    x = self.embed(tokens)
    for block in self.blocks:
      x = block(x, mask)
    return self.embed.attend(self.norm(x))


def train_step(model, optimizer, metrics, batch):
  inputs, targets = batch["inputs"], batch["targets"]
  weights = (inputs > 0).astype(jnp.float32)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def loss_fn(params):
    logits = nnx.merge(graphdef, params, rest)(inputs)
    loss = -jnp.sum(jax.nn.one_hot(targets, VOCAB) * jax.nn.log_softmax(logits), axis=-1)
    # A scalar that depends only on the inputs: a compiler-inserted all-reduce that
    # XLA may place anywhere, as in flax's examples.
    per_sample = (loss * weights).sum(axis=1) * len(loss) / weights.sum()
    return per_sample.mean(), per_sample

  (_, per_sample), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  optimizer.update(model, grads)
  metrics.update(loss=per_sample)  # a scalar all-reduce of its own
  return nnx.state((model, optimizer, metrics))


def run(jitter, mesh, batches):
  rngs = nnx.Rngs(0)
  with jax.set_mesh(mesh):
    model = LM(rngs)
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, nnx.get_named_sharding(state, mesh)))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
  metrics = nnx.MultiMetric(loss=nnx.metrics.Average("loss"))
  step = jitter(train_step, donate_argnums=(0, 1))
  losses = []
  with jax.set_mesh(mesh):
    for batch in batches:
      state = step(model, optimizer, metrics, batch)
      nnx.update((model, optimizer, metrics), state)
      losses.append(float(metrics.compute()["loss"]))
  return step, losses


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("flags")
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--mesh", choices=("fsdp", "tp"), default="fsdp")
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--length", type=int, default=128)
  args = parser.parse_args(argv)
  shape = (8, 1) if args.mesh == "fsdp" else (1, 8)
  mesh = jax.make_mesh(shape, ("fsdp", "tensor"), axis_types=(AxisType.Auto,) * 2)
  rng = np.random.default_rng(0)
  data = jax.NamedSharding(mesh, P("fsdp"))
  batches = []
  for _ in range(args.steps):
    tokens = rng.integers(1, VOCAB, (args.batch, args.length + 1)).astype(np.int32)
    tokens[:, -rng.integers(1, args.length // 2) :] = 0  # padding, so weights vary
    batches.append(
      {
        "inputs": jax.device_put(tokens[:, :-1], data),
        "targets": jax.device_put(tokens[:, 1:], data),
      }
    )
  _, want = run(jax.jit, mesh, batches)
  fn, got = run(lambda f, **kw: equarx_pass.jit(f, flags=args.flags, **kw), mesh, batches)
  records = fn.report.records
  print(
    json.dumps(
      {
        "jax_jit": want,
        "equarx": got,
        "rewritten": sum(r.rewritten for r in records),
        "sites": len(records),
        "routes": [low.route for low in fn.report.lowerings],
      }
    ),
    flush=True,
  )


if __name__ == "__main__":
  sys.exit(main())
