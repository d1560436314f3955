"""equarx-opt: rewrite the all-reduces of a jax.export artifact, StableHLO or XLA HLO file.

    equarx-opt INPUT -o OUTPUT [--output_format=F] [--report] [--equarx_* flags]

INPUT: a jax.export artifact (`Exported.serialize()` saved to a file), StableHLO as
MLIR text or bytecode (e.g. `jitted.lower(...).as_text()` saved to a file, the
module.mlir that --xla_dump_to writes, or an artifact's module alone), or XLA HLO
text (module_NNNN.jit_f.before_optimizations.txt).
OUTPUT (`-` or no -o: stdout), by --output_format: `exported`, a jax.export artifact
with the rewritten module and every other field of the input's (for an artifact
only; jax.export.deserialize(data).call(...) runs it); `stablehlo`, MLIR text that
parses and verifies; `hlo`, XLA's HLO text, which XLA's tools read.  `auto`: from
OUTPUT's suffix (.hlo or .txt: hlo; .mlir: stablehlo), else an artifact for an
artifact and StableHLO text for the rest.

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

from equarx_pass import report
from equarx_pass.errors import EquarxError
from equarx_pass.frontends import exported, transform
from equarx_pass.planning import policy as policy_lib

FLAGS = flags.FLAGS
flags.DEFINE_string("output", None, "output file; '-' or unset: stdout", short_name="o")
OUTPUT_FORMAT_HELP = (
  "exported (a jax.export artifact; for an artifact), stablehlo (MLIR text) or hlo "
  "(XLA's HLO text); auto: by OUTPUT's suffix (.hlo, .txt: hlo; .mlir: stablehlo), "
  "else exported for an artifact, stablehlo for the rest"
)
flags.DEFINE_string("output_format", "auto", OUTPUT_FORMAT_HELP)
flags.DEFINE_boolean("report", False, "print the site table (stderr when the output is stdout)")
# Every --equarx_* flag comes from the one table in policy.py.
for _flag in policy_lib.FLAGS.values():
  if _flag.is_bool:
    flags.DEFINE_boolean(_flag.name, None, _flag.help.replace("`", ""))
  else:
    flags.DEFINE_string(_flag.name, None, _flag.help.replace("`", ""))

EXIT_BAD_INPUT = 2
# Virtual CPU devices this command starts for an artifact's partitioned route at most.
MAX_CPU_DEVICES = 4096


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
  to_stdout = output in (None, "-")
  try:
    policy = policy_from_command_line()
    output_format = transform.output_format_for(FLAGS.output_format, output)
    data = _read(input_path)
    _start_jax(data)
    if to_stdout:
      result = transform.transform_text(data, policy, input_path, output_format)
    else:
      result = transform.transform_file(input_path, output, policy, output_format)
  except EquarxError as e:
    return _fail(str(e))
  # The report goes beside the program: on stderr when the program is on stdout.
  notes = sys.stderr if to_stdout else sys.stdout
  try:
    if to_stdout:
      if isinstance(result.output, bytes):
        if sys.stdout.isatty():
          return _fail(
            f"{input_path}: the output is a binary jax.export artifact; give -o FILE, or "
            "--output_format=stablehlo or hlo for text"
          )
        sys.stdout.flush()
        sys.stdout.buffer.write(result.output)
      else:
        sys.stdout.write(result.output)
    if FLAGS.report or policy.report:
      print(_report(result, input_path), file=notes)
    if result.tpu is not None:
      print(result.tpu.summary(), file=notes)
    sys.stdout.flush()
  except OSError as e:  # a full disk, a closed pipe
    # Python would try to flush again at exit and print a traceback.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return _fail(f"cannot write to standard output: {e.strerror}")
  return 0


def _report(result: transform.TransformResult, input_path: str) -> str:
  """The site table; for an artifact one per module it holds (its function's, its VJPs')."""
  if not result.parts:
    title = f"{input_path} ({result.input_kind}, pass {result.pass_seconds * 1e3:.1f} ms)"
    return report.format_table(result.records, title, result.topology)
  tables = []
  for part in result.parts:
    how = f"pass {part.pass_seconds * 1e3:.1f} ms"
    if part.route == "partitioned":
      how = f"partitioned program, {how}, partitioning compile {part.first_compile_seconds:.2f} s"
    title = f"{input_path} ({result.input_kind}, {part.name}: {how})"
    tables.append(report.format_table(part.records, title, part.topology))
    if part.unseen:
      tables[-1] += f"\nnot considered: {part.unseen}"
  return "\n\n".join(tables)


def _start_jax(data: bytes) -> None:
  """JAX on the CPU, with as many devices as an artifact runs on.

  This command compiles nothing on an accelerator (a TPU compile runs in a child), but
  an auto-sharded artifact is compiled here on CPU devices (exported.py).  JAX has read
  the environment when it was imported, so the defaults go into its config, which it
  reads when it starts a backend, as the demo does.
  """
  import jax

  try:
    if not os.environ.get("JAX_PLATFORMS"):
      os.environ["JAX_PLATFORMS"] = "cpu"
      jax.config.update("jax_platforms", "cpu")
    count = exported.device_count(data)
    if count is not None and 1 < count <= MAX_CPU_DEVICES:
      jax.config.update("jax_num_cpu_devices", count)
  except RuntimeError:
    pass  # a backend is up already (main called in-process): the route says if too few


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
  lines.append("  --output_format=F")
  lines.append(f"      {OUTPUT_FORMAT_HELP}")
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
