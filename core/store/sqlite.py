"""The embedded default store: one SQLite file, WAL; rows in and out, migrations.

The schema is `sqlite_schema.MIGRATIONS`. Beside the rows, three in-memory components serve
searches (`indexes.py`): which rows a filter admits (`sqlite_access.py`), the keyword leg
(`sqlite_keyword.py`) and the dense leg (`sqlite_vectors.py`); every commit hands them its
changes (`sqlite_changes.ChangeFeed`). What runs in the background (checkpoints, new cells'
keyword windows, warm-ups) runs on the store's `ampkit.scheduler.Scheduler`.

Concurrency: one writer connection behind a lock (`BEGIN IMMEDIATE` per transaction) and one
reader connection per thread; WAL lets readers run while a write commits.
"""

from __future__ import annotations

import builtins
import fcntl
import json
import logging
import os
import sqlite3
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Callable, Iterator, Optional, Sequence, cast

import numpy as np

from ..errors import Unavailable
from ..glob import upgrade_stored
from ..models import MemoryCell
from ..scheduler import Loop, Scheduler, new_lock, new_rlock, thread_local
from ..textindex import CJK_CLASS, has_hangul, index_text, owner_token, text_key
from ..vector_index import DEFAULT_ANN_THRESHOLD
from ._files import SQLFileReads, SQLFileTx
from .base import COMPACT_JSON, Candidate, CellFilter, StoredVector, cell_columns_text, window_class
from .indexes import CacheBudgets
from .sql import SQLITE
from .sql.store import SQLStore, SQLWriteTx
from .sqlite_access import SNAPSHOT_SAVE_INTERVAL_S, SQLiteAccessIndex
from .sqlite_changes import ChangeFeed
from .sqlite_keyword import TOKENIZER, WARM_TERMS_MIN_CELLS, SQLiteKeywordIndex, tokenize
from .sqlite_schema import MIGRATIONS, split_sql
from .sqlite_vectors import SQLiteVectorIndex
from .sqlite_windows import WindowMarks

log = logging.getLogger("ampkit.store")

# Pending windows (migration 12): indexed at most this many new rows per transaction (the
# write lock is held that long), PENDING_WINDOWS_DELAY_S after the first of them commits
# (the creates arriving meanwhile are indexed in the same pass, their windows shared).
PENDING_WINDOWS_CHUNK = 2000
PENDING_WINDOWS_DELAY_S = 0.05
# Only a transaction creating at most this many cells leaves its windows pending (single
# creates and their commit groups, whose windows a later pass shares); a batch's windows are
# rewritten in one pass already, and deferring them costs more than it saves (bench/writes.py).
PENDING_WINDOWS_MAX_NEW = 64
# A commit writing more vectors or windows than this (a batch, re-embedded cells) has the
# windows loop catch the caches up soon after (`_windows_loop`); fewer are left to the next search.
BACKGROUND_CATCH_UP_ROWS = 64
# How often the windows loop, idle, looks whether another connection to the file (another
# process: `--workers`, a replica, an in-process client) committed, and takes its commits
# into this store's caches then rather than in the next search (`_take_in_foreign`): one
# `PRAGMA data_version` a look while nothing changes.
FOREIGN_LOOK_SECONDS = 1.0
# Checkpoints (the WAL copied back into the database file, with its fsyncs): a background loop
# copies what commits wrote, at most once per CHECKPOINT_INTERVAL_S while they arrive
# (PASSIVE: it never blocks the writer or a reader, and leaves `PRAGMA data_version` as it
# is, so no cache is reloaded). While writes keep coming it rarely catches the last frames,
# so the writer's own autocheckpoint still ends a cycle, every AUTOCHECKPOINT_PAGES instead
# of SQLite's 1000, and copies only what the loop has not: a commit is durable once it is in
# the WAL, so none of this changes a guarantee, and writes wait for the disk less often.
CHECKPOINT_INTERVAL_S = 1.0
CHECKPOINT_RETRY_MIN_S = 0.01  # between tries while a reader holds frames back (a 0 interval would spin)
AUTOCHECKPOINT_PAGES = 4_000


def _ts(value: Optional[datetime]) -> Optional[float]:
    return None if value is None else value.timestamp()


def cell_to_row(cell: MemoryCell) -> dict[str, Any]:
    columns, body = cell_columns_text(cell)
    return {
        **columns,
        "public": int(columns["public"]),
        "expires_at": _ts(columns["expires_at"]),
        "body": body,
        "text_key": text_key(columns["text"]),
        # the body's readable_by as json_extract gives it (migration 13): the access snapshot's column
        "readers": COMPACT_JSON.encode(cell.access_policy.readable_by),
    }


