"""ampkit: one shared long-term memory for AI agents, over the AMP v0.1 wire protocol."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .client import AsyncClient, Client, ConfigError, SearchResult, aconnect, connect
from .errors import (
    AccessDenied,
    AmpkitError,
    APIError,
    Conflict,
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

try:
    __version__ = version("ampkit")  # one source: the version in pyproject.toml
except PackageNotFoundError:  # pragma: no cover - running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = [
    "AMP_VERSION",
    "AccessDenied",
    "AmpkitError",
    "APIError",
    "AsyncClient",
    "Client",
    "ConfigError",
    "Conflict",
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
