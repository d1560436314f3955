"""Bit-for-bit comparison shared by the numeric tests."""

import numpy as np


def bits(a: np.ndarray) -> np.ndarray:
  """The raw bits of an f32/bf16/f16 array, as unsigned integers."""
  a = np.ascontiguousarray(a)
  return a.view({4: np.uint32, 2: np.uint16}[a.dtype.itemsize])


def assert_same_bits(got, want, what=""):
  """Bit equality; NaNs match any NaN (XLA and NumPy may pick different NaN payloads)."""
  got, want = np.asarray(got), np.asarray(want)
  assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.shape)
  nan = np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32))
  same = (bits(got) == bits(want)) | nan
  if not same.all():
    i = np.unravel_index(np.flatnonzero(~same)[0], got.shape)
    raise AssertionError(
      f"{what}: {np.count_nonzero(~same)} of {same.size} values differ; "
      f"first at {i}: got {got[i]!r}, want {want[i]!r}"
    )
