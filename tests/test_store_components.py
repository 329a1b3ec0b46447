"""The SQLite store's in-memory components, each built alone over a real SQLite file.

The file is written by a `SQLiteStore` and closed; each component then reads it through
`FileRows`, the least a component needs of a store (`ampkit.store.indexes.SQLiteRows`): two
connections, a write lock and a scheduler. No service, no server, no store around it."""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Any, Sequence

import numpy as np

from ampkit.models import CellCreate
from ampkit.scheduler import Scheduler
from ampkit.service import MemoryService
from ampkit.store.base import CellFilter, StoredVector
from ampkit.store.indexes import CacheBudgets, SQLiteRows
from ampkit.store.sqlite import SQLiteStore
from ampkit.store.sqlite_access import SQLiteAccessIndex
from ampkit.store.sqlite_changes import ChangeFeed
from ampkit.store.sqlite_keyword import TOKENIZER, SQLiteKeywordIndex
from ampkit.store.sqlite_vectors import SQLiteVectorIndex

TEXTS = ["dark roast coffee every morning", "green tea after lunch", "coffee beans from Kenya",
         "jazz records on sunday", "trains to Osaka", "decaf coffee at night"]


class FileRows:
    """A SQLite file as the components read it (`SQLiteRows`)."""

    def __init__(self, path: str):
        self.path = path
        self.busy_timeout_ms = 10_000
        self.scheduler = Scheduler()
        self._write_lock = threading.RLock()
        self.writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for statement in TOKENIZER:
            self.reader.execute(statement)
        self.opened = 1
        self.closed = False

    def _reader(self) -> sqlite3.Connection:
        return self.reader

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        return self.reader.execute(sql, params).fetchall()

    def _require_writer(self) -> sqlite3.Connection:
        return self.writer

    def _windows_current(self) -> None:
        pass  # the file was written by a store that indexed its windows before closing

    def schema_version(self) -> int:
        return self.writer.execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0]

    def current(self, opened: int) -> bool:
        return not self.closed and opened == self.opened

    def close(self) -> None:
        self.closed = True
        self.reader.close()
        self.writer.close()


def _write_file(path: str, vectors: bool = False) -> list[str]:
    """Cells of owners a and b, a's readable by team-*, written and closed; their ids."""
    store = SQLiteStore(path)
    store.open()
    try:
        service = MemoryService(store=store)
        ids = []
        for i, text in enumerate(TEXTS):
            owner = "a" if i % 2 == 0 else "b"
            readers = ["team-*"] if owner == "a" else []
            ids.append(service.create(owner, CellCreate(content={"text": text}, identity={"owner_id": owner},
                                                        access_policy={"readable_by": readers})).id)
        if vectors:
            with store.write() as tx:
                for i, cell_id in enumerate(ids):
                    tx.update(tx.get(cell_id), StoredVector("onehot8", np.eye(8, dtype=np.float32)[i]))
    finally:
        store.close()
    return ids


def _components(path: str) -> tuple[FileRows, ChangeFeed, SQLiteAccessIndex]:
    rows = FileRows(path)
    checked: SQLiteRows = rows  # (what mypy would check: the test double is the protocol)
    changes = ChangeFeed(checked)
    access = SQLiteAccessIndex(checked, changes)
    changes.listeners = [access]
    changes.opened(rows.writer)
    return rows, changes, access


def test_the_access_index_admits_what_a_reader_may_read_and_resumes_its_saved_snapshot(tmp_path):
    path = str(tmp_path / "access.db")
    _write_file(path)
    rows, changes, access = _components(path)
    try:
        team = CellFilter(reader="team-1")  # reader-wide: from the snapshot
        entry = access.entry(team)
        assert entry[1] == 3 and access.source == "table"  # a's three cells, nothing of b's
        assert access.wide(team, entry[1])
        owner = CellFilter(reader="b", owner_id="b")  # an owner's filter: counted in SQL
        assert access.entry(owner)[1] == 3 and not access.wide(owner, 3)
        admitted = access.admitted_set(team, entry)
        owners = {r for (r,) in rows._query(
            f"SELECT owner_id FROM cells WHERE rowid IN ({','.join(map(str, admitted.rowids.tolist()))})")}
        assert owners == {"a"}
        access.save()
        assert os.path.exists(access.snapshot_file())
    finally:
        rows.close()
    rows, changes, again = _components(path)
    try:
        again.opened()
        assert again.entry(CellFilter(reader="team-1"))[1] == 3 and again.source == "saved"
    finally:
        rows.close()


def test_the_keyword_index_ranks_over_the_admitted_windows_alone(tmp_path):
    path = str(tmp_path / "keyword.db")
    ids = _write_file(path)
    rows, changes, access = _components(path)
    keyword = SQLiteKeywordIndex(rows, changes, access, budgets=CacheBudgets(postings_bytes=2**20))
    changes.listeners.append(keyword)
    try:
        wide, owner = CellFilter(reader="team-1"), CellFilter(reader="a", owner_id="a")
        (team_hits, owner_hits) = (keyword.candidates_many(["coffee"], flt, 10)[0] for flt in (wide, owner))
        assert {c.cell_id for c in team_hits} == {ids[0], ids[2]}  # a's coffee cells; b's decaf is not readable
        assert [c.cell_id for c in team_hits] == [c.cell_id for c in owner_hits]
        assert all(c.score > 0 for c in team_hits)
        assert keyword.postings is not None and "t:coffe" in keyword.postings[1].items  # the wide leg's cache
        assert keyword.warmup_state() == "ready"  # a small file needs no warm-up
    finally:
        rows.close()
    # The same answers as the store that wrote the file.
    store = SQLiteStore(path)
    store.open()
    try:
        assert [(c.cell_id, c.score) for c in store.keyword_candidates("coffee", CellFilter(reader="team-1"), 10)] == \
            [(c.cell_id, c.score) for c in team_hits]
    finally:
        store.close()


def test_the_vector_index_loads_the_stored_vectors_and_ranks_the_admitted_rows(tmp_path):
    path = str(tmp_path / "vectors.db")
    ids = _write_file(path, vectors=True)
    rows, changes, access = _components(path)
    vectors = SQLiteVectorIndex(rows, access, ann_threshold=None)
    try:
        assert vectors.state()["state"] == "loading"
        vectors.warm(rows.opened)  # (open() runs it on the scheduler)
        assert vectors.state() == {"state": "ready", "vectors": 6, "approximate": "off", "approximate_backlog": 0}
        query = np.eye(8, dtype=np.float32)[1]  # b's cell 1
        assert [c.cell_id for c in vectors.candidates(query, "onehot8", CellFilter(reader="b", owner_id="b"), 1)] == [ids[1]]
        team = vectors.candidates(query, "onehot8", CellFilter(reader="team-1"), 6)
        assert ids[1] not in {c.cell_id for c in team} and len(team) == 3  # only a's cells are ranked
        assert vectors.has_vectors("onehot8", CellFilter(reader="team-1"))
        assert not vectors.has_vectors("other", CellFilter(reader="team-1"))
    finally:
        rows.close()
