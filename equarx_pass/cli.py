"""equarx-opt: rewrite the all-reduces of a dumped StableHLO or XLA HLO file.

    equarx-opt INPUT -o OUTPUT [--report] [--equarx_* flags]

INPUT: StableHLO as MLIR text or bytecode (e.g. `jitted.lower(...).as_text()`
saved to a file, or the module.mlir that --xla_dump_to writes), a jax.export
portable artifact, or XLA HLO text (module_NNNN.jit_f.before_optimizations.txt).
OUTPUT: StableHLO text that parses and verifies; `-` or no -o for stdout.

The pass is on by default here (rewriting is this command's only job);
--noequarx_enable only converts and reports.  $EQUARX_FLAGS applies first, then
the command line.  Exit status: 0 done, 2 bad input, flags or output (nothing
written, input untouched).
"""

# All the work is in transform.py; this is a thin main.

from __future__ import annotations

import os
import sys
import textwrap

from absl import app, flags

from equarx_pass import policy as policy_lib
from equarx_pass import report, transform
from equarx_pass.errors import EquarxError

FLAGS = flags.FLAGS
flags.DEFINE_string("output", None, "output file; '-' or unset: stdout", short_name="o")
flags.DEFINE_boolean("report", False, "print the site table (stderr when the output is stdout)")
# Every --equarx_* flag comes from the one table in policy.py.
for _flag in policy_lib.FLAGS.values():
  if _flag.is_bool:
    flags.DEFINE_boolean(_flag.name, None, _flag.help.replace("`", ""))
  else:
    flags.DEFINE_string(_flag.name, None, _flag.help.replace("`", ""))

EXIT_BAD_INPUT = 2


def _fail(message: str) -> int:
  print(f"equarx-opt: error: {message}", file=sys.stderr)
  return EXIT_BAD_INPUT


def policy_from_command_line(environ=None) -> policy_lib.Policy:
  """enable=True, then $EQUARX_FLAGS, then the --equarx_* flags given here."""
  environ = os.environ if environ is None else environ
  policy = policy_lib.apply_flags(
    policy_lib.Policy(enable=True), environ.get(policy_lib.ENV_VAR, "")
  )
  changes = {}
  for flag in policy_lib.FLAGS.values():
    value = FLAGS[flag.name].value
    if value is None:
      continue
    changes[flag.field] = value if isinstance(value, bool) else flag.parse(flag.name, value)
  return policy.replace(**changes)


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    return _fail(
      "expected exactly one INPUT file; usage: equarx-opt INPUT -o OUTPUT "
      "[--report] [--equarx_* flags]"
    )
  input_path = argv[1]
  output = FLAGS.output
  try:
    policy = policy_from_command_line()
    if output in (None, "-"):
      result = transform.transform_text(_read(input_path), policy, input_path)
    else:
      result = transform.transform_file(input_path, output, policy)
  except EquarxError as e:
    return _fail(str(e))
  to_stdout = output in (None, "-")
  # The report goes beside the program: on stderr when the program is on stdout.
  notes = sys.stderr if to_stdout else sys.stdout
  try:
    if to_stdout:
      sys.stdout.write(result.text)
    if FLAGS.report or policy.report:
      table = report.format_table(
        result.records,
        f"{input_path} ({result.input_kind}, pass {result.pass_seconds * 1e3:.1f} ms)",
      )
      print(table, file=notes)
    if result.tpu is not None:
      print(result.tpu.summary(), file=notes)
    sys.stdout.flush()
  except OSError as e:  # a full disk, a closed pipe
    # Python would try to flush again at exit and print a traceback.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return _fail(f"cannot write to standard output: {e.strerror}")
  return 0


def _read(path: str) -> bytes:
  from equarx_pass.errors import ParseError

  try:
    with open(path, "rb") as f:
      return f.read()
  except OSError as e:
    raise ParseError(f"cannot read input: {e.strerror}", path) from None


def usage() -> str:
  """What --help prints: the command, then every flag of this command."""
  lines = [__doc__.strip(), "", "flags:"]
  lines.append("  -o, --output FILE      output file; '-' or unset: stdout")
  lines.append("  --report               print the site table (stderr when the output is stdout)")
  for flag in policy_lib.FLAGS.values():
    # The text of the flag table (policy.FLAGS), without its Markdown backticks.
    text = f"{flag.help} (default: {flag.default_text()})".replace("`", "")
    if flag.name == "equarx_enable":
      text = "rewrite matching all-reduces (on here; --noequarx_enable converts and reports only)"
    lines.append(f"  {flag.syntax}")
    pad = " " * 6
    lines.extend(
      textwrap.wrap(text, 88, initial_indent=pad, subsequent_indent=pad, break_on_hyphens=False)
    )
  return "\n".join(lines) + "\n"


def _parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, but a bad flag exits 2 like every other bad input, and -h/--help
  print this command's own help (absl's lists only its logging flags)."""
  if any(a in ("-h", "--help", "-help", "--helpshort", "--helpfull") for a in argv[1:]):
    sys.stdout.write(usage())
    sys.exit(0)
  try:
    return FLAGS(argv)
  except flags.Error as e:
    sys.exit(_fail(str(e)))


def run() -> None:
  """Console-script entry point."""
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  run()
