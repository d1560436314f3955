"""The site report: one row per all-reduce, printed by the decorator, the CLI and the demo."""

from __future__ import annotations

from typing import Sequence

from equarx_pass.rewrite import SiteRecord


def _shape(shapes) -> str:
  return "+".join("dynamic" if s is None else "x".join(map(str, s)) or "scalar" for s in shapes)


def _bytes(n: int) -> str:
  for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
    if n >= size:
      return f"{n / size:.1f} {unit}"
  return f"{n} B"


# Locations longer than this keep their source line and the end of the op's name path,
# where the layer and the op are.
LOCATION_WIDTH = 72


def _fit(location: str, width: int) -> str:
  if len(location) <= width:
    return location
  where, _, name = location.partition(" ")
  if not name or len(where) > width // 2:
    return "..." + location[-(width - 3) :]
  return f"{where} ...{name[-(width - len(where) - 4) :]}"


def format_table(records: Sequence[SiteRecord], title: str = "") -> str:
  """A fixed-width table of the records, with totals."""
  header = (
    "#",
    "location",
    "shape",
    "dtype",
    "group",
    "decision",
    "wire before",
    "wire after",
    "ratio",
    "why",
  )
  rows = []
  for r in records:
    ratio = f"{r.bytes_before / r.bytes_after:.2f}x" if r.rewritten and r.bytes_after else "-"
    rows.append(
      (
        str(r.index),
        _fit(r.location, LOCATION_WIDTH),
        _shape(r.shapes),
        ",".join(sorted(set(r.dtypes))),
        f"{r.group_size}x{r.num_groups}",
        r.decision,
        _bytes(r.bytes_before),
        _bytes(r.bytes_after),
        ratio,
        r.reason,
      )
    )
  widths = [
    max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)
  ]
  lines = [title] if title else []
  fmt = "  ".join("{:<%d}" % w for w in widths)
  lines.append(fmt.format(*header).rstrip())
  lines.append("  ".join("-" * w for w in widths))
  lines.extend(fmt.format(*row).rstrip() for row in rows)
  done = [r for r in records if r.rewritten]
  before = sum(r.bytes_before for r in done)
  after = sum(r.bytes_after for r in done)
  noun = "all-reduce" if all(r.kind == "all_reduce" for r in records) else "collective"
  summary = f"{len(done)} of {len(records)} {noun} sites rewritten"
  if done:
    summary += (
      f"; wire bytes per rank {_bytes(before)} -> {_bytes(after)} ({before / after:.2f}x less)"
    )
  lines.append(summary)
  return "\n".join(lines)
