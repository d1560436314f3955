"""Sphinx configuration of the docs site: MyST Markdown pages, the API reference from
docstrings (autodoc), the flag reference from equarx_pass.planning.policy.FLAGS (_ext/).

Built in CI with warnings as errors:
    python -m sphinx -W --keep-going -b html docs docs/_build/html
It imports the installed equarx_pass (the `docs` extra adds Sphinx, MyST and furo).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ext"))

import equarx_pass  # noqa: E402

project = "equarx-pass"
author = "the equarx-pass authors"
copyright = "the equarx-pass authors; Apache-2.0"
release = version = equarx_pass.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "equarx_docs"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3  # links to a page's sections: [text](page.md#section-title)
myst_enable_extensions = ["colon_fence"]

# Docstrings write code in single backticks, as Markdown does.
default_role = "code"
autodoc_member_order = "bysource"
autodoc_typehints = "signature"

html_theme = "furo"
html_title = f"equarx-pass {release}"
html_static_path: list[str] = []
# No page may link outside the site by accident; the build stays offline.
nitpicky = False
