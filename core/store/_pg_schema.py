"""The PostgreSQL store's schema: numbered migrations, and the keyword index's upkeep.

The keyword index (`cell_search`) holds, per cell, a *window*: the cell's text plus up to
CONTEXT_RADIUS neighbours of the same window class (same owner, session, readers and status:
`ampkit.store.base.window_class`) each side, in insertion order, exactly as the SQLite
store's `cell_context` does; a question asked in one turn is then found by the answer given
in the next. Each write transaction collects the cells it touched and rewrites their windows
(and their neighbours') once, before COMMIT (`refresh_windows`).
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable

import numpy as np
import psycopg
from psycopg import sql
from psycopg.types.json import Json

from ..glob import upgrade_stored
from ..textindex import index_text, text_key
from ._files import FILES_SCHEMA
from .base import CONTEXT_RADIUS, window_class
from .sql.dialects import POSTGRES, READER_LITERAL

TEXT_CONFIG = "english"  # stemming and stop words, the counterpart of FTS5's porter tokenizer

# A change of a `cells` column a keyword filter reads (the triggers of migrations 10 and 12).
FILTER_COLUMNS_CHANGED = (
    "(OLD.owner_id, OLD.created_by, OLD.session_id, OLD.type, OLD.status, OLD.public, OLD.expires_at, "
    "OLD.superseded_by, OLD.reader_patterns, OLD.metadata, OLD.seq) IS DISTINCT FROM "
    "(NEW.owner_id, NEW.created_by, NEW.session_id, NEW.type, NEW.status, NEW.public, NEW.expires_at, "
    "NEW.superseded_by, NEW.reader_patterns, NEW.metadata, NEW.seq)"
)

MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "cells, keyword index, vectors, history",
        """
        CREATE EXTENSION IF NOT EXISTS vector;
        CREATE TABLE cells (
            id              TEXT COLLATE "C" PRIMARY KEY,
            owner_id        TEXT NOT NULL,
            created_by      TEXT,
            session_id      TEXT,
            type            TEXT NOT NULL,
            status          TEXT NOT NULL,
            public          BOOLEAN NOT NULL DEFAULT FALSE,
            expires_at      TIMESTAMPTZ,
            superseded_by   TEXT,
            reader_patterns TEXT[] NOT NULL DEFAULT '{}',
            metadata        JSONB NOT NULL DEFAULT '{}',
            text            TEXT NOT NULL,
            body            JSON NOT NULL
        ) WITH (fillfactor = 80);
        CREATE INDEX cells_owner_status ON cells (owner_id, status, id);
        CREATE INDEX cells_status ON cells (status, id);
        CREATE TABLE cell_search (
            cell_id TEXT COLLATE "C" PRIMARY KEY REFERENCES cells(id) ON DELETE CASCADE,
            tsv     TSVECTOR NOT NULL
        );
        CREATE INDEX cell_search_tsv ON cell_search USING gin (tsv);
        CREATE TABLE cell_vectors (
            cell_id   TEXT COLLATE "C" PRIMARY KEY REFERENCES cells(id) ON DELETE CASCADE,
            model     TEXT NOT NULL,
            dim       INTEGER NOT NULL,
            embedding vector NOT NULL
        );
        CREATE TABLE history (
            seq     BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            cell_id TEXT COLLATE "C" NOT NULL,
            at      TIMESTAMPTZ NOT NULL,
            actor   TEXT NOT NULL,
            action  TEXT NOT NULL,
            changes JSON NOT NULL
        );
        CREATE INDEX history_cell ON history (cell_id, seq);
        """,
    ),
    (
        2,
        "api keys (hashed secrets)",
        """
        CREATE TABLE api_keys (
            key_id      TEXT PRIMARY KEY,
            agent_id    TEXT NOT NULL,
            scopes      TEXT NOT NULL,
            secret_hash TEXT NOT NULL,
            created_at  TIMESTAMPTZ NOT NULL,
            expires_at  TIMESTAMPTZ,
            revoked_at  TIMESTAMPTZ,
            replaced_by TEXT
        );
        CREATE INDEX api_keys_agent ON api_keys (agent_id, created_at);
        """,
    ),
    (
        3,
        "keyword index over same-session turn windows; document lengths for BM25",
        # As in SQLite's migration 2: a cell is found by its own words and by those of the cells
        # around it in its owner's session (CONTEXT_RADIUS each side; a question asked in one
        # turn is answered in the next). `seq` is the insertion order that defines "before" and "after";
        # the windows themselves are rebuilt in Python (`rebuild_keyword_index`), because the
        # CJK bigrams come from ampkit.textindex.
        """
        ALTER TABLE cells ADD COLUMN seq BIGINT GENERATED ALWAYS AS IDENTITY;
        CREATE INDEX cells_session_seq ON cells (owner_id, session_id, seq) WHERE session_id IS NOT NULL;
        ALTER TABLE cell_search ADD COLUMN len INTEGER NOT NULL DEFAULT 0;
        """,
    ),
    (
        4,
        "when the scheduled lifecycle last ran",
        """
        CREATE TABLE lifecycle_schedule (name TEXT PRIMARY KEY, last_run TIMESTAMPTZ NOT NULL);
        """,
    ),
    (
        5,
        "cell keys: one live cell per (owner, key)",
        # Identity.key: a caller-chosen name. Archived, deleted and superseded cells release it.
        """
        ALTER TABLE cells ADD COLUMN cell_key TEXT;
        CREATE UNIQUE INDEX cells_live_key ON cells (owner_id, cell_key)
            WHERE cell_key IS NOT NULL AND status IN ('active', 'stale') AND superseded_by IS NULL;
        """,
    ),
    (
        6,
        "keyword windows only within one access class; readers in the one glob dialect",
        # As SQLite's migration 5: neighbours are the nearest cells of the same window class,
        # so a window never crosses an access or status boundary; `reader_patterns` is
        # recompiled by ampkit.glob (the old translation let some patterns through as invalid
        # regular expressions), after stored patterns outside the grammar are rewritten to match
        # literally (`upgrade_stored`). `rebuild_access_and_windows` does all three.
        """
        ALTER TABLE cells ADD COLUMN window_class TEXT;
        CREATE INDEX cells_window_seq ON cells (window_class, seq) WHERE window_class IS NOT NULL;
        """,
    ),
    (7, "memory files: paths, proposals, approval modes", FILES_SCHEMA),
    (
        8,
        "keyword index: Korean words by stem (particles and endings stripped)",
        # As SQLite's migration 7: the windows that hold Korean text (a Korean cell's and its
        # neighbours') are indexed again by `rewrite_hangul_windows`.
        "SELECT 1",
    ),
    (
        9,
        "embedding queue",
        # As SQLite's migration 8: cells written without a vector while the retriever embeds
        # in the background, oldest first; a purged cell leaves the queue with its row.
        """
        CREATE TABLE embed_queue (
            seq     BIGSERIAL PRIMARY KEY,
            cell_id TEXT COLLATE "C" NOT NULL UNIQUE REFERENCES cells(id) ON DELETE CASCADE
        );
        """,
    ),
    (
        10,
        "keyword index rows numbered as their cells; a log of the transactions that change what a keyword search reads",
        # For the wide keyword leg (`_pg_keyword`): each server keeps numpy arrays keyed by
        # `cells.seq` between searches and asks this log whether they still hold. The triggers
        # log whatever the writer (the store, a migration, an operator's UPDATE): any change
        # to a window or its length, and any change to a column a filter reads; a read that
        # only bumps access counts logs nothing. One row per transaction (the GUC remembers
        # it was logged); `_pg_keyword.PRUNE` removes old rows and says below which
        # transaction it did (a server whose arrays are older starts afresh).
        f"""
        ALTER TABLE cell_search ADD COLUMN seq BIGINT;
        UPDATE cell_search s SET seq = c.seq FROM cells c WHERE c.id = s.cell_id;
        ALTER TABLE cell_search ALTER COLUMN seq SET NOT NULL;
        CREATE UNIQUE INDEX cell_search_seq ON cell_search (seq) INCLUDE (cell_id);
        CREATE FUNCTION ampkit_cell_search_seq() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            NEW.seq := (SELECT seq FROM cells WHERE id = NEW.cell_id);
            RETURN NEW;
        END $$;
        CREATE TRIGGER cell_search_seq BEFORE INSERT ON cell_search
            FOR EACH ROW EXECUTE FUNCTION ampkit_cell_search_seq();
        CREATE TABLE search_changes (xid xid8 PRIMARY KEY);
        CREATE TABLE search_changes_pruned (horizon xid8 NOT NULL, at TIMESTAMPTZ NOT NULL, deleted_below xid8 NOT NULL);
        INSERT INTO search_changes_pruned
            VALUES (pg_snapshot_xmin(pg_current_snapshot()), now(), pg_snapshot_xmin(pg_current_snapshot()));
        CREATE FUNCTION ampkit_search_changed() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF current_setting('ampkit.search_changed', true) IS DISTINCT FROM 'on' THEN
                INSERT INTO search_changes (xid) VALUES (pg_current_xact_id()) ON CONFLICT (xid) DO NOTHING;
                PERFORM set_config('ampkit.search_changed', 'on', true);
            END IF;
            RETURN NULL;
        END $$;
        CREATE TRIGGER cell_search_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON cell_search
            FOR EACH STATEMENT EXECUTE FUNCTION ampkit_search_changed();
        CREATE TRIGGER cells_removed AFTER DELETE OR TRUNCATE ON cells
            FOR EACH STATEMENT EXECUTE FUNCTION ampkit_search_changed();
        CREATE TRIGGER cells_filter_changed AFTER UPDATE ON cells FOR EACH ROW
            WHEN ({FILTER_COLUMNS_CHANGED})
            EXECUTE FUNCTION ampkit_search_changed();
        """,
    ),
    (
        11,
        "normalised-text digest for exact dedup",
        # As SQLite's migration 9: dedup on write looks an exact duplicate up by this digest
        # (ampkit.textindex.text_key) in one index probe, instead of a keyword query on the
        # text and a read of its hits. The digest is Python's, so `digest_texts` fills it in
        # and then builds the index.
        """
        ALTER TABLE cells ADD COLUMN text_key TEXT;
        """,
    ),
    (
        12,
        "which keyword rows each transaction changed",
        # Migration 10 logs *that* a transaction changed what a wide keyword search reads; this
        # logs *which* rows (`cell_search.seq`, NULL: all of them, a TRUNCATE), so a server's
        # arrays are patched with those rows instead of read afresh after every write
        # (`_pg_keyword`: a fresh read of a large store is long, with wide searches on the
        # slow statement meanwhile). Same triggers as migration 10's, per row.
        f"""
        CREATE TABLE search_change_rows (xid xid8 NOT NULL, seq BIGINT);
        CREATE INDEX search_change_rows_xid ON search_change_rows (xid);
        CREATE FUNCTION ampkit_search_row_changed() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO search_change_rows (xid, seq)
                VALUES (pg_current_xact_id(), CASE TG_OP WHEN 'DELETE' THEN OLD.seq WHEN 'TRUNCATE' THEN NULL ELSE NEW.seq END);
            RETURN NULL;
        END $$;
        CREATE TRIGGER cell_search_row_changed AFTER INSERT OR UPDATE OR DELETE ON cell_search
            FOR EACH ROW EXECUTE FUNCTION ampkit_search_row_changed();
        CREATE TRIGGER cell_search_truncated AFTER TRUNCATE ON cell_search
            FOR EACH STATEMENT EXECUTE FUNCTION ampkit_search_row_changed();
        CREATE TRIGGER cells_filter_row_changed AFTER UPDATE ON cells FOR EACH ROW
            WHEN ({FILTER_COLUMNS_CHANGED})
            EXECUTE FUNCTION ampkit_search_row_changed();
        """,
    ),
    (
        13,
        "narrow indexes for a wide filter's admitted rows",
        # A reader across owners has its admitted rows read once per server (`_pg_keyword`
        # `_ADMITTED`): a scan of `cells` for the read rule's columns, joined by seq to each
        # row's window length. From these two indexes alone (index-only scans) instead of the
        # tables, whose rows carry the cell's JSON and the tsvector (the rest of the time is
        # mostly the reader's pattern match on every row).
        """
        CREATE INDEX cells_read_rule ON cells (status, seq)
            INCLUDE (owner_id, created_by, public, reader_patterns, superseded_by, expires_at, type);
        CREATE UNIQUE INDEX cell_search_seq_len ON cell_search (seq) INCLUDE (cell_id, len);
        DROP INDEX cell_search_seq;
        """,
    ),
    (
        14,
        "readers named by a literal compared by equality, not run as regular expressions",
        # Most grants name an agent; a regular expression per row was most of a new wide
        # reader's scan of its admitted rows. `reader_patterns` stays as it was (every pattern
        # compiled, written by the store); two columns derived from it by the database split it:
        # `reader_literals`, those of READER_LITERAL's shape (each names one agent id, compared
        # by equality with the reader's own literal, `PostgresDialect.reader_literal`), and
        # `reader_globs`, the rest. Derived, not written: whoever writes `reader_patterns` (a
        # server of the previous version during an upgrade, an operator) keeps them right.
        # Adding them rewrites the table once (its indexes rebuilt, no dead rows left behind);
        # `cells_read_rule` then holds them instead of `reader_patterns`, so the admitted-rows
        # query stays index-only. The keyword filter triggers (10, 12) already watch
        # `reader_patterns`, which the two follow.
        f"""
        CREATE FUNCTION ampkit_reader_literals(patterns TEXT[]) RETURNS TEXT[]
            LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
            RETURN ARRAY(SELECT p FROM unnest(patterns) AS p WHERE p ~ '{READER_LITERAL}');
        CREATE FUNCTION ampkit_reader_globs(patterns TEXT[]) RETURNS TEXT[]
            LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
            RETURN ARRAY(SELECT p FROM unnest(patterns) AS p WHERE p !~ '{READER_LITERAL}');
        ALTER TABLE cells
            ADD COLUMN reader_literals TEXT[] NOT NULL GENERATED ALWAYS AS (ampkit_reader_literals(reader_patterns)) STORED,
            ADD COLUMN reader_globs TEXT[] NOT NULL GENERATED ALWAYS AS (ampkit_reader_globs(reader_patterns)) STORED;
        DROP INDEX cells_read_rule;
        CREATE INDEX cells_read_rule ON cells (status, seq)
            INCLUDE (owner_id, created_by, public, reader_literals, reader_globs, superseded_by, expires_at, type);
        """,
    ),
    (
        15,
        "one HNSW graph element per distinct vector: identical vectors share a canonical row",
        # Identical texts (the same memory of many owners) have identical vectors, and copies of
        # one vector in an HNSW graph fill each other's neighbour lists: the graph falls into
        # islands a walk cannot leave, so a filtered walk ran out of rows and fell back to an
        # exact scan (often, on bench/scale.py's data, where many owners share memories). The graph now holds one row per distinct vector
        # (`canonical`); a walk joins each of its rows to the cells sharing that vector
        # (`vec_key`, a digest of the stored vector) and filters those. Derived by the database, like migration 14's columns. (md5 is enough:
        # the vectors are the server's model's output, never a client's bytes.)
        # A new row takes the canonical part when its vector has none (a trigger, so a server of
        # the previous version creating cells keeps this right too); a replaced or deleted
        # canonical row hands it on in `settle_canonical_vectors`. The table's rewrite and the
        # indexes are `canonical_vectors`' (the old graph is dropped before the rewrite).
        """
        CREATE FUNCTION ampkit_vector_key_lock(model TEXT, dim INTEGER, vec_key UUID) RETURNS void
            LANGUAGE sql AS $$ SELECT pg_advisory_xact_lock(hashtextextended(model || ' ' || dim || ' ' || vec_key, 15)) $$;
        CREATE FUNCTION ampkit_vector_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            key UUID := md5(NEW.embedding::text)::uuid;
        BEGIN
            PERFORM ampkit_vector_key_lock(NEW.model, NEW.dim, key);
            -- (a statement of its own after the lock: it sees the rows of writers who held it)
            NEW.canonical := NOT EXISTS (SELECT 1 FROM cell_vectors
                                         WHERE vec_key = key AND model = NEW.model AND dim = NEW.dim AND canonical);
            RETURN NEW;
        END $$;
        """,
    ),
    (
        16,
        "the read rule's columns by cell id, so a walk's filter reads no table page",
        # A reader-wide dense search walks the graph and checks each cell the walk reaches
        # against the read rule; by `cells_pkey` each check read the cell's table page, and a
        # team walk reaches many cells for each it may read. With the rule's columns in an
        # index by id (those `cells_read_rule` holds by seq) the check is an index-only scan,
        # for the cost of one more index. Also used by other joins from an id that filter by the rule.
        """
        CREATE INDEX cells_id_read_rule ON cells (id)
            INCLUDE (status, owner_id, created_by, public, reader_literals, reader_globs, superseded_by, expires_at, type);
        """,
    ),
    (
        17,
        "vectors stored without a last block of zeros",
        # (ZERO_BLOCK, below: the default model's Latin vectors end in 128 zeros.)
        "-- the work is narrow_vectors': it needs the models and widths the table holds",
    ),
]


# The default model's vector of Latin text ends in its 128-dimension block for Korean, Japanese
# and Chinese character pairs, all zero: a third of the vector, of its row and of its graph
# entry. A vector whose last ZERO_BLOCK components are zero is stored without them (migration
# 17), so one model's vectors have up to two widths, each with its own index, and a search
# walks each (`PostgresStore.vector_query`): a dot product over the kept components is the
# whole one (docs/performance.md, "The zero block on PostgreSQL").
ZERO_BLOCK = 128


def stored_widths(dim: int) -> tuple[int, ...]:
    """The widths a model's `dim`-dimension vectors are stored at (narrowest first)."""
    return (dim - ZERO_BLOCK, dim) if dim >= 2 * ZERO_BLOCK else (dim,)


