"""The partitioned program's MHLO ops, written in StableHLO.

XLA's HLO -> StableHLO conversion (`jax.extend.mlir.hlo_to_stablehlo`) keeps as MHLO
the HLO ops that StableHLO has no form for.  XLA:CPU compiles such a module in process,
but TPU and GPU compiles go through PJRT's C API, which takes StableHLO only and fails
with "failed to legalize operation 'mhlo.X'".  Two such ops occur in the programs that
XLA's partitioners write (a MaxText train step has both):

- `mhlo.copy`: a copy of a value (a `with_sharding_constraint`, a reshard).  StableHLO
  values are immutable, so its uses take its operand;
- the tuple form of `mhlo.all_to_all` (no split dimension): operand j goes whole to the
  group's j-th device, and result j is what that device sent.  It is the array form
  over the operands stacked along a new first dimension, which the decomposition below
  uses: stack, one all-to-all that splits and concatenates that dimension, unstack.

Any other MHLO op is reported by name (`remaining`), so that the route can refuse the
program with the true cause instead of an MLIR error at the final compile.
"""

from __future__ import annotations

import re

from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass.ir import traverse
from equarx_pass.ir.hlo_builder import Emitter, shape_of


def legalize(module: ir.Module) -> list[str]:
  """Rewrite `module`'s copies and tuple all-to-alls in StableHLO, in place; return the
  names of the MHLO ops left (sorted, each once)."""
  for op in list(traverse.walk(module.operation)):
    if op.name == "mhlo.copy":
      op.results[0].replace_all_uses_with(op.operands[0])
      op.erase()
    elif op.name == "mhlo.all_to_all" and "split_dimension" not in op.attributes:
      _tuple_all_to_all(op, module.context)
  return remaining(module)


def remaining(module: ir.Module) -> list[str]:
  """The MHLO ops in `module`, sorted, each name once."""
  return sorted({op.name for op in traverse.walk(module.operation) if op.name.startswith("mhlo.")})


def _tuple_all_to_all(op, context: ir.Context) -> None:
  """A tuple all-to-all of N operands of one type -> stack, array all-to-all, unstack.
  Operands of different types stay as they are (and are reported as left)."""
  types = [ir.RankedTensorType(v.type) for v in op.operands]
  if len({str(t) for t in types}) != 1 or len(types) < 2:
    return
  n, shape = len(types), list(types[0].shape)
  with context, ir.Location.unknown(context), ir.InsertionPoint(op):
    em = Emitter()
    stacked = em.concat([em.reshape(v, [1, *shape]) for v in op.operands], 0)
    channel = None
    if "channel_handle" in op.attributes:
      channel = _channel_handle(op.attributes["channel_handle"])
    groups = op.attributes["replica_groups"]
    exchanged = hlo.AllToAllOp([stacked], 0, 0, n, groups, channel_handle=channel).results[0]
    assert shape_of(exchanged) == (n, *shape)
    for j, result in enumerate(op.results):
      piece = em.slice(exchanged, [j] + [0] * len(shape), [j + 1, *shape])
      result.replace_all_uses_with(em.reshape(piece, shape))
  op.erase()


_CHANNEL = re.compile(r"handle = (-?\d+), type = (\d+)")


def _channel_handle(attr: ir.Attribute) -> ir.Attribute:
  """#mhlo.channel_handle<handle = H, type = T> -> the StableHLO attribute (no
  Python class for the MHLO one: read from its text)."""
  found = _CHANNEL.search(str(attr))
  if found is None:
    raise ValueError(f"unreadable channel handle {attr}")
  return hlo.ChannelHandle.get(int(found.group(1)), int(found.group(2)))
