"""The shape of the code, checked: `core/` has no import cycle, and the adapters use only
ampkit's public names and the frameworks' public APIs.

Every import counts, wherever it is written (module level, inside a function, under
TYPE_CHECKING): a lazy import hides a cycle from the interpreter, not from the reader."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from support import ROOT

CORE = ROOT / "core"
ADAPTERS = ROOT / "adapters"


def _modules(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is a package) for every .py under `root`."""
    found = {}
    for path in root.rglob("*.py"):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _imports(path: Path, module: str, is_package: bool):
    """(imported module, [names]) for every import statement, relative ones resolved."""
    package = module if is_package else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield target, [alias.name for alias in node.names]


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    modules = _modules(root, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        for target, names in _imports(path, name, is_package):
            submodules = {f"{target}.{n}" for n in names} & modules.keys()
            graph[name] |= submodules
            # `from . import sibling` needs only the sibling: the package being imported from is
            # this module's own ancestor, already loading. Any other import of a package runs it.
            own_ancestor = name.startswith(target + ".")
            if target in modules and not (own_ancestor and len(submodules) == len(names)):
                graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), plus self-loops."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_core_has_no_import_cycle():
    graph = import_graph(CORE, "ampkit")
    assert "ampkit.service" in graph and "ampkit.bootstrap" in graph  # the walk found the package
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"], ["e"]]


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def _public_ampkit_name(module: str, name: str) -> bool:
    """In the module's `__all__` when it declares one, else any name without a leading `_`."""
    exported = getattr(importlib.import_module(module), "__all__", None)
    return name in exported if exported is not None else not name.startswith("_")


def adapter_violations() -> list[str]:
    problems = []
    for name, (path, is_package) in _modules(ADAPTERS, "ampkit.adapters").items():
        for target, names in _imports(path, name, is_package):
            if target.startswith("ampkit.adapters"):
                continue  # the adapters' own helpers
            if target == "ampkit" or target.startswith("ampkit."):
                if _private(target):
                    problems.append(f"{name}: imports private module {target}")
                    continue
                problems += [f"{name}: {target}.{n} is not a public name of {target}" for n in names
                             if not _public_ampkit_name(target, n)]
                continue
            if _private(target):
                problems.append(f"{name}: imports private module {target}")
            problems += [f"{name}: imports private name {target}.{n}" for n in names if _private(n)]
    return problems


def test_adapters_use_only_public_names():
    assert adapter_violations() == []
