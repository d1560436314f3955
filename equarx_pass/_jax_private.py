"""Every private JAX/jaxlib API equarx-pass uses, in one place (see BUILD_NOTES.md).

A JAX upgrade that moves one of these touches only this file.
"""

from __future__ import annotations

import contextlib
import copy
import threading

import numpy as np

from jax.extend.mlir import ir


def make_ir_context() -> ir.Context:
  """An MLIR context with the dialects JAX uses (stablehlo, func, sdy, chlo, mhlo).

  Private: jax._src.interpreters.mlir.make_ir_context.  A bare ir.Context() has
  no dialects registered, and jax.extend exposes no factory.
  """
  from jax._src.interpreters import mlir as jax_mlir

  return jax_mlir.make_ir_context()


def hlo_text_to_proto(text: str) -> bytes:
  """Parse XLA HLO text; return the serialized HloModuleProto.

  Private: jaxlib._hlo.hlo_module_from_text.  Raises jax.errors.JaxRuntimeError
  with "was parsing L:C: error: ..." on a syntax error.
  """
  from jaxlib import _hlo  # type: ignore[attr-defined]

  return _hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()


def hlo_proto_to_text(proto: bytes) -> str:
  """XLA's text of a serialized HloModuleProto.

  Private: jaxlib._hlo.HloModule.from_serialized_hlo_module_proto and to_string.
  """
  from jaxlib import _hlo  # type: ignore[attr-defined]

  return _hlo.HloModule.from_serialized_hlo_module_proto(proto).to_string()


def mhlo_to_stablehlo(module: ir.Module) -> bytes:
  """`module` with its MHLO ops legalized to StableHLO, as MLIR bytecode.

  Private: jaxlib._jax.mlir.mhlo_to_stablehlo (jax.extend.mlir exposes only the
  HLO -> StableHLO direction).  Raises on ops it cannot legalize.
  """
  from jaxlib import _jax

  return _jax.mlir.mhlo_to_stablehlo(str(module).encode())


def lowered_with_module(lowered, module: ir.Module):
  """A new jax.stages.Lowered that compiles `module` instead of lowered's own.

  Private: jax.stages.Lowered._lowering (a pxla.MeshComputation) and its `_hlo`
  and `_executable` fields.  The lowering object is copied, never mutated:
  `jitted.lower()` may hand back a cached lowering that already holds an
  executable, and mutating it would silently run the old program.
  """
  new = _lowering_copy(lowered, module, dict(lowered._lowering.compile_args))
  return _lowered_like(lowered, new)


def lowered_with_executable(lowered, compiled):
  """`lowered`, or where `compiled` (a jax.stages.Compiled of its very module) is given
  a copy whose compile() returns that executable instead of compiling again.

  Private: pxla.MeshComputation._executable, which its compile() returns when set (what
  jax.jit's own lower().compile() caches), its compile(compiler_options, device_assignment=),
  shadowed on the copy so that empty options get the executable too, and
  jax.stages.Compiled._executable.  The
  partitioned route's read compile is plain jax.jit's compile of the module; a user who
  lowers and compiles later gets it instead of a second compile.
  """
  if compiled is None:
    return lowered
  new = copy.copy(lowered._lowering)
  new._executable = executable = compiled._executable
  plain_compile = new.compile

  def compile(compiler_options=None, *, device_assignment=None):
    # Empty options ask for nothing the read compile lacks (MaxText passes {} when its
    # compile_xla_flags is empty), yet pxla compiles again for any dict; answer those too.
    if not compiler_options and device_assignment is None:
      return executable
    return plain_compile(compiler_options, device_assignment=device_assignment)

  new.compile = compile  # the copy's own: the cached lowering jax.jit holds is untouched
  return _lowered_like(lowered, new)


def _lowered_like(lowered, lowering):
  """A jax.stages.Lowered of `lowering` with everything else `lowered`'s (private: the
  constructor's `_no_kwargs`, `_in_types`, `_out_types`)."""
  from jax import stages

  return stages.Lowered(
    lowering,
    lowered.args_info,
    lowered.out_tree,
    no_kwargs=lowered._no_kwargs,
    in_types=lowered._in_types,
    out_types=lowered._out_types,
  )


