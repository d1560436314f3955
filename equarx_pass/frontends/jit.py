"""equarx_pass.jit: a drop-in for jax.jit that quantizes the program's all-reduces.

    step = equarx_pass.jit(step_fn, flags="--equarx_enable --equarx_min_bytes=65536")
    out = step(params, x)             # runs the rewritten program
    step.lower(params, x).compile()   # AOT stages, like jax.jit's

Per input signature: lower with jax.jit -> rewrite the StableHLO (rewrite.py) ->
compile the rewritten module with the original lowering's shardings, donation
and layouts (via a copy of the Lowered stage) -> cache.  When the policy is not
enabled, calls go straight to the jax.jit object: it *is* jax.jit.

All-reduces that the SPMD partitioner inserts (jax.jit + NamedSharding, no psum)
are not in the lowered StableHLO; for those the per-device program after
partitioning is rewritten instead (partitioned.py, --equarx_partitioned).

Signals: an EquarxWarning, once per wrapped function and reason, when the pass is
enabled and nothing was rewritten (with the sites' reasons, or why the partitioned
route was not taken), and when the function is called under a JAX transformation
(jax.grad, jax.vmap, an outer jax.jit): it is then traced as plain jax.jit would trace
it, because the pass rewrites a lowered program and a traced call is part of its
caller's program.  Inside the lowering of another equarx_pass.jit function that call
is traced silently: the outer function's pass sees its collectives.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import os
import sys
import threading
import warnings
from typing import Any, Callable

import jax
import numpy as np

from equarx_pass import _jax_private, report, topology
from equarx_pass.errors import CompileError, EquarxWarning, FlagError, RewriteError
from equarx_pass.frontends import partitioned, tpu_aot
from equarx_pass.planning import match
from equarx_pass.planning.policy import Policy
from equarx_pass.rewrite import rewrite_module
from equarx_pass.site_kind import SiteKind
from equarx_pass.site_records import SiteRecord


def resolve_policy(policy: Policy | None = None, flags: str | None = None) -> Policy:
  """`policy` (default: from $EQUARX_FLAGS) with `flags` applied on top."""
  if policy is not None and not isinstance(policy, Policy):
    hint = " (a flag string goes in flags=)" if isinstance(policy, str) else ""
    raise FlagError(f"policy must be an equarx_pass.Policy, got {type(policy).__name__}{hint}")
  if flags is not None and not isinstance(flags, str):
    raise FlagError(f"flags must be a string of --equarx_* flags, got {type(flags).__name__}")
  base = policy if policy is not None else Policy.from_env()
  return Policy.from_flags(flags, base=base) if flags else base


@dataclasses.dataclass(frozen=True)
class RouteChoice:
  """Which program the sites are read from, and why (Jitted._choose_route)."""

  partitioned: bool
  why: str
  # What the chosen route cannot see and the flag that reaches it ("": it sees it all).
  unseen: str = ""
  # The ops the partitioner splits (match.auto_sharded_ops), where the choice read them.
  auto_ops: tuple[str, ...] | list[str] = ()


@dataclasses.dataclass(frozen=True)
class LoweringReport:
  """The sites of one lowering (one input signature) of a wrapped function."""

  signature: str
  records: tuple[SiteRecord, ...]
  pass_seconds: float
  tpu: tpu_aot.TopologyCompile | None = None  # with --equarx_compile_for
  # "lowered": the StableHLO jax.jit lowered; "partitioned": the per-device program
  # after SPMD partitioning (the sites are the compiler-inserted all-reduces too).
  route: str = "lowered"
  note: str = ""  # why the partitioned route was not taken, where it was tried
  first_compile_seconds: float = 0.0  # partitioned route: the compile that exposed the program
  # partitioned route: all-reduces in plain jax.jit's compiled program (XLA merges some)
  compiled_all_reduces: int | None = None
  topology: topology.Topology | None = None  # the fast domains the sites were planned on
  # --equarx_compile_for: why the ahead-of-time compile for that target failed (the
  # program itself runs on)
  tpu_error: str = ""
  route_why: str = ""  # why this route (Jitted._choose_route)
  unseen: str = ""  # what the route could not see, and which flag reaches it


class Report:
  """Every all-reduce site the wrapped function's lowerings contained."""

  def __init__(self):
    #: One LoweringReport per input signature lowered, in order.
    self.lowerings: list[LoweringReport] = []

  @property
  def records(self) -> list[SiteRecord]:
    return [r for low in self.lowerings for r in low.records]

  def __len__(self):
    return len(self.records)

  def __str__(self):
    if not self.lowerings:
      return "no lowering yet: call the function or its .lower() first"
    return "\n\n".join(format_lowering(low) for low in self.lowerings)


