"""The one-shot all-reduce (algorithms/one_shot.py) and where the plan gives it to a site.

The one-shot sends a rank's whole quantized operand to every other rank in one all-gather,
one collective step where the two-shot takes two; for a group of two the bytes are the
same.  Under the default two-shot, a small site across slow links that the two-shot is
predicted to lose (its second step's latency) gets the one-shot where that wins.  On 8 CPU
devices as a 2x4 mesh, fast domains of 4 devices priced as TPU slices over DCN.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from meshes import psum_program

import equarx_pass
from equarx_pass.emission import scheme as scheme_lib
from equarx_pass.emission.algorithms import ALGORITHMS

ACROSS = "--equarx_enable --equarx_platform=tpu --equarx_domain_devices=4 --equarx_rotation=none "


def _mesh():
  return Mesh(np.array(jax.devices()).reshape(2, 4), ("dp", "tp"))


def _run(flags: str, columns: int):
  """A bf16 psum over dp (groups {d, d + 4}: one device in each domain) of `columns`
  values a device, as 2 rows: a TPU stores them unpadded (one row of bf16 would take
  two rows of tiles, twice the bytes: platforms.TileRule)."""
  x = np.random.default_rng(3).standard_normal((16, columns // 2)).astype(jnp.bfloat16)
  fn = equarx_pass.jit(psum_program(_mesh(), "dp"), flags=ACROSS + flags)
  out = np.asarray(fn(x))
  (record,) = fn.report.records
  return fn, x, out, record


def _equals_model(fn, x, out):
  ids = np.arange(8).reshape(2, 4)
  for group in ids.T:
    scheme = dataclasses.replace(fn.policy.scheme, algorithm="one_shot")
    model = scheme_lib.reference([x[2 * d : 2 * d + 2] for d in group], scheme, jnp.bfloat16)
    for pos, d in enumerate(group):
      np.testing.assert_array_equal(out[2 * d : 2 * d + 2], model[pos], err_msg=f"device {d}")


def test_small_site_across_slices_gets_the_one_shot():
  # 192 KiB of bf16 a device: the two-shot's second DCN step costs more than its bytes
  # save; the one-shot's single step wins (predicted 1.08x).
  fn, x, out, record = _run("", 12 * 8192)
  assert record.decision == "rewritten", record.reason
  assert record.reason.startswith("int8 one_shot"), record.reason
  assert record.traffic_after.slow_steps == 1 and record.traffic_before.slow_steps == 1
  assert record.speedup is not None and record.speedup > 1
  text = fn.lower(x).as_text()
  assert "stablehlo.all_gather" in text and "stablehlo.all_to_all" not in text
  _equals_model(fn, x, out)


def test_large_site_keeps_the_two_shot():
  fn, _, _, record = _run("", 256 * 1024)
  assert record.decision == "rewritten", record.reason
  assert record.reason.startswith("int8 two_shot"), record.reason


def test_a_named_algorithm_is_not_replaced():
  # --equarx_algorithm names what the sites get: no fallback under the ring.
  _, _, _, record = _run("--equarx_algorithm=ring", 9 * 8192)
  assert record.decision == "skipped", record.reason
  assert "one_shot" not in record.reason


def test_too_small_for_either_stays_native():
  _, _, _, record = _run("--equarx_min_bytes=0", 1024)
  assert record.decision == "skipped", record.reason
  assert "left native" in record.reason


def test_one_shot_bytes_and_steps():
  # N-1 copies of the rank's N quantized chunks, in one step; for N = 2 the two-shot's bytes.
  one, two = ALGORITHMS["one_shot"], ALGORITHMS["two_shot"]
  for n in (2, 4, 8):
    layout = scheme_lib.Scheme(algorithm="one_shot").layout(n * 4096, n)
    fmt = scheme_lib.Scheme().fmt
    chunk = fmt.payload_bytes(layout.chunk, layout.blocks)
    assert one.wire_bytes(layout, fmt) == (n - 1) * n * chunk
    assert one.collective_steps(n) == 1
    if n == 2:
      assert one.wire_bytes(layout, fmt) == two.wire_bytes(layout, fmt)
  # One copy crosses to each other domain: all of it for two ranks in two domains.
  assert one.crossing_share([0, 1]) == 1.0
  assert one.crossing_share([0, 0, 1, 1]) == pytest.approx(1 / 3)
  assert one.crossing_share([0, 0, 0, 0]) == 0.0


def test_no_fallback_on_fast_links_alone():
  # Inside one domain the on-chip work decides: a site the two-shot loses stays native.
  x = np.random.default_rng(3).standard_normal((8, 9 * 8192)).astype(np.float32)
  fn = equarx_pass.jit(psum_program(_mesh(), "tp"), flags=ACROSS)
  fn(x)
  (record,) = fn.report.records
  assert record.decision == "skipped", record.reason
  assert record.reason.startswith("fast links only"), record.reason
