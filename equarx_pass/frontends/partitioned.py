"""The partitioned route: all-reduces that the SPMD partitioner inserts.

A `jax.jit` program sharded with NamedSharding has no all-reduce in its lowered
StableHLO: the partitioner (Shardy, then XLA's SPMD partitioner) adds them while
compiling.  This module gets them:

1. compile the original lowering once, with XLA dumping the module into a
   temporary directory (as a proto: lossless) after its `spmd-partitioning` pass and,
   on XLA:CPU, after the `simplification` pipeline that follows it: the per-device
   program, with the all-reduces, before any fusion or layout assignment (why the
   later of the two: `_pick_dump`);
2. convert that HLO module to StableHLO, rewrite its all-reduces (rewrite.py);
3. build a module that keeps the original `main` signature (global shapes, the
   shardings of the first compile, donation) and whose body is one
   `sdy.manual_computation` over every mesh axis that calls the rewritten
   per-device program: the partitioner has nothing left to do but split the
   inputs and join the outputs, exactly as it did the first time.

The new module compiles through the original lowering (`_jax_private.lowered_with_module`),
so the result is a real `jax.stages.Lowered` / `Compiled` with the same input and
output shardings as plain jax.jit.

Why not the public `jax.extend.xla.register_hlo_module_transformation` hook:
see BUILD_NOTES.md ("Compiler-inserted all-reduces"); in short, it hands over the
module after fusion and layout assignment, and the StableHLO round trip drops the
fusions' backend configs, which XLA:CPU then refuses.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import time

import numpy as np
from jax.extend import mlir as jax_mlir
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import func, sdy, stablehlo

from equarx_pass import _jax_private
from equarx_pass.errors import RewriteError
from equarx_pass.frontends import tpu_aot
from equarx_pass.ir import dot_transposes, mhlo_legalize, traverse
from equarx_pass.planning import match
from equarx_pass.planning.policy import Policy
from equarx_pass.platforms import named_by_jax, rules_for
from equarx_pass.rewrite import RewriteResult, copy_module, rewrite_module, verify
from equarx_pass.site_kind import SiteKind

# XLA dumps the module after every pass whose name matches: the SPMD partitioner proper
# (the pass that inserts the collectives), and the algebraic simplification pipeline
# that XLA:CPU runs to a fixed point after it (_pick_dump says why).  The partitioner's
# name is the platform's: `spmd-partitioning` in XLA's CPU and GPU pipelines,
# `tpu-spmd-partitioning` in libtpu's; any pass whose name ends so is taken.
PARTITION_PASS = r"[\w-]*spmd-partitioning"
SIMPLIFICATION_PASS = "simplification"
# Platforms whose read compile (the one that exposes the partitioned program) runs at
# the lowest execution-time optimization effort: that compile's executable is thrown
# away, and on TPU its code generation is most of the compile (a MaxText step: the
# partitioner is done in a few percent of it).  The partitioned program sends the same
# at any effort: the same text, or for a scanned loop one iteration not peeled out
# (tests/test_tpu_partitioned.py compares them).  On CPU the read compile is plain
# jax.jit's own, reused when nothing is rewritten.
CHEAP_READ_PLATFORMS = ("tpu",)
# Symbol of the per-device program inside the rebuilt module.
PER_DEVICE_MAIN = "equarx_per_device_main"
PER_DEVICE_PREFIX = "equarx_per_device_"


class NotPartitionable(Exception):
  """The program cannot take the partitioned route; the message says why.

  Not an EquarxError: jit.py catches it and runs the program as plain jax.jit
  would, with the reason in the site report.  `compiled`: plain jax.jit's executable
  where the read compile already made it, else None.
  """

  compiled: object = None


@dataclasses.dataclass
class PartitionedRewrite:
  compiled: object  # plain jax.jit's executable, where the read compile made it; else None
  result: RewriteResult  # its site records; result.module's functions were moved
  # into `module` (_rebuild), so read the program there
  module: ir.Module | None  # the rebuilt global module; None when nothing was rewritten
  first_compile_seconds: float  # compiling the original to expose its per-device program
  pass_seconds: float  # converting, rewriting and rebuilding
  # all-reduces in plain jax.jit's compiled program, where the read compile made it
  compiled_all_reduces: int | None


def rewrite_partitioned(lowered, policy: Policy, devices=None) -> PartitionedRewrite:
  """Compile `lowered` once to get its per-device program, rewrite it, rebuild it.
  `devices`: its devices, whose fast domains the sites are planned on (rewrite.rewrite_module).

  Raises NotPartitionable with `.compiled` set to the read compile's executable where it
  is plain jax.jit's own (so that the caller need not compile again)."""
  start = time.perf_counter()
  compiled, hlo_proto, reusable = _compile_and_dump(lowered)
  first_compile = time.perf_counter() - start
  start = time.perf_counter()
  original = lowered.compiler_ir("stablehlo")
  if not holds_collective(hlo_proto, policy.ops):
    # Nothing to rewrite (a parameter initialisation, a helper): no conversion, no pass;
    # under --equarx_identity too, which takes the routes --equarx_enable takes.
    return PartitionedRewrite(
      compiled if reusable else None,
      RewriteResult(original, [], 0.0),
      None,
      first_compile,
      time.perf_counter() - start,
      0 if reusable else None,
    )
  try:
    mesh_name, mesh = _only_mesh(original)
    per_device = _per_device_module(hlo_proto, original, _jax_private.lowered_platform(lowered))
  except NotPartitionable as e:
    e.compiled = compiled if reusable else None
    raise
  result = rewrite_module(per_device, policy, _jax_private.lowered_platform(lowered), devices)
  module = None
  if result.modified or policy.identity:  # identity: rebuild even with no site selected
    in_shardings, out_shardings = _jax_private.executable_shardings(compiled)
    module = _rebuild(
      original, result.module, mesh_name, mesh, in_shardings, out_shardings, devices
    )
  return PartitionedRewrite(
    compiled if reusable else None,
    result,
    module,
    first_compile,
    time.perf_counter() - start,
    count_compiled_all_reduces(compiled) if reusable else None,
  )


