"""Keeping a SQLite store's in-memory caches in step with every commit, of any process.

Every writer of the file appends the rowid of each row it changes to `change_log` (migration
11), in the same transaction. The store reads the rows logged since the caches last looked
inside each write transaction (`ChangeFeed.collect`, before COMMIT) and hands their states to
the caches after it (`apply`); commits of other connections are taken in the same way when
`PRAGMA data_version` says something committed (`generation`). When the log cannot say what
changed (pruned, emptied, too long) the generation moves and the caches load afresh.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass
from typing import Optional

from ..errors import Unavailable
from ._access_snapshot import SNAPSHOT_COLUMNS, SNAPSHOT_FROM, RowState, row_state
from .indexes import ChangeListener, SQLiteRows

# Past this many rows logged by other processes since this one last looked, the caches load
# afresh instead of patching (one scan then costs less than reading that many rows' state).
CHANGE_LOG_PATCH_MAX = 200_000
# The log's first and last sequence numbers: two subqueries, each one step of the primary key
# (SQLite's min/max shortcut takes a query with a single min() or max(); both in one query
# scan the whole log, at every commit).
LOG_BOUNDS = "SELECT (SELECT MIN(seq) FROM change_log), (SELECT MAX(seq) FROM change_log)"
LOG_SINCE = "SELECT rid FROM change_log WHERE seq > ?"


@dataclass(frozen=True)
class Changes:
    """Rows logged since the caches last took the change log in: each one's state now and its
    window's term counts (`ChangeFeed.collect`), up to log entry `seq`; `reload`: the log
    cannot say (pruned, or too long), the caches load afresh."""

    seq: int
    states: dict[int, Optional[RowState]]
    terms: dict[int, Optional[dict[str, int]]]
    reload: bool = False


def row_states(conn: sqlite3.Connection, rowids: list[int], with_terms: bool = True) -> tuple[
        dict[int, Optional[RowState]], dict[int, Optional[dict[str, int]]]]:
    """Each row's access columns (None: gone) and, `with_terms`, its keyword window's term
    counts (None: no window), as the caches take them in."""
    states: dict[int, Optional[RowState]] = dict.fromkeys(rowids)
    terms: dict[int, Optional[dict[str, int]]] = dict.fromkeys(rowids) if with_terms else {}
    patterns: dict[Optional[str], tuple[str, ...]] = {}
    extra = ", x.terms" if with_terms else ", NULL"
    for i in range(0, len(rowids), 500):
        chunk = rowids[i : i + 500]
        for row in conn.execute(
            f"SELECT {SNAPSHOT_COLUMNS}{extra} FROM {SNAPSHOT_FROM} WHERE c.rowid IN ({','.join('?' * len(chunk))})", chunk,
        ):
            states[row[0]] = row_state(row[1:-1], patterns)
            if with_terms:
                terms[row[0]] = None if row[-1] is None else json.loads(row[-1])
    return states, terms


class ChangeFeed:
    """The change log as the caches see it: the last entry they took in (`log_seq`), and the
    generation they are valid for (`foreign`: moves when they must load afresh)."""

    def __init__(self, rows: SQLiteRows):
        self.rows = rows
        self.listeners: list[ChangeListener] = []
        self.tracking = False  # the change log exists (set at open)
        self.log_seq = 0  # the last change_log entry the in-memory caches have taken in
        self.foreign = 0
        self.seen_version: Optional[int] = None
        self.writer_version: Optional[int] = None
        self._version_conn: Optional[sqlite3.Connection] = None
        self._version_lock = threading.Lock()
        self._foreign_lock = threading.Lock()

    def opened(self, writer: sqlite3.Connection) -> None:
        # (A store a test holds at an old schema has no change log: nothing to track.)
        self.tracking = writer.execute("SELECT 1 FROM sqlite_master WHERE name = 'change_log'").fetchone() is not None
        if self.tracking:
            self.log_seq = writer.execute("SELECT COALESCE(MAX(seq), 0) FROM change_log").fetchone()[0]

    def closed(self) -> None:
        with self._version_lock:
            if self._version_conn is not None:
                self._version_conn.close()
                self._version_conn = None
        self.seen_version = self.writer_version = None

    def collect(self, conn: sqlite3.Connection, limit: Optional[int] = None) -> Optional[Changes]:
        """Inside a transaction (a write's, before COMMIT, or a read's): the rows logged since
        the caches last took the log in (this transaction's and any other process's), each
        with its state now (access columns, None when gone) and its keyword window's term
        counts (None when it has none), for the in-memory caches. Its `reload` is set when
        the log no longer reaches back that far (pruned) or holds more than `limit` rows:
        the caches load afresh. None when nothing was logged since."""
        if not self.tracking:
            return None
        since = self.log_seq
        first, top = conn.execute(LOG_BOUNDS).fetchone()
        if top is None or top == since:
            return None
        if top < since:  # the log started afresh (emptied by hand): it cannot say
            return Changes(top, {}, {}, reload=True)
        if not any(listener.wants_changes() for listener in self.listeners):
            return Changes(top, {}, {})  # no cache to patch
        if first > since + 1:  # pruned past what the caches have seen
            return Changes(top, {}, {}, reload=True)
        if limit is not None and top - since > limit:
            return Changes(top, {}, {}, reload=True)
        touched = sorted({r for (r,) in conn.execute(LOG_SINCE, (since,))})
        return Changes(top, *row_states(conn, touched))

    def apply(self, changes: Optional[Changes]) -> None:
        """After COMMIT, under the write lock (so in commit order): the logged rows' new state
        into every cache, or, when the log could not say, the generation moves (every cache
        loads afresh)."""
        if changes is None:
            return
        self.log_seq = changes.seq
        if changes.reload:
            self.foreign += 1
            return
        if not changes.states:
            return
        for listener in self.listeners:
            listener.take(changes.states, changes.terms)

    def catch_up(self) -> None:
        """Under the write lock, after another connection committed: its logged rows into
        the caches, read in one read transaction of the writer connection (no write of ours
        is under way)."""
        if not self.tracking:  # an old schema without the log: load afresh
            self.foreign += 1
            return
        conn = self.rows._require_writer()
        conn.execute("BEGIN")
        try:
            changes = self.collect(conn, CHANGE_LOG_PATCH_MAX)
        finally:
            conn.execute("COMMIT")
        self.apply(changes)

    def data_version(self) -> int:
        """A number that changes whenever anything commits to the database: this process's
        writer or another process (`PRAGMA data_version` of a connection that never writes,
        which moves on every other connection's commit). Read before the data it labels, so
        a cached answer is never older than its label."""
        with self._version_lock:
            if self._version_conn is None:
                self.rows._require_writer()
                self._version_conn = sqlite3.connect(self.rows.path, isolation_level=None, check_same_thread=False)
            return int(self._version_conn.execute("PRAGMA data_version").fetchone()[0])

    def generation(self) -> int:
        """The caches' generation, after taking in what other connections (another process,
        another store on the same file) committed since the last call: their logged rows
        patch the caches as this process's own commits do (`catch_up`); the number moves
        only when that cannot be done and the caches must load afresh. The writer's
        `PRAGMA data_version` is unchanged by its own commits and moves on everyone else's;
        it is read (under the write lock, the writer's owner) only when `data_version`
        says something committed at all."""
        with self._foreign_lock:
            version = self.data_version()
            if version != self.seen_version:
                with self.rows._write_lock:
                    writer = int(self.rows._require_writer().execute("PRAGMA data_version").fetchone()[0])
                    if self.writer_version is not None and writer != self.writer_version:
                        self.catch_up()
                    self.writer_version = writer
                self.seen_version = version
            return self.foreign

    def committed_elsewhere(self) -> bool:
        """Whether anything committed since the caches last looked (one pragma)."""
        try:
            return self.data_version() != self.seen_version
        except Unavailable:
            return False


__all__ = ["CHANGE_LOG_PATCH_MAX", "ChangeFeed", "Changes", "LOG_BOUNDS", "LOG_SINCE", "row_states"]