class _SQLiteWriteTx(SQLFileTx, SQLWriteTx, WindowMarks):
    dialect = SQLITE

    def __init__(self, conn: sqlite3.Connection, embed_queue: bool = False, defer_windows: bool = False,
                 embed_new: Optional[Callable[[Sequence[str]], builtins.list[Any]]] = None):
        super().__init__(conn)
        self.embed_queue = embed_queue
        # New rows stored without a vector get it with their keyword windows (`_embed_new`).
        self.embed_new = embed_new
        # New rows' windows left to `SQLiteStore.index_pending_windows` (migration 12) instead
        # of rewritten before COMMIT; `deferred`: this transaction left some.
        self.defer_windows = defer_windows
        self.deferred = False
        self._dirty_windows: set[int] = set()
        self._inserted: list[int] = []  # new rows, whose windows `flush` marks in one pass
        self._vec_seq: Optional[int] = None  # last vec_seq given out in this transaction
        self._vec_seq_stored: Optional[int] = None  # the counter as stored (read with it)
        self.vectors_written = 0

    def _vector_columns(self, vector: StoredVector) -> dict[str, Any]:
        """A vector as stored: float16 (half the bytes; cosine ranking is unchanged to ~1e-3)
        and a vec_seq that orders vector changes, so every process's index can catch up."""
        vec = np.asarray(vector.vector, dtype=np.float32).ravel()
        return {"embed_model": vector.model, "embed_dim": int(vec.size),
                "embedding": vec.astype(np.float16).tobytes(), "vec_seq": self._next_vec_seq()}

    def _next_vec_seq(self) -> int:
        if self._vec_seq is None:  # writes are serialised: one read per transaction, one write (`flush`)
            self._vec_seq = self._vec_seq_stored = self.conn.execute(
                "SELECT value FROM store_counters WHERE name = 'vec_seq'").fetchone()[0]
        self._vec_seq += 1
        self.vectors_written += 1
        return self._vec_seq

    def _write_vector(self, cell_id: str, vector: Optional[StoredVector]) -> None:
        if vector is not None:
            cols = self._vector_columns(vector)
            sets = ", ".join(f"{k} = ?" for k in cols)
            self.conn.execute(f"UPDATE cells SET {sets} WHERE id = ?", [*cols.values(), cell_id])

    def _write_readers(self, cell: MemoryCell, new: bool = False) -> None:
        if not new:
            self.conn.execute("DELETE FROM cell_readers WHERE cell_id = ?", (cell.id,))
        self.conn.executemany(
            "INSERT OR IGNORE INTO cell_readers(cell_id, pattern) VALUES (?, ?)",
            [(cell.id, SQLITE.reader_pattern(p)) for p in cell.access_policy.readable_by],
        )

    def take_pending(self, limit: int, embedded: Optional[dict[int, tuple[str, Any]]] = None) -> int:
        """Mark the windows of up to `limit` pending new rows (the oldest) and take them off
        the pending list; `flush` rewrites them. Store their vectors (`_embed_new`, with
        those `embedded` before the transaction). Returns how many."""
        rowids = [r for (r,) in self.conn.execute("SELECT rowid FROM pending_windows ORDER BY rowid LIMIT ?", (limit,))]
        if rowids:
            self.conn.execute("DELETE FROM pending_windows WHERE rowid <= ?", (rowids[-1],))
            self._touch_new(rowids)
            self._embed_new(rowids, embedded)
        return len(rowids)

    def _embed_new(self, rowids: Sequence[int], embedded: Optional[dict[int, tuple[str, Any]]] = None) -> None:
        """Store the vectors of these new rows that have none, embedded in one call
        (`embed_new`), when their windows are indexed: a single create then neither waits for
        its embedding nor pays a one-text call (dearer per text than a batch). A
        vector `embedded` before the transaction is used while its text is still the row's. A
        text `embed_new` leaves to the background is queued for it instead."""
        if self.embed_new is None or not rowids:
            return
        embedded = embedded or {}
        rows = []
        for i in range(0, len(rowids), 500):
            chunk = rowids[i : i + 500]
            rows += self.conn.execute(
                f"SELECT rowid, id, text FROM cells WHERE embedding IS NULL AND rowid IN ({','.join('?' * len(chunk))})",
                chunk).fetchall()
        if not rows:
            return
        now = [(rowid, text) for rowid, _, text in rows if embedded.get(rowid, (None,))[0] != text]
        vectors = {rowid: vector for rowid, (_, vector) in embedded.items()}
        vectors.update(zip((rowid for rowid, _ in now), self.embed_new([text for _, text in now]) if now else []))
        for rowid, cell_id, _ in rows:
            vector = vectors[rowid]
            if vector is not None:  # (and off the queue, where a start-up's scan may have put it)
                self.set_vector(cell_id, vector)
            elif self.embed_queue:
                self._queue(cell_id)

    def flush(self) -> None:
        """Rewrite the marked keyword windows (text, term frequencies, length); runs once
        before COMMIT, so a batch of turns in one session rewrites each window once. The
        vec_seq counter is stored here too, once for the transaction (after the vectors of
        new rows indexed here)."""
        if self._inserted:
            if self.defer_windows and len(self._inserted) <= PENDING_WINDOWS_MAX_NEW:
                # (A row a savepoint undid may be listed: its pass finds no row, and rewrites nothing.)
                self.conn.executemany("INSERT OR IGNORE INTO pending_windows(rowid) VALUES (?)", [(r,) for r in self._inserted])
                self.deferred = True
            else:
                self._touch_new(self._inserted)
                self._embed_new(self._inserted)
            self._inserted = []
        if self._vec_seq != self._vec_seq_stored:
            self.conn.execute("UPDATE store_counters SET value = ? WHERE name = 'vec_seq'", (self._vec_seq,))
            self._vec_seq_stored = self._vec_seq
        dirty = sorted(self._dirty_windows)
        if not dirty:  # nothing to rewrite (and an old schema mid-upgrade has no cell_context yet)
            return
        self.conn.executemany("DELETE FROM cell_context WHERE rowid = ?", [(r,) for r in dirty])
        windows = self._windows(dirty)
        # A window's terms are the sum of its parts' terms: the tokenizer splits at the
        # newlines that join them, and CJK runs never cross one (`index_text` of each part).
        # So each text is tokenized once, not once per window it lends context to (five).
        for i in range(0, len(dirty), 500):
            chunk = [rowid for rowid in dirty[i : i + 500] if rowid in windows]
            parts = {r: t for rowid in chunk for r, t in windows[rowid][1]}
            part_tf = dict(zip(parts, tokenize(self.conn, [index_text(t) for t in parts.values()])))
            rows = []
            for rowid in chunk:
                owner, window = windows[rowid]
                tf: dict[str, int] = {}
                for r, _ in window:
                    for term, n in part_tf[r].items():
                        tf[term] = tf.get(term, 0) + n
                rows.append((rowid, index_text("\n".join(t for _, t in window)), owner_token(owner),
                             COMPACT_JSON.encode(dict(sorted(tf.items()))),
                             sum(tf.values())))
            self.conn.executemany("INSERT INTO cell_context(rowid, text, owner, terms, len) VALUES (?, ?, ?, ?, ?)", rows)
        self._dirty_windows.clear()

    def _rowid(self, cell_id: str) -> Optional[int]:
        row = self.conn.execute("SELECT rowid FROM cells WHERE id = ?", (cell_id,)).fetchone()
        return None if row is None else row[0]

    def insert(self, cell: MemoryCell, vector: Optional[StoredVector] = None) -> None:
        row = cell_to_row(cell)
        if vector is not None:
            row.update(self._vector_columns(vector))
        else:
            # No vector yet, but a vec_seq all the same: the rowid may be a purged row's (SQLite
            # reuses the highest rowid once it is deleted), whose vector an in-memory index still
            # holds; catching up, every index forgets it (see `_catch_up_vectors`).
            row["vec_seq"] = self._next_vec_seq()
        cols = ",".join(row)
        cur = self.conn.execute(f"INSERT INTO cells({cols}) VALUES ({','.join('?' * len(row))})", list(row.values()))
        self._inserted.append(cur.lastrowid or 0)  # an INSERT always sets lastrowid
        self._write_readers(cell, new=True)
        if vector is None and self.embed_queue and self.embed_new is None:  # (else `_embed_new` decides)
            self._queue(cell.id)

    def _queue(self, cell_id: str) -> None:
        self.conn.execute("INSERT OR IGNORE INTO embed_queue(cell_id) VALUES (?)", (cell_id,))

    def set_vector(self, cell_id: str, vector: StoredVector) -> None:
        self._write_vector(cell_id, vector)
        self.conn.execute("DELETE FROM embed_queue WHERE cell_id = ?", (cell_id,))

    def update(self, cell: MemoryCell, vector: Optional[StoredVector] = None) -> None:
        row = cell_to_row(cell)
        old = self.conn.execute("SELECT rowid, text, window_class FROM cells WHERE id = ?", (cell.id,)).fetchone()
        # A new text, or a new window class (policy, status, session...), rewrites the windows
        # of the cell's old neighbours (before the UPDATE) and of its new ones (after it).
        moved = old is not None and (old[1] != row["text"] or old[2] != row["window_class"])
        if moved:
            self._touch(old[0])
        sets = ",".join(f"{k} = ?" for k in row if k != "id")
        self.conn.execute(f"UPDATE cells SET {sets} WHERE id = ?", [v for k, v in row.items() if k != "id"] + [cell.id])
        if moved:
            self._touch(old[0])
        self._write_readers(cell)
        self._write_vector(cell.id, vector)
        if vector is None and self.embed_queue and old is not None and old[1] != row["text"]:
            self._queue(cell.id)

    def _forget(self, cell_id: str) -> None:
        rowid = self._rowid(cell_id)
        if rowid is not None:  # erasure: its text leaves its own and its neighbours' windows
            self._touch(rowid)
        self.conn.execute("DELETE FROM cell_readers WHERE cell_id = ?", (cell_id,))
        self.conn.execute("DELETE FROM embed_queue WHERE cell_id = ?", (cell_id,))



