#!/usr/bin/env python3
"""Cut test modules written by XLA's, StableHLO's and Shardy's developers out of
their repositories, for tests/test_foreign_corpus.py.

    python tests/cut_foreign_modules.py \\
        --source openxla/xla=/work/.mirror/ROCm+xla/repo@refs/heads/main \\
        --source openxla/stablehlo=/work/.mirror/openxla+stablehlo/repo@HEAD \\
        --source openxla/shardy=/work/.mirror/openxla+shardy/repo@HEAD \\
        --out tests/data/foreign

Each --source is NAME=GIT_DIR@REV: a bare git directory (no work tree needed) and
the revision to read; NAME is the repository the commit belongs to, recorded as
the module's provenance with the commit hash REV resolves to.

What is cut:
  * XLA HLO text in C++ test files (`*_test.cc`): every raw string literal
    (R"(...)", R"hlo(...)hlo", ...) whose first code line is `HloModule`;
  * `.hlo` / `.txt` HLO files under test directories, split on `// -----` and
    on `HloModule` lines;
  * `.mlir` test files (StableHLO, MHLO, Shardy), split on `// -----` (and, for
    split-file tests, on `//--- part`).  StableHLO interpreter tests: the
    harness function that calls `interpreter.run_parallel` / `check.*` is cut
    away, and its `programs=[[..], ..]` gives the replica and partition counts.

Modules that are templates (absl::Substitute `$0`/`$name`, absl::StrFormat
`%s`/`%d`/`%%`) are skipped and counted: their text is not HLO until C++ fills
them in.  Modules that contain an all-reduce in any form are preferred (HLO
`all-reduce(`, `all-reduce-start(`, `stablehlo.all_reduce`, `mhlo.all_reduce`,
`sdy.all_reduce`), with a fixed-seed sample of the others.  Each candidate is
parsed first (jaxlib's HLO parser + HLO->StableHLO conversion, or MLIR's parser
with JAX's dialects) in a helper process, and the result is recorded.

Device counts: HLO header `replica_count=` / `num_partitions=`; else what the
C++ test passes near the string (`replica_count=4`, `set_num_partitions(8)`, ...);
MLIR `mhlo.num_replicas` / `mhlo.num_partitions`, or the interpreter's
`programs=`; else the largest device id in the replica groups (or the size of the
mesh), as partitions when the collective has a channel and as replicas when not;
else 8 (the test machine's device count).  `devices.source` says which.

Output: one file per kept module and manifest.json (file -> repo, commit,
source path, line of the module's first line, kind, devices, all-reduce counts,
whether it parsed), plus the tallies of what was cut, skipped and kept.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import re
import subprocess
import sys

# --- reading git -------------------------------------------------------------


class Repo:
  def __init__(self, name: str, git_dir: str, rev: str):
    self.name, self.git_dir = name, git_dir
    self.commit = self._git("rev-parse", rev + "^{commit}").strip()

  def _git(self, *args: str) -> str:
    return subprocess.run(
      ["git", "--git-dir", self.git_dir, *args], check=True, capture_output=True, text=True
    ).stdout

  def files(self) -> list[tuple[str, int]]:
    """(path, size) of every blob at the commit."""
    out = []
    for line in self._git("ls-tree", "-r", "-l", self.commit).splitlines():
      meta, _, path = line.partition("\t")
      parts = meta.split()
      if parts[1] == "blob" and parts[3].isdigit():
        out.append((path, int(parts[3])))
    return out

  def read(self, paths: list[str]) -> dict[str, str]:
    """Contents of `paths` (missing blobs, e.g. large files the snapshot lacks, left out)."""
    proc = subprocess.Popen(
      ["git", "--git-dir", self.git_dir, "cat-file", "--batch"],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
    )
    data, _ = proc.communicate("".join(f"{self.commit}:{p}\n" for p in paths).encode())
    out, pos = {}, 0
    for path in paths:
      end = data.index(b"\n", pos)
      header = data[pos:end].decode()
      pos = end + 1
      if header.endswith("missing") or len(header.split()) != 3:
        continue
      size = int(header.split()[2])
      blob = data[pos : pos + size]
      pos += size + 1
      try:
        out[path] = blob.decode("utf-8")
      except UnicodeDecodeError:
        pass
    return out


# --- counting all-reduces ------------------------------------------------------

_HLO_AR = re.compile(r"(?<![\w.%-])all-reduce(-start)?\(")
_HLO_COMP_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*[({]")
_HLO_TOKEN = re.compile(r"%?([A-Za-z_][\w.\-]*)")


def hlo_computations(text: str) -> tuple[dict[str, list[str]], str | None]:
  """{computation name: its lines}, and the ENTRY computation's name."""
  comps, entry, current = {}, None, None
  for line in text.splitlines():
    s = line.strip()
    if current is None:
      if s.endswith("{") and " = " not in s and not s.startswith("HloModule"):
        m = _HLO_COMP_HEADER.match(s)
        if m:
          current = m.group(1)
          comps[current] = []
          if s.startswith("ENTRY"):
            entry = current
      continue
    if s == "}":
      current = None
    else:
      comps[current].append(line)
  return comps, entry


