"""build: turn a ring plan (equarx_pass.ring) into StableHLO ops.

The schedule (source-target pairs, chunk indices, layout) is computed in plain
NumPy by ring.py; this module only emits ops for it, with the dialect's Python
op builders, at the insertion point of the all-reduce it replaces.

Emitted shape of one site (N ranks, chunk C, P payload bytes per chunk):

  x:[N,C] f32 = reshape(pad(concat(convert_f32(reshape(operand_i)))))
  rank        = dynamic_slice(rank_table, partition_id or replica_id)
  while s < N-1 (reduce-scatter):    partial = dq(permute(q(partial))) + x[(rank-s-1) mod N]
  own:[P] i8  = q(partial)           the one final quantization
  while s < N-1 (all-gather):        cur = permute(cur); out[(rank-s) mod N] = cur
  result_i    = convert_T(reshape(slice(dq(out))))

Two loops per site, whatever the group size, keep the module small: the paper's
"full-loop" ring.  q() packs int8 values and the f32 scales (as bytes) into one
int8 payload so that every ring step is a single collective_permute.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass import quantize as qz
from equarx_pass import ring

# stablehlo ChannelHandle type 1 = DEVICE_TO_DEVICE, what JAX gives ppermute.
DEVICE_TO_DEVICE = 1


class ChannelAllocator:
  """Hands out channel handles above every handle already in the module."""

  def __init__(self, highest_in_use: int):
    self._next = highest_in_use + 1

  def new(self) -> int:
    handle, self._next = self._next, self._next + 1
    return handle


@dataclasses.dataclass(frozen=True)
class RingPlan:
  layout: ring.ChunkLayout
  schedule: ring.RingSchedule
  device_kind: str          # "partition" (permutes carry a channel) or "replica"
  num_devices: int


def _tensor(shape, element_type) -> ir.RankedTensorType:
  return ir.RankedTensorType.get(list(shape), element_type)


class _Emitter:
  """Small typed helpers over the op builders; every value is a ranked tensor."""

  def __init__(self):
    self.f32 = ir.F32Type.get()
    self.i8 = ir.IntegerType.get_signless(8)
    self.i32 = ir.IntegerType.get_signless(32)

  # constants
  def const(self, array: np.ndarray, element_type) -> ir.Value:
    array = np.ascontiguousarray(array)
    attr = ir.DenseElementsAttr.get(array, type=_tensor(array.shape, element_type))
    return hlo.ConstantOp(attr).result

  def splat(self, value, shape, element_type) -> ir.Value:
    t = _tensor(shape, element_type)
    scalar = (ir.FloatAttr.get(element_type, float(value))
              if isinstance(element_type, ir.FloatType)
              else ir.IntegerAttr.get(element_type, int(value)))
    return hlo.ConstantOp(ir.DenseElementsAttr.get_splat(t, scalar)).result

  def i32_scalar(self, value: int) -> ir.Value:
    return self.splat(value, (), self.i32)

  # shape ops
  def reshape(self, x, shape) -> ir.Value:
    return hlo.ReshapeOp(_tensor(shape, ir.RankedTensorType(x.type).element_type), x).result

  def convert(self, x, element_type) -> ir.Value:
    t = ir.RankedTensorType(x.type)
    if t.element_type == element_type:
      return x
    return hlo.ConvertOp(_tensor(t.shape, element_type), x).result

  def slice(self, x, start, limit) -> ir.Value:
    return hlo.SliceOp(x, list(start), list(limit), [1] * len(start)).result

  def dynamic_row(self, x, row, width) -> ir.Value:
    """x[row, :] of a 2-D x, as a 1-D tensor of `width`."""
    zero = self.i32_scalar(0)
    t = ir.RankedTensorType(x.type)
    sl = hlo.DynamicSliceOp(x, [row, zero], [1, width],
                            results=[_tensor((1, width), t.element_type)]).result
    return self.reshape(sl, (width,))

  def set_row(self, x, row, value) -> ir.Value:
    t = ir.RankedTensorType(value.type)
    upd = self.reshape(value, (1,) + tuple(t.shape))
    return hlo.DynamicUpdateSliceOp(x, upd, [row, self.i32_scalar(0)]).result

  def mod(self, x, n: int) -> ir.Value:
    """(x + n) mod n for x >= -n, on i32 scalars (rem alone keeps the sign)."""
    return hlo.RemOp(hlo.AddOp(x, self.i32_scalar(n)).result, self.i32_scalar(n)).result

  def bcast(self, x, shape, dims) -> ir.Value:
    t = ir.RankedTensorType(x.type)
    return hlo.BroadcastInDimOp(_tensor(shape, t.element_type), x, list(dims)).result

  # quantization: the ops of quantize.py, in its order
  def quantize(self, x, layout: ring.ChunkLayout, fmt: qz.Int8Format) -> ir.Value:
    """f32[C] -> int8 payload [C + 4 * blocks]: values then scale bytes."""
    nb, b = layout.blocks, layout.block
    blocks = self.reshape(x, (nb, b))
    # Qp1: block metadata.
    amax = _reduce_max(hlo.AbsOp(blocks).result, self.splat(0, (), self.f32), self.f32)
    scale = hlo.MulOp(amax, self.splat(qz.inverse(fmt.qmax), (nb,), self.f32)).result
    positive = hlo.CompareOp(scale, self.splat(0, (nb,), self.f32),
                             hlo.ComparisonDirectionAttr.get("GT")).result
    safe = hlo.SelectOp(positive, scale, self.splat(1, (nb,), self.f32)).result
    # Qp2: scale and cast.
    scaled = hlo.DivOp(blocks, self.bcast(safe, (nb, b), [0])).result
    rounded = hlo.RoundNearestEvenOp(scaled).result
    clamped = hlo.ClampOp(self.splat(-fmt.qmax, (), self.f32), rounded,
                          self.splat(fmt.qmax, (), self.f32)).result
    q = self.reshape(self.convert(clamped, self.i8), (nb * b,))
    scale_bytes = hlo.BitcastConvertOp(_tensor((nb, 4), self.i8), scale).result
    return hlo.ConcatenateOp([q, self.reshape(scale_bytes, (nb * 4,))], 0).result

  def dequantize(self, payload, rows: int, layout: ring.ChunkLayout) -> ir.Value:
    """int8 payload [rows, C + 4 * blocks] -> f32 [rows * C]."""
    nb, b, c = layout.blocks, layout.block, layout.chunk
    q = self.slice(payload, (0, 0), (rows, c))
    scale_bytes = self.reshape(self.slice(payload, (0, c), (rows, c + 4 * nb)), (rows * nb, 4))
    scale = hlo.BitcastConvertOp(_tensor((rows * nb,), self.f32), scale_bytes).result
    values = self.convert(self.reshape(q, (rows * nb, b)), self.f32)
    out = hlo.MulOp(values, self.bcast(scale, (rows * nb, b), [0])).result
    return self.reshape(out, (rows * c,))


def _reduce_max(x, init, element_type) -> ir.Value:
  """max over the last axis of a 2-D tensor."""
  t = ir.RankedTensorType(x.type)
  op = hlo.ReduceOp([_tensor(t.shape[:1], element_type)], [x], [init], [1])
  scalar = _tensor((), element_type)
  block = op.body.blocks.append(scalar, scalar)
  with ir.InsertionPoint(block):
    hlo.ReturnOp([hlo.MaxOp(block.arguments[0], block.arguments[1]).result])
  return op.result


def _while(init: list[ir.Value], trip_count: int, body_fn) -> list[ir.Value]:
  """for s in range(trip_count): carry = body_fn(s, *carry).  s is the first carry."""
  em = _Emitter()
  operands = [em.i32_scalar(0)] + list(init)
  types = [v.type for v in operands]
  op = hlo.WhileOp(types, operands)
  cond = op.cond.blocks.append(*types)
  with ir.InsertionPoint(cond):
    lt = hlo.CompareOp(cond.arguments[0], em.i32_scalar(trip_count),
                       hlo.ComparisonDirectionAttr.get("LT")).result
    hlo.ReturnOp([lt])
  body = op.body.blocks.append(*types)
  with ir.InsertionPoint(body):
    step = body.arguments[0]
    new = body_fn(step, *body.arguments[1:])
    nxt = hlo.AddOp(step, em.i32_scalar(1)).result
    hlo.ReturnOp([nxt] + list(new))
  return list(op.results)[1:]


def emit_ring_allreduce(operands: list[ir.Value], plan: RingPlan,
                        channels: ChannelAllocator,
                        fmt: qz.Int8Format = qz.FORMATS["int8"]) -> list[ir.Value]:
  """Emit the quantized ring for `operands` at the current insertion point.

  Returns one value per operand with the operand's type.
  """
  em = _Emitter()
  layout, sched = plan.layout, plan.schedule
  n, c = layout.group_size, layout.chunk
  payload_len = fmt.payload_bytes(c, layout.blocks)
  pairs = np.array(sched.source_target_pairs(), np.int64).reshape(-1, 2)

  def permute(x):
    kwargs = {}
    if plan.device_kind == "partition":
      kwargs["channel_handle"] = hlo.ChannelHandle.get(channels.new(), DEVICE_TO_DEVICE)
    attr = ir.DenseIntElementsAttr.get(pairs, type=_tensor(pairs.shape, ir.IntegerType.get_signless(64)))
    return hlo.CollectivePermuteOp(x, attr, **kwargs).result

  # Flatten every operand to f32 and lay them out as N chunks.
  types = [ir.RankedTensorType(v.type) for v in operands]
  flat = [em.reshape(em.convert(v, em.f32), (int(np.prod(t.shape, dtype=np.int64)),))
          for v, t in zip(operands, types)]
  x = flat[0] if len(flat) == 1 else hlo.ConcatenateOp(flat, 0).result
  pad = layout.padded - layout.num_values
  if pad:
    x = hlo.PadOp(x, em.splat(0, (), em.f32), [0], [pad], [0]).result
  chunks = em.reshape(x, (n, c))

  # This device's position in its group.
  device = (hlo.PartitionIdOp() if plan.device_kind == "partition" else hlo.ReplicaIdOp()).result
  device = em.reshape(em.convert(device, em.i32), (1,))
  table = em.const(sched.rank_table(plan.num_devices), em.i32)
  rank = em.reshape(hlo.DynamicSliceOp(table, [em.reshape(device, ())], [1],
                                       results=[_tensor((1,), em.i32)]).result, ())

  # Reduce-scatter: N-1 steps of quantize -> permute -> dequantize -> f32 add.
  def rs_step(step, partial, chunks_, rank_):
    received = permute(em.quantize(partial, layout, fmt))
    idx = em.mod(hlo.SubtractOp(hlo.SubtractOp(rank_, step).result, em.i32_scalar(1)).result, n)
    local = em.dynamic_row(chunks_, idx, c)
    return [hlo.AddOp(em.dequantize(em.reshape(received, (1, payload_len)), 1, layout),
                      local).result, chunks_, rank_]

  partial = em.dynamic_row(chunks, rank, c)
  partial, _, _ = _while([partial, chunks, rank], n - 1, rs_step)

  # Final quantization, once; then the all-gather forwards bytes unchanged.
  own = em.quantize(partial, layout, fmt)
  gathered = em.set_row(em.splat(0, (n, payload_len), em.i8), em.mod(
      hlo.AddOp(rank, em.i32_scalar(1 - n)).result, n), own)

  def ag_step(step, current, gathered_, rank_):
    current = permute(current)
    idx = em.mod(hlo.SubtractOp(rank_, step).result, n)
    return [current, em.set_row(gathered_, idx, current), rank_]

  _, gathered, _ = _while([own, gathered, rank], n - 1, ag_step)

  # Every rank dequantizes all N chunks the same way: identical bits everywhere.
  values = em.dequantize(gathered, n, layout)
  results, offset = [], 0
  for t in types:
    size = int(np.prod(t.shape, dtype=np.int64))
    piece = em.slice(values, (offset,), (offset + size,))
    results.append(em.convert(em.reshape(piece, t.shape), t.element_type))
    offset += size
  return results
