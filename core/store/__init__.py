"""Stores, chosen by URL: `sqlite:///path`, `memory://`, `postgresql://...`."""

from __future__ import annotations

from urllib.parse import urlsplit

from .base import Candidate, CellFilter, HistoryRecord, Store, StoredVector, WriteTx

__all__ = ["Candidate", "CellFilter", "HistoryRecord", "Store", "StoredVector", "WriteTx", "store_from_url"]


def store_from_url(url: str, **options) -> Store:
    """Build (not open) the store a URL names."""
    scheme = urlsplit(url).scheme.lower()
    if scheme == "sqlite":
        from .sqlite import SQLiteStore

        # sqlite:///relative.db, sqlite:////abs/path.db, sqlite:///:memory:
        path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else url[len("sqlite://"):]
        return SQLiteStore(path or ":memory:", **options)
    if scheme == "memory":
        from .sqlite import SQLiteStore

        return SQLiteStore(":memory:", **options)
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        try:
            from .postgres import PostgresStore
        except ImportError as exc:  # pragma: no cover - depends on the extra
            from ..errors import install_hint

            raise ImportError(f"the PostgreSQL store needs the postgres extra: {install_hint('postgres')}") from exc
        return PostgresStore(url, **options)
    raise ValueError(f"unknown store URL scheme {scheme!r}; use sqlite:///PATH, memory:// or postgresql://...")
