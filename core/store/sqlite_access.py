"""Which rows of a SQLite store a filter admits, with BM25's N and lengths over them.

Both search legs rank only rows their caller may read. An owner's or a session's filter is
answered in SQL, where its index serves it, and its counts are kept until the database
changes. A reader-wide filter (no owner, session or metadata condition) is answered from the
access snapshot (`_access_snapshot.AccessSnapshot`: every row's access columns in arrays),
which is loaded once, patched by every commit of any process (`ChangeFeed`), saved beside the
file at close and periodically, and resumed from that file at the next open.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from dataclasses import replace
from typing import Any, Optional

import numpy as np

from ._access_snapshot import AccessSnapshot, RowState
from ._bm25 import AdmittedSet, SetArrays, SharedArrays, admitted_lengths
from .base import CellFilter
from .indexes import CacheBudgets, SQLiteRows
from .sql import SQLITE, compile_filter
from .sqlite_changes import LOG_BOUNDS, LOG_SINCE, ChangeFeed, row_states

log = logging.getLogger("ampkit.store")

# A saved access snapshot names the change-log entry it is current with by its sequence number
# and a digest of the entries up to it (this many): a file put back from a backup, or another
# history's log, gives another digest (or lacks the entry).
LOG_MARK_ENTRIES = 64
_LOG_MARK = "SELECT seq, rid FROM change_log WHERE seq > ? AND seq <= ? ORDER BY seq"
# At most this many logged rows since the save are read to bring a saved snapshot forward (under
# the write lock); past it the snapshot loads from the table.
SNAPSHOT_RESUME_MAX = 20_000
# While commits arrive, the checkpoint loop also saves the access snapshot (as close() does) at
# most once per this many seconds, so a restart after a crash finds one at most this old (and
# usable while at most SNAPSHOT_RESUME_MAX rows were logged since).
SNAPSHOT_SAVE_INTERVAL_S = 300.0


def filter_sql(flt: CellFilter, alias: str = "c") -> tuple[str, list[Any]]:
    """WHERE clause (without the keyword) for a CellFilter (the one compiler, SQLite's spelling)."""
    return compile_filter(flt, SQLITE, alias)


class SQLiteAccessIndex:
    """The admitted rows of filters over one SQLite store (`AccessIndex`)."""

    def __init__(self, rows: SQLiteRows, changes: ChangeFeed, *, budgets: CacheBudgets = CacheBudgets(),
                 keyword_scan_max: int = 5000, save_interval_s: Optional[float] = SNAPSHOT_SAVE_INTERVAL_S):
        self.rows = rows
        self.changes = changes
        self.admitted_rows = budgets.admitted_rows
        self.keyword_scan_max = keyword_scan_max  # admitted cells up to which the keyword leg scans
        self.save_interval_s = save_interval_s  # None: saved at close only
        self._saved_state: Optional[tuple[int, int, int]] = None  # (foreign, generation, log seq) last saved
        self._saved_time = 0.0  # time.monotonic() of the last periodic save
        # Every admitted set's per-term arrays, one budget per kind.
        self.set_arrays = SetArrays(SharedArrays(budgets.term_positions_bytes), SharedArrays(budgets.term_matches_bytes),
                                    SharedArrays(budgets.term_scores_bytes))
        # Non-wide filters' counts, valid for one database version (`ChangeFeed.data_version`).
        self._stats_cache: Optional[tuple[int, dict[tuple[str, tuple[Any, ...], bool], list[Any]], list[list[float]]]] = None
        self.snapshot: Optional[AccessSnapshot] = None
        self._build_lock = threading.Lock()
        self._backlog: Optional[list[dict[int, Optional[RowState]]]] = None
        self._saved = False  # a saved snapshot is yet to be tried (set at open)
        self.source: Optional[str] = None  # how the current one came: "saved" or "table" (/health)
        self.warm_lock = threading.Lock()  # held by `warm`, and by the store's close()
        # Clear from open() until the term warm-up has loaded the snapshot (or found the store
        # too small for one): the vector warm-up and the embedding worker's scan wait for it.
        self.first = threading.Event()
        self.first.set()

    # ------------------------------------------------------------ lifetime
    def opened(self) -> None:
        self._saved = self.changes.tracking and self.saved_holds()

    def closed(self) -> None:
        """At the store's close, under its locks: every cache goes."""
        self._stats_cache = None
        self.set_arrays.clear()
        self.snapshot = self.source = None

    # ------------------------------------------------------------ change feed
    def wants_changes(self) -> bool:
        return self.snapshot is not None or self._backlog is not None

    def take(self, states: dict[int, Any], terms: dict[int, Optional[dict[str, int]]]) -> None:
        if self._backlog is not None:
            self._backlog.append(states)
        snapshot = self.snapshot
        if snapshot is not None:
            snapshot.apply(states)

    # ------------------------------------------------------------ the snapshot
    def load(self) -> AccessSnapshot:
        """The access snapshot, current with every commit so far: loaded on first use (one
        scan of the table), then patched from the change log; loaded again only when the log
        cannot say what changed. A search that needs it while it loads waits for that load
        instead of scanning too."""
        snapshot = self.snapshot
        if snapshot is not None and snapshot.foreign == self.changes.generation():
            return snapshot
        with self._build_lock:
            snapshot = self.snapshot
            if snapshot is not None and snapshot.foreign == self.changes.generation():
                return snapshot
            if self._saved:  # the first load since open(): a saved one, when it is current
                self._saved = False
                snapshot = self.resumed()
                if snapshot is not None:
                    return snapshot
            conn = self.rows._reader()
            beside = self._second_connection()
            # The generation is read first (a reload the log asks for meanwhile moves it, and
            # this snapshot is loaded again at its next use). The read transactions start
            # under the write lock, with no commit of ours half done, in one snapshot of the
            # file (`_begin_reads`); the logged rows taken in from then on (ours, or another
            # process's caught up) are kept in the backlog and applied on top (each is a
            # row's whole state: one the load already saw changes nothing).
            foreign = self.changes.generation()
            with self.rows._write_lock:
                self.snapshot = None
                self._backlog = []
            try:
                reading = self._begin_reads([conn] if beside is None else [conn, beside])
                if beside is not None and len(reading) == 1:
                    beside.close()  # another process kept committing: one connection reads it all
                    beside = None
                snapshot = AccessSnapshot(foreign)
                snapshot.load(*[lambda sql, c=c: c.execute(sql).fetchall() for c in reading])
            except BaseException:
                with self.rows._write_lock:
                    self._backlog = None
                raise
            finally:
                for c in (conn, beside):
                    if c is not None and c.in_transaction:
                        c.execute("COMMIT")
                if beside is not None:
                    beside.close()
            with self.rows._write_lock:
                for states in self._backlog or []:
                    snapshot.apply(states)
                self._backlog = None
                self.snapshot = snapshot
                self.source = "table"
            return snapshot

    def warm(self, opened: int) -> None:
        """The snapshot loaded ahead of the first reader-wide search (the term warm-up's first step)."""
        with self.warm_lock:
            if not self.rows.current(opened):
                return
            try:
                self.load()
            except Exception:  # noqa: BLE001  (closed meanwhile: the first wide search loads it)
                return

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Until the warm-up open() started has loaded the snapshot (at once when it has none
        to load: a small store); False on timeout."""
        return self.first.wait(timeout)

    # A clean close saves the snapshot beside the file and the next open reads it back and brings
    # it forward by the change log, which every writer of the file appends to (migration 11),
    # whatever process it is: cheaper than loading it from the table.
    def snapshot_file(self) -> str:
        return f"{self.rows.path}.access-snapshot"

    @staticmethod
    def log_mark(conn: sqlite3.Connection, seq: int) -> Optional[str]:
        """A digest of the change log's entries up to `seq` (the last LOG_MARK_ENTRIES), or
        None when the log does not hold entry `seq` (pruned past, emptied, never written)."""
        entries = conn.execute(_LOG_MARK, (seq - LOG_MARK_ENTRIES, seq)).fetchall()
        if not entries or entries[-1][0] != seq:
            return None
        return hashlib.blake2b(json.dumps(entries).encode(), digest_size=16).hexdigest()

    def saved_holds(self) -> bool:
        """At open, before this process writes anything: whether a saved snapshot is there, of
        this schema, and still names an entry of this file's change log (the same entry, the
        same 64 up to it). One that does not is deleted now (not read whole at the first load
        only to be refused): the file was migrated since, or put back from a backup, or is
        another one, and writes from here on could log a sequence of rows that happens to match
        the mark again (a restored file re-imported in the same order) with other values."""
        path = self.snapshot_file()
        if not os.path.exists(path):
            return False
        try:
            meta = AccessSnapshot.saved_meta(path)
            holds = meta.get("schema") == self.rows.schema_version() and \
                self.log_mark(self.rows._require_writer(), int(meta["log_seq"])) == meta.get("log_mark")
        except Exception as exc:  # noqa: BLE001  (an unreadable file is no snapshot)
            log.warning("saved access snapshot unreadable: %s", exc)
            holds = False
        if not holds:
            try:
                os.remove(path)
            except OSError:
                pass
        return holds

    def save(self, conn: Optional[sqlite3.Connection] = None) -> None:
        """The snapshot, with the change-log entry it is current with (every logged change up
        to it is in the snapshot: the store applies its own commits and catches up with other
        processes' in log order), beside the database file: at close, and from the checkpoint
        loop (on its connection `conn`, `save_if_due`). Nothing to save (never loaded, due to
        load afresh, unchanged since the last save): a file saved earlier stays, as current as
        it was."""
        if not self.changes.tracking:
            return
        self.changes.generation()  # other processes' commits so far, into the snapshot
        with self.rows._write_lock:  # (held only to copy the arrays: no commit moves them meanwhile)
            snapshot = self.snapshot
            if snapshot is None or snapshot.foreign != self.changes.foreign or self._backlog is not None:
                return
            state = (self.changes.foreign, snapshot.generation, self.changes.log_seq)
            if state == self._saved_state and os.path.exists(self.snapshot_file()):
                return
            frozen, seq = snapshot.frozen(), self.changes.log_seq
        # Entries up to `seq` are committed and never change (the log is only pruned from its start).
        mark = self.log_mark(conn or self.rows._require_writer(), seq)
        if mark is None:
            return
        frozen.save(self.snapshot_file(), {"log_seq": seq, "log_mark": mark, "schema": self.rows.schema_version()})
        self._saved_state = state

    def save_if_due(self, conn: sqlite3.Connection) -> None:
        """`save`, at most once per `save_interval_s`."""
        interval = self.save_interval_s
        if interval is not None and time.monotonic() - self._saved_time >= interval:
            self._saved_time = time.monotonic()
            self.save(conn)

    def resumed(self) -> Optional[AccessSnapshot]:
        """The saved snapshot brought forward to now, and made current; None when there is
        none to trust: not this schema, its change-log entry gone or another (a file put back
        from a backup), more than SNAPSHOT_RESUME_MAX rows logged since, or rows that do not
        add up to the table's (then the caller loads from the table). The log's rows since the
        save are read in one transaction under the write lock (no commit of ours in between),
        each row's whole current state; another process's commits after it are caught up like
        any other (`ChangeFeed.generation`)."""
        foreign = self.changes.generation()
        try:
            snapshot, meta = AccessSnapshot.saved(self.snapshot_file(), foreign)
            seq = int(meta["log_seq"])
        except Exception as exc:  # noqa: BLE001  (any unreadable file: load from the table)
            log.warning("saved access snapshot not used (loading from the table): %s", exc)
            return None
        if meta.get("schema") != self.rows.schema_version():
            return None
        with self.rows._write_lock:
            conn = self.rows._require_writer()
            conn.execute("BEGIN")
            try:
                if self.log_mark(conn, seq) != meta.get("log_mark"):
                    return None
                top = conn.execute(LOG_BOUNDS).fetchone()[1]
                if top - seq > SNAPSHOT_RESUME_MAX:
                    return None
                touched = sorted({r for (r,) in conn.execute(LOG_SINCE, (seq,))})
                snapshot.apply(row_states(conn, touched, with_terms=False)[0])  # (the snapshot only)
                rows, highest = conn.execute("SELECT count(*), COALESCE(MAX(rowid), 0) FROM cells").fetchone()
            finally:
                conn.execute("COMMIT")
            present = np.flatnonzero(snapshot.present[: snapshot.size])
            if len(present) != rows or (rows and int(present[-1]) != highest):
                log.warning("saved access snapshot does not match the table (loading from the table)")
                return None
            if foreign != self.changes.foreign:  # the log asked for a reload meanwhile
                return None
            self.snapshot = snapshot
            self.source = "saved"
        return snapshot

    def _second_connection(self) -> Optional[sqlite3.Connection]:
        """A second connection for loading the snapshot (its reader patterns, read beside the
        rest: `AccessSnapshot.load`), closed after; None without the change log (an old schema
        mid-upgrade), which `_begin_reads` needs."""
        if not self.changes.tracking:
            return None
        return sqlite3.connect(self.rows.path, isolation_level=None, check_same_thread=False,
                               timeout=self.rows.busy_timeout_ms / 1000)

    def _begin_reads(self, conns: list[sqlite3.Connection], attempts: int = 3) -> list[sqlite3.Connection]:
        """Starts a read transaction on each connection, all in one snapshot of the file: under
        the write lock (no commit of ours between them), and seeing the same last change_log
        entry (no other process's commit between them either: every commit that changes a
        row's access columns or window logs one). Tried again when another process committed
        in between; the connections reading: all, or after `attempts` the first alone."""
        def begin(c: sqlite3.Connection) -> Any:
            c.execute("BEGIN")
            return c.execute(LOG_BOUNDS if len(conns) > 1 else "SELECT 1 FROM cells LIMIT 1").fetchone()[-1]

        for _ in range(attempts):
            with self.rows._write_lock:
                tops = {begin(c) for c in conns}
            if len(tops) == 1:
                return conns
            for c in conns:
                c.execute("COMMIT")
        with self.rows._write_lock:
            begin(conns[0])
        return conns[:1]

    # ------------------------------------------------------------ admitted rows
    def wide(self, flt: CellFilter, admitted: int) -> bool:
        """Whether both legs take a filter's rows from its admitted set (the access snapshot's
        arrays) rather than from SQL: a reader-wide filter, however few cells it admits (in
        SQL its access condition is evaluated on every cell of the store), or any filter
        admitting more than `keyword_scan_max` cells. An owner's or a session's filter SQL
        answers by its index."""
        return admitted > self.keyword_scan_max or AccessSnapshot.supports(flt)

    def admitted_set(self, flt: CellFilter, entry: list[Any]) -> AdmittedSet:
        """The filter's admitted rows (kept with its N in `entry`), at most `admitted_rows`
        rows' worth in all."""
        if entry[3] is None:
            self._hold_admitted(entry, self.load_admitted(flt))
        return entry[3]

    def load_admitted(self, flt: CellFilter) -> AdmittedSet:
        where, params = filter_sql(flt)
        return AdmittedSet(*admitted_lengths(self.rows._query(
            f"SELECT c.rowid, x.len FROM cells c JOIN cell_context x ON x.rowid = c.rowid WHERE {where}", params)),
            self.set_arrays)

    def _hold_admitted(self, entry: list[Any], admitted: AdmittedSet) -> None:
        cache = self._stats_cache
        held = [e for e in cache[1].values() if e[3] is not None] if cache is not None else []
        if sum(e[3].n for e in held) + admitted.n > self.admitted_rows:
            for e in held:
                e[3] = None
        entry[3] = admitted

    def stats(self, flt: CellFilter) -> tuple[int, int]:
        entry = self.entry(flt)
        return entry[1], entry[2]

    def entry(self, flt: CellFilter) -> list[Any]:
        """[valid-from time, cells, summed window length, admitted rows or None] for the
        filter: BM25's N and mean length (and, for a wide filter, the rows themselves). A
        reader-wide filter (no owner, session or metadata condition) is answered from the
        access snapshot, its rows kept until a row changes; any other is counted in SQL and
        kept per filter, for every thread, until the database changes (`data_version`).
        Either answer is kept until a cell expires in between."""
        self.rows._windows_current()
        if AccessSnapshot.supports(flt):
            return self._snapshot_entry(flt)
        version = self.changes.data_version()
        cache = self._stats_cache
        if cache is None or cache[0] != version:
            cache = self._stats_cache = (version, {}, [])
        at = flt.not_expired_at.timestamp() if flt.not_expired_at is not None else None
        where, params = filter_sql(replace(flt, not_expired_at=None))
        key = (where, tuple(params), at is None)
        hit = cache[1].get(key)
        if hit is not None and at is not None and at != hit[0]:
            if not cache[2]:  # the store's expiry times, sorted, once per database version
                cache[2].append(sorted(t for (t,) in self.rows._query(
                    "SELECT expires_at FROM cells WHERE expires_at IS NOT NULL")))
            expiries = cache[2][0]
            if at < hit[0] or bisect.bisect_right(expiries, at) != bisect.bisect_right(expiries, hit[0]):
                hit = None  # a cell expired in between (or the clock went back)
        if hit is None:
            if len(cache[1]) >= 256:
                cache[1].clear()
            where, params = filter_sql(flt)
            n, total = self.rows._query(
                f"SELECT COUNT(*), COALESCE(SUM(x.len), 0) FROM cells c JOIN cell_context x ON x.rowid = c.rowid "
                f"WHERE {where}", params,
            )[0]
            hit = cache[1][key] = [at or 0.0, int(n), int(total), None]
        return hit

    def _snapshot_entry(self, flt: CellFilter) -> list[Any]:
        """`entry` of a reader-wide filter, from the access snapshot: its admitted rows,
        computed in memory and kept until the snapshot changes (a commit touching any row) or
        a cell expires in between."""
        snapshot = self.load()
        at = flt.not_expired_at.timestamp() if flt.not_expired_at is not None else None
        where, params = filter_sql(replace(flt, not_expired_at=None))  # also checks the filter
        key = (where, tuple(params), at is None)
        with snapshot.lock:
            hit = snapshot.entries.get(key)
            if hit is not None and at is not None and snapshot.may_have_expired(hit[0], at):
                hit = None
            if hit is None:
                held = sum(e[1] for e in snapshot.entries.values())
                rowids, lengths = snapshot.admitted(flt, key)
                if held + rowids.size > self.admitted_rows:
                    snapshot.entries.clear()
                admitted = AdmittedSet(rowids, lengths, int(lengths.sum()), self.set_arrays)
                hit = snapshot.entries[key] = [at or 0.0, admitted.n, admitted.total, admitted]
            return hit


__all__ = ["SNAPSHOT_RESUME_MAX", "SNAPSHOT_SAVE_INTERVAL_S", "SQLiteAccessIndex", "filter_sql"]
