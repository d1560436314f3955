"""CI's test lists (.ci/run): the older JAX minors run .ci/minor-tests.txt, the newest the whole
suite; every test file is in exactly one of the two lists, so a new one is placed on purpose."""

import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _listed(name: str) -> list[str]:
  with open(os.path.join(ROOT, ".ci", name)) as f:
    return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def test_every_test_file_is_in_one_ci_list():
  files = sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "tests", "test_*.py"))
  )
  minor, newest = _listed("minor-tests.txt"), _listed("newest-only.txt")
  assert sorted(set(minor)) == sorted(minor) and sorted(set(newest)) == sorted(newest)
  assert not set(minor) & set(newest)
  assert sorted(minor + newest) == files


@pytest.mark.parametrize("name", ["minor-tests.txt", "smoke-tests.txt"])
def test_ci_lists_name_test_files(name):
  for path in _listed(name):
    assert os.path.isfile(os.path.join(ROOT, path)), f".ci/{name}: {path}"


def test_each_ci_leg_pins_a_jax_in_the_declared_range():
  from packaging.requirements import Requirement
  from packaging.specifiers import SpecifierSet

  from equarx_pass import _version

  supported = SpecifierSet(_version.SUPPORTED_JAX_SPEC)
  lower, upper = _version.SUPPORTED_JAX
  minors = [f"{lower[0]}.{m}" for m in range(lower[1], upper[1])]
  for minor in minors:  # one leg per supported minor, pinned to a release of it
    pins = {
      Requirement(r).name: Requirement(r).specifier for r in _listed(f"constraints/jax-{minor}.txt")
    }
    assert set(pins) == {"jax", "jaxlib"}
    (jax_pin,) = pins["jax"]
    assert jax_pin.operator == "==" and pins["jaxlib"] == pins["jax"]
    assert jax_pin.version.startswith(minor + ".") and supported.contains(jax_pin.version)
  with open(os.path.join(ROOT, ".ci", "run")) as f:
    run = f.read()
  for minor in minors:
    assert f"jax-{minor}.txt" in run
