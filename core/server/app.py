"""The `/amp/v1` HTTP app. Its routes are made from the operations table
(`ampkit.operations`): each validates the row's inputs, runs the row (one service method) and
serialises. Errors are translated once, in `errors.py` of this package."""


import asyncio
import contextvars
import functools
import importlib.util
import inspect
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Optional

from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from .. import portable
from ..bootstrap import build_service, load_settings, start_background, stop_background
from ..config import Settings
from ..embed_queue import EmbeddingWorker
from ..errors import UnsupportedMediaType, install_hint
from ..limits import Limits
from ..models import AMP_VERSION, ErrorEnvelope, IdString
from ..operations import OPERATIONS, PREFIX, Answer, Context, Operation
from ..service import MemoryService
from .hosts import HostAllowList, allowed_hosts
from .errors import BodySizeLimit, CatchUnexpected, HeaderSizeLimit, install_error_handlers
from .identity import Caller, IdentityResolver
from .routes import OperationRoute

log = logging.getLogger("ampkit.server")

KEYWORD = inspect.Parameter.KEYWORD_ONLY
MCP_CAPABILITY = {"path": "/mcp", "transport": "streamable-http", "identity": "as on /amp/v1"}

_ERRORS: dict[Any, dict[str, Any]] = {
    code: {"model": ErrorEnvelope} for code in (400, 401, 403, 409, 413, 415, 422, 429, 503)
}


async def require_json(request: Request) -> None:  # async: no thread-pool hop
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json" and not ctype.endswith("+json"):
        raise UnsupportedMediaType(
            "request body must be JSON (Content-Type: application/json)", {"content_type": ctype or None}
        )


def _native_telemetry() -> dict[str, Any]:
    """FastAPI's native OpenTelemetry, off when no provider is configured as the app is made.

    FastAPI (0.16x) traces and measures each request when a global OpenTelemetry provider is
    configured, and asks the three global providers whether one is on every request, a
    noticeable share of a cheap request's CPU. Asked once instead: a provider set up before the server starts (`opentelemetry-instrument ampkit
    serve`, or an application's own set-up before `create_app`) keeps FastAPI's tracing as
    it was; one configured only later is not seen (docs/configuration.md)."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:  # an older FastAPI
        return {}
    if os.getenv("FASTAPI_OTEL_AUTO_CONFIGURE", "").lower() == "true":  # FastAPI configures them itself
        return {}
    try:
        from opentelemetry import _logs, metrics, trace
    except ImportError:
        return {}
    # The API's stand-ins until an SDK (or a vendor) sets a provider: the state FastAPI's own
    # per-request check looks for.
    placeholders = {"ProxyTracerProvider", "_ProxyMeterProvider", "ProxyLoggerProvider"}
    providers = (trace.get_tracer_provider(), metrics.get_meter_provider(), _logs.get_logger_provider())
    if all(type(provider).__name__ in placeholders for provider in providers):
        return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    return {}


def create_app(settings: Optional[Settings] = None, service: Optional[MemoryService] = None, *,
               monotonic: Callable[[], float] = time.monotonic) -> FastAPI:
    """The app for `settings` (loaded from the environment when absent), running `service`
    (built from `settings` when absent). Keys expire on the service's clock; `monotonic`
    refills the rate-limit buckets."""
    settings = settings or load_settings()
    service = service or build_service(settings)
    identity = IdentityResolver(settings, service.store, clock=service.clock, monotonic=monotonic)

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

    embedding = EmbeddingWorker(service, batch_size=settings.embed_batch_size)
    # The operations' worker threads (`_endpoint`); as many as anyio's default pool. Not shut
    # down with the lifespan: an app may be served again (tests do); idle threads end when the
    # app (and so the pool) is collected.
    workers = ThreadPoolExecutor(max_workers=40, thread_name_prefix="ampkit-request")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await run_in_threadpool(start_background, service, embedding)  # the store's loops, the embedding worker
        task = asyncio.create_task(lifecycle_loop()) if service.policy.interval_seconds > 0 else None
        try:
            async with (mcp.running() if mcp is not None else nullcontext()):
                yield
        finally:
            if task is not None:
                task.cancel()
            await run_in_threadpool(stop_background, service, embedding)

    app = FastAPI(
        title="ampkit",
        version=AMP_VERSION,
        summary="Agent Memory Protocol (AMP v0.1) server with ampkit extensions",
        lifespan=lifespan,
        docs_url=f"{PREFIX}/docs",
        redoc_url=None,
        openapi_url=f"{PREFIX}/openapi.json",
        **_native_telemetry(),
    )
    app.state.service = service
    app.state.settings = settings
    app.openapi = _with_security_schemes(app)  # type: ignore[method-assign]  # FastAPI's documented hook
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=service.limits.max_request_bytes)
    app.add_middleware(HeaderSizeLimit, max_bytes=settings.max_header_bytes)
    hosts = allowed_hosts(settings.host, settings.allowed_hosts)
    if hosts is not None:
        app.add_middleware(HostAllowList, allowed=hosts)
    app.add_middleware(CatchUnexpected)  # outermost of ours: see its docstring
    serves_mcp = _serves_mcp(settings)

    app.state.serving = Serving(service, identity, identity.describe(),
                                MCP_CAPABILITY if serves_mcp else None, workers)
    # The shared routes themselves, not `include_router`: an included router is re-made for
    # each app (prefix, dependencies) on its first request, rebuilding every route.
    app.router.routes.extend(api_routes(service.limits))
    if settings.ui:
        _mount_inspector(app, service, identity, settings)
    mcp = _mount_mcp(app, service, identity, settings) if serves_mcp else None
    return app


def _serves_mcp(settings: Settings) -> bool:
    """MCP over streamable HTTP at /mcp, unless switched off or the `mcp` extra is missing."""
    if not settings.mcp_http:
        return False
    if importlib.util.find_spec("mcp") is None:
        log.warning("MCP over HTTP is off: install ampkit[mcp] to serve /mcp")
        return False
    return True


def _mount_inspector(app: FastAPI, service: MemoryService, identity: IdentityResolver, settings: Settings) -> None:
    """The memory inspector's pages at /ui (docs/inspector.md), under the same identity rules
    and rate limit as /amp/v1."""
    missing = [name for name in ("jinja2", "multipart") if importlib.util.find_spec(name) is None]
    if missing:
        log.warning("the inspector at /ui is off: %s not installed (%s)", ", ".join(missing), install_hint("server"))
        return
    from ..inspector import create_inspector_app

    limiter = identity.rate_limiter
    secret = settings.ui_secret.get_secret_value() if settings.ui_secret else None
    app.mount("/ui", create_inspector_app(service, auth_required=identity.required, secret=secret,
                                          rate_check=limiter.check if limiter else None))


def _mount_mcp(app: FastAPI, service: MemoryService, identity: IdentityResolver, settings: Settings) -> Any:
    from ..mcp_http import mount_streamable_http

    def build() -> Any:  # on /mcp's first request (core/mcp_http.py)
        from ..mcp_server import ServiceGateway, build_mcp_server, caller_from_request

        return build_mcp_server(ServiceGateway(service, caller_from_request), host=settings.host,
                                max_request_bytes=service.limits.max_request_bytes)

    return mount_streamable_http(app, build, identity)


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
        open_routes = {PREFIX + path for op in OPERATIONS if op.scope is None
                       for path in (op.path, *(alias for alias, _ in op.aliases))}
        for path, operations in schema.get("paths", {}).items():
            open_route = path in open_routes
            for operation in operations.values():
                operation["security"] = [] if open_route else [{"agentId": []}, {"bearerKey": []}]
        return schema

    return openapi


@dataclass(frozen=True)
class Serving:
    """What one app's routes run against (`app.state.serving`): the routes themselves are
    built once per process (`api_router`) and find their app's service here."""

    service: MemoryService
    identity: IdentityResolver
    auth: dict[str, Any]  # GET /spec's description of how callers identify themselves
    mcp: Optional[dict[str, Any]]  # GET /spec's MCP capability, when /mcp is served
    workers: ThreadPoolExecutor  # where the rows run (the service blocks: SQLite, group commit)


