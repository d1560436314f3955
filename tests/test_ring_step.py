"""The ring step alone (equarx_pass.emission.ring_step, as tools/bench_gpu_step.py times it)
equals the NumPy model bit for bit on XLA:CPU, and the tool's probe of the backend's
arithmetic sees what the model assumes there: correctly rounded 1/x and an FMA."""

import numpy as np
import pytest

from equarx_pass.emission import quantize as qz
from equarx_pass.emission import ring_step
from equarx_pass.emission.formats import FORMATS

VALUES, BLOCK = 8192, 1024


def _payload(rng, fmt):
  return ring_step.to_payload(
    *qz.quantize(rng.standard_normal((1, VALUES), dtype=np.float32), BLOCK, fmt)
  )


@pytest.mark.parametrize("fmt_name", ["int8", "int4", "fp8_e4m3"])
def test_emitted_step_equals_model(fmt_name):
  fmt = FORMATS[fmt_name]
  rng = np.random.default_rng(3)
  step, payload_bytes = ring_step.step_program(VALUES, BLOCK, fmt)
  payload = _payload(rng, fmt)
  assert payload.shape == (1, payload_bytes)
  local = rng.standard_normal((1, VALUES), dtype=np.float32)
  out = np.asarray(step(payload, local))
  assert ring_step.compare(out, payload, local, VALUES, BLOCK, fmt) == "same bits"


def test_compare_reports_a_wrong_code():
  fmt = FORMATS["int8"]
  rng = np.random.default_rng(4)
  payload = _payload(rng, fmt)
  local = rng.standard_normal((1, VALUES), dtype=np.float32)
  out = ring_step.model_step(payload, local, VALUES, BLOCK, fmt)
  out[0, 7] += 1
  verdict = ring_step.compare(out, payload, local, VALUES, BLOCK, fmt)
  assert verdict.startswith("model (FMA) but 1.2e-04 codes off (max 1)"), verdict


def test_cpu_arithmetic_is_what_the_model_assumes():
  assert ring_step.backend_arithmetic() == dict(
    reciprocal_not_ieee=0.0, mul_add_is_fma=True, mul_add_is_unfused=False
  )
