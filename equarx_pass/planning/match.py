"""match: which stablehlo.all_reduce ops the selection takes, and why the others are skipped.

Matching is a pure predicate over (op, module facts, the policy's Selection): it returns a
`Candidate` for an op to rewrite or a `Skip` with the reason, and never touches
the IR.  `find_all_reduces` collects every all-reduce first (nested regions
included: while bodies, case branches, private functions, sdy.manual_computation),
so nothing is mutated while the module is walked.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Callable, Union

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import sdy, stablehlo

from equarx_pass.ir import traverse
from equarx_pass.ir.layout import ChunkLayout, DeviceKind, GroupSchedule, make_schedule
from equarx_pass.planning import loops
from equarx_pass.planning.settings import DTYPE_BYTES, Selection
from equarx_pass.platforms import rules_for
from equarx_pass.site_kind import SiteKind

ALL_REDUCE = "stablehlo.all_reduce"
# With --equarx_ops: reduce-scatters and all-gathers (sites after the all-reduces).
REDUCE_SCATTER = "stablehlo.reduce_scatter"
ALL_GATHER = "stablehlo.all_gather"
# MHLO's all-reduce.  parse.py converts a module holding one to StableHLO; one that is
# still there (the conversion failed) is a site skipped with the reason, never ignored.
MHLO_ALL_REDUCE = "mhlo.all_reduce"
# An async pair (HLO all-reduce-start/-done): the all-reduce is the only op of the
# region of an async_start, whose future one async_done waits for.
ASYNC_STARTS = ("stablehlo.async_start", "mhlo.async_start")
ASYNC_DONES = ("stablehlo.async_done", "mhlo.async_done")
# All-reduces the pass finds but leaves as they are, with the reason (match._check_kind):
# Shardy's, which partitioning lowers (the pass sees what it lowers them to), and MHLO's
# encoded as a custom call inside StableHLO.
SDY_ALL_REDUCE = "sdy.all_reduce"
CUSTOM_CALL = "stablehlo.custom_call"
MHLO_ALL_REDUCE_TARGET = "mhlo.all_reduce"


def is_all_reduce(op: ir.Operation) -> bool:
  """Any form of all-reduce the pass accounts for: rewritten, or skipped with a reason."""
  if op.name in (ALL_REDUCE, MHLO_ALL_REDUCE, SDY_ALL_REDUCE):
    return True
  return (
    op.name == CUSTOM_CALL
    and "call_target_name" in op.attributes
    and ir.StringAttr(op.attributes["call_target_name"]).value == MHLO_ALL_REDUCE_TARGET
  )


@dataclasses.dataclass(frozen=True)
class Mesh:
  """A device mesh: axis names and sizes, and the device id at each position."""

  axis_names: tuple[str, ...]
  axis_sizes: tuple[int, ...]
  device_ids: tuple[int, ...]  # row-major over the axes


@dataclasses.dataclass(frozen=True)
class ModuleFacts:
  """What a site's meaning depends on beyond the op itself."""

  num_partitions: int
  num_replicas: int
  meshes: tuple[tuple[str, Mesh], ...] = ()  # symbol name -> mesh, from sdy.mesh ops
  async_computations: frozenset[str] = frozenset()  # functions an async_start runs
  # Functions that run only when a conditional's branch is taken (loops.branch_functions).
  branch_functions: frozenset[str] = frozenset()

  def mesh(self, name: str) -> Mesh | None:
    return dict(self.meshes).get(name)


def _mesh_from_attr(attr: ir.Attribute) -> Mesh:
  """An sdy.MeshAttr or stablehlo.MeshAttr as a Mesh."""
  # The bindings' stubs type these attributes' sequences as plain Attributes.
  axes: list[Any]
  if stablehlo.MeshAttr.isinstance(attr):
    m = stablehlo.MeshAttr(attr)
    axes = [stablehlo.MeshAxisAttr(a) for a in m.axes]  # type: ignore[attr-defined]
    ids = list(m.device_ids) if m.device_ids is not None else []  # type: ignore[call-overload]
  else:
    sdy_mesh = sdy.MeshAttr(attr)
    axes = [sdy.MeshAxisAttr(a) for a in sdy_mesh.axes]  # type: ignore[attr-defined]
    ids = list(sdy_mesh.device_ids)  # type: ignore[call-overload]
  names = tuple(a.name for a in axes)
  sizes = tuple(int(a.size) for a in axes)
  count = int(np.prod(sizes, dtype=np.int64))
  return Mesh(names, sizes, tuple(int(i) for i in ids) if ids else tuple(range(count)))