def ops_outside(auto_ops) -> str:
  """'12 ops outside shard_map, e.g. stablehlo.dot_general' (match.auto_sharded_ops')."""
  n = len(auto_ops)
  return f"{n} op{'s' if n != 1 else ''} outside shard_map, e.g. {auto_ops[0]}"


def unseen_note(auto_ops, reach: str) -> str:
  """The report's "not considered" line for a program with auto-sharded parts read on the
  lowered route, and what reaches them ("" for a program manual throughout)."""
  if not auto_ops:
    return ""
  return (
    "the collectives XLA's SPMD partitioner inserts into the auto-sharded part "
    f"({ops_outside(auto_ops)}) are not in this program and were not considered; "
    f"reached by: {reach}"
  )


# The HLO opcodes of each kind of site (an async pair's start names its kind too).
SITE_OPCODES = {
  SiteKind.ALL_REDUCE: b"all-reduce",
  SiteKind.REDUCE_SCATTER: b"reduce-scatter",
  SiteKind.ALL_GATHER: b"all-gather",
}


def holds_collective(hlo_proto: bytes, ops) -> bool:
  """Whether the serialized HloModuleProto may hold a site: an all-reduce, or a collective
  of the kinds `ops` names: its bytes hold the opcode's name (a proto stores each
  instruction's opcode as a string).  A name or metadata that merely contains it can only
  say yes, and a yes costs just the full read."""
  # Every all-reduce is a site whatever `ops` says (match.find_sites): rewritten, taken as
  # a reduce-scatter with the slice after it, or listed as skipped.
  opcodes = {SITE_OPCODES[SiteKind.ALL_REDUCE]} | {SITE_OPCODES[SiteKind(op)] for op in ops}
  return any(opcode in hlo_proto for opcode in opcodes)


