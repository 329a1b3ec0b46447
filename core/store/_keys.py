"""API-key rows, shared by the SQL stores: the columns, record <-> row, and the two reads.

The writes stay in each store (each has its own transaction and duplicate-key error)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Optional, Sequence

from .base import ApiKeyRecord

KEY_COLUMNS = "key_id, agent_id, scopes, secret_hash, created_at, expires_at, revoked_at, replaced_by"


def key_to_row(key: ApiKeyRecord, stamp: Callable[[Optional[datetime]], Any] = lambda t: t) -> tuple:
    """The INSERT parameters in KEY_COLUMNS order; `stamp` encodes times for the driver."""
    return (key.key_id, key.agent_id, ",".join(key.scopes), key.secret_hash, stamp(key.created_at),
            stamp(key.expires_at), stamp(key.revoked_at), key.replaced_by)


def _when(value: Any) -> Optional[datetime]:
    # SQLite keeps ISO strings, PostgreSQL returns timestamptz as datetimes.
    return value if value is None or isinstance(value, datetime) else datetime.fromisoformat(value)


def key_from_row(row: Sequence[Any]) -> ApiKeyRecord:
    key_id, agent_id, scopes, secret_hash, created, expires, revoked, replaced_by = row
    created_at = _when(created)
    assert created_at is not None  # NOT NULL in both schemas
    return ApiKeyRecord(key_id, agent_id, tuple(s for s in scopes.split(",") if s), secret_hash,
                        created_at, _when(expires), _when(revoked), replaced_by)


class SQLKeyReads:
    """`get_key` and `list_keys` for a store with `_query(sql, params)`; PARAM is its placeholder."""

    PARAM = "?"

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:  # provided by the store
        raise NotImplementedError

    def get_key(self, key_id: str) -> Optional[ApiKeyRecord]:
        rows = self._query(f"SELECT {KEY_COLUMNS} FROM api_keys WHERE key_id = {self.PARAM}", (key_id,))
        return key_from_row(rows[0]) if rows else None

    def list_keys(self, agent_id: Optional[str] = None) -> list[ApiKeyRecord]:
        where, params = (f"WHERE agent_id = {self.PARAM}", [agent_id]) if agent_id is not None else ("", [])
        rows = self._query(f"SELECT {KEY_COLUMNS} FROM api_keys {where} ORDER BY created_at, key_id", params)
        return [key_from_row(r) for r in rows]
