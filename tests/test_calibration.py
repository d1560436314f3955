"""The calibrated outlier-feature scheme: calibrate(), the calibration file, the rewrite.

On 8 CPU devices: calibrate() records NumPy's absmax of the psum operands; the
rewritten program equals the NumPy model (outlier.reference) bit for bit, on
every rank; sites not in the file fall back to the dynamic scheme with the
reason in the report; bad files are ParseErrors naming the file; zeros stay
zero, out-of-range values saturate, non-finite values stay non-finite.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from meshes import psum_program

import equarx_pass
from equarx_pass.emission import outlier
from equarx_pass.errors import ParseError
from equarx_pass.ir import wire_bytes
from equarx_pass.planning import calibration
from equarx_pass.planning.policy import Policy

ON = "--equarx_enable --equarx_min_bytes=0"


def _draw(rng, shape, hot=(3, 77)):
  """Gaussian, a few features (last dimension) scaled x100."""
  x = rng.standard_normal(shape).astype(np.float32)
  x[..., list(hot)] *= 100
  return x


def _model(x, entry, group, out_dtype=None, clip=0.0):
  """The model's results for the devices of `group` (ids into x's first axis)."""
  scales = entry.group_scales(group, entry.outliers(), clip)
  return outlier.reference([x[d : d + 1] for d in group], scales, out_dtype)


@pytest.fixture(scope="module")
def one_group(tmp_path_factory):
  """A psum over 8 devices of [1, 40, 256] per device, calibrated on 3 batches."""
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  program = psum_program(mesh, "tp")
  rng = np.random.default_rng(0)
  batches = [_draw(rng, (8, 40, 256)) for _ in range(3)]
  path = str(tmp_path_factory.mktemp("cal") / "one_group.json")
  calib = equarx_pass.calibrate(program, batches, path=path, flags="--equarx_min_bytes=0", ema=0.75)
  return program, batches, path, calib, rng


def test_calibrate_records_numpy_ranges(one_group):
  program, batches, path, calib, _ = one_group
  loaded = calibration.load(path)
  (entry,) = loaded.sites.values()
  assert entry.shape == (1, 40, 256) and entry.dtype == "f32" and loaded.batches == 3
  assert entry.groups == (tuple(range(8)),) and entry.devices == tuple(range(8))
  expected_in = expected_out = expected_ms = None
  for x in batches:
    expected_in = outlier.ema_update(expected_in, np.abs(x).max(axis=1), 0.75)
    total = x.sum(axis=0, dtype=np.float32)
    expected_out = outlier.ema_update(
      expected_out, np.tile(np.abs(total).max(axis=0), (8, 1)), 0.75
    )
    expected_ms = outlier.ema_update(expected_ms, (x.astype(np.float64) ** 2).mean(axis=1), 0.75)
  # The operand's absmax is exact; the result's depends on XLA's order of adds.
  np.testing.assert_array_equal(entry.stats["in_range"], expected_in)
  np.testing.assert_allclose(entry.stats["out_range"], expected_out, rtol=1e-5)
  np.testing.assert_allclose(entry.stats["in_mean_square"], expected_ms, rtol=1e-5)
  data = json.load(open(path))
  assert data["format"] == "equarx-calibration" and data["version"] == 1


@pytest.mark.parametrize("clip", [0.0, 2.55])
def test_calibrated_equals_model_bit_for_bit(one_group, clip):
  program, _, path, calib, rng = one_group
  fn = equarx_pass.jit(
    program, flags=f"{ON} --equarx_calibration={path} --equarx_calibration_clip={clip}"
  )
  x = _draw(rng, (8, 1, 40, 256))[:, 0]
  out = np.asarray(fn(x))
  (record,) = fn.report.records
  assert record.rewritten and record.reason.startswith("calibrated int4 two_shot, 4 of 256")
  assert ("clipped at 2.55 rms" in record.reason) == bool(clip)
  model = _model(x, calib.sites[0], tuple(range(8)), clip=clip)
  for r in range(8):
    np.testing.assert_array_equal(out[r], model[r][0], err_msg=f"rank {r}")
    np.testing.assert_array_equal(out[r], out[0])
  np.testing.assert_array_equal(np.asarray(fn(x)), out)
  exact = x.astype(np.float64).sum(0)
  assert np.linalg.norm(out[0] - exact) / np.linalg.norm(exact) < 0.1


def test_report_gives_the_calibrated_bytes(one_group):
  """The report's bytes and prediction are the calibrated program's, not the dynamic
  scheme's it was first priced with."""
  program, _, path, _, _ = one_group
  fn = equarx_pass.jit(program, flags=f"{ON} --equarx_calibration={path}")
  x = jax.ShapeDtypeStruct((8, 40, 256), jnp.float32)
  module = fn.lower(x).compiler_ir("stablehlo")
  (record,) = fn.report.records
  dynamic = equarx_pass.jit(program, flags=ON)
  dynamic.lower(x)
  (int8,) = dynamic.report.records
  sent = wire_bytes.count_module(module, 8).bytes
  assert record.bytes_after == record.traffic_after.total == sent
  assert sent < int8.traffic_after.total / 1.8
  assert record.speedup > int8.speedup


