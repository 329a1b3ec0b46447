"""API keys: create, list, revoke, rotate, verify.

A key reads `ampk_<key_id>_<secret>`. `key_id` (16 hex characters) is public: it names the
stored record and shows up in `ampkit keys list` and in logs. `secret` is 32 random bytes
(base64url, 43 characters) and is shown once, at creation. The store keeps only the SHA-256
of the secret: a secret with 256 bits of entropy needs no slow KDF or salt (nobody can
brute-force it from the hash), and verification stays one indexed lookup plus one hash per
request. The comparison is constant-time.

Scopes: `read` (get, list, search, history, export), `write` (create, patch, delete) and
`admin` (lifecycle runs, purge). `approve` lets a key decide other agents' proposed changes to
memory files (docs/files.md#approval); `admin` implies it. A key acts for exactly one agent id.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Iterable, Optional

from .access import check_agent_id
from .errors import APIError, Unauthorized
from .store.base import ApiKeyRecord

if TYPE_CHECKING:
    from .store.base import Store

KEY_PREFIX = "ampk_"
SCOPES = ("read", "write", "approve", "admin")
DEFAULT_SCOPES = ("read", "write")
_KEY_RE = re.compile(r"^ampk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def parse_duration(text: str) -> timedelta:
    """`90s`, `15m`, `24h`, `30d`, `2w` (a bare number is seconds)."""
    match = _DURATION_RE.match(text or "")
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 15m, 24h, 30d)")
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def parse_scopes(scopes: Iterable[str] | str) -> tuple[str, ...]:
    items = scopes.split(",") if isinstance(scopes, str) else list(scopes)
    wanted = {s.strip().lower() for s in items if s.strip()}
    unknown = sorted(wanted - set(SCOPES))
    if unknown or not wanted:
        raise ValueError(f"scopes must be a non-empty subset of {list(SCOPES)}; got {sorted(wanted)}")
    return tuple(s for s in SCOPES if s in wanted)


def key_state(key: ApiKeyRecord, now: Optional[datetime] = None) -> str:
    """`active`, `expired` or `revoked`."""
    now = now or utcnow()
    if key.revoked_at is not None and key.revoked_at <= now:
        return "revoked"
    if key.expires_at is not None and key.expires_at <= now:
        return "expired"
    return "active"


@dataclass(frozen=True)
class IssuedKey:
    """A freshly created key: `token` is the only copy of the secret."""

    token: str
    record: ApiKeyRecord


def create_key(
    store: Store,
    agent_id: str,
    scopes: Iterable[str] | str = DEFAULT_SCOPES,
    expires_in: Optional[timedelta] = None,
    *,
    now: Optional[datetime] = None,
) -> IssuedKey:
    try:
        agent_id = check_agent_id(agent_id)
    except APIError:
        raise ValueError("agent id must be 1-256 printable characters") from None
    now = now or utcnow()
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    record = ApiKeyRecord(
        key_id=key_id,
        agent_id=agent_id,
        scopes=parse_scopes(scopes),
        secret_hash=hash_secret(secret),
        created_at=now,
        expires_at=now + expires_in if expires_in is not None else None,
    )
    store.keys.put(record)
    return IssuedKey(f"{KEY_PREFIX}{key_id}_{secret}", record)


def _existing(store: Store, key_id: str) -> ApiKeyRecord:
    key = store.keys.get(key_id)
    if key is None:
        raise KeyError(f"no key {key_id!r}")
    return key


def revoke_key(store: Store, key_id: str, *, now: Optional[datetime] = None) -> ApiKeyRecord:
    """Revoke now. Revoking an already revoked key keeps the first revocation time."""
    key = _existing(store, key_id)
    if key.revoked_at is None:
        key = replace(key, revoked_at=now or utcnow())
        store.keys.update(key)
    return key


def rotate_key(
    store: Store, key_id: str, overlap: timedelta = timedelta(hours=24), *, now: Optional[datetime] = None
) -> IssuedKey:
    """Issue a new key for the same agent and scopes; the old one stays valid for `overlap`
    and then expires. The new key keeps the old key's lifetime length, if it had one."""
    now = now or utcnow()
    old = _existing(store, key_id)
    if key_state(old, now) != "active":
        raise ValueError(f"key {key_id} is {key_state(old, now)}; only an active key can be rotated")
    lifetime = old.expires_at - old.created_at if old.expires_at is not None else None
    new = create_key(store, old.agent_id, old.scopes, lifetime, now=now)
    old_expiry = now + overlap
    if old.expires_at is not None:
        old_expiry = min(old_expiry, old.expires_at)
    store.keys.update(replace(old, expires_at=old_expiry, replaced_by=new.record.key_id))
    return new


def verify_key(store: Store, token: str, *, now: Optional[datetime] = None) -> ApiKeyRecord:
    """The record of a valid key, else `Unauthorized` (one message for every failure, so the
    answer does not tell a guesser whether a key id exists)."""
    match = _KEY_RE.match(token.strip())
    if not match:
        raise Unauthorized("invalid API key", {"reason": "malformed"})
    key_id, secret = match.groups()
    key = store.keys.get(key_id)
    # Hash even when the id is unknown, so the timing does not reveal which ids exist.
    presented = hash_secret(secret)
    expected = key.secret_hash if key is not None else "0" * 64
    if not hmac.compare_digest(presented, expected) or key is None:
        raise Unauthorized("invalid API key")
    state = key_state(key, now)
    if state != "active":
        raise Unauthorized(f"API key {key_id} is {state}", {"key_id": key_id, "state": state})
    return key

