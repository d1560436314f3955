"""Compile one psum for a 2-slice v5e:2x2 TPU topology (compile-only, libtpu) natively and
through equarx_pass.jit; print, as one JSON line, the bytes per chip the compiled programs
send between slices and what the reports say.  Run by tests/test_tpu_compile.py in a child
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


def main() -> int:
  desc = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2", num_slices=2)
  devices = mesh_utils.create_hybrid_device_mesh((1, 4), (2, 1), desc.devices)
  mesh = Mesh(np.asarray(devices), ("dcn", "ici"))
  spec = P(("dcn", "ici"))
  arg = jax.ShapeDtypeStruct((8 << 19,), jnp.bfloat16, sharding=NamedSharding(mesh, spec))
  out = {}
  for axes in (("dcn", "ici"), ("ici",)):
    psum = jax.shard_map(
      lambda v, a=axes: jax.lax.psum(v, a),
      mesh=mesh,
      in_specs=spec,
      out_specs=P(),
      check_vma=False,
    )
    for name, flags in (
      ("native", None),
      ("default", "--equarx_enable --equarx_min_bytes=0"),
      ("flat", "--equarx_enable --equarx_min_bytes=0 --equarx_hierarchy=flat --equarx_force"),
    ):
      fn = jax.jit(psum) if flags is None else equarx_pass.jit(psum, flags=flags)
      compiled = fn.lower(arg).compile()
      row = {"counted": cross_slice_bytes(compiled.as_text(), 2)}
      if flags is not None:
        [r] = fn.report.records
        row.update(
          decision=r.decision,
          route=r.route,
          before=r.traffic_before.slow,
          after=(r.traffic_after if r.rewritten else r.traffic_before).slow,
          reason=r.reason,
        )
      out[f"{','.join(axes)}:{name}"] = row
  print(json.dumps(out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