_HLO_NAME = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=")


def hlo_sites(text: str) -> list[tuple[str, str]]:
  """(form, instruction name) of each all-reduce in the computations reachable from
  ENTRY; form "hlo" (all-reduce) or "hlo_async" (all-reduce-start)."""
  comps, entry = hlo_computations(text)
  reachable = set(comps) if entry is None else {entry}
  todo = list(reachable)
  while todo:
    for line in comps[todo.pop()]:
      _, eq, rhs = line.partition("=")
      for m in _HLO_TOKEN.finditer(rhs if eq else line):
        name = m.group(1)
        if name in comps and name not in reachable:
          reachable.add(name)
          todo.append(name)
  sites = []
  for name in comps:
    if name not in reachable:
      continue
    for line in comps[name]:
      m = _HLO_AR.search(line)
      n = _HLO_NAME.match(line)
      if m and n:
        sites.append(("hlo_async" if m.group(1) else "hlo", n.group(1)))
  return sites


def count_hlo(text: str) -> dict[str, int]:
  """All-reduce instructions in the computations reachable from ENTRY, by form."""
  return dict(collections.Counter(form for form, _ in hlo_sites(text)))


def strip_mlir_comments(text: str) -> str:
  """Text without `//` comments (outside string literals)."""
  out = []
  for line in text.splitlines():
    in_str, cut = False, len(line)
    i = 0
    while i < len(line):
      ch = line[i]
      if in_str:
        if ch == "\\":
          i += 1
        elif ch == '"':
          in_str = False
      elif ch == '"':
        in_str = True
      elif line.startswith("//", i):
        cut = i
        break
      i += 1
    out.append(line[:cut])
  return "\n".join(out)


# `stablehlo.custom_call @mhlo.all_reduce(...)`: an MHLO all-reduce carried through
# StableHLO (XLA's StableHLO extension encoding), turned back into one by XLA.
_MLIR_AR = re.compile(
  r'(?<![\w.@])"?(stablehlo|mhlo|sdy)\.all_reduce\b(?!_)|'
  r"(custom_call\s*@mhlo\.all_reduce)\b"
)


def mlir_sites(text: str) -> list[tuple[str, int]]:
  """(dialect, line) of each all-reduce op in MLIR text (comments excluded): dialect
  "stablehlo", "mhlo", "sdy", or "mhlo_custom_call" (custom_call @mhlo.all_reduce)."""
  code = strip_mlir_comments(text)
  return [
    (m.group(1) or "mhlo_custom_call", code.count("\n", 0, m.start()) + 1)
    for m in _MLIR_AR.finditer(code)
  ]


def count_mlir(text: str) -> dict[str, int]:
  return dict(collections.Counter(form for form, _ in mlir_sites(text)))


