"""The benchmark suite: `python -m tools SUBCOMMAND [ARGS]` from the repository root.

A regular package, not a namespace one, so that a `tools` package installed elsewhere
cannot shadow this folder.  See tools/README.md.
"""
