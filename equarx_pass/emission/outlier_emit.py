"""The calibrated outlier-feature scheme of outlier.py, emitted, and the statistics
that calibration records (calibrate.py).

outlier.reference is the model, op for op: a two-shot all-reduce of int4 codes with
static per-feature scales, the outlier features in bf16 beside them.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass.emission import outlier
from equarx_pass.emission.quantize_emit import pack_int4, unpack_int4
from equarx_pass.ir.hlo_builder import (
  ChannelAllocator,
  Collectives,
  Emitter,
  reduce,
  shape_of,
  while_loop,
)
from equarx_pass.ir.layout import DeviceKind, GroupSchedule


@dataclasses.dataclass(frozen=True)
class CalibratedPlan:
  """One site's calibrated two-shot: the layout and every group's static scales.

  Tables are indexed by group (group_of_device[device id]) and, for the input
  scales, by the sender's rank in its group; columns are the int4 features in
  wire order (outlier.OutlierLayout.normal).
  """

  layout: outlier.OutlierLayout
  schedule: GroupSchedule
  device_kind: DeviceKind
  num_devices: int
  in_scale: np.ndarray  # f32 [G, N, H - k]
  in_reciprocal: np.ndarray  # f32 [G, N, H - k]
  out_scale: np.ndarray  # f32 [G, H - k]
  out_reciprocal: np.ndarray  # f32 [G, H - k]

  def group_table(self) -> np.ndarray:
    """group_table[device id] = index of the device's group (-1: in none)."""
    table = np.full(self.num_devices, -1, np.int32)
    for g, members in enumerate(self.schedule.groups):
      table[list(members)] = g
    return table


class _SumCarry(NamedTuple):
  acc: ir.Value  # f32 [R, H - k]: the int4 features' sum so far
  acc_hot: ir.Value  # f32 [R, max(k, 1)]: the bf16 outlier features' sum
  received: ir.Value  # int8 [N, P]: row j from rank j
  in_scale: ir.Value  # f32 [N, H - k]: each sender's static scales


def _take_columns(em: Emitter, x, columns) -> ir.Value:
  """x[:, columns] of a 2-D tensor, `columns` a static index list (one gather)."""
  rows, _ = shape_of(x)
  indices = em.const(np.asarray(columns, np.int32).reshape(-1, 1), em.i32)
  dims = hlo.GatherDimensionNumbers.get(
    offset_dims=[0],
    collapsed_slice_dims=[1],
    operand_batching_dims=[],
    start_indices_batching_dims=[],
    start_index_map=[1],
    index_vector_dim=1,
  )
  return hlo.GatherOp(
    x, indices, dims, ir.DenseI64ArrayAttr.get([rows, 1]), indices_are_sorted=False
  ).result


def _static_quantize(em: Emitter, x, reciprocal) -> ir.Value:
  """outlier.quantize_static: f32 [rows, F] and reciprocals [rows, F] -> int8 codes."""
  shape = shape_of(x)
  clamped = hlo.ClampOp(
    em.splat(-outlier.QMAX, (), em.f32),
    hlo.MulOp(x, reciprocal).result,
    em.splat(outlier.QMAX, (), em.f32),
  ).result
  rounded = hlo.RoundNearestEvenOp(clamped).result
  finite = hlo.IsFiniteOp(x).result
  marked = hlo.SelectOp(finite, rounded, em.splat(outlier.NONFINITE_CODE, shape, em.f32)).result
  return em.convert(marked, em.i8)


def _code_values(em: Emitter, codes) -> ir.Value:
  """outlier.code_values: int8 codes -> f32, NaN for the non-finite marker."""
  shape = shape_of(codes)
  marker = hlo.CompareOp(
    codes, em.splat(outlier.NONFINITE_CODE, shape, em.i8), hlo.ComparisonDirectionAttr.get("EQ")
  ).result
  return hlo.SelectOp(marker, em.splat(np.nan, shape, em.f32), em.convert(codes, em.f32)).result


