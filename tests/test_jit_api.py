"""equarx_pass.jit behaves as jax.jit: decorator forms, keyword arguments, caching, flags."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import equarx_pass
from equarx_pass.emission.algorithms import ring
from equarx_pass.planning import policy as policy_lib

MESH = Mesh(np.array(jax.devices()).reshape(8), ("x",))
SHARDED = NamedSharding(MESH, P("x"))
REPLICATED = NamedSharding(MESH, P())
# The int8 ring, compared with ring.reference_allreduce below.
ON = (
  "--equarx_enable --equarx_min_bytes=0 --equarx_force --equarx_block_size=128 "
  "--equarx_algorithm=ring --equarx_rotation=none"
)
FLAGS_DEFAULT = "--equarx_enable --equarx_min_bytes=0"  # the default scheme


def psum_body(x):
  """The psum of each device's row; the docstring must survive the decorator."""
  return jax.lax.psum(x, "x")


PSUM = jax.shard_map(psum_body, mesh=MESH, in_specs=P("x"), out_specs=P("x"))


def data(cols=300, seed=0):
  return np.random.default_rng(seed).standard_normal((8, cols)).astype(np.float32)


def expected(x, block=128):
  """The model's result for PSUM (rank r holds row r)."""
  return np.stack(ring.reference_allreduce(list(x), block))


def assert_bits_equal(a, b):
  a, b = np.asarray(a), np.asarray(b)
  assert a.dtype == b.dtype and a.shape == b.shape
  assert a.tobytes() == b.tobytes()


def rewritten(w):
  return [r.decision for r in w.report.records] == ["rewritten"] * len(w.report.records) and len(
    w.report.records
  ) > 0


# --- decorator forms -----------------------------------------------------------


def test_three_decorator_forms_agree(monkeypatch):
  x = data()
  monkeypatch.setenv("EQUARX_FLAGS", ON)

  @equarx_pass.jit
  def bare(v):
    return PSUM(v)

  monkeypatch.delenv("EQUARX_FLAGS")

  @equarx_pass.jit(flags=ON)
  def called(v):
    return PSUM(v)

  direct = equarx_pass.jit(PSUM, flags=ON)
  want = expected(x)
  for w in (bare, called, direct):
    assert isinstance(w, equarx_pass.Jitted)
    assert w.policy == equarx_pass.Policy.from_flags(ON)
    assert_bits_equal(w(x), want)
    assert rewritten(w)


def test_wrapper_keeps_the_function_identity():
  w = equarx_pass.jit(psum_body, flags=ON)
  assert w.__name__ == "psum_body" and w.__doc__ == psum_body.__doc__
  assert w.__wrapped__ is psum_body
  # Attributes the wrapper does not define come from the jax.jit object.
  w2 = equarx_pass.jit(PSUM, flags=ON)
  x = data()
  shape = w2.eval_shape(x)
  assert (shape.shape, shape.dtype) == (x.shape, x.dtype)
  assert w2.trace(x).jaxpr is not None


# --- policy sources --------------------------------------------------------------


def test_disabled_is_plain_jax_jit():
  w = equarx_pass.jit(PSUM)  # conftest clears EQUARX_FLAGS
  assert not w.policy.enable
  x = data()
  got, plain = w(x), jax.jit(PSUM)(x)
  assert type(got) is type(plain) and got.sharding == plain.sharding
  assert_bits_equal(got, plain)
  lowered = w.lower(x)
  assert isinstance(lowered, jax.stages.Lowered)
  text = lowered.as_text()
  assert "stablehlo.all_reduce" in text and "collective_permute" not in text
  assert len(w.report) == 0 and w.report.lowerings == []
  # Explicitly off, by flag or by policy, whatever the environment says.
  for off in (
    equarx_pass.jit(PSUM, flags=ON + " --noequarx_enable"),
    equarx_pass.jit(PSUM, policy=equarx_pass.Policy(enable=False, min_bytes=0)),
  ):
    assert_bits_equal(off(x), plain)
    assert off.report.lowerings == []


