"""The default's quantize stage as one Pallas kernel, against what XLA makes of the same math.

    python tools/bench_kernel.py --platform cuda            # on a GPU, where there is one
    python tools/bench_kernel.py --values 1M --interpret    # anywhere: Pallas's interpreter

The stage is the tiled form's first one for a 16-bit operand: rotate each row of 128
values by the randomized Hadamard matrix ((H / 128) D, as a matmul), take each row's
absmax, scale it by 1/127 and round the rotated values to int8 codes, as quantize.py
has it.  XLA compiles that math from jnp, as it compiles the pass's emitted ops: a matmul
whose f32 result it stores, then the reductions and the codes.  The kernel does it in one
pass per block of rows: read the block, rotate it on the tensor cores, keep it in
registers for the maximum and the codes, write codes and scales.  Printed: the median of
--calls calls of each, beside one pass over the operand (x + 1), and how many codes and
scales the kernel gets differently from XLA (the matmul may sum in another order).

This is a measurement for the kernel form, not part of the pass: nothing here is emitted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

ROW = 128  # the rotation's and the block's size
QMAX = 127.0
FLT_MAX = 3.4028234663852886e38


def round_half_even(jnp, v):
  """v rounded to the nearest integer, ties to even, with floor alone (Pallas's Triton
  lowering has no round); exact for |v| < 2^22, and codes are within +-127."""
  r = jnp.floor(v + 0.5)
  tie = (r - v) == 0.5
  odd = (r - 2 * jnp.floor(r * 0.5)) != 0
  return jnp.where(tie & odd, r - 1, r)


def quantize_rows(jnp, y):
  """Codes and scales of f32 rows [rows, 128] (quantize.py's int8 block codec: rounding
  to the nearest integer, ties to even)."""
  scale = jnp.max(jnp.abs(y), axis=-1) * jnp.float32(1 / QMAX)
  safe = jnp.where(scale > 0, scale, jnp.float32(1))
  inverse = jnp.minimum(jnp.float32(1) / safe, jnp.float32(FLT_MAX))
  v = jnp.clip(y * inverse[:, None], -QMAX, QMAX)
  codes = round_half_even(jnp, v).astype(jnp.int8)
  return codes, scale


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--values", default="32M", help="values (K/M suffixes), bf16")
  parser.add_argument("--rows-per-block", type=int, default=128)
  parser.add_argument("--calls", type=int, default=21)
  parser.add_argument("--platform", default="cpu", help="the JAX platform that runs it")
  parser.add_argument("--interpret", action="store_true", help="Pallas's interpreter")
  parser.add_argument("--out", default=os.path.join(benchlib.RESULTS, "kernel.json"))
  args = parser.parse_args(argv)
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.experimental import pallas as pl

  from equarx_pass import rotation

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

  @jax.jit
  def xla(x, m):
    return quantize_rows(jnp, jnp.dot(x, m, preferred_element_type=jnp.float32))

  def kernel(x_ref, m_ref, codes_ref, scale_ref):
    y = jnp.dot(x_ref[...], m_ref[...], preferred_element_type=jnp.float32)
    codes, scale = quantize_rows(jnp, y)
    codes_ref[...] = codes
    scale_ref[...] = scale

  fused = jax.jit(
    pl.pallas_call(
      kernel,
      grid=(rows // block,),
      in_specs=[
        pl.BlockSpec((block, ROW), lambda i: (i, 0)),
        pl.BlockSpec((ROW, ROW), lambda i: (0, 0)),
      ],
      out_specs=[
        pl.BlockSpec((block, ROW), lambda i: (i, 0)),
        pl.BlockSpec((block,), lambda i: (i,)),
      ],
      out_shape=[
        jax.ShapeDtypeStruct((rows, ROW), jnp.int8),
        jax.ShapeDtypeStruct((rows,), jnp.float32),
      ],
      interpret=args.interpret,
    )
  )
  one_pass = jax.jit(lambda v: v + 1)

  def timed(run) -> float:
    jax.block_until_ready(run())
    times = []
    for _ in range(args.calls):
      start = time.perf_counter()
      jax.block_until_ready(run())
      times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]

  want_codes, want_scales = (np.asarray(a) for a in xla(x, m))
  got_codes, got_scales = (np.asarray(a) for a in fused(x, m))
  rows_out = [
    dict(program="one pass (x + 1)", seconds=timed(lambda: one_pass(x))),
    dict(program="XLA: jnp of the stage", seconds=timed(lambda: xla(x, m))),
    dict(program="one Pallas kernel", seconds=timed(lambda: fused(x, m))),
  ]
  for r in rows_out:
    r["ms"] = f"{r['seconds'] * 1e3:.3f}"
    r["x_one_pass"] = f"{r['seconds'] / rows_out[0]['seconds']:.2f}"
  codes_off = int(np.count_nonzero(got_codes != want_codes))
  scales_off = int(np.count_nonzero(got_scales != want_scales))
  title = (
    f"the quantize stage of {benchlib.fmt_bytes(values * 2)} of bf16 on one "
    f"{device.platform} device{' (interpreted)' if args.interpret else ''}, "
    f"median of {args.calls}"
  )
  print(benchlib.table(rows_out, ["program", "ms", "x_one_pass"], title))
  print(f"the kernel's codes against XLA's: {codes_off} of {values} differ; scales: {scales_off}")
  benchlib.write_result(
    args.out,
    rows_out,
    values=values,
    rows_per_block=block,
    platform=device.platform,
    interpret=args.interpret,
    codes_differing=codes_off,
    scales_differing=scales_off,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