def _bf16_bytes(em: Emitter, x, rows: int) -> ir.Value:
  """f32 [r, k] -> bf16 (round to nearest even) -> its bytes, int8 [rows, r * k * 2 / rows]."""
  r, k = shape_of(x)
  bf16 = em.convert(x, ir.BF16Type.get())
  return em.reshape(em.bitcast(bf16, (r, k, 2), em.i8), (rows, r * k * 2 // rows))


def _bf16_values(em: Emitter, data, r: int, k: int) -> ir.Value:
  """int8 bytes of r x k bf16 values -> f32 [r, k]."""
  pairs = em.reshape(data, (r, k, 2))
  return em.convert(em.bitcast(pairs, (r, k), ir.BF16Type.get()), em.f32)


def emit_calibrated_allreduce(
  operands: list[ir.Value], plan: CalibratedPlan, channels: ChannelAllocator
) -> list[ir.Value]:
  """Emit the calibrated two-shot (outlier.reference, op for op) for one operand."""
  em = Emitter()
  (operand,) = operands
  t = ir.RankedTensorType(operand.type)
  lay = plan.layout
  n, rows, h = lay.group_size, lay.rows, lay.features
  k = len(lay.outliers)
  hn = h - k
  coll = Collectives(em, plan, channels)

  # [M, H] f32, rows padded to N chunks of R, columns in wire order.
  x = em.reshape(em.convert(operand, em.f32), (lay.num_rows, h))
  if lay.padded_rows > lay.num_rows:
    x = hlo.PadOp(
      x, em.splat(0, (), em.f32), [0, 0], [lay.padded_rows - lay.num_rows, 0], [0, 0]
    ).result
  x = _take_columns(em, x, lay.permutation)

  # This device's group and rank pick its rows of the scale tables.
  group, rank = coll.per_device([plan.group_table(), plan.schedule.rank_table(plan.num_devices)])
  zero = em.i32_scalar(0)
  in_scale = em.reshape(
    em.dynamic_slice(em.const(plan.in_scale, em.f32), [group, zero, zero], [1, n, hn]), (n, hn)
  )
  own_reciprocal = em.reshape(
    em.dynamic_slice(em.const(plan.in_reciprocal, em.f32), [group, rank, zero], [1, 1, hn]), (1, hn)
  )
  out_scale = em.dynamic_slice(em.const(plan.out_scale, em.f32), [group, zero], [1, hn])
  out_reciprocal = em.dynamic_slice(em.const(plan.out_reciprocal, em.f32), [group, zero], [1, hn])

  def payload(values, count: int, reciprocal) -> ir.Value:
    """f32 [count * R, H] in wire order -> int8 [count, P]: int4 codes, then bf16 bytes."""
    normal = em.slice(values, (0, 0), (count * rows, hn))
    codes = _static_quantize(
      em, normal, em.bcast(em.reshape(reciprocal, (hn,)), (count * rows, hn), [1])
    )
    # The nibbles pair within each chunk's row of codes (quantize.pack_int4).
    parts = [pack_int4(em, em.reshape(codes, (count, rows * hn)), rows * hn)]
    if k:
      hot = em.slice(values, (0, hn), (count * rows, h))
      parts.append(_bf16_bytes(em, hot, count))
    return em.concat(parts, 1)

  def unpack(data, count: int, requantized: bool):
    """int8 [count, P] -> (f32 code values [count * R, H - k], bf16 as f32 [count * R, k]).
    requantized: the values feed the sum that is quantized again (unpack_int4's form)."""
    codes = em.slice(data, (0, 0), (count, lay.code_bytes))
    codes = unpack_int4(em, codes, rows * hn, by_broadcast=not requantized)
    values = em.reshape(_code_values(em, codes), (count * rows, hn))
    hot = None
    if k:
      hot = _bf16_values(
        em, em.slice(data, (0, lay.code_bytes), (count, lay.payload_bytes)), count * rows, k
      )
    return values, hot

  received = coll.all_to_all(payload(x, n, own_reciprocal))  # row j: from rank j

  def sum_step(j, carry: _SumCarry) -> _SumCarry:
    row = em.dynamic_rows(carry.received, j, 0, 1, lay.payload_bytes)
    values, hot = unpack(row, 1, True)
    scale = em.reshape(em.dynamic_rows(carry.in_scale, j, 0, 1, hn), (hn,))
    scale = em.bcast(scale, (rows, hn), [1])
    acc = hlo.AddOp(carry.acc, hlo.MulOp(values, scale).result).result  # XLA: one FMA
    acc_hot = hlo.AddOp(carry.acc_hot, hot).result if k else carry.acc_hot
    return carry._replace(acc=acc, acc_hot=acc_hot)

  init = _SumCarry(
    em.splat(0, (rows, hn), em.f32), em.splat(0, (rows, max(k, 1)), em.f32), received, in_scale
  )
  done = while_loop(init, n, sum_step)
  owned = em.concat([done.acc, done.acc_hot], 1) if k else done.acc
  gathered = coll.all_gather(payload(owned, 1, out_reciprocal))  # row j: rank j's sum

  values, hot = unpack(gathered, n, False)
  normal = hlo.MulOp(values, em.bcast(em.reshape(out_scale, (hn,)), (n * rows, hn), [1])).result
  wire = em.concat([normal, hot], 1) if k else normal
  inverse = np.argsort(lay.permutation)
  out = _take_columns(em, wire, inverse)
  out = em.slice(out, (0, 0), (lay.num_rows, h))
  return [em.convert(em.reshape(out, tuple(t.shape)), t.element_type)]


def emit_feature_stats(value: ir.Value) -> list[ir.Value]:
  """Per feature (last dimension) of a tensor: [absmax, mean square], each f32 [1, H].

  NaN counts as +inf in the absmax (as in quantize.py), so non-finite data shows
  as an infinite range.  calibrate (calibrate.py) records these.
  """
  em = Emitter()
  rows, features = outlier.rows_and_features(shape_of(value))
  x = em.reshape(em.convert(value, em.f32), (rows, features))
  zero = em.splat(0, (), em.f32)
  absmax = reduce(em.magnitude(x), zero, em.f32, 0, hlo.MaxOp)
  square_sum = reduce(hlo.MulOp(x, x).result, zero, em.f32, 0, hlo.AddOp)
  mean_square = hlo.MulOp(square_sum, em.splat(1.0 / max(rows, 1), (features,), em.f32)).result
  return [em.reshape(absmax, (1, features)), em.reshape(mean_square, (1, features))]
