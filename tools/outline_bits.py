"""What --equarx_outline changes in the bits: one quantized psum and what consumes it.

    python tools/outline_bits.py [--values 16384]

On 8 CPU devices, a shard_map psum of --values values per device (the default scheme,
--equarx_min_bytes=0), followed by nothing, an add of a constant vector, a multiply by
0.1, tanh, or (the psum of a product) an add; in f32 and bf16.  Each program runs with
--equarx_outline=on and =off; the table gives how many values differ between the two and,
in f32, how many of rank 0's values differ from the NumPy model (equarx_pass.emission.scheme.
reference) followed by the same f32 op.  The flag reference (--equarx_outline) and
BUILD_NOTES ("Compile-time decisions") quote it.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ["JAX_PLATFORMS"] = os.environ.get("JAX_PLATFORMS") or "cpu"
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

FLAGS = "--equarx_enable --equarx_min_bytes=0"
# name -> (psum of a product?, what follows the psum)
PROGRAMS = {
  "psum(x)": (False, None),
  "psum(x) + c": (False, "add"),
  "psum(x) * 0.1": (False, "scale"),
  "tanh(psum(x))": (False, "tanh"),
  "psum(a * b) + c": (True, "add"),
}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--values", type=int, default=16384, help="values per device")
  opts = parser.parse_args(argv)

  import jax
  import jax.numpy as jnp
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  import equarx_pass
  from equarx_pass.emission import scheme as scheme_lib

  mesh = Mesh(np.array(jax.devices()), ("x",))
  n = mesh.size
  rng = np.random.default_rng(0)
  a = rng.standard_normal((n, opts.values)).astype(np.float32)
  b = rng.standard_normal((n, opts.values)).astype(np.float32)
  c = rng.standard_normal((opts.values,)).astype(np.float32)
  scheme = equarx_pass.Policy.from_flags(FLAGS).scheme

  def program(product, after, dtype):
    def body(a, b, c):
      x = a[0].astype(dtype) * b[0].astype(dtype) if product else a[0].astype(dtype)
      y = jax.lax.psum(x, "x")
      if after == "add":
        y = y + c.astype(dtype)
      elif after == "scale":
        y = y * jnp.asarray(0.1, dtype)
      elif after == "tanh":
        y = jnp.tanh(y)
      return y[None]

    return jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x"), P()), out_specs=P("x"))

  def model(product, after):
    partials = [(a[r] * b[r] if product else a[r]).astype(np.float32) for r in range(n)]
    y = scheme_lib.reference(partials, scheme)[0]
    if after == "add":
      return (y + c).astype(np.float32)
    if after == "scale":
      return (y * np.float32(0.1)).astype(np.float32)
    return None if after == "tanh" else y

  print(f"{n} CPU devices, {opts.values} values per device, flags {FLAGS!r}")
  print(
    f"{'program':18s} {'dtype':9s} {'on != off':>16s} {'on != model':>14s} {'off != model':>14s}"
  )
  for dtype in (jnp.float32, jnp.bfloat16):
    for name, (product, after) in PROGRAMS.items():
      out = {}
      for mode in ("on", "off"):
        fn = equarx_pass.jit(
          program(product, after, dtype), flags=f"{FLAGS} --equarx_outline={mode}"
        )
        out[mode] = np.asarray(fn(a, b, c).astype(jnp.float32))
      differ = int(np.count_nonzero(out["on"] != out["off"]))
      row = f"{name:18s} {jnp.dtype(dtype).name:9s} {differ:>7d} of {out['on'].size:<6d}"
      want = model(product, after) if dtype == jnp.float32 else None
      if want is not None:
        for mode in ("on", "off"):
          row += f" {int(np.count_nonzero(out[mode][0] != want)):>6d} of {want.size:<5d}"
      print(row)
  return 0


if __name__ == "__main__":
  sys.exit(main())
