"""`/mcp` in `ampkit serve`: MCP over streamable HTTP, beside /amp/v1 (the tools themselves are
in `mcp_server`).

The MCP server is built on the endpoint's first request, not at start-up: its imports and tool
definitions cost a core for a noticeable while, which every restart paid before answering
anything (`bench/startup.py` measures the start). This module imports nothing of the `mcp` package, so a server that is
never asked for MCP never loads it.
"""

from __future__ import annotations

import json
import math
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

import anyio
import anyio.abc
import anyio.to_thread

from .errors import APIError, MalformedRequest, MethodNotAllowed, Unavailable, ValidationFailed

MCP_PATH = "/mcp"
INVALID_PARAMS = -32602  # JSON-RPC
CALLER_SCOPE_KEY = "ampkit.caller"
"""Where `/mcp`'s identity check leaves the request's `Caller` in the ASGI scope."""


def envelope_text(err: APIError) -> str:
    """The error envelope as the HTTP API answers it (Starlette's JSONResponse encoding): the
    text of an MCP tool error."""
    return json.dumps(err.envelope(), ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _has_non_finite(value: Any) -> bool:
    """Whether a decoded JSON value holds NaN or an infinity anywhere (iteratively: a value
    nested as deep as the decoder allows must not exhaust the stack here)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


NON_FINITE = "numbers must be finite (JSON has no NaN or Infinity)"


def non_finite_refusal(message: Any) -> Optional[dict[str, Any]]:
    """The JSON-RPC answer to a decoded request whose parameters hold NaN or an infinity, or
    None when they hold none. Python's decoder accepts `NaN`, `Infinity` and `1e999`, and the
    SDK re-encodes a request before its handler runs, turning them into null (a tool would
    then store null, or a default where the argument is dropped); REST refuses them with 422.
    A tool call gets the tool error a 422 of the API would make (`mcp_server.tool_error`'s
    shape), any other request the JSON-RPC invalid-params error with the same envelope. Used
    by `MCPEndpoint` and the stdio loop (`mcp_server.AmpkitMCP.run_stdio_async`)."""
    if not isinstance(message, dict) or not _has_non_finite(message.get("params")):
        return None
    err = ValidationFailed(NON_FINITE, {"errors": [{"loc": ["params"], "msg": NON_FINITE, "type": "finite_number"}]})
    if message.get("method") == "tools/call":
        result = {"content": [{"type": "text", "text": envelope_text(err)}], "structuredContent": err.envelope(),
                  "isError": True}
        return {"jsonrpc": "2.0", "id": message.get("id"), "result": result}
    return {"jsonrpc": "2.0", "id": message.get("id"),
            "error": {"code": INVALID_PARAMS, "message": err.message, "data": err.envelope()}}


def mount_streamable_http(app: Any, build: Callable[[], Any], identity: Any) -> "MCPEndpoint":
    """Serve MCP over streamable HTTP at `/mcp` of the FastAPI `app`: the server `build` makes
    (on the first request), each request as the identity `identity` resolves (the REST API's
    `IdentityResolver`: a Bearer key with auth on, X-AMP-Agent-ID with auth off; its rate limit
    too). The app's lifespan must enter the returned endpoint's `running()`."""
    from starlette.routing import Route

    endpoint = MCPEndpoint(build, identity)
    app.router.routes.append(Route(MCP_PATH, endpoint=endpoint))
    return endpoint


class MCPEndpoint:
    """ASGI app (a class, so Starlette routes every method to it) that resolves the caller,
    then hands the request to the MCP session manager. An APIError raised by the identity
    check (401, 403, 429) is answered by the app's error handlers, in the same envelope and
    with the same headers as on /amp/v1.

    Stateless and JSON-only: every POST stands alone (identity is per request anyway), so
    several servers behind one load balancer need no session affinity.

    The MCP server (`build`, in a worker thread) and its session manager start with the first
    POST that passes the identity check; the manager then runs in the lifespan's task group
    until the lifespan ends."""

    def __init__(self, build: Callable[[], Any], identity: Any):
        self._build = build
        self.identity = identity
        self.mcp: Any = None  # built once per endpoint, kept across lifespans
        self._manager: Any = None
        self._tasks: Optional[anyio.abc.TaskGroup] = None
        self._starting: Optional[anyio.Lock] = None
        self._stop: Optional[anyio.Event] = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The app's lifespan: a started session manager (one per lifespan: a manager runs only
        once) ends with it."""
        async with anyio.create_task_group() as tasks:
            self._tasks, self._starting, self._stop = tasks, anyio.Lock(), anyio.Event()
            try:
                yield
            finally:
                self._tasks = None
                self._stop.set()

    async def _started(self) -> Any:
        """The running session manager, started by the first request that needs it."""
        if self._starting is None:
            raise Unavailable("the MCP endpoint is not running")
        async with self._starting:
            if self._manager is None:
                tasks = self._tasks
                if tasks is None:
                    raise Unavailable("the MCP endpoint is not running")
                if self.mcp is None:
                    self.mcp = await anyio.to_thread.run_sync(self._build)
                await tasks.start(self._run_manager, self.mcp)
            return self._manager

    async def _run_manager(self, mcp: Any, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        settings = mcp.settings
        manager = StreamableHTTPSessionManager(
            app=mcp._mcp_server, json_response=True, stateless=True,
            security_settings=settings.transport_security, max_request_body_size=settings.max_request_body_size,
        )
        stop = self._stop
        assert stop is not None
        async with manager.run():
            self._manager = manager
            task_status.started()
            try:
                await stop.wait()
            finally:
                self._manager = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from starlette.requests import Request

        if self._tasks is None:
            raise Unavailable("the MCP endpoint is not running")
        if scope["method"] != "POST":
            # Stateless: no server-to-client stream to GET and no session to DELETE (a GET
            # would otherwise hold a connection open that nothing ever writes to).
            from .server.errors import envelope_response

            refused = MethodNotAllowed(f"{scope['method']} is not allowed on {MCP_PATH}; MCP messages are POSTed",
                                       {"allowed": ["POST"]})
            await envelope_response(refused, {"Allow": "POST"})(scope, receive, send)
            return
        request = Request(scope, receive)
        scope[CALLER_SCOPE_KEY] = await self.identity.caller(request)
        body = await request.body()  # bounded by the app's max_request_bytes
        try:
            message = json.loads(body)
        except RecursionError:
            # The SDK's decoder raises it past its own handling (a 500); answered as on /amp/v1.
            raise MalformedRequest("request body is not valid JSON (UTF-8 text, not nested too deeply)",
                                   {"reason": "RecursionError"}) from None
        except ValueError:
            message = None  # the SDK answers it: 400 with a JSON-RPC parse error
        refusal = non_finite_refusal(message)
        if refusal is not None:
            from starlette.responses import JSONResponse

            await JSONResponse(refusal)(scope, receive, send)
            return
        manager = await self._started()
        await manager.handle_request(scope, _replay(body, receive), send)


def _replay(body: bytes, receive: Any) -> Callable[[], Awaitable[Any]]:
    """An ASGI `receive` that hands over the already-read `body`, then defers to `receive`
    (which then reports the disconnect)."""
    sent = False

    async def replayed() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