# --- device counts -----------------------------------------------------------

_HINTS = {
  "replicas": [
    r"replica_count\s*=\s*(\d+)",
    r"/\*\s*replica_count\s*=\s*\*/\s*(\d+)",
    r"set_replica_count\(\s*(\d+)\s*\)",
    r"num_replicas\s*=\s*(\d+)",
    r"/\*\s*num_replicas\s*=\s*\*/\s*(\d+)",
  ],
  "partitions": [
    r"num_partitions\s*=\s*(\d+)",
    r"/\*\s*num_partitions\s*=\s*\*/\s*(\d+)",
    r"set_num_partitions\(\s*(\d+)\s*\)",
  ],
}


def _largest_device_id(text: str) -> int | None:
  """1 + the largest device id in the replica groups of `text`, or None."""
  best = None
  # HLO: replica_groups={{0,1},{2,3}} / replica_groups=[2,4]<=[8] / [4,2]<=[2,4]T(1,0)
  for m in re.finditer(r"replica_groups=\{((?:\{[\d,\s]*\},?\s*)*)\}", text):
    ids = [int(v) for v in re.findall(r"\d+", m.group(1))]
    if ids:
      best = max(best or 0, max(ids) + 1)
  for m in re.finditer(r"replica_groups=\[[\d,]+\]<=\[([\d,]+)\]", text):
    n = 1
    for v in m.group(1).split(","):
      n *= int(v)
    best = max(best or 0, n)
  # MLIR: replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>
  for m in re.finditer(r"replica_groups\s*=\s*dense<([^>]*)>", text):
    ids = [int(v) for v in re.findall(r"-?\d+", m.group(1))]
    if ids and max(ids) >= 0:
      best = max(best or 0, max(ids) + 1)
  return best


def _mesh_size(text: str) -> int | None:
  best = None
  for m in re.finditer(r"(?:sdy\.mesh\s+@[\w.]+\s*=\s*|#sdy\.mesh)<\s*\[([^\]]*)\]", text):
    n = 1
    for size in re.findall(r"=\s*(\d+)", m.group(1)):
      n *= int(size)
    best = max(best or 0, n)
  return best


def _has_channel(text: str, kind: str) -> bool:
  if kind == "hlo":
    return any("channel_id=" in line for line in text.splitlines() if _HLO_AR.search(line))
  return "channel_handle" in text


def _counts(replicas, partitions, source: str) -> dict | None:
  """{replicas, partitions, source} from two regex matches (a missing one: 1), or None
  when neither matched."""
  if not (replicas or partitions):
    return None
  return {
    "replicas": int(replicas.group(1)) if replicas else 1,
    "partitions": int(partitions.group(1)) if partitions else 1,
    "source": source,
  }


def devices_for(
  text: str, kind: str, harness: str = "", run_parallel: tuple[int, int] | None = None
) -> dict:
  """{replicas, partitions, source} for a module (see the module docstring)."""
  if kind == "hlo":
    header = text.lstrip().splitlines()[0] if text.strip() else ""
    counts = _counts(
      re.search(r"\breplica_count=(\d+)", header),
      re.search(r"\bnum_partitions=(\d+)", header),
      "header",
    )
    if counts:
      return counts
    found = {}
    for key, patterns in _HINTS.items():
      for pattern in patterns:
        m = re.search(pattern, harness)
        if m:
          found[key] = int(m.group(1))
          break
    if found:
      return {
        "replicas": found.get("replicas", 1),
        "partitions": found.get("partitions", 1),
        "source": "test harness",
      }
  else:
    code = strip_mlir_comments(text)
    counts = _counts(
      re.search(r"mhlo\.num_replicas\s*=\s*(\d+)", code),
      re.search(r"mhlo\.num_partitions\s*=\s*(\d+)", code),
      "module attributes",
    )
    if counts:
      return counts
    if run_parallel:
      return {
        "replicas": run_parallel[0],
        "partitions": run_parallel[1],
        "source": "interpreter programs=",
      }
    text = code
  n = _largest_device_id(text)
  source = "replica groups"
  if n is None and kind == "mlir":
    n, source = _mesh_size(text), "sdy mesh"
  if n is None:
    n, source = 8, "default"
  if _has_channel(text, kind):
    return {"replicas": 1, "partitions": n, "source": source}
  return {"replicas": n, "partitions": 1, "source": source}


