"""Fixtures for the adapter tests: every test runs once over HTTP against the session's real
`ampkit serve` process, and once on an in-process SQLite file, with the same code.

Import the fixtures into a test module with `from adapter_support import backend, Backend`.
"""

from __future__ import annotations

import importlib
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest

import ampkit


@dataclass
class Backend:
    """Where memory lives for one test, and how to connect to it as any agent."""

    name: str
    url: str
    opened: list = field(default_factory=list)

    def connect(self, agent_id: str) -> "ampkit.Client":
        client = ampkit.connect(self.url, agent_id=agent_id)
        self.opened.append(client)
        return client

    def aconnect(self, agent_id: str) -> "ampkit.AsyncClient":
        return ampkit.aconnect(self.url, agent_id=agent_id)

    def cells(self, owner_id: str, **filters) -> list:
        """Every cell of `owner_id`, read as the owner with a raw client: the store's view."""
        return list(self.connect(owner_id).list(owner_id=owner_id, **filters))

    def texts(self, owner_id: str, **filters) -> list[str]:
        return [c.content.text for c in self.cells(owner_id, **filters)]


class Deferred:
    """`from module import name` (or `import module`), done when the name is first called or
    read. Every pytest-xdist worker imports every test module to collect it, and CrewAI (~4 s)
    and LlamaIndex (~1.6 s) are slow to import, though only the worker that runs their tests
    needs them (tests/conftest.py keeps those files on one worker). For names that are called
    or have attributes read; not for isinstance checks or base classes."""

    def __init__(self, module: str, name: Optional[str] = None):
        self._module, self._name = module, name

    def _resolve(self) -> Any:
        found = importlib.import_module(self._module)
        return found if self._name is None else getattr(found, self._name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._resolve()(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):  # pytest probes module attributes (`__wrapped__`, `_pytestfixturefunction`...)
            raise AttributeError(attr)
        return getattr(self._resolve(), attr)


def deferred(module: str, *names: str) -> Any:
    """`deferred("crewai", "Agent", "Task")` -> (Agent, Task), each a `Deferred`; with no
    names, the module itself."""
    if not names:
        return Deferred(module)
    found = tuple(Deferred(module, name) for name in names)
    return found[0] if len(found) == 1 else found


def unique(prefix: str) -> str:
    """Tests share one server: every test gets its own user and agent ids."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["http", "sqlite"])
def backend(request, tmp_path):
    if request.param == "http":
        url = request.getfixturevalue("server").base_url
    else:
        url = f"sqlite:///{tmp_path}/memory.db"
    b = Backend(request.param, url)
    yield b
    for client in b.opened:
        client.close()
