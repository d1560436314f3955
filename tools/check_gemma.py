"""equarx_pass.jit on flax's examples/gemma train step, unchanged, on an FSDP or TP mesh.

    python tools/check_gemma.py --gemma-dir /tmp/flax/examples/gemma [--mesh 8,1] \
        [--flags="--equarx_enable --equarx_min_bytes=0"] [--steps 3] [--batch 16 --length 128]

The model and the train step are flax's own, imported at run time from a flax checkout;
nothing of them is copied here.  Get the example's directory with

    git clone https://github.com/google/flax /tmp/flax     # or any flax checkout

What it does, the way the example's train.py does it: a tiny Transformer config
(--layers, emb 256, 8 heads, 1 kv head, vocab 2048, bf16 activations), its
ShardingConfig.fsdp_tp_sharding, jax.make_mesh(--mesh, ("fsdp", "tensor")) with
jax.set_mesh, its train.jax_train_step (with_capture=True) under optax adamw with the
example's donation, one run under jax.jit and one under equarx_pass.jit(--flags), on the
same synthetic token batches.  It prints each step's loss (the example's metrics: the
mean over the steps so far) and time and the site report,
and exits 1 when a loss is more than 1% off jax.jit's.  The losses, the sites rewritten
and the largest difference go to results/gemma_check.json (--out).

Run it with XLA's collective timeouts lowered to see a hang fail fast:

    XLA_FLAGS="--xla_cpu_collective_call_terminate_timeout_seconds=20" python tools/check_gemma.py ...

train.py imports clu, grain, orbax, sentencepiece and its data pipeline at module level for
code this tool does not run; where those are not installed, inert stand-in modules take
their place, and the output says which.  The model code itself needs jaxtyping
(`pip install jaxtyping`).
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
from flax_examples import flax_commit, install_stand_ins  # noqa: E402

STAND_INS = (
  "clu",
  "clu.metric_writers",
  "clu.periodic_actions",
  "grain",
  "orbax",
  "orbax.checkpoint",
  "orbax.checkpoint.checkpoint_managers",
  "orbax.checkpoint.checkpoint_managers.preservation_policy",
  "orbax.checkpoint.path",
  "orbax.checkpoint.path.atomicity",
  "input_pipeline",
  "sampler",
  "tokenizer",
)


def import_example(gemma_dir: str):
  """(train, transformer, sow_lib, transformer_cfg, names of stand-ins used)."""
  gemma_dir = os.path.abspath(gemma_dir)
  for f in ("train.py", "transformer.py", "transformer_cfg.py", "modules.py"):
    if not os.path.exists(os.path.join(gemma_dir, f)):
      sys.exit(f"--gemma-dir {gemma_dir}: no {f}; pass flax's examples/gemma directory")
  sys.path.insert(0, gemma_dir)
  stand_ins = install_stand_ins(STAND_INS)
  try:
    import sow_lib
    import train
    import transformer
    import transformer_cfg
  except ModuleNotFoundError as e:  # what the model code itself needs (jaxtyping)
    sys.exit(f"--gemma-dir {gemma_dir}: the example imports {e.name}, which is not installed")

  for mod in (train, transformer, sow_lib, transformer_cfg):
    assert os.path.abspath(mod.__file__).startswith(gemma_dir), mod.__file__
  return train, transformer, sow_lib, transformer_cfg, stand_ins


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--gemma-dir", required=True, help="flax's examples/gemma directory")
  parser.add_argument(
    "--flags",
    default="--equarx_enable --equarx_min_bytes=0",
    help="equarx_pass.jit's flags for the second run",
  )
  parser.add_argument("--mesh", default="8,1", help="fsdp,tensor sizes (8,1: FSDP; 1,8: TP)")
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--length", type=int, default=128)
  parser.add_argument(
    "--flax-commit",
    default="",
    help="the flax commit the directory came from (default: git rev-parse there; needed "
    "for a directory unpacked with git archive)",
  )
  parser.add_argument("--out", default=os.path.join(benchlib.RESULTS, "gemma_check.json"))
  args = parser.parse_args()

  from functools import partial

  import jax
  import jax.numpy as jnp
  import optax
  from flax import nnx

  import equarx_pass

  train, transformer, sow_lib, transformer_cfg, stand_ins = import_example(args.gemma_dir)
  if stand_ins:
    print(
      f"stand-in modules (not importable here, not used by the train step): {', '.join(stand_ins)}"
    )
  shape = tuple(int(v) for v in args.mesh.split(","))
  mesh = jax.make_mesh(shape, ("fsdp", "tensor"))
  sharding = transformer_cfg.ShardingConfig.fsdp_tp_sharding(
    fsdp_axis_name="fsdp", tensor_parallel_axis_name="tensor"
  )
  vocab = 2048
  config = transformer.TransformerConfig(
    num_layers=args.layers,
    num_embed=vocab,
    embed_dim=256,
    hidden_dim=512,
    num_heads=8,
    head_dim=32,
    num_kv_heads=1,
    final_logit_softcap=None,
    attention_types=(transformer.modules.AttentionType.GLOBAL,) * args.layers,
    use_post_attn_norm=False,
    use_post_ffw_norm=False,
    dtype=jnp.bfloat16,
    shd_config=sharding,
  )
  rng = np.random.default_rng(0)
  data = jax.NamedSharding(mesh, jax.P("fsdp"))
  batches = []
  for _ in range(args.steps):
    tokens = rng.integers(1, vocab, (args.batch, args.length)).astype(np.int32)
    positions = np.tile(np.arange(args.length, dtype=np.int32), (args.batch, 1))
    batches.append(
      {"inputs": tokens, "inputs_position": positions, "targets": np.roll(tokens, -1, 1)}
    )

  def run(jitter, name):
    rngs = nnx.Rngs(params=0, dropout=0)
    with jax.set_mesh(mesh):
      model = transformer.Transformer(config, rngs=rngs, sow_config=sow_lib.SowConfig())
      optimizer = nnx.Optimizer(
        model, tx=optax.adamw(1e-3, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.1), wrt=nnx.Param
      )
    metrics = nnx.MultiMetric(loss=nnx.metrics.Average("loss"), accuracy=nnx.metrics.Accuracy())
    step = jitter(
      partial(train.jax_train_step, with_capture=True),
      static_argnames=("label_smoothing", "pad_id"),
      donate_argnames=("model", "optimizer"),
    )
    losses = []
    with jax.set_mesh(mesh):
      for i, batch in enumerate(batches):
        batch = {k: jax.device_put(v, data) for k, v in batch.items()}
        start = time.perf_counter()
        updates, _ = step(model, optimizer, rngs, batch, metrics, 0.0, 0)
        nnx.update((model, optimizer, rngs, metrics), updates)
        losses.append(float(metrics.compute()["loss"]))
        print(
          f"{name} step {i}: loss {losses[-1]:.6f} ({time.perf_counter() - start:.2f} s)",
          flush=True,
        )
    return step, losses

  _, want = run(jax.jit, "jax.jit")
  fn, got = run(lambda f, **kw: equarx_pass.jit(f, flags=args.flags, **kw), "equarx_pass.jit")
  print(fn.report)
  worst = max(abs(g - w) / abs(w) for g, w in zip(got, want))
  print(f"largest relative loss difference against jax.jit over {args.steps} steps: {worst:.2e}")
  records = fn.report.lowerings[-1].records  # the train step's (one lowering per signature)
  benchlib.write_result(
    args.out,
    [dict(step=i, jax_jit_loss=w, equarx_loss=g) for i, (w, g) in enumerate(zip(want, got))],
    flax_commit=args.flax_commit or flax_commit(args.gemma_dir),
    mesh=args.mesh,
    flags=args.flags,
    sites=len(records),
    rewritten=sum(r.rewritten for r in records),
    largest_loss_difference=worst,
  )
  return 0 if worst <= 1e-2 else 1


if __name__ == "__main__":
  sys.exit(main())