def module_facts(module: ir.Module) -> ModuleFacts:
  """Every fact a site's meaning needs: mesh_facts' and the functions that run async or
  only in a conditional's branch (both walk the whole module)."""
  facts = mesh_facts(module)
  return dataclasses.replace(
    facts,
    async_computations=async_computations(module),
    branch_functions=loops.branch_functions(module),
  )


def mesh_facts(module: ir.Module) -> ModuleFacts:
  """The facts read off the module's attributes and top-level ops, with no walk:
  partitions, replicas and meshes (its async and branch function sets left empty: ask
  module_facts where a site's meaning needs them).  The route choice and the partitioned
  route's conversion need no more, and ask on every lowering."""
  attrs = module.operation.attributes

  def get(name):
    return ir.IntegerAttr(attrs[name]).value if name in attrs else 1

  meshes = []
  for view in module.body.operations:
    op = view.operation
    if op.name == "sdy.mesh":
      name = ir.StringAttr(op.attributes["sym_name"]).value
      meshes.append((name, _mesh_from_attr(op.attributes["mesh"])))
  return ModuleFacts(get("mhlo.num_partitions"), get("mhlo.num_replicas"), tuple(meshes))


# Ops that compute nothing the SPMD partitioner could split: outside every manual
# computation, a program made only of these (and of manual computations over all the
# mesh's axes) gets no collective from the partitioner (auto_sharded_ops).
_INERT_OPS = frozenset({"func.return", "stablehlo.constant", "sdy.return"})
MANUAL_COMPUTATION = "sdy.manual_computation"
SHARDING_CONSTRAINT = "sdy.sharding_constraint"


def auto_sharded_ops(module: ir.Module) -> list[str]:
  """The ops of `module` that the SPMD partitioner splits: those outside every
  `sdy.manual_computation` (a shard_map) that is manual over all of the mesh's axes of
  more than one device, in main and in the functions it calls from there, by name in
  program order.  Empty: the program is manual throughout, and the partitioner inserts
  no collective (it only joins the manual computations' inputs and outputs).

  A manual computation over some of the axes (an `auto` axis left to the partitioner)
  counts as auto-sharded, and so does every op of a program lowered without Shardy
  (GSPMD's custom calls mark manual regions by value, not by region): the route that
  sees the partitioner's collectives is the safe one for both.
  """
  facts = mesh_facts(module)
  functions = {
    traverse.function_name(view.operation): view.operation
    for view in module.body.operations
    if view.operation.name == "func.func"
  }
  found: list[str] = []
  seen: set[str] = set()

  def visit(function: ir.Operation) -> None:
    for block in function.regions[0].blocks:
      constant: set = set()  # values computed from constants alone: the same on every device
      for view in block.operations:
        op = view.operation
        if op.name in _INERT_OPS:
          constant.update(op.results)
          continue
        if not op.regions and all(v in constant for v in op.operands):
          # A constant's broadcast or reshape that JAX hoisted out of a shard_map: each
          # device computes it whole, nothing for the partitioner to split.
          constant.update(op.results)
          continue
        if op.name == MANUAL_COMPUTATION and not _partly_auto(op, facts):
          continue
        if op.name == SHARDING_CONSTRAINT and _restates_manual_output(op):
          continue
        if op.name == "func.call":
          callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
          if callee in functions and callee not in seen:
            seen.add(callee)
            visit(functions[callee])
          continue
        found.append(op.name)

  main = functions.get("main")
  if main is not None:
    visit(main)
  return found


def _restates_manual_output(constraint: ir.Operation) -> bool:
  """Whether an sdy.sharding_constraint asks for the sharding its operand already has as a
  manual computation's result (what shard_map's lowering adds after it: the partitioner
  has nothing to move)."""
  value: Any = constraint.operands[0]
  owner = value.owner
  if isinstance(owner, ir.Block) or owner.name != MANUAL_COMPUTATION:
    return False
  outs = list(sdy.TensorShardingPerValueAttr(owner.attributes["out_shardings"]).shardings)
  return str(outs[value.result_number]) == str(constraint.attributes["sharding"])


