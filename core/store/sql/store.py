"""What both SQL stores do the same way, written once: reading cells (get, list, count),
history, dedup's exact-duplicate lookups (by the `text_key` digest), the migration bookkeeping
(applied versions, the pending check, the apply loop), and the write transaction's shared
steps (locked reads, the key holder, history, purge).

A backend supplies connections (`_query`, `_write_transaction`, `_migration_connection`,
`_applied_versions`), its dialect, its migrations, and the two legs that really differ: the
keyword index (windows) and the vector index.
"""

from __future__ import annotations

import builtins
import json
from abc import abstractmethod
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Callable, ClassVar, Iterator, Mapping, Optional, Sequence

from ...models import STORED, HistoryEntry, MemoryCell
from ...textindex import text_key
from .._keys import SQLKeyStore
from ..base import ApiKeyStore, CellFilter, FacetRow, HistoryPage, HistoryRecord, Store, WriteTx
from .compiler import compile_filter
from .dialects import Dialect

# One page of `get_many`: the ids travel as parameters, and SQLite allows at most 999 a query
# before 3.32.
GET_MANY_CHUNK = 500

Migration = tuple[int, str, str]  # (version, name, SQL script)


# `json.dumps(changes, default=str, ensure_ascii=False)`, without building an encoder per record.
_HISTORY_JSON = json.JSONEncoder(default=str, ensure_ascii=False)


def row_to_cell(text: str, body: Any) -> MemoryCell:
    """A stored row as a cell: the JSON body (text from SQLite, already decoded by psycopg)
    with the text, which is stored once, in its own column."""
    data = json.loads(body) if isinstance(body, (str, bytes)) else body
    data["content"]["text"] = text
    return MemoryCell.model_validate(data, context=STORED)


def _history_entry(row: Sequence[Any]) -> HistoryEntry:
    seq, cell_id, at, actor, action, changes = row
    return HistoryEntry(seq=seq, cell_id=cell_id, at=at, actor=actor, action=action,
                        changes=json.loads(changes) if isinstance(changes, (str, bytes)) else changes)


class SQLWriteTx(WriteTx):
    """The write transaction's steps both SQL stores share. The backend's subclass adds
    `insert`, `update` and `flush` (its keyword windows and vectors) and `_forget`."""

    dialect: ClassVar[Dialect]

    def __init__(self, conn: Any):
        self.conn = conn
        self._history_at: Optional[tuple[Any, Any]] = None  # (a record's time, as stored)

    def _cell(self, where: str, params: Sequence[Any]) -> Optional[MemoryCell]:
        # Locked until the transaction ends where the dialect locks rows (PostgreSQL: FOR
        # UPDATE); SQLite's writers are serialised, so every row read here is already ours.
        row = self.conn.execute(f"SELECT text, body FROM cells WHERE {where}{self.dialect.for_update}", params).fetchone()
        return None if row is None else row_to_cell(*row)

    def get(self, cell_id: str) -> Optional[MemoryCell]:
        return self._cell(f"id = {self.dialect.param}", (cell_id,))

    def _lock_key(self, owner_id: str, key: str) -> None:
        """Make concurrent writers of one (owner, key) take turns; default: writers already do."""

    def key_holder(self, owner_id: str, key: str) -> Optional[MemoryCell]:
        self._lock_key(owner_id, key)
        p = self.dialect.param
        return self._cell(f"owner_id = {p} AND cell_key = {p} AND status IN ('active', 'stale') "
                          "AND superseded_by IS NULL", (owner_id, key))

    def add_history(self, record: HistoryRecord) -> None:
        p = self.dialect.param
        # A batch's records share one time: converted once.
        if self._history_at is None or self._history_at[0] != record.at:
            self._history_at = (record.at, self.dialect.history_time(record.at))
        self.conn.execute(
            f"INSERT INTO history (cell_id, at, actor, action, changes) VALUES ({p}, {p}, {p}, {p}, {p})",
            (record.cell_id, self._history_at[1], record.actor, record.action, _HISTORY_JSON.encode(record.changes)),
        )

    @abstractmethod
    def _forget(self, cell_id: str) -> None:
        """Before a purge deletes the row: take the cell out of the backend's indexes (its
        text leaves its own and its neighbours' keyword windows)."""

    def purge(self, cell_id: str) -> None:
        p = self.dialect.param
        self._forget(cell_id)
        self.conn.execute(f"DELETE FROM cells WHERE id = {p}", (cell_id,))
        # Erasure: the history keeps who did what and when, never the old values.
        self.conn.execute(f"UPDATE history SET changes = '{{}}' WHERE cell_id = {p}", (cell_id,))

    def flush(self) -> None:
        """Runs once just before COMMIT (the backend rewrites the keyword windows it marked)."""

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        # Windows marked inside a part that is undone are rewritten anyway, from what is
        # committed: a wasted rewrite, never a wrong one.
        self.conn.execute("SAVEPOINT ampkit_part")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK TO SAVEPOINT ampkit_part")
            self.conn.execute("RELEASE SAVEPOINT ampkit_part")
            raise
        self.conn.execute("RELEASE SAVEPOINT ampkit_part")


