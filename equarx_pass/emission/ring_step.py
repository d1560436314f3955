"""One flat ring step alone, compiled for one device, and its check against the model.

Between two collective-permutes every step of the flat ring's reduce-scatter
dequantizes the chunk it received, adds its own f32 chunk and quantizes the sum for
the next hop (`ring.emit_ring_step`).  `step_program` compiles exactly those ops for
one device (no collective, so one device of any backend runs it); `compare` says
whether a backend's output has the NumPy model's bits (quantize.py), with or without
the FMA XLA:CPU forms; `backend_arithmetic` probes the two properties of a backend's
f32 arithmetic the model depends on.  tools/bench_gpu_step.py times the step with
these, and tests/test_ring_step.py checks them on XLA:CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from equarx_pass.emission import quantize as qz
from equarx_pass.emission.formats import Format
from equarx_pass.ir import traverse


def step_program(values: int, block: int, fmt: Format) -> tuple[Any, int]:
  """(a compiled (payload int8 [1, P], local f32 [1, C]) -> payload int8 [1, P],
  P): the step for chunks of C = `values` values, on JAX's default device."""
  import jax
  import jax.numpy as jnp
  from jax.extend.mlir import ir
  from jax.extend.mlir.dialects import func

  from equarx_pass import _jax_private
  from equarx_pass.emission.algorithms import ring

  p = fmt.payload_bytes(values, values // block)
  payload_spec = jax.ShapeDtypeStruct((1, p), jnp.int8)
  local_spec = jax.ShapeDtypeStruct((1, values), jnp.float32)
  # Lower a function of the right signature, then replace its body with the step.
  lowered = jax.jit(lambda payload, local: payload, keep_unused=True).lower(
    payload_spec, local_spec
  )
  module: Any = lowered.compiler_ir("stablehlo")  # an ir.Module for "stablehlo"
  main: Any = traverse.find_function(module, "main")
  body = main.opview.body.blocks[0]
  for op in list(body.operations):
    op.erase()
  with module.context, ir.Location.unknown(), ir.InsertionPoint(body):
    out = ring.emit_ring_step(body.arguments[0], body.arguments[1], block, fmt)
    func.ReturnOp([out])
  if not module.operation.verify():
    raise RuntimeError("step module failed verification")
  return _jax_private.lowered_with_module(lowered, module).compile(), p


def to_payload(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
  """The wire payload of one chunk, int8 [1, P]: codes, then the f32 scales' bytes."""
  return np.concatenate([codes.reshape(1, -1), scale.view(np.int8).reshape(1, -1)], 1)


def from_payload(payload: np.ndarray, values: int, fmt: Format) -> tuple[np.ndarray, np.ndarray]:
  """(codes int8, scales f32) of an int8 [1, P] payload of `values` values."""
  code_bytes = fmt.code_bytes(values)
  return payload[0, :code_bytes], payload[0, code_bytes:].copy().view(np.float32)


def model_step(
  payload: np.ndarray, local: np.ndarray, values: int, block: int, fmt: Format, fma: bool = True
) -> np.ndarray:
  """The NumPy model's step.  fma=False rounds the product before the add, as a
  backend that does not contract Dq's multiply into the add would."""
  codes, scale = from_payload(payload, values, fmt)
  local = local.reshape(-1, block)
  if fma:
    decoded = qz.codes_to_f32(codes, fmt, block).reshape(-1, block)
    partial = qz.fused_multiply_add(decoded, scale[:, None], local)
  else:
    partial = qz.dequantize(codes, scale, block, fmt).reshape(-1, block) + local
  return to_payload(*qz.quantize(partial.reshape(1, values), block, fmt))


def compare(
  out: np.ndarray, payload: np.ndarray, local: np.ndarray, values: int, block: int, fmt: Format
) -> str:
  """Which model the device's bits equal, or how far they are from the nearer one."""
  got_codes, got_scale = from_payload(out, values, fmt)
  got_values = qz.codes_to_f32(got_codes, fmt, block)
  found = []
  for fma, name in ((True, "FMA"), (False, "no FMA")):
    want = model_step(payload, local, values, block, fmt, fma)
    if np.array_equal(out, want):
      return "same bits" if fma else "same bits, no FMA"
    want_codes, want_scale = from_payload(want, values, fmt)
    want_values = qz.codes_to_f32(want_codes, fmt, block)
    codes_off = float((got_values != want_values).mean())
    scales_off = float((got_scale != want_scale).mean())
    worst = float(np.abs(got_values - want_values).max())
    found.append((codes_off + scales_off, name, codes_off, worst, scales_off))
  _, name, codes_off, worst, scales_off = min(found)
  return (
    f"model ({name}) but {codes_off:.1e} codes off (max {worst:g}), {scales_off:.1e} scales off"
  )


def backend_arithmetic() -> dict[str, Any]:
  """How the default backend's f32 arithmetic compares with IEEE (what the model
  assumes): the fraction of 1/x not correctly rounded, and whether a * b + c is one FMA."""
  import jax

  rng = np.random.default_rng(1)
  x, y, z = (rng.standard_normal(1 << 22).astype(np.float32) for _ in range(3))
  inverse = np.asarray(jax.jit(lambda a: 1 / a)(x))
  mul_add = np.asarray(jax.jit(lambda a, b, c: a * b + c)(x, y, z))
  return dict(
    reciprocal_not_ieee=float(np.mean(inverse != np.float32(1) / x)),
    mul_add_is_fma=bool(np.array_equal(mul_add, qz.fused_multiply_add(x, y, z))),
    mul_add_is_unfused=bool(np.array_equal(mul_add, x * y + z)),
  )
