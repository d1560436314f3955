"""A small FileCheck: the core of LLVM FileCheck's directives, for the structural tests.

Directives sit anywhere on a line of the check text (usually after `//`):

  CHECK: p          p matches at or after the end of the previous match
  CHECK-NEXT: p     p matches on the line right after the previous match's line
  CHECK-SAME: p     p matches on the previous match's line, after it
  CHECK-NOT: p      p occurs nowhere between the previous match and the next one
  CHECK-COUNT-n: p  p matches n times in a row, each time like CHECK
  CHECK-LABEL: p    matched first, in order; cuts the output into sections, and the
                    checks after a label only look inside its section

A pattern is literal text (runs of blanks match any run of blanks) with `{{regex}}`
blocks, `[[NAME:regex]]` to capture and `[[NAME]]` to reuse a capture, as in LLVM.
Failures raise CheckError naming the check line and showing the output around it.
"""

from __future__ import annotations

import dataclasses
import re

_DIRECTIVE = re.compile(r"\bCHECK(-[A-Z]+(?:-\d+)?)?:(.*)$")
_KINDS = {None: "CHECK", "-NEXT": "NEXT", "-SAME": "SAME", "-NOT": "NOT", "-LABEL": "LABEL"}
_TOKEN = re.compile(r"\{\{(.*?)\}\}|\[\[([A-Za-z_]\w*)(?::(.*?))?\]\]")


class CheckError(AssertionError):
  pass


@dataclasses.dataclass(frozen=True)
class Check:
  kind: str  # CHECK, NEXT, SAME, NOT, LABEL (COUNT-n is CHECK with count n)
  pattern: str
  where: str  # "file:line: CHECK-...", as written, for messages
  count: int = 1

  def __str__(self):
    return f"{self.where}: {self.pattern}"


def parse_checks(text: str, name: str = "<checks>") -> list[Check]:
  checks = []
  for number, line in enumerate(text.splitlines(), 1):
    m = _DIRECTIVE.search(line)
    if not m:
      continue
    suffix, pattern = m.group(1), m.group(2).strip()
    where = f"{name}:{number}: CHECK{suffix or ''}"
    count = 1
    if suffix and suffix.startswith("-COUNT-"):
      kind, count = "CHECK", int(suffix[len("-COUNT-") :])
    elif suffix in _KINDS:
      kind = _KINDS[suffix]
    else:
      raise CheckError(f"{where}: unknown directive")
    if not pattern:
      raise CheckError(f"{where}: empty pattern")
    if count < 1:
      raise CheckError(f"{where}: the count must be >= 1")
    if kind in ("NEXT", "SAME") and not any(c.kind != "NOT" for c in checks):
      raise CheckError(f"{where}: needs an earlier positive match")
    checks.append(Check(kind, pattern, where, count))
  if not checks:
    raise CheckError(f"{name}: no CHECK directives")
  return checks


def _regex(check: Check, variables: dict[str, str]) -> re.Pattern:
  out, pos = [], 0
  for m in _TOKEN.finditer(check.pattern):
    out.append(_literal(check.pattern[pos : m.start()]))
    regex, var, definition = m.groups()
    if regex is not None:
      out.append(f"(?:{regex})")
    elif definition is not None:
      out.append(f"(?P<{var}>{definition})")
    elif var in variables:
      out.append(re.escape(variables[var]))
    else:
      raise CheckError(f"{check}\n  uses [[{var}]] before any check defines it")
    pos = m.end()
  out.append(_literal(check.pattern[pos:]))
  try:
    return re.compile("".join(out))
  except re.error as e:
    raise CheckError(f"{check}\n  bad regex: {e}") from None


def _literal(text: str) -> str:
  return r"[ \t]+".join(re.escape(part) for part in re.split(r"[ \t]+", text))


def _context(lines: list[str], line: int, radius: int = 3) -> str:
  """The output around `line` (0-based), numbered from 1, `line` marked with '>'."""
  lo, hi = max(0, line - radius), min(len(lines), line + radius + 1)
  return "\n".join(f"  {'>' if i == line else ' '} {i + 1:5d} | {lines[i]}" for i in range(lo, hi))


def run_checks(checks: list[Check], output: str) -> None:
  """Raise CheckError unless `output` satisfies `checks`."""
  lines = output.splitlines()
  variables: dict[str, str] = {}
  # Labels first: each cuts the output at the line where it matches.
  sections, group = [], []
  start, label_line = (0, 0), None
  for check in checks:
    if check.kind == "LABEL":
      line, _, col = _find(check, lines, start, len(lines), variables)
      sections.append((group, start, line, label_line))
      start, label_line, group = (line, col), line, []
    else:
      group.append(check)
  sections.append((group, start, len(lines), label_line))
  for group, begin, end, label_line in sections:
    _run_section(group, lines, begin, end, label_line, variables)


def _run_section(checks, lines, begin, end, matched_line, variables) -> None:
  """Checks in order over lines [begin, end); `matched_line`: the label's line or None."""
  pos, nots = begin, []
  for check in checks:
    if check.kind == "NOT":
      nots.append(check)
      continue
    for _ in range(check.count):
      if check.kind == "NEXT":
        line, col, stop = matched_line + 1, 0, matched_line + 2
      elif check.kind == "SAME":
        line, col, stop = pos[0], pos[1], pos[0] + 1
      else:
        line, col, stop = pos[0], pos[1], end
      found = _find(check, lines, (line, col), min(stop, end), variables, after=matched_line)
      _forbid(nots, lines, pos, found[:2], variables)
      nots = []
      matched_line, pos = found[0], (found[0], found[2])
  _forbid(nots, lines, pos, (end, 0), variables)


def _find(check, lines, start, stop, variables, after=None):
  """(line, start col, end col) of the first match in [start, stop); records captures."""
  regex = _regex(check, variables)
  line, col = start
  while line < stop:
    m = regex.search(lines[line], col)
    if m:
      variables.update({k: v for k, v in m.groupdict().items() if v is not None})
      return line, m.start(), m.end()
    line, col = line + 1, 0
  if check.kind == "NEXT":
    why = f"not on the line after the previous match (output line {after + 1})"
  elif check.kind == "SAME":
    why = f"not on the previous match's line (output line {after + 1}) after the match"
  else:
    why = f"no match at or after output line {start[0] + 1}"
  raise CheckError(
    f"{check}\n  {why}; output there:\n{_context(lines, min(start[0], max(len(lines) - 1, 0)))}"
  )


def _forbid(nots, lines, begin, end, variables) -> None:
  """Each CHECK-NOT must not match in the text from `begin` up to `end` (both (line, col))."""
  for check in nots:
    regex = _regex(check, variables)
    for line in range(begin[0], min(end[0] + 1, len(lines))):
      text = lines[line]
      lo = begin[1] if line == begin[0] else 0
      hi = end[1] if line == end[0] else len(text)
      if regex.search(text[:hi], lo):
        raise CheckError(
          f"{check}\n  forbidden text found on output line {line + 1}:\n{_context(lines, line)}"
        )


def check_text(check_text: str, output: str, name: str = "<checks>") -> None:
  run_checks(parse_checks(check_text, name), output)
