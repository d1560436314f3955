"""One source for the flags: `equarx-opt --help`, README.md's flag table and the docs'
flag reference all come from equarx_pass.policy.FLAGS, and these tests keep them so.

After changing a flag, rewrite README.md's table with
    python -c "from equarx_pass.policy import flags_markdown; print(flags_markdown())"
(the docs site renders the same function's table when it is built).
"""

import os
import re
import subprocess
import sys

from equarx_pass import policy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = (
  "<!-- flag-table: equarx_pass.policy.flags_markdown() verbatim; tests/test_flag_docs.py -->"
)


def _words(text: str) -> str:
  return " ".join(text.replace("`", "").split())


def test_readme_flag_table_is_the_generated_one():
  readme = open(os.path.join(ROOT, "README.md")).read()
  assert readme.count(MARKER) == 1, f"README.md needs the line {MARKER!r} above its flag table"
  table = readme.split(MARKER + "\n", 1)[1].split("\n\n", 1)[0] + "\n"
  assert table == policy.flags_markdown(), (
    "README.md's flag table differs from policy.flags_markdown(); regenerate it (see "
    "this test's docstring)"
  )


def test_docs_flag_page_renders_the_generated_table():
  page = open(os.path.join(ROOT, "docs", "flags.md")).read()
  assert re.search(r"^```\{equarx-flag-table\}\n```$", page, re.M), page[:500]


def test_help_shows_every_flag_with_its_table_text():
  proc = subprocess.run(
    [sys.executable, "-m", "equarx_pass.cli", "--help"], capture_output=True, text=True
  )
  assert proc.returncode == 0, proc.stderr
  shown = _words(proc.stdout)
  for flag in policy.FLAGS.values():
    assert flag.syntax in proc.stdout, flag.name
    if flag.name == "equarx_enable":  # on by default in the CLI; its own line says so
      continue
    assert _words(f"{flag.help} (default: {flag.default_text()})") in shown, flag.name
