"""What the check_* tools share to run flax's examples unchanged from a flax checkout.

The examples import, at module level, packages their training loops need and these checks
do not (tensorflow, clu, orbax, their input pipelines, ml_collections).  Where one is not
installed, `install_stand_ins` puts an inert module in its place, so the example imports;
calling anything of a stand-in raises.  Also: the checkout's commit, for the result file,
and synthetic token rows, since no dataset is needed to compare two compilations of the
same program.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
from typing import Iterable

import numpy as np


class StandIn(types.ModuleType):
  """A stand-in module: every attribute is another stand-in (tf.data.Dataset, ...)."""

  def __getattr__(self, name):
    if name.startswith("__"):
      raise AttributeError(name)
    sub = StandIn(f"{self.__name__}.{name}")
    setattr(self, name, sub)
    return sub

  def __call__(self, *args, **kwargs):
    raise RuntimeError(f"{self.__name__} is a stand-in module of tools/flax_examples.py")


class ConfigDict:
  """ml_collections.ConfigDict as the examples' configs/default.py use it: attributes,
  dict()."""

  def __init__(self):
    object.__setattr__(self, "_d", {})

  def __getattr__(self, name):
    try:
      return self._d[name]
    except KeyError:
      raise AttributeError(name) from None

  def __setattr__(self, name, value):
    self._d[name] = value

  def keys(self):
    return self._d.keys()

  def __getitem__(self, k):
    return self._d[k]


def try_import(name: str) -> bool:
  try:
    importlib.import_module(name)
    return True
  except Exception:  # ImportError, or a stand-in failing at module level
    for k in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
      if not isinstance(sys.modules[k], StandIn):
        del sys.modules[k]
    return False


def install_stand_ins(names: Iterable[str]) -> list[str]:
  """Import each of `names` in order, or put a stand-in in its place (for ml_collections, a
  module whose ConfigDict works); returns the names stood in for."""
  stood_in = []
  for name in names:
    if try_import(name):
      continue
    if name == "ml_collections":
      module = types.ModuleType(name)
      module.ConfigDict = ConfigDict  # type: ignore[attr-defined]
    else:
      module = StandIn(name)
    sys.modules[name] = module
    stood_in.append(name)
  return stood_in


def flax_commit(example_dir: str) -> str:
  """The commit of the flax checkout holding `example_dir`, or "" where git cannot say."""
  try:
    out = subprocess.run(
      ["git", "-C", example_dir, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
    )
    return out.stdout.strip() if out.returncode == 0 else ""
  except (OSError, subprocess.SubprocessError):
    return ""


def padded_tokens(rng: np.random.Generator, vocab: int, batch: int, seq: int) -> np.ndarray:
  """int32 token rows: random ids in [1, vocab), each row padded with 0s after a random
  length of at least seq // 2."""
  toks = rng.integers(1, vocab, size=(batch, seq), dtype=np.int32)
  lengths = rng.integers(seq // 2, seq + 1, size=batch)
  toks[np.arange(seq)[None, :] >= lengths[:, None]] = 0
  return toks


def as64(x) -> np.ndarray:
  return np.asarray(x, np.float64)
