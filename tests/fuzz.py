"""Fuzz the pass's input handling with mutated fixtures.

    python tests/fuzz.py --cases 1000 [--seed 0] [--jobs 2] [--cli 30] [--save DIR]
    python tests/fuzz.py --seed 0 --only 123 --save DIR    # write out one case

Every case is a module from hlo_fixtures/ (MLIR text, the same as MLIR bytecode
or a jax.export portable artifact, or XLA HLO text) with one to three random
mutations: delete a span or a line, swap two spans or lines, truncate, overwrite
or insert random bytes, repeat a span many times, replace a number or a word
(once or everywhere).  Each goes through `transform_text` (parse -> rewrite ->
verify -> print) with the pass on and a random scheme (algorithm, format,
rotation, block layout, microshards, block size).  The unmutated inputs run
first and must all succeed.  Every case must end in one of:

  clean error     an EquarxError whose message names the input
  rewrite         a module that parses and verifies again, with one record per
                  all-reduce of the input, exactly the rewritten ones gone, and
                  nothing left to rewrite when it is fed back in

and never in a crash (a signal such as SIGSEGV/SIGABRT, a Python exception that
is not an EquarxError, no answer within --timeout) or an invalid module (a
rewrite that fails those checks).  Cases run in worker processes, so a crash of
the C++ parsers kills a worker, not the run: the case it was running is counted
and run again alone to see whether it crashes by itself.

--cli N also runs the first N cases through equarx-opt as a user would (exit 0
with an output, or exit 2 with one error line, nothing written).  Counts go to
stdout (--json: one JSON object); the exit status is 1 when there was a crash or
an invalid module, whose inputs are saved under --save.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import random
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import time

# Run as a script under PYTHONSAFEPATH (as CI does), Python leaves this file's folder off
# sys.path; its sibling module is found from here.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jax_startup import without_jax_startup  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "hlo_fixtures")
# A worker that sees this input aborts: how the tests check that crashes are caught.
ABORT_MARKER = b"EQUARX-FUZZ-SELFTEST-ABORT"
BLOCK_SIZES = (1, 2, 3, 64, 128, 1024)
# What parse.py says when its helper process crashed or hung on an input.
CONTAINED = ("crashed on this input", "did not finish in time")

OUTCOMES = ("clean_error", "internal_error", "rewritten", "unchanged", "crash", "invalid")


@dataclasses.dataclass
class Case:
  name: str  # fixture, form and mutations: enough to tell what it was
  data: bytes
  flags: str  # --equarx_* flags for the policy


@dataclasses.dataclass
class Result:
  outcome: str  # one of OUTCOMES
  detail: str = ""
  reproduced: bool | None = None  # crashes: did the case crash again on its own?


# --- inputs and mutations --------------------------------------------------------


def base_inputs() -> list[tuple[str, bytes]]:
  """Every fixture as it is, and each MLIR fixture as bytecode and as a portable artifact."""
  import io

  from jax.extend import mlir as jax_mlir

  from equarx_pass.ir import parse

  out = []
  for name in sorted(os.listdir(FIXTURES)):
    if name.endswith(".md"):
      continue
    with open(os.path.join(FIXTURES, name), "rb") as f:
      data = f.read()
    out.append((name, data))
    if name.endswith(".mlir"):
      module = parse.parse_bytes(data, name).module
      buffer = io.BytesIO()
      module.operation.write_bytecode(buffer)
      out.append((name + ":bytecode", buffer.getvalue()))
      artifact = jax_mlir.serialize_portable_artifact(buffer.getvalue(), "1.0.0")
      out.append((name + ":artifact", artifact))
  return out


INTERESTING_NUMBERS = [
  b"0",
  b"1",
  b"-1",
  b"2",
  b"3",
  b"7",
  b"8",
  b"9",
  b"16",
  b"127",
  b"1024",
  b"65536",
  b"2147483647",
  b"-2147483648",
  b"4294967296",
  b"9223372036854775807",
  b"99999999999999999999",
  b"1.5",
  b"1e40",
  b"0x7FC00000",
  b"nan",
  b"inf",
]
_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_WORD = re.compile(rb"[A-Za-z_][A-Za-z0-9_.]*")


def _span(rng: random.Random, n: int) -> tuple[int, int]:
  """A random [start, end) within n bytes, usually short."""
  length = min(n, max(1, int(rng.expovariate(1 / 16))))
  start = rng.randrange(0, n - length + 1)
  return start, start + length


def _lines(data: bytes) -> list[bytes]:
  return data.splitlines(keepends=True)


def mutate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
  """One random mutation of `data`, and its name."""
  if not data:
    return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16))), "random"
  # The *_everywhere kinds twice as often: their mutants often parse, so they
  # reach match, build and verify with modules nobody wrote.
  kind = rng.choice(
    [
      "delete",
      "delete_line",
      "swap",
      "swap_lines",
      "duplicate_line",
      "truncate",
      "random_bytes",
      "insert_bytes",
      "repeat",
      "number",
      "word",
      "number_everywhere",
      "word_everywhere",
    ]
    * 2
    + ["number_everywhere", "word_everywhere"] * 2
  )
  n = len(data)
  if kind == "delete":
    a, b = _span(rng, n)
    return data[:a] + data[b:], kind
  if kind == "truncate":
    return data[: rng.randrange(0, n)], kind
  if kind == "random_bytes":
    out = bytearray(data)
    for _ in range(rng.randrange(1, 9)):
      out[rng.randrange(n)] = rng.randrange(256)
    return bytes(out), kind
  if kind == "insert_bytes":
    at = rng.randrange(n + 1)
    junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 17)))
    return data[:at] + junk + data[at:], kind
  if kind == "swap":
    (a, b), (c, d) = sorted([_span(rng, n), _span(rng, n)])
    if c < b:  # overlapping spans: reverse their union instead
      d = max(b, d)
      return data[:a] + data[a:d][::-1] + data[d:], "reverse"
    return data[:a] + data[c:d] + data[b:c] + data[a:b] + data[d:], kind
  if kind == "repeat":
    # Many copies of a few bytes: deep nesting when they open a bracket.
    a, b = _span(rng, n)
    b = min(b, a + 16)
    times = rng.choice([2, 10, 100, 1000, 5000, 20000])
    return data[:b] + data[a:b] * times + data[b:], f"repeat{times}"
  if kind.startswith(("number", "word")):
    pattern = _NUMBER if kind.startswith("number") else _WORD
    found = list(pattern.finditer(data))
    if found:
      m = rng.choice(found)
      new = rng.choice(INTERESTING_NUMBERS if pattern is _NUMBER else [f.group() for f in found])
      if kind.endswith("everywhere"):
        # The same change at every occurrence keeps the module consistent (all
        # 512s become 7s, all f32s f16s), so more cases get past the verifier.
        old = re.escape(m.group())
        return re.sub(rb"(?<![\w.])" + old + rb"(?![\w.])", lambda _: new, data), kind
      return data[: m.start()] + new + data[m.end() :], kind
    return data[: rng.randrange(0, n)], "truncate"
  lines = _lines(data)
  i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
  if kind == "delete_line":
    del lines[i]
  elif kind == "swap_lines":
    lines[i], lines[j] = lines[j], lines[i]
  else:
    lines.insert(i, lines[j])
  return b"".join(lines), kind


def make_case(bases: list[tuple[str, bytes]], seed: int, index: int) -> Case:
  """Case `index` of run `seed`: the same arguments always give the same case."""
  rng = random.Random(f"{seed}:{index}")
  # Text half of the time: binary forms rarely survive a mutation, text often does.
  forms = {"text": [], "bytecode": [], "artifact": []}
  for base in bases:
    forms[base[0].rpartition(":")[2] if ":" in base[0] else "text"].append(base)
  form = rng.choice(["text", "text", "bytecode", "artifact"])
  name, data = rng.choice(forms[form])
  names = []
  for _ in range(rng.choice([1, 1, 1, 2, 3])):
    data, kind = mutate(data, rng)
    names.append(kind)
  return Case(f"{name}+{'+'.join(names)}", data, random_flags(rng))


def random_flags(rng: random.Random) -> str:
  """Flags for a random scheme the pass accepts: every algorithm, format, rotation."""
  from equarx_pass.planning import policy

  while True:
    flags = " ".join(
      [
        "--equarx_enable --equarx_min_bytes=0",
        f"--equarx_block_size={rng.choice((0,) + BLOCK_SIZES)}",  # 0: the default
        f"--equarx_algorithm={rng.choice(policy.ALGORITHMS)}",
        f"--equarx_format={rng.choice(policy.FORMATS)}",
        f"--equarx_rotation={rng.choice(policy.ROTATIONS)}",
        f"--equarx_block_layout={rng.choice(policy.BLOCK_LAYOUTS)}",
        f"--equarx_microshards={rng.choice([1, 1, 2, 4])}",
        f"--equarx_rounding={rng.choice(policy.ROUNDINGS)}",
        f"--equarx_ops={rng.choice(['all_reduce', 'all_reduce,reduce_scatter,all_gather'])}",
      ]
    )
    try:
      policy.Policy.from_flags(flags)
    except ValueError:  # FlagError: an inconsistent combination; draw again
      continue
    return flags


# --- the worker: one case at a time, in a child process --------------------------


def check_rewrite(data: bytes, path: str, result, policy) -> str | None:
  """Why a successful transform of `data` emitted an invalid module, or None."""
  from equarx_pass.errors import EquarxError
  from equarx_pass.frontends import transform
  from equarx_pass.ir import parse
  from equarx_pass.planning.match import find_all_reduces

  try:
    out = parse.parse_bytes(result.text, path + " (output)").module
  except EquarxError as e:
    return f"the output does not parse: {e}"
  before = len(find_all_reduces(parse.parse_bytes(data, path).module))
  after = len(find_all_reduces(out))
  rewritten = sum(r.rewritten for r in result.records)
  if len(result.records) != before:
    return f"{len(result.records)} records for {before} all-reduces"
  if after != before - rewritten:
    return f"{before} all-reduces, {rewritten} rewritten, but {after} left in the output"
  if rewritten and not any(
    f"stablehlo.{op}" in result.text for op in ("collective_permute", "all_to_all", "all_gather")
  ):
    return "sites rewritten but the output has no collective that replaces them"
  try:
    again = transform.transform_text(result.text, policy, path + " (output)")
  except EquarxError as e:
    return f"the output, fed back in, fails: {e}"
  if any(r.rewritten for r in again.records):
    return "the output, fed back in, has sites to rewrite again"
  return None


def run_one(case_path: str) -> dict:
  """Transform one saved case; classify what happened."""
  from equarx_pass.errors import CompileError, EquarxError, ParseError, RewriteError, VerifyError
  from equarx_pass.frontends import transform
  from equarx_pass.planning.policy import Policy

  with open(case_path + ".json") as f:
    meta = json.load(f)
  with open(case_path, "rb") as f:
    data = f.read()
  if data.startswith(ABORT_MARKER):
    os.abort()
  path = meta["path"]
  policy = Policy.from_flags(meta["flags"])
  try:
    result = transform.transform_text(data, policy, path)
  except EquarxError as e:
    if not str(e).startswith(path) or (isinstance(e, ParseError) and e.path != path):
      return {"outcome": "invalid", "detail": f"error message does not name {path}: {e}"}
    if isinstance(e, (RewriteError, VerifyError, CompileError)):
      # Not the input's fault: the pass could not handle a module it accepted.
      return {"outcome": "internal_error", "detail": f"{type(e).__name__}: {e}"}
    return {"outcome": "clean_error", "detail": f"{type(e).__name__}: {str(e)[:200]}"}
  except Exception as e:  # noqa: BLE001 -- any other exception is the bug being looked for
    return {"outcome": "crash", "detail": f"Python {type(e).__name__}: {str(e)[:300]}"}
  problem = check_rewrite(data, path, result, policy)
  if problem:
    return {"outcome": "invalid", "detail": problem}
  changed = any(r.rewritten for r in result.records)
  return {
    "outcome": "rewritten" if changed else "unchanged",
    "detail": f"{sum(r.rewritten for r in result.records)} of {len(result.records)} sites",
  }


def worker_main() -> None:
  """Read case paths from stdin, answer one JSON line each."""
  import equarx_pass  # noqa: F401 -- import before the first case, not during it

  for line in sys.stdin:
    try:
      answer = run_one(line.strip())
    except Exception as e:  # noqa: BLE001 -- e.g. from checking the output: still a crash
      answer = {"outcome": "crash", "detail": f"Python {type(e).__name__}: {str(e)[:300]}"}
    print(json.dumps(answer), flush=True)


# --- the driver --------------------------------------------------------------------


def _worker_env() -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("EQUARX_FLAGS", None)
  return env


class _Worker:
  def __init__(self):
    self.proc = subprocess.Popen(
      [sys.executable, os.path.abspath(__file__), "--worker"],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL,
      env=_worker_env(),
      text=True,
    )
    self.case = None  # index of the case in flight
    self.started = 0.0

  def send(self, index: int, path: str) -> None:
    self.case, self.started = index, time.monotonic()
    self.proc.stdin.write(path + "\n")
    self.proc.stdin.flush()

  def kill(self) -> None:
    self.proc.kill()
    self.proc.wait()


def _crash_detail(proc: subprocess.Popen) -> str:
  code = proc.wait()
  if code < 0:
    import signal

    return f"worker killed by {signal.Signals(-code).name}"
  return f"worker exited with status {code}"


def run_cases(
  cases: list[Case],
  jobs: int = 2,
  timeout: float = 120.0,
  workdir: str | None = None,
  confirm: bool = True,
  progress=None,
) -> list[Result]:
  """Run every case in worker processes; one Result per case, in order."""
  own_dir = workdir is None
  workdir = workdir or tempfile.mkdtemp(prefix="equarx-fuzz-")
  paths = []
  for i, case in enumerate(cases):
    path = os.path.join(workdir, f"case{i:06d}")
    with open(path, "wb") as f:
      f.write(case.data)
    with open(path + ".json", "w") as f:
      json.dump({"path": f"case{i:06d}.in", "flags": case.flags, "name": case.name}, f)
    paths.append(path)
  results: list[Result | None] = [None] * len(cases)
  pending = collections.deque(range(len(cases)))
  sel = selectors.DefaultSelector()
  workers: list[_Worker] = []

  def start_worker():
    w = _Worker()
    workers.append(w)
    sel.register(w.proc.stdout, selectors.EVENT_READ, w)
    feed(w)

  def feed(w):
    if pending:
      i = pending.popleft()
      w.send(i, paths[i])
    else:
      w.case = None

  def retire(w, outcome_detail):
    sel.unregister(w.proc.stdout)
    workers.remove(w)
    results[w.case] = Result("crash", outcome_detail)
    w.kill()

  try:
    for _ in range(min(jobs, len(cases))):
      start_worker()
    while any(w.case is not None for w in workers):
      for key, _ in sel.select(timeout=1.0):
        w = key.data
        line = w.proc.stdout.readline()
        if not line:  # the worker died while running its case
          retire(w, _crash_detail(w.proc))
          if pending:
            start_worker()
          continue
        answer = json.loads(line)
        results[w.case] = Result(answer["outcome"], answer["detail"])
        answer["seconds"] = round(time.monotonic() - w.started, 2)
        if progress:
          progress(w.case, answer)
        feed(w)
      now = time.monotonic()
      for w in list(workers):
        if w.case is not None and now - w.started > timeout:
          retire(w, f"no answer within {timeout:.0f} s")
          if pending:
            start_worker()
  finally:
    for w in workers:
      w.proc.stdin.close()
      w.kill()
    sel.close()
  if confirm:
    for i, r in enumerate(results):
      if r.outcome == "crash" and r.detail.startswith(("worker", "no answer")):
        again = run_cases([cases[i]], 1, timeout, confirm=False)[0]
        r.reproduced = again.outcome == "crash"
  if own_dir:
    shutil.rmtree(workdir, ignore_errors=True)
  return results


def run_cli(case: Case, workdir: str) -> str | None:
  """equarx-opt on the case as a user runs it: why its behaviour is wrong, or None.

  Exit 0 with an output, or exit 2 with one line on stderr and no output; never
  a traceback or a crash dump; the input untouched.
  """
  src, out = os.path.join(workdir, "input"), os.path.join(workdir, "output.mlir")
  with open(src, "wb") as f:
    f.write(case.data)
  if os.path.exists(out):
    os.unlink(out)
  argv = [sys.executable, "-m", "equarx_pass.frontends.cli", src, "-o", out, *case.flags.split()]
  try:
    proc = subprocess.run(
      argv, capture_output=True, text=True, env=_worker_env(), timeout=600, cwd=workdir
    )
  except subprocess.TimeoutExpired:
    return "equarx-opt did not finish in 600 s"
  with open(src, "rb") as f:
    if f.read() != case.data:
      return "the input was modified"
  if proc.returncode == 0:
    return None if os.path.exists(out) else "exit 0 without an output file"
  if proc.returncode != 2:
    return f"exit status {proc.returncode}: {proc.stderr[-300:]}"
  stderr = without_jax_startup(proc.stderr)
  if not stderr.startswith(f"equarx-opt: error: {src}") or stderr.count("\n") != 1:
    return f"exit 2 but stderr is not one error line naming the input: {proc.stderr[-300:]}"
  if os.path.exists(out):
    return "exit 2 but an output file was written"
  return None


def summarize(results: list[Result]) -> dict:
  counts = collections.Counter(r.outcome for r in results)
  contained = sum(
    r.outcome == "clean_error" and any(c in r.detail for c in CONTAINED) for r in results
  )
  return {
    "cases": len(results),
    "clean_errors": counts["clean_error"],
    "parser_failures_contained": contained,
    "internal_errors": counts["internal_error"],
    "rewrites": counts["rewritten"] + counts["unchanged"],
    "rewrites_with_sites_rewritten": counts["rewritten"],
    "crashes": counts["crash"],
    "invalid_modules": counts["invalid"],
  }


def save_case(directory: str, index: int, case: Case, result: Result | None) -> str:
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, f"case{index:06d}.in")
  with open(path, "wb") as f:
    f.write(case.data)
  with open(path + ".txt", "w") as f:
    f.write(f"case {index}: {case.name}\nflags: {case.flags}\n")
    if result:
      f.write(f"outcome: {result.outcome}\n{result.detail}\n")
      if result.reproduced is not None:
        f.write(f"crashes when run alone: {result.reproduced}\n")
  return path


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--cases", type=int, default=1000)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--jobs", type=int, default=2)
  parser.add_argument(
    "--timeout",
    type=float,
    default=120.0,
    help="seconds per case (parse.py gives its helper 60 s for a small input)",
  )
  parser.add_argument("--only", type=int, help="run (and with --save, write out) just this case")
  parser.add_argument(
    "--save",
    default=os.path.join(tempfile.gettempdir(), "equarx-fuzz"),
    help="where inputs that crashed or gave invalid modules are written",
  )
  parser.add_argument("--json", action="store_true", help="print the counts as one JSON object")
  parser.add_argument(
    "--cli",
    type=int,
    default=0,
    metavar="N",
    help="also run the first N cases through equarx-opt (about 3 s each)",
  )
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    worker_main()
    return 0
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  bases = base_inputs()
  indices = [args.only] if args.only is not None else range(args.cases)
  cases = [make_case(bases, args.seed, i) for i in indices]
  start = time.monotonic()
  # The inputs as they are come first: each must be rewritten, or the mutants
  # test a pass that cannot even read its fixtures.
  flags = "--equarx_enable --equarx_min_bytes=0"
  unmutated = [Case(name, data, flags) for name, data in bases]
  results = run_cases(unmutated + cases, args.jobs, args.timeout)
  base_results, results = results[: len(bases)], results[len(bases) :]
  counts = summarize(results)
  if args.cli:
    from concurrent.futures import ThreadPoolExecutor

    dirs = [tempfile.mkdtemp(prefix="equarx-fuzz-cli-") for _ in range(args.cli)]
    with ThreadPoolExecutor(args.jobs) as pool:
      cli_problems = list(pool.map(run_cli, cases[: args.cli], dirs))
    for d in dirs:
      shutil.rmtree(d, ignore_errors=True)
    counts["cli_cases"] = len(cli_problems)
    counts["cli_failures"] = sum(p is not None for p in cli_problems)
    for i, problem in enumerate(cli_problems):
      if problem:
        results[i] = Result(
          "crash" if results[i].outcome != "invalid" else "invalid", f"equarx-opt: {problem}"
        )
    counts["crashes"] = summarize(results)["crashes"]
  counts["base_inputs"] = len(bases)
  counts["base_inputs_ok"] = sum(r.outcome in ("rewritten", "unchanged") for r in base_results)
  counts["seconds"] = round(time.monotonic() - start, 1)
  failures = []
  for i, case, r in zip(indices, cases, results):
    if r.outcome in ("crash", "invalid") or args.only is not None:
      failures.append((save_case(args.save, i, case, r), case, r))
  bases_failed = [
    (case.name, r)
    for case, r in zip(unmutated, base_results)
    if r.outcome not in ("rewritten", "unchanged")
  ]
  if args.json:
    counts["failures"] = [
      {
        "input": p,
        "case": c.name,
        "outcome": r.outcome,
        "detail": r.detail,
        "reproduced": r.reproduced,
      }
      for p, c, r in failures
    ]
    counts["base_failures"] = [
      {"case": name, "outcome": r.outcome, "detail": r.detail} for name, r in bases_failed
    ]
    print(json.dumps(counts))
  else:
    print(f"equarx fuzz: seed {args.seed}, {counts['seconds']} s")
    for key in (
      "base_inputs",
      "base_inputs_ok",
      "cases",
      "clean_errors",
      "parser_failures_contained",
      "internal_errors",
      "rewrites",
      "rewrites_with_sites_rewritten",
      "crashes",
      "invalid_modules",
      "cli_cases",
      "cli_failures",
    ):
      if key in counts:
        print(f"  {key:30s} {counts[key]}")
    for name, r in bases_failed:
      print(f"  base input {name}: {r.outcome}: {r.detail[:200]}")
    for path, case, r in failures:
      alone = "" if r.reproduced is None else f" (alone: {'crashes' if r.reproduced else 'fine'})"
      print(f"  {r.outcome}: {path}  [{case.name}] {r.detail[:200]}{alone}")
  return 1 if counts["crashes"] or counts["invalid_modules"] or bases_failed else 0


if __name__ == "__main__":
  sys.exit(main())