def stored_vector(vector: np.ndarray) -> np.ndarray:
    """The vector as stored: without its last ZERO_BLOCK components when they are all zero."""
    if len(stored_widths(vector.size)) > 1 and not vector[-ZERO_BLOCK:].any():
        return vector[:-ZERO_BLOCK]
    return vector


def vector_index_name(model: str, dim: int) -> str:
    return "cell_vectors_hnsw_" + hashlib.sha1(f"{model}\0{dim}".encode()).hexdigest()[:16]


def vector_index_sql(model: str, dim: int) -> sql.Composed:
    """The partial HNSW cosine index of one (model, dimension): over canonical rows only."""
    return sql.SQL(
        "CREATE INDEX IF NOT EXISTS {name} ON cell_vectors USING hnsw ((embedding::vector({dim})) vector_cosine_ops) "
        "WHERE model = {model} AND dim = {dim} AND canonical"
    ).format(name=sql.Identifier(vector_index_name(model, dim)), dim=sql.Literal(dim), model=sql.Literal(model))


# A transaction-scoped advisory lock per vector key (model, dim, vec_key), apart from the
# (owner, key) locks (seed 0): `ampkit_vector_key_lock` (migration 15). Whoever changes which
# rows a vector has holds its lock first: an insert (the trigger), a replace or delete before
# touching its row (`_PostgresWriteTx._note_vector_key`), a settle before its UPDATE; so a
# settle never waits on a row another holds.
def vector_key_lock(model: str, dim: str, vec_key: str) -> str:
    return f"ampkit_vector_key_lock({model}, {dim}, {vec_key})"


