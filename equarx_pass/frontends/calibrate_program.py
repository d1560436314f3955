"""calibrate: run a program on calibration inputs and record every all-reduce's ranges.

    equarx_pass.calibrate(step, [(x1,), (x2,)], path="cal.json")
    fast = equarx_pass.jit(step, flags="--equarx_enable --equarx_calibration=cal.json")

How the operands are observed: the program is lowered exactly as
equarx_pass.jit lowers it (jax.jit(fn).lower(...)), and a copy of the module
is rewritten so that after each selected all-reduce it also computes, per
device, the per-feature absmax and mean square of the operand and of the
result ([1, 4, H]).  Those become extra results of the enclosing
`sdy.manual_computation` (sharded over all its manual axes along a new first
dimension, so device d's row is its own) and of `main`.  The module is compiled
with the original lowering's shardings plus the new outputs and run once per
batch; nothing is printed or called back from the device.
Observable sites: one operand, inside an `sdy.manual_computation` (shard_map,
pmap; JAX 0.10's default Shardy lowering) directly in `main`, manual over every
mesh axis, and not inside a loop or a conditional (a while body would run the
statistics once per iteration).  The others are listed as "unobserved" in the
file and fall back to the dynamic scheme at rewrite time.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Iterable

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import func, sdy
from jax.extend.mlir.dialects import stablehlo as hlo

from equarx_pass import _jax_private
from equarx_pass.emission import outlier
from equarx_pass.emission.outlier_emit import emit_feature_stats
from equarx_pass.errors import FlagError
from equarx_pass.frontends import transform
from equarx_pass.ir import traverse
from equarx_pass.planning import calibration, match
from equarx_pass.planning.policy import Policy

STATS_ROWS = 4  # in absmax, out absmax, in mean square, out mean square
MANUAL_COMPUTATION = "sdy.manual_computation"


@dataclasses.dataclass
class _Observed:
  site: match.Site
  type: str
  manual_computation: ir.Operation
  mesh: match.Mesh
  stats: ir.Value | None = None  # f32 [1, 4, H] inside the manual computation
  features: int = 0
  output: int = -1  # index among main's extra results


def _observability(op: ir.Operation, main: ir.Operation, facts: match.ModuleFacts):
  """(manual computation, mesh) holding the all-reduce, or the reason it cannot be observed."""
  if len(op.operands) != 1:
    return "several operands in one all-reduce"
  parent = op.parent
  if parent is None or parent.name != MANUAL_COMPUTATION:
    return "not directly inside a shard_map body (loop, conditional or other function)"
  if parent.parent is None or parent.parent != main:
    return "its shard_map is not directly in main"
  mesh_ref = _mesh_ref(parent)
  mesh = None
  if isinstance(mesh_ref, ir.FlatSymbolRefAttr):
    mesh = facts.mesh(mesh_ref.value)
  if mesh is None:
    return "the shard_map's mesh is not an sdy.mesh symbol"
  manual_axes = sdy.ManualAxesAttr(parent.attributes["manual_axes"])
  manual = [str(a) for a in manual_axes]  # type: ignore[attr-defined]  # iterable at run time
  if sorted(manual) != sorted(mesh.axis_names):
    return "the shard_map is not manual over every mesh axis"
  return parent, mesh


def _mesh_ref(manual_computation: ir.Operation):
  """The mesh (or its symbol) of a manual computation's first in-sharding, else None."""
  shardings = list(
    sdy.TensorShardingPerValueAttr(manual_computation.attributes["in_shardings"]).shardings
  )
  return sdy.TensorShardingAttr(shardings[0]).mesh_or_ref if shardings else None


def _insert_stats(obs: _Observed, op: ir.Operation) -> None:
  """After the all-reduce: its operand's and result's statistics, f32 [1, 4, H]."""
  ops = list(op.block.operations)
  after = ops[[o.operation for o in ops].index(op) + 1]
  with ir.InsertionPoint(after):
    # NaN counts as +inf in the absmax: non-finite data shows as an infinite
    # range, and the site is not calibrated from it.
    in_max, in_ms = emit_feature_stats(op.operands[0])
    out_max, out_ms = emit_feature_stats(op.results[0])
    stacked = hlo.ConcatenateOp([in_max, out_max, in_ms, out_ms], 0).result
    h = ir.RankedTensorType(stacked.type).shape[1]
    obs.stats = hlo.ReshapeOp(
      ir.RankedTensorType.get([1, STATS_ROWS, h], ir.F32Type.get()), stacked
    ).result
    obs.features = h


