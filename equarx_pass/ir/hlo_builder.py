"""Stateless helpers over the StableHLO op builders, shared by every emitter.

Typed shortcuts for constants, shapes, slices and converts (`Emitter`), a reduce,
loops with structured carries (`while_loop`, `unrolled_loop`: the carry is any
nesting of tuples, lists and named tuples of values, flattened in order), and the
collectives of one site (`Collectives`: fresh channel handles, the site's groups).
Nothing here knows a format, a rotation or an algorithm.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import numpy as np
from jax import tree_util
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass.ir.layout import DeviceKind, GroupSchedule

# stablehlo ChannelHandle type 1 = DEVICE_TO_DEVICE, what JAX gives ppermute.
DEVICE_TO_DEVICE = 1


class ChannelAllocator:
  """Hands out channel handles above every handle already in the module."""

  def __init__(self, highest_in_use: int):
    self._next = highest_in_use + 1

  def new(self) -> int:
    handle, self._next = self._next, self._next + 1
    return handle


def tensor(shape: Sequence[int], element_type: ir.Type) -> ir.RankedTensorType:
  return ir.RankedTensorType.get(list(shape), element_type)


def shape_of(x: ir.Value) -> tuple[int, ...]:
  """The static shape of a ranked tensor value."""
  return tuple(ir.RankedTensorType(x.type).shape)


def front_order(rank: int, dimension: int) -> list[int]:
  """The transpose permutation that moves `dimension` to the front, the others in order."""
  return [dimension] + [i for i in range(rank) if i != dimension]


def back_order(rank: int, dimension: int) -> list[int]:
  """front_order's inverse: the transpose that puts the front dimension back in place."""
  order = front_order(rank, dimension)
  return [order.index(i) for i in range(rank)]


