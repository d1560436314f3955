"""Run a Python program with its jax.jit functions going through the pass, unedited.

    EQUARX_FLAGS="--equarx_enable" python -m equarx_pass.frontends.launch -m maxtext.trainers.pre_train.train ...
    EQUARX_FLAGS="--equarx_enable" equarx-run train.py --steps 10

For trainers nobody here wrote (MaxText, a framework's example): the launcher replaces
`jax.jit` with `equarx_pass.jit` for the process, with the policy $EQUARX_FLAGS gives, and
runs the program as `python -m MODULE` or `python SCRIPT` would.  Everything else is the
program's own.  A function that the program jits goes through the pass when it is called
or lowered outside any other trace (a train step); inside another jitted function it is
traced as jax.jit traces it, and the outer function's pass sees its collectives.

Without --equarx_enable in $EQUARX_FLAGS nothing is replaced and the program runs as it
is (one line on stderr says so).  At exit, each function with collectives gets one
summary line on stderr (--equarx_report prints every report in full as it is made).

Only `jax.jit` looked up after the launcher starts is replaced: a program that imported
`jit` from JAX before (in a module the launcher itself imports) keeps the original.
JAX's own internal jits never go through `jax.jit` and are untouched.
"""

from __future__ import annotations

import atexit
import functools
import os
import runpy
import sys
from typing import Callable

import jax

from equarx_pass import report
from equarx_pass.errors import FlagError
from equarx_pass.frontends.jit import JAX_JIT, Jitted
from equarx_pass.planning.policy import Policy

USAGE = """usage: equarx-run [-m MODULE | SCRIPT] [ARGS...]
       python -m equarx_pass.frontends.launch [-m MODULE | SCRIPT] [ARGS...]

Runs the program with every jax.jit replaced by equarx_pass.jit; $EQUARX_FLAGS says what
the pass does (e.g. EQUARX_FLAGS="--equarx_enable --equarx_report")."""


def install(policy: Policy) -> list[Jitted]:
  """Replace jax.jit with equarx_pass.jit under `policy`; return the list that every
  function jitted from now on is appended to (for the exit summary)."""
  made: list[Jitted] = []

  @functools.wraps(JAX_JIT)
  def launched_jit(fun: Callable | None = None, /, **jit_kwargs):
    if fun is None:  # @jax.jit(static_argnums=...)-style use
      return lambda f: launched_jit(f, **jit_kwargs)
    jitted = Jitted(fun, policy, jit_kwargs)
    jitted.launched = True
    made.append(jitted)
    return jitted

  jax.jit = launched_jit
  return made


def summary(made: list[Jitted]) -> str:
  """One line per lowering that held collectives: its sites and bytes, from the report."""
  return "\n".join(
    f"equarx-run: {low.signature}: {report.summary(low.records, low.topology)}"
    for jitted in made
    for low in jitted.report.lowerings
    if low.records
  )


def main(argv: list[str] | None = None) -> int:
  args = list(sys.argv[1:] if argv is None else argv)
  if not args or args[0] in ("-h", "--help") or (args[0] == "-m" and len(args) < 2):
    print(USAGE, file=sys.stderr if not args or args[0] == "-m" else sys.stdout)
    return 0 if args and args[0] in ("-h", "--help") else 2
  try:
    policy = Policy.from_env()
  except FlagError as e:
    print(f"equarx-run: EQUARX_FLAGS: {e}", file=sys.stderr)
    return 2
  if not policy.enable:
    print(
      "equarx-run: EQUARX_FLAGS does not say --equarx_enable: running the program as it is",
      file=sys.stderr,
    )
  else:
    made = install(policy)
    atexit.register(lambda: _print_summary(made))
  if args[0] == "-m":
    module, rest = args[1], args[2:]
    sys.argv = [module, *rest]
    if sys.path and sys.path[0] != os.getcwd() and not sys.flags.safe_path:
      sys.path.insert(0, os.getcwd())  # as `python -m` puts the working directory first
    runpy.run_module(module, run_name="__main__", alter_sys=True)
  else:
    script = args[0]
    if not os.path.isfile(script):
      print(f"equarx-run: {script}: no such file", file=sys.stderr)
      return 2
    sys.argv = list(args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
  return 0


def _print_summary(made: list[Jitted]) -> None:
  text = summary(made)
  if text:
    print(text, file=sys.stderr)


def run() -> None:
  """The equarx-run console script."""
  sys.exit(main())


if __name__ == "__main__":
  run()