def _partly_auto(manual: ir.Operation, facts: ModuleFacts) -> bool:
  """Whether a manual computation leaves some mesh axis of more than one device to the
  partitioner (or names a mesh this module does not declare)."""
  shardings = list(sdy.TensorShardingPerValueAttr(manual.attributes["in_shardings"]).shardings)
  shardings += list(sdy.TensorShardingPerValueAttr(manual.attributes["out_shardings"]).shardings)
  if not shardings:
    return False  # no operand and no result: nothing crosses its boundary
  ref = sdy.TensorShardingAttr(shardings[0]).mesh_or_ref
  mesh = facts.mesh(ref.value) if isinstance(ref, ir.FlatSymbolRefAttr) else None
  if mesh is None:
    return True
  manual_axes = {str(a) for a in sdy.ManualAxesAttr(manual.attributes["manual_axes"])}  # type: ignore[attr-defined]
  return any(
    size > 1 and name not in manual_axes for name, size in zip(mesh.axis_names, mesh.axis_sizes)
  )


def find_all_reduces(module: ir.Module) -> list[ir.Operation]:
  """Every all-reduce that can run: in the public functions and what they reference.

  Private functions that nothing references are left out: XLA's HLO -> StableHLO
  conversion inlines while bodies and called computations and also keeps them as
  unused functions, and counting those would count each site twice.
  """
  return [
    op
    for func in traverse.called_functions(module)
    for op in traverse.walk(func)
    if is_all_reduce(op)
  ]


def find_sites(
  module: ir.Module, ops: tuple[str, ...] = (SiteKind.ALL_REDUCE,)
) -> list[ir.Operation]:
  """The collectives that can run (find_all_reduces' rule): every all-reduce (rewritten,
  made a reduce-scatter, or listed as skipped: whatever `ops` says), first, so their
  indices (which calibration files name) do not depend on `ops`; then the reduce-scatters
  and the all-gathers, when `ops` selects them."""
  functions = traverse.called_functions(module)
  found = find_all_reduces(module)
  for kind, name in ((SiteKind.REDUCE_SCATTER, REDUCE_SCATTER), (SiteKind.ALL_GATHER, ALL_GATHER)):
    if kind in ops:
      found += [op for func in functions for op in traverse.walk(func) if op.name == name]
  return found


def kind_of(op: ir.Operation) -> SiteKind:
  if op.name == REDUCE_SCATTER:
    return SiteKind.REDUCE_SCATTER
  if op.name == ALL_GATHER:
    return SiteKind.ALL_GATHER
  return SiteKind.ALL_REDUCE


def unused_all_reduces(module: ir.Module) -> int:
  """All-reduces in private functions that nothing references (never run)."""
  used = {traverse.function_name(f) for f in traverse.called_functions(module)}
  return sum(
    1
    for op in module.body.operations
    if op.operation.name == "func.func" and traverse.function_name(op.operation) not in used
    for inner in traverse.walk(op.operation)
    if is_all_reduce(inner)
  )


def async_computations(module: ir.Module) -> frozenset[str]:
  """Functions that an async_start runs (HLO `async-start(...), calls=`), by name."""
  names = set()
  for op in traverse.walk(module.operation):
    if op.name in ASYNC_STARTS and "called_computation" in op.attributes:
      names.update(traverse.symbol_names(op.attributes["called_computation"]))
  return frozenset(names)


def async_pair(op: ir.Operation) -> tuple[ir.Operation, ir.Operation] | None | str:
  """For an all-reduce inside an async_start: (async_start, async_done), or a reason
  the pair cannot be taken apart.  None for an all-reduce that is not async."""
  parent = op.parent
  if parent is None or parent.name not in ASYNC_STARTS:
    return None
  block = op.block
  body = [o.operation for o in block.operations]
  if (
    len(body) != 2
    or body[1].name not in ("stablehlo.return", "mhlo.return")
    or list(body[1].operands) != list(op.results)
  ):
    return "an async_start whose region holds more than the all-reduce"
  args = list(block.arguments)
  if len(args) != len(parent.operands) or list(op.operands) != args:
    return "an async_start whose operands are not the all-reduce's"
  users = [use.owner for result in parent.results for use in result.uses]
  if len(users) != 1 or users[0].name not in ASYNC_DONES:
    return "an async_start whose future is used by more than one async_done"
  return parent, users[0].operation


@dataclasses.dataclass(frozen=True)
class Operand:
  shape: tuple[int, ...] | None  # None: not a static shape
  dtype: str  # MLIR element type spelling: bf16, f16, f32, i32, ... (else the type's text)

  @property
  def size(self) -> int:
    """Elements; 0 when the shape is not static."""
    return int(np.prod(self.shape, dtype=np.int64)) if self.shape is not None else 0


