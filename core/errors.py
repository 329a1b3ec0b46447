"""The one exception tree. Server, stores and every client raise these; the wire carries them
as `{"error": {"code", "message", "details"}}` and the clients turn that envelope back into
the same class.

    AmpkitError
    ├── TransportError            (client side: connection failed, timed out)
    └── APIError                  (.status, .code, .message, .details)
        ├── MalformedRequest      400 MALFORMED_JSON  (body is not valid JSON)
        ├── MissingAgentId        401 MISSING_AGENT_ID
        ├── Unauthorized          401 UNAUTHORIZED
        ├── AccessDenied          403 ACCESS_DENIED   (also: missing or deleted cell)
        ├── Forbidden             403 FORBIDDEN       (key lacks a scope / identity mismatch)
        ├── PolicyChangeDenied    403 POLICY_CHANGE_DENIED (a writer may change content, not who reads)
        ├── NotFound              404 NOT_FOUND       (unknown route only; never for a cell)
        ├── MethodNotAllowed      405 METHOD_NOT_ALLOWED
        ├── InvalidTransition     409 INVALID_TRANSITION
        ├── Conflict              409 CONFLICT        (version check failed)
        ├── FileManaged           409 USE_FILES_API   (the cell is a memory file: change it through /files)
        ├── PayloadTooLarge       413 PAYLOAD_TOO_LARGE
        ├── UnsupportedMediaType  415 UNSUPPORTED_MEDIA_TYPE
        ├── ValidationFailed      422 VALIDATION_ERROR
        ├── RateLimited           429 RATE_LIMITED
        ├── InternalError         500 INTERNAL_ERROR
        ├── NotConfigured         501 NOT_CONFIGURED  (e.g. consolidation without a model)
        ├── ModelError            502 MODEL_ERROR     (the model failed or answered unusable JSON)
        └── Unavailable           503 UNAVAILABLE     (store down, disk full or read-only)
"""

from __future__ import annotations

from typing import Any, Optional


class AmpkitError(Exception):
    """Base of every ampkit exception."""


class TransportError(AmpkitError):
    """The request never got an answer from the server (connection refused, timeout...)."""


class APIError(AmpkitError):
    status: int = 500
    code: str = "INTERNAL_ERROR"

    def __init__(self, message: str = "", details: Optional[dict[str, Any]] = None, *, code: Optional[str] = None):
        super().__init__(message or self.code)
        self.message = message or self.code
        self.details = details or {}
        if code is not None:
            self.code = code

    def envelope(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class MalformedRequest(APIError):
    status, code = 400, "MALFORMED_JSON"


class MissingAgentId(APIError):
    status, code = 401, "MISSING_AGENT_ID"


class Unauthorized(APIError):
    status, code = 401, "UNAUTHORIZED"


class AccessDenied(APIError):
    status, code = 403, "ACCESS_DENIED"


class Forbidden(APIError):
    status, code = 403, "FORBIDDEN"


class PolicyChangeDenied(APIError):
    """A change of a cell's access policy by a caller that may write the cell but is neither
    its owner nor its creator nor an admin key (`access.check_policy_change`)."""

    status, code = 403, "POLICY_CHANGE_DENIED"


class NotFound(APIError):
    status, code = 404, "NOT_FOUND"


class MethodNotAllowed(APIError):
    status, code = 405, "METHOD_NOT_ALLOWED"


class InvalidTransition(APIError):
    status, code = 409, "INVALID_TRANSITION"


class Conflict(APIError):
    status, code = 409, "CONFLICT"


class FileManaged(APIError):
    """The cell is a memory file: it changes only through the files API, where validation and
    approval apply (docs/files.md)."""

    status, code = 409, "USE_FILES_API"


class PayloadTooLarge(APIError):
    status, code = 413, "PAYLOAD_TOO_LARGE"


class UnsupportedMediaType(APIError):
    status, code = 415, "UNSUPPORTED_MEDIA_TYPE"


class ValidationFailed(APIError):
    status, code = 422, "VALIDATION_ERROR"


class RateLimited(APIError):
    status, code = 429, "RATE_LIMITED"


class InternalError(APIError):
    status, code = 500, "INTERNAL_ERROR"


class Unavailable(APIError):
    status, code = 503, "UNAVAILABLE"


class NotConfigured(APIError):
    """A feature needs configuration this server lacks (e.g. no model for consolidation)."""

    status, code = 501, "NOT_CONFIGURED"


class ModelError(APIError):
    """The configured model failed: unreachable, timed out, or answered unusable output."""

    status, code = 502, "MODEL_ERROR"


_BY_CODE: dict[str, type[APIError]] = {
    cls.code: cls
    for cls in (
        MalformedRequest, MissingAgentId, Unauthorized, AccessDenied, Forbidden, PolicyChangeDenied, NotFound,
        MethodNotAllowed, InvalidTransition, Conflict, FileManaged, PayloadTooLarge, UnsupportedMediaType,
        ValidationFailed,
        RateLimited, InternalError, Unavailable, NotConfigured, ModelError,
    )
}


# The one body every "you may not see this cell" answer uses, so that a missing, a deleted
# and a forbidden cell are indistinguishable on the wire.
ACCESS_DENIED_MESSAGE = "memory not found or access denied"


def access_denied() -> AccessDenied:
    return AccessDenied(ACCESS_DENIED_MESSAGE)


def error_from_envelope(status: int, body: Any) -> APIError:
    """Rebuild the exception a server answered with (used by the HTTP clients)."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        exc = APIError(f"HTTP {status} without an error envelope", {"body": body})
        exc.status = status
        return exc
    code = str(err.get("code", "INTERNAL_ERROR"))
    cls = _BY_CODE.get(code, APIError)
    exc = cls(str(err.get("message", code)), err.get("details") or {}, code=code)
    exc.status = status
    return exc


def _clean_errors(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Keep what a client needs; drop echoed input (may be huge) and pydantic's doc URLs.
    return [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in errors]


def validation_to_api_error(errors: list[dict[str, Any]]) -> APIError:
    """pydantic's error list -> the wire error (the server's request validation and the
    in-process clients both use this, so both answer the same code, message and details)."""
    if any(e.get("type") == "json_invalid" for e in errors):
        return MalformedRequest("request body is not valid JSON", {"errors": _clean_errors(errors)})
    first = errors[0] if errors else {}
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    return ValidationFailed(
        f"{where or 'request'}: {first.get('msg', 'invalid')}" if first else "invalid request",
        {"errors": _clean_errors(errors)},
    )


def install_hint(extra: str) -> str:
    """How to add an extra: ampkit is installed from its checkout or a built wheel (it is on
    no package index), so name both ways."""
    return (f"pip install -e '.[{extra}]' in ampkit's checkout, or "
            f"pip install 'dist/ampkit-<version>-py3-none-any.whl[{extra}]' (make dist builds it)")
