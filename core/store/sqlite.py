"""The embedded default: one SQLite file, WAL, FTS5 BM25 for the keyword leg.

Layout (see MIGRATIONS): `cells` holds the indexed columns plus the rest of the cell as
JSON (`body`, without the text, which lives once in the `text` column); `cells_fts` is an
external-content FTS5 index over `cells.text`, kept in step by triggers inside the same
transaction; `cell_readers` holds each cell's `readable_by` patterns (as SQLite GLOBs) so the
access filter runs inside the query; `history` is append-only.

Concurrency: one writer connection behind a lock (`BEGIN IMMEDIATE` per transaction) and one
reader connection per thread; WAL lets readers run while a write commits.
"""

from __future__ import annotations

import bisect
import builtins
import fcntl
import hashlib
import json
import logging
import os
import re
import sqlite3
import tempfile
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Callable, Iterator, Optional, Sequence, cast

import numpy as np

from ..errors import Unavailable
from ..glob import upgrade_stored
from ..models import MemoryCell
from ..scheduler import Loop, Scheduler
from ..textindex import CJK_CLASS, STOP_WORDS, fts_match, has_hangul, index_text, owner_token, query_terms, text_key
from ..vector_index import DEFAULT_ANN_THRESHOLD, VectorIndex, _top_k, row_dots
from ._access_snapshot import SNAPSHOT_COLUMNS, SNAPSHOT_FROM, AccessSnapshot, RowState, row_state
from ._bm25 import AdmittedSet, PostingsCache, SetArrays, admitted_lengths, bm25_scores, doc_counts, int_list, top_k, union_positions
from .sql import SQLITE, compile_filter
from .sql.store import SQLStore, SQLWriteTx
from ._files import FILES_SCHEMA, SQLFileReads, SQLFileTx
from .base import (
    COMPACT_JSON, CONTEXT_RADIUS, Candidate, CellFilter, StoredVector, cell_columns_text, window_class,
)

log = logging.getLogger("ampkit.store")

MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "cells, keyword index, readers, history",
        """
        CREATE TABLE cells (
            id            TEXT PRIMARY KEY,
            owner_id      TEXT NOT NULL,
            created_by    TEXT,
            session_id    TEXT,
            type          TEXT NOT NULL,
            status        TEXT NOT NULL,
            public        INTEGER NOT NULL DEFAULT 0,
            expires_at    REAL,
            superseded_by TEXT,
            text          TEXT NOT NULL,
            body          TEXT NOT NULL,
            embed_model   TEXT,
            embedding     BLOB
        );
        CREATE INDEX cells_owner_status ON cells(owner_id, status, id);
        CREATE INDEX cells_status ON cells(status, id);
        CREATE TABLE cell_readers (
            cell_id TEXT NOT NULL,
            pattern TEXT NOT NULL,
            PRIMARY KEY (cell_id, pattern)
        ) WITHOUT ROWID;
        CREATE VIRTUAL TABLE cells_fts USING fts5(
            text, content='cells', content_rowid='rowid', tokenize='porter unicode61 remove_diacritics 2'
        );
        CREATE TRIGGER cells_fts_ai AFTER INSERT ON cells BEGIN
            INSERT INTO cells_fts(rowid, text) VALUES (new.rowid, new.text);
        END;
        CREATE TRIGGER cells_fts_ad AFTER DELETE ON cells BEGIN
            INSERT INTO cells_fts(cells_fts, rowid, text) VALUES ('delete', old.rowid, old.text);
        END;
        CREATE TRIGGER cells_fts_au AFTER UPDATE OF text ON cells BEGIN
            INSERT INTO cells_fts(cells_fts, rowid, text) VALUES ('delete', old.rowid, old.text);
            INSERT INTO cells_fts(rowid, text) VALUES (new.rowid, new.text);
        END;
        CREATE TABLE history (
            seq     INTEGER PRIMARY KEY AUTOINCREMENT,
            cell_id TEXT NOT NULL,
            at      TEXT NOT NULL,
            actor   TEXT NOT NULL,
            action  TEXT NOT NULL,
            changes TEXT NOT NULL
        );
        CREATE INDEX history_cell ON history(cell_id, seq);
        """,
    ),
    (
        2,
        "keyword index over turn windows and CJK bigrams; vector dimension and change sequence",
        # The keyword index now covers a *window* per cell: its text plus the texts of the cells
        # just before and after it in the same owner's session (a question asked in one turn
        # is answered in the next), extended with CJK bigrams (ampkit.textindex). The window
        # text lives in `cell_context` (rowid = cells.rowid), maintained by the write
        # transaction; `cells_fts` is an external-content index over it, kept by triggers.
        # Its `owner` column holds one token per owner (ampkit.textindex.owner_token), so an
        # owner's search is an indexed AND (ranked with that column's weight at 0).
        """
        DROP TRIGGER cells_fts_ai;
        DROP TRIGGER cells_fts_ad;
        DROP TRIGGER cells_fts_au;
        DROP TABLE cells_fts;
        CREATE INDEX cells_session ON cells(owner_id, session_id) WHERE session_id IS NOT NULL;
        CREATE TABLE cell_context (rowid INTEGER PRIMARY KEY, text TEXT NOT NULL, owner TEXT NOT NULL);
        CREATE VIRTUAL TABLE cells_fts USING fts5(
            text, owner, content='cell_context', content_rowid='rowid', tokenize='porter unicode61 remove_diacritics 2'
        );
        CREATE TRIGGER cell_context_ai AFTER INSERT ON cell_context BEGIN
            INSERT INTO cells_fts(rowid, text, owner) VALUES (new.rowid, new.text, new.owner);
        END;
        CREATE TRIGGER cell_context_ad AFTER DELETE ON cell_context BEGIN
            INSERT INTO cells_fts(cells_fts, rowid, text, owner) VALUES ('delete', old.rowid, old.text, old.owner);
        END;
        INSERT INTO cell_context(rowid, owner, text)
            SELECT rid, ampkit_owner_token(owner_id), ampkit_index_text(CASE WHEN session_id IS NULL THEN text ELSE
                coalesce(lag(text, 2) OVER w || char(10), '') || coalesce(lag(text, 1) OVER w || char(10), '') || text
                || coalesce(char(10) || lead(text, 1) OVER w, '') || coalesce(char(10) || lead(text, 2) OVER w, '') END)
            FROM (SELECT rowid AS rid, owner_id, session_id, text FROM cells)
            WINDOW w AS (PARTITION BY owner_id, session_id ORDER BY rid);
        ALTER TABLE cells ADD COLUMN embed_dim INTEGER;
        ALTER TABLE cells ADD COLUMN vec_seq INTEGER;
        UPDATE cells SET embed_dim = length(embedding) / 4, vec_seq = rowid WHERE embedding IS NOT NULL;
        CREATE INDEX cells_vec_seq ON cells(vec_seq) WHERE vec_seq IS NOT NULL;
        """,
    ),
    (
        3,
        "api keys (hashed secrets)",
        """
        CREATE TABLE api_keys (
            key_id      TEXT PRIMARY KEY,
            agent_id    TEXT NOT NULL,
            scopes      TEXT NOT NULL,
            secret_hash TEXT NOT NULL,
            created_at  TEXT NOT NULL,
            expires_at  TEXT,
            revoked_at  TEXT,
            replaced_by TEXT
        );
        CREATE INDEX api_keys_agent ON api_keys(agent_id, created_at);
        """,
    ),
    (
        4,
        "cell keys: one live cell per (owner, key)",
        # Identity.key: a caller-chosen name. Archived, deleted and superseded cells release it.
        """
        ALTER TABLE cells ADD COLUMN cell_key TEXT;
        CREATE UNIQUE INDEX cells_live_key ON cells(owner_id, cell_key)
            WHERE cell_key IS NOT NULL AND status IN ('active', 'stale') AND superseded_by IS NULL;
        """,
    ),
    (
        5,
        "keyword windows only within one access class; access-scoped BM25; readers in the one glob dialect",
        # Windows no longer cross an access or status boundary: neighbours are the nearest
        # cells of the same `window_class` (ampkit.store.base.window_class). Each window keeps
        # its term frequencies and length, so BM25 statistics can be computed over exactly the
        # cells a search may see (`keyword_candidates`). `cell_readers` is recompiled from the
        # stored patterns by ampkit.glob, after stored patterns outside its grammar are
        # rewritten to match literally (`upgrade_stored`). The Python step (`_rebuild_access_and_windows`)
        # fills all three. (The index on window_class also orders by rowid, implicitly.)
        """
        ALTER TABLE cells ADD COLUMN window_class TEXT;
        CREATE INDEX cells_window ON cells(window_class) WHERE window_class IS NOT NULL;
        ALTER TABLE cell_context ADD COLUMN terms TEXT NOT NULL DEFAULT '{}';
        ALTER TABLE cell_context ADD COLUMN len INTEGER NOT NULL DEFAULT 0;
        """,
    ),
    (6, "memory files: paths, proposals, approval modes", FILES_SCHEMA),
    (
        7,
        "keyword index: Korean words by stem (particles and endings stripped)",
        # ampkit.textindex now indexes a Korean word's stem and the stem's bigrams instead of
        # the bigrams of the whole word; the Python step (`_rewrite_hangul_windows`) rewrites
        # the windows that hold Hangul (other windows index exactly as before).
        "",
    ),
    (
        8,
        "embedding queue",
        # Cells written without a vector while the retriever embeds in the background
        # (docs/retrieval.md#embedding-in-the-background), oldest first; a worker embeds them in
        # batches and takes them off (`set_vector`). A cell is queued once, however often its
        # text changes before the worker gets to it.
        """
        CREATE TABLE embed_queue (seq INTEGER PRIMARY KEY AUTOINCREMENT, cell_id TEXT NOT NULL UNIQUE);
        """,
    ),
    (
        9,
        "normalised-text digest for exact dedup",
        # Dedup on write looks an exact duplicate up by this digest (ampkit.textindex.text_key)
        # in one index probe, instead of an FTS phrase query whose cost grows with the store.
        """
        ALTER TABLE cells ADD COLUMN text_key TEXT;
        UPDATE cells SET text_key = ampkit_text_key(text);
        CREATE INDEX cells_text_key ON cells(owner_id, text_key);
        """,
    ),
    (
        10,
        "vector sequence that never goes back",
        # vec_seq orders vector changes so that every process's in-memory index catches up
        # (`_catch_up_vectors`). Taken as MAX(vec_seq) + 1 it went back when a purge deleted
        # the row holding the maximum, and an index that had loaded that row skipped the next
        # one (keeping the purged row's vector under a reused rowid). The high-water mark now
        # lives here.
        """
        CREATE TABLE store_counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
        INSERT INTO store_counters(name, value) SELECT 'vec_seq', COALESCE(MAX(vec_seq), 0) FROM cells;
        """,
    ),
    (
        11,
        "change log: the rows each commit touched, for every process's in-memory caches",
        # Every writer (any process, any connection: these are triggers in the file) appends
        # the rowid of each row it changes, in the same transaction. A process's access
        # snapshot and term rows then catch up with another process's commits by reading the
        # rows logged since the last sequence number they saw (`SQLiteStore._catch_up`)
        # instead of loading everything again. A window deleted without being written again
        # is its cell's deletion (logged on `cells`); every other window delete is followed by
        # its insert. The log keeps its last million entries (pruned every 4096
        # appends); a process further behind loads afresh.
        """
        CREATE TABLE change_log (seq INTEGER PRIMARY KEY, rid INTEGER NOT NULL);
        CREATE TRIGGER change_log_cells_ai AFTER INSERT ON cells BEGIN
            INSERT INTO change_log(rid) VALUES (new.rowid);
        END;
        CREATE TRIGGER change_log_cells_au AFTER UPDATE OF owner_id, created_by, type, status, public, superseded_by,
            expires_at, body ON cells BEGIN
            INSERT INTO change_log(rid) VALUES (new.rowid);
        END;
        CREATE TRIGGER change_log_cells_ad AFTER DELETE ON cells BEGIN
            INSERT INTO change_log(rid) VALUES (old.rowid);
        END;
        CREATE TRIGGER change_log_context_ai AFTER INSERT ON cell_context BEGIN
            INSERT INTO change_log(rid) VALUES (new.rowid);
        END;
        CREATE TRIGGER change_log_prune AFTER INSERT ON change_log WHEN new.seq % 4096 = 0 BEGIN
            DELETE FROM change_log WHERE seq <= new.seq - 1000000;
        END;
        """,
    ),
    (
        12,
        "keyword windows of new cells indexed after the commit that stores them",
        # A create commits its row and its rowid here, instead of rewriting its keyword
        # window and its predecessors' before COMMIT (about a third of a single create's
        # CPU); `SQLiteStore.index_pending_windows` rewrites them later in one pass per
        # window class: in the background, before any answer that depends on the windows
        # (`_windows_current`), and at open after a crash. Rows here are committed with
        # their cells, so no acknowledged write is lost to the keyword index either.
        """
        CREATE TABLE pending_windows (rowid INTEGER PRIMARY KEY);
        """,
    ),
    (
        13,
        "each cell's readable_by in a column of its own, for the access snapshot",
        # `readers`: the body's `access_policy.readable_by` as JSON text, as
        # json_extract(body, '$.access_policy.readable_by') gives it (NULL: the body has
        # none), so loading the access snapshot reads a short column instead of parsing every
        # body (most of its load: seconds at a million cells, which the first reader-wide
        # search after a restart waited for). Every write of the body writes it (`cell_to_row`);
        # the triggers hold the column to the body for any writer that does not (a process of
        # an older version sharing the file): an insert without it, or an update of the body
        # that leaves it as it was while the body says otherwise, takes it from the body.
        """
        ALTER TABLE cells ADD COLUMN readers TEXT;
        UPDATE cells SET readers = json_extract(body, '$.access_policy.readable_by');
        CREATE TRIGGER cells_readers_ai AFTER INSERT ON cells WHEN new.readers IS NULL BEGIN
            UPDATE cells SET readers = json_extract(new.body, '$.access_policy.readable_by') WHERE rowid = new.rowid;
        END;
        CREATE TRIGGER cells_readers_au AFTER UPDATE OF body ON cells WHEN new.readers IS old.readers
            AND new.readers IS NOT json_extract(new.body, '$.access_policy.readable_by') BEGIN
            UPDATE cells SET readers = json_extract(new.body, '$.access_policy.readable_by') WHERE rowid = new.rowid;
        END;
        """,
    ),
]
# Past this many rows logged by other processes since this one last looked, its caches load
# afresh instead of patching (one scan then costs less than reading that many rows' state).
CHANGE_LOG_PATCH_MAX = 200_000
# The log's first and last sequence numbers: two subqueries, each one step of the primary key
# (SQLite's min/max shortcut takes a query with a single min() or max(); both in one query
# scan the whole log, at every commit).
_LOG_BOUNDS = "SELECT (SELECT MIN(seq) FROM change_log), (SELECT MAX(seq) FROM change_log)"
_LOG_SINCE = "SELECT rid FROM change_log WHERE seq > ?"
# A saved access snapshot (`_save_snapshot`, at close) names the change-log entry it is current
# with by its sequence number and a digest of the entries up to it (this many): a file put back
# from a backup, or another history's log, gives another digest (or lacks the entry).
_LOG_MARK_ENTRIES = 64
_LOG_MARK = "SELECT seq, rid FROM change_log WHERE seq > ? AND seq <= ? ORDER BY seq"
# At most this many logged rows since the save are read to bring a saved snapshot forward (under
# the write lock); past it the snapshot loads from the table.
SNAPSHOT_RESUME_MAX = 20_000
# Pending windows (migration 12): indexed at most this many new rows per transaction (the
# write lock is held that long), PENDING_WINDOWS_DELAY_S after the first of them commits
# (the creates arriving meanwhile are indexed in the same pass, their windows shared).
PENDING_WINDOWS_CHUNK = 2000
PENDING_WINDOWS_DELAY_S = 0.05
# Only a transaction creating at most this many cells leaves its windows pending (single
# creates and their commit groups, whose windows a later pass shares); a batch's windows are
# already rewritten in one pass, and deferring them cost more than it saved (bench/writes.py:
# batches of 500, 0.29 instead of 0.27 ms of server CPU per cell).
PENDING_WINDOWS_MAX_NEW = 64
# A commit writing more vectors or windows than this (a batch, re-embedded cells) has the
# windows thread catch the caches up soon after (`_windows_loop`); fewer are left to the next
# search (well under 1 ms).
BACKGROUND_CATCH_UP_ROWS = 64
# How often the windows thread, idle, looks whether another connection to the file (another
# process: `--workers`, a replica, an in-process client) committed, and takes its commits
# into this store's caches then rather than in the next search (`_take_in_foreign`): one
# `PRAGMA data_version` a look while nothing changes.
FOREIGN_LOOK_SECONDS = 1.0