@dataclasses.dataclass(frozen=True)
class Site:
  """An all-reduce as found: what every record starts from."""

  index: int
  location: str
  operands: tuple[Operand, ...]
  groups: tuple[tuple[int, ...], ...] | None  # None when the group form is unsupported
  device_kind: DeviceKind
  num_devices: int
  async_computation: str | None = None  # the async computation it is in, if any
  kind: SiteKind = SiteKind.ALL_REDUCE
  dimension: int = 0  # a reduce-scatter's scatter or an all-gather's gather dimension
  # An all-reduce whose one use slices out each device's own piece (own_piece_slice):
  # XLA's compiler runs the pair as a reduce-scatter, so natively it sends what a
  # reduce-scatter sends (plan.py prices it so).
  scattered: bool = False
  # "bf16 summed as f32" for each operand type an all-reduce widens to its result's (the
  # sum happens in the result's type), sorted: read while the op exists, for the report.
  promoted: tuple[str, ...] = ()
  # In a branch of a conditional (loops.in_branch): it runs only when the branch is taken.
  in_branch: bool = False
  # Its operand keeps the default layout (on a TPU, its last dimension on the lanes:
  # platforms.TileRule): the compiler passes a conditional's values in that layout, and
  # the site is in a branch or a branch uses its result.
  default_layout: bool = False

  @property
  def nbytes(self) -> int:
    """The bytes of the tensor reduced or gathered, which --equarx_min_bytes/max_bytes
    compare: the operands (an all-reduce's, a reduce-scatter's), or an all-gather's
    gathered result (its operand is one rank's piece)."""
    total = sum(o.size * DTYPE_BYTES.get(o.dtype, bytes_of(o.dtype)) for o in self.operands)
    return total * self.group_size if self.kind == SiteKind.ALL_GATHER else total

  @property
  def group_size(self) -> int:
    return len(self.groups[0]) if self.groups else 0


@dataclasses.dataclass(frozen=True)
class Candidate:
  site: Site
  op: ir.Operation
  layout: ChunkLayout
  schedule: GroupSchedule
  # A reduce-scatter written as an all-reduce whose one use slices out each rank's own
  # piece (what SPMD partitioning makes of a gradient's reduce-scatter): the slice.
  slice_op: ir.Operation | None = None
  # The plan's (plan.py): how it is rewritten on this topology, and the cost model's
  # prediction.
  route: Any = None
  prediction: Any = None
  # Rewritten under --equarx_force although the plan would have left it native: why.
  forced_over: str = ""


@dataclasses.dataclass(frozen=True)
class Skip:
  site: Site
  reason: str
  route: Any = None  # plan.py's, when the cost model left the site native
  prediction: Any = None


Decision = Union[Candidate, Skip]