def _add_results(mc: ir.Operation, observed: list[_Observed]) -> ir.Operation:
  """A copy of the manual computation `mc` with each observation as an extra result,
  global [devices, 4, H] with the first dimension over every mesh axis."""
  mesh = observed[0].mesh
  f32 = ir.F32Type.get()
  ref = _mesh_ref(mc)  # observable: an sdy.mesh symbol (_observability)
  axes = [sdy.AxisRefAttr.get(name) for name in mesh.axis_names]
  by_device = sdy.TensorShardingAttr.get(
    ref, [sdy.DimensionShardingAttr.get(axes, True)] + [sdy.DimensionShardingAttr.get([], True)] * 2
  )
  devices = len(mesh.device_ids)
  out_shardings = list(sdy.TensorShardingPerValueAttr(mc.attributes["out_shardings"]).shardings)
  types = [r.type for r in mc.results]
  for obs in observed:
    types.append(ir.RankedTensorType.get([devices, STATS_ROWS, obs.features], f32))
    out_shardings.append(by_device)
  with ir.InsertionPoint(mc), mc.location:
    new = sdy.ManualComputationOp(
      types,
      list(mc.operands),
      mc.attributes["in_shardings"],
      sdy.TensorShardingPerValueAttr.get(out_shardings),
      mc.attributes["manual_axes"],
    )
  block = mc.regions[0].blocks[0]
  terminator = list(block.operations)[-1]
  with ir.InsertionPoint(terminator), terminator.location:
    sdy.ReturnOp(list(terminator.operands) + [obs.stats for obs in observed])
  terminator.erase()
  block.append_to(new.body)
  for old, value in zip(mc.results, new.results):
    old.replace_all_uses_with(value)
  mc.erase()
  return new.operation


def observation_module(module: ir.Module, policy: Policy):
  """A copy of `module` whose main also returns the statistics of every observable
  all-reduce that `policy` selects.  Returns (module, observed sites, unobserved
  [(site, reason)])."""
  from equarx_pass.rewrite import copy_module

  out = copy_module(module)
  facts = match.module_facts(out)
  main = traverse.find_function(out, "main")
  observed: list[_Observed] = []
  unobserved = []
  with out.context, ir.Location.unknown():
    ops = match.find_all_reduces(out)
    selection = policy.selection
    for index, op in enumerate(ops):
      decision = match.match(op, index, facts, selection)
      if not isinstance(decision, match.Candidate):
        continue
      where = _observability(op, main, facts) if main is not None else "no main function"
      if isinstance(where, str):
        unobserved.append((decision.site, where))
        continue
      obs = _Observed(decision.site, str(op.operands[0].type), *where)
      _insert_stats(obs, op)
      observed.append(obs)
    # Group the observations by their manual computation, in walk order.
    groups: list[tuple[ir.Operation, list[_Observed]]] = []
    for obs in observed:
      for mc, members in groups:
        if mc == obs.manual_computation:
          members.append(obs)
          break
      else:
        groups.append((obs.manual_computation, [obs]))
    extra: list[ir.Value] = []
    for mc, members in groups:
      new = _add_results(mc, members)
      first = len(new.results) - len(members)
      extra.extend(new.results[first + i] for i in range(len(members)))
    if extra:
      assert main is not None  # sites are observed only in main
      terminator = list(main.regions[0].blocks[0].operations)[-1]
      results = list(terminator.operands)
      for i, obs in enumerate(o for _, members in groups for o in members):
        obs.output = i
      with ir.InsertionPoint(terminator):
        func.ReturnOp(results + extra)
      terminator.erase()
      ftype = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
      main.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(list(ftype.inputs), list(ftype.results) + [v.type for v in extra])
      )
      if "res_attrs" in main.attributes:
        attrs = list(ir.ArrayAttr(main.attributes["res_attrs"]))
        main.attributes["res_attrs"] = ir.ArrayAttr.get(attrs + [ir.DictAttr.get({})] * len(extra))
  from equarx_pass.rewrite import verify

  verify(out)
  observed.sort(key=lambda o: o.site.index)
  return out, observed, unobserved


def _as_args(batch) -> tuple[tuple, dict]:
  """A calibration batch: a tuple of positional arguments, (args, kwargs), or one argument."""
  if (
    isinstance(batch, tuple)
    and len(batch) == 2
    and isinstance(batch[1], dict)
    and isinstance(batch[0], tuple)
  ):
    return batch
  if isinstance(batch, tuple):
    return batch, {}
  return (batch,), {}


