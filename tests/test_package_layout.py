"""The package's layout shows the pass's flow, and its imports follow it.

Layers, lowest first: the shared vocabulary at the top level (errors, the site kinds,
the platform rules and the topology they describe), the IR (ir/), emission (emission/),
planning (planning/), the driver (rewrite.py and the site records and report it
builds), the front ends (frontends/), the package's public names, and its users
(the demo, examples/).  A module imports from its own layer or below; type-only
imports (under `if TYPE_CHECKING:`) are left out, since they run nothing.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "equarx_pass"
FOUNDATION = {"errors", "_version", "_jax_private", "registry", "site_kind", "platforms"}
FOUNDATION |= {"topology", "traffic"}
LAYERS = ["foundation", "ir", "emission", "planning", "driver", "frontends", "api", "users"]
DRIVER = {"rewrite", "site_patterns", "site_records", "report"}
# Imports from a lower layer up to a higher one, each with its reason.
UPWARD: dict[tuple[str, str], str] = {}


def layer(module: str) -> str:
  parts = module.split(".")[1:]
  if not parts:
    return "api"
  if parts[0] in ("ir", "emission", "planning", "frontends"):
    return parts[0]
  if parts[0] in DRIVER:
    return "driver"
  if parts[0] in FOUNDATION:
    return "foundation"
  if parts[0] in ("demo", "examples"):
    return "users"
  raise AssertionError(
    f"{module}: a module in no layer; add it to one (tests/test_package_layout.py)"
  )


def modules() -> dict[str, pathlib.Path]:
  found = {}
  for path in ROOT.rglob("*.py"):
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    found[name] = path
  return found


def _runtime_nodes(tree: ast.AST):
  """Every node but those under `if TYPE_CHECKING:`."""
  for node in ast.iter_child_nodes(tree):
    if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
      yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
      continue
    yield node
    yield from _runtime_nodes(node)


def imports() -> dict[str, set[str]]:
  """module -> the package's modules it imports at run time (function-level too)."""
  mods = modules()
  graph: dict[str, set[str]] = {name: set() for name in mods}
  for name, path in mods.items():
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in _runtime_nodes(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          up = package.split(".")[: len(package.split(".")) - node.level + 1]
          base = ".".join(up + ([base] if base else []))
        subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
        targets = subs if len(subs) == len(node.names) else [base, *subs]
      else:
        continue
      for target in targets:
        while target and target not in mods:
          target = target.rpartition(".")[0]
        if target and target != name:
          graph[name].add(target)
  return graph


def test_every_module_has_a_layer():
  for name in modules():
    assert layer(name) in LAYERS


def test_no_import_cycle():
  graph = imports()
  state: dict[str, int] = {}

  def visit(node, path):
    state[node] = 1
    for nxt in sorted(graph[node]):
      if state.get(nxt) == 1:
        pytest.fail("import cycle: " + " -> ".join(path[path.index(nxt) :] + [nxt]))
      if nxt not in state:
        visit(nxt, path + [nxt])
    state[node] = 2

  for node in sorted(graph):
    if node not in state:
      visit(node, [node])


def test_imports_follow_the_layers():
  upward = {
    (name, target)
    for name, targets in imports().items()
    for target in targets
    if LAYERS.index(layer(target)) > LAYERS.index(layer(name))
  }
  assert upward <= set(UPWARD), f"imports up the layers: {sorted(upward - set(UPWARD))}"
  assert len(UPWARD) <= 2


def test_the_checker_sees_imports():
  """The graph is not empty by a parsing slip: the driver reaches every layer below it."""
  graph = imports()
  assert {layer(t) for t in graph["equarx_pass.rewrite"]} >= {"foundation", "ir", "planning"}
  assert "equarx_pass.emission.scheme" in graph["equarx_pass.planning.policy"]