def bytes_of(dtype: str) -> int:
  """Bytes per element of an MLIR element type spelling (bf16: 2, f32: 4, i8: 1, ...)."""
  digits = "".join(ch for ch in dtype if ch.isdigit())
  return max(1, int(digits) // 8) if digits else 4


# In a printed location: a NameLoc's name, and a file position.
_LOC_NAME = re.compile(r'"([^"]+)"\(')
_LOC_FILE = re.compile(r'"([^"]+)":(\d+):(\d+)')


# The leading jit(...)/pjit(...) scopes of a JAX op name say nothing about the layer.
_JIT_SCOPES = re.compile(r"^(?:p?jit\([^)/]*\)/)+")


def _location(op: ir.Operation) -> str:
  """'file.py:12 Block_3/Mlp/Dense_1/dot_general' from JAX's nested name/call-site
  locations: the source line, then the op's name path (the layer) without jit scopes."""
  text = str(op.location)
  names = _LOC_NAME.findall(text)
  pos = _LOC_FILE.search(text)
  where = f"{os.path.basename(pos.group(1))}:{pos.group(2)}" if pos else ""
  name = _JIT_SCOPES.sub("", names[0]) if names else ""
  return " ".join(p for p in (where, name) if p) or text


def describe(op: ir.Operation, index: int, facts: ModuleFacts) -> tuple[Site, str | None]:
  """The Site for an all-reduce, and why its replica groups are unusable (or None)."""
  operands = []
  kind = kind_of(op)
  # An all-reduce's result type: it may promote (bf16 in, f32 out), and the sum happens
  # in the result's type.  A reduce-scatter's or all-gather's operand: what is split or
  # sent (the element types are the same).
  for value in op.results if kind == SiteKind.ALL_REDUCE else op.operands:
    if isinstance(value.type, ir.ShapedType):
      t = ir.ShapedType(value.type)
      shape = tuple(t.shape) if t.has_rank and t.has_static_shape else None
      operands.append(Operand(shape, str(t.element_type)))
    else:
      operands.append(Operand(None, str(value.type)))
  attrs = op.attributes
  # A channel id <= 0 is no channel (the StableHLO spec; XLA runs such an all-reduce
  # across replicas): the mode is cross-replica, whatever the attribute's presence says.
  has_channel = traverse.channel_id(op) > 0
  global_ids = "use_global_device_ids" in attrs
  problem = None
  if has_channel and global_ids:
    # Groups hold global ids = replica * num_partitions + partition.
    device_kind: DeviceKind = "partition"
    num_devices = facts.num_partitions * facts.num_replicas
    if facts.num_replicas != 1:
      problem = "global device ids with several replicas (a permute addresses one dimension only)"
  elif has_channel:
    device_kind, num_devices = "partition", facts.num_partitions
    if facts.num_replicas != 1:
      problem = "cross-replica-and-partition groups with several replicas"
  else:
    device_kind, num_devices = "replica", facts.num_replicas
  if "replica_groups" in attrs:
    groups, group_problem = _replica_groups(attrs["replica_groups"], num_devices, facts)
  else:
    groups, group_problem = None, "no replica groups"
  if has_channel and not global_ids and problem is None:
    groups = (tuple(range(num_devices)),)  # num_replicas == 1: all partitions, one group
  function = traverse.enclosing_function(op)
  dimension_attr = {
    SiteKind.REDUCE_SCATTER: "scatter_dimension",
    SiteKind.ALL_GATHER: "all_gather_dim",
  }
  dimension = 0
  if kind in dimension_attr:
    dimension = ir.IntegerAttr(attrs[dimension_attr[kind]]).value
  in_branch = loops.in_branch(op, facts.branch_functions)
  site = Site(
    index,
    _location(op),
    tuple(operands),
    groups,
    device_kind,
    num_devices,
    function if function in facts.async_computations else None,
    kind,
    dimension,
    promoted=_promoted(op),
    in_branch=in_branch,
    default_layout=in_branch or loops.used_in_branch(op),
  )
  return site, problem or group_problem


def _promoted(op: ir.Operation) -> tuple[str, ...]:
  """'bf16 summed as f32' for each (operand, result) element type pair that differs (none
  where a type is not a ranked tensor: no candidate has one)."""
  values = [*op.operands, *op.results]
  if not all(isinstance(v.type, ir.RankedTensorType) for v in values):
    return ()
  pairs = {
    (str(ir.RankedTensorType(a.type).element_type), str(ir.RankedTensorType(r.type).element_type))
    for a, r in zip(op.operands, op.results)
  }
  return tuple(sorted(f"{a} summed as {r}" for a, r in pairs if a != r))


def _replica_groups(attr: ir.Attribute, num_devices: int, facts: ModuleFacts):
  """Replica groups as tuples of device ids, from the dense or the mesh-axes form."""
  # Dialect attributes are not downcast automatically: ask the class.
  if stablehlo.ReplicaGroupMeshAxesAttr.isinstance(attr):
    groups, problem = mesh_axes_groups(stablehlo.ReplicaGroupMeshAxesAttr(attr), facts)
    if problem:
      return None, problem
  elif isinstance(attr, ir.DenseIntElementsAttr):
    shape = tuple(ir.ShapedType(attr.type).shape)
    values = [int(v) for v in attr]  # type: ignore[attr-defined]  # iterable at run time
    if not values:
      return (tuple(range(num_devices)),), None  # empty: one group of every device
    rows = np.array(values, np.int64).reshape(shape)
    groups = tuple(tuple(int(v) for v in row if v >= 0) for row in rows)
  else:
    return None, f"replica groups in a form the pass does not expand ({attr})"
  try:
    make_schedule(groups)
  except ValueError as e:
    return None, f"unusable replica groups: {e}"
  if max(max(g) for g in groups) >= num_devices:
    return None, f"replica groups name device ids >= the {num_devices} devices of the module"
  return groups, None


def mesh_axes_groups(attr, facts: ModuleFacts):
  """#stablehlo.replica_group_mesh_axes<mesh, axes>: devices that differ only
  along `axes` form a group, ordered row-major over `axes` in the order given."""
  mesh_attr = attr.mesh
  if isinstance(mesh_attr, ir.FlatSymbolRefAttr):
    mesh = facts.mesh(mesh_attr.value)
    if mesh is None:
      return None, f"replica groups name mesh @{mesh_attr.value}, which the module lacks"
  else:
    mesh = _mesh_from_attr(mesh_attr)
  names = []
  for axis in attr.axes:
    ref = stablehlo.AxisRefAttr(axis)
    if ref.sub_axis_info is not None:
      return None, f"replica groups over a sub-axis of {ref.name!r} are not supported"
    if ref.name not in mesh.axis_names:
      return None, f"replica groups name axis {ref.name!r}, not in mesh {mesh.axis_names}"
    names.append(ref.name)
  inside = [mesh.axis_names.index(n) for n in names]
  outside = [i for i in range(len(mesh.axis_names)) if i not in inside]
  ids = np.array(mesh.device_ids, np.int64).reshape(mesh.axis_sizes)
  size = int(np.prod([mesh.axis_sizes[i] for i in inside], dtype=np.int64))
  rows = ids.transpose(outside + inside).reshape(-1, size)
  return tuple(tuple(int(v) for v in row) for row in rows), None


def _reduction_is_add(op: ir.Operation) -> bool:
  """The region is `return add(arg0, arg1)` on scalars.

  StableHLO applies that one region to every operand of a variadic all-reduce,
  so it has two arguments whatever the number of operands.
  """
  block = op.regions[0].blocks[0]
  body = [o.operation for o in block.operations]
  if len(block.arguments) != 2 or len(body) != 2:
    return False
  add, ret = body
  if add.name != "stablehlo.add" or ret.name != "stablehlo.return":
    return False
  args = {v.arg_number if isinstance(v, ir.BlockArgument) else -1 for v in add.operands}
  return args == {0, 1} and list(ret.operands) == [add.result]


# Each check: (site, op, selection) -> reason to skip, or None.  First hit wins.
def _check_enabled(site, op, selection, problem):
  if not selection.enable:
    return "pass not enabled (--equarx_enable is off)"


def _check_kind(site, op, selection, problem):
  if op.name == MHLO_ALL_REDUCE:
    return "mhlo.all_reduce that the conversion to StableHLO left: left as it is"
  if op.name == SDY_ALL_REDUCE:
    return (
      "sdy.all_reduce: a sharding op that SPMD partitioning lowers; the pass rewrites "
      "what it lowers to (equarx_pass.jit's partitioned route), left as it is"
    )
  if op.name == CUSTOM_CALL:
    return "an mhlo.all_reduce encoded as a custom call: left as it is"


def _check_async(site, op, selection, problem):
  pair = async_pair(op)
  if isinstance(pair, str):
    return f"async all-reduce: {pair}"
  if site.async_computation:
    return (
      "inside an async computation (HLO async-start ... calls=): replacing it there "
      "would break the async op; left as it is"
    )


def _check_supported_groups(site, op, selection, problem):
  return problem


def _check_reduction(site, op, selection, problem):
  if site.kind != SiteKind.ALL_GATHER and not _reduction_is_add(op):
    return "reduction is not add (only sums are quantized)"


def _check_types(site, op, selection, problem):
  for o in site.operands:
    if o.dtype not in selection.dtypes:
      return f"element type {o.dtype} not in --equarx_dtypes={','.join(selection.dtypes)}"
    if o.shape is None:
      return "dynamic shape"


def _check_size(site, op, selection, problem):
  if all(o.size == 0 for o in site.operands):
    return "zero elements: nothing to send"
  if site.nbytes < selection.min_bytes:
    return f"{site.nbytes} bytes < --equarx_min_bytes={selection.min_bytes}"
  if selection.max_bytes and site.nbytes > selection.max_bytes:
    return f"{site.nbytes} bytes > --equarx_max_bytes={selection.max_bytes}"


def _check_group_size(site, op, selection, problem):
  if site.group_size < 2:
    return "group of one device: nothing to reduce"


def _check_pieces(site, op, selection, problem):
  """A reduce-scatter or all-gather: one operand, and the tiled form (the only one these
  are emitted in)."""
  if site.kind == SiteKind.ALL_REDUCE:
    return None
  if len(site.operands) != 1:
    return f"{site.kind} of several operands"
  (operand,) = site.operands
  if site.kind == SiteKind.REDUCE_SCATTER and operand.shape[site.dimension] % site.group_size:
    return f"scatter dimension of {operand.shape[site.dimension]} not divisible by the group"
  flat_why = selection.flat_why
  if flat_why:
    return f"{site.kind} needs the tiled form ({flat_why})"
  if site.kind == SiteKind.REDUCE_SCATTER and not selection.scheme.algo.emits_reduce_scatter:
    return f"reduce_scatter: {selection.scheme.algorithm} has no reduce-scatter half"


def _check_known_divergence(site, op, selection, problem):
  """Configurations measured to break "every rank ends with the same bits": skipped
  with the reason rather than rewritten (BUILD_NOTES, "Faithfulness decisions")."""
  # The slow links' scheme too (--equarx_slow_format): the plan may send it across domains.
  schemes = (selection.scheme, selection.slow_scheme)
  int4_grid_ring = any(
    s.fmt.bits == 4 and s.block_layout == "grid" and s.algorithm != "two_shot" for s in schemes
  )
  if (
    site.kind == SiteKind.ALL_REDUCE
    and int4_grid_ring
    and (site.group_size == 2 or not rules_for(selection.platform).collectives_in_loops)
  ):
    # Written out (2 ranks: XLA inlines the one-step loops; on XLA:CPU the pass writes
    # every ring out), the last partial sum is an expression XLA recomputes in each of
    # its consumers, each contracting its multiply-add on its own.
    return (
      "int4 with the grid layout on a ring whose steps are written out (on CPU, or "
      "2 ranks) leaves the ranks up to an ulp apart; use two_shot, fixed blocks or int8 here"
    )


CHECKS: list[Callable] = [
  _check_enabled,
  _check_kind,
  _check_async,
  _check_supported_groups,
  _check_reduction,
  _check_types,
  _check_size,
  _check_group_size,
  _check_pieces,
  _check_known_divergence,
]


def match(op: ir.Operation, index: int, facts: ModuleFacts, selection: Selection) -> Decision:
  site, problem = describe(op, index, facts)
  for check in CHECKS:
    reason = check(site, op, selection, problem)
    if reason:
      return Skip(site, reason)
  assert site.groups is not None  # _check_supported_groups skips sites without
  # Under --equarx_identity too: identity takes this route and emits the all-reduce and a
  # slice of the piece recognised here (site_patterns.emit_native).
  if site.kind == SiteKind.ALL_REDUCE and SiteKind.REDUCE_SCATTER in selection.ops:
    piece = own_piece_slice(op, site)
    if piece is not None:
      dimension, slice_op = piece
      scattered = dataclasses.replace(site, kind=SiteKind.REDUCE_SCATTER, dimension=dimension)
      if _check_pieces(scattered, op, selection, problem) is None:
        layout = site_layout(scattered, selection.scheme)
        return Candidate(scattered, op, layout, make_schedule(site.groups), slice_op)
  if site.kind == SiteKind.ALL_REDUCE and SiteKind.ALL_REDUCE not in selection.ops:
    return Skip(site, f"--equarx_ops={','.join(selection.ops)} does not select all-reduces")
  if site.kind == SiteKind.ALL_REDUCE and own_piece_slice(op, site) is not None:
    site = dataclasses.replace(site, scattered=True)
  assert site.groups is not None
  return Candidate(site, op, site_layout(site, selection.scheme), make_schedule(site.groups))


def site_layout(site: Site, scheme) -> ChunkLayout:
  """The chunks of a site's quantized collective over its whole group under `scheme`."""
  total = sum(o.size for o in site.operands)
  if site.kind == SiteKind.ALL_GATHER:  # every rank's piece, as a reduce-scatter's operand
    total *= site.group_size
  return scheme.layout(total, site.group_size)


def own_piece_slice(op: ir.Operation, site: Site) -> tuple[int, ir.Operation] | None:
  """(dimension, the slice) when the all-reduce's one use is a dynamic_slice that gives
  each device of a group its own piece, in group order, along one dimension: a
  reduce-scatter.  The slice's start indices must be constants or a constant table
  indexed by the device id (SPMD partitioning's form), known for every device."""
  if len(op.operands) != 1 or site.groups is None:
    return None
  users = [use.owner for use in op.results[0].uses]
  if len(users) != 1 or users[0].name != "stablehlo.dynamic_slice":
    return None
  slice_op = users[0].operation
  if slice_op.operands[0] != op.results[0]:
    return None
  shape = ir.RankedTensorType(op.results[0].type).shape
  sizes = list(ir.DenseI64ArrayAttr(slice_op.attributes["slice_sizes"]))
  starts = [
    _per_device_values(v, site.num_devices, site.device_kind) for v in slice_op.operands[1:]
  ]
  if any(s is None for s in starts):
    return None
  cut = [i for i, (size, full) in enumerate(zip(sizes, shape)) if size != full]
  n = site.group_size
  if len(cut) != 1 or shape[cut[0]] != sizes[cut[0]] * n:
    return None
  (dimension,) = cut
  for group in site.groups:
    for rank, device in enumerate(group):
      offsets = [s[device] for s in starts]  # type: ignore[index]
      want = [rank * sizes[dimension] if i == dimension else 0 for i in range(len(shape))]
      if offsets != want:
        return None
  return dimension, slice_op


# Integer arithmetic on the device id that XLA's simplifier writes in place of a table
# lookup (a table 0, k, 2k, ... indexed by the partition id becomes id * k).
_INT_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
  "stablehlo.add": np.add,
  "stablehlo.subtract": np.subtract,
  "stablehlo.multiply": np.multiply,
  "stablehlo.minimum": np.minimum,
  "stablehlo.maximum": np.maximum,
}
_MAX_EXPRESSION_DEPTH = 32