def lowered_platform(lowered) -> str:
  """The platform ("cpu", "gpu", "tpu") `lowered` will be compiled for.

  Private: jax.stages.Lowered._lowering.compile_args["backend"], the PjRt client
  the compile uses (JAX's public API names the default backend, not this one's).
  """
  return lowered._lowering.compile_args["backend"].platform


def lowered_devices(lowered) -> list:
  """The devices of `lowered`'s device assignment: position i runs partition i.

  Private: jax.stages.Lowered._lowering._device_list (a DeviceList).  The public
  shardings name meshes, not the order the compiled program numbers its devices in.
  """
  return list(lowered._lowering._device_list)


def _lowering_copy(lowered, module: ir.Module, compile_args: dict):
  """A copy of lowered's pxla.MeshComputation with `module` and no executable yet."""
  new = copy.copy(lowered._lowering)
  new._hlo = module
  new._executable = None
  new.compile_args = compile_args
  return new


def array_type() -> type:
  """The class of a concrete jax.Array (not a tracer).

  Private: jax._src.array.ArrayImpl.  equarx_pass.jit's call path reads a concrete
  array's shape, dtype, weak type and sharding straight off it, as a cache key; the
  public isinstance(x, jax.Array) check is true for tracers too and costs more.
  """
  from jax._src.array import ArrayImpl

  return ArrayImpl


def sharding_meaning(sharding, ndim: int) -> tuple:
  """What jax.jit's lowering cache compares of an argument's sharding: its HLO sharding
  for `ndim` dimensions, its devices in order and its memory kind.  Two shardings that
  agree on these (NamedSharding P() and P(None, None), say) lower to the same program.

  Private: Sharding._to_xla_hlo_sharding and Sharding._device_assignment, what
  jax._src.interpreters.pxla.SemanticallyEqualShardings and the device assignment key
  jax.jit's lowering by.
  """
  return (
    sharding._to_xla_hlo_sharding(ndim),
    tuple(sharding._device_assignment),
    sharding.memory_kind,
  )


def named_on_mesh(sharding, axis_names, axis_sizes, mesh_devices, ndim: int):
  """`sharding` (the GSPMDSharding XLA gives an argument the caller did not shard) as a
  NamedSharding over the mesh of `axis_names` and `axis_sizes` whose devices, row-major,
  are `mesh_devices`; None where no PartitionSpec of that mesh means the same (the same
  HLO sharding over the same devices in the same order: sharding_meaning).

  Private: jax._src.sharding_impls.parse_flatten_op_sharding (what JAX uses to name a
  GSPMD sharding over a mesh) and GSPMDSharding._hlo_sharding.
  """
  from jax._src import sharding_impls
  from jax.sharding import Mesh, NamedSharding

  hlo_sharding = getattr(sharding, "_hlo_sharding", None)
  if hlo_sharding is None:
    return None
  mesh = Mesh(np.array(mesh_devices, dtype=object).reshape(axis_sizes), tuple(axis_names))
  try:
    (spec,) = sharding_impls.parse_flatten_op_sharding(hlo_sharding, mesh)
    named = NamedSharding(mesh, spec, memory_kind=sharding.memory_kind)
  except Exception:  # a tiling no axis order of the mesh gives
    return None
  if sharding_meaning(named, ndim) != sharding_meaning(sharding, ndim):
    return None
  return named


def compiled_call(compiled):
  """What runs a jax.stages.Compiled that has been called once: its C++ fast path
  where JAX made one, else the Compiled itself.

  Private: Compiled._call, which Compiled.__call__ creates on its first call and then
  forwards every call to (one Python frame less per call on equarx_pass.jit's path).
  """
  call = getattr(compiled, "_call", None)
  return compiled if call is None else call


def device_list(devices):
  """xla_client.DeviceList of `devices`, what a PjRt client's compile() takes.

  Private: jax._src.lib.xla_client.DeviceList (jax.extend has no alias).
  """
  from jax._src.lib import xla_client

  return xla_client.DeviceList(tuple(devices))


def executable_shardings(compiled) -> tuple[list, list]:
  """(input, output) shardings of a Compiled's executable, one per main argument/result.

  Private: jax.stages.Compiled._executable (a pxla.MeshExecutable) and its
  `_in_shardings` / `_out_shardings`.  The public `input_shardings` lists every
  argument of the Python function, also the ones JAX dropped from `main` as
  unused; the executable's list matches `main` one to one.
  """
  executable = compiled._executable
  return list(executable._in_shardings), list(executable._out_shardings)


