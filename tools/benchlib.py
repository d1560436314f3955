"""Shared helpers of the benchmark tools: scheme flag strings, tables, JSON, plots.

A scheme is a flag string for equarx_pass ("--equarx_enable --equarx_format=int4").
Schemes whose flags this checkout does not know yet are reported as "not
available" instead of failing, so the same command can be rerun when they land.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where the tools write their JSON and plots by default; the docs pages read them there.
RESULTS = os.path.join(ROOT, "results")
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

# What the tools run by default.  Each scheme names its algorithm and rotation, so
# that a change of the pass's own default does not change what a row measures;
# "--equarx_enable" alone is the pass's default scheme, whatever it is.  Flags a
# checkout does not know show up as "not available".
RING = "--equarx_enable --equarx_algorithm=ring --equarx_rotation=none"
DEFAULT_SCHEMES = (
  RING,  # EQuARX int8 ring, block 1024
  RING + " --equarx_microshards=4",
  "--equarx_enable --equarx_algorithm=bidirectional --equarx_rotation=none",
  "--equarx_enable --equarx_algorithm=two_shot --equarx_rotation=none",
  "--equarx_enable",  # the pass's default scheme
  RING + " --equarx_format=int4",
  RING + " --equarx_format=fp8_e4m3",
)


def add_scheme_argument(parser) -> None:
  # One flag string per --scheme; written --scheme="--equarx_enable ..." (with '=')
  # because the value itself starts with dashes.
  parser.add_argument(
    "--scheme",
    action="append",
    metavar="FLAGS",
    help="an equarx flag string; repeat for more (default: DEFAULT_SCHEMES in tools/benchlib.py)",
  )


def scheme_label(flags: str) -> str:
  """A short name: 'int8 ring', 'int4 ring b128', 'int8 two_shot hadamard', ...

  From the policy the flags make (so the pass's defaults are filled in), or from
  the flag text where this checkout does not know them.
  """
  try:
    import equarx_pass

    p = equarx_pass.Policy.from_flags(flags)
  except Exception:
    return " ".join(
      t.lstrip("-").replace("equarx_", "") for t in flags.split() if t != "--equarx_enable"
    )
  get = lambda name, default: getattr(p, name, default)
  parts = [get("format", "int8"), get("algorithm", "ring")]
  if get("block_size", 0):  # 0: the form's default
    parts.append(f"b{p.block_size}")
  if get("block_layout", "fixed") != "fixed":
    parts.append(p.block_layout)
  if get("rotation", "none") != "none":
    parts.append(p.rotation + (f"{p.rotation_size}" if get("rotation_size", 0) else ""))
  if get("microshards", 1) != 1:
    parts.append(f"ms{p.microshards}")
  default_unroll = getattr(equarx_pass.Policy, "unroll_min_bytes", None)
  if default_unroll is not None and p.unroll_min_bytes != default_unroll:
    parts.append(f"unroll>={p.unroll_min_bytes}")
  if get("outline", "auto") != "auto":
    parts.append(f"outline={p.outline}")
  if get("form", "auto") != "auto":
    parts.append(p.form)
  if "--equarx_kernel_exchange" in flags:  # as asked: a site may still keep the other
    parts.append(f"by {p.kernel_exchange}")
  if get("platform", "auto") != "auto":
    parts.append(f"for {p.platform}")
  if get("rounding", "nearest") != "nearest":
    parts.append(p.rounding)
  if get("slow_format", "") and p.slow_format != p.format:
    parts.append(f"{p.slow_format} across")
  ops = get("ops", ("all_reduce",))
  if tuple(ops) != ("all_reduce",):
    short = {"all_reduce": "AR", "reduce_scatter": "RS", "all_gather": "AG"}
    parts.append("+".join(short.get(o, o) for o in ops))
  return " ".join(parts)


def check_scheme(flags: str) -> str | None:
  """None if this checkout's equarx_pass accepts the flags, else why not."""
  import equarx_pass

  try:
    equarx_pass.Policy.from_flags(flags)
  except equarx_pass.FlagError as e:
    return f"not available ({e})"[:200]
  return None


def split_schemes(schemes) -> tuple[list[str], dict[str, str]]:
  """(available schemes, {unavailable scheme: why})."""
  ok, missing = [], {}
  for s in schemes:
    why = check_scheme(s)
    if why:
      missing[s] = why
    else:
      ok.append(s)
  return ok, missing


def jnp_dtype(name: str):
  """'bf16' or 'f32' (the tools' --dtypes) -> the JAX dtype."""
  import jax.numpy as jnp

  return {"bf16": jnp.bfloat16, "f32": jnp.float32}[name]


def psum_program(n: int, platform: str | None = None):
  """jax.jit of a shard_map psum over axis "x" of the first `n` devices (of `platform`,
  default JAX's default backend): the one all-reduce the benchmark tools rewrite."""
  import jax
  import numpy as np
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  mesh = Mesh(np.array(jax.devices(platform)[:n]), ("x",))
  return jax.jit(
    jax.shard_map(lambda v: jax.lax.psum(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  )


def median_seconds(run, calls: int) -> float:
  """Median seconds of `calls` calls of run() after one warm-up, each waited for
  (jax.block_until_ready on what it returns)."""
  import jax

  jax.block_until_ready(run())
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    jax.block_until_ready(run())
    times.append(time.perf_counter() - start)
  return sorted(times)[len(times) // 2]


def parse_size(text: str) -> int:
  """'64K', '8M', '4096' -> bytes (powers of 1024)."""
  m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.I)
  if not m:
    raise ValueError(f"bad size {text!r}")
  return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def fmt_bytes(n: float) -> str:
  for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
    if abs(n) >= size:
      v = n / size
      return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
  return f"{n:.0f} B"


def table(rows: list[dict], columns: list[str], title: str = "") -> str:
  """A fixed-width text table of `rows` (dicts), in `columns` order."""
  cells = [[str(r.get(c, "")) for c in columns] for r in rows]
  widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
  fmt = "  ".join("{:<%d}" % w for w in widths)
  lines = [title] if title else []
  lines.append(fmt.format(*columns).rstrip())
  lines.append("  ".join("-" * w for w in widths))
  lines.extend(fmt.format(*row).rstrip() for row in cells)
  return "\n".join(lines)


def markdown_table(rows: list[dict], columns: list[str]) -> str:
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  for r in rows:
    lines.append("| " + " | ".join(str(r.get(c, "")) for c in columns) + " |")
  return "\n".join(lines)


def _rounded(x):
  """Floats to 6 significant digits: the files are committed, and timings carry no more."""
  if isinstance(x, float):
    return float(f"{x:.6g}")
  if isinstance(x, dict):
    return {k: _rounded(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_rounded(v) for v in x]
  return x


def write_json(path: str, data: dict) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    # Top-level keys one per line, each value on one line: small and still greppable.
    f.write(
      "{\n"
      + ",\n".join(
        f"{json.dumps(k)}: {json.dumps(_rounded(v), default=str)}" for k, v in data.items()
      )
      + "\n}\n"
    )
  os.replace(tmp, path)


# The envelope of every result file (tools/README.md, "Result files").  A reader takes
# "results" and the tool's own fields by name; the envelope says what made the file.
RESULT_SCHEMA = "equarx-bench/1"
ENVELOPE = (
  "schema",
  "tool",
  "command",
  "created",
  "equarx_version",
  "jax_version",
  "machine",
)


def write_result(path: str, results: list[dict], **fields) -> None:
  """Write a tool's result file: the envelope, the tool's own `fields`, then `results`,
  one object per row."""
  clash = set(fields) & set(ENVELOPE + ("results",))
  assert not clash, f"fields {sorted(clash)} are the envelope's"
  try:
    import equarx_pass

    equarx_version = equarx_pass.__version__
  except ImportError:
    equarx_version = None
  jax = sys.modules.get("jax")
  envelope = dict(
    schema=RESULT_SCHEMA,
    tool=os.path.splitext(os.path.basename(sys.argv[0]))[0],
    # As typed, with the interpreter's path (a virtual environment's) left out.
    command=shlex.join(["python"] + sys.orig_argv[1:]),
    created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    equarx_version=equarx_version,
    jax_version=getattr(jax, "__version__", None),
    machine=machine_info(),
  )
  write_json(path, dict(envelope, **fields, results=results))
  print(f"wrote {path}")


def write_results(
  path: str, rows: list[dict], table_rows: list[dict], columns: list[str], **fields
) -> None:
  """write_result with the table the tool printed, as Markdown (`table_markdown`)."""
  write_result(path, rows, **fields, table_markdown=markdown_table(table_rows, columns))


def pyplot():
  """matplotlib's pyplot with a file-only backend, or None if not installed."""
  try:
    import matplotlib
  except ImportError:
    print('matplotlib not installed (pip install ".[bench]"): no plot written', file=sys.stderr)
    return None
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def save_plot(fig, path: str) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  # Small PNGs: modest dpi; they are committed.
  fig.savefig(path, dpi=60, bbox_inches="tight")
  print(f"wrote {path}")


def machine_info() -> dict:
  import platform

  info = {
    "python": platform.python_version(),
    "machine": platform.machine(),
    "cpus": os.cpu_count(),
  }
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          info["cpu"] = line.split(":", 1)[1].strip()
          break
  except OSError:
    pass
  devices = _devices()
  if devices:
    info["devices"] = devices
  return info


def _devices() -> str | None:
  """'8 x cpu', '1 x NVIDIA H100 80GB HBM3': the devices of this process, if it started
  JAX's backend.  Never starts it: without JAX_PLATFORMS that probes for a TPU."""
  jax = sys.modules.get("jax")
  if jax is None:
    return None
  try:
    from jax._src import xla_bridge  # private; a JAX without it records no devices

    if not xla_bridge.backends_are_initialized():
      return None
    devices = jax.devices()
  except Exception:
    return None
  return f"{len(devices)} x {devices[0].device_kind}"
