"""One error hierarchy for the whole pass; every message says what to do."""


class EquarxError(Exception):
  """Base class of every error equarx-pass raises on purpose."""


class FlagError(EquarxError, ValueError):
  """An unknown, malformed or out-of-range --equarx_* flag or Policy field."""


class ParseError(EquarxError):
  """Input that is not a StableHLO module or XLA HLO text.

  `path`, `line` and `column` are set where they are known (1-based).
  """

  def __init__(
    self, message: str, path: str | None = None, line: int | None = None, column: int | None = None
  ):
    self.path, self.line, self.column = path, line, column
    self.message = message  # without the position prefix
    where = path or "<input>"
    if line is not None:
      where += f":{line}"
      if column is not None:
        where += f":{column}"
    super().__init__(f"{where}: {message}")


class RewriteError(EquarxError):
  """A selected all-reduce could not be rewritten; the module is left as it was."""


class InternalError(RewriteError):
  """A bug in equarx-pass itself (an emitter or rebuild failure), not in the input: the
  message names the site and says how to go on without it."""


class VerifyError(EquarxError):
  """The rewritten module failed verification; it is discarded, never returned."""


class CompileError(EquarxError):
  """XLA refused to compile the rewritten module."""


class EquarxWarning(UserWarning):
  """`equarx_pass.jit` runs something other than what its flags ask for: the pass is
  enabled but nothing was rewritten, the partitioned route was not taken, or the function
  was called under a JAX transformation and traced as plain `jax.jit`.

  Issued with Python's `warnings`, once per wrapped function and reason; silence it with
  `warnings.filterwarnings("ignore", category=equarx_pass.EquarxWarning)`.
  """