def test_env_flags_are_read_at_decoration(monkeypatch):
  monkeypatch.setenv(
    "EQUARX_FLAGS",
    "--equarx_enable --equarx_min_bytes=0 --equarx_force --equarx_block_size=64 "
    "--equarx_algorithm=ring --equarx_rotation=none",
  )
  w = equarx_pass.jit(PSUM)
  monkeypatch.setenv("EQUARX_FLAGS", "--noequarx_enable")  # too late for w
  assert w.policy == equarx_pass.Policy(
    enable=True, min_bytes=0, force=True, block_size=64, algorithm="ring", rotation="none"
  )
  x = data()
  assert_bits_equal(w(x), expected(x, 64))
  assert not equarx_pass.jit(PSUM).policy.enable  # a new decoration sees the new value


def test_flags_and_policy_override_env(monkeypatch):
  monkeypatch.setenv(
    "EQUARX_FLAGS",
    "--equarx_enable --equarx_block_size=64 --equarx_min_bytes=0 "
    "--equarx_algorithm=ring --equarx_rotation=none",
  )
  # flags= goes on top of the environment: the block size changes, the rest stays.
  w = equarx_pass.jit(PSUM, flags="--equarx_block_size=256")
  assert w.policy == equarx_pass.Policy(
    enable=True, min_bytes=0, block_size=256, algorithm="ring", rotation="none"
  )
  # policy= replaces the environment as the base; flags= still applies on top.
  base = equarx_pass.Policy(enable=True, min_bytes=0, block_size=32, dtypes=("f32",))
  assert equarx_pass.jit(PSUM, policy=base).policy == base
  w2 = equarx_pass.jit(PSUM, policy=base, flags="--equarx_min_bytes=1_000_000")
  assert w2.policy == base.replace(min_bytes=1_000_000)
  x = data()
  w2(x)
  assert [r.decision for r in w2.report.records] == ["skipped"]
  assert "--equarx_min_bytes=1000000" in w2.report.records[0].reason


@pytest.mark.parametrize(
  "flags, named",
  [
    ("--equarx_bogus=1", "--equarx_bogus"),
    ("--equarx_enable --equarx_min_bytes=abc", "--equarx_min_bytes"),
    ("--equarx_min_bytes", "--equarx_min_bytes"),  # needs a value
    ("--equarx_min_bytes=-5", "--equarx_min_bytes"),
    ("--equarx_block_size=-1", "--equarx_block_size"),
    ("--equarx_unroll_min_bytes=-1", "--equarx_unroll_min_bytes"),
    ("--equarx_dtypes=f64", "--equarx_dtypes"),
    ("--equarx_enable=maybe", "--equarx_enable"),
    ("--noequarx_min_bytes", "--noequarx_min_bytes"),  # negation is for booleans
    ("--equarx_format=int3", "--equarx_format"),
    ("--equarx_compile_for=gpu", "--equarx_compile_for"),
    ("--equarx_outline=yes", "--equarx_outline"),
    ("equarx_enable", "equarx_enable"),  # no leading --
    ("--equarx_enable '--equarx_min_bytes=1", "--equarx_min_bytes=1"),  # unbalanced quote
    # Grid lanes must be whole blocks (blocks may be odd), and for int4 at least two.
    (
      "--equarx_block_layout=grid --equarx_algorithm=bidirectional --equarx_microshards=1024",
      "at most 1024 lanes",
    ),
    (
      "--equarx_block_layout=grid --equarx_format=int4 --equarx_algorithm=ring "
      "--equarx_microshards=1024",
      "at most 512 lanes",
    ),
  ],
)
def test_bad_flags_raise_flag_error_naming_the_flag(monkeypatch, flags, named):
  with pytest.raises(equarx_pass.FlagError, match=named):
    equarx_pass.jit(PSUM, flags=flags)
  with pytest.raises(equarx_pass.FlagError, match=named):
    equarx_pass.Policy.from_flags(flags)
  monkeypatch.setenv("EQUARX_FLAGS", flags)
  with pytest.raises(equarx_pass.FlagError, match=named):
    equarx_pass.jit(PSUM)
  with pytest.raises(equarx_pass.FlagError, match=named):
    equarx_pass.jit(flags="--equarx_enable")  # env still applies first