# Within each given (model, dim, vec_key): exactly one canonical row, the one already canonical
# if any (the graph keeps its element), else the smallest cell id. Run under those keys' locks,
# in a statement of its own (READ COMMITTED: it sees every committed writer's rows).
_KEYS = "SELECT * FROM unnest(%s::text[], %s::int[], %s::uuid[]) WITH ORDINALITY AS k(model, dim, vec_key, n)"
_LOCK_KEYS = f"SELECT {vector_key_lock('k.model', 'k.dim', 'k.vec_key')} FROM ({_KEYS}) k ORDER BY k.n"
_SETTLE = f"""
WITH k AS ({_KEYS}),
twins AS (
    SELECT v.cell_id, row_number() OVER (PARTITION BY v.model, v.dim, v.vec_key
                                         ORDER BY v.canonical DESC, v.cell_id) = 1 AS keep
    FROM cell_vectors v JOIN k ON v.vec_key = k.vec_key AND v.model = k.model AND v.dim = k.dim)
UPDATE cell_vectors v SET canonical = t.keep FROM twins t WHERE v.cell_id = t.cell_id AND v.canonical <> t.keep
"""


def settle_canonical_vectors(conn: psycopg.Connection, keys: set[tuple[str, int, Any]]) -> None:
    """After a transaction replaced or deleted vector rows: each touched vector (old and new
    keys) keeps exactly one canonical row. Writers of one vector take turns on its lock (taken
    here in one order), so two changing copies of it at once cannot both choose one, or both
    leave it without."""
    if not keys:
        return
    ordered = sorted(keys, key=lambda k: (k[0], k[1], str(k[2])))
    arrays = ([m for m, _, _ in ordered], [d for _, d, _ in ordered], [v for _, _, v in ordered])
    conn.execute(_LOCK_KEYS, arrays)
    conn.execute(_SETTLE, arrays)