def count_compiled_all_reduces(compiled) -> int:
  """All-reduces (sync, or async start) in a Compiled's optimized HLO.  XLA's combiner
  merges all-reduces after partitioning, so this can be fewer than the sites."""
  return sum(
    tpu_aot.count_collectives(module.to_string())["all_reduces"]
    for module in _jax_private.compiled_hlo_modules(compiled)
  )


def _compile_and_dump(lowered, cheap: bool | None = None):
  """Compile `lowered` (a fresh executable) and return it with the partitioned program,
  a serialized HloModuleProto (_pick_dump says which point of XLA's pipeline), and
  whether the executable is plain jax.jit's (False: a cheap read compile, whose
  shardings hold but whose code is not to be run).  `cheap`: whether to read at the
  lowest effort (default: on CHEAP_READ_PLATFORMS).

  The dump is XLA's binary proto, not its text: the text elides constants of more
  than 10 elements (`constant({...})`), which then parse back as garbage, and it
  rounds nothing else but is still a printed form.  The proto is the module itself.
  """
  platform = _jax_private.lowered_platform(lowered)
  after_simplification = rules_for(named_by_jax(platform)).read_after_simplification
  passes = [PARTITION_PASS] + ([SIMPLIFICATION_PASS] if after_simplification else [])
  if cheap is None:
    cheap = platform in CHEAP_READ_PLATFORMS
  with tempfile.TemporaryDirectory(prefix="equarx_spmd_") as tmp:
    # rgv3_materialization off: XLA then writes the collectives' groups as device lists
    # (iota or explicit), which the conversion to StableHLO keeps; in its mesh-axes form
    # the conversion drops each collective's device order (see mesh_device_ids).
    options: dict = {
      "xla_dump_to": tmp,
      "xla_dump_hlo_pass_re": f"^({'|'.join(passes)})$",
      "xla_dump_hlo_as_proto": True,
      "xla_dump_hlo_as_text": False,
      "xla_enable_rgv3_materialization": False,
    }
    if cheap:
      options.update(_jax_private.lowest_effort_options())
    # Never from (or into) JAX's persistent cache: a cached executable comes with no dump.
    compiled = _jax_private.compile_uncached(lowered, options)
    try:
      name = _pick_dump(os.listdir(tmp), platform)
    except NotPartitionable as e:
      e.compiled = None if cheap else compiled
      raise
    with open(os.path.join(tmp, name), "rb") as f:
      return compiled, hlo_module_of_dump(f.read()), not cheap


# module_0001.jit_f.0007.HLO_passes_through_layout_assignment.after_simplification.before_X.hlo.pb
_DUMP_NAME = re.compile(r"^module_\d+\..*\.(\d+)\.[\w-]+\.after_([\w-]+)\.before_[\w-]+\.hlo\.pb$")


def _pick_dump(names: list[str], platform: str) -> str:
  """The dump to rewrite: on XLA:CPU the module after the first `simplification`
  pipeline that follows SPMD partitioning, else (or where XLA ran none) the module
  right after partitioning.

  Why not always right after partitioning: the rebuilt module reaches XLA through the
  StableHLO -> HLO translation, which folds what the partitioner leaves (identity
  broadcasts, reshape chains), so XLA's algebraic simplifier starts from another program
  than it did in the first compile and can rewrite an op differently (flax's wmt train
  step: softmax's divide by the broadcast row sum kept as a divide, where plain jax.jit
  multiplies by the reciprocal; gradients one ulp off, 1.8e-07 relative).  After the
  simplification pipeline, which XLA runs to a fixed point, the program has no such
  patterns left and the second compile's passes find it as the first compile left it.
  Measured on XLA:CPU only; other backends keep the module right after partitioning.
  """
  steps: dict[str, list[tuple[int, str]]] = {PARTITION_PASS: [], SIMPLIFICATION_PASS: []}
  for name in names:
    m = _DUMP_NAME.match(name)
    if not m:
      continue
    if re.fullmatch(PARTITION_PASS, m.group(2)):
      steps[PARTITION_PASS].append((int(m.group(1)), name))
    elif m.group(2) == SIMPLIFICATION_PASS:
      steps[SIMPLIFICATION_PASS].append((int(m.group(1)), name))
  if not steps[PARTITION_PASS]:
    raise NotPartitionable(
      f"XLA's {platform} compiler ran no pass named like '{PARTITION_PASS}' (the SPMD "
      "partitioner), so the program's partitioned form cannot be read"
    )
  partitioned_at, partitioned_name = max(steps[PARTITION_PASS])
  later = sorted(s for s in steps[SIMPLIFICATION_PASS] if s[0] > partitioned_at)
  if rules_for(named_by_jax(platform)).read_after_simplification and later:
    return later[0][1]
  return partitioned_name


