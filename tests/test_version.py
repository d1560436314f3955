"""The supported JAX range: pyproject.toml declares it, equarx_pass/_version.py enforces it
at import with a comparison of its own (the package has no PEP 440 parser among its
dependencies).  `packaging`, the PyPA's implementation of PEP 440, checks both here."""

import os
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from equarx_pass import _version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUPPORTED = SpecifierSet(_version.SUPPORTED_JAX_SPEC)


def test_pyproject_declares_the_range_the_import_check_enforces():
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    project = tomllib.load(f)["project"]
  requirements = [Requirement(r) for r in project["dependencies"]]
  requirements += [Requirement(r) for r in project["optional-dependencies"]["tpu"]]
  specifiers = {r.name: r.specifier for r in requirements if r.name in ("jax", "jaxlib")}
  assert specifiers == {"jax": SUPPORTED, "jaxlib": SUPPORTED}
  lower, upper = (".".join(map(str, v)) for v in _version.SUPPORTED_JAX)
  assert SUPPORTED == SpecifierSet(f">={lower},<{upper}")


@pytest.mark.parametrize(
  "version",
  # Releases around both bounds, a post-release, and pre-releases inside and at the top.
  ["0.9.9", "0.10.1", "0.10.2", "0.10.3", "0.10.10", "0.10.2.post1", "0.11.0", "0.11.2"]
  + ["0.12.0", "0.12.0.1", "0.12.9", "0.13.0", "1.0.0"]
  + ["0.10.3rc1", "0.10.4.dev20260101", "0.11.0rc1", "0.12.1.dev20260101", "0.13.0rc1"]
  + ["0.13.0.dev20260101"],
)
def test_import_check_agrees_with_pep_440(version):
  accepted = _version.check_jax_version(version, version) is None
  assert accepted == SUPPORTED.contains(Version(version), prereleases=True)


def test_prerelease_of_the_lowest_version_passes_the_import_check():
  # The one difference: the check compares release numbers only, so 0.10.2rc1, which PEP 440
  # orders before 0.10.2, passes it.  Left so: a release candidate of the lowest supported
  # JAX is close to it, and telling them apart needs a PEP 440 parser in the package.
  assert not SUPPORTED.contains("0.10.2rc1", prereleases=True)
  assert _version.check_jax_version("0.10.2rc1", "0.10.2") is None