def narrow_vectors(conn: psycopg.Connection) -> None:
    """Migration 17: vectors whose last ZERO_BLOCK components are zero lose them, and each
    width a model's vectors then have gets its graph. One rewrite of the table (an UPDATE
    would leave every old row behind as dead space): the graphs go first, and `vec_key`,
    derived from the vector, is dropped and derived again in the same statement (its
    indexes with it). A vector's copies share its components, so they move together and
    keep their one canonical row."""
    drop_vector_graphs(conn)
    narrow = f"dim >= {2 * ZERO_BLOCK} AND vector_norm(subvector(embedding, dim - {ZERO_BLOCK - 1}, {ZERO_BLOCK})) = 0"
    conn.execute(
        f"ALTER TABLE cell_vectors DROP COLUMN vec_key,"
        f" ALTER COLUMN embedding TYPE vector USING"
        f" (CASE WHEN {narrow} THEN subvector(embedding, 1, dim - {ZERO_BLOCK}) ELSE embedding END),"
        f" ALTER COLUMN dim TYPE INTEGER USING (CASE WHEN {narrow} THEN dim - {ZERO_BLOCK} ELSE dim END),"
        f" {VEC_KEY_COLUMN}")
    vector_key_indexes(conn)


def drop_vector_graphs(conn: psycopg.Connection) -> None:
    """Every model's HNSW index, before a migration rewrites `cell_vectors` (the rewrite would
    otherwise rebuild them, only for `vector_key_indexes` to build them again)."""
    for (name,) in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
                                "AND tablename = 'cell_vectors' AND indexname LIKE 'cell_vectors_hnsw_%%'").fetchall():
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(name)))


