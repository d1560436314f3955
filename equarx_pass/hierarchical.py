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

from equarx_pass.hlo_builder import DEVICE_TO_DEVICE, ChannelAllocator, Emitter, narrow_float
from equarx_pass.hlo_builder import shape_of, tensor
from equarx_pass.layout import DeviceKind
from equarx_pass.topology import Levels, split_groups  # noqa: F401  (re-exported)

if TYPE_CHECKING:
  from equarx_pass.scheme import Scheme


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
  from equarx_pass import scheme as scheme_lib

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
) -> list[ir.Value]:
  """The hierarchical all-reduce at the current insertion point; one value per operand,
  its type.  `cross(piece)` emits the quantized all-reduce of a member's piece (1-D,
  the operands' common type) among `levels.outer` and returns it, the same type."""
  em = Emitter()
  types = [ir.RankedTensorType(v.type) for v in operands]
  entry = narrow_float(types) or em.f32
  total = sum(int(np.prod(t.shape, dtype=np.int64)) for t in types)
  k = levels.per_domain
  c = piece_size(total, k)
  x = em.flat_padded(operands, entry, k * c)
  piece = reduce_scatter(em, x, levels.inner, device_kind, channels)
  piece = cross(piece)
  whole = all_gather(em, piece, levels.inner, device_kind, channels)
  return em.unflatten_like(whole, types)
