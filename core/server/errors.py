"""Every error leaves the server as `{"error": {"code", "message", "details"}}`.

One table maps exceptions to that envelope: our own `APIError`s, request validation,
malformed JSON, Starlette's 404/405, oversized bodies, and anything unexpected (500)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import (
    APIError,
    InternalError,
    MalformedRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    validation_to_api_error,
)

log = logging.getLogger("ampkit.server")


def envelope_response(exc: APIError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(exc.envelope(), status_code=exc.status, headers=headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves on this path (Starlette's 405 names only the first
    route that matched the path, e.g. `Allow: POST` on /memories, which also takes GET)."""
    methods: set[str] = set()
    routes = list(request.app.router.routes)
    while routes:
        route = routes.pop()
        inner = getattr(route, "original_router", None)  # FastAPI wraps included routers
        if inner is not None:
            routes.extend(inner.routes)
        elif route.matches(request.scope)[0] != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        headers = {"Retry-After": str(exc.details["retry_after"])} if "retry_after" in exc.details else {}
        if isinstance(exc, Unauthorized):
            headers["WWW-Authenticate"] = 'Bearer realm="ampkit"'
        return envelope_response(exc, headers or None)

    @app.exception_handler(RequestValidationError)
    async def request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return envelope_response(validation_to_api_error(list(exc.errors())))

    @app.exception_handler(ValidationError)
    async def model_validation(request: Request, exc: ValidationError) -> JSONResponse:
        return envelope_response(validation_to_api_error([dict(e) for e in exc.errors()]))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 404:
            err: APIError = NotFound(f"no route {request.method} {request.url.path}")
        elif exc.status_code == 400 and isinstance(exc.__cause__, (ValueError, RecursionError)):
            # FastAPI's body parser: not UTF-8 (UnicodeDecodeError) or nested too deep for the
            # JSON decoder (RecursionError). Both are bodies that are not usable JSON.
            err = MalformedRequest("request body is not valid JSON (UTF-8 text, not nested too deeply)",
                                   {"reason": type(exc.__cause__).__name__})
        elif exc.status_code == 405:
            allowed = allowed_methods(request)
            err = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}", {"allowed": allowed})
            headers["Allow"] = ", ".join(allowed)
        else:
            err = APIError(str(exc.detail), code="HTTP_ERROR")
            err.status = exc.status_code
        return envelope_response(err, headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return envelope_response(InternalError("internal server error; see the server log"))


class CatchUnexpected:
    """Answer an unhandled exception with 500 in the envelope and keep the connection.

    Starlette's outermost error middleware re-raises after answering, and the HTTP server
    then closes the keep-alive connection; this middleware sits inside it, logs, answers and
    stops the exception there."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            if started:  # half an answer is on the wire: only closing the connection is honest
                raise
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            await envelope_response(InternalError("internal server error; see the server log"))(scope, receive, send)


class BodySizeLimit:
    """Refuse request bodies over `max_bytes` with 413 in the envelope, before parsing them.

    Checks Content-Length up front (the HTTP layer then reads no more than that) and counts
    the bytes of a body without one (chunked)."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    break  # counted below
                if declared > self.max_bytes:
                    await self._refuse(scope, receive, send)
                    return
                if declared >= 0:
                    # The HTTP layer reads no more of a body than its declared length (what
                    # follows is the next request): nothing to count.
                    await self.app(scope, receive, send)
                    return
                break
        seen = 0
        started = exceeded = False

        async def limited_receive() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    exceeded = True
                    raise _BodyTooLarge()
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if exceeded:
                # The body parser may catch our exception and answer 400 itself: answer 413
                # instead, and drop whatever the app says about the truncated body.
                if not started:
                    started = True
                    await self._refuse(scope, receive, send)
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        too_large = PayloadTooLarge(f"request body exceeds {self.max_bytes} bytes", {"max_request_bytes": self.max_bytes})
        await envelope_response(too_large, {"Connection": "close"})(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


class HeaderSizeLimit:
    """Refuse requests whose headers total more than `max_bytes` with 431 in the envelope.

    The HTTP layer (h11) already refuses heads it would have to buffer beyond that size; this
    catches a large head that arrived in one piece, before any route reads it."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = sum(len(name) + len(value) + 4 for name, value in scope.get("headers", []))
            if size > self.max_bytes:
                err = APIError(f"request headers exceed {self.max_bytes} bytes", {"max_header_bytes": self.max_bytes},
                               code="HEADERS_TOO_LARGE")
                err.status = 431
                await envelope_response(err, {"Connection": "close"})(scope, receive, send)
                return
        await self.app(scope, receive, send)

