"""The site report: one row per all-reduce, printed by the decorator, the CLI and the demo."""

from __future__ import annotations

from typing import Sequence

from equarx_pass.site_kind import SiteKind
from equarx_pass.site_records import SiteRecord


def _shape(shapes) -> str:
  return "+".join("dynamic" if s is None else "x".join(map(str, s)) or "scalar" for s in shapes)


def fmt_bytes(n: int) -> str:
  for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
    if n >= size:
      return f"{n / size:.1f} {unit}"
  return f"{n} B"


# The column of the cost model's speed-up: what the model believes, named as such.
MODEL_COLUMN = "model speed-up"

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


def _runs(record: SiteRecord) -> int:
  """The times one run of the program executes the site; a loop of unknown trip count
  counts once (and _loop_note says so)."""
  return record.runs if record.runs is not None else 1


def _loop_note(record: SiteRecord) -> str:
  """The why column's prefix for a site in a loop (its bytes are per run of the program)
  or in a conditional's branch (its bytes are for a run that takes the branch)."""
  note = "in a conditional branch, runs only when taken; " if record.in_branch else ""
  if record.runs is None:
    return note + "in a loop of unknown trip count, bytes counted once; "
  if record.runs != 1:
    return note + f"runs {record.runs}x a call (a loop), bytes for all; "
  return note


def _ratio(before: float, after: float) -> str:
  return f"{before / after:.2f}x" if after else "-"


def format_table(records: Sequence[SiteRecord], title: str = "", topology=None) -> str:
  """A fixed-width table of the records, with totals.  With a topology (topology.py), the
  bytes are split by link class (slow first: what crosses domains) and each rewritten
  site shows the cost model's speed-up (cost.py): an estimate, not a measurement, and
  none where the rewrite sends more bytes than the native collective (the plan counts
  that a loss whatever the time model says)."""
  if not records:  # no columns to name: say so in one line
    return "\n".join(([title] if title else []) + ["no collective site in the program"])
  split = topology is not None and any(r.traffic_before is not None for r in records)
  wire: tuple[str, ...]
  cells: tuple[str, ...]
  if split:
    slow, fast = topology.slow.name, topology.fast.name
    wire = (f"{slow} before", f"{slow} after", f"{fast} before", f"{fast} after", MODEL_COLUMN)
  else:
    wire = ("wire before", "wire after", "ratio")
  # With --equarx_slow_format, the format on each link class (site_records.link_formats).
  formats = split and any(r.link_formats for r in records)
  if formats:
    wire += (f"{topology.slow.name} / {topology.fast.name} format",)
  header = ("#", "location", "shape", "dtype", "group", "decision", *wire, "why")
  rows = []
  for r in records:
    if split:
      b, a = r.traffic_before, r.traffic_after
      n = _runs(r)
      cells = (
        (
          fmt_bytes(round(n * b.slow)),
          fmt_bytes(round(n * a.slow)),
          fmt_bytes(round(n * b.fast)),
          fmt_bytes(round(n * a.fast)),
        )
        if b is not None and a is not None
        else ("-",) * 4
      )
      cells += (f"{r.speedup:.2f}x" if r.speedup is not None else "-",)
      if formats:
        cells += (" / ".join(f or "-" for f in r.link_formats) if r.link_formats else "-",)
    else:
      ratio = _ratio(r.bytes_before, r.bytes_after) if r.rewritten else "-"
      cells = (fmt_bytes(_runs(r) * r.bytes_before), fmt_bytes(_runs(r) * r.bytes_after), ratio)
    rows.append(
      (
        str(r.index),
        _fit(r.location, LOCATION_WIDTH),
        _shape(r.shapes),
        ",".join(sorted(set(r.dtypes))),
        f"{r.group_size}x{r.num_groups}",
        r.decision,
        *cells,
        _loop_note(r) + r.reason,
      )
    )
  widths = [
    max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)
  ]
  lines = [title] if title else []
  if split:
    lines.append(f"topology: {topology.describe()}")
  fmt = "  ".join("{:<%d}" % w for w in widths)
  lines.append(fmt.format(*header).rstrip())
  lines.append("  ".join("-" * w for w in widths))
  lines.extend(fmt.format(*row).rstrip() for row in rows)
  lines.append(summary(records, topology))
  return "\n".join(lines)


def summary(records: Sequence[SiteRecord], topology=None) -> str:
  """The table's last line: sites rewritten and the bytes they send before and after, per
  link class where the records have them (else the wire bytes).  The bytes of every call
  come first; those of sites in a conditional's branch, which a call sends only when the
  branch is taken, follow apart ("+ ... in conditional branches, when taken")."""
  if not any(r.traffic_before is not None for r in records):
    topology = None
  done = [r for r in records if r.rewritten]
  noun = "all-reduce" if all(r.kind == SiteKind.ALL_REDUCE for r in records) else "collective"
  text = f"{len(done)} of {len(records)} {noun} sites rewritten"
  if not done:
    return text
  every = [r for r in done if not r.in_branch]
  taken = [r for r in done if r.in_branch]
  if topology is not None and all(r.traffic_before is not None for r in done):
    text += "; bytes per device: " + (_link_bytes(every, topology) or "none every call")
    if taken:
      text += f" + {_link_bytes(taken, topology) or 'none'} in conditional branches, when taken"
    return text
  text += f"; wire bytes per rank {_wire_bytes(every)}"
  if taken:
    text += f" + {_wire_bytes(taken)} in conditional branches, when taken"
  return text


def _link_bytes(records: Sequence[SiteRecord], topology) -> str:
  """The records' bytes before and after per link class that carries any; "" if none."""
  parts = []
  for name, field in ((topology.slow.name, "slow"), (topology.fast.name, "fast")):
    before = sum(_runs(r) * getattr(r.traffic_before, field) for r in records)
    after = sum(_runs(r) * getattr(r.traffic_after, field) for r in records)
    if before or after:
      parts.append(
        f"{name} {fmt_bytes(round(before))} -> {fmt_bytes(round(after))}{_change(before, after)}"
      )
  return ", ".join(parts)


def _wire_bytes(records: Sequence[SiteRecord]) -> str:
  before = sum(_runs(r) * r.bytes_before for r in records)
  after = sum(_runs(r) * r.bytes_after for r in records)
  return f"{fmt_bytes(before)} -> {fmt_bytes(after)}{_change(before, after)}"


def _change(before: float, after: float) -> str:
  if round(before) == round(after):
    return " (unchanged)"
  if after < before:
    return f" ({before / after:.2f}x less)" if after else " (all of it)"
  return f" ({after / before:.2f}x more)" if before else ""
