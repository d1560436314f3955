"""TPU, on paper, with the links: a psum's time by the compiled program's own schedule.

    python tools/schedule_estimate.py                       # v5e:2x2, 32 MiB bf16 and f32
    python tools/schedule_estimate.py --topology v5e:2x2 v5e:4x4 v5p:2x2x1 --sizes 32M

No TPU is used or needed: libtpu compiles a psum over all chips of each topology ahead of
time, as it is and rewritten by each scheme (forced, in the form the pass emits for TPU),
and equarx_pass/frontends/tpu_schedule.py replays each compiled program's schedule: the compiler's
estimated cycles per instruction (at the generation's clock; a Pallas kernel by its bytes
at the compiler's own HBM bandwidth), each collective's bytes per chip over the ICI
figure the cost model uses for that generation (passed to the pass as
--equarx_fast_link_bandwidth, so that both price the same link), asynchronous
collectives overlapped with the work the schedule puts inside them.

Per program it prints the core's time, the links' time, how much of the links' time ran
under the core's work, the time with overlap, that over the native psum's, and the cost
model's own prediction for the site (its native time over its speed-up) beside it.  All of
it is ESTIMATES, the compiler's and the cost model's: nothing here measures a TPU.

--overlap-probe K adds stand-ins of a chunked two-shot site written in JAX (not what the
pass emits): the operand in K chunks, each rounded to int8, exchanged (an all_to_all, or
N - 1 ppermutes), summed, requantized and all_gathered, with no chunk waiting for another,
so that the compiler is free to run one chunk's transfers under another's work.  What its
schedule makes asynchronous says what a chunked form can expect of the compiler.

--pieces-probe adds stand-ins of the kernel form's two-shot (not what the pass emits)
with its exchanges as N - 1 ppermutes a phase and Pallas kernels that take the pieces as
separate operands: one quantize kernel per piece (piece k is chunk rank + k, read where it
lies), one sum kernel over the N pieces received (summed in group order), the sum sent by
N - 1 ppermutes and one dequantize kernel per piece, each writing its chunk of the result
in place.  "scales packed": each piece's scales travel in its int8 array, as bytes of
lane-dense rows (equarx_pass/emission/packed_scales.py); "scales apart": in ppermutes of their own.

Writes results/schedule_estimate.json (or --out).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
from bench_tpu import topology_devices  # noqa: E402

DEFAULT_SCHEMES = [
  "--equarx_enable",
  "--equarx_enable --equarx_form=kernel --equarx_kernel_exchange=collectives",
  "--equarx_enable --equarx_form=kernel --equarx_kernel_exchange=permutes",
]


def chunked_stand_in(jax, n: int, chunks: int, exchange: str):
  """A psum stand-in over axis "x" of n devices: two-shot on int8 in `chunks` independent
  chunks, each chunk's reduce-scatter an all_to_all or n - 1 ppermutes (exchange)."""
  import numpy as np
  from jax.sharding import Mesh, PartitionSpec as P

  jnp = jax.numpy

  def chunk_sum(c):
    q = jnp.round(c.astype(jnp.float32) * 64).astype(jnp.int8).reshape(n, -1, 8, 128)
    if exchange == "all_to_all":
      got = jax.lax.all_to_all(q, "x", 0, 0, tiled=True)
    else:
      me = jax.lax.axis_index("x")
      got = jnp.stack(
        [q[me]]
        + [
          jax.lax.ppermute(q[(me + s) % n], "x", [(i, (i + s) % n) for i in range(n)])
          for s in range(1, n)
        ]
      )
    summed = jnp.round(got.astype(jnp.float32).sum(0) / n).astype(jnp.int8)
    gathered = jax.lax.all_gather(summed, "x", tiled=True)
    return (gathered.astype(jnp.float32) / 64).astype(c.dtype).reshape(-1)

  def site(v):
    return jnp.concatenate([chunk_sum(c) for c in jnp.split(v, chunks)])

  mesh = Mesh(np.array(jax.devices()[:n]), ("x",))
  return jax.jit(jax.shard_map(site, mesh=mesh, in_specs=P("x"), out_specs=P("x")))


PROBES = ("all_to_all", "ppermute")
PIECES_PROBES = ("scales packed", "scales apart")
TILE = (8, 128)  # a TPU tile of int8 codes: eight blocks of one 128-value row