def format_lowering(low: LoweringReport) -> str:
  title = f"{low.signature} (pass {low.pass_seconds * 1e3:.1f} ms)"
  if low.route == "partitioned":
    title = (
      f"{low.signature}, partitioned program (pass {low.pass_seconds * 1e3:.1f} ms, "
      f"partitioning compile {low.first_compile_seconds:.2f} s)"
    )
  route = f"route: the {low.route} program"
  if low.route_why:
    route += f" ({low.route_why})"
  if low.records:
    text = title + "\n" + route + "\n" + report.format_table(low.records, "", low.topology)
  else:
    text = f"{title}\n{route}\nno collective in it that --equarx_ops selects"
  if low.unseen:
    text += f"\nnot considered: {low.unseen}"
  sites = sum(r.found_as == SiteKind.ALL_REDUCE for r in low.records)
  compiled = low.compiled_all_reduces
  if compiled is not None and compiled != sites and sites:
    text += (
      f"\nplain jax.jit's compiled program holds {compiled} "
      f"all-reduce{'s' if compiled != 1 else ''} for these {sites} all-reduce "
      f"site{'s' if sites != 1 else ''}: XLA merges all-reduces "
      "after partitioning (its all-reduce combiner), so a site here can be part of "
      "a larger one there"
    )
  if low.note:
    text += f"\npartitioned route not taken: {low.note}"
  if low.tpu_error:
    text += f"\n{low.tpu_error}"
  return text + ("\n" + low.tpu.summary() if low.tpu else "")


# Arguments listed one by one up to this many; more are counted by element type.
SIGNATURE_ARGUMENTS = 6


def signature(leaves) -> str:
  """The arguments' types for a report title: 'float32[64, 256], int32[]', or for many
  arguments (a model's parameters) a count per element type."""
  # str(dtype): a typed PRNG key's dtype (key<fry>) is no NumPy dtype.
  arrays = [(_dtype_name(x.dtype), list(x.shape)) for x in leaves if hasattr(x, "shape")]
  if len(arrays) <= SIGNATURE_ARGUMENTS:
    return ", ".join(f"{dtype}{shape}" for dtype, shape in arrays)
  counts: dict[str, int] = {}
  for dtype, _ in arrays:
    counts[dtype] = counts.get(dtype, 0) + 1
  return f"{len(arrays)} arrays: " + ", ".join(f"{n} {dtype}" for dtype, n in counts.items())


def _static_positions(fun: Callable, jit_kwargs: dict) -> tuple[set[int], set[str]]:
  """static_argnums and static_argnames as jax.jit completes them from each other.

  jax.jit infers names from numbers (or numbers from names) only when one of the two
  is not given, and only over positional-or-keyword parameters; from JAX 0.11 a
  negative number also names the parameter it counts back to, and is turned into a
  position.  Inferring more (or less) than the installed JAX does would treat an
  argument as static (or dynamic) where jax.jit does not, so JAX's own rule is asked
  (_jax_private.static_arguments).
  """
  nums, names = _jax_private.static_arguments(
    fun, jit_kwargs.get("static_argnums"), jit_kwargs.get("static_argnames")
  )
  return set(nums), set(names)


def _dtype_name(dtype) -> str:
  try:
    return np.dtype(dtype).name
  except TypeError:
    return str(dtype)


# jax.jit as JAX defines it: the launcher (launch.py) replaces the attribute.
JAX_JIT = jax.jit
# A traced argument's part of the cache key: such a call is never compiled or cached.
_TRACED = ("traced",)
# How many equarx_pass.jit lowerings this thread is inside (their jax.jit traces call the
# user's function, which may call other equarx_pass.jit functions).
_LOWERING = threading.local()
# Frames in these directories are not the user's: a warning points past them.
_INTERNAL_DIRS = tuple(
  os.path.dirname(m.__file__) + os.sep for m in (sys.modules["equarx_pass"], jax) if m.__file__
)


_ARRAY: Any = _jax_private.array_type()  # Any: the attributes read are its own


