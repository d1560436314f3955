"""The kernel form (--equarx_form=kernel): two-shot's local stages as Pallas kernels.

  quantize     rotate the operand's rows of 128 ((H / 128) D, a matmul), take each row's
               maximum, scale and round: int8 codes and f32 scales, one pass
  sum          the N received pieces dequantized, added in f32 in group order (as
               forms.plus_zero and forms.add), quantized again
  dequantize   rotate back (H, then D), scale, convert to the result's type

What XLA makes of the same stages emitted as ops (quantize_emit.TileCodec) reads the
operand twice and, on a GPU, stores the rotation's f32 result and reads it back
(tools/bench_kernel.py on an H100: the quantize stage 2.7x one pass over its input, as
a kernel 1.2-1.3x with the same codes).  A kernel over blocks of (8, 128) tiles keeps
each block on chip.  An operand of whole tiles is read and written where it lies, its
tiles in column-major order (two-shot sums its blocks alike in any order), and one of
more than PART_BYTES goes through in parts (dequantize_module says how they chain).

The codec is quantize.py's int8 on one-row blocks of 128 values: absmax with NaN counted
as inf, the scale times f32(1/127), the reciprocal of the safe scale capped at FLT_MAX,
clamp, round half to even (with floor: Triton has no round; exact for |v| <= 127), NaN
codes 0.  The forward rotation is a matmul with an f32 result (16-bit operands as they
are, f32 at the highest precision), as the tiled form's.

JAX lowers each kernel for where the program is compiled: Mosaic (a tpu_custom_call) on
TPU, Triton on CUDA GPUs, and Pallas's interpreter (plain StableHLO) where a program
emitted in a TPU or GPU form runs on CPU devices (the tests).  The lowered functions move
into the module as private functions, one per distinct kernel, called at each site.
Each kernel declares the bytes it moves as its cost: XLA's cost analysis cannot see
inside it (BUILD_NOTES, "A kernel is priced by the bytes it reads and writes").
"""

from __future__ import annotations

import copy
import enum
import functools
import math
from typing import Any, Literal

from jax.extend.mlir import ir
from jax.extend.mlir.dialects import func

from equarx_pass import _jax_private
from equarx_pass.emission import packed_scales
from equarx_pass.ir.hlo_builder import Emitter, shape_of
from equarx_pass.ir.outline import fresh_symbol
from equarx_pass.platforms import named_by_jax, rules_for

ROWS, LANES = 8, 128  # one (8, 128) tile: eight blocks of one row
TILES_PER_STEP_TPU = 256  # a TPU grid step's tiles of int8 codes: 256 KiB
QMAX = 127.0
# Values a part of the kernel form holds where it splits an operand (parts_for): the
# temporary arrays of two-shot (the codes, the pieces received, the gathered sums) are
# then those of a part, not of the whole operand.
PART_BYTES = 64 << 20
CODEC_FLOPS = 12  # per value: magnitude, max, scale, clamp, round half to even
FLT_MAX = 3.4028234663852886e38

Target = Literal["tpu", "cuda", "interpret"]
# MLIR's element type names -> NumPy's (JAX's) dtype names.
_DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}
# The JAX platform each target lowers for.
_LOWERING_PLATFORM = {"tpu": "tpu", "cuda": "cuda", "interpret": "cpu"}


def target_for(compile_platform: str | None, form_platform: str) -> Target | str:
  """Where the kernel runs, or why there is no kernel.

  compile_platform: the JAX platform the program is compiled for (None: not known, as
  for a file, where the form's platform says); form_platform: the platform whose forms
  are emitted ("cpu", "tpu", "gpu")."""
  if not rules_for(form_platform).matmul_rotation:
    return f"the {form_platform} form's rotation is the model's butterflies"
  platform = compile_platform or form_platform
  rules = rules_for(named_by_jax(platform) or platform)
  if rules.kernel_target and (not rules.kernel_needs_own_forms or rules.name == form_platform):
    return rules.kernel_target
  return f"no kernel for {platform} with the {form_platform} form"


def format_why_not(format_name: str, stochastic: bool) -> str:
  """Why the kernels cannot take codes of this format and rounding ("": they can)."""
  if format_name != "int8" or stochastic:
    return f"the kernel has int8 with rounding to nearest only, not {format_name}" + (
      " with stochastic rounding" if stochastic else ""
    )
  return ""


def why_not(
  format_name: str,
  stochastic: bool,
  tile: tuple[int, ...],
  block_dims: int,
  rotation_size: int,
  matmul_rotation: bool,
) -> str:
  """Why the kernels cannot take a site whose chunks are `tile`s, rotated by
  `rotation_size` values (0: none), as a matmul or not ("": they can)."""
  why = format_why_not(format_name, stochastic)
  if not why and (block_dims != 1 or tuple(tile[-2:]) != (ROWS, LANES)):
    why = f"blocks of one {LANES}-value row in ({ROWS}, {LANES}) tiles only, not tiles {tile}"
  if not why and rotation_size not in (0, LANES):
    why = f"a rotation of {rotation_size} values, not {LANES}"
  if not why and rotation_size and not matmul_rotation:
    why = "the rotation is the model's butterflies"
  return why