def pieces_stand_in(jax, n: int, values: int, dtype, scales: str, interpret: bool = False):
  """A psum stand-in over axis "x" of n devices: the kernel form's two-shot (the rotation
  as a matmul, int8 codes of 128-value rows) with N - 1 ppermutes per phase whose pieces
  the kernels take as separate operands; scales "packed" into each piece's int8 array or
  sent "apart".  `values` per device, a multiple of n * 32 tiles; interpret: Pallas's
  interpreter (CPU) instead of Mosaic."""
  import numpy as np
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import tpu as pltpu
  from jax.sharding import Mesh, PartitionSpec as P

  from equarx_pass.emission import packed_scales, quantize_kernel, rotation

  jnp = jax.numpy
  rows, lanes = TILE
  tiles = values // (rows * lanes)
  t = tiles // n  # a piece's tiles
  step = quantize_kernel.permuted_step(tiles, n)
  steps, element = t // step, jnp.dtype(dtype)
  packed = scales == "packed"
  extra = step // 32 if packed else 0  # a step's tiles of scale bytes
  piece_bytes = t * rows * lanes + t * rows * 4
  values_bytes = t * rows * lanes * element.itemsize

  def at(block, index):
    return pl.BlockSpec(block, index)

  def codes_spec():
    return at((step + extra, *TILE), lambda s, me: (s, 0, 0))

  def scales_spec():
    return at((step, rows), lambda s, me: (s, 0))

  out_codes = jax.ShapeDtypeStruct((steps * (step + extra), *TILE), jnp.int8)
  out_scales = jax.ShapeDtypeStruct((t, rows), jnp.float32)
  outs = [out_codes] + ([] if packed else [out_scales])
  out_specs = [codes_spec()] + ([] if packed else [scales_spec()])

  def call(kernel, name, in_specs, out_specs, out_shape, moved, args, aliases=None):
    spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=1, grid=(steps,), in_specs=in_specs, out_specs=out_specs
    )
    return pl.pallas_call(
      kernel,
      grid_spec=spec,
      out_shape=out_shape,
      input_output_aliases=aliases or {},
      interpret=interpret,
      name=name,
      cost_estimate=pl.CostEstimate(flops=0, transcendentals=0, bytes_accessed=int(moved)),
    )(*args)

  def write(codes_ref, scales_refs, y):
    codes, scale = quantize_kernel.quantize_tiles(jnp, y, not interpret)
    if packed:
      codes_ref[pl.ds(0, step)] = codes
      codes_ref[pl.ds(step, extra)] = packed_scales.pack(jax, scale)
    else:
      codes_ref[...], scales_refs[0][...] = codes, scale

  def read(codes_ref, scales_ref):
    """A piece's step of values: codes times scales, f32 [step, 8, 128]."""
    if packed:
      codes = codes_ref[pl.ds(0, step)]
      scale = packed_scales.unpack(jax, codes_ref[pl.ds(step, extra)], step)
    else:
      codes, scale = codes_ref[...], scales_ref[...][..., None]
    return codes.astype(jnp.float32), scale

  def quantize(k, x, matrix, me):
    """Piece k: chunk (me + k) % n of x [tiles, 8, 128], quantized."""

    def kernel(me_ref, x_ref, m_ref, codes_ref, *scales_refs):
      y = jnp.dot(
        x_ref[...].reshape(step * rows, lanes), m_ref[...], preferred_element_type=jnp.float32
      )
      write(codes_ref, scales_refs, y.reshape(step, *TILE))

    source = at((step, *TILE), lambda s, me: (((me[0] + k) % n) * steps + s, 0, 0))
    matrix_spec = at((lanes, lanes), lambda s, me: (0, 0))
    return call(
      kernel,
      f"quantize_{k}",
      [source, matrix_spec],
      out_specs,
      outs,
      values_bytes + piece_bytes,
      [me, x, matrix],
    )

  def sum_pieces(codes, scales, me):
    """Slot s holds the piece from rank (me - s) % n: summed in group order (rank 0
    first, as two-shot's sum), one branch per rank."""

    def kernel(me_ref, *refs):
      code_refs, scale_refs = refs[:n], refs[n : n + len(scales)]
      codes_ref, *scales_refs = refs[n + len(scales) :]
      for rank in range(n):

        @pl.when(me_ref[0] == rank)
        def _(rank=rank):
          def term(j):
            s = (rank - j) % n
            c, scale = read(code_refs[s], scale_refs[s] if scale_refs else None)
            return c * scale

          first = term(0)
          acc = jnp.where(first == 0, jnp.float32(0), first)
          for j in range(1, n):
            acc = term(j) + acc
          write(codes_ref, scales_refs, acc)

    in_specs = [codes_spec() for _ in codes] + [scales_spec() for _ in scales]
    return call(
      kernel, "sum", in_specs, out_specs, outs, (n + 1) * piece_bytes, [me, *codes, *scales]
    )

  def dequantize(k, codes, scales, matrix, me, into):
    """Slot k (chunk (me - k) % n) rotated back and written into the values."""

    def kernel(me_ref, c_ref, *rest):
      scales_ref = None if packed else rest[0]
      m_ref, out_ref = rest[-3 if into is not None else -2], rest[-1]
      c, scale = read(c_ref, scales_ref)
      y = jnp.dot(
        c.reshape(step * rows, lanes).astype(jnp.bfloat16),
        m_ref[...],
        preferred_element_type=jnp.float32,
      )
      out_ref[...] = (y.reshape(step, *TILE) * scale).astype(out_ref.dtype)

    in_specs = (
      [codes_spec()]
      + ([] if packed else [scales_spec()])
      + [at((lanes, lanes), lambda s, me: (0, 0))]
    )
    args = [me, codes] + ([] if packed else [scales]) + [matrix]
    aliases = None
    if into is not None:  # the values so far, written in place
      in_specs.append(pl.BlockSpec(memory_space=pl.ANY))
      args.append(into)
      aliases = {len(args) - 1: 0}
    dest = at((step, *TILE), lambda s, me: (((me[0] - k) % n) * steps + s, 0, 0))
    (out,) = call(
      kernel,
      f"dequantize_{k}",
      in_specs,
      [dest],
      [jax.ShapeDtypeStruct((tiles, *TILE), element)],
      piece_bytes + values_bytes,
      args,
      aliases,
    )
    return out

  def send(x, k):
    return jax.lax.ppermute(x, "x", [(i, (i + k) % n) for i in range(n)])

  h = np.asarray(rotation.matrix(lanes), np.float32)

  def site(v):
    me = jax.lax.axis_index("x").astype(jnp.int32).reshape(1)
    x = v.reshape(tiles, *TILE)
    pieces = [quantize(k, x, jnp.asarray(h / lanes, element), me) for k in range(n)]
    got = [pieces[0]] + [[send(a, k) for a in pieces[k]] for k in range(1, n)]
    codes, scales = [g[0] for g in got], [g[1] for g in got if len(g) > 1]
    summed = sum_pieces(codes, scales, me)
    gathered = [summed] + [[send(a, k) for a in summed] for k in range(1, n)]
    out = None
    for k, g in enumerate(gathered):
      out = dequantize(k, g[0], g[1] if len(g) > 1 else None, jnp.asarray(h, jnp.bfloat16), me, out)
    return out.reshape(-1)

  mesh = Mesh(np.array(jax.devices()[:n]), ("x",))
  return jax.jit(jax.shard_map(site, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))