def _leaf_keys(leaves: list) -> tuple:
  """What the dynamic arguments contribute to the cache key: their abstract values.

  A concrete jax.Array, the common case on every call's path, gives its abstract value
  (shape, dtype, weak type) and its sharding: JAX shares both objects between arrays, so
  comparing a key with the last call's is mostly a test of identity.
  """
  return tuple([(x.aval, x.sharding) if type(x) is _ARRAY else _leaf_key(x) for x in leaves])


def _leaf_key(x) -> Any:
  """_leaf_keys' entry for an argument that is not a concrete jax.Array."""
  if type(x) is _ARRAY:
    return (x.aval, x.sharding)
  if isinstance(x, jax.core.Tracer):
    return _TRACED
  if hasattr(x, "shape") and hasattr(x, "dtype"):
    sharding = getattr(x, "sharding", None) if isinstance(x, jax.Array) else None
    # The dtype as given: np.dtype compares by value; a typed PRNG key's is no np.dtype.
    return (tuple(x.shape), x.dtype, bool(getattr(x, "weak_type", False)), sharding)
  return (type(x).__name__,)  # Python scalars: one trace per type, as jax.jit does


def _meaning(key: tuple) -> tuple:
  """A call's cache key as jax.jit's lowering cache compares it: each sharding by what it
  does (_jax_private.sharding_meaning), so that equivalent shardings share one lowering.

  A step's outputs fed back carry NamedSharding(mesh, P(None, None)) where its inputs had
  P(): another key, the same program.  Only a call whose key is new pays for this.
  """
  return key[:-1] + (tuple([_leaf_meaning(entry) for entry in key[-1]]),)


def _leaf_meaning(entry: tuple) -> tuple:
  """One entry of _leaf_keys with its sharding, if it has one, by meaning."""
  if len(entry) == 2:  # a concrete jax.Array: (aval, sharding)
    aval, sharding = entry
    return (aval, _jax_private.sharding_meaning(sharding, aval.ndim))
  if len(entry) == 4 and entry[3] is not None:  # another array with a sharding
    shape, dtype, weak_type, sharding = entry
    return (shape, dtype, weak_type, _jax_private.sharding_meaning(sharding, len(shape)))
  return entry


