"""Error table: relative L2 error and bits per value of every scheme, from the NumPy models.

    python tools/error_table.py [--values 1048576] [--groups 2,4,8]
                                [--activations FILE.npz] [--out results/error_table]

For each scheme x group size N x data set it runs equarx_pass.emission.scheme.reference
(the model the rewritten programs equal bit for bit on CPU) and prints the
relative L2 error against the float64 sum, plus the bits each value costs on
the wire.  Data sets, f32 per rank:
  gaussian   independent N(0, 1) values
  outlier    Gaussian with 4 of every 4096 channels scaled x100, like LLM
             activations; "outlier/rest" is the error on the other channels alone
  sumsq      squares of Gaussian values: a large common mean, as the sums of squares
             of norm statistics
  minilm     the real inputs of the all-reduce sites of all-MiniLM-L6-v2 run
             tensor-parallel over 4 devices (python -m equarx_pass.examples.minilm
             --capture FILE.npz); only N = 4, all sites concatenated
The calibrated outlier-feature scheme (--equarx_calibration; rows "calibrated
int4 + bf16 H/64") is calibrated on separate draws from the same distribution:
4 batches of the same size (the same outlier channels, other values), ranges
as equarx_pass.calibrate records them (moving average, decay 0.9), features =
the 4096 channels.  For MiniLM each site is calibrated on half of the sentences
and measured on the other half, and the other way round (cross-fitting).
Writes OUT.json and, if matplotlib is installed, OUT.png (error vs bits per value).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

from equarx_pass.emission import outlier
from equarx_pass.emission import scheme as scheme_lib  # noqa: E402
from equarx_pass.planning import calibration  # noqa: E402
from equarx_pass.planning.policy import Policy  # noqa: E402

# Every entry names its algorithm and rotation: the policy's defaults are not assumed.
R, T, B = (
  "--equarx_algorithm=ring",
  "--equarx_algorithm=two_shot",
  "--equarx_algorithm=bidirectional",
)
H, NOROT = "--equarx_rotation=hadamard", "--equarx_rotation=none"
SCHEMES = [
  f"{R} {NOROT} --equarx_block_size=1024",
  f"{R} {NOROT} --equarx_block_size=128",
  f"{R} {NOROT} --equarx_block_layout=grid",
  f"{T} {NOROT}",
  f"{B} {NOROT}",
  f"{R} {H} --equarx_block_size=1024 --equarx_rotation_size=1024",
  f"{T} {H} --equarx_block_size=1024 --equarx_rotation_size=1024",  # the flat form's default
  f"{T} {H} --equarx_block_size=1024 --equarx_rotation_size=128",
  f"{T} {H} --equarx_block_size=128",  # the default
  f"{R} {H} --equarx_block_size=128",
  f"{R} {NOROT} --equarx_format=int4 --equarx_block_size=128",
  f"{R} {H} --equarx_format=int4 --equarx_block_size=128",
  f"{T} {H} --equarx_format=int4 --equarx_block_size=128",
  f"{R} {NOROT} --equarx_format=fp8_e4m3",
  f"{T} {H} --equarx_format=fp8_e4m3 --equarx_block_size=1024 --equarx_rotation_size=1024",
  f"{R} {NOROT} --equarx_format=fp8_e5m2",
  f"{T} {NOROT} --equarx_format=mxint8",
  f"{T} {H} --equarx_format=mxint8",  # the default scheme in mxint8: hadamard 32
  f"{T} {H} --equarx_block_size=128 --equarx_rounding=stochastic",
  f"{T} {H} --equarx_format=int4 --equarx_block_size=128 --equarx_rounding=stochastic",
]


# The calibrated scheme: one row per clip ratio (0: the calibrated absmax).
CALIBRATED_CLIPS = [0.0, 2.55]
CHANNELS = 4096
CALIBRATION_BATCHES = 4
EMA = 0.9


def calibrated_name(clip: float) -> str:
  name = "calibrated int4 + bf16 H/64, two_shot"
  return name + (f", clip {clip:g} rms" if clip else "")


def calibrated_flags(clip: float) -> str:
  flags = "--equarx_calibration=FILE"
  return flags + (f" --equarx_calibration_clip={clip:g}" if clip else "")


def rel_err(result: np.ndarray, exact: np.ndarray, mask=None) -> float:
  r = np.asarray(result, np.float64).reshape(-1)
  e = exact.reshape(-1)
  if mask is not None:
    r, e = r[mask], e[mask]
  return float(np.linalg.norm(r - e) / np.linalg.norm(e))


def make_data(n: int, values: int, rng) -> dict:
  gaussian = rng.standard_normal((n, values)).astype(np.float32)
  channels = 4096
  outlier = rng.standard_normal((n, values)).astype(np.float32)
  hot = rng.choice(channels, 4, replace=False)
  view = outlier.reshape(n, -1, channels)
  view[:, :, hot] *= 100
  rest = np.ones(channels, bool)
  rest[hot] = False
  # A large common mean: squares of Gaussian values, as sums of squares in norm statistics.
  sumsq = rng.standard_normal((n, values)).astype(np.float32) ** 2
  return {
    "gaussian": (gaussian, None),
    "outlier": (outlier, np.tile(rest, values // channels)),
    "sumsq": (sumsq, None),
  }


def site_calibration(batches) -> calibration.SiteCalibration:
  """What equarx_pass.calibrate records for one site, from NumPy batches
  [N, rows, H] (the all-reduce's per-rank operands)."""
  stats = {}
  for x in batches:
    x = np.asarray(x, np.float32)
    total = x.sum(axis=0, dtype=np.float32)
    n = x.shape[0]
    batch = {
      "in_range": np.abs(x).max(axis=1),
      "out_range": np.tile(np.abs(total).max(axis=0), (n, 1)),
      "in_mean_square": (x.astype(np.float64) ** 2).mean(axis=1),
      "out_mean_square": np.tile((total.astype(np.float64) ** 2).mean(axis=0), (n, 1)),
    }
    for name, value in batch.items():
      stats[name] = outlier.ema_update(stats.get(name), value, EMA)
  n, rows, h = np.shape(batches[0])
  group = tuple(range(n))
  return calibration.SiteCalibration(0, "", "", (rows, h), "f32", (group,), group, stats)


def calibrated_result(data: np.ndarray, entry: calibration.SiteCalibration, clip: float):
  """Rank 0's result of the calibrated scheme for data [N, rows, H]."""
  n = data.shape[0]
  outliers = entry.outliers()
  scales = entry.group_scales(tuple(range(n)), outliers, clip)
  layout = outlier.make_layout(data.shape[1:], n, outliers)
  return outlier.reference(list(data), scales)[0], layout.bits_per_value


def load_activation_sites(path: str) -> list[tuple[np.ndarray, np.ndarray]]:
  """Per site: (real tokens' inputs [devices, tokens, hidden], each token's sentence)."""
  data = np.load(path)
  mask = data["mask"]
  sentence = data["sentence"][mask]
  return [(data[str(site)][:, mask, :].astype(np.float32), sentence) for site in data["sites"]]


def run_calibrated(clips, groups, values, activation_sites=None, seed=0) -> list[dict]:
  """Rows of the calibrated scheme, on the data sets of run() (same seed, same test draws).

  Each data set is calibrated once; only the clip changes between rows.  A row's seconds
  count its data sets' calibration as well as the scheme's run.
  """
  rng = np.random.default_rng(seed)
  sets = {n: make_data(n, values, rng) for n in groups}
  calibrated = {
    (n, name): _calibrate_synthetic(data, rest, n, name, seed)
    for n in groups
    for name, (data, rest) in sets[n].items()
  }
  minilm = _calibrate_minilm(activation_sites) if activation_sites else None
  rows = []
  for clip in clips:
    for n in groups:
      row = dict(scheme=calibrated_name(clip), flags=calibrated_flags(clip), n=n, seconds=0.0)
      for name, (data, rest) in sets[n].items():
        entry, calibration_seconds = calibrated[(n, name)]
        start = time.perf_counter()
        out, bits = calibrated_result(data.reshape(n, -1, CHANNELS), entry, clip)
        exact = data.astype(np.float64).sum(0)
        row[name] = rel_err(out, exact)
        if rest is not None:
          row[name + "/rest"] = rel_err(out, exact, rest)
        row["bits"] = bits
        row["seconds"] += calibration_seconds + time.perf_counter() - start
      rows.append(row)
      print(_format_row(row), flush=True)
    if minilm:
      rows.append(_calibrated_minilm_row(clip, minilm))
      print(_format_row(rows[-1]), flush=True)
  return rows


def _calibrate_synthetic(data, rest, n: int, name: str, seed: int):
  """(calibration, seconds) of one synthetic data set, from separate draws of the same
  distribution (and outlier channels): another random stream."""
  start = time.perf_counter()
  hot = None if rest is None else np.flatnonzero(~rest[:CHANNELS])
  draw_rng = np.random.default_rng([seed, n, 1 + (name == "outlier")])
  batches = []
  for _ in range(CALIBRATION_BATCHES):
    x = draw_rng.standard_normal(data.shape).astype(np.float32).reshape(n, -1, CHANNELS)
    if hot is not None:
      x[:, :, hot] *= 100
    if name == "sumsq":
      x = x**2
    batches.append(x)
  return site_calibration(batches), time.perf_counter() - start


def _calibrate_minilm(sites) -> list[tuple]:
  """Per site and half of the sentences: (calibration from that half, the other half's data)."""
  halves = []
  for x, sentence in sites:
    first = sentence < np.median(np.unique(sentence))
    for calib_half, test_half in ((first, ~first), (~first, first)):
      halves.append((site_calibration([x[:, calib_half]]), x[:, test_half]))
  return halves


def _calibrated_minilm_row(clip: float, halves) -> dict:
  """Each site calibrated on one half of the sentences and measured on the other."""
  errors, norms, bits = 0.0, 0.0, []
  for entry, test in halves:
    out, b = calibrated_result(test, entry, clip)
    exact = test.astype(np.float64).sum(0)
    errors += float(np.sum((out.astype(np.float64) - exact) ** 2))
    norms += float(np.sum(exact**2))
    bits.append(b)
  n = halves[0][1].shape[0]
  return dict(
    scheme=calibrated_name(clip),
    flags=calibrated_flags(clip),
    n=n,
    minilm=(errors / norms) ** 0.5,
    bits=float(np.mean(bits)),
  )


def run(schemes, groups, values, activations=None, seed=0) -> list[dict]:
  rows = []
  rng = np.random.default_rng(seed)
  sets = {n: make_data(n, values, rng) for n in groups}
  if activations is not None:
    sets.setdefault(activations.shape[0], {})["minilm"] = (activations, None)
  for flags in schemes:
    scheme = Policy.from_flags("--equarx_enable " + flags).scheme
    for n in groups + (
      [activations.shape[0]]
      if activations is not None and activations.shape[0] not in groups
      else []
    ):
      row = dict(scheme=scheme.describe(), flags=flags, n=n)
      for name, (data, rest) in sets[n].items():
        exact = data.astype(np.float64).sum(0)
        start = time.perf_counter()
        out = scheme_lib.reference(list(data), scheme)[0]
        row["seconds"] = row.get("seconds", 0) + time.perf_counter() - start
        row[name] = rel_err(out, exact)
        if rest is not None:
          row[name + "/rest"] = rel_err(out, exact, rest)
        row["bits"] = scheme.bits_per_value(scheme.layout(data.shape[1], n))
      rows.append(row)
      print(_format_row(row), flush=True)
  return rows


COLUMNS = ["gaussian", "outlier", "outlier/rest", "sumsq", "minilm"]


def _format_row(row) -> str:
  cells = [f"{row.get(c):.2e}" if c in row else "-" for c in COLUMNS]
  return f"{row['scheme']:<52} N={row['n']}  {row['bits']:5.2f} bits  " + "  ".join(
    f"{c} {v:>8}" for c, v in zip(COLUMNS, cells)
  )


def plot(rows, path: str) -> bool:
  try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return False
  fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=False)
  for ax, data in zip(axes, ("gaussian", "outlier")):
    for row in rows:
      if row["n"] != max(r["n"] for r in rows) or data not in row:
        continue
      ax.scatter(row["bits"], row[data])
      ax.annotate(row["scheme"], (row["bits"], row[data]), fontsize=6)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bits per value on the wire")
    ax.set_ylabel("relative L2 error vs float64 sum")
    ax.set_title(f"{data}, N = {max(r['n'] for r in rows)}")
    ax.grid(True, which="both", alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  return True


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--values", type=int, default=1 << 20, help="values per rank")
  parser.add_argument("--groups", default="2,4,8", help="group sizes N")
  parser.add_argument("--activations", help="a --capture file of equarx_pass.examples.minilm")
  parser.add_argument("--scheme", action="append", help="flag string (default: the built-in list)")
  parser.add_argument(
    "--out", default=os.path.join(benchlib.RESULTS, "error_table"), help="output path prefix"
  )
  args = parser.parse_args(argv)
  groups = [int(g) for g in args.groups.split(",")]
  sites = load_activation_sites(args.activations) if args.activations else None
  # All sites' per-device inputs side by side, [devices, values].
  activations = (
    np.concatenate([x.reshape(x.shape[0], -1) for x, _ in sites], axis=1) if sites else None
  )
  print(
    f"relative L2 error vs the float64 sum, {args.values} values per rank; "
    f"bits = bits per value on the wire (bf16 ring: 16)"
  )
  rows = run(args.scheme or SCHEMES, groups, args.values, activations)
  if not args.scheme:
    rows += run_calibrated(CALIBRATED_CLIPS, groups, args.values, sites)
  benchlib.write_result(
    args.out + ".json", rows, values=args.values, groups=groups, activations=args.activations
  )
  if plot(rows, args.out + ".png"):
    print(f"wrote {args.out}.png")
  else:
    print("no matplotlib: no plot")
  return 0


if __name__ == "__main__":
  sys.exit(main())
