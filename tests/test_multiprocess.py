"""Two processes x 4 CPU devices (jax.distributed on loopback, gloo collectives):
a rewritten program whose rings cross the process boundary.

Each process runs the same equarx_pass.jit program on a 2x4 mesh (row a = the
process, a fast domain): psums over "a" (groups of 2, one rank per process) and over "b"
(groups of 4 within a process), both the flat scheme, and over both (one group of 8:
hierarchical), in two schemes, every site forced (--equarx_force).  Each saves
its devices' results and the rewritten module; the test checks that the two
processes emitted the same module, that every group holds bit-identical results
across processes, and that they equal the NumPy model bit for bit.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np

from equarx_pass.emission import hierarchical
from equarx_pass.emission import scheme as scheme_lib
from equarx_pass.planning.policy import Policy

SCHEMES = {
  "ring": "--equarx_algorithm=ring --equarx_rotation=none --equarx_block_size=128",
  "default": "",
}
AXES = {"a": ("a",), "b": ("b",), "ab": ("a", "b")}

CHILD = r"""
import hashlib, json, os, sys
process_id, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
schemes, axes = json.loads(sys.argv[4]), json.loads(sys.argv[5])
import jax, numpy as np
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
                           initialization_timeout=120)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import equarx_pass

assert jax.device_count() == 8 and jax.local_device_count() == 4
mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
spec = P("a", "b")
x = np.load(os.path.join(out, "x.npy"))                          # [2, 4, 1000] f32
xs = jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda i: x[i])

def body(v):
  v = v[0, 0]
  return tuple(jax.lax.psum(v, tuple(a))[None, None] for a in axes.values())
fn = jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=(spec,) * len(axes))
report = {}
for name, flags in schemes.items():
  w = equarx_pass.jit(fn, flags="--equarx_enable --equarx_min_bytes=0 --equarx_force " + flags)
  outs = w(xs)
  module = w.lower(xs).as_text()
  report[name] = {"decisions": [r.decision for r in w.report.records],
                  "routes": [r.route for r in w.report.records],
                  "module": hashlib.sha256(module.encode()).hexdigest()}
  for axis, o in zip(axes, outs):
    for shard in o.addressable_shards:
      i, j = (s.start for s in shard.index[:2])
      np.save(os.path.join(out, f"{name}-{axis}-{i}-{j}.npy"), np.asarray(shard.data)[0, 0])
# --equarx_identity on the same hybrid mesh: every route rebuilt with native collectives.
identity = "--equarx_enable --equarx_min_bytes=0 --equarx_force --equarx_identity"
for name, w in (("plain", jax.jit(fn)), ("identity", equarx_pass.jit(fn, flags=identity))):
  outs = w(xs)
  if name == "identity":
    report[name] = {"routes": [r.route for r in w.report.records]}
  for axis, o in zip(axes, outs):
    for shard in o.addressable_shards:
      i, j = (s.start for s in shard.index[:2])
      np.save(os.path.join(out, f"{name}-{axis}-{i}-{j}.npy"), np.asarray(shard.data)[0, 0])
with open(os.path.join(out, f"report{process_id}.json"), "w") as f:
  json.dump(report, f)