class Emitter:
  """Small typed helpers over the op builders; every value is a ranked tensor."""

  def __init__(self) -> None:
    self.f32 = ir.F32Type.get()
    self.i8 = ir.IntegerType.get_signless(8)
    self.i16 = ir.IntegerType.get_signless(16)
    self.i32 = ir.IntegerType.get_signless(32)
    self.i64 = ir.IntegerType.get_signless(64)

  # constants
  def const(self, array: np.ndarray, element_type: ir.Type) -> ir.Value:
    array = np.ascontiguousarray(array)
    # The stubs accept only buffers typed as such; an ndarray is one.
    attr = ir.DenseElementsAttr.get(array, type=tensor(array.shape, element_type))  # type: ignore[call-overload]
    return hlo.ConstantOp(attr).result  # type: ignore[no-any-return]

  def splat(self, value: float, shape: Sequence[int], element_type: ir.Type) -> ir.Value:
    t = tensor(shape, element_type)
    scalar = (
      ir.FloatAttr.get(element_type, float(value))
      if isinstance(element_type, ir.FloatType)
      else ir.IntegerAttr.get(element_type, int(value))
    )
    return hlo.ConstantOp(ir.DenseElementsAttr.get_splat(t, scalar)).result  # type: ignore[no-any-return]

  def i32_scalar(self, value: int) -> ir.Value:
    return self.splat(value, (), self.i32)

  def groups_attr(self, groups: Any) -> ir.Attribute:
    array = np.array(groups, np.int64)
    attr: ir.Attribute = ir.DenseIntElementsAttr.get(  # type: ignore[call-overload]
      array, type=tensor(array.shape, self.i64)
    )
    return attr

  # shape ops
  def reshape(self, x: ir.Value, shape: Sequence[int]) -> ir.Value:
    if shape_of(x) == tuple(shape):
      return x
    return hlo.ReshapeOp(tensor(shape, ir.RankedTensorType(x.type).element_type), x).result  # type: ignore[no-any-return]

  def convert(self, x: ir.Value, element_type: ir.Type) -> ir.Value:
    if ir.RankedTensorType(x.type).element_type == element_type:
      return x
    return hlo.ConvertOp(tensor(shape_of(x), element_type), x).result  # type: ignore[no-any-return]

  def widen(self, x: ir.Value, narrow: ir.Type | None) -> ir.Value:
    """f32 of x; x holds the bits of `narrow` (a 16-bit float type) as i16, or is f32."""
    if narrow is None:
      return x
    return self.convert(self.bitcast(x, shape_of(x), narrow), self.f32)

  def bitcast(self, x: ir.Value, shape: Sequence[int], element_type: ir.Type) -> ir.Value:
    return hlo.BitcastConvertOp(tensor(shape, element_type), x).result  # type: ignore[no-any-return]

  def flat_padded(self, operands: list[ir.Value], element_type: ir.Type, padded: int) -> ir.Value:
    """The operands converted to `element_type` and flattened, one after another, then
    zero-padded to `padded` values: what every algorithm lays out as chunks."""
    sizes = [int(np.prod(shape_of(v), dtype=np.int64)) for v in operands]
    x = self.concat(
      [self.reshape(self.convert(v, element_type), (size,)) for v, size in zip(operands, sizes)], 0
    )
    if padded > sum(sizes):
      x = hlo.PadOp(x, self.splat(0, (), element_type), [0], [padded - sum(sizes)], [0]).result
    return x

  def unflatten_like(self, values: ir.Value, types: list[ir.RankedTensorType]) -> list[ir.Value]:
    """flat_padded undone: `values` (any shape, flat in order) cut into one value per
    type of `types`, in its shape and element type."""
    flat = self.reshape(values, (int(np.prod(shape_of(values), dtype=np.int64)),))
    results, offset = [], 0
    for t in types:
      size = int(np.prod(t.shape, dtype=np.int64))
      piece = self.slice(flat, (offset,), (offset + size,))
      results.append(self.convert(self.reshape(piece, t.shape), t.element_type))
      offset += size
    return results

  def slice(self, x: ir.Value, start: Sequence[int], limit: Sequence[int]) -> ir.Value:
    return hlo.SliceOp(x, list(start), list(limit), [1] * len(start)).result  # type: ignore[no-any-return]

  def concat(self, values: Sequence[ir.Value], axis: int) -> ir.Value:
    return values[0] if len(values) == 1 else hlo.ConcatenateOp(values, axis).result

  def dynamic_slice(
    self, x: ir.Value, starts: Sequence[ir.Value], sizes: Sequence[int]
  ) -> ir.Value:
    """x[starts[0]:starts[0]+sizes[0], ...], `starts` traced i32 scalars."""
    element_type = ir.RankedTensorType(x.type).element_type
    return hlo.DynamicSliceOp(  # type: ignore[no-any-return]
      x, list(starts), list(sizes), results=[tensor(tuple(sizes), element_type)]
    ).result

  def dynamic_rows(self, x: ir.Value, row: ir.Value, col: int, rows: int, width: int) -> ir.Value:
    """x[row:row+rows, col:col+width] of a 2-D x, `row` a traced i32 scalar."""
    return self.dynamic_slice(x, [row, self.i32_scalar(col)], [rows, width])

  def set_rows(self, x: ir.Value, row: ir.Value, value: ir.Value) -> ir.Value:
    return hlo.DynamicUpdateSliceOp(x, value, [row, self.i32_scalar(0)]).result  # type: ignore[no-any-return]

  def mod(self, x: ir.Value, n: int) -> ir.Value:
    """(x + n) mod n for x >= -n, on i32 scalars (rem alone keeps the sign)."""
    return hlo.RemOp(hlo.AddOp(x, self.i32_scalar(n)).result, self.i32_scalar(n)).result  # type: ignore[no-any-return]

  def add_i32(self, x: ir.Value, k: int) -> ir.Value:
    return hlo.AddOp(x, self.i32_scalar(k)).result  # type: ignore[no-any-return]

  def bcast(self, x: ir.Value, shape: Sequence[int], dims: Sequence[int]) -> ir.Value:
    t = ir.RankedTensorType(x.type)
    return hlo.BroadcastInDimOp(tensor(shape, t.element_type), x, list(dims)).result  # type: ignore[no-any-return]

  def magnitude(self, x: ir.Value) -> ir.Value:
    """|x| of an f32 tensor, with NaN counted as +inf (quantize.py): a max kernel
    may drop NaN, never an inf."""
    is_nan = hlo.CompareOp(x, x, hlo.ComparisonDirectionAttr.get("NE")).result
    return hlo.SelectOp(  # type: ignore[no-any-return]
      is_nan, self.splat(np.inf, shape_of(x), self.f32), hlo.AbsOp(x).result
    ).result


def reduce(
  x: ir.Value, init: ir.Value, element_type: ir.Type, axes: int | tuple[int, ...], combine: Any
) -> ir.Value:
  """combine (hlo.MaxOp, hlo.AddOp, ...) over one axis (or several) of a tensor."""
  axes = (axes,) if isinstance(axes, int) else tuple(axes)
  shape = [d for i, d in enumerate(shape_of(x)) if i not in axes]
  op = hlo.ReduceOp([tensor(shape, element_type)], [x], [init], list(axes))
  scalar = tensor((), element_type)
  block = op.body.blocks.append(scalar, scalar)
  with ir.InsertionPoint(block):
    hlo.ReturnOp([combine(block.arguments[0], block.arguments[1]).result])
  return op.result  # type: ignore[no-any-return]


def narrow_float(types: list[ir.RankedTensorType]) -> ir.Type | None:
  """The operands' common float type if it is 16-bit (bf16, f16), else None."""
  element_types = {t.element_type for t in types}
  if len(element_types) != 1:
    return None
  (element_type,) = element_types
  if isinstance(element_type, (ir.BF16Type, ir.F16Type)):
    return element_type
  return None


# A loop's carry: values, nested in tuples, lists and named tuples (a pytree whose
# leaves are ir.Values); the loop carries its leaves in flattening order.
Carry = Any


