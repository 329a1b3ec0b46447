"""The `/amp/v1` HTTP app. Routes are thin: parse the wire model, call one service method,
serialise. Errors are translated once, in `errors.py` of this package."""


import asyncio
import json
import logging
from contextlib import asynccontextmanager
from typing import Annotated, Any, Optional

from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from .. import portable
from ..config import Settings
from ..errors import UnsupportedMediaType, ValidationFailed
from ..models import (
    AMP_VERSION,
    UtcDatetime,
    BatchCreate,
    BatchCreateResponse,
    CellCreate,
    CellPatch,
    ErrorEnvelope,
    Health,
    HistoryResponse,
    LifecycleRunRequest,
    LifecycleRunResponse,
    ListResponse,
    MemoryCell,
    PurgeRequest,
    PurgeResponse,
    RollbackRequest,
    SearchRequest,
    SearchResponse,
)
from ..bootstrap import build_service, load_settings
from ..service import MemoryService, spec_document
from .errors import BodySizeLimit, CatchUnexpected, HeaderSizeLimit, install_error_handlers
from .identity import Caller, IdentityResolver

log = logging.getLogger("ampkit.server")

PREFIX = "/amp/v1"

# An as-of read (extension): the cell or set as it was at this time, rebuilt from history.
# Not the admin runs' `as_of` clock override; see docs/time-travel.md.
AsOfQuery = Annotated[Optional[UtcDatetime], Query(
    description="extension (as-of read): the state at this time (RFC 3339; no offset means UTC), rebuilt from history")]

_ERRORS: dict[Any, dict[str, Any]] = {
    code: {"model": ErrorEnvelope} for code in (400, 401, 403, 409, 413, 415, 422, 429, 503)
}
_WRITE_ONLY: dict[Any, dict[str, Any]] = {204: {"description": "created; the key lacks the read scope, so no cell"}}


async def require_json(request: Request) -> None:  # async: no thread-pool hop
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json" and not ctype.endswith("+json"):
        raise UnsupportedMediaType(
            "request body must be JSON (Content-Type: application/json)", {"content_type": ctype or None}
        )