# --- cutting -----------------------------------------------------------------

_RAW = re.compile(r'R"([^()\\\s"]{0,16})\((.*?)\)\1"', re.S)
# absl::Substitute ($0, $name, ${x}) and absl::StrFormat (%s, %d, %%) templates.
_DOLLAR = re.compile(r"\$\{?\w")
_PRINTF = re.compile(r"%%|%[-+ #0]*\d*(?:\.\d+)?[sdiuvfgx](?![\w.\-]|\s*=)")


def _first_code_line(text: str) -> tuple[int, str]:
  for i, line in enumerate(text.splitlines()):
    s = line.strip()
    if s and not s.startswith("//") and not s.startswith("#"):
      return i, s
  return 0, ""


def _line_at(text: str, offset: int) -> int:
  return text.count("\n", 0, offset) + 1


def placeholder(text: str, kind: str) -> str | None:
  """Why `text` is a template, not a module (None when it is not one)."""
  code = strip_mlir_comments(text) if kind == "mlir" else text
  if _DOLLAR.search(code):
    return "dollar"  # absl::Substitute / StrReplaceAll
  if kind == "hlo" and _PRINTF.search(code):
    return "printf"  # absl::StrFormat
  return None


def cut_cc(path: str, source: str):
  """HLO modules in C++ raw strings: (line, text, harness text after it)."""
  for m in _RAW.finditer(source):
    body = m.group(2)
    skip, first = _first_code_line(body)
    if not first.startswith("HloModule"):
      continue
    lines = body.splitlines(keepends=True)
    text = "".join(lines[skip:])
    line = _line_at(source, m.start(2)) + skip
    harness = source[m.end() : m.end() + 3000]
    yield line, text, harness


def cut_hlo_file(path: str, source: str):
  """HLO modules in an .hlo/.txt file: split on `// -----` and `HloModule` lines."""
  starts = [m.start() for m in re.finditer(r"^HloModule\b", source, re.M)]
  seps = [m.start() for m in re.finditer(r"^// -----", source, re.M)]
  for i, start in enumerate(starts):
    end = min([s for s in starts[i + 1 :] + seps if s > start] or [len(source)])
    yield _line_at(source, start), source[start:end].rstrip() + "\n", ""


def _drop_func(code: str, keep_out: re.Pattern) -> tuple[str, bool]:
  """`code` without the func.func ops whose bodies match `keep_out`."""
  out, pos, dropped = [], 0, False
  for m in re.finditer(r"^[ \t]*func\.func\b", code, re.M):
    if m.start() < pos:
      continue
    brace = code.find("{", code.find(")", m.end()))
    depth, i = 0, brace
    while i < len(code):
      if code[i] == "{":
        depth += 1
      elif code[i] == "}":
        depth -= 1
        if depth == 0:
          break
      i += 1
    if keep_out.search(code[m.start() : i + 1]):
      out.append(code[pos : m.start()])
      pos = i + 1
      dropped = True
  out.append(code[pos:])
  return "".join(out), dropped


_HARNESS_OPS = re.compile(r"\binterpreter\.|\bcheck\.")