def hlo_module_of_dump(data: bytes) -> bytes:
  """The HloModuleProto inside the HloProto that XLA dumps (its field 1, `hlo_module`).

  Protobuf wire format, read by hand: field 1 is length-delimited (wire type 2).
  """
  pos = 0
  while pos < len(data):
    key, pos = _proto_varint(data, pos)
    field, wire_type = key >> 3, key & 7
    if wire_type == 0:
      _, pos = _proto_varint(data, pos)
    elif wire_type == 1:
      pos += 8
    elif wire_type == 5:
      pos += 4
    elif wire_type == 2:
      size, pos = _proto_varint(data, pos)
      if field == 1:
        if pos + size > len(data):
          break
        return data[pos : pos + size]
      pos += size
    else:
      break
  raise RewriteError(
    "XLA's dump of the partitioned program holds no HLO module "
    "(an HloProto without field hlo_module)"
  )


def _proto_varint(data: bytes, pos: int) -> tuple[int, int]:
  value = shift = 0
  while True:
    if pos >= len(data):
      raise RewriteError("XLA's dump of the partitioned program is truncated")
    byte = data[pos]
    pos += 1
    value |= (byte & 0x7F) << shift
    shift += 7
    if not byte & 0x80:
      return value, pos


def _only_mesh(module: ir.Module):
  """The module's one sdy.mesh with axes: (symbol name, match.Mesh).  A mesh of no
  axes (JAX's @empty_mesh, for values on one device such as a typed PRNG key or an
  optimizer's step count made outside jit) shards nothing, so it is not counted.  Meshes
  of the same axes and devices under two names are one mesh: JAX 0.11 and later give a
  shard_map's mesh-axes replica groups a symbol of their own (@mesh_0 beside @mesh)."""
  meshes: dict[match.Mesh, str] = {}
  for name, mesh in match.mesh_facts(module).meshes:
    if mesh.axis_names:
      meshes.setdefault(mesh, name)
  if len(meshes) != 1:
    raise NotPartitionable(
      f"the program uses {len(meshes)} device meshes; the partitioned route handles exactly one"
    )
  ((mesh, name),) = meshes.items()
  return name, mesh


def _per_device_module(proto: bytes, original: ir.Module, platform: str) -> ir.Module:
  """The partitioned program (an HloModuleProto) -> StableHLO in `original`'s context.

  The conversion drops the device counts and writes replica groups as
  mesh-axes attributes over a mesh of its own; both are made explicit here so
  that the functions can move into another module.  Where the program is read after
  XLA's simplification (CPU), the transposes that a dot reads and that XLA wrote in the
  default layout are folded into the dots (ir/dot_transposes.py: the way back to HLO
  would lay them out otherwise, and XLA:CPU would compute such a bf16 dot in f32).
  The ops it leaves in MHLO are
  written in StableHLO (mhlo_legalize); one that cannot be is refused where the
  rebuilt program compiles through StableHLO (every platform but XLA:CPU).
  """
  module = ir.Module.parse(jax_mlir.hlo_to_stablehlo(proto), context=original.context)
  left = mhlo_legalize.legalize(module)
  if left and not rules_for(named_by_jax(platform)).compiles_mhlo:
    raise NotPartitionable(
      f"the {platform}-partitioned program holds {', '.join(left)}, which StableHLO "
      f"cannot express and the {platform} compiler takes StableHLO only"
    )
  if any(op.operation.name == "sdy.mesh" for op in module.body.operations):
    # Mesh-form groups (XLA writes them despite rgv3 materialization off): their device
    # order is only in XLA's text of the module.
    _restore_mesh_device_ids(module, mesh_device_ids(_jax_private.hlo_proto_to_text(proto)))
  attrs = original.operation.attributes
  for name in ("mhlo.num_partitions", "mhlo.num_replicas"):
    if name in attrs:
      module.operation.attributes[name] = attrs[name]
  _dense_replica_groups(module)
  if rules_for(named_by_jax(platform)).read_after_simplification:
    dot_transposes.fold_default_layout_transposes(module)
  for op in list(module.body.operations):
    if op.operation.name == "sdy.mesh":
      op.operation.erase()
  return module