@pytest.mark.parametrize(
  "kwargs, named",
  [
    ({"flags": 42}, "flags must be a string of --equarx_\\* flags, got int"),
    ({"policy": "--equarx_enable"}, r"policy must be an equarx_pass.Policy, got str \(a flag"),
    ({"policy": {"enable": True}}, "policy must be an equarx_pass.Policy, got dict"),
  ],
)
def test_wrong_argument_types_raise_flag_error(kwargs, named):
  with pytest.raises(equarx_pass.FlagError, match=named):
    equarx_pass.jit(PSUM, **kwargs)


def test_flag_error_is_a_value_error():
  with pytest.raises(ValueError):
    equarx_pass.Policy(block_size=-1)


@st.composite
def policies(draw):
  fields = dict(
    enable=draw(st.booleans()),
    min_bytes=draw(st.integers(0, 1 << 40)),
    max_bytes=draw(st.integers(0, 1 << 40)),
    dtypes=tuple(
      draw(st.lists(st.sampled_from(policy_lib.DTYPES), min_size=1, max_size=3, unique=True))
    ),
    block_size=draw(st.one_of(st.just(0), st.integers(1, 1 << 20))),  # 0: the default
    format=draw(st.sampled_from(policy_lib.FORMATS)),
    algorithm=draw(st.sampled_from(policy_lib.ALGORITHMS)),
    rotation=draw(st.sampled_from(policy_lib.ROTATIONS)),
    rotation_size=draw(st.sampled_from([0, 2, 16, 128, 1024])),
    microshards=draw(st.sampled_from([1, 2, 4])),
    block_layout=draw(st.sampled_from(policy_lib.BLOCK_LAYOUTS)),
    report=draw(st.booleans()),
    compile_for=draw(st.sampled_from(["", "tpu:v5e:2x2", "tpu:v4:2x2x1"])),
    partitioned=draw(st.sampled_from(policy_lib.PARTITIONED_MODES)),
    outline=draw(st.sampled_from(policy_lib.OUTLINE_MODES)),
    identity=draw(st.booleans()),  # turns enable on
  )
  try:
    return equarx_pass.Policy(**fields)
  except equarx_pass.FlagError:
    # Inconsistent combinations (odd int4 blocks, a rotation that does not divide
    # the block, microshards with two_shot) are rejected: not this test's subject.
    assume(False)


@settings(max_examples=200, deadline=None)
@given(policies())
def test_policy_round_trips_through_flags(p):
  flags = p.to_flags()
  assert equarx_pass.Policy.from_flags(flags) == p
  assert equarx_pass.jit(PSUM, flags=flags).policy == p
  # Applied on top of another policy, the string sets exactly the non-default fields.
  assert equarx_pass.Policy.from_flags(flags, base=p) == p


def test_default_policy_has_empty_flags():
  assert equarx_pass.Policy().to_flags() == ""
  assert equarx_pass.Policy.from_flags("") == equarx_pass.Policy()


def test_identity_alone_turns_the_pass_on():
  """--equarx_identity is a check of the pass: without --equarx_enable it would check
  nothing and pass.  With --equarx_force --equarx_min_bytes=0 it checks every site."""
  assert equarx_pass.Policy.from_flags("--equarx_identity").enable
  x = data()
  every = equarx_pass.jit(PSUM, flags="--equarx_identity --equarx_force --equarx_min_bytes=0")
  assert_bits_equal(every(x), jax.jit(PSUM)(x))
  [record] = every.report.records
  assert record.rewritten and record.route == "identity", str(every.report)
  alone = equarx_pass.jit(PSUM, flags="--equarx_identity")
  with pytest.warns(
    equarx_pass.EquarxWarning,
    match="--equarx_identity checked no site.*add --equarx_force --equarx_min_bytes=0",
  ):
    alone(x)  # 1200 bytes a device: under the default size floor
  assert len(alone.report.lowerings) == 1
  with pytest.raises(equarx_pass.FlagError, match="--noequarx_identity"):
    equarx_pass.Policy.from_flags("--equarx_identity --noequarx_enable")
  off = equarx_pass.Policy.from_flags("--noequarx_enable --noequarx_identity", base=every.policy)
  assert not off.enable


# --- caching ---------------------------------------------------------------------