class SQLiteStore(SQLFileReads, SQLStore):
    backend = "sqlite"
    embeds_new_rows = True  # with their keyword windows (`_SQLiteWriteTx._embed_new`)
    serialised_writes = True
    dialect = SQLITE
    MIGRATIONS = MIGRATIONS

    def __init__(
        self,
        path: str,
        *,
        synchronous: str = "NORMAL",
        busy_timeout_ms: int = 10000,
        ann_threshold: Optional[int] = DEFAULT_ANN_THRESHOLD,
        keyword_scan_max: int = 5000,
        warm_exact_max: int = 20000,
        checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S,
        warm_terms_min_cells: Optional[int] = WARM_TERMS_MIN_CELLS,
        defer_windows: bool = True,
        snapshot_save_interval_s: Optional[float] = SNAPSHOT_SAVE_INTERVAL_S,
        budgets: CacheBudgets = CacheBudgets(),
        scheduler: Optional[Scheduler] = None,
    ):
        self.path = path
        self.synchronous = synchronous
        self.busy_timeout_ms = busy_timeout_ms
        # Runs this store's background loops and tasks (the composition root's, or its own).
        self.scheduler = scheduler or Scheduler()
        # False: every write rewrites its keyword windows before COMMIT, as before migration 12
        # (the same windows, bit for bit: tests compare the two).
        self.defer_windows = defer_windows
        self.checkpoint_interval_s = checkpoint_interval_s
        self.checkpoints = 0  # done by the background loop
        self._opened = 0  # open() calls so far (a background warm-up belongs to one)
        self._write_lock = new_rlock()
        self._writer: Optional[sqlite3.Connection] = None
        self._local = thread_local()
        self._readers: builtins.list[sqlite3.Connection] = []
        self._readers_lock = new_lock()
        self._lifecycle_lock = new_lock()
        self.wall_clock: Callable[[], float] = time.time  # the scheduled jobs' claims (tests move it)
        self._embedding_lease: Optional[int] = None  # descriptor holding the flock (`holds_embedding_lease`)
        self._embedding_lease_lock = new_lock()
        self._tempdir: Optional[tempfile.TemporaryDirectory] = None
        # New rows' keyword windows are indexed after their commit (migration 12), by the
        # windows loop, woken by such commits, and by `_windows_current` before a read.
        self._deferring = False  # the pending_windows table exists (open)
        self._large_commits = 0  # commits that changed many rows: the windows loop catches up
        self._windows: Optional[Loop] = None
        self._checkpointer: Optional[Loop] = None  # woken by each commit
        # The in-memory components over the rows, kept in step with every commit by the feed.
        self.changes = ChangeFeed(self)
        self.access = SQLiteAccessIndex(self, self.changes, budgets=budgets, keyword_scan_max=keyword_scan_max,
                                        save_interval_s=snapshot_save_interval_s)
        self.keyword = SQLiteKeywordIndex(self, self.changes, self.access, budgets=budgets,
                                          warm_terms_min_cells=warm_terms_min_cells)
        self.vectors = SQLiteVectorIndex(self, self.access, ann_threshold=ann_threshold, warm_exact_max=warm_exact_max)
        self.changes.listeners = [self.access, self.keyword]

    # ------------------------------------------------------------ connections
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=self.busy_timeout_ms / 1000)
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        # The connection's TEMP tables (the tokenizer's index, the writer's touched rows) are
        # filled and emptied by every write: in memory, not in a temporary file with a journal.
        # Set before any TEMP table exists (setting it drops them).
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.create_function("ampkit_index_text", 1, index_text, deterministic=True)  # migration 2
        conn.create_function("ampkit_owner_token", 1, owner_token, deterministic=True)
        conn.create_function("ampkit_text_key", 1, text_key, deterministic=True)  # migration 9
        for statement in TOKENIZER:
            conn.execute(statement)
        return conn

    @property
    def opened(self) -> int:
        return self._opened

    def current(self, opened: int) -> bool:
        """Whether the store is open, and by the open() that started a warm-up (`opened`)."""
        return self._writer is not None and self._opened == opened

    def open(self) -> None:
        if self._writer is not None:  # already open: a second writer and warm-ups would race the first
            return
        # Each open's background warm-ups stop at a close: a warm-up of an earlier open that
        # is still running (`ampkit serve` opens, closes and opens again at startup) must not
        # mark the index ready or build its graph over a partial load for the later one.
        self._opened += 1
        if self.path in (":memory:", ""):
            # An ephemeral store is a real file in a temporary directory, so that it behaves
            # exactly like the persistent one (WAL, one writer, many readers).
            self._tempdir = tempfile.TemporaryDirectory(prefix="ampkit-")
            self.path = os.path.join(self._tempdir.name, "memory.db")
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        try:
            self._writer = self._connect()
        except sqlite3.Error as exc:
            raise Unavailable(f"cannot open SQLite store at {self.path}: {exc}") from exc
        self.migrate()
        self.changes.opened(self._writer)
        self._deferring = self._writer.execute("SELECT 1 FROM sqlite_master WHERE name = 'pending_windows'").fetchone() is not None
        self.access.opened()
        if self._deferring and self._windows is None:  # (also what another process left pending)
            self._windows = self.scheduler.loop("sqlite.windows", self._windows_loop)
            self._windows.wake()  # what a crash left pending (a pass that finds none costs one query)
        self._writer.execute(f"PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT_PAGES}")
        if self._checkpointer is None:  # (an open store opened again keeps its loop)
            self._checkpointer = self.scheduler.loop("sqlite.checkpoint", self._checkpoint_loop)
        # The vector index starts loading once the term warm-up has loaded the access snapshot
        # (`SQLiteAccessIndex.first`), which the first reader-wide search waits for: the two
        # loads would share the cores.
        warm_terms = self.keyword.opened()
        if warm_terms:
            self.access.first.clear()
        self.vectors.opened()
        if warm_terms:
            self.keyword.start_warmup()

    def _checkpoint_loop(self, loop: Loop) -> None:
        """The background checkpoints (see CHECKPOINT_INTERVAL_S), on a connection of their own;
        and, every `snapshot_save_interval_s`, the access snapshot saved."""
        conn: Optional[sqlite3.Connection] = None
        try:
            while True:
                loop.wait()
                if loop.stopping:
                    return
                loop.take()
                behind = False
                try:
                    if conn is None:
                        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                               timeout=self.busy_timeout_ms / 1000)
                    _, wal_frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    # A reader that began before the last commits holds their frames back
                    # (PASSIVE copies only what every reader is past): try again after the
                    # interval, so the file catches up once writes stop, not at the next commit.
                    behind = copied < wal_frames
                    self.access.save_if_due(conn)
                except sqlite3.Error:
                    pass  # the next commit asks again; the writer's autocheckpoint is the backstop
                except (OSError, Unavailable) as exc:
                    log.warning("access snapshot not saved: %s", exc)
                finally:
                    self.checkpoints += 1
                    loop.done(again=behind)
                if loop.sleep(max(self.checkpoint_interval_s, CHECKPOINT_RETRY_MIN_S) if behind
                              else self.checkpoint_interval_s):
                    return
        finally:
            if conn is not None:
                conn.close()

    def wait_for_checkpoint(self, timeout: Optional[float] = None) -> bool:
        """Until no checkpoint is asked for or running: every commit so far is in the database
        file (the loop tries again while readers hold frames back); False on timeout."""
        loop = self._checkpointer
        return loop is None or loop.idle(timeout)

    def _stop_checkpointer(self) -> None:
        loop, self._checkpointer = self._checkpointer, None
        if loop is not None:
            self.scheduler.stop(loop.name)

    def _windows_loop(self, loop: Loop) -> None:
        """Index pending windows (`index_pending_windows`) PENDING_WINDOWS_DELAY_S after a
        commit left some; a failure (the disk, a busy file) is retried by the next commit
        that leaves some, and by any read that needs them first. Then catch the vector index
        up with the pass's vectors and any batch's (BACKGROUND_CATCH_UP_ROWS), and convert the
        term cache's new log entries (`PostingsCache.convert_closed`)."""
        self._local.windows_loop = True  # (its own commits wake no catch-up: it is the one catching up)
        caught_up = self._large_commits
        while not loop.stopping:  # (checked here too: a stop may come just before the take)
            if not loop.wait(FOREIGN_LOOK_SECONDS):
                self._take_in_foreign()
                continue
            if loop.sleep(PENDING_WINDOWS_DELAY_S):
                return
            loop.take()
            try:
                large = self._large_commits
                behind, caught_up = large != caught_up, large
                try:
                    # (Woken by a batch alone: a pass only if some other commit left windows.)
                    indexed = self.index_pending_windows() if not behind or self._windows_pending() else 0
                except Exception:  # noqa: BLE001 - keep the loop: the next commit or search retries
                    log.exception("indexing new cells' keyword windows failed")
                    continue
                if indexed or behind:
                    self._catch_up_caches()
            finally:
                loop.done()

    def _catch_up_caches(self) -> None:
        """New vectors (a pass's, a batch's, another process's) into the index, and new windows
        into the term cache's log, now rather than in the next search."""
        self.vectors.catch_up_if_ready()
        self.keyword.convert_closed()

    def _take_in_foreign(self) -> None:
        """What other connections committed since the caches last looked (an import through
        another process), taken in now: their logged rows into the caches
        (`ChangeFeed.generation`), their vectors into the index, the log's new entries
        converted, so the next wide search finds at most a look's worth."""
        loop = self._windows
        if loop is None or loop.stopping or not self.changes.committed_elsewhere():
            return  # nothing committed anywhere since the last look (or the store closed meanwhile)
        try:
            self.changes.generation()
        except (Unavailable, sqlite3.Error):  # (closed meanwhile, or the disk: the next search catches up)
            return
        self._catch_up_caches()

    def _stop_windows_thread(self) -> None:
        loop, self._windows = self._windows, None
        if loop is not None:
            self.scheduler.stop(loop.name)

    def index_pending_windows(self) -> int:
        """Index the keyword windows of the cells created since the last pass (and of their
        predecessors), in transactions of at most PENDING_WINDOWS_CHUNK new rows; returns
        how many new rows were indexed."""
        done = 0
        while True:
            embedded = self._embed_pending(PENDING_WINDOWS_CHUNK)
            with self.write() as tx:
                taken = cast(_SQLiteWriteTx, tx).take_pending(PENDING_WINDOWS_CHUNK, embedded)
            done += taken
            if taken < PENDING_WINDOWS_CHUNK:
                return done

    def _embed_pending(self, limit: int) -> dict[int, tuple[str, Any]]:
        """The pending rows without a vector, embedded before the pass takes the write lock
        (a create waiting for the lock would wait for the embedding too): rowid -> (the text
        embedded, its vector or None). The pass uses a vector only while its row's text is
        still that text (`_SQLiteWriteTx._embed_new`)."""
        if self.embed_new is None:
            return {}
        rows = self._query("SELECT c.rowid, c.text FROM pending_windows p JOIN cells c ON c.rowid = p.rowid "
                           "WHERE c.embedding IS NULL ORDER BY p.rowid LIMIT ?", (limit,))
        if not rows:
            return {}
        return {rowid: (text, vector) for (rowid, text), vector in zip(rows, self.embed_new([text for _, text in rows]))}

    def _windows_current(self) -> None:
        """Before any answer that depends on the keyword windows (matches, BM25's statistics,
        the rows either leg admits: a cell without a window is admitted by neither) or on the
        vectors (new rows get theirs in the same pass, `embed_new`): the windows of every cell
        committed so far, by this process or another, are indexed, so a search sees every
        write acknowledged before it, scored as if indexed at its commit.
        A read inside this thread's own write transaction (none does) would not wait. When
        the pass cannot write (a full disk), the search answers from the windows indexed so
        far rather than fail: reads keep working, and the pass runs again at the next write
        or search."""
        if not self._deferring or getattr(self._local, "writing", False):
            return
        if self._windows_pending():
            try:
                self.index_pending_windows()
            except Unavailable as exc:
                log.warning("new cells' keyword windows not indexed yet (searches miss them until they are): %s", exc)

    def _windows_pending(self) -> bool:
        return bool(self._query("SELECT EXISTS (SELECT 1 FROM pending_windows)")[0][0])

    def wait_for_access_snapshot(self, timeout: Optional[float] = None) -> bool:
        """Until the warm-up open() started has loaded the access snapshot (at once when it
        has none to load: a small store); False on timeout. The embedding worker's start-up
        scan waits for it, as the vector warm-up does."""
        return self.access.wait(timeout)

    def wait_for_term_warmup(self, timeout: Optional[float] = None) -> bool:
        """Until the background term warm-up started by open() is done; False on timeout."""
        return self.keyword.wait_for_warmup(timeout)

    def wait_for_vector_index(self, timeout: Optional[float] = None) -> None:
        """Until the background loading and graph building started so far are done."""
        self.vectors.wait(timeout)

    # ------------------------------------------------------------ migrations (the loop: SQLStore)
    def _applied_versions(self) -> Optional[set[int]]:
        # Read-only, and never creates the file: `ampkit migrate --check` changes nothing.
        if self.path in ("", ":memory:") or not os.path.exists(self.path):
            return None
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        try:
            if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'schema_migrations'").fetchone() is None:
                return None
            return {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
        finally:
            conn.close()

    @contextmanager
    def _migration_connection(self) -> Iterator[sqlite3.Connection]:
        conn = self._require_writer()
        with self._write_lock:
            yield conn

    @contextmanager
    def _migration_transaction(self, conn: sqlite3.Connection, version: int, name: str) -> Iterator[None]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _run_script(self, conn: sqlite3.Connection, script: str) -> None:
        for statement in split_sql(script):
            conn.execute(statement)

    def close(self) -> None:
        self._stop_windows_thread()
        self._release_embedding_lease()  # (its embedding worker stopped first: the server's lifespan)
        if self._deferring and self._writer is not None:
            try:  # a clean stop leaves nothing pending (the next open would index it otherwise)
                self.index_pending_windows()
            except Unavailable:
                pass
        self._stop_checkpointer()  # before the writer closes: its close checkpoints what is left
        if self._writer is not None:
            self.vectors.save_graphs()  # a restart then loads the graphs instead of rebuilding them
            try:  # a restart then reads it instead of scanning the table
                self.access.save()
            except (OSError, sqlite3.Error, Unavailable) as exc:
                log.warning("access snapshot not saved (the next start loads it from the table): %s", exc)
        # The background warm-ups read under these locks: none reads from a connection closed here.
        with self.keyword.warm_lock, self.access.warm_lock, self.vectors.lock:
            with self._readers_lock:
                for conn in self._readers:
                    conn.close()
                self._readers.clear()
            self._local = thread_local()
            self.changes.closed()
            self.keyword.closed()
            self.access.closed()
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None

    def _require_writer(self) -> sqlite3.Connection:
        if self._writer is None:
            raise Unavailable("store is not open")
        return self._writer

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            self._require_writer()
            conn = self._connect()
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    # ------------------------------------------------------------ writes
    @contextmanager
    def _write_transaction(self) -> Iterator[_SQLiteWriteTx]:
        conn = self._require_writer()
        with self._write_lock:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise Unavailable(f"store is busy or unwritable: {exc}") from exc
            tx = _SQLiteWriteTx(conn, self.embed_queue, defer_windows=self._deferring and self.defer_windows,
                                embed_new=self.embed_new)
            self._local.writing = True
            try:
                yield tx
                changes = self.changes.collect(conn)
                conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                _rollback(conn)
                # disk full, read-only file system, I/O error: the write did not happen.
                raise Unavailable(f"store cannot write: {exc}") from exc
            except BaseException:
                _rollback(conn)
                raise
            finally:
                self._local.writing = False
            self.changes.apply(changes)
            if self._checkpointer is not None:
                self._checkpointer.wake()
            if tx.deferred:
                self._wake_windows()
            elif (max(tx.vectors_written, len(changes.terms) if changes else 0) > BACKGROUND_CATCH_UP_ROWS
                  and not getattr(self._local, "windows_loop", False)):
                self._large_commits += 1  # (the windows loop catches the caches up)
                self._wake_windows()

    def _wake_windows(self) -> None:
        if self._windows is not None:
            self._windows.wake()

    # ------------------------------------------------------------ reads
    def _query(self, sql: str, params: Sequence[Any] = ()) -> builtins.list[tuple]:
        try:
            return self._reader().execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            raise Unavailable(f"store cannot read: {exc}") from exc

    def keyword_candidates(self, query: str, flt: CellFilter, k: int) -> builtins.list[Candidate]:
        """BM25 over the windows `flt` admits, with statistics over those alone (`SQLiteKeywordIndex`)."""
        return self.keyword.candidates_many([query], flt, k)[0]

    def keyword_candidates_many(self, queries: Sequence[str], flt: CellFilter, k: int) -> builtins.list[builtins.list[Candidate]]:
        return self.keyword.candidates_many(queries, flt, k)

    def vector_candidates(self, vector: Any, model: str, flt: CellFilter, k: int) -> builtins.list[Candidate]:
        return self.vectors.candidates(vector, model, flt, k)

    def has_vectors(self, model: str, flt: CellFilter) -> bool:
        return self.vectors.has_vectors(model, flt)

    def vector_models(self, cell_ids: Sequence[str]) -> dict[str, str]:
        self._windows_current()
        out: dict[str, str] = {}
        ids = list(cell_ids)
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            out.update(self._query(
                f"SELECT id, embed_model FROM cells WHERE embed_model IS NOT NULL AND id IN ({','.join('?' * len(chunk))})",
                chunk,
            ))
        return out

    @property
    def vectors_warming(self) -> bool:
        """True while the vector index is still loading after open, or while its approximate
        graph is being built or loaded (see `SQLiteVectorIndex.candidates`)."""
        return self.vectors.warming

    def vector_index_state(self) -> dict[str, Any]:
        return {"keyword_warmup": self.keyword.warmup_state(), "access_snapshot": self.access.source or "none",
                **self.vectors.state()}

    @contextmanager
    def try_lifecycle_lock(self) -> Iterator[bool]:
        got = self._lifecycle_lock.acquire(blocking=False)
        try:
            yield got
        finally:
            if got:
                self._lifecycle_lock.release()

    def holds_embedding_lease(self) -> bool:
        """An `flock` on `PATH-embedding.lock`, taken without waiting and then kept until the
        store closes; the kernel releases it when its process ends, however it ends, and
        another process's next ask takes it. (A store in a temporary directory, `memory://`,
        is this process's alone.)"""
        if self._tempdir is not None or self.path in ("", ":memory:"):
            return True
        with self._embedding_lease_lock:
            if self._embedding_lease is None:
                try:
                    fd = os.open(f"{self.path}-embedding.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                except OSError:  # no lock file here (a read-only directory): every process embeds
                    return True
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    return False
                self._embedding_lease = fd
            return True

    def _release_embedding_lease(self) -> None:
        with self._embedding_lease_lock:
            if self._embedding_lease is not None:
                os.close(self._embedding_lease)  # (closing the only descriptor releases the flock)
                self._embedding_lease = None

    def claim_scheduled_lifecycle(self, interval_seconds: float) -> bool:
        return self.claim_scheduled_job("lifecycle", interval_seconds)

    def claim_scheduled_job(self, name: str, interval_seconds: float) -> bool:
        """Processes sharing the file (`ampkit serve --workers`, servers on one file) run a
        scheduled job once per interval in all: the first whose timer fires stores the time
        (ms since the epoch) in `store_counters`, in the upsert that checks the last one; the
        others find a recent time and skip. (A tenth of the interval is allowed for timers
        that drift, as on PostgreSQL.)"""
        now_ms = int(self.wall_clock() * 1000)
        return self._execute(
            "INSERT INTO store_counters(name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value "
            "WHERE store_counters.value <= ?",
            (f"schedule:{name}", now_ms, now_ms - int(900 * interval_seconds)),
        ) == 1

    def _execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        with self.write() as tx:
            return tx.conn.execute(statement, params).rowcount  # type: ignore[attr-defined]

    def stats(self) -> dict[str, Any]:
        cells = self._query("SELECT COUNT(*) FROM cells")[0][0]
        size = os.path.getsize(self.path) if os.path.exists(self.path) else 0
        wal = self.path + "-wal"
        size += os.path.getsize(wal) if os.path.exists(wal) else 0
        return {"backend": self.backend, "path": self.path, "cells": cells, "bytes": size}

    # ------------------------------------------------------------ embedding queue
    def embedding_queue_depth(self) -> int:
        self._windows_current()  # (new rows join the queue in the pass that indexes them)
        return int(self._query("SELECT COUNT(*) FROM embed_queue")[0][0])

    def queued_embeddings(self, limit: int) -> builtins.list[tuple[str, str]]:
        self._windows_current()
        return [(cid, text) for cid, text in self._query(
            "SELECT q.cell_id, c.text FROM embed_queue q JOIN cells c ON c.id = q.cell_id ORDER BY q.seq LIMIT ?", (limit,))]

    def pending_embeddings(self, flt: CellFilter, created_by: str, since_id: str,
                           limit: int) -> builtins.list[tuple[str, str]]:
        self._windows_current()  # (new rows join the queue in the pass that indexes them)
        return super().pending_embeddings(flt, created_by, since_id, limit)

    def queue_stale_embeddings(self, model: str, batch_size: int = 10000, cjk_model: Optional[str] = None) -> int:
        # Found by reads, batch by batch of rowids, and queued by a short write only when a
        # batch has some: the scan held the write lock batch after batch (long on a large
        # store, at every start), so other writers, and a search indexing a new cell's
        # keyword window (migration 12), lost the lock to the next batch until their busy
        # timeout. A row found stale that is rewritten meanwhile is embedded once more.
        if cjk_model is None:
            stale, params = "embed_model IS NOT ?", [model]
        else:  # GLOB runs in C: an English store costs a scan, no Python per row. A text of
            # ASCII alone (as many bytes as characters) holds no CJK character and is not
            # matched against the class at all: a GLOB of every text would cost a large store
            # seconds of CPU at every start, beside the warm-ups.
            stale = "embed_model IS NOT (CASE WHEN length(CAST(text AS BLOB)) > length(text) AND text GLOB ? THEN ? ELSE ? END)"
            params = [f"*{CJK_CLASS}*", cjk_model, model]
        queued, after = 0, 0
        while True:
            last = self._query("SELECT MAX(rowid) FROM (SELECT rowid FROM cells WHERE rowid > ? ORDER BY rowid LIMIT ?)",
                               (after, batch_size))[0][0]
            if last is None:
                return queued
            ids = self._query(f"SELECT id FROM cells WHERE rowid > ? AND rowid <= ? AND {stale} ORDER BY rowid",
                              (after, last, *params))
            if ids:
                with self.write() as tx:
                    queued += cast(_SQLiteWriteTx, tx).conn.executemany(
                        "INSERT OR IGNORE INTO embed_queue(cell_id) VALUES (?)", ids).rowcount
            after = last


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


def _rebuild_access_and_windows(conn: sqlite3.Connection) -> None:
    """Migration 5: patterns outside the glob grammar rewritten to match literally
    (`ampkit.glob.upgrade_stored`), then every cell's window class and compiled readers, then
    every window."""
    conn.execute("DELETE FROM cell_readers")
    rowids: list[int] = []
    for rowid, cell_id, owner_id, session_id, created_by, public, status, superseded_by, body in conn.execute(
        "SELECT rowid, id, owner_id, session_id, created_by, public, status, superseded_by, body FROM cells"
    ).fetchall():
        data = json.loads(body)
        policy = data.setdefault("access_policy", {})
        upgraded = {k: [upgrade_stored(p) for p in policy.get(k, [])] for k in ("readable_by", "writable_by")}
        if any(upgraded[k] != policy.get(k, []) for k in upgraded):
            policy.update(upgraded)
            conn.execute("UPDATE cells SET body = ? WHERE rowid = ?",
                         (json.dumps(data, separators=(",", ":"), ensure_ascii=False), rowid))
        readable_by = upgraded["readable_by"]
        klass = window_class(owner_id, session_id, created_by, bool(public), readable_by, status, superseded_by)
        conn.execute("UPDATE cells SET window_class = ? WHERE rowid = ?", (klass, rowid))
        conn.executemany("INSERT OR IGNORE INTO cell_readers(cell_id, pattern) VALUES (?, ?)",
                         [(cell_id, SQLITE.reader_pattern(p)) for p in readable_by])
        rowids.append(rowid)
    tx = _SQLiteWriteTx(conn)
    for i in range(0, len(rowids), 2000):
        tx._dirty_windows.update(rowids[i : i + 2000])
        tx.flush()


def _rewrite_hangul_windows(conn: sqlite3.Connection) -> None:
    """Migration 7: the windows whose text holds Korean, indexed again."""
    rowids = [rowid for rowid, text in conn.execute("SELECT rowid, text FROM cell_context") if has_hangul(text)]
    tx = _SQLiteWriteTx(conn)
    for i in range(0, len(rowids), 2000):
        tx._dirty_windows.update(rowids[i : i + 2000])
        tx.flush()


# Python steps that run inside a migration's transaction, after its SQL.
MIGRATION_STEPS = {5: _rebuild_access_and_windows, 7: _rewrite_hangul_windows}
SQLiteStore.MIGRATION_STEPS = MIGRATION_STEPS