def cut_mlir(path: str, source: str):
  """MLIR chunks: (line, text, run_parallel or None, negative)."""
  parts = [(0, source)]
  if re.search(r"^//--- ", source, re.M):  # split-file: each part its own input
    marks = [m for m in re.finditer(r"^//--- .*$", source, re.M)]
    parts = [
      (
        m.end() + 1,
        source[m.end() + 1 : (marks[i + 1].start() if i + 1 < len(marks) else len(source))],
      )
      for i, m in enumerate(marks)
    ]
  for base, part in parts:
    bounds = [0] + [m.end() for m in re.finditer(r"^// -----.*$", part, re.M)]
    ends = [m.start() for m in re.finditer(r"^// -----.*$", part, re.M)] + [len(part)]
    for start, end in zip(bounds, ends):
      chunk = part[start:end]
      code = strip_mlir_comments(chunk)
      if not re.search(r"\bfunc\.func\b|\bmodule\b", code):
        continue
      lead = len(chunk) - len(chunk.lstrip())
      line = _line_at(source, base + start + lead)
      text = chunk.strip() + "\n"
      negative = bool(re.search(r"expected-(error|warning|remark)", chunk))
      run_parallel = None
      if _HARNESS_OPS.search(code):
        m = re.search(r"programs\s*=\s*\[((?:\s*\[[^\]]*\]\s*,?)+)\]", code)
        if m:
          rows = re.findall(r"\[([^\]]*)\]", m.group(1))
          run_parallel = (len(rows), len(rows[0].split(",")))
        text, dropped = _drop_func(text, _HARNESS_OPS)
        if _HARNESS_OPS.search(strip_mlir_comments(text)):
          yield line, None, None, negative  # harness ops outside a function
          continue
      yield line, text, run_parallel, negative


# --- parsing in a helper process --------------------------------------------

_WORKER = r"""
import json, os, sys
os.environ["JAX_PLATFORMS"] = "cpu"
from jax.extend import mlir as jax_mlir
from jax.extend.mlir import ir
from jax._src.interpreters import mlir as jm
from jaxlib import _hlo
for line in sys.stdin:
  req = json.loads(line)
  try:
    if req["kind"] == "hlo":
      proto = _hlo.hlo_module_from_text(req["text"]).as_serialized_hlo_module_proto()
      jax_mlir.hlo_to_stablehlo(proto)
    else:
      ir.Module.parse(req["text"], context=jm.make_ir_context())
    res = "ok"
  except Exception as e:
    res = "error: " + (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
  sys.stdout.write(json.dumps(res) + "\n")
  sys.stdout.flush()
"""