def compiled_hlo_modules(compiled) -> list:
  """The optimized HloModules of a jax.stages.Compiled.

  Private: Compiled.runtime_executable() (a jaxlib LoadedExecutable) and its
  hlo_modules(); the public as_text() returns one module's text only.
  """
  return list(compiled.runtime_executable().hlo_modules())


def lowered_with_extra_outputs(lowered, module: ir.Module, extra_shapes):
  """A jax.stages.Lowered of `module`, whose main returns lowered's results and then
  one f32 array per shape in `extra_shapes`; calling its compiled form returns
  (original outputs, tuple of the extra arrays).

  Private, beyond lowered_with_module: the lowering's compile_args
  `global_out_avals`, `out_shardings` (the extra ones UNSPECIFIED, from
  jax._src.sharding_impls: the compiler's propagation decides) and `out_layouts`.
  """
  import jax
  import numpy as np
  from jax import stages
  from jax._src import sharding_impls

  args = dict(lowered._lowering.compile_args)
  extra = [jax.core.ShapedArray(tuple(shape), np.float32) for shape in extra_shapes]
  args["global_out_avals"] = list(args["global_out_avals"]) + extra
  args["out_shardings"] = list(args["out_shardings"]) + [sharding_impls.UNSPECIFIED] * len(extra)
  args["out_layouts"] = list(args["out_layouts"]) + [None] * len(extra)
  new = _lowering_copy(lowered, module, args)
  original = jax.tree_util.tree_unflatten(lowered.out_tree, [0] * lowered.out_tree.num_leaves)
  out_tree = jax.tree_util.tree_structure((original, (0,) * len(extra)))
  return stages.Lowered(
    new,
    lowered.args_info,
    out_tree,
    no_kwargs=lowered._no_kwargs,
    in_types=lowered._in_types,
    out_types=None,
  )


def stablehlo_to_hlo_text(module: ir.Module) -> str:
  """XLA's HLO text of a StableHLO module, every constant written out in full.

  Private: jaxlib._jax.mlir.mlir_module_to_xla_computation (what Lowered.as_text(
  dialect="hlo") calls; jax.extend.mlir has only the HLO -> StableHLO direction) and
  XlaComputation.as_hlo_text.  Shardy's shardings and meshes become the frontend
  attributes and custom calls that XLA's own dumps carry.  Raises on a module XLA
  cannot translate.
  """
  import io

  from jaxlib import _jax

  buffer = io.BytesIO()
  module.operation.write_bytecode(buffer)
  computation = _jax.mlir.mlir_module_to_xla_computation(
    buffer.getvalue(), use_tuple_args=False, return_tuple=False
  )
  return computation.as_hlo_text(print_large_constants=True)


def exported_with_module(exported, module_serialized: bytes, vjp=None):
  """A copy of a jax.export.Exported with another module (a portable artifact), and
  with `vjp` (an Exported) as its VJP where given; every other field the same.

  Private: the dataclass field `_get_vjp` (the public `vjp()` only reads it).
  """
  import dataclasses

  changes: dict = {"mlir_module_serialized": module_serialized}
  if vjp is not None:
    changes["_get_vjp"] = lambda _: vjp
  return dataclasses.replace(exported, **changes)


def exported_named_shardings(exported) -> tuple[tuple, tuple] | None:
  """(input, output) NamedShardings of a jax.export.Exported, over its abstract mesh,
  None where unspecified; None for artifacts written before JAX kept them (HloShardings
  only).

  Private: the fields `_has_named_shardings` (JAX 0.10), `_in_named_shardings` and
  `_out_named_shardings`; the public in_shardings_jax(mesh) needs the mesh first.  JAX
  0.11 dropped `_has_named_shardings`: its artifacts always carry named shardings (its
  reader turns an older artifact's into them).
  """
  if not getattr(exported, "_has_named_shardings", True):
    return None
  return tuple(exported._in_named_shardings), tuple(exported._out_named_shardings)


# One compile at a time swaps JAX's cache-key function (compile_uncached).
_UNCACHED_LOCK = threading.Lock()


