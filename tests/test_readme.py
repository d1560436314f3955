"""README.md and the docs cannot drift: their marked code blocks run as written.

A marked block is the fenced block right after the line `<!-- readme-test -->` in
README.md, or `<!-- docs-test -->` in a page under docs/: a
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
DOCS_MARKER = "<!-- docs-test -->"


def marked_blocks(path: str, marker: str) -> list[tuple[str, str, str]]:
  """(file:line, language, code) of every block marked with `marker` in `path`."""
  name = os.path.relpath(path, ROOT)
  lines = open(path).read().splitlines()
  blocks = []
  for i, line in enumerate(lines):
    if line.strip() != marker:
      continue
    fence = re.fullmatch(r"```(\w+)", lines[i + 1].strip())
    assert fence, f"{name}:{i + 1}: {marker} must be followed by a ```python or ```bash block"
    end = lines.index("```", i + 2)
    blocks.append((f"{name}:{i + 3}", fence.group(1), "\n".join(lines[i + 2 : end]) + "\n"))
  return blocks


def _doc_pages() -> list[str]:
  pages = []
  for folder, _, files in os.walk(os.path.join(ROOT, "docs")):
    pages += [os.path.join(folder, f) for f in files if f.endswith(".md")]
  return sorted(pages)


BLOCKS = marked_blocks(README, MARKER)
DOC_BLOCKS = [b for page in _doc_pages() for b in marked_blocks(page, DOCS_MARKER)]


def test_readme_has_runnable_blocks():
  assert {lang for _, lang, _ in BLOCKS} == {"python", "bash"}
  assert DOC_BLOCKS, "no docs page has a block marked " + DOCS_MARKER


def test_ci_runs_the_readme_test_command():
  readme = open(README).read()
  ci = open(os.path.join(ROOT, ".ci", "run")).read().splitlines()
  assert "```bash\npython -m pytest -q\n```" in readme
  assert ci[-1] == "python -m pytest -q"


@pytest.mark.parametrize(
  "line,lang,code", BLOCKS + DOC_BLOCKS, ids=[b[0] for b in BLOCKS + DOC_BLOCKS]
)
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
    pytest.fail(f"{line}: cannot run a ```{lang} block")
  proc = subprocess.run(
    cmd, input=code, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
  )
  assert proc.returncode == 0, (
    f"{line} ({lang}) failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
  )