def create_app(settings: Optional[Settings] = None, service: Optional[MemoryService] = None) -> FastAPI:
    settings = settings or load_settings()
    service = service or build_service(settings)
    identity = IdentityResolver(settings, service.store)

    async def lifecycle_loop() -> None:
        interval = service.policy.interval_seconds
        while True:
            await asyncio.sleep(interval)
            try:
                # Servers sharing one database take turns: one run per interval in all.
                if not await run_in_threadpool(service.store.claim_scheduled_lifecycle, interval):
                    continue
                result = await run_in_threadpool(service.run_lifecycle)
                log.info("lifecycle run: %s", result.model_dump(exclude={"ran_at"}))
            except Exception:  # noqa: BLE001 - keep the scheduler alive; the next run retries
                log.exception("lifecycle run failed")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await run_in_threadpool(service.store.open)
        task = asyncio.create_task(lifecycle_loop()) if service.policy.interval_seconds > 0 else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
            await run_in_threadpool(service.store.close)

    app = FastAPI(
        title="ampkit",
        version=AMP_VERSION,
        summary="Agent Memory Protocol (AMP v0.1) server with ampkit extensions",
        lifespan=lifespan,
        docs_url=f"{PREFIX}/docs",
        redoc_url=None,
        openapi_url=f"{PREFIX}/openapi.json",
    )
    app.state.service = service
    app.state.settings = settings
    app.openapi = _with_security_schemes(app)
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=service.limits.max_request_bytes)
    app.add_middleware(HeaderSizeLimit, max_bytes=settings.max_header_bytes)
    app.add_middleware(CatchUnexpected)  # outermost of ours: see its docstring

    CallerDep = Annotated[Caller, Depends(identity.caller)]
    AdminDep = Annotated[Caller, Depends(identity.admin)]
    router = APIRouter(prefix=PREFIX, responses=_ERRORS)

    @router.get("/health", response_model=Health, tags=["meta"],
                responses={503: {"model": ErrorEnvelope, "description": "the store cannot be reached"}})
    def health() -> Health:
        # Readiness, not just liveness: a load balancer takes a server whose store is down
        # out of rotation (503 UNAVAILABLE) and back when the store returns.
        service.store.ping()
        return Health()

    @router.get("/spec", tags=["meta"])
    def spec() -> dict[str, Any]:
        return spec_document(service, identity.describe())

    # A body that contains a cell needs the `read` scope: a write-only key gets 204 (and, for
    # one new cell, its address in Location), never the cell.
    @router.post("/memories", status_code=201, response_model=MemoryCell, tags=["memories"],
                 dependencies=[Depends(require_json)], responses=_WRITE_ONLY)
    def create_memory(body: CellCreate, caller: CallerDep) -> Any:
        cell = service.create(caller.write(), body)
        if not caller.may("read"):
            return Response(status_code=204, headers={"Location": f"{PREFIX}/memories/{cell.id}"})
        return cell

    @router.post("/memories/batch", status_code=201, response_model=BatchCreateResponse, tags=["memories"],
                 dependencies=[Depends(require_json)], responses=_WRITE_ONLY)
    def create_memories(body: BatchCreate, caller: CallerDep) -> Any:
        cells = service.create_many(caller.write(), body.cells)
        return BatchCreateResponse(results=cells) if caller.may("read") else Response(status_code=204)

    @router.post("/memories/search", response_model=SearchResponse,
                 tags=["memories"], dependencies=[Depends(require_json)])
    def search_memories(body: SearchRequest, caller: CallerDep) -> SearchResponse:
        return service.search(caller.read(), body)

    def list_route(
        caller: CallerDep,
        owner_id: Optional[str] = None,
        type: Annotated[Optional[list[str]], Query()] = None,
        status: Annotated[Optional[list[str]], Query()] = None,
        session_id: Optional[str] = None,
        include_stale: bool = False,
        include_superseded: bool = False,
        limit: Annotated[Optional[int], Query(ge=1, le=service.limits.max_page_size)] = None,
        cursor: Optional[str] = None,
        metadata: Annotated[Optional[str], Query(description="extension: JSON object, equality filter on content.metadata keys")] = None,
        as_of: AsOfQuery = None,
    ) -> ListResponse:
        results, total, next_cursor = service.list(
            caller.read(),
            owner_id=owner_id,
            types=_split(type, ("episodic", "semantic", "procedural")),
            status=_split(status, ("active", "stale", "archived", "deleted")),
            include_stale=include_stale,
            include_superseded=include_superseded,
            session_id=session_id,
            metadata=_metadata_filter(metadata),
            limit=limit,
            cursor=cursor,
            as_of=as_of,
        )
        return ListResponse(results=results, total=total, next_cursor=next_cursor)

    # Registered before /memories/{memory_id} so that no id route shadows them.
    router.add_api_route("/memories", list_route, methods=["GET"], response_model=ListResponse, tags=["memories"])
    router.add_api_route("/memories/query", list_route, methods=["GET"], response_model=ListResponse,
                         tags=["memories"], summary="Alias of GET /memories (AMP v0.1 name)")

    @router.get("/export", tags=["memories"])
    def export(caller: CallerDep, owner_id: Optional[str] = None) -> dict[str, Any]:
        cells = service.export(caller.read(), owner_id=owner_id)
        return {"amp_version": AMP_VERSION, "count": len(cells), "cells": [c.model_dump(mode="json") for c in cells]}

    @router.get("/memories/{memory_id}", response_model=MemoryCell, tags=["memories"])
    def get_memory(memory_id: str, caller: CallerDep, as_of: AsOfQuery = None) -> MemoryCell:
        return service.get(caller.read(), memory_id, as_of=as_of)

    @router.patch("/memories/{memory_id}", response_model=MemoryCell, tags=["memories"],
                  dependencies=[Depends(require_json)],
                  responses={204: {"description": "applied; the caller may write but not read this cell "
                                                  "(or its key lacks the read scope)"}})
    def patch_memory(
        memory_id: str,
        body: CellPatch,
        caller: CallerDep,
        if_match: Annotated[Optional[int], Header(description="extension: expected lifecycle.version")] = None,
    ) -> Any:
        updated = service.update(caller.write(), memory_id, body, expected_version=if_match,
                                 may_read=caller.may("read"))
        return Response(status_code=204) if updated is None else updated

    @router.delete("/memories/{memory_id}", status_code=204, tags=["memories"])
    def delete_memory(memory_id: str, caller: CallerDep) -> Response:
        service.delete(caller.write(), memory_id)
        return Response(status_code=204)

    @router.post("/memories/{memory_id}/rollback", response_model=MemoryCell, tags=["memories"],
                 dependencies=[Depends(require_json)],
                 responses={204: {"description": "applied; the caller may write but not read this cell"}})
    def rollback_memory(
        memory_id: str,
        body: RollbackRequest,
        caller: CallerDep,
        if_match: Annotated[Optional[int], Header(description="extension: expected lifecycle.version")] = None,
    ) -> Any:
        restored = service.rollback(caller.write(), memory_id, body.to_version, expected_version=if_match,
                                    may_read=caller.may("read"))
        return Response(status_code=204) if restored is None else restored

    @router.get("/memories/{memory_id}/history", response_model=HistoryResponse, tags=["memories"])
    def memory_history(memory_id: str, caller: CallerDep) -> HistoryResponse:
        return HistoryResponse(results=service.history(caller.read(), memory_id))

    @router.post("/admin/lifecycle/run", response_model=LifecycleRunResponse, tags=["admin"])
    def run_lifecycle(caller: AdminDep, body: Optional[LifecycleRunRequest] = None) -> LifecycleRunResponse:
        return service.run_lifecycle(as_of=body.as_of if body else None)

    @router.get("/admin/export", tags=["admin"], response_class=StreamingResponse,
                responses={200: {"content": {portable.MEDIA_TYPE: {"schema": {"type": "string"}}},
                                 "description": "the NDJSON export (docs/time-travel.md), streamed"}})
    def export_ndjson(
        caller: AdminDep,
        owner_id: Optional[str] = None,
        cursor: Annotated[Optional[str], Query(description="resume after the line carrying this cursor")] = None,
    ) -> StreamingResponse:
        portable.check_cursor(cursor)  # a bad cursor is a 422 before the stream starts
        return StreamingResponse(portable.export_lines(service.store, owner_id, cursor), media_type=portable.MEDIA_TYPE)

    @router.post("/admin/import", response_model=portable.ImportReport, tags=["admin"],
                 openapi_extra={"requestBody": {"required": True, "content": {
                     portable.MEDIA_TYPE: {"schema": {"type": "string", "description": "an NDJSON export"}}}}})
    async def import_ndjson(request: Request, caller: AdminDep) -> portable.ImportReport:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in (portable.MEDIA_TYPE, "application/jsonl"):
            raise UnsupportedMediaType(f"the body must be NDJSON (Content-Type: {portable.MEDIA_TYPE})",
                                       {"content_type": ctype or None})
        body = await request.body()  # bounded by max_request_bytes; larger files: `ampkit import`
        return await run_in_threadpool(
            portable.import_lines, service.store, lambda: body.splitlines(), service.retriever)

    @router.post("/admin/purge", response_model=PurgeResponse, tags=["admin"])
    def purge(caller: AdminDep, body: Optional[PurgeRequest] = None) -> PurgeResponse:
        body = body or PurgeRequest()
        return service.purge(caller.agent_id, ids=body.ids, as_of=body.as_of)

    app.include_router(router)
    return app