def test_one_lowering_per_input_signature():
  w = equarx_pass.jit(PSUM, flags=ON)
  x = data()
  first = w(x)
  assert len(w.report.lowerings) == 1
  second = w(data(seed=1))  # same signature: cached
  assert len(w.report.lowerings) == 1
  assert_bits_equal(second, expected(data(seed=1)))
  w.lower(x)  # .lower() shares the cache with calls
  assert len(w.report.lowerings) == 1
  w(data(cols=301))  # new shape
  assert len(w.report.lowerings) == 2
  w(data(cols=300).astype(np.float16))  # new dtype
  assert len(w.report.lowerings) == 3
  assert w.report.records[-1].dtypes == ("f16",)
  assert_bits_equal(w(x), first)
  assert len(w.report.lowerings) == 3
  w.clear_cache()
  w(x)
  assert len(w.report.lowerings) == 4


def test_outputs_fed_back_keep_one_lowering():
  """On a mesh of explicit axes (jax.make_mesh's default) a step's outputs carry
  NamedSharding(P(None, None)) where its inputs had P(): the same sharding as jax.jit's
  lowering sees it, so fed back they hit the cache."""
  mesh = jax.make_mesh((8,), ("x",))

  def put(array, *spec):
    return jax.device_put(array, NamedSharding(mesh, P(*spec)))

  def local(w, x):
    return w - 1e-3 * jax.lax.psum(x.T @ (x @ w), "x"), x

  step = jax.shard_map(local, mesh=mesh, in_specs=(P(), P("x")), out_specs=(P(), P("x")))
  w = equarx_pass.jit(step, flags=ON)
  first = (put(np.eye(16, dtype=np.float32)), put(data(16), "x"))
  state = first
  for _ in range(4):
    state = w(*state)
  assert state[0].sharding.spec != first[0].sharding.spec  # another spec, fed back
  assert len(w.report.lowerings) == 1 and rewritten(w)
  again = w(*first)  # the first spec again, after the fed-back one: still cached
  assert len(w.report.lowerings) == 1
  assert_bits_equal(again[0], w.lower(*first).compile()(*first)[0])
  # A sharding that means another thing is another program.
  psum = equarx_pass.jit(PSUM, flags=ON)
  x = data()
  assert_bits_equal(psum(jax.device_put(x, SHARDED)), psum(jax.device_put(x, REPLICATED)))
  assert len(psum.report.lowerings) == 2


def test_a_new_signature_of_the_same_program_is_not_rewritten_again(monkeypatch):
  """Under jax.set_mesh, a replicated array put from another jax.Array carries an empty
  abstract mesh in its type, and the step's output the mesh's (flax NNX's rng counters):
  a new signature, but jax.jit lowers the same program for it and compiles it once.  So
  does equarx_pass.jit: one rewrite, one report entry, no second compile."""
  from equarx_pass.frontends import partitioned

  mesh = jax.make_mesh((8,), ("x",))
  reads = []
  read = partitioned.rewrite_partitioned
  monkeypatch.setattr(
    partitioned, "rewrite_partitioned", lambda *a, **k: reads.append(1) or read(*a, **k)
  )

  def step(count, x):
    return count + 1, jnp.sum(x * x, axis=0)

  with jax.set_mesh(mesh):
    count = jax.device_put(jnp.uint32(0), NamedSharding(mesh, P()))
    x = jax.device_put(data(), NamedSharding(mesh, P("x")))
    fn = equarx_pass.jit(step, flags=ON)
    for _ in range(3):
      count, y = fn(count, x)
  assert len(fn._lowered) == 2  # two signatures (the counter's type changed) ...
  assert len(fn.report.lowerings) == 1 and len(reads) == 1  # ... one program
  assert int(count) == 3 and rewritten(fn)
  want = np.asarray(jax.jit(step)(count, x)[1])
  np.testing.assert_allclose(y, want, atol=0.05 * np.abs(want).max())


# --- jax.jit keyword arguments ---------------------------------------------------