def canonical_vectors(conn: psycopg.Connection) -> None:
    """Migration 15: each row's vector key, a canonical row per distinct vector, the indexes
    copies and canonical rows are found by, and each model's HNSW index again over the
    canonical rows only. The old graphs go first: the table's rewrite would otherwise rebuild
    them, only to drop them."""
    drop_vector_graphs(conn)
    conn.execute(f"ALTER TABLE cell_vectors {VEC_KEY_COLUMN}, ADD COLUMN canonical BOOLEAN NOT NULL DEFAULT false")
    conn.execute("UPDATE cell_vectors SET canonical = true WHERE cell_id IN ("
                 "SELECT DISTINCT ON (model, dim, vec_key) cell_id FROM cell_vectors ORDER BY model, dim, vec_key, cell_id)")
    vector_key_indexes(conn)
    conn.execute("CREATE TRIGGER cell_vectors_inserted BEFORE INSERT ON cell_vectors"
                 " FOR EACH ROW EXECUTE FUNCTION ampkit_vector_inserted()")


GRAPH_BUILD_MEMORY_MB = 1024  # maintenance_work_mem while a migration builds the graphs
VEC_KEY_COLUMN = "ADD COLUMN vec_key UUID NOT NULL GENERATED ALWAYS AS (md5(embedding::text)::uuid) STORED"


