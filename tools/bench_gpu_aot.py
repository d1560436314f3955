"""Multi-node H100 clusters, compile-only (no GPU): what crosses the network between nodes,
counted from the compiled programs, beside the report's, and the compile time.

    JAX_PLATFORMS=cpu python tools/bench_gpu_aot.py \\
        [--clusters h100:2x8 h100:4x8] [--programs psum dp_grad fsdp] [--dtypes f32 bf16] \\
        [--sizes 4M 16M 64M] [--gbps 50 12.5] [--out results/gpu_aot.json]

Needs the cuda-aot extra (JAX's CUDA plugin): JAX compiles for N nodes of 8 H100
(equarx_pass.frontends.gpu_aot.cluster_devices) on any machine.  Programs, on a ("node", "gpu") mesh
(FSDP's: ("dcn", "ici"), as equarx_pass/examples/fsdp_step.py names them):

  psum     shard_map psum over both axes of SIZE bytes per GPU
  dp_grad  jax.jit + NamedSharding, no psum: the gradient of a replicated SIZE-byte weight
           on a batch split over every GPU (the partitioner writes the all-reduce)
  fsdp     equarx_pass/examples/fsdp_step.py's SGD step: FSDP inside a node, data parallel
           across; its two weights' gradients each SIZE bytes per GPU after the
           reduce-scatter inside the node (width 4096)

Each compiled with jax.jit and with equarx_pass.jit --equarx_enable (the cost model
decides; --equarx_slow_link_bandwidth=GBPS for each --gbps), one after the other in this
process.  Per row:

  across MiB    bytes per GPU per run sent between nodes, counted from each compiled
                program's collectives and replica groups (gpu_aot.cross_node_bytes: a flat
                all-reduce over several GPUs per node is counted as reduced inside each node
                first, the floor any algorithm sends)
  report MiB    the report's bytes across nodes, summed over the sites
  compile s     lower + compile, wall clock, first compile of each program (the shared
                machine's load moves it)
  first compile s  of "compile pass", on the partitioned route (dp_grad, fsdp): the compile
                of the original program that exposes the partitioner's all-reduces

Writes results/gpu_aot.json (or --out).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402

COLUMNS = [
  "cluster",
  "program",
  "dtype",
  "MiB/GPU",
  "GB/s",
  "rewritten",
  "predicted",
  "across native",
  "across pass",
  "report",
  "vs native",
  "compile jit",
  "compile pass",
  "compile ratio",
  "first compile s",
]
FSDP_WIDTH = 4096


def cluster_mesh(cluster: str, names=("node", "gpu")):
  import numpy as np
  from jax.sharding import Mesh

  from equarx_pass.frontends import gpu_aot

  nodes = gpu_aot.parse_cluster(cluster).nodes
  devices = np.asarray(gpu_aot.cluster_devices(cluster)).reshape(nodes, -1)
  return Mesh(devices, names)


def program(name: str, cluster: str, dtype, size: int):
  """(function, abstract arguments, jit keyword arguments) of program `name`."""
  import jax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  itemsize = jax.numpy.dtype(dtype).itemsize
  if name == "fsdp":
    from equarx_pass.examples import fsdp_step

    mesh = cluster_mesh(cluster, ("dcn", "ici"))
    gpus = mesh.shape["ici"]
    hidden = size * gpus // (itemsize * FSDP_WIDTH)
    step, args = fsdp_step.sgd_step(mesh, dtype, width=FSDP_WIDTH, hidden=hidden, batch=8)
    return step, args, {"out_shardings": fsdp_step.out_shardings(mesh)}
  mesh = cluster_mesh(cluster)
  every = P(("node", "gpu"))
  values = size // itemsize
  if name == "psum":
    arg = jax.ShapeDtypeStruct((mesh.size * values,), dtype, sharding=NamedSharding(mesh, every))
    fn = jax.shard_map(
      lambda v: jax.lax.psum(v, ("node", "gpu")), mesh=mesh, in_specs=every, out_specs=P()
    )
    return fn, (arg,), {}
  if name == "dp_grad":
    rows = values // 1024
    w = jax.ShapeDtypeStruct((rows, 1024), dtype, sharding=NamedSharding(mesh, P()))
    x = jax.ShapeDtypeStruct((mesh.size * 8, rows), dtype, sharding=NamedSharding(mesh, every))

    def grad(w, x):
      return jax.grad(lambda w: jax.numpy.sum(jax.numpy.tanh(x @ w).astype("float32")))(w)

    return grad, (w, x), {}
  raise ValueError(f"unknown program {name!r}")


def measure(cluster: str, name: str, dtype_name: str, size: int, gbps: float) -> dict:
  import jax

  import equarx_pass
  from equarx_pass.frontends import gpu_aot

  dtype = benchlib.jnp_dtype(dtype_name)
  timed = {}
  counted = {}
  for variant in ("jit", "pass"):
    fn, args, kwargs = program(name, cluster, dtype, size)  # a new function: no cache hit
    if variant == "jit":
      jitted = jax.jit(fn, **kwargs)
    else:
      flags = f"--equarx_enable --equarx_slow_link_bandwidth={gbps:g}"
      jitted = equarx_pass.jit(fn, flags=flags, **kwargs)
    start = time.perf_counter()
    lowered = jitted.lower(*args)
    compiled = lowered.compile()
    timed[variant] = time.perf_counter() - start
    counted[variant] = gpu_aot.bytes_across_nodes(lowered, compiled)
  records = jitted.report.records
  rewritten = [r for r in records if r.rewritten]
  report = sum(
    (r.traffic_after if r.rewritten else r.traffic_before).slow * (r.runs or 1)
    for r in records
    if r.traffic_before is not None
  )
  speedups = [r.speedup for r in records if r.speedup is not None]
  MiB = 1 << 20
  return {
    "cluster": cluster,
    "program": name,
    "dtype": dtype_name,
    "MiB/GPU": size / MiB,
    "GB/s": gbps,
    "rewritten": f"{len(rewritten)}/{len(records)}",
    "predicted": "/".join(f"{s:.2f}x" for s in speedups),
    "across native": round(counted["jit"] / MiB, 4),
    "across pass": round(counted["pass"] / MiB, 4),
    "report": round(report / MiB, 4),
    "report equal": abs(report - counted["pass"]) < 1,
    "vs native": round(counted["pass"] / counted["jit"], 3) if counted["jit"] else None,
    "compile jit": round(timed["jit"], 2),
    "compile pass": round(timed["pass"], 2),
    "compile ratio": round(timed["pass"] / timed["jit"], 2),
    "route": jitted.report.lowerings[0].route,
    # Inside "compile pass": the pass itself, and on the partitioned route the compile of
    # the original program that exposes the partitioner's collectives.
    "pass s": round(jitted.report.lowerings[0].pass_seconds, 3),
    "first compile s": round(jitted.report.lowerings[0].first_compile_seconds, 2),
  }


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--clusters", nargs="+", default=["h100:2x8", "h100:4x8"])
  parser.add_argument("--programs", nargs="+", default=["psum", "dp_grad", "fsdp"])
  parser.add_argument("--dtypes", nargs="+", default=["f32", "bf16"])
  parser.add_argument("--sizes", nargs="+", default=["4M", "16M", "64M"])
  parser.add_argument("--gbps", nargs="+", type=float, default=[50.0, 12.5])
  parser.add_argument("--out", default=os.path.join(benchlib.RESULTS, "gpu_aot.json"))
  args = parser.parse_args()

  from equarx_pass.frontends import gpu_aot

  if not gpu_aot.have_cuda_plugin():
    print(f"bench_gpu_aot: {gpu_aot.PLUGIN_HINT}", file=sys.stderr)
    return 2
  # The first compile of a process pays for starting XLA's GPU compiler: not a program's.
  measure(args.clusters[0], "psum", "f32", 1 << 20, 50.0)
  rows = []
  for cluster in args.clusters:
    for name in args.programs:
      for dtype in args.dtypes:
        for size in args.sizes:
          for gbps in args.gbps:
            row = measure(cluster, name, dtype, benchlib.parse_size(size), gbps)
            print(benchlib.table([row], COLUMNS), flush=True)
            rows.append(row)
  print(benchlib.table(rows, COLUMNS, "multi-node H100, compile-only: bytes per GPU across nodes"))
  benchlib.write_results(args.out, rows, rows, COLUMNS)
  return 0


if __name__ == "__main__":
  sys.exit(main())
