"""Sphinx directives of the docs site.

```{equarx-flag-table}
```
renders equarx_pass.planning.policy.flags_markdown(): the flag reference is generated from the
flag definitions, the same table README.md holds and `equarx-opt --help` prints.
"""

from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective


class FlagTable(SphinxDirective):
  has_content = False

  def run(self):
    from docutils import nodes

    from equarx_pass.planning import policy

    container = nodes.container()
    lines = StringList(
      policy.flags_markdown().splitlines(), source="equarx_pass.planning.policy.FLAGS"
    )
    # Inside a MyST page this parses the table as Markdown.
    self.state.nested_parse(lines, self.content_offset, container)
    return container.children


def setup(app):
  app.add_directive("equarx-flag-table", FlagTable)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