# XLA's text for a collective's groups over a device mesh:
#   replica_groups=mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_0'}
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(([^)]*\)?)\))?")
_IOTA = re.compile(r"^\[([\d,]+)\](?:<=\[([\d,]+)\])?(?:T\(([\d,]+)\))?$")


def mesh_device_ids(hlo_text: str) -> dict[tuple, tuple[int, ...]]:
  """The device order of each mesh XLA's collectives name: {((axis, size), ...): ids}.

  jaxlib's HLO -> StableHLO conversion writes such a mesh as an sdy.mesh without its
  device ids, which would silently make every group of a mesh whose order is not the
  identity the wrong devices.  A mesh given two orders is refused.
  """
  found: dict[tuple[tuple[str, int], ...], tuple[int, ...]] = {}
  for m in _MESH_GROUPS.finditer(hlo_text):
    axes = tuple(
      (name.strip().strip("'\""), int(size))
      for name, _, size in (a.partition("=") for a in m.group(1).split(",") if a)
    )
    count = int(np.prod([size for _, size in axes], dtype=np.int64))
    ids = _device_ids(m.group(2), count) if m.group(2) else tuple(range(count))
    if found.setdefault(axes, ids) != ids:
      raise NotPartitionable(
        f"the partitioned program orders the devices of mesh {axes} "
        "in two ways; the route cannot rebuild it faithfully"
      )
  return found


def _device_ids(text: str, count: int) -> tuple[int, ...]:
  """`[2,4]T(1,0)` (iota reshaped and transposed), `[8]<=[2,4]T(1,0)`, or `0,4,1,5,...`."""
  text = text.strip()
  m = _IOTA.match(text)
  if m:
    dims = [int(d) for d in m.group(1).split(",")]
    source = [int(d) for d in m.group(2).split(",")] if m.group(2) else dims
    iota = np.arange(count).reshape(source)
    if m.group(3):
      iota = iota.transpose([int(p) for p in m.group(3).split(",")])
    return tuple(int(i) for i in iota.reshape(-1))
  try:
    ids = tuple(int(i) for i in text.split(","))
  except ValueError:
    raise NotPartitionable(
      f"device ids {text!r} in the partitioned program are in a form the route does not read"
    ) from None
  if sorted(ids) != list(range(count)):
    raise NotPartitionable(f"device ids {text!r} are not a permutation of {count} devices")
  return ids


def _restore_mesh_device_ids(module: ir.Module, device_ids: dict) -> None:
  """Give each sdy.mesh of the converted program the device ids XLA's program had."""
  for op in module.body.operations:
    if op.operation.name != "sdy.mesh":
      continue
    mesh = sdy.MeshAttr(op.attributes["mesh"])
    axes = tuple((sdy.MeshAxisAttr(a).name, int(sdy.MeshAxisAttr(a).size)) for a in mesh.axes)
    ids = device_ids.get(axes)
    if ids is None or ids == tuple(range(len(ids))):
      continue
    text = ", ".join(f'"{name}"={size}' for name, size in axes)
    op.attributes["mesh"] = ir.Attribute.parse(
      f"#sdy.mesh<[{text}], device_ids=[{', '.join(map(str, ids))}]>", module.context
    )


