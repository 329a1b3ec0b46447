"""What a SQL store's in-memory indexes are to the store, in one place.

A store keeps rows; beside them, a SQLite store keeps three in-memory components over those
rows, each in a module of its own and each built over a real file alone in its tests:

- `AccessIndex` (`sqlite_access.py`): which rows a filter admits, with BM25's N and lengths
  over them; for reader-wide filters from the access snapshot (saved at close, resumed at
  open, patched by every commit);
- `KeywordIndex` (`sqlite_keyword.py`): the keyword leg (BM25 over the admitted rows'
  windows), with the postings cache and its warm-up;
- `VectorIndex` (`sqlite_vectors.py`): the dense leg, exact or approximate, caught up from the
  stored vectors, with its warm-up, graph build and drain.

Their budgets are one `CacheBudgets`, filled from `Settings` by the composition root. What
they need of the store is `SQLiteRows`; what the store tells them is a commit's changes
(`ChangeFeed`, `sqlite_changes.py`).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence

from ..scheduler import Scheduler
from .base import Candidate, CellFilter

MIB = 2**20


@dataclass(frozen=True)
class CacheBudgets:
    """The memory each in-memory cache of a store may hold (`Settings`: `cache_*`).

    Each cache drops its least recently used entries past its budget; an evicted entry only
    costs reading or computing it again."""

    # SQLite: each term's rows read from the FTS index (most words: 5 bytes a row); the most
    # common words are the ones a wide search needs again.
    postings_bytes: int = 256 * MIB
    # SQLite: the admitted rows of recent wide filters (16 bytes a row), for every thread.
    admitted_rows: int = 4_000_000
    # SQLite, per store across every admitted set (`_bm25.SetArrays`): a term's BM25 score per
    # admitted row is what a query adds up, so it gets the most room; its positions and
    # matches are needed only to compute those (and for a phrase).
    term_scores_bytes: int = 768 * MIB
    term_positions_bytes: int = 64 * MIB
    term_matches_bytes: int = 128 * MIB


class SQLiteRows(Protocol):
    """What the in-memory components read through: the store's connections and its state."""

    path: str
    busy_timeout_ms: int
    scheduler: Scheduler
    _write_lock: Any  # held while a commit is between its change capture and its COMMIT

    def _reader(self) -> sqlite3.Connection: ...
    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]: ...
    def _require_writer(self) -> sqlite3.Connection: ...
    def _windows_current(self) -> None: ...
    def schema_version(self) -> int: ...

    @property
    def opened(self) -> int: ...

    def current(self, opened: int) -> bool: ...


class AccessIndex(Protocol):
    def entry(self, flt: CellFilter) -> list[Any]: ...
    def admitted_set(self, flt: CellFilter, entry: list[Any]) -> Any: ...
    def wide(self, flt: CellFilter, admitted: int) -> bool: ...


class KeywordIndex(Protocol):
    def candidates_many(self, queries: Sequence[str], flt: CellFilter, k: int) -> list[list[Candidate]]: ...
    def warmup_state(self) -> str: ...


class VectorIndex(Protocol):
    def candidates(self, vector: Any, model: str, flt: CellFilter, k: int) -> list[Candidate]: ...
    def has_vectors(self, model: str, flt: CellFilter) -> bool: ...
    def state(self) -> dict[str, Any]: ...


class ChangeListener(Protocol):
    """An in-memory cache the change feed keeps in step with every commit."""

    def wants_changes(self) -> bool: ...
    def take(self, states: dict[int, Any], terms: dict[int, Optional[dict[str, int]]]) -> None: ...


__all__ = ["AccessIndex", "CacheBudgets", "ChangeListener", "KeywordIndex", "SQLiteRows", "VectorIndex"]