def vector_key_indexes(conn: psycopg.Connection) -> None:
    """The indexes copies of a vector and its canonical row are found by, and each (model,
    width)'s graph (migrations 15 and 17)."""
    conn.execute("CREATE INDEX cell_vectors_twins ON cell_vectors (vec_key, model, dim) INCLUDE (cell_id)")
    # A vector's canonical row, found from any copy: an owner's search ranks its own cells
    # through their canonical rows (the graph's, for a walk): without this index, a scan of
    # every copy, which would dominate the dense leg.
    conn.execute("CREATE INDEX cell_vectors_canonical ON cell_vectors (vec_key, model, dim) WHERE canonical")
    # An HNSW build whose graph outgrows maintenance_work_mem goes on far slower (PostgreSQL's
    # default is 64MB), so it is raised to GRAPH_BUILD_MEMORY_MB for
    # this transaction only, never lowered.
    conn.execute("SELECT set_config('maintenance_work_mem', %s, true) FROM pg_settings "
                 "WHERE name = 'maintenance_work_mem' AND setting::bigint < %s", (f"{GRAPH_BUILD_MEMORY_MB}MB", GRAPH_BUILD_MEMORY_MB * 1024))
    for model, dim in conn.execute("SELECT DISTINCT model, dim FROM cell_vectors").fetchall():
        conn.execute(vector_index_sql(model, dim))


