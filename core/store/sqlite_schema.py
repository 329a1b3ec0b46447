"""The SQLite store's schema: its migrations, in order (each a version, a name and a script).

`cells` holds the indexed columns plus the rest of the cell as JSON (`body`, without the text,
which lives once in the `text` column); `cell_context` holds each cell's keyword window, which
`cells_fts` (external-content FTS5) indexes; `cell_readers` holds each cell's `readable_by`
patterns (as SQLite GLOBs) so the access filter runs inside the query; `history` is
append-only; `change_log` lists the rows each commit touched, for every process's in-memory
caches. Python steps that run after a migration's script are `MIGRATION_STEPS` in `sqlite.py`.
"""

from __future__ import annotations

import sqlite3

from ._files import FILES_SCHEMA

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
        # (`SQLiteVectorIndex.catch_up`). Taken as MAX(vec_seq) + 1 it went back when a purge deleted
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
        # rows logged since the last sequence number they saw (`ChangeFeed.catch_up`)
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
        # window and its predecessors' before COMMIT (a large share of a single create's
        # work); `SQLiteStore.index_pending_windows` rewrites them later in one pass per
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
        # body (most of its load, which the first reader-wide search after a restart waits
        # for). Every write of the body writes it (`cell_to_row`);
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


def split_sql(script: str) -> list[str]:
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


__all__ = ["MIGRATIONS", "split_sql"]
