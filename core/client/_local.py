"""In-process transports: run a `Call` on a `MemoryService` over a local store, no server.

The service is built by `ampkit.bootstrap.build_service` from the same `Settings` model the
server uses (the store URL given, the rest from `AMPKIT_*` variables; the embedder is shared
by every client in the process), so the store, limits, lifecycle policy and access rules are
the server's. Inputs are validated with the same models and parameter types the routes use
(both come from the operations table), and a validation failure becomes the same
`ValidationFailed` (code, message, details) the server would answer. The answer then goes
through `call.decode`, as an HTTP answer would.

The in-process clients act with every scope (there is no API key to check) and run no
background lifecycle scheduler: call `run_lifecycle()` when you want one.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, Iterable, Iterator, Mapping, Optional

import anyio.to_thread

from ..access import check_agent_id
from ..auth import SCOPES
from ..bootstrap import build_service, settings_for_store, start_background, stop_background
from ..embed_queue import EmbeddingWorker
from ..operations import Answer, Context, Inputs, query_pairs
from ..service import MemoryService
from ._calls import Call

# What GET /spec says about identity in process: no header, no key; every scope.
IN_PROCESS_AUTH = {"mode": "in-process", "header": None}


def run_call(service: MemoryService, agent: str, call: Call[Any], auth: Mapping[str, Any] = IN_PROCESS_AUTH,
             scopes: frozenset[str] = frozenset(SCOPES), admin_key: bool = False) -> Any:
    """Run the call's operation as its route would, as `agent` holding `scopes` (the MCP
    tools pass their caller's key scopes: a write by a key without `read` gets no cell
    back, as over HTTP): the same input validation (the query travels in its wire form),
    the same row, the same decoding. The in-process clients and the MCP tools
    (`ampkit.mcp_server`) both run calls here. `admin_key`: the caller's key holds `admin`
    (MCP over HTTP); in process there is no key, so no caller changes a policy it does
    not own (`access.may_change_policy`)."""
    context, inputs = _prepared(service, agent, call, auth, scopes, admin_key)
    return _decoded(call, call.operation.run(context, inputs))


async def run_call_grouped(service: MemoryService, agent: str, call: Call[Any],
                           grouped: Callable[[Context, Inputs], Awaitable[Any]]) -> Any:
    """`run_call` for a create on a service that commits in groups, on an asyncio loop
    (`grouped`: the row's `Operation.grouped(service)`): the call waits for its group's commit
    without a thread of its own, as the server's do."""
    context, inputs = _prepared(service, agent, call, IN_PROCESS_AUTH, frozenset(SCOPES))
    return _decoded(call, await grouped(context, inputs))


def _prepared(service: MemoryService, agent: str, call: Call[Any], auth: Mapping[str, Any],
              scopes: frozenset[str], admin_key: bool = False) -> tuple[Context, dict[str, Any]]:
    inputs = call.operation.parse(path=call.path_params, query=query_pairs(call.query), headers=call.headers,
                                  body=call.body, limits=service.limits)
    return Context(service, agent, auth, may_read="read" in scopes, scopes=scopes, admin_key=admin_key), inputs


def _decoded(call: Call[Any], result: Any) -> Any:
    return call.decode(result.value if isinstance(result, Answer) else result)


class LocalTransport:
    """Runs calls on a service whose store it opens on first use and closes on `close()`."""

    def __init__(self, store_url: str, *, agent_id: Optional[str], service: Optional[MemoryService] = None):
        self.url = store_url
        self.agent_id = agent_id
        self.service = service or build_service(settings_for_store(store_url))
        self._opened = False
        self._lock = threading.Lock()
        # With a slow embedder, cells are embedded after the write by this worker thread.
        self._embedding = EmbeddingWorker(self.service)

    def open(self) -> None:
        with self._lock:
            if not self._opened:
                start_background(self.service, self._embedding)
                self._opened = True

    @property
    def is_open(self) -> bool:
        return self._opened

    def agent_for(self, call: Call[Any]) -> str:
        """The agent the call acts as ("" for a call that needs none)."""
        return check_agent_id(self.agent_id) if call.needs_agent else ""

    def send(self, call: Call[Any]) -> Any:
        agent = self.agent_for(call)
        self.open()
        return run_call(self.service, agent, call)

    def close(self) -> None:
        with self._lock:
            if self._opened:
                stop_background(self.service, self._embedding)
                self._opened = False

    def export_lines(self, owner_id: Optional[str], cursor: Optional[str]) -> Iterator[str]:
        from ..portable import check_cursor, export_lines

        check_cursor(cursor)
        self.open()
        return export_lines(self.service.store, owner_id, cursor)

    def import_lines(self, chunks: Iterable[bytes]) -> dict[str, Any]:
        from ..portable import import_lines

        self.open()
        body = b"".join(chunks)
        report = import_lines(self.service.store, body.splitlines, self.service.retriever)
        return report.model_dump()


class AsyncLocalTransport:
    """The same, with each call run in a worker thread so the event loop never blocks on SQL;
    on asyncio, a create on a store that commits in groups (SQLite) instead waits for its
    group on the loop, without a thread of its own (`run_call_grouped`)."""

    def __init__(self, store_url: str, *, agent_id: Optional[str], service: Optional[MemoryService] = None):
        self._sync = LocalTransport(store_url, agent_id=agent_id, service=service)
        self.url = store_url

    async def open(self) -> None:
        if not self._sync.is_open:
            await anyio.to_thread.run_sync(self._sync.open)

    async def send(self, call: Call[Any]) -> Any:
        service = self._sync.service
        grouped = call.operation.grouped(service)
        if grouped is not None and _on_asyncio():
            agent = self._sync.agent_for(call)
            await self.open()
            return await run_call_grouped(service, agent, call, grouped)
        return await anyio.to_thread.run_sync(self._sync.send, call)

    async def close(self) -> None:
        await anyio.to_thread.run_sync(self._sync.close)


def _on_asyncio() -> bool:
    """Whether the caller runs on an asyncio loop (group commit answers there; under trio the
    call takes a worker thread instead)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
