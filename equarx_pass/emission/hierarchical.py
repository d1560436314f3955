"""The hierarchical all-reduce: native inside each fast domain, quantized across domains.

A group of N = S x k devices, k in each of S fast domains (topology.py):

  reduce-scatter  native, inside each domain: member j of a domain gets piece j of the
                  domain's sum (the operand flattened, padded to k pieces)
  all-reduce      the scheme's quantized all-reduce (any algorithm and format) of piece j
                  among the S members that hold it, one per domain: only this crosses the
                  slow links, and only 1/k of the operand
  all-gather      native, inside each domain: every member gets every piece

This is what XLA already does natively for a group that spans TPU slices, with the middle
step quantized.  Every member ends with the same bits: the quantized all-reduce leaves
piece j identical on its S holders, and the all-gather forwards pieces unchanged.
`reference` is the NumPy model, `emit` the StableHLO.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass.ir.hlo_builder import (
  DEVICE_TO_DEVICE,
  ChannelAllocator,
  Emitter,
  back_order,
  front_order,
  narrow_float,
  shape_of,
  tensor,
)
from equarx_pass.ir.layout import DeviceKind
from equarx_pass.topology import Levels, split_groups  # noqa: F401  (re-exported)

if TYPE_CHECKING:
  from equarx_pass.emission.scheme import Scheme


def piece_size(num_values: int, per_domain: int) -> int:
  """Values in each member's piece: the operand split into k equal pieces."""
  return -(-num_values // per_domain)


# --- the NumPy model ----------------------------------------------------------------


def domain_sum(parts: Sequence[np.ndarray], dtype: np.dtype) -> np.ndarray:
  """The native reduce-scatter's sum of the domain's members, as XLA:CPU computes it, in
  member order: bf16 in f32, rounded once (XLA widens bf16 arithmetic); f16 and f32 in
  their own type, each add rounded."""
  once = np.dtype(dtype) != np.float16 and np.dtype(dtype).itemsize == 2
  with np.errstate(over="ignore", invalid="ignore"):
    acc = np.asarray(parts[0], np.float32)
    for p in parts[1:]:
      acc = acc + np.asarray(p, np.float32)
      if not once:
        acc = acc.astype(dtype).astype(np.float32)
    return acc.astype(dtype)


def reference(
  inputs: Sequence[np.ndarray],
  domains: Sequence[int],
  scheme: Scheme,
  quantized: Callable[..., list[np.ndarray]] | None = None,
) -> list[np.ndarray]:
  """Per-member results for one group: inputs[r] is member r's operand (group order),
  domains[r] its fast domain.  `quantized(pieces, scheme, out_dtype)` is the cross-domain
  all-reduce's model (default: scheme.reference)."""
  from equarx_pass.emission import scheme as scheme_lib

  quantized = quantized or scheme_lib.reference
  first = np.asarray(inputs[0])
  dtype = first.dtype
  parts: dict[int, list[int]] = {}
  for r, d in enumerate(domains):
    parts.setdefault(d, []).append(r)
  members = list(parts.values())
  k = len(members[0])
  c = piece_size(first.size, k)
  padded = [np.zeros(k * c, dtype) for _ in inputs]
  for v, p in zip(inputs, padded):
    p[: first.size] = np.asarray(v).reshape(-1)
  # Each domain's sum, split in k pieces; piece j is held by the domain's member j.
  sums = [domain_sum([padded[r] for r in m], dtype).reshape(k, c) for m in members]
  out = np.zeros(k * c, dtype)
  for j in range(k):
    reduced = quantized([s[j] for s in sums], scheme, dtype)
    out[j * c : (j + 1) * c] = reduced[0]
  result = out[: first.size].reshape(first.shape)
  return [result.copy() for _ in inputs]


# --- the emitted form ---------------------------------------------------------------


def _collective_args(
  device_kind: DeviceKind, channels: ChannelAllocator, gather: bool = False
) -> dict:
  if device_kind != "partition":
    return {}
  args: dict = {"channel_handle": hlo.ChannelHandle.get(channels.new(), DEVICE_TO_DEVICE)}
  if gather:
    args["use_global_device_ids"] = True
  return args


def reduce_scatter(
  em: Emitter,
  x: ir.Value,
  groups: Sequence[Sequence[int]],
  device_kind: DeviceKind,
  channels: ChannelAllocator,
) -> ir.Value:
  """Native reduce-scatter (sum) of a 1-D x over `groups`: member j gets piece j."""
  (size,) = shape_of(x)
  k = len(groups[0])
  element_type = ir.RankedTensorType(x.type).element_type
  kwargs = _collective_args(device_kind, channels)
  if device_kind == "partition":
    kwargs["use_global_device_ids"] = True
  op = hlo.ReduceScatterOp(
    tensor((size // k,), element_type), x, 0, em.groups_attr(groups), **kwargs
  )
  scalar = tensor((), element_type)
  block = op.computation.blocks.append(scalar, scalar)
  with ir.InsertionPoint(block):
    hlo.ReturnOp([hlo.AddOp(block.arguments[0], block.arguments[1]).result])
  return op.result


def domain_piece(
  em: Emitter,
  x: ir.Value,
  groups: Sequence[Sequence[int]],
  device_kind: DeviceKind,
  channels: ChannelAllocator,
  num_devices: int,
  by_all_reduce: bool,
) -> ir.Value:
  """This member's piece of the sum of 1-D x over its group (member j: piece j): a native
  reduce-scatter, or with `by_all_reduce` a native all-reduce and the slice of the piece.

  Why the second: XLA:CPU's reduce-scatter in a program of several processes (gloo) gave
  different results from call to call (4 processes of 2 devices, a psum_scatter over a
  process's own 2 devices: 3 of 4 processes saw another result in 1 to 3 of 8 calls),
  where its all-reduce and all-gather gave the same bits every time.  The all-reduce sums
  in member order, as the reduce-scatter does in one process: the same bits there.
  """
  if not by_all_reduce:
    return reduce_scatter(em, x, groups, device_kind, channels)
  (size,) = shape_of(x)
  k = len(groups[0])
  element_type = ir.RankedTensorType(x.type).element_type
  kwargs = _collective_args(device_kind, channels, gather=True)
  op = hlo.AllReduceOp([x.type], [x], em.groups_attr(groups), **kwargs)
  scalar = tensor((), element_type)
  block = op.computation.blocks.append(scalar, scalar)
  with ir.InsertionPoint(block):
    hlo.ReturnOp([hlo.AddOp(block.arguments[0], block.arguments[1]).result])
  position = np.full(num_devices, 0, np.int32)
  for group in groups:
    for j, member in enumerate(group):
      position[member] = j * (size // k)
  index = (hlo.PartitionIdOp() if device_kind == "partition" else hlo.ReplicaIdOp()).result
  device = em.reshape(em.convert(index, em.i32), (1,))
  start = em.dynamic_slice(em.const(position, em.i32), [em.reshape(device, ())], [1])
  return em.dynamic_slice(op.results[0], [em.reshape(start, ())], [size // k])


def all_gather(
  em: Emitter,
  x: ir.Value,
  groups: Sequence[Sequence[int]],
  device_kind: DeviceKind,
  channels: ChannelAllocator,
) -> ir.Value:
  """Native all-gather of a 1-D x over `groups`, concatenated in group order."""
  (size,) = shape_of(x)
  k = len(groups[0])
  element_type = ir.RankedTensorType(x.type).element_type
  kwargs = _collective_args(device_kind, channels, gather=True)
  op = hlo.AllGatherOp(
    [tensor((k * size,), element_type)], [x], 0, em.groups_attr(groups), **kwargs
  )
  result: ir.Value = op.results[0]
  return result


def emit(
  operands: list[ir.Value],
  levels: Levels,
  device_kind: DeviceKind,
  channels: ChannelAllocator,
  cross: Callable[[ir.Value], ir.Value],
  num_devices: int = 0,
  by_all_reduce: bool = False,
) -> list[ir.Value]:
  """The hierarchical all-reduce at the current insertion point; one value per operand,
  its type.  `cross(piece)` emits the quantized all-reduce of a member's piece (1-D,
  the operands' common type) among `levels.outer` and returns it, the same type.
  `by_all_reduce`: the pieces inside a domain from an all-reduce (domain_piece)."""
  em = Emitter()
  types = [ir.RankedTensorType(v.type) for v in operands]
  entry = narrow_float(types) or em.f32
  total = sum(int(np.prod(t.shape, dtype=np.int64)) for t in types)
  k = levels.per_domain
  c = piece_size(total, k)
  x = em.flat_padded(operands, entry, k * c)
  piece = domain_piece(em, x, levels.inner, device_kind, channels, num_devices, by_all_reduce)
  piece = cross(piece)
  whole = all_gather(em, piece, levels.inner, device_kind, channels)
  return em.unflatten_like(whole, types)


# --- reduce-scatters and all-gathers (--equarx_ops) -----------------------------------
#
# Rank r of a group sits at position j of domain D.  A reduce-scatter gives rank r piece
# r of the sum: each domain reduce-scatters natively a reordered operand whose k parts are,
# for j = 0 .. k-1, the S pieces of the ranks at position j (domain order), and the S
# members at position j then reduce-scatter that part quantized, among themselves: the
# member in domain D gets the piece of rank (D, j), its own.  An all-gather runs the other
# way: the quantized all-gather among the S members at position j, then the native one
# inside each domain, then the pieces back in rank order.


def piece_order(groups: Sequence[Sequence[int]], levels: Levels) -> tuple[int, ...] | str:
  """The ranks in (position j, domain D) order, the same for every group, or why not."""
  orders = set()
  k, domains = levels.per_domain, levels.domains
  inner = iter(levels.inner)
  for group in groups:
    parts = [next(inner) for _ in range(domains)]
    rank = {device: r for r, device in enumerate(group)}
    orders.add(tuple(rank[parts[d][j]] for j in range(k) for d in range(domains)))
  if len(orders) != 1:
    return "its groups order their ranks differently across domains"
  return orders.pop()


def _reorder_rows(em: Emitter, x: ir.Value, order: Sequence[int]) -> ir.Value:
  """x's rows (dimension 0, len(order) equal parts) in `order`: rows[order[i]] at i."""
  shape = shape_of(x)
  n = len(order)
  if list(order) == list(range(n)):
    return x
  part = shape[0] // n
  rows = [
    em.slice(x, (o * part,) + (0,) * (len(shape) - 1), ((o + 1) * part,) + shape[1:]) for o in order
  ]
  return em.concat(rows, 0)


def _moved(x: ir.Value, dimension: int) -> ir.Value:
  if not dimension:
    return x
  return hlo.TransposeOp(x, front_order(len(shape_of(x)), dimension)).result


def _moved_back(x: ir.Value, dimension: int) -> ir.Value:
  if not dimension:
    return x
  return hlo.TransposeOp(x, back_order(len(shape_of(x)), dimension)).result


def emit_reduce_scatter(
  operand: ir.Value,
  levels: Levels,
  order: Sequence[int],
  dimension: int,
  result_type: ir.RankedTensorType,
  device_kind: DeviceKind,
  channels: ChannelAllocator,
  cross: Callable[[ir.Value, ir.RankedTensorType], ir.Value],
  num_devices: int = 0,
  by_all_reduce: bool = False,
) -> list[ir.Value]:
  """The hierarchical reduce-scatter of `operand` along `dimension`.  `cross(part, type)`
  emits the quantized reduce-scatter of a member's part (its S pieces along dimension 0)
  among `levels.outer`, returning the piece of `type`; `by_all_reduce` as for emit."""
  em = Emitter()
  k, domains = levels.per_domain, levels.domains
  x = _reorder_rows(em, _moved(operand, dimension), order)
  shape = shape_of(x)
  flat = em.reshape(x, (int(np.prod(shape, dtype=np.int64)),))
  part = domain_piece(em, flat, levels.inner, device_kind, channels, num_devices, by_all_reduce)
  piece_shape = (shape[0] // (k * domains),) + shape[1:]
  part = em.reshape(part, (domains * piece_shape[0],) + shape[1:])
  element = ir.RankedTensorType(operand.type).element_type
  piece = cross(part, tensor(piece_shape, element))
  return [em.convert(_moved_back(piece, dimension), result_type.element_type)]


def emit_all_gather(
  operand: ir.Value,
  levels: Levels,
  order: Sequence[int],
  dimension: int,
  result_type: ir.RankedTensorType,
  device_kind: DeviceKind,
  channels: ChannelAllocator,
  cross: Callable[[ir.Value, ir.RankedTensorType], ir.Value],
  num_devices: int = 0,
  by_all_reduce: bool = False,
) -> list[ir.Value]:
  """The hierarchical all-gather of `operand` along `dimension`.  `cross(piece, type)`
  emits the quantized all-gather of a member's piece among `levels.outer`, returning the
  S pieces along dimension 0, of `type`."""
  em = Emitter()
  k, domains = levels.per_domain, levels.domains
  piece = _moved(operand, dimension)
  shape = shape_of(piece)
  element = ir.RankedTensorType(operand.type).element_type
  part = cross(piece, tensor((domains * shape[0],) + shape[1:], element))
  flat = em.reshape(part, (int(np.prod(shape_of(part), dtype=np.int64)),))
  whole = all_gather(em, flat, levels.inner, device_kind, channels)
  whole = em.reshape(whole, (k * domains * shape[0],) + shape[1:])
  # Rows in (j, D) order -> rank order: row i holds rank order[i]'s piece.
  inverse = [list(order).index(r) for r in range(len(order))]
  whole = _reorder_rows(em, whole, inverse)
  return [em.convert(_moved_back(whole, dimension), result_type.element_type)]


def reduce_scatter_reference(
  inputs: Sequence[np.ndarray],
  domains: Sequence[int],
  scheme: Scheme,
  dimension: int = 0,
) -> list[np.ndarray]:
  """Per-rank results of the hierarchical reduce-scatter for one group (ranks in group
  order, domains[r] the fast domain of rank r): rank r gets piece r of the sum."""
  from equarx_pass.emission import scheme as scheme_lib

  n = len(inputs)
  members: dict[int, list[int]] = {}
  for r, d in enumerate(domains):
    members.setdefault(d, []).append(r)
  parts = list(members.values())
  k, s = len(parts[0]), len(parts)
  dtype = np.asarray(inputs[0]).dtype
  moved = [np.moveaxis(np.asarray(v), dimension, 0) for v in inputs]
  p = moved[0].shape[0] // n
  pieces = [[v[r * p : (r + 1) * p] for r in range(n)] for v in moved]  # [member][rank]
  out: list[np.ndarray] = [np.empty(0)] * n
  for j in range(k):
    # Domain D's member j holds the domain's sum of the pieces of ranks (0..S-1, j).
    held = []
    for members_of_d in parts:
      sums = [domain_sum([pieces[m][parts[dd][j]] for m in members_of_d], dtype) for dd in range(s)]
      held.append(np.concatenate(sums, axis=0))
    results = scheme_lib.reduce_scatter_reference(held, scheme, 0, dtype)
    for d in range(s):
      out[parts[d][j]] = np.moveaxis(results[d], 0, dimension)
  return out


def all_gather_reference(
  inputs: Sequence[np.ndarray],
  domains: Sequence[int],
  scheme: Scheme,
  dimension: int = 0,
) -> np.ndarray:
  """The hierarchical all-gather's result (the same on every rank) for one group."""
  from equarx_pass.emission import scheme as scheme_lib

  members: dict[int, list[int]] = {}
  for r, d in enumerate(domains):
    members.setdefault(d, []).append(r)
  parts = list(members.values())
  k, s = len(parts[0]), len(parts)
  dtype = np.asarray(inputs[0]).dtype
  moved = [np.moveaxis(np.asarray(v), dimension, 0) for v in inputs]
  rows: list[np.ndarray] = [np.empty(0)] * len(inputs)
  for j in range(k):
    peers = [parts[d][j] for d in range(s)]
    gathered = scheme_lib.all_gather_reference([moved[r] for r in peers], scheme, 0, dtype)
    p = moved[0].shape[0]
    for d, r in enumerate(peers):
      rows[r] = gathered[d * p : (d + 1) * p]
  return np.moveaxis(np.concatenate(rows, axis=0), 0, dimension)
