"""Regenerate every file in hlo_fixtures/ from real JAX programs on 8 virtual CPU devices.

    python tools/data/make_fixtures.py

Each fixture is a small sharded program lowered with `jax.jit(...).lower(...)` and
written as StableHLO text with debug locations (so the pass's site report names
the psum's source line).  One more is an XLA HLO text dump of a compiled program,
the other input kind the pass accepts.  Nothing here depends on time, randomness or
the checkout's absolute path, so running it twice leaves `git diff` empty.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "hlo_fixtures")
DUMP = tempfile.mkdtemp(prefix="equarx-fixtures-")

# Before JAX starts its backend: 8 CPU devices, and an HLO dump of the one program
# that is compiled (hlo_dump); lowering alone never writes a dump.
os.environ["XLA_FLAGS"] = " ".join(
  [
    "--xla_force_host_platform_device_count=8",
    f"--xla_dump_to={DUMP}",
    "--xla_dump_hlo_module_re=tp_mlp_dumped",
  ]
)
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

# Locations name this file as tools/data/make_fixtures.py wherever the checkout lives.
jax.config.update("jax_hlo_source_file_canonicalization_regex", "^.*/(?=tools/)")

sys.path.insert(0, ROOT)
import equarx_pass  # noqa: E402

# Sizes: every all-reduce meant to be rewritten under the default policy
# (--equarx_min_bytes=65536) moves at least 64 KiB.  TOKENS x HIDDEN f32 is 128 KiB.
TOKENS, HIDDEN, FFN = 64, 512, 1024
HEADS, HEAD_DIM = 8, 64
LAYERS = 4


def spec(shape, dtype=jnp.float32):
  return jax.ShapeDtypeStruct(shape, dtype)


def mesh_1d(n=8, name="tp"):
  return Mesh(np.array(jax.devices()[:n]), (name,))


# --- the programs ----------------------------------------------------------------


def mlp(x, w_up, w_down):
  """Megatron MLP shard: column-parallel up projection, row-parallel down projection."""
  h = jax.nn.gelu(x @ w_up)
  return jax.lax.psum(h @ w_down, "tp")


def tp_mlp(dtype, devices=8):
  mesh = mesh_1d(devices)
  f = jax.jit(
    jax.shard_map(mlp, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P())
  )
  return f.lower(
    spec((TOKENS, HIDDEN), dtype), spec((HIDDEN, FFN), dtype), spec((FFN, HIDDEN), dtype)
  )


def tp_attention():
  """Self-attention with the heads split across devices; psum after the output projection."""

  def attention(x, wq, wk, wv, wo):
    local_heads = wq.shape[1] // HEAD_DIM

    def heads(w):
      return (x @ w).reshape(TOKENS, local_heads, HEAD_DIM)

    q, k, v = heads(wq), heads(wk), heads(wv)
    logits = jnp.einsum("thd,shd->hts", q, k) / np.sqrt(HEAD_DIM).astype(np.float32)
    mask = jnp.tril(jnp.ones((TOKENS, TOKENS), bool))
    probs = jax.nn.softmax(jnp.where(mask, logits, -1e30), axis=-1)
    out = jnp.einsum("hts,shd->thd", probs, v).reshape(TOKENS, local_heads * HEAD_DIM)
    return jax.lax.psum(out @ wo, "tp")

  mesh = mesh_1d()
  col = P(None, "tp")
  f = jax.jit(
    jax.shard_map(attention, mesh=mesh, in_specs=(P(), col, col, col, P("tp", None)), out_specs=P())
  )
  w = spec((HIDDEN, HEADS * HEAD_DIM))
  return f.lower(spec((TOKENS, HIDDEN)), w, w, w, spec((HEADS * HEAD_DIM, HIDDEN)))


def lower_layer_stack(stack):
  """Lower stack(x, w_up[LAYERS], w_down[LAYERS]) as a shard_map over the 1-D tp mesh."""
  f = jax.jit(
    jax.shard_map(
      stack, mesh=mesh_1d(), in_specs=(P(), P(None, None, "tp"), P(None, "tp", None)), out_specs=P()
    )
  )
  return f.lower(spec((TOKENS, HIDDEN)), spec((LAYERS, HIDDEN, FFN)), spec((LAYERS, FFN, HIDDEN)))


def scan_layers():
  """A stack of TP MLP layers under lax.scan, which lowers its body to a private function
  (@closed_call) that the stablehlo.while body calls; the psum is in that function."""

  def stack(x, w_up, w_down):
    def layer(y, ws):
      # x is replicated and the psum is device-invariant, so the carry stays invariant
      # (a carry that entered the loop as varying would need jax.lax.pcast).
      return y + mlp(y, *ws), None

    y, _ = jax.lax.scan(layer, x, (w_up, w_down))
    return y

  return lower_layer_stack(stack)


def while_layers():
  """The same layers under lax.while_loop: the all_reduce sits in the while body region
  itself (scan moves its body into a private function; while_loop inlines it)."""

  def stack(x, w_up, w_down):
    def body(carry):
      i, y = carry
      return i + 1, y + mlp(y, w_up[i], w_down[i])

    return jax.lax.while_loop(lambda carry: carry[0] < LAYERS, body, (0, x))[1]

  return lower_layer_stack(stack)


def pmap_psum():
  f = jax.pmap(lambda x: jax.lax.psum(2.0 * x, "i"), axis_name="i")
  return f.lower(spec((8, TOKENS, HIDDEN)))


def subgroups_2x4():
  """A 2x4 (dp, tp) mesh: a psum within each row of 4 (tp), then within each column of 2 (dp)."""

  def body(x, w):
    y = jax.lax.psum(x @ w, "tp")  # groups {0,1,2,3}, {4,5,6,7}
    return jax.lax.psum(y * y, "dp")  # groups {0,4}, {1,5}, {2,6}, {3,7}

  mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("dp", "tp"))
  f = jax.jit(
    jax.shard_map(body, mesh=mesh, in_specs=(P("dp", "tp"), P("tp", None)), out_specs=P())
  )
  return f.lower(spec((2 * TOKENS, 4 * HIDDEN)), spec((4 * HIDDEN, HIDDEN)))


def single_psum(fn, shape, dtype):
  mesh = mesh_1d()
  f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("tp"), out_specs=P()))
  return f.lower(spec((8 * shape[0],) + shape[1:], dtype))


def small_psum():
  """64 floats (256 bytes): far below the default --equarx_min_bytes."""
  return single_psum(lambda x: jax.lax.psum(jnp.tanh(x), "tp"), (64,), jnp.float32)


def pmax():
  """A max reduction of a rewritable size: only sums are quantized."""
  return single_psum(lambda x: jax.lax.pmax(x, "tp"), (TOKENS, HIDDEN), jnp.float32)


def psum_int32():
  """An integer sum of a rewritable size: only bf16/f16/f32 are quantized."""
  return single_psum(lambda x: jax.lax.psum(x, "tp"), (TOKENS, HIDDEN), jnp.int32)


def cond_psum():
  """psum in both branches of a lax.cond whose predicate is the same on every device."""

  def body(pred, x, w):
    y = x @ w
    return jax.lax.cond(
      pred, lambda y: jax.lax.psum(y, "tp"), lambda y: jax.lax.psum(0.5 * y, "tp"), y
    )

  mesh = mesh_1d()
  f = jax.jit(
    jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P())
  )
  return f.lower(spec((), jnp.bool_), spec((TOKENS, FFN)), spec((FFN, HIDDEN)))


def hlo_dump() -> str:
  """The f32 TP MLP compiled and run once, so that XLA writes its HLO dump."""
  mesh = mesh_1d()

  def tp_mlp_dumped(x, w_up, w_down):  # the HLO module is jit_tp_mlp_dumped
    return mlp(x, w_up, w_down)

  f = jax.jit(
    jax.shard_map(
      tp_mlp_dumped, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P()
    )
  )
  args = [jnp.ones((TOKENS, HIDDEN)), jnp.full((HIDDEN, FFN), 1e-3), jnp.full((FFN, HIDDEN), 1e-3)]
  shardings = [NamedSharding(mesh, s) for s in (P(), P(None, "tp"), P("tp", None))]
  args = [jax.device_put(a, s) for a, s in zip(args, shardings)]
  jax.block_until_ready(f(*args))
  dumps = glob.glob(os.path.join(DUMP, "module_*.jit_tp_mlp_dumped.before_optimizations.txt"))
  if len(dumps) != 1:
    raise RuntimeError(f"expected one before_optimizations dump in {DUMP}, found {dumps}")
  with open(dumps[0]) as dump:
    return dump.read()


def scatter_gather():
  """FSDP-style: all_gather the weight shards, matmul, psum_scatter the product."""

  def body(x, w):
    w_full = jax.lax.all_gather(w, "tp", axis=0, tiled=True)
    return jax.lax.psum_scatter(x @ w_full, "tp", scatter_dimension=1, tiled=True)

  mesh = mesh_1d()
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P("tp")), out_specs=P(None, "tp")))
  return f.lower(spec((TOKENS, HIDDEN)), spec((HIDDEN, FFN)))


# name -> (what it is, how to make it).  The README is generated from this table.
FIXTURES = {
  "tp_mlp_f32.mlir": (
    "Megatron TP MLP, f32, 8 devices: one psum of 64x512 (128 KiB)",
    lambda: tp_mlp(jnp.float32),
  ),
  "tp_mlp_bf16.mlir": ("the same MLP in bf16 (64 KiB psum)", lambda: tp_mlp(jnp.bfloat16)),
  "tp_mlp_f16.mlir": ("the same MLP in f16 (64 KiB psum)", lambda: tp_mlp(jnp.float16)),
  "tp_mlp_4dev_f32.mlir": (
    "the f32 MLP on 4 devices (for TPU v5e:2x2)",
    lambda: tp_mlp(jnp.float32, devices=4),
  ),
  "tp_attention_f32.mlir": (
    "causal self-attention, 8 heads split over 8 devices, psum after the output projection",
    tp_attention,
  ),
  "scan_layers_f32.mlir": (
    f"{LAYERS} TP MLP layers under lax.scan: the psum is in a private "
    "function that the stablehlo.while body calls",
    scan_layers,
  ),
  "while_layers_f32.mlir": (
    f"{LAYERS} TP MLP layers under lax.while_loop: the psum is nested "
    "in the stablehlo.while body region",
    while_layers,
  ),
  "pmap_psum_f32.mlir": ("jax.pmap over 8 devices with a psum", pmap_psum),
  "subgroups_2x4_f32.mlir": (
    "2x4 (dp, tp) mesh: psum over tp (groups of 4), then over dp (groups of 2)",
    subgroups_2x4,
  ),
  "small_psum_f32.mlir": ("psum of 64 floats (256 bytes): below the default min_bytes", small_psum),
  "pmax_f32.mlir": ("pmax (max reduction, 128 KiB): never rewritten", pmax),
  "psum_i32.mlir": ("integer psum (128 KiB): never rewritten", psum_int32),
  "cond_psum_f32.mlir": (
    "a psum in each branch of lax.cond with a replicated predicate",
    cond_psum,
  ),
  "scatter_gather_f32.mlir": (
    "FSDP-style: all_gather of 64x1024 weight shards (256 KiB), a matmul, psum_scatter of "
    "the 64x1024 product (256 KiB); no all-reduce",
    scatter_gather,
  ),
}
HLO_DUMP = (
  "tp_mlp_f32.before_optimizations.txt",
  "XLA HLO text dump of the f32 TP MLP, compiled and run on 8 CPU devices: "
  "`module_NNNN.jit_tp_mlp_dumped.before_optimizations.txt` from --xla_dump_to, "
  "renamed; the pass converts it to StableHLO",
)


def readme() -> str:
  lines = [
    "# hlo_fixtures",
    "",
    "Inputs for the structural tests (tests/filecheck/*.check, tests/test_structure.py) and",
    "the TPU compile tests. Every file is generated; do not edit by hand. Regenerate all of",
    "them with one command from the repository root:",
    "",
    "    python tools/data/make_fixtures.py",
    "",
    f"Sizes: tokens={TOKENS}, hidden={HIDDEN}, ffn={FFN}, heads={HEADS}x{HEAD_DIM}. "
    "Unless a line says otherwise, the",
    "psums are >= 64 KiB, so the default policy (--equarx_min_bytes=65536) rewrites them.",
    "The .mlir files are `jax.jit(...).lower(...).as_text(debug_info=True)` (StableHLO",
    "text with source locations) from JAX " + jax.__version__ + " on 8 virtual CPU devices.",
    "The locations point at lines of tools/data/make_fixtures.py, so editing the script and",
    "regenerating changes them; the tests never depend on locations beyond the file name.",
    "",
    "| file | what it is |",
    "|---|---|",
  ]
  for name, (what, _) in FIXTURES.items():
    lines.append(f"| `{name}` | {what} |")
  lines.append(f"| `{HLO_DUMP[0]}` | {HLO_DUMP[1]} |")
  return "\n".join(lines) + "\n"


def write(name: str, text: str) -> None:
  # Fail here, not in a test, if a fixture is something the pass cannot read.
  equarx_pass.parse_bytes(text, name)
  with open(os.path.join(OUT, name), "w") as f:
    f.write(text)
  print(f"wrote hlo_fixtures/{name} ({len(text)} bytes)")


def main() -> None:
  import argparse

  argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
  os.makedirs(OUT, exist_ok=True)
  try:
    for name, (_, make) in FIXTURES.items():
      write(name, make().as_text(debug_info=True))
    write(HLO_DUMP[0], hlo_dump())
  finally:
    shutil.rmtree(DUMP, ignore_errors=True)
  with open(os.path.join(OUT, "README.md"), "w") as f:
    f.write(readme())


if __name__ == "__main__":
  main()