@pytest.mark.parametrize("axis", ["tp", "dp"])
@pytest.mark.parametrize("shape", [(2, 7, 320), (1, 5, 63)])
def test_calibrated_subgroups_bf16(axis, shape, tmp_path):
  """2x4 mesh, groups of 4 (tp) or 2 (dp), bf16; rows that do not divide into N
  chunks; 320 features (5 in bf16, 315 in int4: odd, rows padded to even) and
  63 (none in bf16)."""
  mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("dp", "tp"))
  program = psum_program(mesh, axis)
  rng = np.random.default_rng(1)
  hot = (3, 17) if shape[-1] > 64 else (5,)
  batches = [_draw(rng, (8,) + shape[1:], hot).astype(jnp.bfloat16) for _ in range(2)]
  path = str(tmp_path / "cal.json")
  calib = equarx_pass.calibrate(program, batches, path=path, flags="--equarx_min_bytes=0")
  # Forced: the cost model leaves sites this small native (on-chip work per site).
  fn = equarx_pass.jit(program, flags=f"{ON} --equarx_force --equarx_calibration={path}")
  x = _draw(rng, (8,) + shape[1:], hot).astype(jnp.bfloat16)
  out = np.asarray(fn(x))
  assert out.dtype == jnp.bfloat16
  assert fn.report.records[0].reason.startswith("calibrated")
  ids = np.arange(8).reshape(2, 4)
  for group in ids if axis == "tp" else ids.T:
    model = _model(x, calib.sites[0], tuple(int(d) for d in group), jnp.bfloat16)
    for pos, d in enumerate(group):
      np.testing.assert_array_equal(out[d], model[pos][0], err_msg=f"device {d}")


def test_per_device_scales_are_the_senders(tmp_path):
  """Ranks with very different ranges: each contribution is dequantized with its
  sender's scales (a max over devices would lose the small ranks' values)."""
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  program = psum_program(mesh, "tp")
  rng = np.random.default_rng(2)
  gain = (10.0 ** np.arange(-3, 5)).astype(np.float32).reshape(8, 1, 1)
  batches = [rng.standard_normal((8, 16, 128)).astype(np.float32) * gain for _ in range(2)]
  path = str(tmp_path / "cal.json")
  calib = equarx_pass.calibrate(program, batches, path=path, flags="--equarx_min_bytes=0")
  ranges = calib.sites[0].stats["in_range"]
  assert ranges[0].max() < 1e-2 < 1e3 < ranges[7].min()
  fn = equarx_pass.jit(program, flags=f"{ON} --equarx_calibration={path}")
  x = rng.standard_normal((8, 16, 128)).astype(np.float32) * gain
  out = np.asarray(fn(x))
  model = _model(x, calib.sites[0], tuple(range(8)))
  np.testing.assert_array_equal(out[3], model[3][0])


def test_zero_saturation_and_nonfinite(one_group):
  program, _, path, calib, rng = one_group
  fn = equarx_pass.jit(program, flags=f"{ON} --equarx_calibration={path}")
  hot = calib.sites[0].outliers()
  cold = [f for f in range(256) if f not in hot][:4]
  x = _draw(rng, (8, 40, 256))
  x[:, :8, :] = 0.0  # whole rows of zeros
  x[:, 8, cold[0]] = 1e6  # far beyond the calibrated range: saturates
  x[2, 10, cold[1]] = np.nan  # NaN in an int4 feature
  x[5, 11, cold[2]] = np.inf  # Inf in an int4 feature
  x[1, 12, cold[3]] = -np.inf
  x[6, 13, hot[0]] = np.inf  # Inf in a bf16 feature
  x[4, 14, hot[1]] = np.nan
  out = np.asarray(fn(x))
  model = _model(x, calib.sites[0], tuple(range(8)))
  for r in range(8):
    np.testing.assert_array_equal(out[r], model[r][0])
  assert np.all(out[:, :8, :] == 0)
  # Saturated: every rank's 1e6 comes back as (about) its calibrated range.
  total_range = calib.sites[0].stats["in_range"][:, cold[0]].sum()
  assert np.all(np.isfinite(out[:, 8, cold[0]]))
  assert np.all(np.abs(out[:, 8, cold[0]]) <= calib.sites[0].stats["out_range"][0, cold[0]] * 1.01)
  assert total_range < 1e6
  for row, feature in ((10, cold[1]), (11, cold[2]), (12, cold[3]), (13, hot[0]), (14, hot[1])):
    assert not np.isfinite(out[:, row, feature]).any(), (row, feature)
  assert np.isposinf(out[:, 13, hot[0]]).all()
  # Everything else in those rows stays finite.
  assert np.isfinite(np.delete(out[:, 10], cold[1], axis=1)).all()