# A cell's window: up to CONTEXT_RADIUS cells of its window class each side (insertion order),
# as in SQLite. The first placeholder of each query is the radius.
_SAME_SESSION = "p.window_class = c.window_class"
SESSION_NEIGHBOURS = f"""
SELECT x.id FROM cells c CROSS JOIN LATERAL (
    (SELECT p.id FROM cells p WHERE {_SAME_SESSION} AND p.seq < c.seq ORDER BY p.seq DESC LIMIT %s)
    UNION ALL
    (SELECT p.id FROM cells p WHERE {_SAME_SESSION} AND p.seq > c.seq ORDER BY p.seq LIMIT %s)) x
WHERE c.id = ANY(%s) AND c.window_class IS NOT NULL
"""

_WINDOWS = f"""
SELECT c.id, array_to_string(
    ARRAY(SELECT b.text FROM (SELECT p.text, p.seq FROM cells p WHERE {_SAME_SESSION} AND p.seq < c.seq
                              ORDER BY p.seq DESC LIMIT %s) b ORDER BY b.seq)
    || c.text
    || ARRAY(SELECT p.text FROM cells p WHERE {_SAME_SESSION} AND p.seq > c.seq ORDER BY p.seq LIMIT %s),
    E'\\n')
FROM cells c WHERE c.id = ANY(%s)
"""


def refresh_windows(conn: psycopg.Connection, cell_ids: Iterable[str]) -> None:
    """Rewrite the keyword-index rows (window text, tsvector, length) of these cells; ids in
    sorted order, so two transactions lock shared neighbours in the same order."""
    ids = sorted(set(cell_ids))
    if not ids:
        return
    windows = conn.execute(_WINDOWS, (CONTEXT_RADIUS, CONTEXT_RADIUS, ids)).fetchall()
    if windows:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO cell_search (cell_id, tsv, len) "
                "SELECT %s, v, (SELECT COALESCE(SUM(cardinality(u.positions)), 0) FROM unnest(v) u) "
                "FROM to_tsvector(%s::regconfig, %s) AS v "
                "ON CONFLICT (cell_id) DO UPDATE SET tsv = EXCLUDED.tsv, len = EXCLUDED.len",
                [(cid, TEXT_CONFIG, index_text(window)) for cid, window in sorted(windows)],
            )