def quantize_tiles(jnp, y, scales_by_diagonal: bool = False):
  """f32 [..., 8, 128] -> int8 codes of y's shape and f32 scales [..., 8] (one per row).

  A row's maximum lands in its own sublane; the scales leave as a row of lanes.  Moving
  them there as a reshape is a sublane gather, which Mosaic has on TPU v5e and later but
  not on v4 ("Sublane gather not supported by this TPU generation"), so on TPU
  (scales_by_diagonal) each tile's scales are broadcast along lanes and the diagonal
  taken with a max down the sublanes: the same bits, compiled for v4, v5e, v5p and v6e.
  Triton has no slices, and takes the reshape."""
  import jax

  magnitude = jnp.where(y != y, jnp.float32(jnp.inf), jnp.abs(y))
  scale = jnp.max(magnitude, axis=-1, keepdims=True) * jnp.float32(1 / QMAX)
  safe = jnp.where(scale > 0, scale, jnp.float32(1))
  inverse = jnp.minimum(jnp.float32(1) / safe, jnp.float32(FLT_MAX))
  v = jnp.clip(y * inverse, jnp.float32(-QMAX), jnp.float32(QMAX))
  r = jnp.floor(v + jnp.float32(0.5))
  tie = (r - v) == jnp.float32(0.5)
  odd = (r - jnp.float32(2) * jnp.floor(r * jnp.float32(0.5))) != 0
  r = jnp.where(tie & odd, r - jnp.float32(1), r)
  codes = jnp.where(r != r, jnp.float32(0), r).astype(jnp.int8)
  if not scales_by_diagonal:
    return codes, scale[..., 0]
  shape, rows, lanes = y.shape, len(y.shape) - 2, len(y.shape) - 1
  diagonal = jax.lax.broadcasted_iota(jnp.int32, shape, rows) == jax.lax.broadcasted_iota(
    jnp.int32, shape, lanes
  )
  along_lanes = jnp.where(diagonal, jnp.broadcast_to(scale, shape), jnp.float32(-jnp.inf))
  return codes, jnp.max(along_lanes, axis=-2)[..., : shape[-2]]