def _dense_replica_groups(module: ir.Module) -> None:
  """Every #stablehlo.replica_group_mesh_axes attribute -> dense device-id groups."""
  facts = match.mesh_facts(module)
  i64 = ir.IntegerType.get_signless(64, module.context)
  for op in traverse.walk(module.operation):
    attrs = op.attributes
    if "replica_groups" not in attrs:
      continue
    attr = attrs["replica_groups"]
    if not stablehlo.ReplicaGroupMeshAxesAttr.isinstance(attr):
      continue
    groups, problem = match.mesh_axes_groups(stablehlo.ReplicaGroupMeshAxesAttr(attr), facts)
    if problem:
      raise NotPartitionable(f"{op.name} in the partitioned program: {problem}")
    array = np.array(groups, np.int64)
    with module.context, ir.Location.unknown():
      attrs["replica_groups"] = ir.DenseIntElementsAttr.get(  # type: ignore[call-overload]
        array, type=ir.RankedTensorType.get(list(array.shape), i64)
      )


def sdy_sharding_text(sharding, mesh_name: str, mesh: match.Mesh, rank: int, devices=None) -> str:
  """A jax NamedSharding over the module's mesh -> `#sdy.sharding<@mesh, [...]>` text.
  `devices` (the program's): where given, a GSPMDSharding (what XLA chose for an argument
  passed unsharded, such as a NumPy array) is named over the mesh where one spec means it."""
  spec = getattr(sharding, "spec", None)
  jax_mesh = getattr(sharding, "mesh", None)
  if (spec is None or jax_mesh is None) and devices:
    by_id = {d.id: d for d in devices}
    if all(i in by_id for i in mesh.device_ids):
      named = _jax_private.named_on_mesh(
        sharding, mesh.axis_names, mesh.axis_sizes, [by_id[i] for i in mesh.device_ids], rank
      )
      if named is not None:
        spec, jax_mesh = named.spec, named.mesh
  if (spec is None or jax_mesh is None) and getattr(sharding, "is_fully_replicated", False):
    # XLA hands back a replicated result of a program that mixes shard_map and
    # auto-sharding as a GSPMDSharding: every device holds it whole, in any mesh.
    return f"#sdy.sharding<@{mesh_name}, [{', '.join(['{}'] * rank)}]>"
  if spec is None or jax_mesh is None:
    raise NotPartitionable(f"a sharding the partitioned route cannot express: {sharding}")
  if tuple(jax_mesh.axis_names) != tuple(mesh.axis_names) or tuple(jax_mesh.axis_sizes) != tuple(
    mesh.axis_sizes
  ):
    raise NotPartitionable(
      f"sharding {sharding} is over another mesh than the program's "
      f"{dict(zip(mesh.axis_names, mesh.axis_sizes))}"
    )
  if getattr(spec, "unreduced", None) or getattr(spec, "reduced", None):
    raise NotPartitionable(f"unreduced/reduced axes in {sharding} are not supported")
  dims = []
  for i in range(rank):
    entry = spec[i] if i < len(spec) else None
    names = () if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry))
    dims.append("{" + ", ".join(f'"{n}"' for n in names) + "}")
  return f"#sdy.sharding<@{mesh_name}, [{', '.join(dims)}]>"