def rebuild_keyword_index(conn: psycopg.Connection, batch_size: int = 1000) -> None:
    """Every cell's window again (migration 3)."""
    after = ""
    while True:
        ids = [r[0] for r in conn.execute("SELECT id FROM cells WHERE id > %s ORDER BY id LIMIT %s", (after, batch_size))]
        if not ids:
            return
        refresh_windows(conn, ids)
        after = ids[-1]


# The neighbours a cell had in a window class it is leaving (placeholders: class, seq, radius,
# class, seq, radius).
CLASS_NEIGHBOURS = """
(SELECT id FROM cells WHERE window_class = %s AND seq < %s ORDER BY seq DESC LIMIT %s)
UNION ALL
(SELECT id FROM cells WHERE window_class = %s AND seq > %s ORDER BY seq LIMIT %s)
"""


def rebuild_access_and_windows(conn: psycopg.Connection, batch_size: int = 1000) -> None:
    """Migration 6: patterns outside the glob grammar rewritten to match literally
    (`ampkit.glob.upgrade_stored`), every cell's window class and compiled reader patterns,
    then every window."""
    after = ""
    while True:
        rows = conn.execute(
            "SELECT id, owner_id, session_id, created_by, public, status, superseded_by, body "
            "FROM cells WHERE id > %s ORDER BY id LIMIT %s", (after, batch_size),
        ).fetchall()
        if not rows:
            break
        updates = []
        for cid, owner, session, creator, public, status, newer, body in rows:
            policy = body.setdefault("access_policy", {})
            for key in ("readable_by", "writable_by"):
                policy[key] = [upgrade_stored(p) for p in policy.get(key, [])]
            readable_by = policy["readable_by"]
            updates.append((Json(body), window_class(owner, session, creator, public, readable_by, status, newer),
                            sorted({POSTGRES.reader_pattern(p) for p in readable_by}), cid))
        with conn.cursor() as cur:
            cur.executemany("UPDATE cells SET body = %s, window_class = %s, reader_patterns = %s WHERE id = %s", updates)
        after = rows[-1][0]
    rebuild_keyword_index(conn)


def rewrite_hangul_windows(conn: psycopg.Connection) -> None:
    """Migration 8: the windows of cells with Korean text, and of their neighbours, again."""
    ids = [r[0] for r in conn.execute("SELECT id FROM cells WHERE text ~ '[가-힣]'")]
    for i in range(0, len(ids), 1000):
        chunk = ids[i : i + 1000]
        neighbours = conn.execute(SESSION_NEIGHBOURS, (CONTEXT_RADIUS, CONTEXT_RADIUS, chunk))
        refresh_windows(conn, {*chunk, *(r[0] for r in neighbours)})


def digest_texts(conn: psycopg.Connection, batch_size: int = 1000) -> None:
    """Migration 11: every cell's `text_key`, then the index on it. The index comes last
    (here, not in the migration's SQL, which runs before this step): built once over the filled
    column instead of receiving an entry from every row's UPDATE, which also lets those
    updates stay HOT (no new entry in the table's other indexes either)."""
    after = ""
    while True:
        rows = conn.execute("SELECT id, text FROM cells WHERE id > %s ORDER BY id LIMIT %s", (after, batch_size)).fetchall()
        if not rows:
            break
        with conn.cursor() as cur:
            cur.executemany("UPDATE cells SET text_key = %s WHERE id = %s", [(text_key(text), cid) for cid, text in rows])
        after = rows[-1][0]
    conn.execute("CREATE INDEX cells_text_key ON cells (owner_id, text_key)")


# Python steps that run inside a migration's transaction, after its SQL.
MIGRATION_STEPS = {3: rebuild_keyword_index, 6: rebuild_access_and_windows, 8: rewrite_hangul_windows,
                   11: digest_texts, 15: canonical_vectors, 17: narrow_vectors}
