"""jax.export artifacts: rewrite the modules of an `Exported.serialize()` file, write one back.

An artifact holds a StableHLO module (a portable artifact) and what
`jax.export.deserialize(data).call(...)` needs to run it: shardings, device count,
platforms, calling convention, effects, and, when it was serialized with `vjp_order`,
the exported VJPs, each an artifact of its own.  Only the modules change: each is
rewritten, verified and serialized again the way `jax.export` serializes one; every
other field is kept as it was.

Two routes, chosen as equarx_pass.jit chooses them (--equarx_partitioned):
- lowered: the module holds its all-reduces (shard_map + psum, pmap): rewrite it.
- partitioned: an auto-sharded program (jax.jit + NamedSharding) holds none; the SPMD
  partitioner inserts them when the caller compiles it.  The artifact is compiled
  here, on as many CPU devices as it names, as partitioned.py compiles a jax.jit
  program, and the module written back is its per-device program, rewritten, inside
  one sdy.manual_computation: the program equarx_pass.jit would run.  CPU artifacts
  only, since the route compiles them here.

What cannot be rewritten faithfully is a RewriteError that says why; nothing is
written half right.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from jax.extend import mlir as jax_mlir
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo

from equarx_pass import _jax_private
from equarx_pass.errors import EquarxError, ParseError, RewriteError
from equarx_pass.frontends import partitioned
from equarx_pass.ir import parse
from equarx_pass.planning import match
from equarx_pass.planning.policy import Policy
from equarx_pass.rewrite import rewrite_module
from equarx_pass.site_records import SiteRecord

# The platforms an artifact may name, and the platform whose forms the pass emits there.
PLATFORMS = {"cpu": "cpu", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}
# VJPs of VJPs an artifact may carry (`serialize(vjp_order=...)`); each is a module to
# parse and rewrite, and real artifacts carry one or two, so more is a corrupted file.
MAX_VJP_ORDER = 16


@dataclasses.dataclass
class Part:
  """One module of an artifact: its function's ("main") or a VJP's ("vjp", "vjp 2", ...)."""

  name: str
  records: list[SiteRecord]
  pass_seconds: float
  route: str = "lowered"  # or "partitioned" (the per-device program after partitioning)
  first_compile_seconds: float = 0.0  # partitioned: the compile that exposed the program
  topology: Any = None  # the fast domains its sites were planned on (topology.py)
  # What the route could not see (the partitioner's collectives), "" where it saw it all.
  unseen: str = ""


@dataclasses.dataclass
class ExportedRewrite:
  exported: Any  # the new jax.export.Exported
  data: bytes  # exported.serialize(vjp_order) of it: the artifact to write
  module: ir.Module  # the function's module as written (the main part's)
  parts: list[Part]

  @property
  def records(self) -> list[SiteRecord]:
    return [r for part in self.parts for r in part.records]

  @property
  def pass_seconds(self) -> float:
    return sum(part.pass_seconds for part in self.parts)


def rewrite_exported(exported, module: ir.Module, policy: Policy, path: str) -> ExportedRewrite:
  """Rewrite `exported` (a jax.export.Exported whose module, parsed, is `module`) and
  the VJPs it carries; return the new Exported and its serialization."""
  chain = [exported]
  while chain[-1].has_vjp():
    if len(chain) > MAX_VJP_ORDER:
      raise ParseError(f"an artifact with more than {MAX_VJP_ORDER} nested VJPs: corrupted", path)
    try:
      chain.append(chain[-1].vjp())
    except Exception as e:  # JAX reads a VJP when asked for it
      raise ParseError(f"its VJP ({len(chain)}) cannot be read: {e}", path) from None
  parts: list[Part] = []
  vjp: Any = None  # the rewritten VJP of the artifact being rewritten
  main_module = module
  for depth in reversed(range(len(chain))):
    exp = chain[depth]
    name = "main" if depth == 0 else ("vjp" if depth == 1 else f"vjp {depth}")
    own = module
    if depth:
      own = parse.parse_exported_module(exp, f"{path} ({name})")
    new_module, part = _rewrite_one(exp, own, policy, name)
    parts.insert(0, part)
    serialized = exp.mlir_module_serialized if new_module is None else _serialize(new_module)
    vjp = _jax_private.exported_with_module(exp, serialized, vjp)
    if depth == 0 and new_module is not None:
      main_module = new_module
  try:
    data = bytes(vjp.serialize(vjp_order=len(chain) - 1))
  except Exception as e:  # JAX's writer: flatbuffers, or a field it cannot write
    raise RewriteError(f"JAX cannot serialize the rewritten artifact: {e}") from None
  return ExportedRewrite(vjp, data, main_module, parts)


def _rewrite_one(exp, module: ir.Module, policy: Policy, name: str):
  """(the rewritten module, or None when it is unchanged; its Part)."""
  platform = _platform(exp, policy, name)
  # What reaches the partitioner's collectives when this module's own are rewritten as
  # they are (the lowered route): another mode, or nothing here.
  reach = "--equarx_partitioned=auto (the default) or on"
  if _wants_partitioned(exp, module, policy):
    try:
      done = _rewrite_partitioned(exp, module, policy)
    except partitioned.NotPartitionable as e:
      if policy.partitioned == "on":
        raise RewriteError(f"{name}: --equarx_partitioned=on: {e}") from None
      if not match.find_sites(module, policy.ops):
        raise RewriteError(
          f"{name}: the module spans {exp.nr_devices} devices and holds no all-reduce of its "
          "own: an auto-sharded program, whose all-reduces the SPMD partitioner inserts when "
          f"it is compiled. equarx-opt rewrites those by compiling the artifact here, and "
          f"cannot: {e}. --equarx_partitioned=off writes the module back as it is (nothing "
          "to rewrite in it); equarx_pass.jit rewrites the function where it runs"
        ) from None
      # Its own collectives can still be rewritten; the report says what is left out.
      reach = f"equarx_pass.jit where the function runs (the partitioned route here: {e})"
    else:
      part = Part(
        name,
        done.result.records,
        done.pass_seconds,
        "partitioned",
        done.first_compile_seconds,
        done.result.topology,
      )
      return done.module, part
  result = rewrite_module(module, policy, platform)
  changed = result.modified or policy.identity
  auto_ops = match.auto_sharded_ops(module) if exp.nr_devices > 1 else []
  unseen = partitioned.unseen_note(auto_ops, reach)
  part = Part(name, result.records, result.seconds, topology=result.topology, unseen=unseen)
  return (result.module if changed else None), part


def _platform(exp, policy: Policy, name: str) -> str | None:
  """The JAX platform to rewrite for (rewrite_module's `platform`), from the artifact's."""
  unknown = [p for p in exp.platforms if p not in PLATFORMS]
  if unknown:
    raise RewriteError(
      f"{name}: exported for {', '.join(unknown)}; the pass emits its forms for "
      f"{', '.join(PLATFORMS)} only"
    )
  if len({PLATFORMS[p] for p in exp.platforms}) == 1:
    return exp.platforms[0]
  if policy.platform == "auto":
    raise RewriteError(
      f"{name}: exported for {', '.join(exp.platforms)}, whose forms differ; choose the "
      "one to emit with --equarx_platform=cpu, gpu or tpu (each runs on every platform; "
      "the choice sets the speed and, on CPU, agreement with the NumPy model bit for bit)"
    )
  return None


def _wants_partitioned(exp, module: ir.Module, policy: Policy) -> bool:
  """equarx_pass.jit's rule: `on`, or `auto` and a module over several devices with a
  part the partitioner splits (match.auto_sharded_ops)."""
  mode = policy.partitioned
  if mode == "off" or exp.nr_devices <= 1:
    return False
  return mode == "on" or bool(match.auto_sharded_ops(module))


def _rewrite_partitioned(exp, module: ir.Module, policy: Policy):
  """partitioned.rewrite_partitioned of the artifact's module, compiled on CPU devices
  with the artifact's shardings."""
  import jax
  import jax.numpy as jnp

  if tuple(exp.platforms) != ("cpu",):
    raise partitioned.NotPartitionable(
      f"it is exported for {', '.join(exp.platforms)}, and the route compiles on CPU devices"
    )
  if exp.ordered_effects:
    raise partitioned.NotPartitionable("it has ordered effects (tokens in its signature)")
  if exp.uses_global_constants:
    raise partitioned.NotPartitionable("its shapes are polymorphic (refined when it is called)")
  mesh = _mesh(exp, _cpu_devices(exp.nr_devices))
  in_shardings = exp.in_shardings_jax(mesh)
  kept = exp.module_kept_var_idx
  avals = exp.in_avals

  def kept_arguments_call(*kept_args):
    # The module takes the kept arguments only; the others it never reads.
    flat = [jnp.zeros(a.shape, a.dtype) for a in avals]
    for i, arg in zip(kept, kept_args):
      flat[i] = arg
    args, kwargs = jax.tree_util.tree_unflatten(exp.in_tree, flat)
    return exp.call(*args, **kwargs)

  specs = [
    jax.ShapeDtypeStruct(
      avals[i].shape, avals[i].dtype, sharding=in_shardings[i], weak_type=avals[i].weak_type
    )
    for i in kept
  ]
  try:
    lowered = jax.jit(kept_arguments_call).lower(*specs)
  except Exception as e:  # whatever JAX refuses to call the artifact with here
    raise partitioned.NotPartitionable(f"JAX cannot lower a call of it here: {e}") from None
  # The same signature and shardings, and the artifact's own module: the partitioner
  # then sees exactly the program the artifact holds.
  lowered = _jax_private.lowered_with_module(lowered, module)
  try:
    return partitioned.rewrite_partitioned(lowered, policy)
  except (EquarxError, partitioned.NotPartitionable):
    raise
  except Exception as e:  # JAX or XLA refusing the artifact's module with its shardings
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise partitioned.NotPartitionable(f"JAX cannot compile it here: {first}") from None


def _cpu_devices(count: int) -> list:
  import jax

  try:
    devices = jax.devices("cpu")
  except RuntimeError as e:
    raise partitioned.NotPartitionable(f"JAX has no CPU devices here ({e})") from None
  if len(devices) < count:
    raise partitioned.NotPartitionable(
      f"it runs on {count} devices and this process has {len(devices)} CPU devices; start "
      f"JAX with jax.config.update('jax_num_cpu_devices', {count}) (equarx-opt does)"
    )
  return devices[:count]


def _mesh(exp, devices: list):
  """A concrete mesh of `devices` shaped as the artifact's one abstract mesh."""
  import jax

  shardings = _jax_private.exported_named_shardings(exp)
  if shardings is None:
    raise partitioned.NotPartitionable(
      "it was written by a JAX that kept no named shardings in artifacts"
    )
  meshes = {s.mesh for group in shardings for s in group if s is not None and s.mesh.axis_names}
  if len(meshes) != 1:
    raise partitioned.NotPartitionable(
      f"its inputs and outputs name {len(meshes)} device meshes; the route handles exactly one"
    )
  (abstract,) = meshes
  if int(np.prod(abstract.axis_sizes)) != len(devices):
    raise partitioned.NotPartitionable(
      f"its mesh {dict(zip(abstract.axis_names, abstract.axis_sizes))} is not of its "
      f"{len(devices)} devices"
    )
  return jax.sharding.Mesh(
    np.array(devices).reshape(abstract.axis_sizes),
    abstract.axis_names,
    axis_types=abstract.axis_types,
  )


def _serialize(module: ir.Module) -> bytes:
  """The module as a portable artifact, as jax.export writes one: StableHLO of the
  version four weeks old (what consumers updated monthly read), Shardy serialized as
  this JAX's backend does."""
  from jax.extend import backend

  with module.context:
    target = stablehlo.get_version_from_compatibility_requirement(
      stablehlo.StablehloCompatibilityRequirement.WEEK_4
    )
  try:
    return jax_mlir.serialize_portable_artifact(
      module, target, backend.get_backend().serialize_with_sdy
    )
  except Exception as e:  # jaxlib's legalization to the target version
    raise RewriteError(
      f"JAX cannot serialize the rewritten module as StableHLO {target}: {e}"
    ) from None


def device_count(data: bytes) -> int | None:
  """The devices a serialized artifact runs on; None when `data` is not one."""
  if data.startswith(parse.MLIR_BYTECODE_MAGIC) or parse.MLIR_BYTECODE_MAGIC not in data:
    return None
  try:
    return int(parse.read_exported(data, "<input>").nr_devices)
  except Exception:  # not an artifact: the parse that follows says why
    return None
