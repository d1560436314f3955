"""The hierarchical all-reduce: native inside each fast domain, quantized across domains.

On 8 CPU devices in one process every device stands for a host; --equarx_domains and
--equarx_domain_devices group them into fast domains as slices or multi-device hosts
would be.  The emitted program must equal the NumPy model (hierarchical.reference) bit for
bit, every rank of a group must hold the same bits, and the report must say what crosses
the slow links.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import equarx_pass
from equarx_pass import topology
from equarx_pass.emission import hierarchical
from equarx_pass.emission import scheme as scheme_lib
from equarx_pass.planning.policy import Policy

MESH = jax.make_mesh((2, 4), ("dcn", "ici"))
SPEC = P(("dcn", "ici"))
DOMAINS = "--equarx_enable --equarx_min_bytes=0 --equarx_domains=2"
SCHEMES = [
  "",
  "--equarx_algorithm=ring --equarx_rotation=none",
  "--equarx_algorithm=ring --equarx_format=int4 --equarx_rotation=none --equarx_block_size=128",
  "--equarx_format=fp8_e4m3",
  "--equarx_form=flat",
]


def psum_program(axes, flags):
  fn = jax.shard_map(
    lambda v: jax.lax.psum(v, axes), mesh=MESH, in_specs=SPEC, out_specs=SPEC, check_vma=False
  )
  return equarx_pass.jit(fn, flags=flags)


def sharded(x):
  return jax.device_put(x, NamedSharding(MESH, SPEC))


def bits(a):
  a = np.asarray(a)
  return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def data(values, dtype, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((8, values)) * np.geomspace(0.01, 100, 8)[:, None]
  return x.astype(dtype)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.float16], ids=str)
@pytest.mark.parametrize("values", [3001, 4096])
def test_equals_the_model_bit_for_bit(scheme, dtype, values):
  flags = f"{DOMAINS} {scheme}"
  w = psum_program(("dcn", "ici"), flags)
  x = data(values, dtype)
  got = np.asarray(w(sharded(x)))
  [record] = w.report.records
  assert record.rewritten and record.route == "hierarchical", record.reason
  assert record.reason.startswith("hierarchical (2x4: native inside each domain")
  want = hierarchical.reference(list(x), [0] * 4 + [1] * 4, Policy.from_flags(flags).scheme)
  for r in range(8):
    np.testing.assert_array_equal(bits(got[r]), bits(want[r]), err_msg=f"rank {r}")


def test_ranks_agree_and_error_is_the_schemes():
  w = psum_program(("dcn", "ici"), DOMAINS)
  x = data(1 << 14, np.float32, seed=3)
  got = np.asarray(w(sharded(x)))
  assert all(np.array_equal(got[0], got[r]) for r in range(8))
  exact = x.astype(np.float64).sum(0)
  err = np.linalg.norm(got[0] - exact) / np.linalg.norm(exact)
  assert 1e-4 < err < 1.2e-2, err


def test_extreme_values_stay_faithful():
  x = data(2048, np.float32, seed=4)
  x[:, :512] = 0.0  # whole zero blocks stay exactly zero
  x[2, 700] = np.nan
  x[5, 900] = np.inf
  got = np.asarray(psum_program(("dcn", "ici"), DOMAINS)(sharded(x)))
  assert (got[:, :512] == 0).all()
  assert np.isnan(got[:, 700]).all()
  assert not np.isfinite(got[:, 900]).any()
  assert all(np.array_equal(bits(got[0]), bits(got[r])) for r in range(8))


def test_a_group_with_one_member_per_domain_is_flat():
  w = psum_program(("dcn",), DOMAINS + " --equarx_force")
  x = data(4096, np.float32)
  got = np.asarray(w(sharded(x)))
  [record] = w.report.records
  assert record.rewritten and record.route == "flat"
  for r in range(4):  # groups {r, r + 4}: the flat scheme's model
    want = scheme_lib.reference([x[r], x[r + 4]], Policy.from_flags(DOMAINS).scheme)
    np.testing.assert_array_equal(got[r], want[0])


def test_a_group_inside_one_domain_stays_native_unless_forced():
  w = psum_program(("ici",), DOMAINS)
  x = data(1 << 16, np.float32)
  with pytest.warns(equarx_pass.EquarxWarning, match="fast links only"):
    got = np.asarray(w(sharded(x)))
  [record] = w.report.records
  assert record.decision == "skipped"
  assert record.reason.startswith("fast links only: rewrite predicted")
  assert "--equarx_force" in record.reason
  np.testing.assert_array_equal(got, np.asarray(jax.jit(w._fun)(sharded(x))))
  forced = psum_program(("ici",), DOMAINS + " --equarx_force")
  forced(sharded(x))
  [record] = forced.report.records
  assert record.rewritten and record.route == "flat" and record.speedup < 1


def test_uneven_domains_fall_back_to_flat_with_the_reason():
  w = psum_program(("dcn", "ici"), "--equarx_enable --equarx_min_bytes=0 --equarx_domain_devices=3")
  x = data(4096, np.float32)
  got = np.asarray(w(sharded(x)))
  [record] = w.report.records
  assert record.rewritten and record.route == "flat"
  assert (
    "not hierarchical: the group spans 3 fast domains unevenly (3, 3, 2 members)" in record.reason
  )
  assert all(np.array_equal(got[0], got[r]) for r in range(8))


def test_hierarchy_flat_flag_keeps_the_flat_form():
  w = psum_program(("dcn", "ici"), DOMAINS + " --equarx_hierarchy=flat")
  w(sharded(data(4096, np.float32)))
  assert w.report.records[0].route == "flat"


def test_report_splits_bytes_by_link_class():
  w = psum_program(("dcn", "ici"), DOMAINS)
  w(sharded(data(1 << 16, jnp.bfloat16)))
  [record] = w.report.records
  before, after = record.traffic_before, record.traffic_after
  # Native on CPU: XLA's one ring over the 8 devices, bf16 widened to f32 on the wire
  # (256 KiB); each domain's link carries 2(N-1)/N of it, a quarter per device.
  assert before.slow == pytest.approx(2 * 7 / 8 * 256 * 1024 / 4)
  # Rewritten: the int8 two-shot of the quarter (16384 values) between 2 members.
  scheme = Policy.from_flags(DOMAINS).scheme
  assert after.slow == scheme.wire_bytes(scheme.layout(16384, 2))
  assert after.slow < before.slow / 3
  text = str(w.report)
  assert "topology: 2 fast domains (--equarx_domains=2)" in text
  assert "network before" in text and "memory after" in text


def test_topology_of_devices():
  class Device:
    def __init__(self, process_index=0, slice_index=None, device_kind=""):
      self.process_index, self.device_kind = process_index, device_kind
      if slice_index is not None:
        self.slice_index = slice_index

  tpu = [Device(0, s, "TPU v5 lite") for s in (0, 0, 1, 1)]
  t = topology.from_devices(tpu, "tpu")
  assert t.domains == (0, 0, 1, 1) and (t.fast.name, t.slow.name) == ("ici", "dcn")
  hosts = [Device(p) for p in (0, 0, 0, 0, 1, 1, 1, 1)]
  assert topology.from_devices(hosts, "gpu").domains == (0,) * 4 + (1,) * 4
  # One CPU process: every device a host of its own.
  one = topology.from_devices([Device(0)] * 4, "cpu")
  assert one.domains == (0, 1, 2, 3) and one.slow.name == "network"
  assert topology.from_devices(tpu, "tpu", slow_bandwidth=50).slow.gbytes_per_s == 50
  v5p = topology.from_devices([Device(0, 0, "TPU v5")], "tpu")  # v5p's device kind
  assert (v5p.fast.gbytes_per_s, v5p.slow.gbytes_per_s) == (180.0, 6.25)
  levels = topology.split_groups([(0, 1, 2, 3)], t)
  assert levels.inner == ((0, 1), (2, 3)) and levels.outer == ((0, 2), (1, 3))
  assert topology.split_groups([(0, 1)], t) == "inside one fast domain"


OPS = "--equarx_ops=all_reduce,reduce_scatter,all_gather"


@pytest.mark.parametrize("scheme", SCHEMES[:3])
@pytest.mark.parametrize("dimension", [0, 1])
def test_reduce_scatter_and_all_gather_across_domains(scheme, dimension):
  """psum_scatter and all_gather over both mesh axes: a native reduce-scatter (all-gather)
  inside each domain and the quantized one across; the model's bits on every rank."""
  flags = f"{DOMAINS} {OPS} {scheme}"
  policy = Policy.from_flags(flags)

  def body(v):
    v = v[0]
    scattered = jax.lax.psum_scatter(v, ("dcn", "ici"), scatter_dimension=dimension, tiled=True)
    return scattered[None], jax.lax.all_gather(v, ("dcn", "ici"), axis=dimension, tiled=True)[None]

  fn = jax.shard_map(body, mesh=MESH, in_specs=SPEC, out_specs=(SPEC, SPEC), check_vma=False)
  w = equarx_pass.jit(fn, flags=flags)
  x = data(8 * 48 * 16, np.float32).reshape(8, 8 * 48, 16)
  if dimension:
    x = np.ascontiguousarray(x.reshape(8, 48, 8 * 16))
  scattered, gathered = (np.asarray(a) for a in w(sharded(x)))
  kinds = {r.kind: r for r in w.report.records}
  for kind in ("reduce_scatter", "all_gather"):
    assert kinds[kind].rewritten and kinds[kind].route == "hierarchical", kinds[kind].reason
  # Rank r holds piece r of the sum, and every rank all of x in rank order (to the
  # scheme's error): the model's bits are the right pieces in the right places.
  tolerance = 0.3 if "int4" in scheme else 2e-2
  exact = np.moveaxis(x.astype(np.float64).sum(0), dimension, 0).reshape(8, -1)
  for r in range(8):
    piece = np.moveaxis(scattered[r], dimension, 0).reshape(-1)
    assert np.linalg.norm(piece - exact[r]) <= tolerance * np.linalg.norm(exact[r])
  whole = np.concatenate(list(x), axis=dimension)
  assert np.linalg.norm(gathered[3] - whole) <= tolerance * np.linalg.norm(whole)
  domains = [0] * 4 + [1] * 4
  want = hierarchical.reduce_scatter_reference(list(x), domains, policy.scheme, dimension)
  for r in range(8):
    np.testing.assert_array_equal(bits(scattered[r]), bits(want[r]), err_msg=f"rank {r}")
  want = hierarchical.all_gather_reference(list(x), domains, policy.scheme, dimension)
  for r in range(8):
    np.testing.assert_array_equal(bits(gathered[r]), bits(want), err_msg=f"rank {r}")