def _serving(request: Request) -> Serving:
    return request.app.state.serving


async def _caller(request: Request) -> Caller:
    return await _serving(request).identity.caller(request)


async def _admin(request: Request) -> Caller:
    return await _serving(request).identity.admin(request)


# A row with a JSON body checks its Content-Type, then its caller: one dependency rather than
# two (FastAPI solves each dependency of each request anew, in Python), in the same order.
async def _json_caller(request: Request) -> Caller:
    await require_json(request)
    return await _caller(request)


async def _json_admin(request: Request) -> Caller:
    await require_json(request)
    return await _admin(request)


@functools.lru_cache(maxsize=8)
def api_routes(limits: Limits, route_class: type[APIRoute] = OperationRoute) -> tuple[BaseRoute, ...]:
    """The /amp/v1 routes for servers with these limits (they bound query parameters), made
    from the operations table once per process and shared by every app: building a route
    makes pydantic validators for each of its parameters and responses, slow enough to
    matter when every app (and every test server) paid it again.
    `route_class` APIRoute gives FastAPI's own request handler (tests compare the two)."""
    router = APIRouter(prefix=PREFIX, responses=_ERRORS, route_class=route_class)
    for op in OPERATIONS:
        endpoint = _endpoint(op, limits)
        options: dict[str, Any] = dict(
            methods=[op.method], name=op.name, response_model=op.response, status_code=op.status_code,
            tags=list(op.tags), responses=dict(op.responses) or None,
            dependencies=[Depends(require_json)] if _checks_json(op) and op.scope is None else None,
        )
        router.add_api_route(op.path, endpoint, **options)
        for path, summary in op.aliases:
            router.add_api_route(path, endpoint, summary=summary, **options)

    # Byte streams, not JSON operations: NDJSON export and import (docs/time-travel.md) are
    # written here rather than as rows, since neither has a model body nor an in-process twin.
    admin = Annotated[Caller, Depends(_admin)]

    @router.get("/admin/export", tags=["admin"], response_class=StreamingResponse,
                responses={200: {"content": {portable.MEDIA_TYPE: {"schema": {"type": "string"}}},
                                 "description": "the NDJSON export (docs/time-travel.md), streamed"}})
    def export_ndjson(
        request: Request,
        caller: admin,
        owner_id: Optional[IdString] = None,
        cursor: Annotated[Optional[str], Query(description="resume after the line carrying this cursor")] = None,
    ) -> StreamingResponse:
        # Every parameter is checked before the stream starts: once the 200 and the first chunk
        # are sent, an error can only break the stream, never become a 4xx in the envelope.
        portable.check_cursor(cursor)
        lines = portable.export_lines(_serving(request).service.store, owner_id, cursor)
        return StreamingResponse(portable.in_chunks(lines), media_type=portable.MEDIA_TYPE)

    @router.post("/admin/import", response_model=portable.ImportReport, tags=["admin"],
                 openapi_extra={"requestBody": {"required": True, "content": {
                     portable.MEDIA_TYPE: {"schema": {"type": "string", "description": "an NDJSON export"}}}}})
    async def import_ndjson(request: Request, caller: admin) -> portable.ImportReport:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in (portable.MEDIA_TYPE, "application/jsonl"):
            raise UnsupportedMediaType(f"the body must be NDJSON (Content-Type: {portable.MEDIA_TYPE})",
                                       {"content_type": ctype or None})
        body = await request.body()  # bounded by max_request_bytes; larger files: `ampkit import`
        service = _serving(request).service
        return await run_in_threadpool(
            portable.import_lines, service.store, lambda: body.splitlines(), service.retriever, limits=service.limits)

    return tuple(router.routes)


