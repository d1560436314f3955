"""The calibration file: per all-reduce site, the ranges the calibrated scheme's
static scales come from.  This module builds no MLIR (calibrate.py writes the file,
rewrite.py reads it through `load_cached`).

JSON, one object:
  {"format": "equarx-calibration", "version": 1, "ema": 0.9, "batches": 8,
   "sites": [{"index": 3, "location": "model.py:41 psum", "type": "tensor<8x512xf32>",
              "shape": [8, 512], "dtype": "f32", "groups": [[0, 1, 2, 3], [4, 5, 6, 7]],
              "devices": [0, ..., 7],
              "in_range": [[...H floats...] one per device, in `devices` order],
              "out_range": [...], "in_mean_square": [...], "out_mean_square": [...]}],
   "unobserved": [{"index": 5, "location": ..., "reason": ...}]}

The site key is (index, location, dtype and last dimension): the all-reduce's
ordinal among all all-reduces of the lowered module in walk order
(match.find_all_reduces), its source location as the report prints it, and its
element type and number of features.  Locations alone repeat across the
unrolled layers of a model; the ordinal alone would silently apply one layer's
scales to another after the program changed.  The leading dimensions (tokens,
batch) may differ from the calibrated ones: the statistics are per feature.
"type" and "shape" record the first calibrated operand.
in_range / out_range: per device and feature (last dimension), the absmax of the
all-reduce's operand / result, an exponential moving average over the batches;
the mean squares likewise (not used by the scheme yet; recorded for clipping).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

import numpy as np

from equarx_pass.emission import outlier
from equarx_pass.errors import ParseError

FORMAT = "equarx-calibration"
VERSION = 1
STATISTICS = ("in_range", "out_range", "in_mean_square", "out_mean_square")


@dataclasses.dataclass
class SiteCalibration:
  index: int
  location: str
  type: str  # operand type, e.g. tensor<8x512xf32>
  shape: tuple[int, ...]
  dtype: str
  groups: tuple[tuple[int, ...], ...]
  devices: tuple[int, ...]  # rows of the statistics below
  stats: dict[str, np.ndarray]  # STATISTICS -> f64 [devices, H]

  def row(self, device: int) -> int:
    return self.devices.index(device)

  def group_scales(
    self, group: Sequence[int], outliers: Sequence[int], clip: float = 0.0
  ) -> outlier.GroupScales:
    """The static numbers of one group (device ids in group order).

    clip > 0: each range is at most clip x the feature's calibrated rms
    (outlier.clipped_range).
    """
    rows = [self.row(d) for d in group]
    in_ranges = outlier.clipped_range(
      self.stats["in_range"][rows], self.stats["in_mean_square"][rows], clip
    )
    # Every member of a group holds the same result: its range is one vector.
    out_ranges = np.max(
      outlier.clipped_range(
        self.stats["out_range"][rows], self.stats["out_mean_square"][rows], clip
      ),
      axis=0,
    )
    return outlier.GroupScales(in_ranges, out_ranges, tuple(outliers))

  def outliers(self) -> tuple[int, ...]:
    ranges = self.stats["in_range"]
    return outlier.outlier_features(ranges, outlier.outlier_count(ranges.shape[1]))


@dataclasses.dataclass
class Calibration:
  sites: dict[int, SiteCalibration]
  ema: float
  batches: int
  unobserved: list[dict] = dataclasses.field(default_factory=list)

  def to_json(self) -> dict:
    sites = []
    for s in sorted(self.sites.values(), key=lambda s: s.index):
      entry = dict(
        index=s.index,
        location=s.location,
        type=s.type,
        shape=list(s.shape),
        dtype=s.dtype,
        groups=[list(g) for g in s.groups],
        devices=list(s.devices),
      )
      for name in STATISTICS:
        entry[name] = np.asarray(s.stats[name], np.float64).tolist()
      sites.append(entry)
    return {
      "format": FORMAT,
      "version": VERSION,
      "ema": self.ema,
      "batches": self.batches,
      "sites": sites,
      "unobserved": self.unobserved,
    }


def _site_from_json(entry: dict) -> SiteCalibration:
  shape = tuple(int(d) for d in entry["shape"])
  groups = tuple(tuple(int(d) for d in g) for g in entry["groups"])
  devices = tuple(int(d) for d in entry["devices"])
  _, features = outlier.rows_and_features(shape)
  stats = {}
  for name in STATISTICS:
    array = np.asarray(entry[name], np.float64)
    if array.shape != (len(devices), features):
      raise ValueError(
        f"site {entry['index']}: {name} has shape {array.shape}, expected "
        f"({len(devices)}, {features}) (devices x last dimension)"
      )
    stats[name] = array
  if sorted(d for g in groups for d in g) != sorted(devices):
    raise ValueError(
      f"site {entry['index']}: devices {devices} are not the members of groups {groups}"
    )
  return SiteCalibration(
    int(entry["index"]),
    str(entry["location"]),
    str(entry["type"]),
    shape,
    str(entry["dtype"]),
    groups,
    devices,
    stats,
  )


def load(path: str) -> Calibration:
  """Read a calibration file; any problem is a ParseError naming the file."""
  try:
    with open(path) as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    raise ParseError(f"cannot read the calibration file: {e}", path=path) from None
  try:
    data = json.loads(text)
  except json.JSONDecodeError as e:
    raise ParseError(
      f"not a calibration file (bad JSON: {e.msg})", path=path, line=e.lineno, column=e.colno
    ) from None
  if not isinstance(data, dict) or data.get("format") != FORMAT:
    raise ParseError(
      f'not a calibration file (no "format": "{FORMAT}"); make one with equarx_pass.calibrate',
      path=path,
    )
  if data.get("version") != VERSION:
    raise ParseError(
      f"calibration file version {data.get('version')!r}, this pass reads "
      f"version {VERSION}; calibrate again",
      path=path,
    )
  try:
    sites = [_site_from_json(entry) for entry in data["sites"]]
    calib = Calibration(
      {s.index: s for s in sites},
      float(data["ema"]),
      int(data["batches"]),
      list(data.get("unobserved", [])),
    )
  except (KeyError, TypeError, ValueError) as e:
    what = f"missing field {e}" if isinstance(e, KeyError) else str(e)
    raise ParseError(f"malformed calibration file: {what}", path=path) from None
  if len(calib.sites) != len(sites):
    raise ParseError("malformed calibration file: two sites with one index", path=path)
  return calib


_CACHE: dict[tuple, Calibration] = {}


def load_cached(path: str) -> Calibration:
  """load(), reused while the file's size and modification time stay the same."""
  try:
    st = os.stat(path)
  except OSError as e:
    raise ParseError(f"cannot read the calibration file: {e}", path=path) from None
  key = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
  if key not in _CACHE:
    _CACHE.clear()
    _CACHE[key] = load(path)
  return _CACHE[key]


def _dims(shape) -> str:
  return "x".join(map(str, shape)) or "scalar"


def mismatch(
  entry: SiteCalibration | None, index: int, location: str, shape, dtype: str, groups
) -> str | None:
  """Why a site cannot use its calibration entry (None: it can)."""
  if entry is None:
    return f"site #{index} is not in the calibration file"
  if entry.location != location:
    return f"calibrated site #{index} is at {entry.location!r}, this one at {location!r}"
  # Per-feature statistics hold for any number of rows: only the last dimension counts.
  _, features = outlier.rows_and_features(shape)
  if entry.dtype != dtype or outlier.rows_and_features(entry.shape)[1] != features:
    return (
      f"shape {_dims(shape)} {dtype} differs from the calibrated "
      f"{_dims(entry.shape)} {entry.dtype} in its features (last dimension) or dtype"
    )
  if entry.groups != tuple(tuple(g) for g in groups or ()):
    return f"replica groups differ from the calibrated {[list(g) for g in entry.groups]}"
  for name in ("in_range", "out_range"):
    if not np.all(np.isfinite(entry.stats[name])):
      return f"calibrated {name} is not finite (NaN or Inf in the calibration data)"
  return None
