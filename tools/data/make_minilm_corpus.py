"""Writes equarx_pass/examples/minilm_corpus.txt, the MiniLM example's default sentences.

    python tools/data/make_minilm_corpus.py [--count 256] [--out equarx_pass/examples/minilm_corpus.txt]

The sentences are English prose from the Python Language Reference as it ships
with CPython (Lib/pydoc_data/topics.py, the text `help("assert")` prints),
Copyright Python Software Foundation, PSF License Version 2.  This project wrote
none of them.  Code samples, grammar rules and indented blocks are left out; of
the sentences that remain (8 to 40 words, ending in a full stop), `--count` are
taken evenly spaced through the topics in sorted order, so they cover many
subjects.  The output depends on the Python version; its header names it.
"""

from __future__ import annotations

import argparse
import os
import platform
import pydoc_data.topics
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_OUT = os.path.join(ROOT, "equarx_pass", "examples", "minilm_corpus.txt")

# A sentence ends at . ! or ? followed by space and a capital letter; abbreviations
# such as "e.g." are followed by a lower-case word, so they do not split.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"(])")


def prose_paragraphs(text: str):
  """Paragraphs of running text: not indented (code, grammar), not headings."""
  for block in re.split(r"\n\s*\n", text):
    lines = block.split("\n")
    if any(line.startswith(" ") for line in lines):
      continue
    if len(lines) > 1 and set(lines[1].strip()) <= set("*=-~^"):
      continue  # a heading and its underline
    yield " ".join(line.strip() for line in lines)


def good_sentence(s: str) -> bool:
  words = s.split()
  if not 8 <= len(words) <= 40 or not s.endswith("."):
    return False
  if any(mark in s for mark in ("::=", ">>>", "__", "()", "[", "{", "*")):
    return False  # code and grammar, not English
  letters = sum(c.isalpha() or c == " " for c in s)
  return letters / len(s) > 0.9


def sentences() -> list[str]:
  seen, out = set(), []
  for key in sorted(pydoc_data.topics.topics):
    for para in prose_paragraphs(pydoc_data.topics.topics[key]):
      for s in _SENTENCE_END.split(para):
        s = s.strip()
        if good_sentence(s) and s not in seen:
          seen.add(s)
          out.append(s)
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--count", type=int, default=256)
  parser.add_argument("--out", default=DEFAULT_OUT)
  args = parser.parse_args()
  pool = sentences()
  if len(pool) < args.count:
    raise SystemExit(f"only {len(pool)} sentences found, asked for {args.count}")
  picked = [pool[i * len(pool) // args.count] for i in range(args.count)]
  header = [
    f"# {args.count} English sentences from the Python Language Reference as shipped with",
    f"# CPython {platform.python_version()} (Lib/pydoc_data/topics.py), Copyright Python Software",
    "# Foundation, PSF License Version 2.  Not written by this project; extracted by",
    "# tools/data/make_minilm_corpus.py.  One sentence per line; '#' lines are comments.",
  ]
  with open(args.out, "w") as f:
    f.write("\n".join(header + picked) + "\n")
  print(f"wrote {args.count} of {len(pool)} sentences to {args.out}")


if __name__ == "__main__":
  main()