jax.distributed.shutdown()
"""


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_processes(argvs: list[list[str]], env: dict) -> list[str]:
  """`python -c ARGV...` for each of `argvs`, side by side; their output, once every one has
  exited 0.  A hung or failed peer is killed: none outlives the test."""
  procs = [
    subprocess.Popen(
      [sys.executable, "-c", *argv],
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      env=env,
    )
    for argv in argvs
  ]
  try:
    logs = [p.communicate(timeout=300)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  for i, p in enumerate(procs):
    assert p.returncode == 0, f"process {i} failed ({p.returncode}):\n{logs[i][-3000:]}"
  return logs


def ring_groups(axes):
  """Mesh positions (i, j) of each group of a psum over `axes`, in ring order."""
  if axes == ("a",):
    return [[(0, j), (1, j)] for j in range(4)]
  if axes == ("b",):
    return [[(i, j) for j in range(4)] for i in range(2)]
  return [[(i, j) for i in range(2) for j in range(4)]]


def test_two_processes_give_identical_bits(tmp_path):
  x = np.random.default_rng(21).standard_normal((2, 4, 1000)).astype(np.float32)
  x *= np.array([0.01, 1.0, 30.0, 1.0])[None, :, None]
  np.save(tmp_path / "x.npy", x)
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    TF_CPP_MIN_LOG_LEVEL="3",
    XLA_FLAGS="--xla_force_host_platform_device_count=4",
  )
  env.pop("EQUARX_FLAGS", None)
  port = free_port()
  child = [str(port), str(tmp_path), json.dumps(SCHEMES), json.dumps(AXES)]
  run_processes([[CHILD, str(i), *child] for i in range(2)], env)

  reports = [json.loads((tmp_path / f"report{i}.json").read_text()) for i in range(2)]
  assert reports[0] == reports[1], "the processes rewrote the program differently"
  # Identity, planned as the quantized run (hierarchical over both axes), equals jax.jit.
  assert reports[0]["identity"]["routes"] == ["identity"] * 3
  for axis in AXES:
    for i in range(2):
      for j in range(4):
        got = np.load(tmp_path / f"identity-{axis}-{i}-{j}.npy")
        want = np.load(tmp_path / f"plain-{axis}-{i}-{j}.npy")
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist(), (axis, i, j)
  for name, flags in SCHEMES.items():
    # The processes are the fast domains: over "a" (one device per process) and over "b"
    # (inside a process; forced: the cost model would leave it native) the flat scheme,
    # over both the hierarchical form (native inside each process, quantized between).
    assert reports[0][name]["decisions"] == ["rewritten"] * 3
    assert reports[0][name]["routes"] == ["flat", "flat", "hierarchical"]
    scheme = Policy.from_flags("--equarx_enable " + flags).scheme
    for axis, axes in AXES.items():
      for group in ring_groups(axes):
        got = [np.load(tmp_path / f"{name}-{axis}-{i}-{j}.npy") for i, j in group]
        inputs = [x[i, j] for i, j in group]
        for (i, j), g in zip(group, got):
          assert g.view(np.uint32).tolist() == got[0].view(np.uint32).tolist(), (
            f"{name} psum over {axes}: device ({i}, {j}) differs from ({group[0]})"
          )
        if axis == "ab":
          # The model sums each process's devices in device order; the native
          # reduce-scatter inside a process of a multi-process program is gloo's, whose
          # order can round an f32 sum an ulp apart, which the quantization keeps.
          model = hierarchical.reference(inputs, [i for i, _ in group], scheme)
          apart = np.linalg.norm(got[0] - model[0]) / np.linalg.norm(model[0])
          assert apart <= 1e-3, f"{name} psum over {axes}: {apart:.1e} from the model"
          exact = np.sum([v.astype(np.float64) for v in inputs], axis=0)
          err = np.linalg.norm(got[0] - exact) / np.linalg.norm(exact)
          model_err = np.linalg.norm(model[0] - exact) / np.linalg.norm(exact)
          assert err <= 1.01 * model_err, (err, model_err)
          continue
        model = scheme_lib.reference(inputs, scheme)
        assert np.array_equal(got[0].view(np.uint32), model[0].view(np.uint32)), (
          f"{name} psum over {axes}: differs from the model"
        )


REPEAT_CHILD = r"""
import hashlib, json, sys
process_id, processes, per_process, port = (int(a) for a in sys.argv[1:5])
import jax, numpy as np
jax.config.update("jax_num_cpu_devices", per_process)
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=processes, process_id=process_id,
                           initialization_timeout=120)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import equarx_pass
devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
mesh = Mesh(np.array(devices).reshape(processes, per_process), ("a", "b"))
spec = P(("a", "b"))
n, size = processes * per_process, 1 << 22
local = [d for d in devices if d.process_index == process_id]
values = lambda i: np.random.default_rng([7, i]).standard_normal(size).astype(np.float32)
x = jax.make_array_from_single_device_arrays(
  (n, size), NamedSharding(mesh, spec),
  [jax.device_put(values(process_id * per_process + j)[None], d) for j, d in enumerate(local)])
fn = jax.shard_map(lambda v: jax.lax.psum(v, ("a", "b")), mesh=mesh, in_specs=spec, out_specs=spec)
w = equarx_pass.jit(fn, flags="--equarx_enable")
digests = [hashlib.sha256(b"".join(np.asarray(s.data).tobytes() for s in w(x).addressable_shards)
                          ).hexdigest()[:16] for _ in range(8)]
print(json.dumps({"digests": digests, "route": w.report.records[0].route}), flush=True)
jax.distributed.shutdown()
"""


def test_hierarchical_route_gives_the_same_bits_every_call():
  """4 processes of 2 CPU devices: the psum over all 8 is hierarchical (the processes are
  the fast domains), and every call gives the same bits on every device.  (XLA:CPU's own
  reduce-scatter inside a process of such a program gave other results from call to call;
  the pieces inside a domain come from an all-reduce instead: hierarchical.domain_piece.)"""
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("XLA_FLAGS", None)
  env.pop("EQUARX_FLAGS", None)
  port = free_port()
  logs = run_processes([[REPEAT_CHILD, str(i), "4", "2", str(port)] for i in range(4)], env)
  results = [json.loads(log.strip().splitlines()[-1]) for log in logs]
  assert {r["route"] for r in results} == {"hierarchical"}
  for r in results:
    assert len(set(r["digests"])) == 1, r["digests"]