def _checks_json(op: Operation) -> bool:
    """Whether the row's requests must declare a JSON body (`require_json`)."""
    return op.request is not None and op.body_required


def _endpoint(op: Operation, limits: Limits) -> Callable[..., Any]:
    """A FastAPI endpoint for one row: its signature declares the row's body, parameters and
    identity dependency (FastAPI reads it for validation and the OpenAPI document); its body
    runs the row in one of the app's `workers`: a plain executor rather than FastAPI's thread
    pool (anyio), whose hop adds event-loop CPU to every request (a cancel scope, a capacity
    limiter, an extra checkpoint; bench/writes.py measures it). A
    create on a store that commits in groups awaits `run_grouped` on the loop instead."""
    parameters = [inspect.Parameter("request", KEYWORD, annotation=Request)]
    if op.scope is not None:
        if _checks_json(op):
            resolve = _json_admin if op.scope == "admin" else _json_caller
        else:
            resolve = _admin if op.scope == "admin" else _caller
        parameters.append(inspect.Parameter("caller", KEYWORD, annotation=Annotated[Caller, Depends(resolve)]))
    for param in op.params:
        annotation = param.annotation
        if param.source != "path":
            marker = Query if param.source == "query" else Header
            bounds = param.bounds(limits) if param.bounds else {}
            annotation = Annotated[annotation, marker(description=param.description, **bounds)]
        default = inspect.Parameter.empty if param.required else param.default
        parameters.append(inspect.Parameter(param.name, KEYWORD, annotation=annotation, default=default))
    if op.request is not None:
        body_type = op.request if op.body_required else Optional[op.request]
        default = inspect.Parameter.empty if op.body_required else None
        parameters.append(inspect.Parameter("body", KEYWORD, annotation=body_type, default=default))

    def context_of(serving: Serving, inputs: dict[str, Any]) -> Context:
        caller: Optional[Caller] = inputs.pop("caller", None)
        agent = "" if caller is None else caller.agent_id if op.scope == "admin" else caller.need(op.scope or "")
        for scope in op.extra_scopes:
            if caller is not None:
                caller.need(scope)
        may_read = caller is None or caller.may("read")
        scopes = caller.scopes if caller is not None else frozenset()
        return Context(serving.service, agent, serving.auth, serving.mcp, may_read=may_read, scopes=scopes,
                       admin_key=caller is not None and caller.admin_key)

    def response_of(result: Any) -> Any:
        if isinstance(result, Answer):
            return JSONResponse(jsonable_encoder(result.value), status_code=result.status_code, headers=dict(result.headers))
        return Response(status_code=204) if result is None else result

    def run_row(serving: Serving, inputs: dict[str, Any]) -> Any:
        return response_of(op.run(context_of(serving, inputs), inputs))

    async def endpoint(request: Request, **inputs: Any) -> Any:
        serving = _serving(request)
        grouped = op.grouped(serving.service)
        if grouped is not None:  # waits for its group commit on the loop: no worker thread of its own
            return response_of(await grouped(context_of(serving, inputs), inputs))
        context = contextvars.copy_context()  # what FastAPI's pool would have carried over
        return await asyncio.get_running_loop().run_in_executor(serving.workers, context.run, run_row, serving, inputs)

    endpoint.__name__ = op.name
    endpoint.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    return endpoint