# Every occurrence of one term in the window text (column 0 of cells_fts), read from the FTS
# index itself, as one comma-separated string of rowids in rowid order (fts5vocab `instance`
# has a row per occurrence): one string instead of a Python row per match is most of the speed.
# Shared by every thread: the admitted rows of recent wide filters (16 bytes a row), and every
# row's postings of recent terms (5 bytes a row for most words; at most 256 MB: the most
# common words of a million short windows, half a million rows each, are the ones a wide
# search needs again).
ADMITTED_CACHE_ROWS = 4_000_000
POSTINGS_CACHE_BYTES = 256 * 2**20
_TERM_ROWS = "SELECT group_concat(doc) FROM temp.ampkit_vocab WHERE term = ? AND col = 'text'"
# The same for a term the `owner` column cannot hold (it holds only owner tokens, "o" and 16
# hex digits: `owner_token`): without the column test, which fts5vocab evaluates per
# occurrence (half the time of a common word's read).
_TERM_ROWS_ANY_COLUMN = "SELECT group_concat(doc) FROM temp.ampkit_vocab WHERE term = ?"
_OWNER_TOKEN = re.compile(r"o[0-9a-f]{16}")
_UNIT_ROWS = "SELECT group_concat(rowid) FROM cells_fts WHERE cells_fts MATCH ?"

# FTS5 is also the tokenizer: a contentless temporary index per connection turns texts into
# the exact terms (porter stems) and counts the keyword index uses.
_TOKENIZER = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.ampkit_tokens USING fts5("
    "text, content='', tokenize='porter unicode61 remove_diacritics 2')",
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.ampkit_token_instances USING fts5vocab(temp, ampkit_tokens, instance)",
    # One text (a single-cell create's new turn): its terms with their counts directly, one
    # row per term, instead of one per occurrence grouped (~25% of a tokenize call).
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.ampkit_token_rows USING fts5vocab(temp, ampkit_tokens, row)",
)
_VOCAB = "CREATE VIRTUAL TABLE IF NOT EXISTS temp.ampkit_vocab USING fts5vocab(main, cells_fts, instance)"
_VOCAB_COLUMNS = "CREATE VIRTUAL TABLE IF NOT EXISTS temp.ampkit_vocab_columns USING fts5vocab(main, cells_fts, col)"
# Past this many cells, open() reads the most common words' term rows in the background, up
# to this share of the postings cache (the rest is left for the words searches ask for); so
# does a reader-wide search of a store that grew past it while open, whose term cache started
# afresh since, or that has grown this many times over since they were read.
WARM_TERMS_MIN_CELLS = 100_000
# The vector warm-up of an open() waits at most this long for the term warm-up to load the
# access snapshot (`_snapshot_first`): ~1 s at a million cells on two idle cores.
SNAPSHOT_FIRST_WAIT_S = 30.0
WARM_TERMS_SHARE = 0.75
WARM_TERMS_REGROWTH = 2.0

# Vectors an import left out of the approximate graph go in this many at a time, in the
# background (`_drain_graph`): ~10 ms of hnswlib's insertion on one core here, the longest a
# search then waits for the graph; then the drain pauses so that waiting searches go first.
# (128: the analyst's searches at 1M during the drain p50 44-52 / p95 69-99 ms; 64: 32 / 51,
# the drain 25-26 -> 30 s.)
GRAPH_DRAIN_ROWS = 64
GRAPH_DRAIN_PAUSE_S = 0.005

# Checkpoints (the WAL copied back into the database file, with its fsyncs): a background
# thread copies what commits wrote, at most once per CHECKPOINT_INTERVAL_S while they arrive
# (PASSIVE: it never blocks the writer or a reader, and leaves `PRAGMA data_version` as it
# is, so no cache is reloaded). While writes keep coming it rarely catches the last frames,
# so the writer's own autocheckpoint still ends a cycle, now every AUTOCHECKPOINT_PAGES
# (16 MB) instead of 1000 pages, and copies only what the thread has not: a commit is durable
# once it is in the WAL, so none of this changes a guarantee, and writes wait for the disk
# less often and for less (a batch load's main thread in process: blocked 0.09-0.12 -> 0.06 ms a cell).
CHECKPOINT_INTERVAL_S = 1.0
CHECKPOINT_RETRY_MIN_S = 0.01  # between tries while a reader holds frames back (a 0 interval would spin)
AUTOCHECKPOINT_PAGES = 4_000
# While commits arrive, the checkpoint thread also saves the access snapshot (as close() does)
# at most once per this many seconds, so a restart after a crash finds one at most this old
# (and usable while at most SNAPSHOT_RESUME_MAX rows were logged since).
SNAPSHOT_SAVE_INTERVAL_S = 300.0


