"""README.md cannot drift: its code blocks marked `<!-- readme-test -->` run as written.

A marked block is the fenced block right after the line `<!-- readme-test -->`: a
```python block runs with this Python, a ```bash block with bash -euo pipefail and this
environment's scripts (equarx-opt) first on PATH.  Each runs in its own process in a
scratch directory that links hlo_fixtures/, so the blocks may write files.  Keep the
marked blocks fast: all of them together take well under 30 s.
"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
MARKER = "<!-- readme-test -->"


def marked_blocks() -> list[tuple[int, str, str]]:
  """(line number, language, code) of every marked block."""
  lines = open(README).read().splitlines()
  blocks = []
  for i, line in enumerate(lines):
    if line.strip() != MARKER:
      continue
    fence = re.fullmatch(r"```(\w+)", lines[i + 1].strip())
    assert fence, f"README.md:{i + 1}: {MARKER} must be followed by a ```python or ```bash block"
    end = lines.index("```", i + 2)
    blocks.append((i + 3, fence.group(1), "\n".join(lines[i + 2 : end]) + "\n"))
  return blocks


BLOCKS = marked_blocks()


def test_readme_has_runnable_blocks():
  assert {lang for _, lang, _ in BLOCKS} == {"python", "bash"}


def test_ci_runs_the_readme_test_command():
  readme = open(README).read()
  ci = open(os.path.join(ROOT, ".ci", "run")).read().splitlines()
  assert "```bash\npython -m pytest -q\n```" in readme
  assert ci[-1] == "python -m pytest -q"


@pytest.mark.parametrize("line,lang,code", BLOCKS, ids=[f"README.md:{b[0]}" for b in BLOCKS])
def test_readme_block_runs(line, lang, code, tmp_path):
  os.symlink(os.path.join(ROOT, "hlo_fixtures"), tmp_path / "hlo_fixtures")
  env = dict(os.environ)
  env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
  env.pop("EQUARX_FLAGS", None)
  if lang == "python":
    cmd = [sys.executable, "-"]
  elif lang == "bash":
    cmd = ["bash", "-euo", "pipefail", "-s"]
  else:
    pytest.fail(f"README.md:{line}: cannot run a ```{lang} block")
  proc = subprocess.run(
    cmd, input=code, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
  )
  assert proc.returncode == 0, (
    f"README.md:{line} ({lang}) failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
  )
