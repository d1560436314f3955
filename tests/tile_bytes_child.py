"""Compile a psum of f32 [4096, 64] and [4096, 128] across two v5e:2x2 slices
(compile-only, libtpu), plainly, in a branch of a lax.cond and with its result used in
one, natively and through
equarx_pass.jit; print, as one JSON line, the bytes per chip the compiled programs send
between slices and what the reports say.  Run by tests/test_tpu_tile_bytes.py in a child
process (libtpu can abort a process instead of raising)."""

import json
import os
import sys

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import mesh_utils, topologies  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import equarx_pass  # noqa: E402
from equarx_pass.frontends.tpu_aot import cross_slice_bytes  # noqa: E402

FLAGS = "--equarx_enable --equarx_min_bytes=0 --equarx_force"


def program(mesh, branch: bool):
  def body(v):
    if branch:
      return jax.lax.cond(v.sum() > 0, lambda u: jax.lax.psum(u, "dcn"), lambda u: u * 2.0, v)
    return jax.lax.psum(v, "dcn")

  return jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)


def main() -> int:
  desc = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2", num_slices=2)
  devices = mesh_utils.create_hybrid_device_mesh((1, 4), (2, 1), desc.devices)
  mesh = Mesh(np.asarray(devices), ("dcn", "ici"))
  out = {}
  for lanes in (64, 128):
    arg = jax.ShapeDtypeStruct((4096, lanes), jnp.float32, sharding=NamedSharding(mesh, P()))
    for branch in (False, True):
      f = program(mesh, branch)
      row: dict = {}
      for name, fn in (("native", jax.jit(f)), ("int8", equarx_pass.jit(f, flags=FLAGS))):
        text = fn.lower(arg).compile().as_text()
        row[name] = cross_slice_bytes(text, 2, in_branches=branch)
      [r] = fn.report.records
      row.update(report_native=r.traffic_before.slow, report_int8=r.traffic_after.slow)
      row.update(in_branch=r.in_branch, rewritten=r.rewritten)
      out[f"{lanes}:{'branch' if branch else 'plain'}"] = row

  # A psum whose result a branch uses: the compiler passes it in the default layout too.
  def feeds(v):
    y = jax.lax.psum(v, "dcn")
    return jax.lax.cond(y.sum() > 0, lambda u: u * 0.5, lambda u: u * 2.0, y)

  f = jax.shard_map(feeds, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)
  arg = jax.ShapeDtypeStruct((4096, 64), jnp.float32, sharding=NamedSharding(mesh, P()))
  fn = equarx_pass.jit(f, flags=FLAGS)
  row = {"native": cross_slice_bytes(jax.jit(f).lower(arg).compile().as_text(), 2)}
  row["int8"] = cross_slice_bytes(fn.lower(arg).compile().as_text(), 2)
  [r] = fn.report.records
  row.update(report_native=r.traffic_before.slow, report_int8=r.traffic_after.slow)
  out["64:feeds"] = dict(row, in_branch=r.in_branch, rewritten=r.rewritten)
  print(json.dumps(out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