def compile_uncached(lowered, compiler_options: dict):
  """lowered.compile(compiler_options=...) with JAX's persistent compilation cache
  neither read nor written.

  Private: jax._src.compiler._get_cache_key, replaced for the duration of the compile
  by one that returns None (JAX's own "cache off" answer).  The partitioned route's
  read compile needs XLA to run, so that it dumps the partitioned program: JAX leaves
  the dump options out of the cache key, so a cached entry would be served with no
  dump; and the read compile's cheap executable must not land in the user's cache.
  The public switch (jax_enable_compilation_cache) is read once per process.
  """
  from jax._src import compiler

  with _UNCACHED_LOCK:
    original = compiler._get_cache_key
    compiler._get_cache_key = lambda *args, **kwargs: None
    try:
      return lowered.compile(compiler_options=compiler_options)
    finally:
      compiler._get_cache_key = original


# The GPU whose Triton lowering a kernel gets where no GPU is attached (what JAX 0.10 did
# itself: compute capability 9.0, an H100).
ABSTRACT_GPU_KIND = "NVIDIA H100"


@contextlib.contextmanager
def lowering_for_gpu(enable: bool = True):
  """The scope in which the kernel form's Pallas kernels are lowered with Triton.

  JAX 0.10 lowers Triton kernels for compute capability 9.0 where no GPU is attached;
  0.11 and later raise "No supported GPU devices found" unless an abstract GPU device is
  in scope (public: jax.sharding.AbstractMesh(abstract_device=...), use_abstract_mesh).
  So where this process has no GPU, an empty abstract mesh of an H100 (no axes: nothing
  is sharded) is set; with a GPU, its own kind is used, as on every version.  JAX 0.11
  and later deprecate Pallas's Triton backend ("jax-pallas-triton", a DeprecationWarning
  at each lowering): the kernel form chose it (BUILD_NOTES, "The kernel form on GPU"),
  the user cannot act on it, so it is not passed on from here.
  """
  if not enable:
    yield
    return
  import warnings

  import jax
  from jax.sharding import AbstractDevice, AbstractMesh

  with contextlib.ExitStack() as stack:
    stack.enter_context(warnings.catch_warnings())
    warnings.filterwarnings(
      "ignore", message="The Pallas Triton backend is deprecated", category=DeprecationWarning
    )
    if not _has_gpu(jax):
      device = AbstractDevice(device_kind=ABSTRACT_GPU_KIND, num_cores=None, platform="gpu")
      stack.enter_context(
        jax.sharding.use_abstract_mesh(AbstractMesh((), (), abstract_device=device))
      )
    yield


def _has_gpu(jax) -> bool:
  """Whether this process has a GPU backend (JAX raises for a platform it has not)."""
  try:
    return bool(jax.devices("gpu"))
  except (RuntimeError, ValueError):
    return False


def static_arguments(fun, static_argnums, static_argnames) -> tuple[tuple, tuple]:
  """(static_argnums, static_argnames) as jax.jit(fun, ...) completes and validates them.

  Private: jax._src.api_util.resolve_argnums and fun_signature, what jax.jit calls.  The
  rule moved between minors: JAX 0.10 infers names from non-negative numbers only and
  keeps negative numbers as given (counted from the call's last positional argument);
  0.11 and later also name the parameter a negative number counts back to and turn it
  into a position in the signature.  Raises as jax.jit does on numbers or names that do
  not fit the signature.
  """
  from jax._src import api_util

  _, _, nums, names = api_util.resolve_argnums(
    fun, api_util.fun_signature(fun), None, None, static_argnums, static_argnames
  )
  return tuple(nums), tuple(names)


def lowest_effort_options() -> dict:
  """Compile options for XLA's lowest execution-time optimization effort (the partitioned
  route's cheap read on TPU).

  Public options whose name changed: JAX 0.10 takes `exec_time_optimization_effort`, a
  float in [-1, 1] (-1: least); 0.11 and later dropped it and take `optimization_level`,
  an effort level ("O0": least), and refuse the old name ("No such compile option").
  Which one this JAX has is read from its config (`jax_exec_time_optimization_effort`).
  """
  import jax

  if "jax_exec_time_optimization_effort" in jax.config.values:
    return {"exec_time_optimization_effort": -1.0}
  return {"optimization_level": "O0"}