def _per_device_values(value: ir.Value, num_devices: int, device_kind: str) -> list[int] | None:
  """An integer scalar's value on each device, where it is computed from constants and the
  partition (or replica) id by reshapes, converts, integer arithmetic and lookups in
  constant tables; else None."""
  want = "stablehlo.partition_id" if device_kind == "partition" else "stablehlo.replica_id"
  ids = np.arange(num_devices, dtype=np.int64)
  values = _evaluate(value, ids, want, 0)
  return None if values is None else [int(v) for v in values]


def _integer_scalar_type(value: ir.Value) -> ir.IntegerType | None:
  """The element type of a one-element integer tensor, else None."""
  if not isinstance(value.type, ir.RankedTensorType):
    return None
  t = ir.RankedTensorType(value.type)
  if not t.has_static_shape or int(np.prod(t.shape, dtype=np.int64)) != 1:
    return None
  if not isinstance(t.element_type, ir.IntegerType):
    return None
  return ir.IntegerType(t.element_type)


def _evaluate(value: ir.Value, ids: np.ndarray, id_op: str, depth: int) -> np.ndarray | None:
  """The value on each device (one entry per id), or None where it is not a known
  function of the device id.  Results outside their integer type are refused rather
  than wrapped."""
  element = _integer_scalar_type(value)
  owner = value.owner
  if element is None or depth > _MAX_EXPRESSION_DEPTH:
    return None
  if not isinstance(owner, (ir.OpView, ir.Operation)):
    return None  # a block argument: not known here
  op = owner.operation
  operands = list(op.operands)

  def arg(i):
    return _evaluate(operands[i], ids, id_op, depth + 1)

  result: np.ndarray | None = None
  if op.name == id_op:
    result = ids.copy()
  elif op.name == "stablehlo.constant":
    attr = op.attributes["value"]
    if isinstance(attr, ir.DenseIntElementsAttr) and attr.is_splat:
      result = np.full(ids.shape, ir.IntegerAttr(attr.get_splat_value()).value, np.int64)
  elif op.name in ("stablehlo.reshape", "stablehlo.convert"):
    result = arg(0)
  elif op.name in _INT_BINARY and len(operands) == 2:
    a, b = arg(0), arg(1)
    if a is not None and b is not None:
      result = _INT_BINARY[op.name](a, b)
  elif op.name in ("stablehlo.divide", "stablehlo.remainder") and len(operands) == 2:
    a, b = arg(0), arg(1)
    if a is not None and b is not None and np.all(b != 0):
      quotient = np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))  # truncated, as XLA
      result = quotient if op.name == "stablehlo.divide" else a - b * quotient
  elif op.name == "stablehlo.clamp" and len(operands) == 3:
    low, x, high = arg(0), arg(1), arg(2)
    if low is not None and x is not None and high is not None:
      result = np.minimum(np.maximum(x, low), high)
  elif op.name == "stablehlo.dynamic_slice" and len(operands) == 2:
    result = _table_lookup(operands[0], arg(1))
  if result is None:
    return None
  width = element.width
  low_bound, high_bound = (
    (0, 2**width - 1) if element.is_unsigned else (-(2 ** (width - 1)), 2 ** (width - 1) - 1)
  )
  if element.width > 1 and (result.min() < low_bound or result.max() > high_bound):
    return None
  return result


def _table_lookup(table: ir.Value, index: np.ndarray | None) -> np.ndarray | None:
  """dynamic_slice of one entry of a 1-D constant table at `index` (clamped into the
  table, as dynamic_slice clamps its start)."""
  owner = table.owner
  if index is None or not isinstance(owner, (ir.OpView, ir.Operation)):
    return None
  op = owner.operation
  if op.name != "stablehlo.constant":
    return None
  attr = op.attributes["value"]
  if not isinstance(attr, ir.DenseIntElementsAttr) or len(ir.ShapedType(attr.type).shape) != 1:
    return None
  entries = np.array([int(v) for v in attr], np.int64)  # type: ignore[attr-defined]
  return entries[np.clip(index, 0, len(entries) - 1)]