def _metadata_filter(raw: Optional[str]) -> Optional[dict[str, Any]]:
    """`?metadata={"k": "v"}`: the same equality filter that search takes in its body."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ValidationFailed("metadata must be a JSON object", {"param": "metadata"}) from exc
    if not isinstance(value, dict):
        raise ValidationFailed("metadata must be a JSON object", {"param": "metadata"})
    return value


def _with_security_schemes(app: FastAPI):
    """Declare how callers identify themselves: the trusted header (auth off) or a Bearer key
    (auth on). Identity is resolved in one dependency, so the document is annotated here."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        schema.setdefault("components", {})["securitySchemes"] = {
            "agentId": {"type": "apiKey", "in": "header", "name": "X-AMP-Agent-ID",
                        "description": "the calling agent, trusted as given (auth off; local use)"},
            "bearerKey": {"type": "http", "scheme": "bearer",
                          "description": "an API key from `ampkit keys create` (auth required)"},
        }
        for path, operations in schema.get("paths", {}).items():
            open_route = path in (f"{PREFIX}/health", f"{PREFIX}/spec")
            for operation in operations.values():
                operation["security"] = [] if open_route else [{"agentId": []}, {"bearerKey": []}]
        return schema

    return openapi


def _split(values: Optional[list[str]], allowed: tuple[str, ...]) -> Optional[list[str]]:
    """Accept `?type=a&type=b` and `?type=a,b`; refuse unknown values."""
    if not values:
        return None
    out = [v.strip() for value in values for v in value.split(",") if v.strip()]
    bad = [v for v in out if v not in allowed]
    if bad:
        raise ValidationFailed(f"unknown value(s) {bad}; allowed: {list(allowed)}", {"invalid": bad})
    return out or None
