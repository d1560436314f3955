"""Digests of what the pass emits: every fixture under many schemes, one line each.

    python tools/emit_digest.py --out /tmp/before.json      # about 3 min
    (change the emitter's code, not its output)
    python tools/emit_digest.py --out /tmp/after.json --compare /tmp/before.json

A restructuring of the emitter must not change one emitted byte.  This rewrites
every module in hlo_fixtures/ under each scheme below (every algorithm, format,
rotation, form, platform, block layout and lane count the flags offer, and the
calibrated scheme on a psum calibrated here) and prints the SHA-256 of the
rewritten StableHLO text.  With --compare it lists the (fixture, scheme) pairs
whose text changed and exits 1 if any did.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

ON = "--equarx_enable --equarx_min_bytes=0"


def schemes(formats, algorithms) -> list[str]:
  """Flag strings covering each emitter path the flags can reach."""
  out = []
  for algorithm in algorithms:
    for fmt in formats:
      for rotation in ("none", "hadamard"):
        base = f"{ON} --equarx_algorithm={algorithm} --equarx_format={fmt}"
        base += f" --equarx_rotation={rotation}"
        out.append(base)
        if algorithm != "bidirectional":
          out.append(base + " --equarx_form=flat")
          out.append(base + " --equarx_platform=tpu")
        if algorithm == "ring":
          out.append(base + " --equarx_unroll_min_bytes=0 --equarx_form=flat")
          out.append(base + " --equarx_block_size=256")
        if algorithm != "two_shot" and fmt in ("int8", "int4"):
          out.append(base + " --equarx_microshards=2")
          out.append(base + " --equarx_block_layout=grid")
  return out


def digest(text: str) -> str:
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def fixture_digests(schemes_, fixtures) -> dict[str, str]:
  from equarx_pass import Policy
  from equarx_pass.errors import EquarxError
  from equarx_pass.frontends.transform import transform_text

  out = {}
  for path in fixtures:
    data = open(path, "rb").read()
    name = os.path.basename(path)
    for flags in schemes_:
      try:
        text = transform_text(data, Policy.from_flags(flags), path).text
        out[f"{name} | {flags}"] = digest(text)
      except EquarxError as e:
        out[f"{name} | {flags}"] = "error: " + str(e).splitlines()[0]
  return out


def calibrated_digests() -> dict[str, str]:
  """The calibrated scheme's emission, on a psum over 8 devices calibrated here."""
  import jax
  import numpy as np
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  import equarx_pass

  mesh = Mesh(np.array(jax.devices()), ("tp",))

  program = jax.shard_map(
    lambda v: jax.lax.psum(v, "tp"), mesh=mesh, in_specs=P("tp"), out_specs=P("tp")
  )

  rng = np.random.default_rng(0)
  batches = []
  for _ in range(2):
    x = rng.standard_normal((8, 40, 256)).astype(np.float32)
    x[..., [3, 77]] *= 100
    batches.append(x)
  out = {}
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "calibration.json")
    equarx_pass.calibrate(program, batches, path=path, flags="--equarx_min_bytes=0")
    for clip in (0, 3):
      flags = f"{ON} --equarx_calibration={path} --equarx_calibration_clip={clip}"
      fn = equarx_pass.jit(program, flags=flags)
      text = fn.lower(batches[0]).as_text()
      (record,) = fn.report.records
      if "calibrated" not in record.reason or "not calibrated" in record.reason:
        raise SystemExit(f"the calibrated scheme was not emitted: {record.reason}")
      out[f"calibrated psum | clip {clip}"] = digest(text)
  return out


def read_digests(path: str) -> dict[str, str]:
  """{case: digest} of a file this tool wrote, or (before the common result envelope) the
  plain dict it wrote then."""
  with open(path) as f:
    data = json.load(f)
  if "results" in data:
    return {row["case"]: row["sha256"] for row in data["results"]}
  return data


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--out", required=True, help="where to write the digests (JSON)")
  ap.add_argument("--compare", help="digests written before: list what changed")
  args = ap.parse_args()

  import jax

  jax.config.update("jax_num_cpu_devices", 8)
  from equarx_pass.planning import policy

  fixtures = sorted(glob.glob(os.path.join(benchlib.ROOT, "hlo_fixtures", "*.mlir")))
  fixtures += sorted(glob.glob(os.path.join(benchlib.ROOT, "hlo_fixtures", "*.txt")))
  digests = fixture_digests(schemes(policy.FORMATS, policy.ALGORITHMS), fixtures)
  digests.update(calibrated_digests())
  benchlib.write_result(args.out, [{"case": k, "sha256": digests[k]} for k in sorted(digests)])
  errors = sum(v.startswith("error") for v in digests.values())
  print(f"{len(digests)} digests ({errors} errors, recorded as such)")
  if not args.compare:
    return 0
  before = read_digests(args.compare)
  changed = [k for k in sorted(before) if k in digests and before[k] != digests[k]]
  missing = [k for k in sorted(before) if k not in digests]
  for k in changed:
    print(f"changed: {k}\n  before {before[k]}\n  after  {digests[k]}")
  for k in missing:
    print(f"not emitted now: {k}")
  same = len(before) - len(changed) - len(missing)
  print(f"{same} of {len(before)} unchanged, {len(changed)} changed, {len(missing)} missing")
  return 1 if changed or missing else 0


if __name__ == "__main__":
  sys.exit(main())