def calibrate(
  fn: Callable,
  calibration_batches: Iterable[Any],
  *,
  path: str | None = None,
  policy: Policy | None = None,
  flags: str | None = None,
  ema: float = 0.9,
  **jit_kwargs,
) -> calibration.Calibration:
  """Run `fn` on every batch and write the calibration file for its all-reduces.

  - `fn`: what you will pass to equarx_pass.jit (a function, or an equarx_pass.jit
    object, whose policy and jax.jit arguments are then used); `jit_kwargs` go to
    jax.jit as there.  The module is lowered the same way, so the site keys match.
  - `calibration_batches`: each a tuple of positional arguments (or one argument, or
    (args, kwargs)).  Batches may differ in their leading dimensions (one
    observation program per input signature); a site's statistics are per
    feature (last dimension), so they apply to every number of rows.
  - `path`: the file to write; default the policy's --equarx_calibration.
  - `policy` / `flags`: which all-reduces to observe (the ones the policy would
    rewrite, --equarx_enable implied; default $EQUARX_FLAGS).
  - `ema`: decay of the moving average: range = ema * range + (1 - ema) * batch range.

  Returns the Calibration it wrote.
  """
  from equarx_pass.frontends.jit import Jitted, resolve_policy

  if not 0 <= ema < 1:
    raise FlagError(f"calibrate: ema must be in [0, 1), got {ema}")
  if isinstance(fn, Jitted):
    jitted = fn
    base = resolve_policy(policy or fn.policy, flags) if (policy or flags) else fn.policy
  else:
    jitted = Jitted(fn, resolve_policy(policy, flags), jit_kwargs)
    base = jitted.policy
  path = path or base.calibration
  if not path:
    raise FlagError("calibrate: give path= or --equarx_calibration=FILE")
  observe_policy = base.replace(enable=True, calibration="")

  # One observation program per input signature (batches may differ in their
  # leading dimensions, e.g. sequence length): per-feature statistics do not
  # depend on the number of rows, so every signature feeds the same sites.
  programs: dict[Any, tuple] = {}
  sums: dict[int, dict[str, Any]] = {}
  first_seen: dict[int, _Observed] = {}
  unobserved: dict[int, tuple[match.Site, str]] = {}
  count = 0
  for batch in calibration_batches:
    args, kwargs = _as_args(batch)
    dyn_args, dyn_kwargs, key = jitted.split_arguments(args, kwargs)
    if key not in programs:
      programs[key] = _observation_program(jitted, args, kwargs, observe_policy)
      for site, reason in programs[key][2]:
        unobserved.setdefault(site.index, (site, reason))
      for obs in programs[key][1]:
        _check_same_site(first_seen.setdefault(obs.site.index, obs), obs)
    compiled, observed, _ = programs[key]
    count += 1
    if compiled is None:
      continue
    _, stats = compiled(*dyn_args, **dyn_kwargs)
    for obs in observed:
      value = np.asarray(stats[obs.output], np.float64)
      rows = [obs.mesh.device_ids.index(d) for g in obs.site.groups for d in g]
      per_device = value[rows]  # [devices, 4, H], devices in group order
      entry = sums.setdefault(obs.site.index, {})
      for i, name in enumerate(calibration.STATISTICS):
        entry[name] = outlier.ema_update(entry.get(name), per_device[:, i], ema)
  if count == 0:
    raise FlagError("calibrate: no calibration batches")

  sites = {}
  for index, obs in first_seen.items():
    operand = obs.site.operands[0]
    groups_ = obs.site.groups
    assert groups_ is not None and operand.shape is not None  # matched sites have both
    devices = tuple(d for g in groups_ for d in g)
    sites[index] = calibration.SiteCalibration(
      index,
      obs.site.location,
      obs.type,
      operand.shape,
      operand.dtype,
      groups_,
      devices,
      sums[index],
    )
  result = calibration.Calibration(
    sites,
    ema,
    count,
    [
      dict(index=s.index, location=s.location, reason=r)
      for i, (s, r) in sorted(unobserved.items())
      if i not in sites
    ],
  )
  transform.write_atomically(path, json.dumps(result.to_json()))
  return result


def _observation_program(jitted, args, kwargs, policy: Policy):
  """(compiled observation program or None when nothing is observable, observed, unobserved)."""
  lowered = jitted.lower_plain(*args, **kwargs)
  module, observed, unobserved = observation_module(lowered.compiler_ir("stablehlo"), policy)
  if not observed:
    return None, observed, unobserved
  shapes: list[tuple[int, int, int] | None] = [None] * len(observed)
  for o in observed:
    shapes[o.output] = (len(o.mesh.device_ids), STATS_ROWS, o.features)
  compiled = _jax_private.lowered_with_extra_outputs(lowered, module, shapes).compile()
  return compiled, observed, unobserved


def _check_same_site(first: _Observed, other: _Observed) -> None:
  """Batches of another signature must give the same site there (only the rows may differ)."""
  a, b = first.site, other.site
  same = (
    a.location == b.location
    and a.groups == b.groups
    and a.operands[0].dtype == b.operands[0].dtype
    and first.features == other.features
  )
  if not same:
    raise FlagError(
      f"calibrate: batches of different input signatures give different "
      f"all-reduces at site #{a.index} ({a.location}, {first.type} vs "
      f"{b.location}, {other.type}); calibrate each program separately"
    )
