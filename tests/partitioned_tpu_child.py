"""Compile auto-sharded training programs (jax.jit + NamedSharding, no shard_map) for two
v5e:2x2 TPU slices (compile-only, libtpu), natively and through equarx_pass.jit; print,
as one JSON line, the bytes per chip that each compiled program sends between slices,
what the report says, and whether the partitioned program read at the lowest effort is
the one the default compile partitions.  Run by tests/test_tpu_partitioned.py in a child
process (libtpu can abort a process instead of raising)."""

import json
import os
import re
import sys

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import equarx_pass  # noqa: E402
from equarx_pass import _jax_private
from equarx_pass.examples import fsdp_step  # noqa: E402
from equarx_pass.frontends import partitioned  # noqa: E402
from equarx_pass.frontends.tpu_aot import cross_slice_bytes  # noqa: E402
from equarx_pass.ir import hlo_text


def weight_gradient(mesh):
  """A weight gradient with the batch over both axes and the weight's columns over
  "ici", activations pinned by with_sharding_constraint (copies in the TPU program)."""
  S = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
  x = jax.ShapeDtypeStruct((8, 256, 2048), jnp.bfloat16, sharding=S(("dcn", "ici")))
  w = jax.ShapeDtypeStruct((2048, 2048), jnp.float32, sharding=S(None, "ici"))

  def loss(w, x):
    h = jax.lax.with_sharding_constraint(x, S(("dcn", "ici"), None, None))
    y = jnp.einsum("bsd,de->bse", h, w.astype(jnp.bfloat16))
    y = jax.lax.with_sharding_constraint(y, S(("dcn", "ici"), None, None))
    return jnp.mean(y.astype(jnp.float32) ** 2)

  return jax.grad(loss), (w, x), S(None, "ici")


def scanned_gradient(mesh, layers: int = 6):
  """Layers under jax.lax.scan, as scanned models are written: each layer's weight
  gradient is all-reduced across slices inside the backward loop's body."""
  S = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
  w = jax.ShapeDtypeStruct((layers, 1024, 1024), jnp.float32, sharding=S(None, None, "ici"))
  x = jax.ShapeDtypeStruct((64, 1024), jnp.float32, sharding=S(("dcn", "ici")))

  def loss(w, x):
    def layer(h, wl):
      h = jax.lax.with_sharding_constraint(h, S(("dcn", "ici"), None))
      return jnp.tanh(h @ wl), None

    return jnp.mean(jax.lax.scan(layer, x, w)[0] ** 2)

  return jax.grad(loss), (w, x), S(None, None, "ici")


def partitioned_text(lowered, cheap: bool) -> str:
  _, proto, _ = partitioned._compile_and_dump(lowered, cheap=cheap)
  return _jax_private.hlo_proto_to_text(proto)


_COLLECTIVE = re.compile(
  r"= (\S+) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)\(.*?"
  r"(replica_groups=\S+|source_target_pairs=\S+)"
)


def canonical(text: str) -> list[str]:
  """The text with every instruction and computation name replaced by its order of first
  appearance (names differ between compiles that do the same)."""
  names: dict[str, str] = {}
  return [
    re.sub(r"%[\w.\-]+", lambda m: names.setdefault(m.group(0), f"%v{len(names)}"), line)
    for line in text.splitlines()
  ]


def collectives_per_run(text: str) -> list:
  """(type, op, groups) of every collective, each with the times one run executes it."""
  comps, _ = hlo_text.split_computations(text)
  runs = hlo_text.executions(text)
  found: dict[tuple, int] = {}
  for name, lines in comps.items():
    for line in lines:
      m = _COLLECTIVE.search(line)
      if m:
        found[m.groups()] = found.get(m.groups(), 0) + runs.get(name, 0)
  return sorted([*key, n] for key, n in found.items())


def same_partitioned_program(lowered) -> dict:
  cheap, default = partitioned_text(lowered, True), partitioned_text(lowered, False)
  return {
    "same_text": canonical(cheap) == canonical(default),
    "same_collectives": collectives_per_run(cheap) == collectives_per_run(default),
  }


def measure(fun, args, out_shardings) -> dict:
  native = jax.jit(fun, out_shardings=out_shardings).lower(*args)
  counted_native = cross_slice_bytes(native.compile().as_text(), 2)
  fn = equarx_pass.jit(fun, flags="--equarx_enable", out_shardings=out_shardings)
  compiled = fn.lower(*args).compile()
  [low] = fn.report.lowerings
  return {
    "route": low.route,
    "note": low.note,
    "native": counted_native,
    "counted": cross_slice_bytes(compiled.as_text(), 2),
    "before": sum(r.runs * r.traffic_before.slow for r in low.records if r.traffic_before),
    "after": sum(r.runs * r.traffic_after.slow for r in low.records if r.traffic_after),
    "runs": [r.runs for r in low.records],
    "sites": [
      {
        "decision": r.decision,
        "slow": r.traffic_before.slow if r.traffic_before else None,
        "reason": r.reason,
      }
      for r in low.records
    ],
    **same_partitioned_program(native),
  }


def main() -> int:
  desc = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2", num_slices=2)
  mesh = fsdp_step.hybrid_mesh(desc.devices, 2)
  out = {}
  for name, dtype in (("f32", jnp.float32), ("bf16", jnp.bfloat16)):
    step, args = fsdp_step.sgd_step(mesh, dtype)
    out[f"fsdp_{name}"] = measure(step, args, fsdp_step.out_shardings(mesh))
  fun, args, shardings = weight_gradient(mesh)
  out["weight_gradient"] = measure(fun, args, shardings)
  fun, args, shardings = scanned_gradient(mesh)
  out["scanned"] = measure(fun, args, shardings)
  print(json.dumps(out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