def validate(items: list[dict]) -> None:
  """Set item["parses"] to "ok", "error: ...", or "crash" (the parser killed the process)."""
  i, proc = 0, None
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  while i < len(items):
    if proc is None:
      proc = subprocess.Popen(
        [sys.executable, "-c", _WORKER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
      )
    try:
      proc.stdin.write(json.dumps({"kind": items[i]["kind"], "text": items[i]["text"]}) + "\n")
      proc.stdin.flush()
      answer = proc.stdout.readline()
    except BrokenPipeError:
      answer = ""
    if not answer:
      proc.wait()
      proc = None
      items[i]["parses"] = "crash"
    else:
      items[i]["parses"] = json.loads(answer)
    i += 1
  if proc is not None:
    proc.stdin.close()
    proc.wait()


# --- main ----------------------------------------------------------------------


def _slug(text: str) -> str:
  return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def collect(repo: Repo, tally: collections.Counter, max_file_bytes: int) -> list[dict]:
  short = repo.name.split("/")[-1]
  wanted = []
  for path, size in repo.files():
    if size > max_file_bytes:
      continue
    if path.endswith("_test.cc"):
      wanted.append((path, "cc"))
    elif path.endswith((".hlo", ".txt")) and re.search(r"(^|/)(tests?|testdata)/", path):
      wanted.append((path, "hlo"))
    elif path.endswith(".mlir") and re.search(r"(^|/)(tests?|testdata)/", path):
      wanted.append((path, "mlir"))
  contents = repo.read([p for p, _ in wanted])
  out = []
  for path, how in wanted:
    source = contents.get(path)
    if source is None:
      continue
    if how == "cc":
      cuts = ((line, text, harness, None, False) for line, text, harness in cut_cc(path, source))
    elif how == "hlo":
      cuts = (
        (line, text, harness, None, False) for line, text, harness in cut_hlo_file(path, source)
      )
    else:
      cuts = ((line, text, "", rp, neg) for line, text, rp, neg in cut_mlir(path, source))
    for line, text, harness, run_parallel, negative in cuts:
      kind = "mlir" if how == "mlir" else "hlo"
      tally[f"cut {kind}"] += 1
      if text is None:
        tally["skipped: harness ops left in the module"] += 1
        continue
      why = placeholder(text, kind)
      if why:
        tally[f"skipped: template placeholders ({why})"] += 1
        continue
      counts = count_hlo(text) if kind == "hlo" else count_mlir(text)
      out.append(
        {
          "repo": repo.name,
          "commit": repo.commit,
          "path": path,
          "line": line,
          "kind": kind,
          "text": text,
          "counts": counts,
          "negative": negative,
          "devices": devices_for(text, kind, harness, run_parallel),
          "interpreter_harness_removed": run_parallel is not None,
          "name": f"{short}__{_slug(os.path.splitext(path)[0].split('/')[-1])}__L{line}",
        }
      )
  return out


_INTEREST = [
  # Type-promoting all-reduces (operand and result element types differ).
  (3, re.compile(r"promot", re.I)),
  # Async forms: HLO all-reduce-start/done, async-start wrappers, stablehlo/mhlo async.
  (2, re.compile(r"all-reduce-start|async-start|async_start")),
  # Called computations, where a converter may duplicate functions.
  (
    1,
    re.compile(
      r"\bcall\(|calls=|while\(|conditional\(|func\.call|stablehlo\.while|"
      r"stablehlo\.case|to_apply=%?\w+.*to_apply"
    ),
  ),
  # Element types other than f32.
  (1, re.compile(r"\b(bf16|f16|f64)\b|tensor<[\dx]*(bf16|f16|f64)>")),
]


def _interest(m: dict) -> int:
  """Modules of the forms a pass gets wrong most easily come first in each file."""
  return sum(score for score, pattern in _INTEREST if pattern.search(m["text"]))


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(
    description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
  )
  ap.add_argument(
    "--source",
    action="append",
    required=True,
    help="NAME=GIT_DIR@REV, e.g. openxla/stablehlo=/path/repo@HEAD",
  )
  ap.add_argument("--out", required=True)
  ap.add_argument("--per-file", type=int, default=8, help="all-reduce modules kept per source file")
  ap.add_argument("--max-allreduce", type=int, default=320)
  ap.add_argument("--max-other", type=int, default=50)
  ap.add_argument(
    "--max-negative",
    type=int,
    default=12,
    help="kept modules that the upstream test expects to be rejected",
  )
  ap.add_argument("--max-module-bytes", type=int, default=24000)
  ap.add_argument("--max-file-bytes", type=int, default=2_000_000)
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)

  tally = collections.Counter()
  modules = []
  repos = []
  for spec in args.source:
    name, _, rest = spec.partition("=")
    git_dir, _, rev = rest.rpartition("@") if "@" in rest else (rest, "", "HEAD")
    repo = Repo(name, git_dir, rev or "HEAD")
    repos.append(repo)
    modules.extend(collect(repo, tally, args.max_file_bytes))

  # Duplicates (the same module in several tests or files): the first one counts.
  seen, unique = set(), []
  for m in modules:
    key = hashlib.sha256(m["text"].strip().encode()).hexdigest()
    if key in seen:
      tally["skipped: duplicate"] += 1
      continue
    seen.add(key)
    if len(m["text"].encode()) > args.max_module_bytes:
      tally["skipped: larger than --max-module-bytes"] += 1
      continue
    unique.append(m)

  rng = random.Random(args.seed)
  with_ar = [m for m in unique if m["counts"] and not m["negative"]]
  negative = [m for m in unique if m["counts"] and m["negative"]]
  others = [m for m in unique if not m["counts"] and not m["negative"]]
  for m in with_ar + negative + others:
    tally[
      f"candidate {m['kind']} {'all-reduce' if m['counts'] else 'other'}"
      f"{' negative' if m['negative'] else ''}"
    ] += 1

  # All-reduce modules: up to --per-file per source file, spread over the files.
  by_file = collections.defaultdict(list)
  for m in with_ar:
    by_file[(m["repo"], m["path"])].append(m)
  pool = []
  for key in sorted(by_file):
    group = by_file[key]
    rng.shuffle(group)
    group.sort(key=lambda m: -_interest(m))  # stable: random among equals
    pool.extend(group[: args.per_file])
  validate(pool)
  parsed = [m for m in pool if m["parses"] == "ok"]
  failed = [m for m in pool if m["parses"] != "ok"]
  for m in failed:
    tally[f"all-reduce module the parser rejects ({m['parses'].split(':')[0]})"] += 1
  rng.shuffle(parsed)
  parsed.sort(key=lambda m: -_interest(m))  # the cap drops plain ones first
  rng.shuffle(failed)
  # Mostly modules that parse; a few that do not, for the error paths.
  keep = parsed[: args.max_allreduce] + failed[: max(3, args.max_allreduce // 30)]
  rng.shuffle(negative)
  neg = negative[: args.max_negative]
  validate(neg)
  keep += neg
  rng.shuffle(others)
  sample = others[: args.max_other * 2]
  validate(sample)
  keep += [m for m in sample if m["parses"] == "ok"][: args.max_other]

  os.makedirs(args.out, exist_ok=True)
  for old in os.listdir(args.out):  # what an earlier run wrote; README.md stays
    if old.endswith((".hlo", ".mlir")) or old == "manifest.json":
      os.remove(os.path.join(args.out, old))
  manifest = {}
  names = collections.Counter()
  for m in sorted(keep, key=lambda m: (m["repo"], m["path"], m["line"])):
    base = m["name"]
    names[base] += 1
    if names[base] > 1:
      base += f"_{names[base]}"
    file = base + (".hlo" if m["kind"] == "hlo" else ".mlir")
    with open(os.path.join(args.out, file), "w") as f:
      f.write(m["text"])
    manifest[file] = {
      k: m[k]
      for k in (
        "repo",
        "commit",
        "path",
        "line",
        "kind",
        "devices",
        "counts",
        "negative",
        "parses",
        "interpreter_harness_removed",
      )
    }
    tally[
      f"kept {m['kind']} {'all-reduce' if m['counts'] else 'other'}"
      f"{' negative' if m['negative'] else ''}"
    ] += 1
    for k, n in m["counts"].items():
      tally[f"kept all-reduce sites: {k}"] += n
  doc = {
    "how": (
      "cut by tests/cut_foreign_modules.py; regenerate with: python "
      "tests/cut_foreign_modules.py "
      + " ".join(f"--source {s}" for s in args.source)
      + f" --out {args.out}"
    ),
    "sources": {r.name: {"commit": r.commit, "git_dir": r.git_dir} for r in repos},
    "notes": (
      "Each file is a module verbatim from the named file at the named commit, "
      "starting at `line`, except: MLIR chunks are cut at `// -----`, and StableHLO "
      "interpreter tests lose the harness function that calls "
      "interpreter.run_parallel/check.* (interpreter_harness_removed). counts: "
      "all-reduces in the text (HLO: instructions in computations reachable from "
      "ENTRY; MLIR: ops outside comments). negative: the upstream test expects the "
      "module to be rejected. parses: jaxlib's HLO parser and HLO->StableHLO "
      "conversion, or MLIR's parser with JAX's dialects, when cut."
    ),
    "tally": dict(sorted(tally.items())),
    "modules": manifest,
  }
  with open(os.path.join(args.out, "manifest.json"), "w") as f:
    json.dump(doc, f, indent=1, sort_keys=False)
    f.write("\n")
  for k, v in sorted(tally.items()):
    print(f"{v:6d}  {k}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
