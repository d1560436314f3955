"""The wire formats, by name: each is one object (formats/base.py) in a module of its own.

A new format is a module here defining a `Format` and one `register` line below; the
policy's --equarx_format choices, the scheme's checks and the report's bytes all come
from this registry.
"""

from __future__ import annotations

from equarx_pass import registry
from equarx_pass.emission.formats.base import Format
from equarx_pass.emission.formats.fp8 import FP8_E4M3, FP8_E5M2
from equarx_pass.emission.formats.integer import INT4, INT8
from equarx_pass.emission.formats.mx import MXINT8

FORMATS: dict[str, Format] = {}


def register(fmt: Format) -> Format:
  return registry.add(FORMATS, fmt, "format")


for _fmt in (INT8, INT4, FP8_E4M3, FP8_E5M2, MXINT8):
  register(_fmt)

__all__ = ["FORMATS", "FP8_E4M3", "FP8_E5M2", "INT4", "INT8", "MXINT8", "Format", "register"]
