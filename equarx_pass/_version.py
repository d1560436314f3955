"""This release's version and the JAX versions it supports, checked when equarx_pass is imported.

pyproject.toml reads __version__ from here and declares the same JAX range as its
dependencies.  The pass uses a few private JAX APIs (_jax_private.py) that may move in
another minor release, so a JAX outside the tested range is refused at import with the
range, not with an AttributeError deep inside a rewrite.  EQUARX_ALLOW_ANY_JAX=1 turns
the refusal into a warning.
"""

import os
import re

__version__ = "0.2.0"

SUPPORTED_JAX = ((0, 10, 2), (0, 13, 0))  # [lower, upper), for jax and jaxlib
SUPPORTED_JAX_SPEC = ">=0.10.2,<0.13"


def _parse(version: str) -> tuple[int, ...]:
  return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def check_jax_version(jax_version: str, jaxlib_version: str) -> str | None:
  """None if both versions are supported, else the message saying what is."""
  found = {"jax": jax_version, "jaxlib": jaxlib_version}
  if all(SUPPORTED_JAX[0] <= _parse(v) < SUPPORTED_JAX[1] for v in found.values()):
    return None
  return (
    f"equarx-pass {__version__} supports jax and jaxlib {SUPPORTED_JAX_SPEC}; found "
    f"jax {jax_version}, jaxlib {jaxlib_version}. Install a supported JAX "
    f"(pip install 'jax{SUPPORTED_JAX_SPEC}' 'jaxlib{SUPPORTED_JAX_SPEC}'), or set "
    "EQUARX_ALLOW_ANY_JAX=1 to try this one anyway."
  )


def _check_installed_jax() -> None:
  import jax
  import jaxlib

  message = check_jax_version(jax.__version__, getattr(jaxlib, "__version__", "0"))
  if message is None:
    return
  if os.environ.get("EQUARX_ALLOW_ANY_JAX") == "1":
    import warnings

    warnings.warn(message, RuntimeWarning, stacklevel=2)
  else:
    raise ImportError(message)


_check_installed_jax()
