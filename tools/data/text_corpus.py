"""A real English text corpus that every Python install has: the standard library's own
docstrings and comments.

    import text_corpus
    corpus = text_corpus.build()          # about 10 s; deterministic for one Python build
    corpus.train, corpus.heldout          # uint8 arrays (byte-level tokens, vocab 256)
    corpus.digest                         # sha256 of the corpus bytes: compare runs with it

    python tools/data/text_corpus.py      # prints the corpus's size, digest and a sample

What it reads: for every name in sys.stdlib_module_names (sorted), the module's source
file under sysconfig's "stdlib" directory, or for a package every .py file below it
(sorted; test directories, which hold fixtures and deliberately broken files, and the
generated codec tables of `encodings` left out).
From each file, parsed with ast and tokenize (nothing is imported): the docstrings of the
module, its classes and functions, and its comments (consecutive comment lines joined
into one paragraph), in source order. Files that do not parse are skipped, and so are
comment lines of no letters (rulers such as "####").

The text is UTF-8 bytes; the tokens are the bytes (vocab 256). The split is fixed: the
last `heldout_fraction` (default 5%) of the bytes are held out, so the held-out text is
modules the model never trained on (the end of the alphabet: xml, zipfile, zoneinfo, ...).
Python versions and distributions ship different standard libraries, so the corpus, and
its digest, are the same for one Python build, not across all of them.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import io
import os
import sys
import sysconfig
import tokenize

import numpy as np

# Directories under a stdlib package that hold tests and their fixtures, not library code.
SKIP_DIRS = frozenset({"test", "tests", "idle_test", "__pycache__", "site-packages"})
# Modules that are generated tables, not text: the codecs' charmaps ("0x74 -> LATIN CAPITAL
# LETTER E WITH GRAVE", a fifth of the bytes otherwise).
SKIP_MODULES = frozenset({"encodings"})


@dataclasses.dataclass(frozen=True)
class Corpus:
  data: np.ndarray  # uint8, the whole corpus
  split: int  # data[:split] is train, data[split:] held out
  digest: str  # sha256 of data
  files: int  # source files read
  skipped: int  # files that did not parse
  source: str  # where it came from

  @property
  def train(self) -> np.ndarray:
    return self.data[: self.split]

  @property
  def heldout(self) -> np.ndarray:
    return self.data[self.split :]

  def describe(self) -> dict:
    return dict(
      source=self.source,
      bytes=int(self.data.size),
      train_bytes=int(self.split),
      heldout_bytes=int(self.data.size - self.split),
      sha256=self.digest,
      files=self.files,
      skipped_files=self.skipped,
      python=sys.version.split()[0],
    )


def stdlib_files() -> list[str]:
  """The standard library's source files, in a stable order."""
  root = sysconfig.get_paths()["stdlib"]
  out = []
  for name in sorted(sys.stdlib_module_names - SKIP_MODULES):
    path = os.path.join(root, name)
    if os.path.isfile(path + ".py"):
      out.append(path + ".py")
    elif os.path.isfile(os.path.join(path, "__init__.py")):
      for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        out.extend(os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py"))
  return out


def _docstrings(tree: ast.Module) -> list[tuple[int, str]]:
  out = []
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      doc = ast.get_docstring(node, clean=True)
      if doc and node.body:
        out.append((node.body[0].lineno, doc.strip()))
  return out


def _comments(source: str) -> list[tuple[int, str]]:
  """Comment paragraphs: runs of comment tokens on consecutive lines, '#' stripped."""
  out: list[tuple[int, str]] = []
  last_line, lines, first = -2, [], 0
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type != tokenize.COMMENT:
      continue
    text = tok.string.lstrip("#!").strip()
    row = tok.start[0]
    if not any(c.isalpha() for c in text) or text.startswith(("-*-", "coding", "noqa", "type:")):
      continue
    if row != last_line + 1 and lines:
      out.append((first, " ".join(lines)))
      lines = []
    if not lines:
      first = row
    lines.append(text)
    last_line = row
  if lines:
    out.append((first, " ".join(lines)))
  return out


def file_text(path: str) -> str | None:
  """The docstrings and comments of one source file, in source order; None if it does
  not parse."""
  try:
    with open(path, "rb") as f:
      raw = f.read()
    source = raw.decode(tokenize.detect_encoding(io.BytesIO(raw).readline)[0])
    pieces = _docstrings(ast.parse(source)) + _comments(source)
  except (SyntaxError, UnicodeDecodeError, ValueError, tokenize.TokenError):
    return None
  pieces.sort(key=lambda p: p[0])  # stable: a docstring before a comment on its line
  return "\n\n".join(text for _, text in pieces)


def build(heldout_fraction: float = 0.05) -> Corpus:
  """The corpus (see the module docstring)."""
  texts, skipped = [], 0
  files = stdlib_files()
  for path in files:
    text = file_text(path)
    if text is None:
      skipped += 1
    elif text:
      texts.append(text)
  data = np.frombuffer("\n\n".join(texts).encode("utf-8"), np.uint8)
  split = int(round(data.size * (1 - heldout_fraction)))
  return Corpus(
    data=data,
    split=split,
    digest=hashlib.sha256(data.tobytes()).hexdigest(),
    files=len(files) - skipped,
    skipped=skipped,
    source=f"docstrings and comments of the Python {sys.version.split()[0]} standard library "
    f"({sysconfig.get_paths()['stdlib']})",
  )


def main() -> None:
  import time

  start = time.perf_counter()
  corpus = build()
  print(f"built in {time.perf_counter() - start:.1f} s")
  for k, v in corpus.describe().items():
    print(f"{k}: {v}")
  for at in (corpus.split // 3, corpus.split + 1000):
    print(f"--- bytes {at}..{at + 300}:")
    print(corpus.data[at : at + 300].tobytes().decode("utf-8", "replace"))


if __name__ == "__main__":
  main()