def test_static_argnums_and_argnames():
  def f(x, times, *, negate):
    y = PSUM(x)
    for _ in range(times):  # Python control flow: needs a static value
      y = y * 2
    return -y if negate else y

  x = data()
  want = expected(x)
  by_num = equarx_pass.jit(f, flags=ON, static_argnums=1, static_argnames="negate")
  by_name = equarx_pass.jit(f, flags=ON, static_argnames=("times", "negate"))
  for w in (by_num, by_name):
    assert_bits_equal(w(x, 2, negate=False), want * 4)
    assert_bits_equal(w(x, 2, negate=True), -want * 4)
    assert_bits_equal(w(x, 3, negate=False), want * 8)
    assert len(w.report.lowerings) == 3
    w(x, 2, negate=True)  # seen before: no new lowering
    w(data(seed=4), 3, negate=False)
    assert len(w.report.lowerings) == 3
    assert all(r.rewritten for r in w.report.records)
  # Names given: a static argument may also come by keyword, and is still static (a new
  # call signature, traced again as jax.jit traces it, whose program is one already
  # rewritten: reused, no new report entry).
  assert_bits_equal(by_name(x, times=2, negate=True), -want * 4)
  assert_bits_equal(by_name(x, times=2, negate=True), -want * 4)
  assert len(by_name._lowered) == 4 and len(by_name.report.lowerings) == 3


@pytest.mark.parametrize(
  "kwargs",
  [
    dict(static_argnums=2),
    dict(static_argnames="k"),
    dict(static_argnums=-1),
    dict(static_argnums=2, static_argnames="k"),
    dict(static_argnums=1, static_argnames="k"),  # both given: jax.jit infers nothing
    dict(static_argnums=(), static_argnames="k"),
  ],
)
def test_static_arguments_are_inferred_as_jax_jit_does(kwargs):
  def f(x, scale, k=1):
    return x * scale + k

  x = np.arange(4, dtype=np.float32)
  plain = jax.jit(f, **kwargs)
  w = equarx_pass.jit(f, flags=ON, **kwargs)
  calls = [
    ((x, 2.0, 1), {}),
    ((x,), dict(scale=2.0, k=3)),
    ((x, 2.0), dict(k=5)),
    ((x, np.float32(3.0), 1), {}),
  ]
  for args, kw in calls:
    try:
      want = plain(*args, **kw)
    except Exception as e:  # what jax.jit refuses, so must the wrapper
      with pytest.raises(type(e)):
        w(*args, **kw)
      continue
    assert_bits_equal(w(*args, **kw), want)


def test_donate_argnums_as_jax_jit():
  g = jax.shard_map(
    lambda a, b: jax.lax.psum(a, "x") + b, mesh=MESH, in_specs=P("x"), out_specs=P("x")
  )
  results = []
  for make in (
    lambda: jax.jit(g, donate_argnums=0),
    lambda: equarx_pass.jit(g, flags=ON, donate_argnums=0),
  ):
    a = jax.device_put(data(), SHARDED)
    b = jax.device_put(data(seed=1), SHARDED)
    out = make()(a, b)
    results.append((a.is_deleted(), b.is_deleted(), out.sharding))
  assert results[0] == results[1]
  assert results[1][:2] == (True, False)  # the donated buffer is gone, as with jax.jit


@pytest.mark.parametrize("out_sharding", [SHARDED, REPLICATED], ids=["sharded", "replicated"])
def test_in_and_out_shardings(out_sharding):
  kwargs = dict(in_shardings=SHARDED, out_shardings=out_sharding)
  w = equarx_pass.jit(PSUM, flags=ON, **kwargs)
  x = data()  # NumPy in: placed by in_shardings
  got = w(x)
  plain = jax.jit(PSUM, **kwargs)(x)
  assert got.sharding == plain.sharding == out_sharding
  assert (got.shape, got.dtype) == (plain.shape, plain.dtype)
  assert_bits_equal(got, expected(x))
  assert rewritten(w)
  # Already-placed arrays give the same result and the same signature.
  again = w(jax.device_put(x, SHARDED))
  assert_bits_equal(again, got)


def test_output_sharding_without_explicit_shardings():
  x = jax.device_put(data(), SHARDED)
  got = equarx_pass.jit(PSUM, flags=ON)(x)
  assert got.sharding == jax.jit(PSUM)(x).sharding


# --- AOT stages -------------------------------------------------------------------