def test_fallback_when_not_calibrated(one_group, tmp_path):
  """A second psum (not in the file) and a different shape keep the dynamic scheme."""
  program, _, path, _, rng = one_group
  mesh = Mesh(np.array(jax.devices()), ("tp",))

  def two_sums(x):
    return jax.lax.psum(jax.lax.psum(x, "tp") * 0.5, "tp")

  two = jax.shard_map(two_sums, mesh=mesh, in_specs=P("tp"), out_specs=P("tp"))
  fn = equarx_pass.jit(two, flags=f"{ON} --equarx_calibration={path}")
  fn(_draw(rng, (8, 40, 256)))
  first, second = fn.report.records
  assert first.rewritten and second.rewritten
  assert "not calibrated" in first.reason and "is at" in first.reason  # other location
  assert "site #1 is not in the calibration file" in second.reason
  assert second.reason.startswith(Policy().scheme.describe())

  fn = equarx_pass.jit(program, flags=f"{ON} --equarx_calibration={path}")
  fn(_draw(rng, (8, 24, 128)))
  (record,) = fn.report.records
  assert (
    "not calibrated: shape 1x24x128 f32 differs from the calibrated 1x40x256 f32" in record.reason
  )


def test_other_rows_and_several_signatures(one_group, tmp_path):
  """Per-feature statistics hold for any number of rows: a call with fewer rows is
  calibrated too, and calibration batches may have several signatures."""
  program, _, path, calib, rng = one_group
  fn = equarx_pass.jit(program, flags=f"{ON} --equarx_calibration={path}")
  x = _draw(rng, (8, 3, 256))
  out = np.asarray(fn(x))
  assert fn.report.records[0].reason.startswith("calibrated")
  model = _model(x, calib.sites[0], tuple(range(8)))
  np.testing.assert_array_equal(out[5], model[5][0])

  batches = [_draw(rng, (8, rows, 256)) for rows in (16, 40, 16)]
  path2 = str(tmp_path / "two_signatures.json")
  calib2 = equarx_pass.calibrate(program, batches, path=path2, flags="--equarx_min_bytes=0")
  assert calib2.batches == 3 and list(calib2.sites) == [0]
  expected = None
  for b in batches:
    expected = outlier.ema_update(expected, np.abs(b).max(axis=1), 0.9)
  np.testing.assert_array_equal(calib2.sites[0].stats["in_range"], expected)


def test_loop_sites_are_unobserved_and_fall_back(tmp_path):
  mesh = Mesh(np.array(jax.devices()), ("tp",))

  def body(x):
    def step(carry, _):
      return carry + jax.lax.psum(carry, "tp") * 0.125, None

    return jax.lax.scan(step, x, None, length=2)[0]

  program = jax.shard_map(body, mesh=mesh, in_specs=P("tp"), out_specs=P("tp"))
  x = np.ones((8, 16, 128), np.float32)
  path = str(tmp_path / "cal.json")
  calib = equarx_pass.calibrate(program, [x], path=path, flags="--equarx_min_bytes=0")
  assert not calib.sites and "loop" in calib.unobserved[0]["reason"]
  fn = equarx_pass.jit(program, flags=f"{ON} --equarx_calibration={path}")
  fn(x)
  assert "not in the calibration file" in fn.report.records[0].reason


@pytest.mark.parametrize(
  "content, message",
  [
    (None, "cannot read the calibration file"),
    ("{not json", "bad JSON"),
    ('{"format": "something else"}', "not a calibration file"),
    ('{"format": "equarx-calibration", "version": 99}', "version 99"),
    (
      '{"format": "equarx-calibration", "version": 1, "ema": 0.9, "batches": 1, '
      '"sites": [{"index": 0}]}',
      "missing field",
    ),
  ],
)
def test_bad_calibration_file(content, message, tmp_path):
  path = tmp_path / "bad calibration.json"
  if content is not None:
    path.write_text(content)
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  fn = equarx_pass.jit(psum_program(mesh, "tp"), flags=f"{ON} '--equarx_calibration={path}'")
  with pytest.raises(ParseError) as info:
    fn(np.ones((8, 4, 128), np.float32))
  assert str(path) in str(info.value) and message in str(info.value)


def test_calibration_flags_round_trip():
  policy = Policy.from_flags(
    "--equarx_enable '--equarx_calibration=/tmp/a b.json' --equarx_calibration_clip=2.55"
  )
  assert policy.calibration == "/tmp/a b.json" and policy.calibration_clip == 2.55
  assert Policy.from_flags(policy.to_flags()) == policy
  with pytest.raises(equarx_pass.FlagError, match="calibration_clip"):
    Policy.from_flags("--equarx_calibration_clip=0.5")
