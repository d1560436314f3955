"""One source for the flags: `equarx-opt --help` and the docs' flag reference both come
from equarx_pass.planning.policy.FLAGS (the docs site renders `flags_markdown()` when it is built),
and every flag README.md and the docs pages name is a real one.
"""

import os
import re
import subprocess
import sys

from equarx_pass.planning import policy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _words(text: str) -> str:
  return " ".join(text.replace("`", "").split())


def test_readme_names_only_flags_that_exist():
  """The front page quotes flags without a table; each must be a real flag."""
  readme = open(os.path.join(ROOT, "README.md")).read()
  named = set(re.findall(r"--(?:no)?(equarx_\w+)", readme))
  assert named, "README.md names no flag"
  unknown = sorted(named - set(policy.FLAGS))
  assert not unknown, f"README.md names flags that do not exist: {unknown}"


def test_docs_name_only_flags_that_exist():
  pages = [os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))]
  pages += [
    os.path.join(ROOT, "docs", "guides", f)
    for f in os.listdir(os.path.join(ROOT, "docs", "guides"))
  ]
  for page in (p for p in pages if p.endswith(".md")):
    named = set(re.findall(r"--(?:no)?(equarx_\w+)", open(page).read()))
    unknown = sorted(named - set(policy.FLAGS))
    assert not unknown, f"{os.path.relpath(page, ROOT)} names flags that do not exist: {unknown}"


def test_docs_flag_page_renders_the_generated_table():
  page = open(os.path.join(ROOT, "docs", "flags.md")).read()
  assert re.search(r"^```\{equarx-flag-table\}\n```$", page, re.M), page[:500]


def test_help_shows_every_flag_with_its_table_text():
  proc = subprocess.run(
    [sys.executable, "-m", "equarx_pass.frontends.cli", "--help"], capture_output=True, text=True
  )
  assert proc.returncode == 0, proc.stderr
  shown = _words(proc.stdout)
  for flag in policy.FLAGS.values():
    assert flag.syntax in proc.stdout, flag.name
    if flag.name == "equarx_enable":  # on by default in the CLI; its own line says so
      continue
    assert _words(f"{flag.help} (default: {flag.default_text()})") in shown, flag.name
