"""The benchmark suite's entry point: `python -m tools` lists every tool, each one's --help works.

Only the help texts run here, no benchmark.  tools/ is in the repository, not the sdist:
without it the tests skip.
"""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools")
# Modules the tools import, not tools of their own.
LIBRARIES = {"__init__", "__main__", "benchlib", "flax_examples"}

pytestmark = pytest.mark.skipif(
  not os.path.isdir(TOOLS), reason="tools/ is not in the sdist: run from a checkout"
)


def run_tools(*args: str) -> subprocess.Popen:
  env = dict(os.environ)
  # `python -m tools` finds the package in the working directory, which PYTHONSAFEPATH=1
  # (as .ci/run sets it) keeps off sys.path.
  env.pop("PYTHONSAFEPATH", None)
  return subprocess.Popen(
    [sys.executable, "-m", "tools", *args],
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )


def listed_subcommands() -> list[str]:
  out, _ = run_tools("--help").communicate(timeout=60)
  return re.findall(r"^  (\w+)  ", out, re.M)


def test_help_lists_every_tool():
  scripts = {f[:-3] for f in os.listdir(TOOLS) if f.endswith(".py")} - LIBRARIES
  listed = listed_subcommands()
  assert len(listed) == len(set(listed))
  assert set(listed) == scripts


def test_every_subcommand_help_exits_0():
  # Side by side: most help texts take 0.1 s, a few import JAX first (about 2 s).
  procs = {name: run_tools(name, "--help") for name in listed_subcommands()}
  failed = {}
  for name, proc in procs.items():
    out, _ = proc.communicate(timeout=120)
    if proc.returncode != 0 or "usage:" not in out:
      failed[name] = f"exit {proc.returncode}: {out[-1000:]}"
  assert not failed, failed


def test_unknown_subcommand_fails():
  proc = run_tools("no_such_tool")
  out, _ = proc.communicate(timeout=60)
  assert proc.returncode == 2 and "unknown subcommand" in out


# The result files' envelope, as tools/README.md gives it (benchlib.write_result writes it).
ENVELOPE = ["schema", "tool", "command", "created", "equarx_version", "jax_version", "machine"]


def test_result_files_share_the_envelope():
  results = os.path.join(ROOT, "results")
  if not os.path.isdir(results):
    pytest.skip("results/ is not in the sdist")
  paths = [
    os.path.join(folder, f)
    for folder, _, files in os.walk(results)
    for f in files
    if f.endswith(".json")
  ]
  assert paths
  for path in paths:
    with open(path) as f:
      data = json.load(f)
    name = os.path.relpath(path, ROOT)
    assert list(data)[: len(ENVELOPE)] == ENVELOPE, name
    assert data["schema"] == "equarx-bench/1", name
    rows = data["results"]
    assert isinstance(rows, list) and all(isinstance(r, dict) for r in rows), name


def test_tools_import_only_what_the_package_has():
  """Every `from equarx_pass... import name` in tools/, function-level ones included,
  names a module and an attribute that exist: a tool's rarely run path (a table's last
  column, a TPU-only branch) must not break silently when the package moves."""
  import ast
  import importlib

  missing = []
  for name in sorted(os.listdir(TOOLS)):
    if not name.endswith(".py"):
      continue
    tree = ast.parse(open(os.path.join(TOOLS, name)).read())
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("equarx_pass"):
        module = importlib.import_module(node.module)
        for alias in node.names:
          if not hasattr(module, alias.name):
            try:
              importlib.import_module(f"{node.module}.{alias.name}")
            except ImportError:
              missing.append(f"tools/{name}:{node.lineno}: {node.module}.{alias.name}")
      elif isinstance(node, ast.Import):
        for alias in node.names:
          if alias.name.startswith("equarx_pass"):
            try:
              importlib.import_module(alias.name)
            except ImportError:
              missing.append(f"tools/{name}:{node.lineno}: {alias.name}")
  assert not missing, "\n".join(missing)