def test_lower_compile_runs_the_rewritten_program():
  w = equarx_pass.jit(PSUM, flags=ON)
  x = data()
  lowered = w.lower(x)
  assert isinstance(lowered, jax.stages.Lowered)
  text = lowered.as_text()
  assert "collective_permute" in text and "stablehlo.all_reduce" not in text
  compiled = lowered.compile()
  assert isinstance(compiled, jax.stages.Compiled)
  assert "all-reduce(" not in compiled.as_text()
  assert_bits_equal(compiled(x), expected(x))
  assert_bits_equal(w(x), expected(x))
  assert len(w.report.lowerings) == 1


@pytest.mark.parametrize("outline", ["auto", "on", "off"])
def test_outlined_site_stays_a_call_on_cpu_with_the_same_bits(outline):
  """--equarx_outline: on XLA:CPU (auto) the site's compute between its collectives is
  functions that XLA keeps as calls (nested computations), one per run of compute: the
  ring's quantize, each step's dequantize-add-quantize, the final dequantize.  Its
  collectives (7 steps, then the all-gather; codes and scales of a small site in one
  payload each) stay in the caller, in program order; the bits are the model's either
  way."""
  w = equarx_pass.jit(PSUM, flags=f"{ON} --equarx_outline={outline}")
  x = data()
  lowered = w.lower(x)
  calls = 0 if outline == "off" else 9
  assert lowered.as_text().count('inlineable = "false"') == calls
  compiled = lowered.compile().as_text()
  assert compiled.count(" call(") == calls
  entry = compiled[compiled.index("ENTRY") :]
  assert entry.count(" collective-permute(") == 7 and entry.count(" all-gather(") == 1
  assert_bits_equal(w(x), expected(x))


def test_outline_changes_only_the_rounding_of_a_sites_last_multiply():
  """Inline, XLA:CPU fuses a site's last multiply (codes x block scale) with an add that
  consumes the site's result into one fused multiply-add: one rounding where the
  outlined site, whose result is the product rounded at the call boundary, and the NumPy
  model have two.  A site whose result is not added to is the same either way."""
  from equarx_pass.emission import scheme as scheme_lib

  x = data(cols=4096, seed=3)
  c = np.random.default_rng(4).standard_normal(4096).astype(np.float32)

  def run(add, mode):
    def body(x, c):
      y = jax.lax.psum(x, "x")
      return y + c if add else y

    f = jax.shard_map(body, mesh=MESH, in_specs=(P("x"), P()), out_specs=P("x"))
    return np.asarray(equarx_pass.jit(f, flags=f"{FLAGS_DEFAULT} --equarx_outline={mode}")(x, c))

  site = scheme_lib.reference(list(x), equarx_pass.Policy.from_flags(FLAGS_DEFAULT).scheme)[0]
  for mode in ("on", "off"):
    assert_bits_equal(run(False, mode), np.broadcast_to(site, x.shape))
  outlined, inline = run(True, "on"), run(True, "off")
  assert_bits_equal(outlined, np.broadcast_to((site + c).astype(np.float32), x.shape))
  assert np.count_nonzero(inline != outlined) > 0
  # fma(codes, scale, c) is within half an ulp of the product (site) plus half an ulp of
  # the sum of the exact value site + c.
  exact = site.astype(np.float64) + c
  bound = (np.abs(np.spacing(site)) + np.abs(np.spacing(inline[0]))).astype(np.float64) / 2
  assert np.all(np.abs(inline.astype(np.float64) - exact) <= bound)


def test_outline_auto_is_on_only_for_cpu():
  auto, on, off = (equarx_pass.Policy(outline=m) for m in ("auto", "on", "off"))
  assert [auto.outlines(p) for p in ("cpu", "gpu", "cuda", "tpu", None)] == [
    True,
    False,
    False,
    False,
    False,
  ]
  assert all(on.outlines(p) for p in ("cpu", "gpu", None))
  assert not any(off.outlines(p) for p in ("cpu", "gpu", None))


def test_report_flag_prints_the_site_table(capsys):
  w = equarx_pass.jit(PSUM, flags=ON + " --equarx_report")
  w(data())
  err = capsys.readouterr().err
  assert "equarx-pass" in err and "rewritten" in err and "1 of 1 all-reduce sites rewritten" in err
  assert "1 of 1 all-reduce sites rewritten" in str(w.report)
