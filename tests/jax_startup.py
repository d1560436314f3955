"""JAX's own start-up lines on standard error, which equarx-opt's error contract leaves out.

With JAX's CUDA plugin installed (the cuda-aot extra) on a machine with no GPU, `import
jax` prints from C++, before anything of the pass runs, absl's note and "Could not find
cuda drivers" once per plugin library; no environment variable silences them.  The tests
of what equarx-opt writes to standard error read it without those lines, and only those.
"""

import re

_STARTUP = re.compile(
  r"^(?:WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
  r"STDERR|I\d{4} [\d:.]+ +\d+ cudart_stub\.cc:\d+\] [^\n]*)\n",
  re.M,
)


def without_jax_startup(stderr: str) -> str:
  return _STARTUP.sub("", stderr)