class SQLStore(Store):
    """A store over one SQL database; see the module docstring for what a backend supplies."""

    dialect: ClassVar[Dialect]
    MIGRATIONS: ClassVar[Sequence[Migration]]
    # Python steps that run inside a migration's transaction, after its SQL.
    MIGRATION_STEPS: ClassVar[Mapping[int, Callable[..., None]]] = {}

    # ------------------------------------------------------------ what a backend supplies
    @abstractmethod
    def _query(self, query: Any, params: Sequence[Any] = ()) -> builtins.list[tuple]:
        """Rows of one read, driver errors mapped to `Unavailable`."""

    @abstractmethod
    def _execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        """One statement in its own durable transaction (API keys); returns its row count."""

    @property
    def keys(self) -> ApiKeyStore:
        return SQLKeyStore(self.dialect, self._query, self._execute)

    @abstractmethod
    def _write_transaction(self) -> AbstractContextManager[SQLWriteTx]:
        """A write transaction's connection and its backend's tx object; commits on normal
        exit, rolls back on an exception."""

    @abstractmethod
    def _migration_connection(self) -> AbstractContextManager[Any]:
        """A connection that holds the migration lock (servers that start together take turns)."""

    @abstractmethod
    def _migration_transaction(self, conn: Any, version: int, name: str) -> AbstractContextManager[None]:
        """One migration's transaction, its failures mapped to the store's errors."""

    def _run_script(self, conn: Any, script: str) -> None:
        conn.execute(script)

    @abstractmethod
    def _applied_versions(self) -> Optional[set[int]]:
        """The applied migration versions, read without creating or changing anything; None
        when the database has no schema yet."""

    # ------------------------------------------------------------ migrations
    def pending_migrations(self) -> builtins.list[tuple[int, str]]:
        """(version, name) of the migrations `open()` would apply; reads only, needs no `open()`."""
        applied = self._applied_versions() or set()
        return [(version, name) for version, name, _ in self.MIGRATIONS if version not in applied]

    def migrate(self) -> builtins.list[int]:
        """Apply the pending numbered migrations, each in its own transaction; returns the
        versions applied."""
        d, p = self.dialect, self.dialect.param
        applied: builtins.list[int] = []
        with self._migration_connection() as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations "
                         f"(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at {d.timestamp_type} NOT NULL)")
            done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations").fetchall()}
            for version, name, script in self.MIGRATIONS:
                if version in done:
                    continue
                with self._migration_transaction(conn, version, name):
                    self._run_script(conn, script)
                    if version in self.MIGRATION_STEPS:
                        self.MIGRATION_STEPS[version](conn)
                    stamp, stamp_params = d.now()
                    conn.execute(f"INSERT INTO schema_migrations (version, name, applied_at) VALUES ({p}, {p}, {stamp})",
                                 [version, name, *stamp_params])
                applied.append(version)
        return applied

    def schema_version(self) -> int:
        return int(self._query("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")[0][0])

    # ------------------------------------------------------------ writes
    @contextmanager
    def write(self) -> Iterator[WriteTx]:
        with self._write_transaction() as tx:
            yield tx
            tx.flush()

    # ------------------------------------------------------------ reads
    def _where(self, flt: CellFilter) -> tuple[str, builtins.list[Any]]:
        return compile_filter(flt, self.dialect)

    def get(self, cell_id: str) -> Optional[MemoryCell]:
        rows = self._query(f"SELECT text, body FROM cells WHERE id = {self.dialect.param}", (cell_id,))
        return row_to_cell(*rows[0]) if rows else None

    def get_many(self, cell_ids: Sequence[str]) -> dict[str, MemoryCell]:
        out: dict[str, MemoryCell] = {}
        ids = builtins.list(dict.fromkeys(cell_ids))
        for i in range(0, len(ids), GET_MANY_CHUNK):
            among, params = self.dialect.one_of("id", ids[i : i + GET_MANY_CHUNK])
            for cid, text, body in self._query(f"SELECT id, text, body FROM cells WHERE {among}", params):
                out[cid] = row_to_cell(text, body)
        return out

    def list(self, flt: CellFilter, limit: int, after_id: Optional[str] = None) -> builtins.list[MemoryCell]:
        where, params = self._where(flt)
        p = self.dialect.param
        if after_id is not None:
            where += f" AND c.id > {p}"
            params.append(after_id)
        rows = self._query(f"SELECT c.text, c.body FROM cells c WHERE {where} ORDER BY c.id LIMIT {p}", [*params, limit])
        return [row_to_cell(*r) for r in rows]

    def pending_embeddings(self, flt: CellFilter, created_by: str, since_id: str,
                           limit: int) -> builtins.list[tuple[str, str]]:
        where, params = self._where(flt)
        p = self.dialect.param
        return [(cid, text) for cid, text in self._query(
            # From the queue's own index on cell_id (ids sort by creation time): the recent
            # queued cells only, never a scan of the cells the filter admits (CROSS JOIN: SQLite
            # keeps the queue as the outer loop).
            f"SELECT c.id, c.text FROM embed_queue q CROSS JOIN cells c WHERE c.id = q.cell_id AND q.cell_id >= {p} "
            f"AND {where} AND c.created_by = {p} ORDER BY q.cell_id DESC LIMIT {p}",
            [since_id, *params, created_by, limit])]

    def count(self, flt: CellFilter) -> int:
        where, params = self._where(flt)
        return int(self._query(f"SELECT COUNT(*) FROM cells c WHERE {where}", params)[0][0])

    def facets(self, flt: CellFilter, limit: int, after_owner: Optional[str] = None) -> builtins.list[FacetRow]:
        where, params = self._where(flt)
        p = self.dialect.param
        after = "" if after_owner is None else f" AND c.owner_id > {p}"
        owners = (f"SELECT DISTINCT c.owner_id FROM cells c{self.dialect.owner_order} WHERE {where}{after} "
                  f"ORDER BY c.owner_id LIMIT {p}")
        rows = self._query(
            f"SELECT c.owner_id, c.type, c.status, COUNT(*) FROM cells c WHERE {where} AND c.owner_id IN ({owners}) "
            "GROUP BY c.owner_id, c.type, c.status ORDER BY c.owner_id, c.type, c.status",
            [*params, *params, *([after_owner] if after_owner is not None else []), limit],
        )
        return [FacetRow(owner, kind, status, int(n)) for owner, kind, status, n in rows]

    def metadata_values(self, flt: CellFilter, key: str, limit: int,
                        after: Optional[str] = None) -> builtins.list[tuple[str, int]]:
        where, params = self._where(flt)
        p, order = self.dialect.param, f"v{self.dialect.binary_collation}"  # code-point order on both
        value, value_params = self.dialect.metadata_text("c", key)
        rows = self._query(
            f"SELECT v, COUNT(*) FROM (SELECT {value} AS v FROM cells c WHERE {where}) t "
            f"WHERE v IS NOT NULL{'' if after is None else f' AND {order} > {p}'} GROUP BY v ORDER BY {order} LIMIT {p}",
            [*value_params, *params, *([] if after is None else [after]), limit],
        )
        return [(v, int(n)) for v, n in rows]

    # ------------------------------------------------------------ exact duplicates (ampkit.dedup)
    # Both stores keep `text_key`, a digest of the normalised text (ampkit.textindex.text_key),
    # indexed with the owner (SQLite's migration 9, PostgreSQL's 11).
    _same_text_filter: Optional[tuple[CellFilter, str, builtins.list[Any]]] = None

    def _same_text_where(self, flt: CellFilter) -> tuple[str, builtins.list[Any]]:
        # A batch checks each of its cells under one filter: compiled once (the last one is kept).
        last = self._same_text_filter
        if last is not None and last[0] == flt:
            return last[1], last[2]
        where, params = self._where(flt)
        self._same_text_filter = (flt, where, params)
        return where, params

    def same_text_candidates(self, text: str, flt: CellFilter, k: int) -> builtins.list[str]:
        """Cells whose normalised text has the same digest: one index probe, whatever the size
        of the store."""
        where, params = self._same_text_where(flt)
        p = self.dialect.param
        rows = self._query(f"SELECT c.id FROM cells c WHERE c.text_key = {p} AND {where} LIMIT {p}",
                           [text_key(text), *params, k])
        return [cid for (cid,) in rows]

    def texts_with_candidates(self, texts: Sequence[str], flt: CellFilter) -> Optional[set[str]]:
        """The digests of `texts` in one query (a page of 500 at a time), instead of one probe
        per text: most new memories have no duplicate, and then nothing more is asked. Texts
        that share a digest (two spellings of one memory in a batch) are all found."""
        where, params = self._same_text_where(flt)
        keys: dict[str, builtins.list[str]] = {}
        for text in texts:
            keys.setdefault(text_key(text), []).append(text)
        found: set[str] = set()
        digests = builtins.list(keys)
        for i in range(0, len(digests), 500):
            among, among_params = self.dialect.one_of("c.text_key", digests[i : i + 500])
            rows = self._query(f"SELECT DISTINCT c.text_key FROM cells c WHERE {among} AND {where}", [*among_params, *params])
            for (key,) in rows:
                found.update(keys[key])
        return found

    def history(self, cell_id: str) -> HistoryPage:
        rows = self._query("SELECT seq, cell_id, at, actor, action, changes FROM history "
                           f"WHERE cell_id = {self.dialect.param} ORDER BY seq", (cell_id,))
        return [_history_entry(r) for r in rows]

    def history_scan(self, after: Optional[tuple[str, int]], limit: int) -> HistoryPage:
        p = self.dialect.param
        where, params = ("", []) if after is None else (f"WHERE cell_id > {p} OR (cell_id = {p} AND seq > {p})",
                                                        [after[0], *after])
        rows = self._query(
            f"SELECT seq, cell_id, at, actor, action, changes FROM history {where} ORDER BY cell_id, seq LIMIT {p}",
            [*params, limit],
        )
        return [_history_entry(r) for r in rows]
