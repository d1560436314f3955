"""The default's local stages as Pallas kernels, against what XLA makes of the same math.

    python tools/bench_kernel.py --platform cuda            # on a GPU, where there is one
    python tools/bench_kernel.py --values 1M --interpret    # anywhere: Pallas's interpreter

Two stages of the tiled form for a 16-bit operand, each once as jnp that XLA compiles (as
it compiles the pass's emitted ops) and once as one Pallas kernel over blocks of rows:

  quantize  rotate each row of 128 values by the randomized Hadamard matrix ((H / 128) D,
            a matmul), take each row's absmax, scale it by 1/127 and round the rotated
            values to int8 codes, as quantize.py has it.  XLA stores the matmul's f32
            result and reads it back; the kernel keeps each block on chip.
  sum       the N received pieces of one chunk (--group): codes times scales summed in
            f32, each new term first, then requantized.

Printed per stage: the median of --calls calls of each, beside one pass over the stage's
input (x + 1), and how many codes and scales the kernel gets differently from XLA.

Both sides share the kernel form's codec (equarx_pass/emission/quantize_kernel.py, which emits
these stages as kernels into the site: --equarx_form=kernel); what this isolates is what
one kernel gains over XLA's compilation of the same math, stage by stage.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

ROW = 128  # the rotation's and the block's size


def quantize_rows(jnp, y):
  """Codes and scales of f32 rows [rows, 128]: the kernel form's codec
  (quantize_kernel.quantize_tiles, quantize.py's int8 block codec), on rows in tiles of 8."""
  from equarx_pass.emission.quantize_kernel import quantize_tiles

  rows = y.shape[0]
  codes, scale = quantize_tiles(jnp, y.reshape(rows // 8, 8, ROW))
  return codes.reshape(rows, ROW), scale.reshape(rows)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--values", default="32M", help="values (K/M suffixes), bf16")
  parser.add_argument("--rows-per-block", type=int, default=128)
  parser.add_argument("--group", type=int, default=4, help="N: the pieces the sum stage adds")
  parser.add_argument("--calls", type=int, default=21)
  parser.add_argument("--platform", default="cpu", help="the JAX platform that runs it")
  parser.add_argument("--interpret", action="store_true", help="Pallas's interpreter")
  parser.add_argument("--out", default=os.path.join(benchlib.RESULTS, "kernel.json"))
  args = parser.parse_args(argv)
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.experimental import pallas as pl

  from equarx_pass.emission import rotation

  values = benchlib.parse_size(args.values)
  rows, block = values // ROW, args.rows_per_block
  if values % ROW or rows % block:
    parser.error(f"--values must be whole blocks of {block} rows of {ROW}")
  device = jax.devices(args.platform)[0]
  matrix = (
    rotation.signs(ROW).astype(np.float64)[:, None] * rotation.matrix(ROW) * rotation.norm(ROW)
  )
  m = jax.device_put(jnp.asarray(matrix, jnp.bfloat16), device)  # entries +-2^-k: exact
  rng = np.random.default_rng(0)
  x = jax.device_put(jnp.asarray(rng.standard_normal((rows, ROW)), jnp.bfloat16), device)

  n = args.group
  if rows % (n * block):
    parser.error(f"--values must be whole blocks of {block} rows for each of {n} members")

  def quantize_math(x, m):
    return quantize_rows(jnp, jnp.dot(x, m, preferred_element_type=jnp.float32))

  def quantize_kernel(x_ref, m_ref, codes_ref, scale_ref):
    codes_ref[...], scale_ref[...] = quantize_math(x_ref[...], m_ref[...])

  def sum_math(terms):
    """The N received pieces' codes and scales summed in f32, as the emitted sum: each
    new term first, the sum starting from the first term; then requantized."""
    total = None
    for codes, scale in terms:
      term = codes.astype(jnp.float32) * scale[:, None]
      total = term if total is None else term + total
    return quantize_rows(jnp, total)

  def sum_kernel(codes_ref, scales_ref, codes_out, scale_out):
    terms = [(codes_ref[j, :, :], scales_ref[j, :]) for j in range(n)]
    codes_out[...], scale_out[...] = sum_math(terms)

  chunk = rows // n
  codes_and_scales = [
    jax.ShapeDtypeStruct((chunk, ROW), jnp.int8),
    jax.ShapeDtypeStruct((chunk,), jnp.float32),
  ]
  out_blocks = [
    pl.BlockSpec((block, ROW), lambda i: (i, 0)),
    pl.BlockSpec((block,), lambda i: (i,)),
  ]
  quantize_fused = pl.pallas_call(
    quantize_kernel,
    grid=(rows // block,),
    in_specs=[
      pl.BlockSpec((block, ROW), lambda i: (i, 0)),
      pl.BlockSpec((ROW, ROW), lambda i: (0, 0)),
    ],
    out_specs=out_blocks,
    out_shape=[
      jax.ShapeDtypeStruct((rows, ROW), jnp.int8),
      jax.ShapeDtypeStruct((rows,), jnp.float32),
    ],
    interpret=args.interpret,
  )
  sum_fused = pl.pallas_call(
    sum_kernel,
    grid=(chunk // block,),
    in_specs=[
      pl.BlockSpec((n, block, ROW), lambda i: (0, i, 0)),
      pl.BlockSpec((n, block), lambda i: (0, i)),
    ],
    out_specs=out_blocks,
    out_shape=codes_and_scales,
    interpret=args.interpret,
  )
  # The sum stage's input: every member's codes and scales of one chunk.
  received = jax.device_put(jnp.asarray(rng.integers(-127, 128, (n, chunk, ROW)), jnp.int8), device)
  received_scales = jax.device_put(
    jnp.asarray(rng.uniform(0.001, 0.05, (n, chunk)), jnp.float32), device
  )
  stages = {
    "quantize": (
      (x, m),
      jax.jit(quantize_math),
      jax.jit(quantize_fused),
      f"rotate, absmax, scale and round {benchlib.fmt_bytes(values * 2)} of bf16",
    ),
    "sum": (
      (received, received_scales),
      jax.jit(lambda q, s: sum_math([(q[j], s[j]) for j in range(n)])),
      jax.jit(sum_fused),
      f"dequantize, sum and requantize {n} pieces of {benchlib.fmt_bytes(chunk * ROW)} "
      "of int8 codes",
    ),
  }
  one_pass = jax.jit(lambda v: v + 1)

  rows_out = []
  where = f"one {device.platform} device{' (interpreted)' if args.interpret else ''}"
  for stage, (inputs, xla, fused, what) in stages.items():
    want_codes, want_scales = (np.asarray(a) for a in xla(*inputs))
    got_codes, got_scales = (np.asarray(a) for a in fused(*inputs))
    first = inputs[0]
    programs = {
      "one pass over its input (x + 1)": lambda: one_pass(first),
      "XLA: jnp of the stage": lambda: xla(*inputs),
      "one Pallas kernel": lambda: fused(*inputs),
    }
    stage_rows = [
      dict(stage=stage, program=name, seconds=benchlib.median_seconds(run, args.calls))
      for name, run in programs.items()
    ]
    for r in stage_rows:
      r["ms"] = f"{r['seconds'] * 1e3:.3f}"
      r["x_one_pass"] = f"{r['seconds'] / stage_rows[0]['seconds']:.2f}"
    stage_rows[-1]["codes_differing"] = int(np.count_nonzero(got_codes != want_codes))
    stage_rows[-1]["scales_differing"] = int(np.count_nonzero(got_scales != want_scales))
    title = f"{stage}: {what}, on {where}, median of {args.calls}"
    print(benchlib.table(stage_rows, ["program", "ms", "x_one_pass"], title))
    print(
      f"the kernel's codes against XLA's: {stage_rows[-1]['codes_differing']} of "
      f"{want_codes.size} differ; scales differing: {stage_rows[-1]['scales_differing']}\n"
    )
    rows_out += stage_rows
  benchlib.write_result(
    args.out,
    rows_out,
    values=values,
    group=n,
    rows_per_block=block,
    platform=device.platform,
    interpret=args.interpret,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
