"""The shape of the code, checked: `core/` has no import cycle, the adapters use only
ampkit's public names and the frameworks' public APIs, and every httpx client the project
makes shares the process's one TLS context.

Every import counts, wherever it is written (module level, inside a function, under
TYPE_CHECKING): a lazy import hides a cycle from the interpreter, not from the reader."""

from __future__ import annotations

import ast
import importlib
import inspect
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


# httpx functions and classes that make a client (and with it a TLS context) when called.
HTTPX_CLIENT_MAKERS = {"get", "post", "patch", "put", "delete", "head", "options", "request", "stream", "Client", "AsyncClient"}


def clients_without_shared_tls(source: str) -> list[int]:
    """Lines of `httpx.<maker>(...)` calls given neither `verify=` (the shared context) nor a
    `transport=` of their own (nor `**options` that may carry one): httpx builds a TLS context
    for each such client, ~30 ms of CPU reading the CA bundle, even for plain HTTP, which a
    server starting beside a readiness poll, or a test making hundreds of requests, pays."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "httpx"
                and node.func.attr in HTTPX_CLIENT_MAKERS
                and not {k.arg for k in node.keywords} & {"verify", "transport", None}):
            lines.append(node.lineno)
    return lines


def test_every_httpx_client_shares_one_tls_context():
    # (spec/'s conformance runner imports nothing of ampkit's and makes one client a run.)
    found = [f"{path.relative_to(ROOT)}:{line}" for folder in ("core", "adapters", "tests", "bench", "examples")
             for path in sorted((ROOT / folder).rglob("*.py"))
             for line in clients_without_shared_tls(path.read_text())]
    assert found == [], "pass verify=ampkit.tls.tls_context() (tests: support.TLS): " + ", ".join(found)


def test_the_tls_check_finds_a_client_without_the_shared_context():
    assert clients_without_shared_tls("httpx.get(url)\nhttpx.Client(\n    timeout=5)\n") == [1, 2]
    assert clients_without_shared_tls("httpx.get(url, verify=TLS)\nhttpx.Client(transport=t)\n"
                                      "httpx.Client(**options)\nhttpx.URL(url)\n") == []


# What `import ampkit` must not load: an HTTP client needs neither the service nor the stores,
# numpy or pydantic-settings. They load when a local URL is connected (`client/_local.py`), on
# the first `connect()` (`ClientDefaults`) or in the server. bench/import_time.py times it.
HEAVY_FOR_A_CLIENT = ("numpy", "pydantic_settings", "ampkit.service", "ampkit.bootstrap", "ampkit.retrieval",
                      "ampkit.store.sqlite", "ampkit.files.service", "ampkit.client._local", "fastapi")


def test_import_ampkit_loads_no_server_side_module():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import sys, ampkit; print('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert [name for name in HEAVY_FOR_A_CLIENT if name in out] == []


def test_a_local_url_still_loads_the_in_process_transport(tmp_path):
    import ampkit

    with ampkit.connect(f"sqlite:///{tmp_path}/m.db", agent_id="a") as client:
        assert client.in_process
        client.remember("tea, no sugar", owner_id="a")
        assert [hit.cell.content.text for hit in client.search("tea", owner_id="a")] == ["tea, no sugar"]


# ------------------------------------------------ frameworks' private names used by core
# Each private name of another package that core/ reads, calls or overrides, with the
# distribution that defines it. Each is there for a reason given where it is used, is covered by
# the tests of that module (the MCP tests, the routes' tests, the workers' tests, the embedder's
# tests) and its distribution's version has an upper bound in pyproject.toml, so an upgrade that
# moves it is a deliberate change. A new one fails the test until it is listed here.
FRAMEWORK_INTERNALS = {
    "_embed_body_fields": "fastapi",  # server/routes.py: the plain route handler validates bodies as FastAPI does
    "_mcp_server": "mcp",  # mcp_http.py: the low-level server under FastMCP, for a stateless JSON session manager
    "_tool_manager": "mcp",  # mcp_server.py: an unknown tool answers the error envelope, not an exception
    "_set_max_length_in_tokenizer": "model2vec",  # embeddings.py: the tokenizer's resting state, set once
    "_healthcheck": "uvicorn",  # server/__init__.py: a worker's health check also ends when it dies
}
PUBLIC_UNDERSCORE_API = {"_replace", "_asdict", "_fields", "_make"}  # namedtuple's documented methods


def _names_defined_in(paths) -> set[str]:
    defined: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                defined.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                defined |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
            elif isinstance(node, ast.keyword) and node.arg:
                defined.add(node.arg)
    return defined


def foreign_private_names() -> set[str]:
    """Private attributes core/ reads that no ampkit module defines, and private methods a core
    class defines over a foreign base class's method of the same name."""
    paths = [path for path, _ in _modules(CORE, "ampkit").values()]
    defined = _names_defined_in(paths + [path for path, _ in _modules(ADAPTERS, "ampkit.adapters").values()])
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and node.attr not in defined and node.attr not in PUBLIC_UNDERSCORE_API):
                found.add(node.attr)
    for module, (path, _) in _modules(CORE, "ampkit").items():
        try:
            loaded = importlib.import_module(module)
        except ImportError:  # pragma: no cover - an optional extra missing
            continue
        for value in vars(loaded).values():
            if not (isinstance(value, type) and value.__module__ == module):
                continue
            foreign = [base for base in value.__mro__[1:] if not base.__module__.startswith("ampkit")]
            for name, member in vars(value).items():
                if (name.startswith("_") and not name.startswith("__") and not name.endswith("_")
                        and inspect.isfunction(member)
                        and any(inspect.isfunction(vars(base).get(name)) for base in foreign)):
                    found.add(name)
    return found