SLOW_INT4 = f"{DOMAINS} --equarx_slow_format=int4"


@pytest.mark.parametrize("domains", [2, 4])
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16], ids=str)
def test_slow_format_sends_int4_across_and_equals_the_model(domains, dtype):
  """--equarx_slow_format=int4: the step across domains in int4, the model's bits on every
  rank, half the int8 bytes on the slow links, and the report says so per link class."""
  flags = SLOW_INT4.replace("--equarx_domains=2", f"--equarx_domains={domains}")
  w = psum_program(("dcn", "ici"), flags)
  x = data(3001, dtype)
  got = np.asarray(w(sharded(x)))
  [record] = w.report.records
  k = 8 // domains
  assert (
    f"hierarchical ({domains}x{k}: native inside each domain, int4 two_shot, block 128, "
    "hadamard 128 across)" in record.reason
  )
  assert record.link_formats == ("int4", "native")
  policy = Policy.from_flags(flags)
  across = policy.slow_scheme(policy.scheme)
  assert across == dataclasses.replace(policy.scheme, format="int4")
  want = hierarchical.reference(list(x), [r // k for r in range(8)], across)
  for r in range(8):
    np.testing.assert_array_equal(bits(got[r]), bits(want[r]), err_msg=f"rank {r}")
  int8 = psum_program(("dcn", "ici"), flags.replace(" --equarx_slow_format=int4", ""))
  int8(sharded(x))
  [int8_record] = int8.report.records
  assert record.traffic_after.slow < 0.55 * int8_record.traffic_after.slow
  assert record.traffic_after.fast == int8_record.traffic_after.fast
  assert "network / memory format" in str(w.report) and "int4 / native" in str(w.report)
  assert "format" not in str(int8.report).splitlines()[2]  # the header: no such column


def test_slow_format_where_a_flat_group_crosses_only_slow_links():
  """A group with one member per domain sends everything across the slow links: the slow
  format, the model's bits.  A group inside one domain, and one that spans domains
  unevenly (its fast links carry the collective too), keep --equarx_format."""
  x = data(1 << 14, np.float32)
  across = psum_program(("dcn",), SLOW_INT4 + " --equarx_force")
  got = np.asarray(across(sharded(x)))
  [record] = across.report.records
  assert record.route == "flat" and record.reason.startswith("int4 two_shot")
  assert record.link_formats == ("int4", "")
  policy = Policy.from_flags(SLOW_INT4)
  for r in range(4):  # groups {r, r + 4}
    want = scheme_lib.reference([x[r], x[r + 4]], policy.slow_scheme(policy.scheme))
    np.testing.assert_array_equal(got[r], want[0])
  inside = psum_program(("ici",), SLOW_INT4 + " --equarx_force")
  inside(sharded(x))
  [record] = inside.report.records
  assert record.route == "flat" and record.reason.startswith("int8 two_shot")
  assert record.link_formats == ("", "int8")
  uneven = psum_program(
    ("dcn", "ici"),
    "--equarx_enable --equarx_min_bytes=0 --equarx_domain_devices=3 --equarx_slow_format=int4",
  )
  uneven(sharded(x))
  [record] = uneven.report.records
  assert record.route == "flat" and record.reason.startswith("int8 two_shot")
  assert record.link_formats == ("int8", "int8")


def test_slow_format_flag():
  policy = Policy.from_flags("--equarx_enable --equarx_slow_format=mxint8")
  slow = policy.slow_scheme(policy.scheme)
  assert (slow.format, slow.block_size, slow.resolved_rotation_size) == ("mxint8", 32, 32)
  assert Policy.from_flags(policy.to_flags()) == policy
  plain = Policy.from_flags("--equarx_enable --equarx_slow_format=int8")
  assert plain.slow_scheme(plain.scheme) == plain.scheme
  with pytest.raises(equarx_pass.FlagError, match="--equarx_slow_format must be one of"):
    Policy.from_flags("--equarx_slow_format=int3")
