"""Who is calling: resolved in one place for every route.

Mode `off` (local use): the caller is whoever `X-AMP-Agent-ID` names, with every scope.
Mode `required`: the caller comes from an API key (`Authorization: Bearer <key>`, see
`ampkit.auth`); the key's agent id is the identity. An `X-AMP-Agent-ID` header that names a
different agent is refused with 403 FORBIDDEN (a matching one is accepted), so a client
that believes it acts for someone else finds out instead of silently writing as the key's
agent. Routes ask `caller.read()` / `caller.write()` for the agent id, which also checks
the key's scope.

The per-agent rate limit is applied here too, once the identity is known.
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Optional

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from ..auth import SCOPES, verify_key
from ..config import Settings
from ..access import check_agent_id
from ..errors import Forbidden, Unauthorized
from ..models import utcnow
from ..store.base import Store
from .ratelimit import RateLimiter

AGENT_HEADER = "x-amp-agent-id"
ALL_SCOPES = frozenset(SCOPES)
# Used when auth is required and no rate limit is configured: generous for an agent loop,
# but it stops one runaway client from starving the others.
DEFAULT_AUTH_RATE_LIMIT = 50.0


@dataclass(frozen=True)
class Caller:
    agent_id: str
    scopes: frozenset[str] = field(default=ALL_SCOPES)
    key_id: Optional[str] = None

    def need(self, scope: str) -> str:
        """The agent id, if this caller holds `scope` (else 403 FORBIDDEN)."""
        if scope not in self.scopes:
            raise Forbidden(f"this key lacks the {scope!r} scope", {"required_scope": scope})
        return self.agent_id

    def may(self, scope: str) -> bool:
        return scope in self.scopes

    @property
    def admin_key(self) -> bool:
        """Identified by an API key with the `admin` scope (auth off grants every scope to
        whoever the header names, which is not an admin's key)."""
        return self.key_id is not None and "admin" in self.scopes

    def read(self) -> str:
        return self.need("read")

    def write(self) -> str:
        return self.need("write")


def rate_limiter_from_settings(settings: Settings, clock: Callable[[], float] = time.monotonic) -> Optional[RateLimiter]:
    rate = settings.rate_limit
    if rate is None:
        rate = DEFAULT_AUTH_RATE_LIMIT if settings.auth == "required" else 0.0
    return RateLimiter(rate, settings.rate_burst or None, clock=clock, processes=settings.workers) if rate > 0 else None


class IdentityResolver:
    """`clock` decides when a key has expired (the service's clock); `monotonic` refills the
    rate-limit buckets. Both are arguments so that tests move time instead of sleeping."""

    def __init__(self, settings: Settings, store: Store, *, clock: Callable[[], datetime] = utcnow,
                 monotonic: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.store = store
        self.clock = clock
        self.rate_limiter = rate_limiter_from_settings(settings, monotonic)

    @property
    def required(self) -> bool:
        return self.settings.auth == "required"

    def describe(self) -> dict[str, Any]:
        if self.required:
            auth: dict[str, Any] = {
                "mode": "required",
                "scheme": "bearer",
                "header": "Authorization",
                "scopes": list(SCOPES),
                "agent_header": "optional; must name the key's agent (else 403 FORBIDDEN)",
                "unauthenticated_routes": ["/health", "/spec"],
            }
        else:
            auth = {"mode": "off", "header": "X-AMP-Agent-ID"}
        auth["rate_limit"] = self.rate_limiter.describe() if self.rate_limiter else None
        return auth

    def _from_header(self, request: Request) -> Caller:
        return Caller(check_agent_id(request.headers.get(AGENT_HEADER)))

    def _from_key(self, request: Request) -> Caller:
        scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("this server requires an API key: Authorization: Bearer <key>")
        key = verify_key(self.store, token, now=self.clock())
        claimed = request.headers.get(AGENT_HEADER, "").strip()
        if claimed and check_agent_id(claimed) != key.agent_id:
            raise Forbidden(
                "X-AMP-Agent-ID names a different agent than the API key; the key decides the identity",
                {"key_agent_id": key.agent_id},
            )
        return Caller(key.agent_id, frozenset(key.scopes), key.key_id)

    async def caller(self, request: Request) -> Caller:
        # async: a sync dependency costs a thread-pool hop per request; only the key lookup
        # touches the store, so only it goes to a worker thread.
        if self.required:
            caller = await run_in_threadpool(self._from_key, request)
        else:
            caller = self._from_header(request)
        if self.rate_limiter is not None:
            self.rate_limiter.check(caller.agent_id)
        return caller

    async def admin(self, request: Request) -> Caller:
        caller = await self.caller(request)
        caller.need("admin")
        return caller


def is_loopback_host(host: str) -> bool:
    """True for `localhost` and loopback addresses; any other name might resolve elsewhere."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False
