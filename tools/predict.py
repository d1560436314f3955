"""The cost model's decision for one psum: what the pass would do on a cluster you describe.

    python tools/predict.py --platform gpu --devices 16 --domain-devices 8 \\
      --slow-gbps 50 12.5 3.125 --sizes 1M 16M 64M
    python tools/predict.py --platform gpu --devices 16 --domain-devices 8 --axis inside

Nothing runs on the described machines: a psum over every device (--axis all) or over the
devices of one domain (--axis inside) is lowered on as many virtual CPU devices, rewritten
for --platform with --equarx_domain_devices, and the report's decision and predicted
speed-up are printed per network figure and size.  The figures are the cost model's
(equarx_pass/planning/cost.py), not measurements.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--platform", default="gpu", choices=["gpu", "tpu", "cpu"])
  parser.add_argument("--devices", type=int, default=16)
  parser.add_argument("--domain-devices", type=int, default=8, help="devices per fast domain")
  parser.add_argument(
    "--axis", default="all", choices=["all", "inside"], help="psum over all devices or one domain"
  )
  parser.add_argument(
    "--slow-gbps", nargs="+", type=float, default=[0.0], help="link figures (0: the default)"
  )
  parser.add_argument("--sizes", nargs="+", default=["1M", "16M", "64M"], help="bytes per device")
  parser.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
  parser.add_argument("--flags", default="--equarx_enable", help="the scheme's flags")
  args = parser.parse_args(argv)
  if args.domain_devices < 1 or args.devices % args.domain_devices:
    parser.error(f"--devices {args.devices} is not whole domains of {args.domain_devices}")
  os.environ["JAX_PLATFORMS"] = "cpu"
  import jax

  jax.config.update("jax_num_cpu_devices", args.devices)
  import numpy as np
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  import equarx_pass

  # A site left native warns that nothing was rewritten: here that is an answer.
  warnings.filterwarnings("ignore", category=equarx_pass.EquarxWarning)

  k = args.domain_devices
  mesh = Mesh(np.array(jax.devices()).reshape(args.devices // k, k), ("domains", "inside"))
  axes = ("domains", "inside") if args.axis == "all" else "inside"
  psum = jax.shard_map(
    lambda v: jax.lax.psum(v, axes), mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False
  )
  dtype = benchlib.jnp_dtype(args.dtype)
  rows = []
  for gbps in args.slow_gbps:
    link = f" --equarx_slow_link_bandwidth={gbps}" if gbps else ""
    for size in args.sizes:
      nbytes = benchlib.parse_size(size)
      flags = (
        f"{args.flags} --equarx_platform={args.platform} --equarx_domain_devices={k}"
        f" --equarx_min_bytes=0{link}"
      )
      fn = equarx_pass.jit(psum, flags=flags)
      fn.lower(jax.ShapeDtypeStruct((nbytes // np.dtype(dtype).itemsize,), dtype))
      (record,) = fn.report.records
      rows.append(
        {
          "slow link GB/s": gbps or "default",
          "bytes per device": benchlib.fmt_bytes(nbytes),
          "model speed-up": f"{record.speedup:.2f}x" if record.speedup else "-",
          "decision": "rewritten" if record.rewritten else "left native",
          "route": record.route or "-",
        }
      )
  title = (
    f"psum over {'all ' + str(args.devices) if args.axis == 'all' else k} {args.platform} "
    f"devices, {k} per fast domain, {args.dtype}: the cost model's prediction"
  )
  print(benchlib.table(rows, list(rows[0]), title))
  return 0


if __name__ == "__main__":
  sys.exit(main())
