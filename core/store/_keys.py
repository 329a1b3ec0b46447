"""API-key storage for the SQL stores (`ampkit.store.base.ApiKeyStore`): one class, spelled per
database by the store's dialect. It shares the store's database and nothing else: keys are
not cells, and no cell read or write touches them."""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import Any, Callable, Optional, Sequence

from .base import ApiKeyRecord, ApiKeyStore
from .sql.dialects import Dialect

KEY_COLUMNS = "key_id, agent_id, scopes, secret_hash, created_at, expires_at, revoked_at, replaced_by"

Read = Callable[[str, Sequence[Any]], builtins.list[tuple]]
Execute = Callable[[str, Sequence[Any]], int]  # one durable statement; returns its row count


def _when(value: Any) -> Optional[datetime]:
    # SQLite keeps ISO strings, PostgreSQL returns timestamptz as datetimes.
    return value if value is None or isinstance(value, datetime) else datetime.fromisoformat(value)


def key_from_row(row: Sequence[Any]) -> ApiKeyRecord:
    key_id, agent_id, scopes, secret_hash, created, expires, revoked, replaced_by = row
    created_at = _when(created)
    assert created_at is not None  # NOT NULL in both schemas
    return ApiKeyRecord(key_id, agent_id, tuple(s for s in scopes.split(",") if s), secret_hash,
                        created_at, _when(expires), _when(revoked), replaced_by)


class SQLKeyStore(ApiKeyStore):
    """The `api_keys` table of a SQL store, read with `read` and written with `execute`."""

    def __init__(self, dialect: Dialect, read: Read, execute: Execute):
        self.dialect = dialect
        self._read = read
        self._execute = execute

    def _stamp(self, value: Optional[datetime]) -> Any:
        return None if value is None else self.dialect.timestamp(value)

    def put(self, key: ApiKeyRecord) -> None:
        p = self.dialect.param
        row = (key.key_id, key.agent_id, ",".join(key.scopes), key.secret_hash, self._stamp(key.created_at),
               self._stamp(key.expires_at), self._stamp(key.revoked_at), key.replaced_by)
        try:
            self._execute(f"INSERT INTO api_keys ({KEY_COLUMNS}) VALUES ({', '.join([p] * len(row))})", row)
        except Exception as exc:
            if self.dialect.is_unique_violation(exc):
                raise ValueError(f"key {key.key_id} already exists") from exc
            raise

    def get(self, key_id: str) -> Optional[ApiKeyRecord]:
        rows = self._read(f"SELECT {KEY_COLUMNS} FROM api_keys WHERE key_id = {self.dialect.param}", (key_id,))
        return key_from_row(rows[0]) if rows else None

    def list(self, agent_id: Optional[str] = None) -> builtins.list[ApiKeyRecord]:
        where, params = (f"WHERE agent_id = {self.dialect.param}", [agent_id]) if agent_id is not None else ("", [])
        rows = self._read(f"SELECT {KEY_COLUMNS} FROM api_keys {where} ORDER BY created_at, key_id", params)
        return [key_from_row(r) for r in rows]

    def update(self, key: ApiKeyRecord) -> None:
        p = self.dialect.param
        changed = self._execute(
            f"UPDATE api_keys SET expires_at = {p}, revoked_at = {p}, replaced_by = {p} WHERE key_id = {p}",
            (self._stamp(key.expires_at), self._stamp(key.revoked_at), key.replaced_by, key.key_id),
        )
        if changed == 0:
            raise KeyError(key.key_id)
