"""ampkit: one shared long-term memory for AI agents, over the AMP v0.1 wire protocol."""

from __future__ import annotations

from .client import AsyncClient, Client, ConfigError, SearchResult, aconnect, connect
from .errors import (
    AccessDenied,
    AmpkitError,
    APIError,
    Conflict,
    FileManaged,
    Forbidden,
    InvalidTransition,
    MissingAgentId,
    ModelError,
    NotConfigured,
    NotFound,
    PayloadTooLarge,
    PolicyChangeDenied,
    RateLimited,
    TransportError,
    Unauthorized,
    Unavailable,
    ValidationFailed,
)
from .models import AMP_VERSION, MemoryCell



def __getattr__(name: str) -> str:
    # `ampkit.__version__` reads the installed metadata (one source: pyproject.toml) when asked:
    # importlib.metadata is a noticeable share of a bare `import ampkit`.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("ampkit")
        except PackageNotFoundError:  # pragma: no cover - a source tree that is not installed
            return "0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "AMP_VERSION",
    "AccessDenied",
    "AmpkitError",
    "APIError",
    "AsyncClient",
    "Client",
    "ConfigError",
    "Conflict",
    "FileManaged",
    "Forbidden",
    "InvalidTransition",
    "MemoryCell",
    "MissingAgentId",
    "ModelError",
    "NotConfigured",
    "NotFound",
    "PayloadTooLarge",
    "PolicyChangeDenied",
    "RateLimited",
    "SearchResult",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "ValidationFailed",
    "aconnect",
    "connect",
]