def _rebuild(
  original: ir.Module,
  per_device: ir.Module,
  mesh_name: str,
  mesh: match.Mesh,
  in_shardings,
  out_shardings,
  devices=None,
) -> ir.Module:
  """`original`'s main (signature and attributes) around the per-device program."""
  module = copy_module(original)
  ctx = module.context
  with ctx, ir.Location.unknown(ctx):
    main = _function(module, "main", "the lowered module has no main function")
    # Everything but main and the mesh goes: main's new body calls only the
    # per-device program.
    for op in list(module.body.operations):
      if op.operation.name == "func.func" and op.operation != main.operation:
        op.operation.erase()
    _move_functions(per_device, module)
    per_main = _function(module, PER_DEVICE_MAIN, f"no function @{PER_DEVICE_MAIN} after the move")

    arg_types = list(main.type.inputs)
    result_types = list(main.type.results)
    local_in = list(per_main.type.inputs)
    local_out = list(per_main.type.results)
    if len(local_in) != len(arg_types) or len(local_out) != len(result_types):
      raise NotPartitionable(
        f"the partitioned program takes {len(local_in)} arguments and returns "
        f"{len(local_out)} results; the original main {len(arg_types)} and {len(result_types)}"
      )
    if len(in_shardings) != len(arg_types) or len(out_shardings) != len(result_types):
      raise NotPartitionable("the executable's shardings do not match main's arguments and results")
    in_attrs = [
      ir.Attribute.parse(sdy_sharding_text(s, mesh_name, mesh, len(t.shape), devices))
      for s, t in zip(in_shardings, map(ir.RankedTensorType, arg_types))
    ]
    out_attrs = [
      ir.Attribute.parse(sdy_sharding_text(s, mesh_name, mesh, len(t.shape), devices))
      for s, t in zip(out_shardings, map(ir.RankedTensorType, result_types))
    ]
    _set_value_attrs(main, "arg_attrs", in_attrs)
    _set_value_attrs(main, "res_attrs", out_attrs)

    block = main.regions[0].blocks[0]
    for op in reversed(list(block.operations)):
      op.operation.erase()
    with ir.InsertionPoint(block):
      manual = sdy.ManualComputationOp(
        result_types,
        list(block.arguments),
        sdy.TensorShardingPerValueAttr.get(in_attrs),
        sdy.TensorShardingPerValueAttr.get(out_attrs),
        sdy.ManualAxesAttr.get([ir.StringAttr.get(n) for n in mesh.axis_names]),
      )
      body = manual.regions[0].blocks.append(*local_in)
      with ir.InsertionPoint(body):
        call = func.CallOp(
          local_out, ir.FlatSymbolRefAttr.get(PER_DEVICE_MAIN), list(body.arguments)
        )
        sdy.ReturnOp(list(call.results))
      func.ReturnOp(list(manual.results))
  verify(module, "rebuilt partitioned program")
  return module


def _function(module: ir.Module, name: str, missing: str):
  op = traverse.find_function(module, name)
  if op is None:
    raise RewriteError(missing)
  return op.opview


def _move_functions(source: ir.Module, target: ir.Module) -> None:
  """Move every function of `source` into `target`, prefixed and private."""
  for op in list(source.body.operations):
    if op.operation.name != "func.func":
      continue
    old = ir.StringAttr(op.attributes["sym_name"]).value
    new = PER_DEVICE_MAIN if old == "main" else PER_DEVICE_PREFIX + old
    ir.SymbolTable.replace_all_symbol_uses(old, new, source.operation)
    ir.SymbolTable.set_symbol_name(op, new)
  for op in list(source.body.operations):
    if op.operation.name != "func.func":
      continue
    op.attributes["sym_visibility"] = ir.StringAttr.get("private", target.context)
    # Shardings of the per-device program's own parameters mean nothing inside
    # the manual computation.
    for key in ("arg_attrs", "res_attrs"):
      if key in op.attributes:
        del op.attributes[key]
    op.operation.move_after(list(target.body.operations)[-1])


def _set_value_attrs(main, key: str, shardings) -> None:
  """Set sdy.sharding in main's per-argument (or per-result) attribute dictionaries."""
  old = main.attributes[key] if key in main.attributes else None
  dicts = []
  for i, sharding in enumerate(shardings):
    entries = {}
    if old is not None:
      d = ir.DictAttr(ir.ArrayAttr(old)[i])
      for j in range(len(d)):
        named = d[j]
        entries[named.name] = named.attr
    entries["sdy.sharding"] = sharding
    dicts.append(ir.DictAttr.get(entries))
  main.attributes[key] = ir.ArrayAttr.get(dicts)
