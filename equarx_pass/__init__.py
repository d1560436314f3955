"""equarx-pass: quantized (EQuARX) all-reduce for JAX programs, as a StableHLO pass.

    import equarx_pass
    step = equarx_pass.jit(step_fn, flags="--equarx_enable")

The package follows the pass's flow, a subpackage per stage: the ways in
(frontends/: jit, files, the CLI, compile-only TPU) -> parse (ir/) -> match and plan
(planning/) -> emit (emission/: an algorithm in a form with a wire format, each beside
its NumPy model) -> verify and compile.  rewrite.py runs the stages on one module.
"""

# First: refuses a JAX outside the supported range, naming it (see _version.py).
from equarx_pass._version import SUPPORTED_JAX, __version__
from equarx_pass.errors import (
  CompileError,
  EquarxError,
  EquarxWarning,
  FlagError,
  ParseError,
  RewriteError,
  VerifyError,
)
from equarx_pass.frontends.calibrate_program import calibrate
from equarx_pass.frontends.jit import Jitted, LoweringReport, Report, jit
from equarx_pass.frontends.transform import transform_file, transform_text
from equarx_pass.ir.parse import parse_bytes, parse_file
from equarx_pass.planning.policy import Policy
from equarx_pass.rewrite import RewriteResult, rewrite_module
from equarx_pass.site_records import SiteRecord

__all__ = [
  "CompileError",
  "EquarxError",
  "EquarxWarning",
  "FlagError",
  "ParseError",
  "RewriteError",
  "VerifyError",
  "Jitted",
  "LoweringReport",
  "Report",
  "jit",
  "parse_bytes",
  "parse_file",
  "Policy",
  "RewriteResult",
  "SiteRecord",
  "rewrite_module",
  "transform_file",
  "transform_text",
  "calibrate",
  "SUPPORTED_JAX",
  "__version__",
]