@dataclass(frozen=True)
class _Changes:
    """Rows logged since the caches last took the change log in: each one's state now and its
    window's term counts (`SQLiteStore._collect_changes`), up to log entry `seq`; `reload`:
    the log cannot say (pruned, or too long), the caches load afresh."""

    seq: int
    states: dict[int, Optional[RowState]]
    terms: dict[int, Optional[dict[str, int]]]
    reload: bool = False


class _TermCache:
    """text -> term frequencies, for the texts tokenized most recently (least recently used
    out first). A single-cell create rewrites the windows of the cell and of the turns just
    before it, whose texts were tokenized by the creates before; the result depends on the
    text alone (one tokenizer for every connection), so it is shared, under a lock."""

    def __init__(self, max_entries: int = 4096, max_text_chars: int = 4096):
        self.max_entries, self.max_text_chars = max_entries, max_text_chars
        self._tf: OrderedDict[str, dict[str, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> Optional[dict[str, int]]:
        with self._lock:
            tf = self._tf.get(text)
            if tf is not None:
                self._tf.move_to_end(text)
            return tf

    def put(self, text: str, tf: dict[str, int]) -> None:
        if len(text) > self.max_text_chars:
            return
        with self._lock:
            self._tf[text] = tf
            if len(self._tf) > self.max_entries:
                self._tf.popitem(last=False)


_TERMS = _TermCache()


def tokenize(conn: sqlite3.Connection, texts: Sequence[str]) -> list[dict[str, int]]:
    """Each text's term frequencies, as the keyword index counts them. The returned dicts
    may be shared (`_TermCache`): read them, never change them."""
    out: list[Optional[dict[str, int]]] = [_TERMS.get(t) for t in texts]
    missing = [i for i, tf in enumerate(out) if tf is None]
    if missing:
        fresh: list[dict[str, int]] = [{} for _ in missing]
        conn.executemany("INSERT INTO temp.ampkit_tokens(rowid, text) VALUES (?, ?)",
                         [(j, texts[i]) for j, i in enumerate(missing)])
        if len(missing) == 1:  # the index holds one document: a term's count over all is its count
            fresh[0].update(conn.execute("SELECT term, cnt FROM temp.ampkit_token_rows"))
        else:
            for doc, term, count in conn.execute(
                "SELECT doc, term, COUNT(*) FROM temp.ampkit_token_instances GROUP BY doc, term ORDER BY doc, term"
            ):
                fresh[doc][term] = count
        conn.execute("INSERT INTO temp.ampkit_tokens(ampkit_tokens) VALUES ('delete-all')")
        for j, i in enumerate(missing):
            out[i] = fresh[j]
            _TERMS.put(texts[i], fresh[j])
    return [tf if tf is not None else {} for tf in out]


def term_rows_sql(term: str) -> str:
    """The query for a term's occurrences in the window text (`_TERM_ROWS`)."""
    return _TERM_ROWS if _OWNER_TOKEN.fullmatch(term) else _TERM_ROWS_ANY_COLUMN


def _term_matrix(rows: Sequence[tuple], n_terms: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Rows `(id, window length, tf of each term...)` (no NULLs) as ids, lengths, tf matrix."""
    ids = [row[0] for row in rows]
    numbers = np.array([row[1:] for row in rows], dtype=np.int64).reshape(len(rows), n_terms + 1)
    return ids, numbers[:, 0], numbers[:, 1:]


def _rank_rows(ids: Sequence[str], lengths: np.ndarray, tfs: np.ndarray, n: int, total_len: int, k: int) -> list[Candidate]:
    """BM25 top-k of the matched rows: their ids, window lengths and query terms' frequencies
    (one column per term, in term order)."""
    if not len(ids):
        return []
    matched = np.arange(len(ids), dtype=np.int64)
    hits = []
    for i in range(tfs.shape[1]):
        pos = np.flatnonzero(tfs[:, i])
        hits.append((pos, tfs[pos, i]))
    scores = bm25_scores(n, total_len, lengths, matched, hits)
    best = sorted((-float(scores[i]), ids[i]) for i in top_k(scores, k))
    return [Candidate(cid, -neg) for neg, cid in best[:k]]


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


def filter_sql(flt: CellFilter, alias: str = "c") -> tuple[str, list[Any]]:
    """WHERE clause (without the keyword) for a CellFilter (the one compiler, SQLite's spelling)."""
    return compile_filter(flt, SQLITE, alias)


class _SQLiteWriteTx(SQLFileTx, SQLWriteTx):
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

    def _window(self, rowid: int) -> tuple[list[tuple[int, str]], Optional[tuple[str, str]], list[tuple[int, str]]]:
        """(cells before, (owner, own text), cells after): the nearest CONTEXT_RADIUS cells of
        the same window class each side, in insertion order (cells of other classes are
        skipped, so they change nothing). A cell without a class has no neighbours."""
        row = self.conn.execute("SELECT owner_id, window_class, text FROM cells WHERE rowid = ?", (rowid,)).fetchone()
        if row is None:
            return [], None, []
        if row[1] is None:
            return [], (row[0], row[2]), []
        sql = "SELECT rowid, text FROM cells WHERE window_class = ? AND rowid {} ? ORDER BY rowid {} LIMIT ?"
        before = self.conn.execute(sql.format("<", "DESC"), (row[1], rowid, CONTEXT_RADIUS)).fetchall()
        after = self.conn.execute(sql.format(">", "ASC"), (row[1], rowid, CONTEXT_RADIUS)).fetchall()
        return before[::-1], (row[0], row[2]), after

    def _touch(self, rowid: int) -> None:
        """Mark this row's keyword window, and its neighbours' windows, for rewriting."""
        before, _, after = self._window(rowid)
        self._dirty_windows.update([rowid, *(r for r, _ in before), *(r for r, _ in after)])

    def _windows(self, rowids: Sequence[int]) -> dict[int, tuple[str, list[tuple[int, str]]]]:
        """rowid -> (owner, window parts) for each existing row among `rowids`: its (rowid, text)
        with those of its neighbours (as `_window`), in order; the window text is the texts
        joined by newlines. The rows of one window class are read together, so a batch of
        turns of one session costs three queries, not three per turn."""
        info: dict[int, tuple[str, Optional[str], str]] = {}
        ids = sorted(set(rowids))
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            for rowid, owner, klass, text in self.conn.execute(
                f"SELECT rowid, owner_id, window_class, text FROM cells WHERE rowid IN ({','.join('?' * len(chunk))})", chunk,
            ):
                info[rowid] = (owner, klass, text)
        out: dict[int, tuple[str, list[tuple[int, str]]]] = {}
        by_class: dict[str, list[int]] = {}
        for rowid, (owner, klass, text) in info.items():
            if klass is None:
                out[rowid] = (owner, [(rowid, text)])
            else:
                by_class.setdefault(klass, []).append(rowid)
        side = "SELECT rowid, text FROM cells WHERE window_class = ? AND rowid {} ? ORDER BY rowid {} LIMIT ?"
        for klass, members in by_class.items():
            members.sort()
            # One span over the class's marked rows when they lie close together (a batch of
            # turns); rows far apart in a long session are read one by one.
            close = members[-1] - members[0] <= 64 * len(members)
            spans = [members] if close else [[r] for r in members]
            for span in spans:
                lo, hi = span[0], span[-1]
                before = self.conn.execute(side.format("<", "DESC"), (klass, lo, CONTEXT_RADIUS)).fetchall()[::-1]
                middle = self.conn.execute(
                    "SELECT rowid, text FROM cells WHERE window_class = ? AND rowid BETWEEN ? AND ? ORDER BY rowid",
                    (klass, lo, hi),
                ).fetchall() if hi > lo else [(lo, info[lo][2])]
                after = self.conn.execute(side.format(">", "ASC"), (klass, hi, CONTEXT_RADIUS)).fetchall()
                ordered = before + middle + after
                at = {r: k for k, (r, _) in enumerate(ordered)}
                for r in span:
                    k = at[r]
                    window = ordered[max(0, k - CONTEXT_RADIUS) : k + CONTEXT_RADIUS + 1]
                    out[r] = (info[r][0], window)
        return out

    def _touch_new(self, ids: Sequence[int]) -> None:
        """Mark the windows new rows change: their own and, per window class, those of the
        CONTEXT_RADIUS cells just before the first new row (a new row had the highest rowid
        when it was stored, so every cell after it is new too: stored in this transaction,
        or pending with it, or moved into its class by an update that rewrote its window
        and its neighbours' then)."""
        first: dict[str, int] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            for rowid, klass in self.conn.execute(
                f"SELECT rowid, window_class FROM cells WHERE rowid IN ({','.join('?' * len(chunk))})", chunk,
            ):
                if klass is not None and (klass not in first or rowid < first[klass]):
                    first[klass] = rowid
        sql = "SELECT rowid FROM cells WHERE window_class = ? AND rowid < ? ORDER BY rowid DESC LIMIT ?"
        for klass, rowid in first.items():
            self._dirty_windows.update(r for (r,) in self.conn.execute(sql, (klass, rowid, CONTEXT_RADIUS)))
        self._dirty_windows.update(ids)

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
        its embedding nor pays a one-text call (~0.2 ms against ~0.02 a text in a batch). A
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
        scheduler: Optional[Scheduler] = None,
    ):
        # Runs this store's background loops and tasks (the composition root's, or its own).
        self.scheduler = scheduler or Scheduler()
        self.snapshot_save_interval_s = snapshot_save_interval_s  # None: saved at close only
        self._snapshot_saved_state: Optional[tuple[int, int, int]] = None  # (foreign, generation, log seq) last saved
        self._snapshot_saved_time = 0.0  # time.monotonic() of the last periodic save
        # False: every write rewrites its keyword windows before COMMIT, as before migration 12
        # (the same windows, bit for bit: tests compare the two).
        self.defer_windows = defer_windows
        # Past this many cells, open() reads the term rows of the words in the most windows
        # in the background (`_warm_terms`); None: never.
        self.warm_terms_min_cells = warm_terms_min_cells
        self._warm_lock = threading.Lock()  # held by `_warm_terms` per word, and by close()
        self._snapshot_warm_lock = threading.Lock()  # held by `_warm_snapshot`, and by close()
        self._terms_warm = threading.Event()  # set: no term warm-up running
        # What the last finished term warm-up left warm: ((the term cache's generation, its
        # epoch), the store's rows then); None: nothing since open().
        self._terms_warmed: Optional[tuple[tuple[int, int], int]] = None
        self._terms_warm_start = threading.Lock()
        # Clear from open() until its term warm-up has loaded the access snapshot (or found
        # the store too small for one): the vector warm-up waits for it (SNAPSHOT_FIRST_WAIT_S at most).
        self._snapshot_first = threading.Event()
        self._snapshot_first.set()
        self._opened = 0  # open() calls so far (`_warm_vectors`, `_warm_terms` belong to one)
        self.checkpoint_interval_s = checkpoint_interval_s
        self._checkpointer: Optional[Loop] = None  # woken by each commit
        self.checkpoints = 0  # done by the background loop
        self.warm_exact_max = warm_exact_max  # admitted rows the dense leg ranks from the table while the index loads
        self._vectors_ready = threading.Event()
        self.path = path
        self.keyword_scan_max = keyword_scan_max  # admitted cells up to which the keyword leg scans
        self.synchronous = synchronous
        self.busy_timeout_ms = busy_timeout_ms
        # Vectors past which wide searches use the approximate graph; None: never
        # (`approximate_search` off: docs/security.md, "Approximate search").
        self.ann_threshold = ann_threshold
        self._vectors: dict[str, VectorIndex] = {}  # embedding model -> in-memory index
        self._vectors_seq = 0  # highest cells.vec_seq loaded into self._vectors
        self._vectors_lock = threading.Lock()
        self._write_lock = threading.RLock()
        self._writer: Optional[sqlite3.Connection] = None
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._lifecycle_lock = threading.Lock()
        self.wall_clock: Callable[[], float] = time.time  # the scheduled jobs' claims (tests move it)
        self._embedding_lease: Optional[int] = None  # descriptor holding the flock (`holds_embedding_lease`)
        self._embedding_lease_lock = threading.Lock()
        self._tempdir: Optional[tempfile.TemporaryDirectory] = None
        # The keyword and vector legs' caches, shared by every thread (one reader connection
        # each), valid for one database version (`_data_version`).
        self._version_conn: Optional[sqlite3.Connection] = None
        self._version_lock = threading.Lock()
        self._stats_cache: Optional[tuple[int, dict[tuple[str, tuple[Any, ...], bool], builtins.list[Any]], builtins.list[builtins.list[float]]]] = None
        self._postings: Optional[tuple[int, PostingsCache]] = None  # (foreign generation, cache)
        self._set_arrays = SetArrays()  # every admitted set's per-term arrays, one budget per kind
        # Reader-wide filters: the access snapshot (`_access_snapshot`), kept in step with
        # every process's commits through the change log (`_collect_changes`).
        self._snapshot: Optional[AccessSnapshot] = None
        self._snapshot_build_lock = threading.Lock()
        self._snapshot_backlog: Optional[builtins.list[dict[int, Optional[RowState]]]] = None
        self._snapshot_saved = False  # a saved snapshot is yet to be tried (set by open())
        self.snapshot_source: Optional[str] = None  # how the current one came: "saved" or "table" (/health)
        self._foreign_lock = threading.Lock()
        self._foreign = 0
        self._seen_version: Optional[int] = None
        self._writer_version: Optional[int] = None
        self._tracking = False  # the change log exists (open)
        # New rows' keyword windows are indexed after their commit (migration 12), by a
        # background thread woken by such commits and by `_windows_current` before a read.
        self._deferring = False  # the pending_windows table exists (open)
        self._large_commits = 0  # commits that changed many rows: the windows loop catches up
        self._windows: Optional[Loop] = None
        self._log_seq = 0  # the last change_log entry the in-memory caches have taken in

    # ------------------------------------------------------------ connections
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=self.busy_timeout_ms / 1000)
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        # The connection's TEMP tables (the tokenizer's index, the writer's touched rows) are
        # filled and emptied by every write: in memory, not in a temporary file with a journal
        # (about 5% of a batch write's CPU). Set before any TEMP table exists (setting it drops them).
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.create_function("ampkit_index_text", 1, index_text, deterministic=True)  # migration 2
        conn.create_function("ampkit_owner_token", 1, owner_token, deterministic=True)
        conn.create_function("ampkit_text_key", 1, text_key, deterministic=True)  # migration 9
        for statement in _TOKENIZER:
            conn.execute(statement)
        return conn

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
        # (A store a test holds at an old schema has no change log: nothing to track.)
        self._tracking = self._writer.execute("SELECT 1 FROM sqlite_master WHERE name = 'change_log'").fetchone() is not None
        if self._tracking:
            self._log_seq = self._writer.execute("SELECT COALESCE(MAX(seq), 0) FROM change_log").fetchone()[0]
        self._deferring = self._writer.execute("SELECT 1 FROM sqlite_master WHERE name = 'pending_windows'").fetchone() is not None
        self._snapshot_saved = self._tracking and self._saved_snapshot_holds()
        if self._deferring and self._windows is None:  # (also what another process left pending)
            self._windows = self.scheduler.loop("sqlite.windows", self._windows_loop)
            self._windows.wake()  # what a crash left pending (a pass that finds none costs one query)
        self._writer.execute(f"PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT_PAGES}")
        if self._checkpointer is None:  # (an open store opened again keeps its loop)
            self._checkpointer = self.scheduler.loop("sqlite.checkpoint", self._checkpoint_loop)
        # The vector index loads in the background: a restarted server answers at once (the
        # dense leg meanwhile ranks small filtered sets from the table, see vector_candidates).
        # It starts once the term warm-up has loaded the access snapshot (`_snapshot_first`),
        # which the first reader-wide search waits for: on two cores the vector load had
        # shared them with it.
        self._vectors_ready.clear()
        self._terms_warmed = None
        self._terms_warm.set()
        warm_terms = self.warm_terms_min_cells is not None and self._tracking
        if warm_terms:
            self._snapshot_first.clear()
        self._start_index_thread("vectors.warmup", self._warm_vectors, self._opened)
        if warm_terms:
            self._start_term_warmup()

    def _start_term_warmup(self) -> None:
        """The background term warm-up (`_warm_terms`), unless one is running."""
        with self._terms_warm_start:
            if not self._terms_warm.is_set():
                return
            self._terms_warm.clear()
        self.scheduler.run("keyword.warmup", self._warm_terms, self._opened)

    def _term_warmup_due(self) -> bool:
        """Whether the common words' term rows should be read ahead now, for a store past
        `warm_terms_min_cells`: none were read since open() (it grew past the threshold
        while open: open() had nothing to read), the term cache started afresh since they
        were (the change log overflowed it, or could not say what another process changed),
        or the store has grown WARM_TERMS_REGROWTH times over since (words common now were
        rare then). A reader-wide search asks (`_keyword_wide`), never a write: a store
        loading by writes alone keeps no cache to patch (while the access snapshot and term
        rows exist, every commit reads its changed rows' states and term counts into them)."""
        if self.warm_terms_min_cells is None or not self._tracking or self._writer is None:
            return False
        rows = self._query("SELECT COALESCE(MAX(rowid), 0) FROM cells")[0][0]
        if rows < self.warm_terms_min_cells:
            return False
        warmed, postings = self._terms_warmed, self._postings
        return (warmed is None or postings is None or warmed[0] != (postings[0], postings[1].epoch)
                or rows >= WARM_TERMS_REGROWTH * max(warmed[1], 1))

    def _checkpoint_loop(self, loop: Loop) -> None:
        """The background checkpoints (see CHECKPOINT_INTERVAL_S), on a connection of their own."""
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
                    interval = self.snapshot_save_interval_s
                    if interval is not None and time.monotonic() - self._snapshot_saved_time >= interval:
                        self._snapshot_saved_time = time.monotonic()
                        self._save_snapshot(conn)
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
        file (the thread tries again while readers hold frames back); False on timeout."""
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
        into the term cache's log, now rather than in the next search (an import's 100,000 had
        the first wide search after it take both: 1.7 of its 1.8 s at a million cells)."""
        if self._vectors_ready.is_set():
            try:
                self._catch_up_vectors()
            except (Unavailable, sqlite3.Error):  # (closed meanwhile: the next search catches up)
                pass
        postings = self._postings
        if postings is not None:
            postings[1].convert_closed()

    def _take_in_foreign(self) -> None:
        """What other connections committed since the caches last looked (an import through
        another process), taken in now: their logged rows into the access snapshot and the
        term cache's log (`_foreign_generation`), their vectors into the index, the log's
        new entries converted, so the next wide search finds at most a second's worth (a
        10,000-cell import through another process at 100k made it take 0.38 s)."""
        loop = self._windows
        if loop is None or loop.stopping or self._data_version() == self._seen_version:
            return  # nothing committed anywhere since the last look
        try:
            self._foreign_generation()
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

    def _start_index_thread(self, name: str, target: Any, *args: Any) -> None:
        self.scheduler.run(name, target, *args)

    def _current(self, opened: int) -> bool:
        """Whether the store is open, and by the open() that started a warm-up (`opened`)."""
        return self._writer is not None and self._opened == opened

    def _warm_terms(self, opened: int) -> None:
        """Background, from open() of a store past `warm_terms_min_cells`, or from a
        reader-wide search when it is due again (`_term_warmup_due`): the access snapshot
        first, then the term rows of the words in the most keyword windows (stop words aside:
        a query drops them) into the postings cache, up to WARM_TERMS_SHARE of it, most
        common first. A reader-wide search otherwise loads the snapshot (seconds at a million
        cells) and reads each word at its first use (a tenth of a second for a word in half of
        a million windows). The snapshot comes first because the first reader-wide search
        waits for it, and only for it: the words' reads had shared the cores with its load
        (a search reads a word it needs itself). Each step holds a lock close() takes before
        closing connections; one that needs the snapshot while it loads waits for that load.
        `/health` says `keyword_warmup: warming` until both end."""
        try:
            try:
                with self._warm_lock:
                    if not self._current(opened):
                        return
                    rows = self._query("SELECT COALESCE(MAX(rowid), 0) FROM cells")[0][0]
                    if rows < (self.warm_terms_min_cells or 0):
                        return
                self._warm_snapshot(opened)
            finally:
                self._snapshot_first.set()
            with self._warm_lock:
                if not self._current(opened):
                    return
                conn = self._reader()
                conn.execute(_VOCAB)
                conn.execute(_VOCAB_COLUMNS)
                terms = [t for (t,) in conn.execute(
                    "SELECT term FROM temp.ampkit_vocab_columns WHERE col = 'text' ORDER BY doc DESC LIMIT 5000")
                    if t not in STOP_WORDS]
                postings = self._postings_cache()
                # The cache these rows go to, as it is now: one started afresh meanwhile
                # (they are gone with it) makes the next wide search ask again.
                cache = (self._postings[0] if self._postings else -1, postings.epoch)
            for term in terms:
                with self._warm_lock:
                    if not self._current(opened):
                        return
                    postings = self._postings_cache()
                    if postings.size > POSTINGS_CACHE_BYTES * WARM_TERMS_SHARE:
                        break
                    postings.get("t:" + term, lambda: doc_counts(int_list(
                        conn.execute(term_rows_sql(term), (term,)).fetchone()[0])))
            self._terms_warmed = (cache, rows)
        except Exception:  # noqa: BLE001  (closed meanwhile: searches read words themselves)
            return
        finally:
            if self._opened == opened:
                self._terms_warm.set()

    def _warm_snapshot(self, opened: int) -> None:
        with self._snapshot_warm_lock:
            if not self._current(opened):
                return
            try:
                self._access_snapshot()
            except Exception:  # noqa: BLE001  (closed meanwhile: the first wide search loads it)
                return

    def wait_for_access_snapshot(self, timeout: Optional[float] = None) -> bool:
        """Until the warm-up open() started has loaded the access snapshot (at once when it
        has none to load: a small store); False on timeout. The embedding worker's start-up
        scan waits for it, as the vector warm-up does (`_snapshot_first`)."""
        return self._snapshot_first.wait(timeout)

    def wait_for_term_warmup(self, timeout: Optional[float] = None) -> bool:
        """Until the background term warm-up started by open() is done; False on timeout."""
        return self._terms_warm.wait(timeout)

    def wait_for_vector_index(self, timeout: Optional[float] = None) -> None:
        """Until the background loading and graph building started so far are done, and what
        they started meanwhile (a graph built or loaded starts draining its backlog)."""
        self.scheduler.join("vectors.", timeout)

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
        for statement in _split_sql(script):
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
        for model, index in list(self._vectors.items()):
            if index.ann_state == "ready" and index.ann_dirty and self._writer is not None:
                try:  # a restart then loads the graph instead of rebuilding it
                    self._save_ann(model, index)
                except OSError:
                    pass
        if self._writer is not None:
            try:  # a restart then reads it instead of scanning the table (seconds at a million cells)
                self._save_snapshot()
            except (OSError, sqlite3.Error, Unavailable) as exc:
                log.warning("access snapshot not saved (the next start loads it from the table): %s", exc)
        with self._warm_lock, self._snapshot_warm_lock, self._vectors_lock:  # the background warm-ups read under them
            with self._readers_lock:
                for conn in self._readers:
                    conn.close()
                self._readers.clear()
            self._local = threading.local()
            with self._version_lock:
                if self._version_conn is not None:
                    self._version_conn.close()
                    self._version_conn = None
            self._stats_cache = self._postings = None
            self._set_arrays.clear()
            self._snapshot = self.snapshot_source = None
            self._seen_version = self._writer_version = None
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
                changes = self._collect_changes(conn)
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
            self._apply_changes(changes)
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

    def _collect_changes(self, conn: sqlite3.Connection, limit: Optional[int] = None) -> Optional[_Changes]:
        """Inside a transaction (a write's, before COMMIT, or a read's): the rows logged since
        the caches last took the log in (this transaction's and any other process's), each
        with its state now (access columns, None when gone) and its keyword window's term
        counts (None when it has none), for the in-memory caches. Its `reload` is set when
        the log no longer reaches back that far (pruned) or holds more than `limit` rows:
        the caches load afresh. None when nothing was logged since."""
        if not self._tracking:
            return None
        since = self._log_seq
        first, top = conn.execute(_LOG_BOUNDS).fetchone()
        if top is None or top == since:
            return None
        if top < since:  # the log started afresh (emptied by hand): it cannot say
            return _Changes(top, {}, {}, reload=True)
        if self._snapshot is None and self._snapshot_backlog is None and self._postings is None:
            return _Changes(top, {}, {})  # no cache to patch
        if first > since + 1:  # pruned past what the caches have seen
            return _Changes(top, {}, {}, reload=True)
        if limit is not None and top - since > limit:
            return _Changes(top, {}, {}, reload=True)
        touched = sorted({r for (r,) in conn.execute(_LOG_SINCE, (since,))})
        return _Changes(top, *self._row_states(conn, touched))

    @staticmethod
    def _row_states(conn: sqlite3.Connection, rowids: builtins.list[int], with_terms: bool = True) -> tuple[
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

    def _apply_changes(self, changes: Optional[_Changes]) -> None:
        """After COMMIT, under the write lock (so in commit order): the logged rows' new state
        into the snapshot (or the backlog of one being built) and the postings log, or, when
        the log could not say, every cache loads afresh (the foreign generation moves)."""
        if changes is None:
            return
        self._log_seq = changes.seq
        if changes.reload:
            self._foreign += 1
            return
        if not changes.states:
            return
        if self._snapshot_backlog is not None:
            self._snapshot_backlog.append(changes.states)
        snapshot = self._snapshot
        if snapshot is not None:
            snapshot.apply(changes.states)
        postings = self._postings
        if postings is not None:
            postings[1].record(changes.terms)

    def _catch_up(self) -> None:
        """Under the write lock, after another connection committed: its logged rows into
        the caches, read in one read transaction of the writer connection (no write of ours
        is under way)."""
        if not self._tracking:  # an old schema without the log: load afresh
            self._foreign += 1
            return
        conn = self._require_writer()
        conn.execute("BEGIN")
        try:
            changes = self._collect_changes(conn, CHANGE_LOG_PATCH_MAX)
        finally:
            conn.execute("COMMIT")
        self._apply_changes(changes)

    # ------------------------------------------------------------ reads
    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        try:
            return self._reader().execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            raise Unavailable(f"store cannot read: {exc}") from exc

    def keyword_candidates(self, query: str, flt: CellFilter, k: int) -> builtins.list[Candidate]:
        """Okapi BM25 (FTS5's formula and constants) with its statistics (number of documents,
        mean length, document frequencies) taken over the cells `flt` admits, not the whole
        index: a caller's scores then depend only on cells it may read (non-interference).

        Three ways to the same matches and scores (tested against the straightforward loop):
        a filter admitting few cells (an owner's search) scans their windows' stored term
        counts, at a cost that depends only on the admitted cells; a wide filter (a reader
        across owners) intersects each query term's rows from the FTS index with the admitted
        rows, both kept in numpy arrays until the database changes (`_bm25`); a small filter
        with a word the tokenizer splits (a phrase) runs the FTS OR query."""
        return self.keyword_candidates_many([query], flt, k)[0]

    def _wide(self, flt: CellFilter, admitted: int) -> bool:
        """Whether both legs take a filter's rows from its admitted set (the access snapshot's
        arrays) rather than from SQL: a reader-wide filter, however few cells it admits (in
        SQL its access condition is evaluated on every cell of the store: ~150 ms a search at
        20,000 cells for a team admitting 1,000), or any filter admitting more than
        `keyword_scan_max` cells. An owner's or a session's filter SQL answers by its index."""
        return admitted > self.keyword_scan_max or AccessSnapshot.supports(flt)

    def keyword_candidates_many(self, queries: Sequence[str], flt: CellFilter, k: int) -> builtins.list[builtins.list[Candidate]]:
        """`keyword_candidates` of each query over one filter. An owner-sized filter reads its
        windows' term counts once for all the queries (the scan, not the scoring, is what a
        keyword query costs there); each query's matches and scores are its own, bit for bit."""
        conn = self._reader()
        parsed = []
        for query in queries:
            words = query_terms(query)
            per_word = tokenize(conn, words) if words else []
            terms = sorted({t for tf in per_word for t in tf if '"' not in t and "\\" not in t})
            parsed.append((query, words, per_word, terms))
        out: builtins.list[builtins.list[Candidate]] = [[] for _ in queries]
        todo = [i for i, (_, words, _, terms) in enumerate(parsed) if words and terms]
        if not todo:
            return out
        entry = self._admitted_entry(flt)
        n, total_len = entry[1], entry[2]
        if not n:
            return out
        if self._wide(flt, n):
            for i in todo:
                _, words, per_word, terms = parsed[i]
                out[i] = self._keyword_wide(flt, entry, words, per_word, terms, k)
            return out
        # The scan matches exactly what the FTS query matches when every query word is one
        # index term (a word the tokenizer splits would be a phrase in FTS).
        scanned = [i for i in todo if all(len(tf) == 1 for tf in parsed[i][2])]
        for i in todo:
            if i not in scanned:
                out[i] = self._keyword_fts(parsed[i][0], flt, parsed[i][3], n, total_len, k)
        if scanned:
            union = sorted({t for i in scanned for t in parsed[i][3]})
            where, params = filter_sql(flt)
            tf_columns = ", ".join("coalesce(json_extract(x.terms, ?), 0)" for _ in union)
            paths = ['$."' + t + '"' for t in union]
            ids, lengths, tfs = _term_matrix(self._query(
                f"SELECT c.id, x.len, {tf_columns} FROM cells c JOIN cell_context x ON x.rowid = c.rowid WHERE {where}",
                [*paths, *params],
            ), len(union))
            column = {t: j for j, t in enumerate(union)}
            for i in scanned:
                mine = tfs[:, [column[t] for t in parsed[i][3]]]
                rows = np.flatnonzero(mine.any(axis=1))  # the windows holding one of its terms
                out[i] = _rank_rows([ids[r] for r in rows], lengths[rows], mine[rows], n, total_len, k)
        return out

    def _keyword_fts(self, query: str, flt: CellFilter, terms: builtins.list[str], n: int, total_len: int, k: int) -> builtins.list[Candidate]:
        """The keyword leg through the FTS OR query (a small filter, a word FTS reads as a phrase)."""
        where, params = filter_sql(flt)
        tf_columns = ", ".join("coalesce(json_extract(x.terms, ?), 0)" for _ in terms)
        paths = ['$."' + t + '"' for t in terms]
        match = f"text : ({fts_match(query)})"
        if flt.owner_id is not None:  # an indexed AND instead of filtering every owner's matches
            match += f' AND owner : "{owner_token(flt.owner_id)}"'
        # Every admitted match with its window length and the query terms' frequencies
        # (SQLite caches the parsed JSON across a row's calls). CROSS JOIN keeps the FTS
        # match the outer loop (the planner would otherwise run the MATCH once per cell).
        rows = self._query(
            f"SELECT c.id, x.len, {tf_columns} FROM cells_fts CROSS JOIN cells c ON c.rowid = cells_fts.rowid "
            f"CROSS JOIN cell_context x ON x.rowid = c.rowid WHERE cells_fts MATCH ? AND {where}",
            [*paths, match, *params],
        )
        ids, lengths, tfs = _term_matrix(rows, len(terms))
        return _rank_rows(ids, lengths, tfs, n, total_len, k)

    def _keyword_wide(self, flt: CellFilter, entry: builtins.list[Any], words: builtins.list[str], per_word: builtins.list[dict[str, int]],
                      terms: builtins.list[str], k: int) -> builtins.list[Candidate]:
        """The keyword leg for a filter admitting many cells: every term's rows (FTS doclists,
        with term frequencies from the FTS vocabulary) intersected with the admitted rows."""
        admitted = self._admitted_set(flt, entry)
        postings = self._postings_cache()
        if self._terms_warm.is_set() and self._term_warmup_due():  # e.g. grown past the threshold by writes
            self._start_term_warmup()
        conn = self._reader()
        conn.execute(_VOCAB)  # per connection; cells_fts exists once the store is open

        def load_term(term: str) -> tuple[np.ndarray, np.ndarray]:
            def load() -> tuple[np.ndarray, np.ndarray]:
                return doc_counts(int_list(conn.execute(term_rows_sql(term), (term,)).fetchone()[0]))
            rowids, tf = postings.get("t:" + term, load)
            return rowids, tf

        def load_unit(word: str) -> np.ndarray:
            def load() -> tuple[np.ndarray]:
                quoted = '"' + word.replace('"', '""') + '"'
                return (np.unique(int_list(conn.execute(_UNIT_ROWS, (f"text : {quoted}",)).fetchone()[0])),)
            return postings.get("u:" + word, load)[0]

        if all(len(tf) == 1 for tf in per_word):
            # Every word one term (no phrase): the matched rows are exactly those holding a
            # term, each term's document frequency is its admitted row count, so the scores
            # are summed straight into one array over the admitted rows (same terms, same
            # order, same operations as bm25_scores: the same bits) without marking matches.
            scores = admitted.scores(terms, load_term)
            best = top_k(scores, k)
            rowids = admitted.rowids[best]
        else:
            scores, best, rowids = self._keyword_wide_phrases(admitted, words, per_word, terms, k, load_term, load_unit)
            if not rowids.size:
                return []
        ids = dict(conn.execute("SELECT rowid, id FROM cells WHERE rowid IN (SELECT value FROM json_each(?))",
                                (json.dumps(rowids.tolist()),)).fetchall())
        ranked = sorted((-float(scores[b]), ids[int(r)]) for b, r in zip(best, rowids))
        return [Candidate(cid, -neg) for neg, cid in ranked[:k]]

    @staticmethod
    def _keyword_wide_phrases(admitted: AdmittedSet, words: builtins.list[str], per_word: builtins.list[dict[str, int]],
                              terms: builtins.list[str], k: int, load_term: Any, load_unit: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`_keyword_wide` for a query with a phrase: its matches are marked first (a phrase's
        rows come from FTS), document frequencies count matched rows. (scores of the matched
        rows, the best of them, their rowids)."""
        parts = []
        for word, tf in zip(words, per_word):
            if len(tf) == 1:  # one term: its rows are the word's matches
                parts.append(admitted.term(next(iter(tf)), load_term)[0])
            elif tf:  # a phrase: FTS decides what matches
                parts.append(admitted.unit(word, load_unit))
        matched = union_positions(parts, admitted.n)
        if not matched.size:
            empty = np.empty(0, dtype=np.int64)
            return np.empty(0), empty, empty
        scores = bm25_scores(admitted.n, admitted.total, admitted.lengths, matched,
                             [admitted.term(t, load_term) for t in terms])
        best = top_k(scores, k)
        return scores, best, admitted.rowids[matched[best]]

    def _data_version(self) -> int:
        """A number that changes whenever anything commits to the database: this process's
        writer or another process (`PRAGMA data_version` of a connection that never writes,
        which moves on every other connection's commit). Read before the data it labels, so
        a cached answer is never older than its label."""
        with self._version_lock:
            if self._version_conn is None:
                self._require_writer()
                self._version_conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            return int(self._version_conn.execute("PRAGMA data_version").fetchone()[0])

    def _foreign_generation(self) -> int:
        """The caches' generation, after taking in what other connections (another process,
        another store on the same file) committed since the last call: their logged rows
        patch the caches as this process's own commits do (`_catch_up`); the number moves
        only when that cannot be done and the caches must load afresh. The writer's
        `PRAGMA data_version` is unchanged by its own commits and moves on everyone else's;
        it is read (under the write lock, the writer's owner) only when `_data_version`
        says something committed at all."""
        with self._foreign_lock:
            version = self._data_version()
            if version != self._seen_version:
                with self._write_lock:
                    writer = int(self._require_writer().execute("PRAGMA data_version").fetchone()[0])
                    if self._writer_version is not None and writer != self._writer_version:
                        self._catch_up()
                    self._writer_version = writer
                self._seen_version = version
            return self._foreign

    def _postings_cache(self) -> PostingsCache:
        """Every row's postings per term (all threads): patched with every logged commit,
        started afresh when the change log cannot say what changed."""
        foreign = self._foreign_generation()
        cached = self._postings
        if cached is None or cached[0] != foreign:
            # Made under the write lock: no transaction is between its change capture and
            # its commit, so every later commit is recorded into this cache's log.
            with self._write_lock:
                cached = self._postings = (foreign, PostingsCache(POSTINGS_CACHE_BYTES))
        return cached[1]

    def _access_snapshot(self) -> AccessSnapshot:
        """The access snapshot, current with every commit so far: loaded on first use (one
        scan of the table), then patched from the change log; loaded again only when the log
        cannot say what changed. A search that needs it while it loads waits for that load
        instead of scanning too."""
        snapshot = self._snapshot
        if snapshot is not None and snapshot.foreign == self._foreign_generation():
            return snapshot
        with self._snapshot_build_lock:
            snapshot = self._snapshot
            if snapshot is not None and snapshot.foreign == self._foreign_generation():
                return snapshot
            if self._snapshot_saved:  # the first load since open(): a saved one, when it is current
                self._snapshot_saved = False
                snapshot = self._resumed_snapshot()
                if snapshot is not None:
                    return snapshot
            conn = self._reader()
            beside = self._snapshot_connection()
            # The generation is read first (a reload the log asks for meanwhile moves it, and
            # this snapshot is loaded again at its next use). The read transactions start
            # under the write lock, with no commit of ours half done, in one snapshot of the
            # file (`_begin_reads`); the logged rows taken in from then on (ours, or another
            # process's caught up) are kept in the backlog and applied on top (each is a
            # row's whole state: one the load already saw changes nothing).
            foreign = self._foreign_generation()
            with self._write_lock:
                self._snapshot = None
                self._snapshot_backlog = []
            try:
                reading = self._begin_reads([conn] if beside is None else [conn, beside])
                if beside is not None and len(reading) == 1:
                    beside.close()  # another process kept committing: one connection reads it all
                    beside = None
                snapshot = AccessSnapshot(foreign)
                snapshot.load(*[lambda sql, c=c: c.execute(sql).fetchall() for c in reading])
            except BaseException:
                with self._write_lock:
                    self._snapshot_backlog = None
                raise
            finally:
                for c in (conn, beside):
                    if c is not None and c.in_transaction:
                        c.execute("COMMIT")
                if beside is not None:
                    beside.close()
            with self._write_lock:
                for states in self._snapshot_backlog or []:
                    snapshot.apply(states)
                self._snapshot_backlog = None
                self._snapshot = snapshot
                self.snapshot_source = "table"
            return snapshot

    # A restart's first reader-wide search waited for the snapshot's load from the table (~2.5 s
    # of CPU at a million cells, `AccessSnapshot.load`); a clean close saves it beside the file
    # and the next open reads it back (~0.1 s) and brings it forward by the change log, which
    # every writer of the file appends to (migration 11), whatever process it is.
    def _snapshot_file(self) -> str:
        return f"{self.path}.access-snapshot"

    def _log_mark(self, conn: sqlite3.Connection, seq: int) -> Optional[str]:
        """A digest of the change log's entries up to `seq` (the last _LOG_MARK_ENTRIES), or
        None when the log does not hold entry `seq` (pruned past, emptied, never written)."""
        entries = conn.execute(_LOG_MARK, (seq - _LOG_MARK_ENTRIES, seq)).fetchall()
        if not entries or entries[-1][0] != seq:
            return None
        return hashlib.blake2b(json.dumps(entries).encode(), digest_size=16).hexdigest()

    def _saved_snapshot_holds(self) -> bool:
        """At open, before this process writes anything: whether a saved snapshot is there, of
        this schema, and still names an entry of this file's change log (the same entry, the
        same 64 up to it). One that does not is deleted now (not read whole at the first load
        only to be refused): the file was migrated since, or put back from a backup, or is
        another one, and writes from here on could log a sequence of rows that happens to match
        the mark again (a restored file re-imported in the same order) with other values."""
        path = self._snapshot_file()
        if not os.path.exists(path):
            return False
        try:
            meta = AccessSnapshot.saved_meta(path)
            holds = meta.get("schema") == self.schema_version() and \
                self._log_mark(self._require_writer(), int(meta["log_seq"])) == meta.get("log_mark")
        except Exception as exc:  # noqa: BLE001  (an unreadable file is no snapshot)
            log.warning("saved access snapshot unreadable: %s", exc)
            holds = False
        if not holds:
            try:
                os.remove(path)
            except OSError:
                pass
        return holds

    def _save_snapshot(self, conn: Optional[sqlite3.Connection] = None) -> None:
        """The access snapshot, with the change-log entry it is current with (every logged
        change up to it is in the snapshot: the store applies its own commits and catches up
        with other processes' in log order), beside the database file: at close, and from the
        checkpoint thread (on its connection `conn`) every SNAPSHOT_SAVE_INTERVAL_S while
        commits arrive. Nothing to save (never loaded, due to load afresh, unchanged since the
        last save): a file saved earlier stays, as current as it was."""
        if not self._tracking:
            return
        self._foreign_generation()  # other processes' commits so far, into the snapshot
        with self._write_lock:  # (held only to copy the arrays: no commit moves them meanwhile)
            snapshot = self._snapshot
            if snapshot is None or snapshot.foreign != self._foreign or self._snapshot_backlog is not None:
                return
            state = (self._foreign, snapshot.generation, self._log_seq)
            if state == self._snapshot_saved_state and os.path.exists(self._snapshot_file()):
                return
            frozen, seq = snapshot.frozen(), self._log_seq
        # Entries up to `seq` are committed and never change (the log is only pruned from its start).
        mark = self._log_mark(conn or self._require_writer(), seq)
        if mark is None:
            return
        frozen.save(self._snapshot_file(), {"log_seq": seq, "log_mark": mark, "schema": self.schema_version()})
        self._snapshot_saved_state = state

    def _resumed_snapshot(self) -> Optional[AccessSnapshot]:
        """The saved access snapshot brought forward to now, and made the store's; None when
        there is none to trust: not this schema, its change-log entry gone or another (a file put
        back from a backup), more than SNAPSHOT_RESUME_MAX rows logged since, or rows that do not
        add up to the table's (then the caller loads from the table). The log's rows since the
        save are read in one transaction under the write lock (no commit of ours in between),
        each row's whole current state; another process's commits after it are caught up like
        any other (`_foreign_generation`)."""
        foreign = self._foreign_generation()
        try:
            snapshot, meta = AccessSnapshot.saved(self._snapshot_file(), foreign)
            seq = int(meta["log_seq"])
        except Exception as exc:  # noqa: BLE001  (any unreadable file: load from the table)
            log.warning("saved access snapshot not used (loading from the table): %s", exc)
            return None
        if meta.get("schema") != self.schema_version():
            return None
        with self._write_lock:
            conn = self._require_writer()
            conn.execute("BEGIN")
            try:
                if self._log_mark(conn, seq) != meta.get("log_mark"):
                    return None
                top = conn.execute(_LOG_BOUNDS).fetchone()[1]
                if top - seq > SNAPSHOT_RESUME_MAX:
                    return None
                touched = sorted({r for (r,) in conn.execute(_LOG_SINCE, (seq,))})
                snapshot.apply(self._row_states(conn, touched, with_terms=False)[0])  # (the snapshot only)
                rows, highest = conn.execute("SELECT count(*), COALESCE(MAX(rowid), 0) FROM cells").fetchone()
            finally:
                conn.execute("COMMIT")
            present = np.flatnonzero(snapshot.present[: snapshot.size])
            if len(present) != rows or (rows and int(present[-1]) != highest):
                log.warning("saved access snapshot does not match the table (loading from the table)")
                return None
            if foreign != self._foreign:  # the log asked for a reload meanwhile
                return None
            self._snapshot = snapshot
            self.snapshot_source = "saved"
        return snapshot

    def _snapshot_connection(self) -> Optional[sqlite3.Connection]:
        """A second connection for loading the access snapshot (its reader patterns, read
        beside the rest: `AccessSnapshot.load`), closed after; None without the change log
        (an old schema mid-upgrade), which `_begin_reads` needs."""
        if not self._tracking:
            return None
        return sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                               timeout=self.busy_timeout_ms / 1000)

    def _begin_reads(self, conns: builtins.list[sqlite3.Connection], attempts: int = 3) -> builtins.list[sqlite3.Connection]:
        """Starts a read transaction on each connection, all in one snapshot of the file: under
        the write lock (no commit of ours between them), and seeing the same last change_log
        entry (no other process's commit between them either: every commit that changes a
        row's access columns or window logs one). Tried again when another process committed
        in between; the connections reading: all, or after `attempts` the first alone."""
        def begin(c: sqlite3.Connection) -> Any:
            c.execute("BEGIN")
            return c.execute(_LOG_BOUNDS if len(conns) > 1 else "SELECT 1 FROM cells LIMIT 1").fetchone()[-1]

        for _ in range(attempts):
            with self._write_lock:
                tops = {begin(c) for c in conns}
            if len(tops) == 1:
                return conns
            for c in conns:
                c.execute("COMMIT")
        with self._write_lock:
            begin(conns[0])
        return conns[:1]

    def _admitted_set(self, flt: CellFilter, entry: builtins.list[Any]) -> AdmittedSet:
        """The filter's admitted rows (kept with its N in `_admitted_entry`), at most
        ADMITTED_CACHE_ROWS rows' worth in all."""
        if entry[3] is None:
            self._hold_admitted(entry, self._load_admitted(flt))
        return entry[3]

    def _load_admitted(self, flt: CellFilter) -> AdmittedSet:
        where, params = filter_sql(flt)
        return AdmittedSet(*admitted_lengths(self._query(
            f"SELECT c.rowid, x.len FROM cells c JOIN cell_context x ON x.rowid = c.rowid WHERE {where}", params)),
            self._set_arrays)

    def _hold_admitted(self, entry: builtins.list[Any], admitted: AdmittedSet) -> None:
        cache = self._stats_cache
        held = [e for e in cache[1].values() if e[3] is not None] if cache is not None else []
        if sum(e[3].n for e in held) + admitted.n > ADMITTED_CACHE_ROWS:
            for e in held:
                e[3] = None
        entry[3] = admitted

    def _admitted_stats(self, flt: CellFilter) -> tuple[int, int]:
        entry = self._admitted_entry(flt)
        return entry[1], entry[2]

    def _admitted_entry(self, flt: CellFilter) -> builtins.list[Any]:
        """[valid-from time, cells, summed window length, admitted rows or None] for the
        filter: BM25's N and mean length (and, for a wide filter, the rows themselves). A
        reader-wide filter (no owner, session or metadata condition) is answered from the
        access snapshot, its rows kept until a row changes; any other is counted in SQL and
        kept per filter, for every thread, until the database changes (`_data_version`).
        Either answer is kept until a cell expires in between."""
        self._windows_current()
        if AccessSnapshot.supports(flt):
            return self._snapshot_entry(flt)
        version = self._data_version()
        cache = self._stats_cache
        if cache is None or cache[0] != version:
            cache = self._stats_cache = (version, {}, [])
        at = flt.not_expired_at.timestamp() if flt.not_expired_at is not None else None
        where, params = filter_sql(replace(flt, not_expired_at=None))
        key = (where, tuple(params), at is None)
        hit = cache[1].get(key)
        if hit is not None and at is not None and at != hit[0]:
            if not cache[2]:  # the store's expiry times, sorted, once per database version
                cache[2].append(sorted(t for (t,) in self._query("SELECT expires_at FROM cells WHERE expires_at IS NOT NULL")))
            expiries = cache[2][0]
            if at < hit[0] or bisect.bisect_right(expiries, at) != bisect.bisect_right(expiries, hit[0]):
                hit = None  # a cell expired in between (or the clock went back)
        if hit is None:
            if len(cache[1]) >= 256:
                cache[1].clear()
            where, params = filter_sql(flt)
            n, total = self._query(
                f"SELECT COUNT(*), COALESCE(SUM(x.len), 0) FROM cells c JOIN cell_context x ON x.rowid = c.rowid "
                f"WHERE {where}", params,
            )[0]
            hit = cache[1][key] = [at or 0.0, int(n), int(total), None]
        return hit

    def _snapshot_entry(self, flt: CellFilter) -> builtins.list[Any]:
        """`_admitted_entry` of a reader-wide filter, from the access snapshot: its admitted
        rows, computed in memory and kept until the snapshot changes (a commit touching any
        row) or a cell expires in between."""
        snapshot = self._access_snapshot()
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
                if held + rowids.size > ADMITTED_CACHE_ROWS:
                    snapshot.entries.clear()
                admitted = AdmittedSet(rowids, lengths, int(lengths.sum()), self._set_arrays)
                hit = snapshot.entries[key] = [at or 0.0, admitted.n, admitted.total, admitted]
            return hit

    def _catch_up_vectors(self) -> None:
        """Load vectors written since the last call (by this process or any other)."""
        while True:
            # One chunk per hold of the lock: close() takes it before closing the connections,
            # so the background warm-up never reads from a connection being closed (a crash in
            # the sqlite3 module), and never holds close() up for the whole load.
            with self._vectors_lock:
                if self._writer is None:  # closed meanwhile
                    return
                rows = self._query(
                    "SELECT rowid, embed_model, embedding, vec_seq, embed_dim FROM cells "
                    "WHERE vec_seq > ? ORDER BY vec_seq LIMIT 20000",
                    (self._vectors_seq,),
                )
                if not rows:
                    for held in self._vectors.values():
                        self._start_drain(held)
                    return
                # Each row's vector is now its model's, or none (a row written without one):
                # every other index forgets the rowid. So a vector that moved to another model
                # leaves the old index, and a purged row's vector never stays under its rowid
                # when a new row reuses it (it would rank a readable cell by the text of one
                # its reader could not read).
                changed = np.asarray([row[0] for row in rows], dtype=np.int64)
                now_of = np.asarray([row[1] if row[2] is not None else None for row in rows], dtype=object)
                for name, loaded in self._vectors.items():
                    loaded.discard(changed[now_of != name])
                by_model: dict[str, tuple[list[int], list[bytes], list[Optional[int]]]] = {}
                for rowid, model, blob, _, dim in rows:
                    if blob is None:
                        continue
                    ids, blobs, dims = by_model.setdefault(model, ([], [], []))
                    ids.append(rowid)
                    blobs.append(blob)
                    dims.append(dim)
                for model, (ids, blobs, dims) in by_model.items():
                    matrix = _decode_vectors(blobs, dims)
                    if matrix is None:  # mixed sizes or encodings: one by one
                        vecs = [decode_vector(b, d) for b, d in zip(blobs, dims)]
                        if len({v.size for v in vecs}) > 1:  # one model, several sizes: keep the latest
                            keep = [i for i, v in enumerate(vecs) if v.size == vecs[-1].size]
                            ids, vecs = [ids[i] for i in keep], [vecs[i] for i in keep]
                        matrix = np.stack(vecs)
                    index = self._vectors.get(model)
                    if index is None or index.dim != matrix.shape[1]:
                        index = self._vectors[model] = VectorIndex(matrix.shape[1], self.ann_threshold)
                    index.upsert(np.asarray(ids, dtype=np.int64), matrix)
                self._vectors_seq = rows[-1][3]

    def has_vectors(self, model: str, flt: CellFilter) -> bool:
        """Whether a row `flt` admits has a vector of `model`, decided on those rows alone.

        A reader-wide filter asks the vector index about its admitted set (the slots the
        dense leg's search keeps for it): in SQL, the access condition and then the model
        column were read on every admitted row whenever none has such a vector (0.6 s a
        search at 1M cells, for every English search by a reader who may read no Korean,
        Japanese or Chinese cell of a store that has one, and for every wide search while
        the index loaded). While the index loads, a wide filter's dense legs find nothing
        (`_vector_candidates_from_rows`): no. An owner's or a session's filter asks SQL,
        where its index serves it. No store-wide shortcut: the cost does not depend on
        whether any other cell has such a vector."""
        entry = self._admitted_entry(flt)
        if self._wide(flt, entry[1]):
            if self._vectors_ready.is_set():
                self._catch_up_vectors()
                index = self._vectors.get(model)
                return index is not None and index.holds_any(self._admitted_set(flt, entry).rowids)
            if entry[1] > self.warm_exact_max:
                return False
        where, params = filter_sql(flt)
        return bool(self._query(f"SELECT 1 FROM cells c WHERE {where} AND c.embed_model = ? LIMIT 1", [*params, model]))

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

    # ------------------------------------------------------------ vector index warm-up
    @property
    def vectors_warming(self) -> bool:
        """True while the vector index is still loading after open, or while its approximate
        graph is being built or loaded (see `vector_candidates`)."""
        return not self._vectors_ready.is_set() or any(
            index.ann_state == "building" for index in list(self._vectors.values()))

    def vector_index_state(self) -> dict[str, Any]:
        states = {index.ann_state for index in self._vectors.values()} - {"none"}
        return {
            "keyword_warmup": self._keyword_warmup_state(),
            "access_snapshot": self.snapshot_source or "none",
            "state": "loading" if not self._vectors_ready.is_set() else "ready" if self._vectors else "none",
            "vectors": sum(len(index) for index in self._vectors.values()),
            "approximate": "off" if self.ann_threshold is None
            else next((s for s in ("building", "ready", "unavailable") if s in states), "none"),
            # caught-up vectors not in the approximate graph yet (scored exactly meanwhile)
            "approximate_backlog": sum(index.graph_backlog for index in list(self._vectors.values())),
        }

    def _keyword_warmup_state(self) -> str:
        """warming: a term warm-up runs; none: the store is past `warm_terms_min_cells` and
        its common words were not read ahead for what it holds now (the next reader-wide
        search starts that); ready: they were, or the store is too small to need it."""
        if not self._terms_warm.is_set():
            return "warming"
        try:
            return "none" if self._term_warmup_due() else "ready"
        except Unavailable:  # closed
            return "ready"

    def _ann_path(self, model: str) -> str:
        return f"{self.path}.ann-{hashlib.blake2b(model.encode(), digest_size=6).hexdigest()}"

    def _warm_vectors(self, opened: int) -> None:
        """Background, from open(): load every vector, then the saved (or a new) HNSW graph.
        Closed meanwhile (and perhaps opened again, with a warm-up of its own): it stops,
        neither marking the index ready nor building a graph over what it had loaded (at a
        million vectors, a saved graph loaded over a quarter of them had the later warm-up
        add the rest to the graph one by one, for minutes, while wide searches scanned SQL)."""
        self._snapshot_first.wait(SNAPSHOT_FIRST_WAIT_S)
        try:
            self._catch_up_vectors()
        except Exception:  # noqa: BLE001  (closed meanwhile: the next search catches up)
            pass
        finally:
            if self._opened == opened:
                self._vectors_ready.set()
        for model, index in list(self._vectors.items()):
            if not self._current(opened):
                return
            if index.wants_ann():
                self._build_ann(model, index)

    def _build_ann(self, model: str, index: VectorIndex) -> None:
        """Load the model's saved HNSW graph, or build one and save it next to the database
        with the vector sequence it covers, so a restart loads instead of rebuilding (minutes
        at a million vectors); in a background thread."""
        path = self._ann_path(model)
        try:
            meta = _saved_graph_meta(path)
            # Loaded when the saved graph has the dimensions the index keeps (`prepare_ann`
            # decides, under the index's lock), else built from the vectors held.
            prepared = index.prepare_ann(saved=path, saved_width=meta["dim"]) if meta else index.prepare_ann()
            if prepared is None:
                return
            loaded = prepared[1]
            if meta and loaded:
                # Under the lock catch-ups take: no vector changes between the query and the
                # graph serving with the changed rows in its backlog.
                with self._vectors_lock:
                    if self._writer is None:  # closed meanwhile
                        return
                    changed = self._query("SELECT rowid FROM cells WHERE vec_seq > ? AND embed_model = ?",
                                          (int(meta["vec_seq"]), model))
                    index.install_ann(prepared, np.asarray([r for (r,) in changed], dtype=np.int64))
            else:
                index.install_ann(prepared)
            self._start_drain(index)  # rows changed since the saved graph, or while it was built
            # A built graph is saved now. A loaded one waits for close(): it lacks only the rows
            # changed since its file, which a start adds again from `vec_seq`, and hnswlib holds
            # the interpreter lock while it saves (~4 s at 1M: every request would wait).
            if not loaded:
                self._save_ann(model, index)
        except Exception:  # noqa: BLE001  (a closed store or a bad file: the exact scan answers)
            if index.ann_state == "building":
                index.ann_state = "none"

    def _start_drain(self, index: VectorIndex) -> None:
        """`_drain_graph` in the background, when the index has a backlog none drains."""
        if index.claim_drain():
            self._start_index_thread("vectors.drain", self._drain_graph, self._opened, index)

    def _drain_graph(self, opened: int, index: VectorIndex) -> None:
        """Background: the vectors a catch-up left out of the approximate graph (more than
        GRAPH_SYNC_ROWS at once: an import's), added GRAPH_DRAIN_ROWS at a time; searches
        score them exactly until then (`VectorIndex`). `/health` says how many wait."""
        try:
            while self._current(opened) and index.drain_graph(GRAPH_DRAIN_ROWS):
                # A pause between chunks: a lock released and at once taken again by the same
                # thread starved the searches waiting for it (an 18 s search at 100,000).
                time.sleep(GRAPH_DRAIN_PAUSE_S)
        finally:
            index.release_drain()

    def _save_ann(self, model: str, index: VectorIndex) -> None:
        path = self._ann_path(model)
        with self._vectors_lock:  # the graph then covers exactly the vectors up to this sequence
            seq, width = self._vectors_seq, index.width  # (its graph's dimensions)
            if not index.ann_dirty or not index.save_ann(path + ".tmp"):
                return
        with open(path + ".json.tmp", "w") as f:
            json.dump({"vec_seq": seq, "dim": width, "model": model}, f)
        os.replace(path + ".tmp", path)
        os.replace(path + ".json.tmp", path + ".json")

    def _vector_candidates_from_rows(self, vector: Any, model: str, flt: CellFilter, k: int) -> builtins.list[Candidate]:
        """While the index loads: an exact ranking of the admitted rows read straight from the
        table, when there are few (an owner's search); none for a wide filter (keyword only)."""
        if self._admitted_entry(flt)[1] > self.warm_exact_max:  # wide: not read only to be dropped
            return []
        where, params = filter_sql(flt)
        rows = self._query(
            f"SELECT c.id, c.embedding, c.embed_dim FROM cells c WHERE {where} AND c.embed_model = ? "
            "AND c.embedding IS NOT NULL ORDER BY c.rowid LIMIT ?", [*params, model, self.warm_exact_max + 1],
        )
        query = np.asarray(vector, dtype=np.float32).ravel()
        rows = [r for r in rows if (r[2] or query.size) == query.size]
        if not rows or len(rows) > self.warm_exact_max or k <= 0:
            return []
        scores = row_dots(np.stack([decode_vector(blob, dim) for _, blob, dim in rows]), query)
        top = _top_k(scores, k)
        return [Candidate(rows[i][0], float(scores[i])) for i in top]

    def vector_candidates(self, vector: Any, model: str, flt: CellFilter, k: int) -> builtins.list[Candidate]:
        self._windows_current()  # (new rows get their vectors with their windows: `embed_new`)
        if not self._vectors_ready.is_set():  # still loading: small filtered sets from the table
            return self._vector_candidates_from_rows(vector, model, flt, k)
        self._catch_up_vectors()
        index = self._vectors.get(model)
        if index is None:
            return []
        if index.wants_ann():  # crossed the threshold: build in the background, exact meanwhile
            index.ann_state = "building"
            self._start_index_thread("vectors.build", self._build_ann, model, index)
        # The filter runs in SQL first, so the index only ranks rows the caller may see. A wide
        # filter's rows are the keyword leg's admitted set (cached until the data changes);
        # the index holds exactly the rows whose current vector is of this model.
        entry = self._admitted_entry(flt)
        if self._wide(flt, entry[1]):
            allowed = self._admitted_set(flt, entry).rowids
        else:
            where, params = filter_sql(flt)
            cur = self._reader().execute(f"SELECT c.rowid FROM cells c WHERE {where} AND c.embed_model = ?", [*params, model])
            allowed = np.fromiter((r[0] for r in cur), dtype=np.int64)
        if index.ann_state == "building" and len(allowed) > self.warm_exact_max:
            # An exact scan of this many rows costs seconds at a million (a gather of the
            # allowed rows, then a product): keyword only until the graph is ready.
            return []
        hits = index.search(vector, allowed, k)
        if not hits:
            return []
        ids = dict(self._query(
            f"SELECT rowid, id FROM cells WHERE rowid IN ({','.join('?' * len(hits))})", [r for r, _ in hits]
        ))
        return [Candidate(ids[r], score) for r, score in hits if r in ids]

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

    def queue_stale_embeddings(self, model: str, batch_size: int = 10000, cjk_model: Optional[str] = None) -> int:
        # Found by reads, batch by batch of rowids, and queued by a short write only when a
        # batch has some: the scan held the write lock batch after batch (~10 s at a million
        # cells, at every start), so other writers, and a search indexing a new cell's
        # keyword window (migration 12), lost the lock to the next batch until their busy
        # timeout. A row found stale that is rewritten meanwhile is embedded once more.
        if cjk_model is None:
            stale, params = "embed_model IS NOT ?", [model]
        else:  # GLOB runs in C: an English store costs a scan, no Python per row. A text of
            # ASCII alone (as many bytes as characters) holds no CJK character and is not
            # matched against the class at all: the GLOB of every text was ~6 s of CPU at a
            # million cells, at every start, beside the warm-ups (this, ~0.8 s).
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


def _decode_vectors(blobs: Sequence[bytes], dims: Sequence[Optional[int]]) -> Optional[np.ndarray]:
    """Many stored float16 embeddings of one size as one float32 matrix, decoded at once (a
    million one-row decodes were most of a restart's warm-up); None when they differ."""
    dim = dims[0]
    if not dim or any(d != dim for d in dims) or any(len(b) != 2 * dim for b in blobs):
        return None
    return np.frombuffer(b"".join(blobs), dtype=np.float16).reshape(len(blobs), dim).astype(np.float32)


def decode_vector(blob: bytes, dim: Optional[int]) -> np.ndarray:
    """A stored embedding as float32: float16 since migration 2, float32 before it."""
    dtype = np.float16 if dim and len(blob) == 2 * dim else np.float32
    return np.frombuffer(blob, dtype=dtype).astype(np.float32)


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


def _split_sql(script: str) -> list[str]:
    """Split a migration into statements, keeping trigger bodies (BEGIN ... END;) whole."""
    statements, current = [], []
    for line in script.strip().splitlines():
        current.append(line)
        joined = "\n".join(current).strip()
        if joined.endswith(";") and sqlite3.complete_statement(joined):
            statements.append(joined)
            current = []
    if "\n".join(current).strip():
        statements.append("\n".join(current))
    return statements


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


def _saved_graph_meta(path: str) -> Optional[dict[str, Any]]:
    """What `_save_ann` wrote beside a saved graph (the vector sequence it covers, its
    dimension, its model), when both files are there."""
    try:
        with open(path + ".json") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    ok = isinstance(meta, dict) and isinstance(meta.get("dim"), int) and isinstance(meta.get("vec_seq"), int)
    return meta if ok and os.path.exists(path) else None