class Jitted:
  """The object equarx_pass.jit returns; behaves as the jax.jit object it wraps."""

  def __init__(self, fun: Callable, policy: Policy, jit_kwargs: dict):
    self._fun = fun
    self._jitted = JAX_JIT(fun, **jit_kwargs)
    self.policy = policy
    self.report = Report()
    self._static_nums, self._static_names = _static_positions(fun, jit_kwargs)
    self._has_static = bool(self._static_nums or self._static_names)
    # Keyed by _meaning(key): one lowering per signature as jax.jit sees it.
    self._lowered: dict[Any, Any] = {}  # signature -> jax.stages.Lowered (rewritten)
    self._compiled: dict[Any, Any] = {}  # signature -> jax.stages.Compiled
    # (the lowered module's digest, device ids) -> _lower_and_rewrite's result
    self._by_program: dict[Any, Any] = {}
    self._by_key: dict[Any, Any] = {}  # each call key seen -> its signature's Compiled
    self._warned: set[str] = set()  # the reasons already warned about
    self._last: tuple[Any, Any] | None = None  # (key, compiled) of the last call
    # Made by the launcher (launch.py) for a jax.jit the program itself calls: no warning
    # for a traced call (the caller's jax.jit is wrapped too) or for a program that holds
    # no collective (a trainer jits many such helpers).
    self.launched = False
    # updated=(): copying fun.__dict__ would let a wrapped pmap shadow our own fields.
    functools.update_wrapper(self, fun, updated=())

  def lower_plain(self, *args, **kwargs):
    """The lowering plain jax.jit makes of the same function, nothing rewritten."""
    return self._jitted.lower(*args, **kwargs)

  def split_arguments(self, args, kwargs):
    """(dynamic args, dynamic kwargs, cache key); the key's last part holds one entry
    per dynamic leaf."""
    if not self._has_static:
      leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
      return args, kwargs, (tree, _leaf_keys(leaves))
    n = len(args)
    static = {i % n for i in self._static_nums if -n <= i < n} if n else set()
    dyn_args = tuple(a for i, a in enumerate(args) if i not in static)
    dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self._static_names}
    static_part = (
      tuple((i, args[i]) for i in sorted(static)),
      tuple(sorted((k, v) for k, v in kwargs.items() if k in self._static_names)),
    )
    leaves, tree = jax.tree_util.tree_flatten((dyn_args, dyn_kwargs))
    try:
      hash(static_part)
    except TypeError as e:
      # The error jax.jit gives, rather than a TypeError from our cache lookup.
      raise ValueError(f"Non-hashable static arguments are not supported: {e}") from None
    key = (static_part, tree, _leaf_keys(leaves))
    return dyn_args, dyn_kwargs, key

  def __call__(self, *args, **kwargs):
    if not self.policy.enable:
      return self._jitted(*args, **kwargs)
    # The warm path, measured by tools/bench_dispatch.py: no static arguments, the last
    # call's signature again (a step in a loop).  Its key is compared, mostly object by
    # identical object, instead of hashed leaf by leaf for the dict.
    if self._has_static:
      dyn_args, dyn_kwargs, key = self.split_arguments(args, kwargs)
    else:
      leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
      dyn_args, dyn_kwargs, key = args, kwargs, (tree, _leaf_keys(leaves))
    last = self._last
    if last is not None and last[0] == key:
      return last[1](*dyn_args, **dyn_kwargs)
    compiled = self._by_key.get(key)
    if compiled is None:
      if _TRACED in key[-1]:
        return self._call_traced(args, kwargs)
      meaning = _meaning(key)
      compiled = self._compiled.get(meaning)
      if compiled is None:
        compiled = self._lower(meaning, args, kwargs).compile()
        self._compiled[meaning] = compiled
      self._by_key[key] = compiled
    out = compiled(*dyn_args, **dyn_kwargs)
    self._last = (key, _jax_private.compiled_call(compiled))
    return out

  def _call_traced(self, args, kwargs):
    """A call under a JAX transformation: traced as jax.jit traces it, nothing rewritten
    (a compiled stage cannot take tracers, and the caller's program is the one lowered)."""
    if not getattr(_LOWERING, "depth", 0) and not self.launched:
      self._warn(
        "traced",
        "called under a JAX transformation (jax.grad, jax.vmap, an outer jax.jit, ...), so "
        "it is traced as plain jax.jit and the pass rewrites none of its collectives; apply "
        "equarx_pass.jit to the outermost function instead (e.g. the training step that "
        "calls jax.grad)",
      )
    return self._jitted(*args, **kwargs)

  def lower(self, *args, **kwargs):
    """jax.jit's lower(), then the rewrite: a jax.stages.Lowered of the new module.

    One lowering (and one report entry) per input signature: calls and .lower()
    with the same signature share it.
    """
    if not self.policy.enable:
      return self._jitted.lower(*args, **kwargs)
    return self._lower(_meaning(self.split_arguments(args, kwargs)[2]), args, kwargs)

  def _lower(self, meaning, args, kwargs):
    """The Lowered of the signature `meaning` (_meaning of the call's key), made once."""
    lowered = self._lowered.get(meaning)
    if lowered is None:
      lowered, compiled = self._lower_and_rewrite(args, kwargs)
      self._lowered[meaning] = lowered
      if compiled is not None:
        self._compiled.setdefault(meaning, compiled)
    return lowered

  def _lower_and_rewrite(self, args, kwargs):
    """(the Lowered to run, an executable of it already compiled or None).

    A new signature whose lowering is a program already rewritten (the same StableHLO
    on the same devices) gets that program's result: jax.jit, too, compiles such a
    program once (its compile cache is keyed by the module).  So it is with arguments
    that differ only in what their types carry beyond the program, such as the abstract
    mesh of a replicated array made outside `jax.set_mesh` and the same array as a
    step's output."""
    _LOWERING.depth = getattr(_LOWERING, "depth", 0) + 1
    try:
      lowered = self._jitted.lower(*args, **kwargs)
    finally:
      _LOWERING.depth -= 1
    module = lowered.compiler_ir("stablehlo")
    # The argument and result trees too: an executable is called with the pytree it was
    # compiled for (jax.jit's own check), and two trees can lower to the same program
    # (a state whose step count is a wrapped array at step 0 and a bare one after).
    program = (
      hashlib.sha256(str(module).encode()).digest(),
      tuple(d.id for d in _jax_private.lowered_devices(lowered)),
      lowered.in_tree,
      lowered.out_tree,
    )
    done = self._by_program.get(program)
    if done is None:
      done = self._by_program[program] = self._rewrite_lowering(lowered, module, args, kwargs)
    return done

  def _rewrite_lowering(self, lowered, module, args, kwargs):
    """_lower_and_rewrite of a program not seen before."""
    note = ""
    compiled = None  # plain jax.jit's executable, where the partitioned read made it
    choice = self._choose_route(module)
    unseen = choice.unseen
    if choice.partitioned:
      try:
        return self._rewrite_partitioned(lowered, module, args, kwargs, choice)
      except partitioned.NotPartitionable as e:
        if self.policy.partitioned == "on":
          raise RewriteError(f"--equarx_partitioned=on: {e}") from None
        note, compiled = str(e), e.compiled
        unseen = partitioned.unseen_note(
          choice.auto_ops, "no flag: the partitioned route cannot take it"
        )
    result = rewrite_module(
      module,
      self.policy,
      _jax_private.lowered_platform(lowered),
      _jax_private.lowered_devices(lowered),
    )
    tpu = self._compile_for_target(result.module, module, lowered)
    self._record(
      result.records,
      result.seconds,
      tpu,
      args,
      kwargs,
      note=note,
      topology=result.topology,
      route_why=choice.why,
      unseen=unseen,
    )
    if not result.modified:
      return _jax_private.lowered_with_executable(lowered, compiled), compiled
    return _jax_private.lowered_with_module(lowered, result.module), None

  def _choose_route(self, module) -> RouteChoice:
    """Which program holds the sites (--equarx_partitioned): the partitioned one, after
    SPMD partitioning, for a multi-device program with any part left to the partitioner
    (`auto`), or always (`on`); else the lowered StableHLO."""
    mode = self.policy.partitioned
    if match.mesh_facts(module).num_partitions <= 1:
      return RouteChoice(False, "one partition: no SPMD partitioning")
    auto_ops = match.auto_sharded_ops(module)
    if mode == "off":
      if not auto_ops:
        return RouteChoice(False, "manual throughout (shard_map over every mesh axis)")
      return RouteChoice(
        False,
        "--equarx_partitioned=off",
        unseen=partitioned.unseen_note(auto_ops, "--equarx_partitioned=auto (the default) or on"),
      )
    if mode == "on":
      return RouteChoice(True, "--equarx_partitioned=on")
    if auto_ops:
      return RouteChoice(
        True, f"auto-sharded ({partitioned.ops_outside(auto_ops)})", auto_ops=auto_ops
      )
    return RouteChoice(
      False,
      "manual throughout (shard_map over every mesh axis): the partitioner adds no collective",
    )

  def _rewrite_partitioned(self, lowered, module, args, kwargs, choice: RouteChoice):
    """`module`: the lowering's StableHLO, the original --equarx_compile_for compares with."""
    done = partitioned.rewrite_partitioned(
      lowered, self.policy, _jax_private.lowered_devices(lowered)
    )
    tpu = self._compile_for_target(done.module, module, lowered)
    self._record(
      done.result.records,
      done.pass_seconds,
      tpu,
      args,
      kwargs,
      route="partitioned",
      first_compile_seconds=done.first_compile_seconds,
      compiled_all_reduces=done.compiled_all_reduces,
      topology=done.result.topology,
      route_why=choice.why,
    )
    if done.module is None:
      # Nothing rewritten: the first compile is plain jax.jit's executable; reuse it,
      # for calls and for a later .compile() of the Lowered handed back.
      return _jax_private.lowered_with_executable(lowered, done.compiled), done.compiled
    return _jax_private.lowered_with_module(lowered, done.module), None

  def _compile_for_target(self, module, original, lowered):
    """--equarx_compile_for: the rewritten module compiled ahead of time for that
    target, beside the original (tpu_aot.compare_to_original's report), or None without
    the flag or module.  A program lowered for GPU devices (a GPU cluster's compile-only
    ones) keeps its device order there: it decides which node each logical id is on."""
    if not self.policy.compile_for or module is None:
      return None
    devices = _jax_private.lowered_devices(lowered)
    ids = [d.id for d in devices] if devices and devices[0].platform == "gpu" else None
    try:
      return tpu_aot.compare_to_original(
        str(module), str(original), self.policy.compile_for, device_ids=ids
      )
    except CompileError as e:
      # An inspection, not the run: the program goes on; the report and a warning say
      # what could not be compiled.
      return f"--equarx_compile_for={self.policy.compile_for}: not compiled: {e}"

  def _record(self, records, seconds, tpu, args, kwargs, **extra) -> None:
    if isinstance(tpu, str):  # --equarx_compile_for failed (_compile_for_target)
      extra["tpu_error"], tpu = tpu, None
      self._warn(extra["tpu_error"], extra["tpu_error"])
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    name = getattr(self._fun, "__name__", "fun")
    low = LoweringReport(f"{name}({signature(leaves)})", tuple(records), seconds, tpu, **extra)
    self.report.lowerings.append(low)
    if self.policy.report:
      print("equarx-pass: " + format_lowering(low), file=sys.stderr)
    why = _nothing_rewritten(low, self.policy)
    if why and self.launched and not low.records and not low.note:
      why = ""  # a helper with no collective: nothing to say
    if why and self.policy.identity:
      self._warn(
        why,
        f"--equarx_identity checked no site in {low.signature}: {why}{_every_site(self.policy)}",
      )
    elif why:
      self._warn(
        why,
        f"--equarx_enable is set but nothing was rewritten in {low.signature}: "
        f"{why}; it runs as plain jax.jit would run it",
      )
    elif low.note:
      self._warn(low.note, f"the partitioned route was not taken: {low.note}")

  def _warn(self, reason: str, message: str) -> None:
    """An EquarxWarning naming this function, once per reason."""
    if reason in self._warned:
      return
    self._warned.add(reason)
    name = getattr(self._fun, "__name__", "fun")
    warnings.warn(f"equarx_pass.jit({name}): {message}", EquarxWarning, stacklevel=_user_level())

  def clear_cache(self) -> None:
    self._lowered.clear()
    self._compiled.clear()
    self._by_key.clear()
    self._by_program.clear()
    self._last = None
    self._jitted.clear_cache()  # type: ignore[attr-defined]  # jax.jit's wrapper has it

  def __getattr__(self, name):
    # trace, eval_shape, ...: the jax.jit object's own.
    return getattr(self._jitted, name)