def test_core_uses_only_the_listed_private_names_of_other_packages():
    assert foreign_private_names() == set(FRAMEWORK_INTERNALS)


def test_every_package_whose_private_names_core_uses_has_an_upper_bound():
    from packaging.requirements import Requirement

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    requirements += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    bounded = {r.name for r in requirements if any(s.operator in ("<", "<=", "==", "~=") for s in r.specifier)}
    assert {dist for dist in FRAMEWORK_INTERNALS.values()} - bounded == set()


# ------------------------------------------------ module size, and persistence without threads
MAX_MODULE_LINES = 900
# Modules over MAX_MODULE_LINES allowed, with their size: none now, and the list only shrinks.
OVER_MAX_LINES: dict[str, int] = {}
# Rows in and out, migrations: no background work of their own (a store hands it to its
# `ampkit.scheduler.Scheduler`).
PERSISTENCE = ["store/sqlite.py", "store/sqlite_schema.py", "store/sqlite_windows.py", "store/postgres.py",
               "store/_pg_schema.py", "store/sql/store.py", "store/sql/compiler.py", "store/sql/dialects.py",
               "store/_files.py", "store/_keys.py", "store/base.py"]


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_core_module_is_over_the_line_limit():
    over = {str(path.relative_to(CORE)): _lines(path) for path in CORE.rglob("*.py") if _lines(path) > MAX_MODULE_LINES}
    grown = {name: lines for name, lines in over.items() if lines > OVER_MAX_LINES.get(name, MAX_MODULE_LINES)}
    assert not grown, f"over {MAX_MODULE_LINES} lines (split them): {grown}"
    assert "store/sqlite.py" not in OVER_MAX_LINES


def _threading_uses(path: Path) -> list[str]:
    """The imports of `threading` (or `_thread`) in a module, and any `Thread(` it names."""
    found = [target for target, _ in _imports(path, "ampkit.x", False) if target.split(".")[0] in ("threading", "_thread")]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found += [ast.unparse(node) for node in ast.walk(tree)
              if isinstance(node, ast.Attribute) and node.attr == "Thread"]
    return found


def test_persistence_modules_import_no_threading():
    for name in PERSISTENCE:
        assert (CORE / name).exists(), name
    offenders = {name: uses for name in PERSISTENCE if (uses := _threading_uses(CORE / name))}
    assert offenders == {}


def test_the_threading_check_finds_an_import_and_a_thread(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import threading\n\nthreading.Thread(target=print).start()\n")
    assert _threading_uses(module) == ["threading", "threading.Thread"]
    module.write_text("from threading import Lock\n")
    assert _threading_uses(module) == ["threading"]