def _is_value(x: ir.Value) -> bool:
  return isinstance(x, ir.Value)


def while_loop(init: Carry, trip_count: int, body_fn: Callable[[ir.Value, Carry], Carry]) -> Carry:
  """for s in range(trip_count): carry = body_fn(s, carry).  Returns the last carry.

  One stablehlo.while whose operands are the step counter s (first) and the carry's
  leaves.  Everything the body uses is carried (no implicit captures), as JAX does.
  """
  em = Emitter()
  leaves, tree = tree_util.tree_flatten(init, is_leaf=_is_value)
  operands = [em.i32_scalar(0)] + leaves
  types = [v.type for v in operands]
  op = hlo.WhileOp(types, operands)
  cond = op.cond.blocks.append(*types)
  with ir.InsertionPoint(cond):
    lt = hlo.CompareOp(
      cond.arguments[0], em.i32_scalar(trip_count), hlo.ComparisonDirectionAttr.get("LT")
    ).result
    hlo.ReturnOp([lt])
  body = op.body.blocks.append(*types)
  with ir.InsertionPoint(body):
    step = body.arguments[0]
    carry = tree_util.tree_unflatten(tree, list(body.arguments[1:]))
    new = tree_util.tree_leaves(body_fn(step, carry), is_leaf=_is_value)
    hlo.ReturnOp([em.add_i32(step, 1)] + new)
  return tree_util.tree_unflatten(tree, list(op.results)[1:])


def unrolled_loop(
  init: Carry, trip_count: int, body_fn: Callable[[ir.Value, Carry], Carry]
) -> Carry:
  """while_loop's loop written out: body_fn(s, carry) for s = 0 .. trip_count - 1."""
  em = Emitter()
  carry = init
  for s in range(trip_count):
    carry = body_fn(em.i32_scalar(s), carry)
  return carry


class SitePlan(Protocol):
  """What Collectives needs of a site's plan (forms.SitePlan, outlier_emit's)."""

  @property
  def layout(self) -> Any: ...  # a ChunkLayout or an OutlierLayout: both have group_size

  @property
  def schedule(self) -> GroupSchedule: ...

  @property
  def device_kind(self) -> DeviceKind: ...  # partition: the collectives carry a channel

  @property
  def num_devices(self) -> int: ...


class Collectives:
  """The collectives of one site: fresh channel handles, the site's groups."""

  def __init__(self, em: Emitter, plan: SitePlan, channels: ChannelAllocator):
    self.em, self.plan, self.channels = em, plan, channels
    self.partition = plan.device_kind == "partition"

  def _channel(self) -> dict:
    if not self.partition:
      return {}
    return {"channel_handle": hlo.ChannelHandle.get(self.channels.new(), DEVICE_TO_DEVICE)}

  def permute(self, x: ir.Value, direction: int) -> ir.Value:
    pairs = np.array(self.plan.schedule.source_target_pairs(direction), np.int64).reshape(-1, 2)
    return hlo.CollectivePermuteOp(x, self.em.groups_attr(pairs), **self._channel()).result  # type: ignore[no-any-return]

  def all_to_all(self, x: ir.Value) -> ir.Value:
    n = self.plan.layout.group_size
    op = hlo.AllToAllOp(
      [x], 0, 0, n, self.em.groups_attr(self.plan.schedule.groups), **self._channel()
    )
    result: ir.Value = op.results[0]
    return result

  def all_gather(self, x: ir.Value, first: int = 0) -> ir.Value:
    """x's copies from every rank of the group, concatenated along dimension 0, starting
    with the rank at position `first` of the group (then first + 1, ...): an all-gather
    concatenates in the order its replica groups list the devices."""
    rows, *rest = shape_of(x)
    n = self.plan.layout.group_size
    kwargs = self._channel()
    if self.partition:
      kwargs["use_global_device_ids"] = True
    element_type = ir.RankedTensorType(x.type).element_type
    groups = [tuple(g[first:]) + tuple(g[:first]) for g in self.plan.schedule.groups]
    op = hlo.AllGatherOp(
      [tensor((n * rows, *rest), element_type)], [x], 0, self.em.groups_attr(groups), **kwargs
    )
    result: ir.Value = op.results[0]
    return result

  def per_device(self, tables: list[np.ndarray]) -> list[ir.Value]:
    """Each table's entry for this device (partition or replica id), as i32 scalars."""
    em = self.em
    index = (hlo.PartitionIdOp() if self.partition else hlo.ReplicaIdOp()).result
    device = em.reshape(em.convert(index, em.i32), (1,))
    return [
      em.reshape(em.dynamic_slice(em.const(table, em.i32), [em.reshape(device, ())], [1]), ())
      for table in tables
    ]

  def group_rank(self) -> ir.Value:
    """This device's position in its group, an i32 scalar."""
    (rank,) = self.per_device([self.plan.schedule.rank_table(self.plan.num_devices)])
    return rank