def program_label(scheme: str) -> str:
  if scheme.startswith("pieces"):
    return scheme.replace("pieces", "kernel pieces stand-in,")
  if scheme.startswith("stand-in"):
    return scheme.replace("stand-in", "chunked stand-in,")
  return benchlib.scheme_label(scheme) if scheme else "native psum"


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  benchlib.add_scheme_argument(ap)
  ap.add_argument("--topology", nargs="+", default=["v5e:2x2"])
  ap.add_argument("--sizes", nargs="+", default=["32M"], help="bytes per chip")
  ap.add_argument("--dtypes", nargs="+", default=["bf16", "f32"])
  ap.add_argument(
    "--unforced",
    action="store_true",
    help="also each scheme without --equarx_force: what the pass decides by itself",
  )
  ap.add_argument(
    "--overlap-probe",
    type=int,
    default=0,
    metavar="K",
    help="also the chunked stand-ins (all_to_all and ppermute exchanges) in K chunks",
  )
  ap.add_argument(
    "--pieces-probe",
    action="store_true",
    help="also the kernel form's stand-ins with N - 1 ppermutes a phase, pieces as operands",
  )
  ap.add_argument("--out", default=os.path.join(benchlib.RESULTS, "schedule_estimate.json"))
  args = ap.parse_args()

  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  chips = {topology: topology_devices(topology) for topology in args.topology}
  import jax
  import numpy as np

  import equarx_pass
  from equarx_pass.frontends import tpu_aot, tpu_schedule

  jax.config.update("jax_num_cpu_devices", max(chips.values()))
  schemes = args.scheme or DEFAULT_SCHEMES
  rows = []
  for topology, n in chips.items():
    chip = tpu_schedule.chip_for(topology, n)
    print(
      f"{topology}: {n} chips, clock {chip.clock_hz / 1e9:g} GHz, HBM {chip.hbm_bytes_per_s / 1e9:.0f}"
      f" GB/s (the compiler's), ICI {chip.link.gbytes_per_s:g} GB/s a chip (the cost model's)",
      flush=True,
    )
    f = benchlib.psum_program(n)
    for dtype_name in args.dtypes:
      dtype = benchlib.jnp_dtype(dtype_name)
      for size_text in args.sizes:
        size = benchlib.parse_size(size_text)
        values = size // np.dtype(dtype).itemsize
        module = f.lower(jax.ShapeDtypeStruct((n * values,), dtype)).compiler_ir("stablehlo")
        programs = [("", True)] + [(s, True) for s in schemes]
        programs += [(s, False) for s in schemes] if args.unforced else []
        if args.overlap_probe:
          programs += [(f"stand-in {x} x{args.overlap_probe}", True) for x in PROBES]
        if args.pieces_probe:
          programs += [(f"pieces {x}", True) for x in PIECES_PROBES]
        native_s = None
        for scheme, forced in programs:
          row = dict(topology=topology, dtype=dtype_name, size=size, scheme=scheme, forced=forced)
          mod, model_s, record = module, None, None
          if scheme.startswith("pieces"):
            program = pieces_stand_in(jax, n, values, dtype, scheme.split()[-1])
            traced = program.trace(jax.ShapeDtypeStruct((n * values,), dtype))
            mod = traced.lower(lowering_platforms=("tpu",)).compiler_ir("stablehlo")
          elif scheme.startswith("stand-in"):
            exchange = scheme.split()[1]
            program = chunked_stand_in(jax, n, args.overlap_probe, exchange)
            mod = program.lower(jax.ShapeDtypeStruct((n * values,), dtype)).compiler_ir("stablehlo")
          elif scheme:
            flags = f"{scheme} --equarx_min_bytes=0 --equarx_platform=tpu --equarx_domains=1"
            flags += f" --equarx_fast_link_bandwidth={chip.link.gbytes_per_s:g}"
            flags += " --equarx_force" if forced else ""
            result = equarx_pass.rewrite_module(module, equarx_pass.Policy.from_flags(flags))
            [record] = result.records
            row.update(decision=record.decision, reason=record.reason)
            if record.traffic_before is not None and record.speedup:
              model_native = record.traffic_before.seconds(result.topology)
              model_s = model_native / record.speedup if record.rewritten else model_native
              row.update(model_native_s=model_native, model_s=model_s)
            mod = result.module
          try:
            compiled = tpu_aot.compile_for_target(str(mod), f"tpu:{topology}")
            est = tpu_schedule.estimate(compiled.hlo_text, chip)
          except Exception as e:
            rows.append(dict(row, error=f"{type(e).__name__}: {str(e)[:300]}"))
            print("  " + rows[-1]["error"], flush=True)
            continue
          native_s = est.seconds if not scheme else native_s
          row.update(
            compile_s=compiled.seconds,
            seconds=est.seconds,
            core_s=est.core_seconds,
            wire_s=est.wire_seconds,
            hidden_s=est.hidden_seconds,
            async_transfers=sum(t.asynchronous for t in est.transfers),
            transfers=len(est.transfers),
            optimal_seconds=compiled.on_chip_seconds,
          )
          if native_s:
            row["x_native"] = est.seconds / native_s
          rows.append(row)
          label = program_label(scheme)
          if scheme and not forced:
            label += f" ({record.decision if record else '?'})"
          model = f"  model {model_s * 1e6:7.1f} us" if model_s is not None else ""
          print(
            f"  {dtype_name} {benchlib.fmt_bytes(size):>8} {label:<40} "
            f"{est.seconds * 1e6:8.1f} us ({row.get('x_native', 1):.2f}x native){model}",
            flush=True,
          )

  cols = [
    "topology",
    "dtype",
    "size",
    "program",
    "core us",
    "links us",
    "hidden us",
    "async/all",
    "time us",
    "x native",
    "cost model us",
    "model/schedule",
  ]
  table_rows = []
  for r in rows:
    label = program_label(r["scheme"])
    if r["scheme"] and not r["forced"]:
      label += f" (default: {r.get('decision', '?')})"
    t = {
      "topology": r["topology"],
      "dtype": r["dtype"],
      "size": benchlib.fmt_bytes(r["size"]),
      "program": label,
    }
    if "error" in r:
      t["core us"] = r["error"][:60]
    else:
      t.update(
        {
          "core us": f"{r['core_s'] * 1e6:.1f}",
          "links us": f"{r['wire_s'] * 1e6:.1f}",
          "hidden us": f"{r['hidden_s'] * 1e6:.1f}",
          "async/all": f"{r['async_transfers']}/{r['transfers']}",
          "time us": f"{r['seconds'] * 1e6:.1f}",
          "x native": f"{r['x_native']:.2f}" if "x_native" in r else "-",
        }
      )
      if r.get("model_s") is not None:
        t["cost model us"] = f"{r['model_s'] * 1e6:.1f}"
        t["model/schedule"] = f"{r['model_s'] / r['seconds']:.2f}"
    table_rows.append(t)
  print(
    "TPU compiler estimates replayed by the compiled schedule, transfers at the cost model's "
    "ICI figure (estimates, not measurements)"
  )
  print(benchlib.table(table_rows, cols))
  benchlib.write_results(args.out, rows, table_rows, cols, targets=list(chips), chips=chips)
  return 0


if __name__ == "__main__":
  sys.exit(main())