def step_tiles(target: Target, tiles: int, members: int = 1) -> int:
  """Tiles per grid step: about 256 KiB of int8 codes a step on TPU (fewer steps, each
  with a fixed cost), 16 tiles (128 rows) a program on a GPU (tools/bench_kernel.py's
  block); a power of two that divides `tiles`."""
  most = 16 if target == "cuda" else max(ROWS, TILES_PER_STEP_TPU // members)
  return math.gcd(tiles, most)


def shape_why_not(target: Target, tiles: int, members: int = 1, columns: int = 0) -> str:
  """Why a kernel over `tiles` tiles (in `columns` columns of the operand's tiles, 0: a
  flat run of them) cannot be lowered for `target` ("": it can)."""
  per_column = tiles // max(columns, 1)
  step = step_tiles(target, per_column, members)
  if target == "interpret" or step % ROWS == 0 or (not columns and step == tiles):
    return ""
  # A grid step's scales [step, 8] need whole sublane tiles (TPU) or a power of two of
  # rows (Triton).
  return f"{per_column} tiles of ({ROWS}, {LANES}) a column are not a multiple of {ROWS}"


Spec = tuple  # (shape, NumPy dtype name, block shape, index map of the grid's ids)


def _streamed(spec: Spec, steps: int) -> int:
  """Bytes a kernel moves through one operand or result: its blocks, once each (a block
  the same at every step, once; an array left where it is, not at all)."""
  import numpy as np

  shape, dtype, block, index = spec
  if index is None:
    return 0
  itemsize = np.dtype(dtype).itemsize
  if tuple(block) == tuple(shape):
    return math.prod(shape) * itemsize
  return math.prod(block) * itemsize * steps


def _codes_unrotated(jnp, q, rotation_refs, step: int):
  """A step's int8 codes [step, 8, 128] as f32, rotated back where `rotation_refs` (the
  Hadamard matrix's and the signs' refs) are given: codes are exact in bf16, their
  products with +-1 too, and the sums f32."""
  if rotation_refs is None:
    return q.astype(jnp.float32)
  h, signs = rotation_refs[0][...], rotation_refs[1][...]
  rows = q.reshape(step * ROWS, LANES).astype(jnp.bfloat16)
  y = jnp.dot(rows, h.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
  return y.reshape(step, ROWS, LANES) * signs


def _lower(
  target: Target,
  name: str,
  kernel,
  grid: tuple[int, ...],
  inputs,
  outputs,
  flops,
  aliases: dict[int, int] | None = None,
  rank: bool = False,
  scratch: tuple[tuple[tuple[int, ...], str], ...] = (),
) -> str:
  """pallas_call of `kernel` over `grid`, lowered for `target`: the StableHLO module's
  text.  inputs and outputs: a Spec per operand and result (a block shape that is a
  memory space: the whole array, left where it is); aliases: operand -> result written
  in place.  rank: the first operand is a scalar i32 [1] the index maps take after the
  grid's ids (scalar prefetch; TPU and the interpreter): the device's rank in its group,
  or the chunk a kernel of the permuted exchange works on.  scratch: (shape, dtype) of
  each VMEM buffer the kernel takes after its results (with rank only)."""
  import jax
  import jax.numpy as jnp
  from jax.experimental import pallas as pl

  def shapes(specs):
    return [jax.ShapeDtypeStruct(shape, jnp.dtype(dtype)) for shape, dtype, _, _ in specs]

  args, results = shapes(inputs), shapes(outputs)
  if rank:
    args = [jax.ShapeDtypeStruct((1,), jnp.int32), *args]
  # What the kernel reads and writes, which is what XLA's cost model knows of it: the
  # TPU compiler's estimate gives a Mosaic kernel without one a fixed cost whatever its
  # operands (3.02 us for 8 and 16 MiB alike).
  moved = sum(_streamed(spec, math.prod(grid)) for spec in [*inputs, *outputs])
  params = None
  if target == "cuda":
    from jax.experimental.pallas import triton as pallas_triton

    params = pallas_triton.CompilerParams()
  in_specs = [
    pl.BlockSpec(memory_space=block) if index is None else pl.BlockSpec(block, index)
    for _, _, block, index in inputs
  ]
  out_specs = [pl.BlockSpec(block, index) for _, _, block, index in outputs]
  layout: dict[str, Any]
  if rank:
    from jax.experimental.pallas import tpu as pltpu

    layout = dict(
      grid_spec=pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        scratch_shapes=[pltpu.VMEM(shape, jnp.dtype(dtype)) for shape, dtype in scratch],
      )
    )
  else:
    layout = dict(grid=grid, in_specs=in_specs, out_specs=out_specs)
  call = pl.pallas_call(
    kernel,
    **layout,
    input_output_aliases=aliases or {},
    out_shape=results,
    interpret=target == "interpret",
    compiler_params=params,
    name=name,
    cost_estimate=pl.CostEstimate(flops=flops, transcendentals=0, bytes_accessed=moved),
  )
  # Lowered with no mesh in scope: under a program's jax.set_mesh (explicit axes, as
  # jax.make_mesh gives them) JAX would shard the call over that mesh, and Mosaic refuses
  # a kernel it would have to partition.  The kernel runs on each device's share.
  with jax.set_mesh(None), _jax_private.lowering_for_gpu(target == "cuda"):
    traced = jax.jit(call).trace(*args)
    lowered = traced.lower(lowering_platforms=(_LOWERING_PLATFORM[target],))
  return lowered.as_text()


def _codes_specs(tiles: int, step: int) -> tuple[Spec, Spec]:
  """The specs of codes [tiles, 8, 128] int8 and their scales [tiles, 8] f32, a block
  `step` tiles, stepped along the tiles."""
  return (
    ((tiles, ROWS, LANES), "int8", (step, ROWS, LANES), lambda s: (s, 0, 0)),
    ((tiles, ROWS), "float32", (step, ROWS), lambda s: (s, 0)),
  )


class _Part:
  """Part `part` of `parts` of the values' tiles, in column-major tile order (with
  `columns`: a column's tiles top to bottom, then the next column's; else their order):
  the grid over it, `step` tiles a step, and the specs of its codes [part tiles, 8, 128],
  its scales [part tiles, 8] and the whole values array (a block: `step` tiles down one
  column, or `step` tiles)."""

  def __init__(self, target: Target, tiles: int, columns: int, part: int, parts: int):
    per_column = tiles // max(columns, 1)
    self.step = step = step_tiles(target, per_column)
    self.tiles = tiles // parts
    steps = self.tiles // step
    self.grid = (steps,)
    first = part * steps

    def values_index(s):
      if not columns:
        return (first + s, 0, 0)
      # lax's integer division and remainder: jnp's round towards -inf through a sign,
      # which Mosaic lowers only knowing the chip.
      from jax import lax

      t = (first + s) * step
      return (lax.div(lax.rem(t, per_column), step), lax.div(t, per_column))

    self.codes, self.scales = _codes_specs(self.tiles, step)
    self.values_shape = (per_column * ROWS, columns * LANES) if columns else (tiles, ROWS, LANES)
    self.values_block = (step * ROWS, LANES) if columns else (step, ROWS, LANES)
    self.values_index = values_index

  def values(self, dtype: str) -> Spec:
    return self.values_shape, dtype, self.values_block, self.values_index


@functools.cache
def quantize_module(
  target: Target,
  tiles: int,
  dtype: str,
  rotate: bool,
  columns: int = 0,
  part: int = 0,
  parts: int = 1,
) -> str:
  """The quantize kernel over part `part` of `parts` (_Part) of x of `dtype`, [tiles, 8,
  128] or with `columns` the operand's own rows [tiles / columns * 8, columns * 128] (and,
  rotating, the matrix [128, 128] of `dtype`), lowered: the part's codes [tiles / parts,
  8, 128] and scales [tiles / parts, 8].  After the first part the values written so far
  are an operand too, never read: it orders the parts (dequantize_module)."""
  import jax
  import jax.numpy as jnp
  from jax.experimental import pallas as pl

  element = _DTYPES[dtype]
  where = _Part(target, tiles, columns, part, parts)
  step = where.step
  precision = jax.lax.Precision.HIGHEST if element == "float32" else None

  def kernel(*refs):
    # rest: the matrix where rotating, then (after the first part) the values so far.
    x_ref, *rest, codes_ref, scales_ref = refs
    rows = x_ref[...].reshape(step * ROWS, LANES)
    if rotate:
      y = jnp.dot(rows, rest[0][...], preferred_element_type=jnp.float32, precision=precision)
    else:
      y = rows.astype(jnp.float32)
    codes_ref[...], scales_ref[...] = quantize_tiles(
      jnp, y.reshape(step, ROWS, LANES), target == "tpu"
    )

  inputs = [where.values(element)]
  if rotate:
    inputs.append(((LANES, LANES), element, (LANES, LANES), lambda s: (0, 0)))
  if part > 0:
    inputs.append((where.values_shape, element, pl.ANY, None))
  flops = where.tiles * ROWS * LANES * ((2 * LANES if rotate else 0) + CODEC_FLOPS)
  outputs = [where.codes, where.scales]
  return _lower(target, "equarx_quantize", kernel, where.grid, inputs, outputs, flops)


@functools.cache
def sum_module(target: Target, members: int, tiles: int) -> str:
  """The sum kernel over codes [members, tiles, 8, 128] int8 and scales [members, tiles,
  8] f32, lowered: the members' values summed in f32 in member order, as two-shot's
  emitted sum (the first term + 0, then each new term first: forms.plus_zero, forms.add),
  and quantized again: codes [tiles, 8, 128] and scales [tiles, 8]."""
  import jax
  import jax.numpy as jnp

  step = step_tiles(target, tiles, members)

  def kernel(codes_ref, scales_ref, codes_out, scales_out):
    def term(j):
      return codes_ref[j].astype(jnp.float32) * scales_ref[j][..., None]

    first = term(0)
    acc = jnp.where(first == 0, jnp.float32(0), first)
    acc = jax.lax.fori_loop(1, members, lambda j, acc: term(j) + acc, acc)
    codes_out[...], scales_out[...] = quantize_tiles(jnp, acc, target == "tpu")

  inputs = [
    ((members, tiles, ROWS, LANES), "int8", (members, step, ROWS, LANES), lambda i: (0, i, 0, 0)),
    ((members, tiles, ROWS), "float32", (members, step, ROWS), lambda i: (0, i, 0)),
  ]
  outputs = list(_codes_specs(tiles, step))
  flops = tiles * ROWS * LANES * (2 * members + CODEC_FLOPS)
  return _lower(target, "equarx_sum", kernel, (tiles // step,), inputs, outputs, flops)


@functools.cache
def dequantize_module(
  target: Target,
  tiles: int,
  dtype: str,
  rotate: bool,
  columns: int = 0,
  part: int = 0,
  parts: int = 1,
) -> str:
  """The dequantize kernel over part `part` of `parts`: its codes [tiles / parts, 8, 128]
  int8 and scales [tiles / parts, 8] f32 (and, rotating, H [128, 128] and the signs D as
  [8, 128], both f32), lowered: values of `dtype` in quantize_module's layout, ((q H) D) s
  or q s converted, as TiledSite's finish has them.  q H is exact (small integers), so it
  runs on bf16 inputs.  With several parts, the first part's kernel writes its blocks of
  a new values array (the others' are written later), and each later part's takes the
  values so far as its last operand and writes its part into it in place (the result
  aliases it).  So the operand is never copied, and every part's quantize waits for the
  part before it to finish: only one part's codes are alive at a time."""
  import jax.numpy as jnp
  from jax.experimental import pallas as pl

  element = _DTYPES[dtype]
  where = _Part(target, tiles, columns, part, parts)
  step = where.step

  def kernel(*refs):
    codes_ref, scales_ref, *rest = refs
    out_ref = rest[-1]
    y = _codes_unrotated(jnp, codes_ref[...], rest if rotate else None, step)
    values = (y * scales_ref[...][..., None]).astype(out_ref.dtype)
    out_ref[...] = values.reshape(out_ref.shape)

  inputs: list = [where.codes, where.scales]
  if rotate:
    inputs += [
      ((LANES, LANES), "float32", (LANES, LANES), lambda s: (0, 0)),
      ((ROWS, LANES), "float32", (ROWS, LANES), lambda s: (0, 0)),
    ]
  aliases = {}
  if part > 0:  # the values so far, written in place: never read here
    aliases = {len(inputs): 0}
    inputs.append((where.values_shape, element, pl.ANY, None))
  flops = where.tiles * ROWS * LANES * ((2 * LANES + 2) if rotate else 1)
  outputs = [where.values(element)]
  return _lower(target, "equarx_dequantize", kernel, where.grid, inputs, outputs, flops, aliases)


class KernelExchange(enum.Enum):
  """How the kernel form's two-shot moves its chunks between the kernels."""

  # An all-to-all of codes and one of scales, a sum kernel over the N pieces stacked,
  # two all-gathers: the TPU compiler makes them synchronous, nothing overlaps.
  COLLECTIVES = "all-to-all and all-gather"
  # N - 1 collective-permutes a phase, each of one chunk's codes with its scales packed
  # in (packed_scales.py); a quantize kernel per chunk, a sum kernel taking the N
  # received chunks as N operands, a dequantize kernel per gathered chunk writing it in
  # place: the compiler runs each permute under the next chunk's kernel.
  PERMUTES = "collective-permutes of packed chunks"


# The permuted exchange's sum kernel takes the N chunks as N operands, each
# double-buffered in VMEM, and the site sends 2 (N - 1) collective-permutes; 16 is the
# most compiled (v5e:4x4).
PERMUTE_MAX_MEMBERS = 16


def permuted_step(tiles: int, members: int, columns: int = 0, parts: int = 1) -> int:
  """Tiles per grid step of the permuted exchange's kernels (all three share it: it is
  the packed chunks' layout): a divisor of a chunk's tiles (of `parts` parts' N chunks
  each) and, with `columns`, of a column's; at most 256 KiB of codes, and 1 MiB over all
  the sum kernel's operands from 4 members on (the scales of each operand unpack into 4
  bytes a code: at 256 tiles a step, 16 members ran out of v5e's scoped VMEM)."""
  chunk = tiles // (members * parts)
  most = TILES_PER_STEP_TPU * 4 // max(members, 4)
  return math.gcd(chunk, tiles // max(columns, 1), most)


def permuted_why_not(
  target: Target, tiles: int, members: int, columns: int = 0, parts: int = 1
) -> str:
  """Why the permuted exchange cannot take `tiles` tiles over `members` ranks in `parts`
  parts ("": it can)."""
  return _permutes_why_not(target, members) or _steps_why_not(tiles, members, columns, parts)


def _permutes_why_not(target: Target, members: int) -> str:
  if target == "cuda":
    return "Triton kernels take no scalar operand for their index maps"
  if not 2 <= members <= PERMUTE_MAX_MEMBERS:
    return f"{members} members, not 2 to {PERMUTE_MAX_MEMBERS}"
  return ""


def _steps_why_not(tiles: int, members: int, columns: int, parts: int) -> str:
  if tiles % (members * parts):
    return f"{tiles} tiles are not {members * parts} chunks of whole tiles"
  step = permuted_step(tiles, members, columns, parts)
  if step % packed_scales.STEP_MULTIPLE:
    return f"steps of {step} tiles, not a multiple of {packed_scales.STEP_MULTIPLE}"
  return ""


def permuted_parts(
  target: Target, tiles: int, members: int, itemsize: int, columns: int = 0
) -> tuple[int, str]:
  """How many parts the permuted exchange takes `tiles` tiles of values in, one after
  the other, as the collectives' parts do (QuantizeKernels.parts_for): the fewest of at
  most PART_BYTES of values each (up to 64 times as many) whose chunks are whole steps of
  a multiple of 32 tiles; (0, why) where there are none."""
  why = _permutes_why_not(target, members)
  if why:
    return 0, why
  least = max(1, -(-tiles * ROWS * LANES * itemsize // PART_BYTES))
  for parts in range(least, min(tiles // members, 64 * least) + 1):
    if not _steps_why_not(tiles, members, columns, parts):
      return parts, ""
  why = _steps_why_not(tiles, members, columns, least)
  return 0, why if least == 1 else f"in {least} parts or more, {why}"


class _Chunk:
  """For the permuted exchange, a chunk of values of `tiles` tiles over `members` ranks
  (in `parts` parts), which one given at run time (the kernel's scalar operand): the
  values' spec (a block: `step` tiles down one column, or `step` tiles) and its packed
  chunk's.  The chunk is an operand, not part of the kernel, so that one kernel serves
  every chunk: libtpu compiles each distinct kernel of a program, and N of them made the
  exchange's compile grow with N."""

  def __init__(self, tiles: int, members: int, columns: int, parts: int = 1):
    from jax import lax

    # With parts, the chunks are numbered over all of them: part p's chunk c is p N + c.
    self.step = step = permuted_step(tiles, members, columns, parts)
    chunk = tiles // (members * parts)
    self.steps = steps = chunk // step
    per_column = tiles // max(columns, 1)

    def values_index(s, chunk):
      t = (chunk[0] * steps + s) * step
      if not columns:
        return (lax.div(t, step), 0, 0)
      return (lax.div(lax.rem(t, per_column), step), lax.div(t, per_column))

    self.values_shape = (per_column * ROWS, columns * LANES) if columns else (tiles, ROWS, LANES)
    self.values_block = (step * ROWS, LANES) if columns else (step, ROWS, LANES)
    self.values_index = values_index
    packed = step + packed_scales.scale_tiles(step)
    self.packed: Spec = (
      (steps * packed, ROWS, LANES),
      "int8",
      (packed, ROWS, LANES),
      lambda s, chunk: (s, 0, 0),
    )

  def values(self, dtype: str) -> Spec:
    return self.values_shape, dtype, self.values_block, self.values_index


def _rotated(jnp, x, matrix, precision):
  """x [step, 8, 128] (or the rows of a column) as f32 [step * 8, 128], times `matrix`
  where given."""
  rows = x.reshape(-1, LANES)
  if matrix is None:
    return rows.astype(jnp.float32)
  return jnp.dot(rows, matrix, preferred_element_type=jnp.float32, precision=precision)


@functools.cache
def quantize_permuted_module(
  target: Target,
  tiles: int,
  dtype: str,
  rotate: bool,
  columns: int,
  members: int,
  parts: int = 1,
  after: bool = False,
) -> str:
  """The permuted exchange's quantize kernel: of x (quantize_module's layouts), the chunk
  its scalar operand names (of `members` a part, `parts` parts), quantized as
  quantize_module does and packed (packed_scales.py): int8 [chunk tiles + chunk tiles /
  32, 8, 128].  `after`: the values the parts before wrote are an operand too, never
  read: the part waits for them."""
  import jax
  import jax.numpy as jnp
  from jax.experimental import pallas as pl

  element = _DTYPES[dtype]
  where = _Chunk(tiles, members, columns, parts)
  step = where.step
  precision = jax.lax.Precision.HIGHEST if element == "float32" else None

  def kernel(chunk_ref, x_ref, *rest):
    out_ref = rest[-1]
    y = _rotated(jnp, x_ref[...], rest[0][...] if rotate else None, precision)
    codes, scales = quantize_tiles(jnp, y.reshape(step, ROWS, LANES), target == "tpu")
    out_ref[pl.ds(0, step)] = codes
    out_ref[pl.ds(step, packed_scales.scale_tiles(step))] = packed_scales.pack(jax, scales)

  inputs = [where.values(element)]
  if rotate:
    inputs.append(((LANES, LANES), element, (LANES, LANES), lambda s, chunk: (0, 0)))
  if after:
    inputs.append((where.values_shape, element, pl.ANY, None))
  chunk = tiles // (members * parts)
  flops = chunk * ROWS * LANES * ((2 * LANES if rotate else 0) + CODEC_FLOPS)
  name = "equarx_quantize"
  return _lower(target, name, kernel, (where.steps,), inputs, [where.packed], flops, rank=True)


@functools.cache
def sum_permuted_module(
  target: Target, tiles: int, members: int, columns: int, parts: int = 1
) -> str:
  """The permuted exchange's sum kernel: the `members` packed chunks received, the one
  in operand s from rank (rank - s) % members, summed as sum_module sums (in group order:
  the j-th term is operand (rank - j) % members, chosen at run time) and packed again.

  The operand is chosen inside a loop and each term added to a VMEM buffer of the sum so
  far, so the kernel holds each operand's read twice (the first term, the rest): a
  branch per rank with its own order held members^2 reads and the quantize members
  times, and took libtpu 20 s to compile over 16 members (1.5 s in one order).  (A
  lax.switch returning the term crashed libtpu's compile.)"""
  import jax
  import jax.numpy as jnp
  from jax.experimental import pallas as pl

  where = _Chunk(tiles, members, columns, parts)
  step, extra = where.step, packed_scales.scale_tiles(where.step)

  def kernel(rank_ref, *refs):
    received, (out_ref, acc_ref) = refs[:members], refs[members:]

    def add(source, first: bool):
      """The term of operand `source` (a traced index) added to acc_ref, in one
      expression with the product as the other forms have it."""
      for s, ref in enumerate(received):

        @pl.when(source == s)
        def _(ref=ref):
          scales = packed_scales.unpack(jax, ref[pl.ds(step, extra)], step)
          term = ref[pl.ds(0, step)].astype(jnp.float32) * scales
          if first:
            acc_ref[...] = jnp.where(term == 0, jnp.float32(0), term)
          else:
            acc_ref[...] = term + acc_ref[...]

    def later(j, carry):
      add(jax.lax.rem(rank_ref[0] - j + members, members), first=False)
      return carry

    add(rank_ref[0], first=True)
    jax.lax.fori_loop(1, members, later, 0)
    codes, scales = quantize_tiles(jnp, acc_ref[...], target == "tpu")
    out_ref[pl.ds(0, step)] = codes
    out_ref[pl.ds(step, extra)] = packed_scales.pack(jax, scales)

  chunk = tiles // (members * parts)
  flops = chunk * ROWS * LANES * (2 * members + CODEC_FLOPS)
  inputs = [where.packed] * members
  buffers = (((step, ROWS, LANES), "float32"),)  # the sum so far
  return _lower(
    target,
    "equarx_sum",
    kernel,
    (where.steps,),
    inputs,
    [where.packed],
    flops,
    rank=True,
    scratch=buffers,
  )


@functools.cache
def dequantize_permuted_module(
  target: Target,
  tiles: int,
  dtype: str,
  rotate: bool,
  columns: int,
  members: int,
  into: bool,
  parts: int = 1,
) -> str:
  """The permuted exchange's dequantize kernel for a packed chunk, the chunk its scalar
  operand names: dequantized as dequantize_module does, written into its place of the
  values (quantize_module's layouts).  The first (this rank's own) makes the values
  array; each later one (`into`) takes it as its last operand and writes its chunk in
  place (the result aliases it), so it runs as soon as its chunk arrives."""
  import jax
  import jax.numpy as jnp
  from jax.experimental import pallas as pl

  element = _DTYPES[dtype]
  where = _Chunk(tiles, members, columns, parts)
  step, extra = where.step, packed_scales.scale_tiles(where.step)

  def kernel(chunk_ref, packed_ref, *rest):
    out_ref = rest[-1]
    y = _codes_unrotated(jnp, packed_ref[pl.ds(0, step)], rest if rotate else None, step)
    scales = packed_scales.unpack(jax, packed_ref[pl.ds(step, extra)], step)
    out_ref[...] = (y * scales).astype(out_ref.dtype).reshape(out_ref.shape)

  inputs: list = [where.packed]
  if rotate:
    inputs += [
      ((LANES, LANES), "float32", (LANES, LANES), lambda s, chunk: (0, 0)),
      ((ROWS, LANES), "float32", (ROWS, LANES), lambda s, chunk: (0, 0)),
    ]
  aliases = {}
  if into:  # the values so far, written in place: never read here
    aliases = {1 + len(inputs): 0}  # (after the chunk)
    inputs.append((where.values_shape, element, pl.ANY, None))
  chunk = tiles // (members * parts)
  flops = chunk * ROWS * LANES * ((2 * LANES + 2) if rotate else 1)
  outputs = [where.values(element)]
  return _lower(
    target, "equarx_dequantize", kernel, (where.steps,), inputs, outputs, flops, aliases, rank=True
  )


def _chunk_of(em: Emitter, rank: ir.Value, k: int, members: int, part: int = 0) -> ir.Value:
  """Part `part`'s chunk (rank + k) % members, numbered over all parts (part * members +
  it), i32 [1] as rank: a permuted kernel's scalar operand."""
  if k == 0 and part == 0:
    return rank
  chunk = em.mod(em.add_i32(em.reshape(rank, ()), k), members)
  return em.reshape(em.add_i32(chunk, part * members) if part else chunk, (1,))


class QuantizeKernels:
  """The kernels a module calls: each distinct one lowered once and moved into `module`
  as private functions.  `notes` has one entry per kernel asked for, (its stage, "" where
  the kernel ran, else why not), and ("parts", how many) for a site taken in parts: each
  site is emitted with a view of its own (for_site), whose notes site_records.py puts in
  the site's report."""

  def __init__(self, module: ir.Module, target: Target):
    self.module, self.target = module, target
    self._symbols: dict[tuple, str] = {}
    self.notes: list[tuple[str, str]] = []

  def for_site(self) -> QuantizeKernels:
    """A view for one site: the same module and kernels (each lowered once), notes of its
    own."""
    view = copy.copy(self)  # shares _symbols
    view.notes = []
    return view

  def why_not(self, tiles: int, element: str, columns: int = 0) -> str:
    """Why the quantize and dequantize kernels cannot take `tiles` tiles of `element`
    values (in `columns` columns of the operand's tiles) ("": they can)."""
    if element not in _DTYPES or (self.target == "tpu" and element == "f16"):
      return f"no {element} kernel for {self.target}"  # a TPU has no f16 arithmetic
    return shape_why_not(self.target, tiles, columns=columns)

  def parts_for(self, tiles: int, members: int, itemsize: int, columns: int) -> int:
    """How many parts the kernels take `tiles` tiles of values in, one after the other,
    so that a part's codes, the pieces received and the gathered sums stay a fraction of
    the operand: the fewest parts of at most PART_BYTES of values each, else the most
    there can be.  A part is whole steps of every kernel and N chunks of whole steps; 1
    where no split fits the tiles."""
    least = -(-tiles * ROWS * LANES * itemsize // PART_BYTES)
    if least <= 1:
      return 1
    step = step_tiles(self.target, tiles // max(columns, 1))

    def fits(parts: int) -> bool:
      part = tiles // parts
      return (
        tiles % parts == 0
        and part % step == 0
        and part % members == 0
        and not shape_why_not(self.target, part // members, members)
      )

    feasible = [p for p in range(2, tiles + 1) if fits(p)]
    enough = [p for p in feasible if p >= least]
    return enough[0] if enough else max(feasible, default=1)

  def quantize(
    self,
    em: Emitter,
    x: ir.Value,
    matrix: ir.Value | None,
    columns: int = 0,
    part: int = 0,
    parts: int = 1,
    after: ir.Value | None = None,
  ) -> tuple[ir.Value, ir.Value] | None:
    """Codes [tiles, 8, 128] int8 and scales [tiles, 8] f32 of x (rotated by `matrix`
    first where given): x [..., 8, 128], or with `columns` the operand's own rows [rows,
    columns * 128], its tiles in column-major order; of part `part` of `parts` of the
    tiles only (tiles / parts of them), `after` the values the parts before wrote (an
    order, not an input).  None where the kernel cannot (noted)."""
    shape = shape_of(x)
    tiles = math.prod(shape) // (ROWS * LANES)
    element = str(ir.RankedTensorType(x.type).element_type)
    why = self.why_not(tiles, element, columns)
    self.notes.append(("quantize", why))
    if why:
      return None
    rotate = matrix is not None
    key = ("quantize", (tiles,), element, rotate, columns, part, parts)
    flat = x if columns else em.reshape(x, (tiles, ROWS, LANES))
    codes, scales = self._call(
      em,
      key,
      lambda: quantize_module(self.target, tiles, element, rotate, columns, part, parts),
      [flat]
      + ([matrix] if matrix is not None else [])
      + ([after] if part > 0 and after is not None else []),
      tiles // parts,
    )
    return codes, scales

  def sum_quantize(
    self, em: Emitter, codes: ir.Value, scales: ir.Value
  ) -> tuple[ir.Value, ir.Value] | None:
    """The N pieces' codes [N, ..., 8, 128] and scales [N, ..., 8] summed and quantized
    again: codes [..., 8, 128] and scales [..., 8]; None where the kernel cannot (noted)."""
    shape = shape_of(codes)
    members, tiles = shape[0], math.prod(shape[1:-2])
    why = shape_why_not(self.target, tiles, members)
    self.notes.append(("sum", why))
    if why:
      return None
    key = ("sum", (members, tiles), "i8", False, 0, 0, 1)
    operands = [
      em.reshape(codes, (members, tiles, ROWS, LANES)),
      em.reshape(scales, (members, tiles, ROWS)),
    ]
    summed, summed_scales = self._call(
      em, key, lambda: sum_module(self.target, members, tiles), operands, tiles
    )
    return em.reshape(summed, shape[1:]), em.reshape(summed_scales, shape[1:-1])

  def dequantize(
    self,
    em: Emitter,
    codes: ir.Value,
    scales: ir.Value,
    element: ir.Type,
    rotation: tuple[ir.Value, ir.Value] | None,
    columns: int = 0,
    into: ir.Value | None = None,
    part: int = 0,
    parts: int = 1,
  ) -> ir.Value | None:
    """Codes [..., 8, 128] and scales [..., 8] -> values of `element` rotated back by
    rotation = (H, the signs as [8, 128]) where given: [tiles, 8, 128], or with `columns`
    the operand's own rows [tiles / columns * 8, columns * 128] (quantize's layouts).
    With `parts`, the codes are part `part`'s and its values are written into `into`
    (the whole values array so far), which comes back.  None where the kernel cannot
    (noted)."""
    shape = shape_of(codes)
    tiles = math.prod(shape[:-2]) * parts
    name = str(element)
    why = self.why_not(tiles, name, columns)
    self.notes.append(("dequantize", why))
    if why:
      return None
    rotate = rotation is not None
    key = ("dequantize", (tiles,), name, rotate, columns, part, parts)
    out = (tiles // columns * ROWS, columns * LANES) if columns else (tiles, ROWS, LANES)
    operands = [
      em.reshape(codes, (tiles // parts, ROWS, LANES)),
      em.reshape(scales, (tiles // parts, ROWS)),
      *(rotation or ()),
      *([em.reshape(into, out)] if part > 0 and into is not None else []),
    ]
    (values,) = self._call(
      em,
      key,
      lambda: dequantize_module(self.target, tiles, name, rotate, columns, part, parts),
      operands,
      [ir.RankedTensorType.get(out, element)],
    )
    return values

  def permuted_parts(
    self, tiles: int, members: int, element: str, itemsize: int, columns: int = 0
  ) -> tuple[int, str]:
    """The parts the permuted exchange's kernels take `tiles` tiles of `element` values
    over `members` ranks in, or (0, why they cannot): permuted_parts."""
    why = self.why_not(tiles, element, columns)
    if why:
      return 0, why
    return permuted_parts(self.target, tiles, members, itemsize, columns)

  def _packed_type(
    self, em: Emitter, tiles: int, members: int, columns: int, parts: int
  ) -> ir.Type:
    where = _Chunk(tiles, members, columns, parts)
    return ir.RankedTensorType.get(where.packed[0], em.i8)

  def quantize_permuted(
    self,
    em: Emitter,
    x: ir.Value,
    matrix: ir.Value | None,
    rank: ir.Value,
    members: int,
    columns: int = 0,
    part: int = 0,
    parts: int = 1,
    after: ir.Value | None = None,
  ) -> list[ir.Value]:
    """Part `part`'s chunks of x quantized and packed, one call each of one kernel: the
    k-th is the part's chunk (rank + k) % members, the one to send k places on, `after`
    the values the parts before wrote (an order, not an input).  x and `columns` as
    quantize's; rank i32 [1]."""
    tiles = math.prod(shape_of(x)) // (ROWS * LANES)
    element = str(ir.RankedTensorType(x.type).element_type)
    rotate = matrix is not None
    flat = x if columns else em.reshape(x, (tiles, ROWS, LANES))
    packed = self._packed_type(em, tiles, members, columns, parts)
    self.notes.append(("quantize", ""))
    follows = after if part > 0 else None
    key = ("quantize", (tiles,), element, rotate, columns, int(follows is not None), parts)
    lowered = functools.partial(
      quantize_permuted_module,
      self.target,
      tiles,
      element,
      rotate,
      columns,
      members,
      parts,
      follows is not None,
    )
    name = f"_chunk_of_{members}" + ("_after" if follows is not None else "")
    chunks = []
    for k in range(members):
      operands = [_chunk_of(em, rank, k, members, part), flat]
      operands += [matrix] if matrix is not None else []
      operands += [follows] if follows is not None else []
      (chunk,) = self._call(em, key, lowered, operands, [packed], name)
      chunks.append(chunk)
    return chunks

  def sum_permuted(
    self,
    em: Emitter,
    received: list[ir.Value],
    rank: ir.Value,
    tiles: int,
    columns: int = 0,
    parts: int = 1,
  ) -> ir.Value:
    """The packed chunks received (operand s from s ranks back) summed in group order and
    packed again, one kernel."""
    members = len(received)
    key = ("sum", (members, tiles), "i8", False, columns, 0, parts)
    self.notes.append(("sum", ""))
    (summed,) = self._call(
      em,
      key,
      functools.partial(sum_permuted_module, self.target, tiles, members, columns, parts),
      [rank, *received],
      [self._packed_type(em, tiles, members, columns, parts)],
      "_permuted",
    )
    return summed

  def dequantize_permuted(
    self,
    em: Emitter,
    gathered: list[ir.Value],
    rank: ir.Value,
    tiles: int,
    element: ir.Type,
    rotation: tuple[ir.Value, ir.Value] | None,
    columns: int = 0,
    part: int = 0,
    parts: int = 1,
    into: ir.Value | None = None,
  ) -> ir.Value:
    """Part `part`'s packed chunks gathered (the k-th from k ranks back, the part's chunk
    (rank - k) % members) -> values of `element` in quantize's layout, one call a chunk,
    each writing into the values the one before wrote (or `into`, the parts before's)."""
    members = len(gathered)
    name = str(element)
    rotate = rotation is not None
    out = (tiles // columns * ROWS, columns * LANES) if columns else (tiles, ROWS, LANES)
    self.notes.append(("dequantize", ""))
    values = into
    for k, chunk in enumerate(gathered):
      written = values is not None
      key = ("dequantize", (tiles,), name, rotate, columns, int(written), parts)
      lowered = functools.partial(
        dequantize_permuted_module,
        self.target,
        tiles,
        name,
        rotate,
        columns,
        members,
        written,
        parts,
      )
      operands = [_chunk_of(em, rank, -k, members, part), chunk, *(rotation or ())]
      (values,) = self._call(
        em,
        key,
        lowered,
        operands + ([values] if values is not None else []),
        [ir.RankedTensorType.get(out, element)],
        f"_chunk_{'into' if written else 'new'}_of_{members}",
      )
    assert values is not None
    return values

  def _call(
    self,
    em: Emitter,
    key: tuple,
    lowered,
    operands: list[ir.Value],
    types,
    permuted: str = "",
  ):
    """A call of the kernel `key` (its module from lowered(), moved in on first use):
    its results, of `types` (default: codes [tiles, 8, 128] and scales [tiles, 8] for
    an int: tiles).  permuted: the name's end for a kernel of the permuted exchange."""
    key = (*key, permuted)
    if key not in self._symbols:
      stage, dims, element, rotated, columns, part, parts, _ = key
      shape = "x".join(str(d) for d in (*dims, ROWS, LANES))
      name = f"equarx_{stage}_{self.target}_{shape}x{element}" + ("_rotated" if rotated else "")
      name += f"_in_{columns}_columns" if columns else ""
      if permuted:
        name += permuted
      elif parts > 1:
        name += f"_part_{part + 1}_of_{parts}"
      self._symbols[key] = self._move_in(lowered(), name)
    if isinstance(types, int):
      types = [
        ir.RankedTensorType.get((types, ROWS, LANES), em.i8),
        ir.RankedTensorType.get((types, ROWS), em.f32),
      ]
    call = func.CallOp(types, ir.FlatSymbolRefAttr.get(self._symbols[key]), operands)
    return call.results

  def _move_in(self, text: str, base: str) -> str:
    """Parse JAX's module, give its functions names free in self.module, make them
    private and move them in; the name its main function now has."""
    lowered = ir.Module.parse(text, context=self.module.context)
    functions = [op for op in lowered.body.operations if op.operation.name == "func.func"]
    renamed: dict[str, str] = {}
    for op in functions:
      old = ir.StringAttr(op.attributes["sym_name"]).value
      name = base if old == "main" else f"{base}_{old}"
      new = fresh_symbol(self.module, name, taken=set(renamed.values()))
      ir.SymbolTable.replace_all_symbol_uses(old, new, lowered.operation)
      renamed[old] = new
    for op in functions:
      old = ir.StringAttr(op.attributes["sym_name"]).value
      op.attributes["sym_name"] = ir.StringAttr.get(renamed[old])
      op.attributes["sym_visibility"] = ir.StringAttr.get("private")
      for attribute in ("arg_attrs", "res_attrs"):  # jax.result_info and the like
        if attribute in op.attributes:
          del op.attributes[attribute]
      self.module.body.append(op.operation)
    return renamed["main"]