def _nothing_rewritten(low: LoweringReport, policy: Policy) -> str:
  """Why a lowering with the pass enabled rewrote nothing ("" when it rewrote a site)."""
  if any(r.rewritten for r in low.records):
    return ""
  if low.note:
    return f"the partitioned route was not taken ({low.note})"
  if not low.records:
    why = f"the {low.route} program holds no {' or '.join(policy.ops)}"
    if low.route == "lowered" and policy.partitioned == "off":
      why += " (with --equarx_partitioned=off the partitioner's all-reduces are not looked at)"
    return why
  reasons = collections.Counter(r.reason for r in low.records)
  listed = "; ".join(
    f"{reason} ({count} site{'s' if count != 1 else ''})"
    for reason, count in reasons.most_common(3)
  )
  more = f"; and {len(reasons) - 3} other reasons" if len(reasons) > 3 else ""
  return f"all {len(low.records)} sites skipped: {listed}{more}"


# The flags that make --equarx_identity check every site --equarx_ops selects.
EVERY_SITE_FLAGS = "--equarx_force --equarx_min_bytes=0"


def _every_site(policy: Policy) -> str:
  """How to have identity check the sites the cost model or the size floor left out ("" when
  it already checks them all)."""
  if policy.force and policy.min_bytes == 0:
    return ""
  return (
    f"; add {EVERY_SITE_FLAGS} to check every site --equarx_ops selects, whatever the cost "
    "model predicts"
  )


def _user_level() -> int:
  """The stacklevel of warnings.warn that names the first frame outside equarx_pass and
  JAX: the user's call."""
  frame: Any = sys._getframe(1)
  level = 1
  while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL_DIRS):
    frame, level = frame.f_back, level + 1
  return level


def jit(
  fun: Callable | None = None,
  *,
  policy: Policy | None = None,
  flags: str | None = None,
  **jit_kwargs,
):
  """Like jax.jit, plus the pass.  Usable as @jit, @jit(...) or jit(f, ...).

  policy: an equarx_pass.Policy; default Policy.from_env() ($EQUARX_FLAGS).
  flags:  an --equarx_* flag string applied on top of the policy.
  Every other keyword argument goes to jax.jit unchanged.
  """
  resolved = resolve_policy(policy, flags)
  if fun is None:
    return lambda f: Jitted(f, resolved, jit_kwargs)
  return Jitted(fun, resolved, jit_kwargs)
