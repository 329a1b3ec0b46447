"""In-process transports: run a `Call` on a `MemoryService` over a local store, no server.

The service is built by `ampkit.bootstrap.build_service` from the same `Settings` model the
server uses (the store URL given, the rest from `AMPKIT_*` variables; the embedder is shared
by every client in the process), so the store, limits, lifecycle policy and access rules are the server's. Request
bodies are validated with the same pydantic models the routes use, and a validation failure
becomes the same `ValidationFailed` (code, message, details) the server would answer. The
answer then goes through `call.decode`, as an HTTP answer would.

The in-process clients act with every scope (there is no API key to check) and run no
background lifecycle scheduler: call `run_lifecycle()` when you want one.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any, Callable, Optional

import anyio.to_thread
from pydantic import TypeAdapter, ValidationError

from ..access import check_agent_id
from ..errors import ValidationFailed, validation_to_api_error
from ..models import (
    AMP_VERSION,
    BatchCreate,
    CellCreate,
    CellPatch,
    Health,
    LifecycleRunRequest,
    ListResponse,
    PurgeRequest,
    RollbackRequest,
    SearchRequest,
    UtcDatetime,
)
from ..bootstrap import build_service, settings_for_store
from ..service import MemoryService, spec_document
from ._calls import Call


def _parse(model: type, body: Any) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        # The server reports body errors at loc ("body", ...); keep the details identical.
        errors = [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors()]
        raise validation_to_api_error(errors) from None


def _if_match(call: Call) -> Optional[int]:
    raw = call.headers.get("If-Match")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValidationFailed("header.if-match: Input should be a valid integer") from None


_AS_OF = TypeAdapter(Optional[UtcDatetime])


def _as_of(call: Call) -> Optional[datetime]:
    try:
        return _AS_OF.validate_python(call.query.get("as_of"))
    except ValidationError as exc:
        errors = [{**e, "loc": ("query", "as_of", *e.get("loc", ()))} for e in exc.errors()]
        raise validation_to_api_error(errors) from None


def _list(service: MemoryService, agent: str, call: Call) -> ListResponse:
    q = dict(call.query)
    results, total, next_cursor = service.list(
        agent,
        owner_id=q.get("owner_id"),
        types=q.get("type"),
        status=q.get("status"),
        session_id=q.get("session_id"),
        include_stale=bool(q.get("include_stale")),
        include_superseded=bool(q.get("include_superseded")),
        metadata=q.get("metadata"),
        limit=q.get("limit"),
        cursor=q.get("cursor"),
        as_of=_as_of(call),
    )
    return ListResponse(results=results, total=total, next_cursor=next_cursor)


def _export(service: MemoryService, agent: str, call: Call) -> dict[str, Any]:
    cells = service.export(agent, owner_id=call.query.get("owner_id"))
    return {"amp_version": AMP_VERSION, "count": len(cells), "cells": cells}


# call.op -> what the route for that operation does, minus HTTP.
Handler = Callable[[MemoryService, str, Call], Any]
HANDLERS: dict[str, Handler] = {
    "create": lambda s, agent, c: s.create(agent, _parse(CellCreate, c.body)),
    "create_many": lambda s, agent, c: {"results": s.create_many(agent, _parse(BatchCreate, c.body).cells)},
    "get": lambda s, agent, c: s.get(agent, c.cell_id, as_of=_as_of(c)),
    "rollback": lambda s, agent, c: s.rollback(agent, c.cell_id, _parse(RollbackRequest, c.body).to_version,
                                               expected_version=_if_match(c)),
    "update": lambda s, agent, c: s.update(agent, c.cell_id, _parse(CellPatch, c.body), expected_version=_if_match(c)),
    "delete": lambda s, agent, c: s.delete(agent, c.cell_id),
    "search": lambda s, agent, c: s.search(agent, _parse(SearchRequest, c.body)),
    "list": _list,
    "history": lambda s, agent, c: {"results": s.history(agent, c.cell_id)},
    "export": _export,
    "run_lifecycle": lambda s, agent, c: s.run_lifecycle(as_of=_parse(LifecycleRunRequest, c.body).as_of),
    "purge": lambda s, agent, c: s.purge(agent, **_parse(PurgeRequest, c.body).model_dump()),
    "health": lambda s, agent, c: Health(),
    "spec": lambda s, agent, c: spec_document(s, {"mode": "in-process", "header": None}),
}


class LocalTransport:
    """Runs calls on a service whose store it opens on first use and closes on `close()`."""

    def __init__(self, store_url: str, *, agent_id: Optional[str], service: Optional[MemoryService] = None):
        self.url = store_url
        self.agent_id = agent_id
        self.service = service or build_service(settings_for_store(store_url))
        self._opened = False
        self._lock = threading.Lock()

    def open(self) -> None:
        with self._lock:
            if not self._opened:
                self.service.store.open()
                self._opened = True

    def send(self, call: Call) -> Any:
        agent = check_agent_id(self.agent_id) if call.needs_agent else ""
        self.open()
        return call.decode(HANDLERS[call.op](self.service, agent, call))

    def close(self) -> None:
        with self._lock:
            if self._opened:
                self.service.store.close()
                self._opened = False


class AsyncLocalTransport:
    """The same, with each call run in a worker thread so the event loop never blocks on SQL."""

    def __init__(self, store_url: str, *, agent_id: Optional[str], service: Optional[MemoryService] = None):
        self._sync = LocalTransport(store_url, agent_id=agent_id, service=service)
        self.url = store_url

    async def open(self) -> None:
        await anyio.to_thread.run_sync(self._sync.open)

    async def send(self, call: Call) -> Any:
        return await anyio.to_thread.run_sync(self._sync.send, call)

    async def close(self) -> None:
        await anyio.to_thread.run_sync(self._sync.close)
