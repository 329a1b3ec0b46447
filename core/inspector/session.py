"""Inspector sessions: a signed cookie, a CSRF token per session, the key re-checked on every
request.

The cookie holds no secret of the caller's: `{agent, key_id, nonce, issued}` as JSON, then an
HMAC-SHA256 over it with the server's UI secret (`AMPKIT_UI_SECRET`, else a random one per
process, which signs everyone out at a restart). With auth on, every request looks the key up
again (`store.keys.get`): a key revoked or expired since sign-in ends the session at once, and
its scopes are read fresh. With auth off the cookie names the agent the person typed, and
every page says that identity is not verified.

CSRF: every POST form carries `csrf`, an HMAC of the session's nonce; the sign-in form, which
has no session yet, uses a nonce of its own in a short-lived cookie. The cookies are HttpOnly,
SameSite=Strict, scoped to the inspector's path, and Secure when the request came over HTTPS.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, Optional

from ..auth import SCOPES, key_state, verify_key
from ..access import check_agent_id
from ..errors import Forbidden
from ..store.base import Store

SESSION_COOKIE = "ampkit_ui"
SIGNIN_COOKIE = "ampkit_ui_signin"
SESSION_LIFETIME = timedelta(hours=8)


@dataclass(frozen=True)
class UiSession:
    """Who the pages act as: the agent, the key it signed in with (None: auth off), the key's
    scopes as of this request, and the session's CSRF token."""

    agent: str
    key_id: Optional[str]
    scopes: frozenset[str]
    csrf: str
    nonce: str

    @property
    def verified(self) -> bool:
        return self.key_id is not None

    def need(self, scope: str) -> str:
        if scope not in self.scopes:
            raise Forbidden(f"this key lacks the {scope!r} scope", {"required_scope": scope})
        return self.agent

    def may(self, scope: str) -> bool:
        return scope in self.scopes

    @property
    def operator(self) -> bool:
        """Signed in with a key that has the `admin` scope: the pages read every owner's cells
        (inspector/operator.py). Never with auth off, where the identity is only typed."""
        return self.verified and "admin" in self.scopes

    @property
    def may_approve(self) -> bool:
        """Decides file proposals for any owner (the files API's approver rule)."""
        return "approve" in self.scopes or "admin" in self.scopes


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SessionSigner:
    """Signs and checks the inspector's cookies and CSRF tokens."""

    def __init__(self, store: Store, *, auth_required: bool, secret: Optional[str] = None,
                 clock: Callable[[], datetime]):
        self.store = store
        self.auth_required = auth_required
        self.secret = (secret or secrets.token_urlsafe(32)).encode()
        self.clock = clock
        self._ended: dict[str, datetime] = {}  # nonce -> when its cookie would expire (signed out)
        self._lock = threading.Lock()

    def _mac(self, purpose: str, payload: str) -> str:
        return _b64(hmac.new(self.secret, f"{purpose}\0{payload}".encode(), hashlib.sha256).digest())

    # ------------------------------------------------------------ sign-in form
    def signin_nonce(self) -> str:
        return secrets.token_urlsafe(16)

    def signin_token(self, nonce: str) -> str:
        return self._mac("signin", nonce)

    def check_signin_token(self, nonce: Optional[str], token: Optional[str]) -> None:
        if not nonce or not token or not hmac.compare_digest(self.signin_token(nonce), token):
            raise Forbidden("the sign-in form expired or came from another site; reload the page and try again",
                            {"csrf": "invalid"})

    # ------------------------------------------------------------ sessions
    def sign_in(self, credential: str) -> tuple[str, UiSession]:
        """(cookie value, session) for an API key (auth on) or an agent id (auth off)."""
        now = self.clock()
        if self.auth_required:
            key = verify_key(self.store, credential, now=now)
            agent, key_id, scopes = key.agent_id, key.key_id, frozenset(key.scopes)
        else:
            agent, key_id, scopes = check_agent_id(credential), None, frozenset(SCOPES)
        nonce = secrets.token_urlsafe(16)
        payload = _b64(json.dumps({"a": agent, "k": key_id, "n": nonce, "t": now.timestamp()},
                                  separators=(",", ":")).encode())
        cookie = f"{payload}.{self._mac('session', payload)}"
        return cookie, UiSession(agent, key_id, scopes, self._mac("csrf", nonce), nonce)

    def session(self, cookie: Optional[str]) -> Optional[UiSession]:
        """The session a cookie carries, or None when it is missing, forged, expired, signed
        out, or its key is no longer valid."""
        if not cookie or "." not in cookie:
            return None
        payload, mac = cookie.rsplit(".", 1)
        if not hmac.compare_digest(self._mac("session", payload), mac):
            return None
        try:
            data: dict[str, Any] = json.loads(_unb64(payload))
            agent, key_id, nonce, issued = str(data["a"]), data["k"], str(data["n"]), float(data["t"])
        except (ValueError, KeyError, TypeError):
            return None
        now = self.clock()
        if now.timestamp() - issued > SESSION_LIFETIME.total_seconds() or nonce in self._ended:
            return None
        if self.auth_required:
            if key_id is None:
                return None  # a cookie from when this server ran with auth off
            key = self.store.keys.get(str(key_id))
            if key is None or key.agent_id != agent or key_state(key, now) != "active":
                return None
            scopes = frozenset(key.scopes)
        else:
            if key_id is not None:
                return None
            scopes = frozenset(SCOPES)
        return UiSession(agent, key_id, scopes, self._mac("csrf", nonce), nonce)

    def check_csrf(self, session: UiSession, token: Optional[str]) -> None:
        if not token or not hmac.compare_digest(session.csrf, token):
            raise Forbidden("the form expired or came from another site; reload the page and try again",
                            {"csrf": "invalid"})

    def sign_out(self, session: UiSession) -> None:
        """Refuse this session's cookie from now on (in this process; it expires anyway after
        SESSION_LIFETIME)."""
        now = self.clock()
        with self._lock:
            for nonce, until in list(self._ended.items()):
                if until < now:
                    del self._ended[nonce]
            self._ended[session.nonce] = now + SESSION_LIFETIME


__all__ = ["SESSION_COOKIE", "SESSION_LIFETIME", "SIGNIN_COOKIE", "SessionSigner", "UiSession"]
