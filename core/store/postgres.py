"""The team-scale store: PostgreSQL >= 16 with pgvector >= 0.8, through psycopg 3 and a pool.

Several stateless `ampkit serve` processes can share one database. Layout (see MIGRATIONS in
`_pg_schema`):

- `cells`: the indexed columns, the text, the rest of the cell as JSON (`body`, key order kept
  as written, like SQLite), `metadata` again as JSONB for equality filters, and the cell's
  `readable_by` patterns as anchored regular expressions compiled by `ampkit.glob`
  (`reader_patterns`) so the access filter runs inside every query: split by the database
  into `reader_literals`, those that name one agent (compared by equality), and
  `reader_globs` (matched with `~`; migration 14, `PostgresDialect.reader_matches`), and
  `text_key`, a digest of the normalised text indexed with the owner, for dedup's
  exact-duplicate lookups (`SQLStore`). A read bumps `access_count`, so cells rows are
  rewritten often; the search structures therefore live in side tables that change only when
  the text or the vector does:
- `cell_search`: the keyword leg, a `tsvector` per cell with a GIN index, ranked by Okapi
  BM25 computed in SQL (PostgreSQL's own `ts_rank_cd` has no IDF and ranks worse on LoCoMo,
  see bench/keyword_legs.py) with statistics over the cells
  the caller may see, never the whole corpus. As in SQLite, a cell's entry covers a window:
  its text plus its neighbours' of the same window class (insertion order, `cells.seq`,
  copied to `cell_search.seq`). A search without an owner (a team member, an analyst) is
  ranked from numpy arrays each server keeps, the same BM25 bit for bit, checked against
  `search_changes` at every search and patched with the rows in `search_change_rows`
  (`_pg_keyword`);
- `cell_vectors`: one untyped `vector` per cell plus its model name and dimension. Each
  (model, dimension) gets its own partial HNSW cosine index over `embedding::vector(dim)`,
  created the first time a vector of that model is written, so any embedder works and
  switching models never needs a migration. A vector ending in a block of 128 zeros (the
  default model's, for Latin text) is stored without it (`stored_vector`), so a model's
  vectors have up to two widths, and a search walks the graph of each;
- `history` (append-only) and `api_keys`.

Concurrency: `write()` is one transaction at READ COMMITTED; `tx.get` takes `SELECT ... FOR
UPDATE`, so two servers updating one cell queue on the row lock and neither update is lost.
Migrations run under an advisory lock (servers starting together do not race), and
`try_lifecycle_lock` is `pg_try_advisory_lock`, so one lifecycle run goes at a time across
every server. Connection failures (database down, restarting, pool exhausted) raise
`Unavailable`, which the server answers as 503 UNAVAILABLE; the pool checks each connection
before handing it out, so service resumes by itself when the database returns.

Pool and search settings ride on the URL and are removed before it reaches libpq:
`postgresql://user@host/db?pool_max=20&pool_timeout=5&ef_search=100` (see `_pg_url`).
Not storable, unlike SQLite: a NUL character (U+0000) in a text (PostgreSQL rejects it).
"""

from __future__ import annotations

import bisect
import builtins
import json
import select
import time
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import psycopg
from psycopg import sql
from psycopg.types.json import Json, Jsonb
from pgvector.psycopg import register_vector
from psycopg_pool import ConnectionPool, PoolTimeout

from ..bm25 import sql_plus_one_idf, sql_term_score
from ..errors import Unavailable, ValidationFailed
from ..models import MemoryCell
from ..scheduler import Scheduler, new_lock
from ..textindex import CJK_CLASS, query_terms, text_key
from ._pg_keyword import PRUNE, WideKeywordIndex
from ._pg_url import redact, split_url
from ._pg_schema import (
    CLASS_NEIGHBOURS, MIGRATION_STEPS, MIGRATIONS, SESSION_NEIGHBOURS, TEXT_CONFIG, refresh_windows,
    settle_canonical_vectors, stored_vector, stored_widths, vector_index_name, vector_index_sql, vector_key_lock,
)
from .sql import POSTGRES, compile_filter
from .sql.store import SQLStore, SQLWriteTx
from ._files import PostgresFileTx, SQLFileReads
from .base import (
    CONTEXT_RADIUS, Candidate, CellFilter, StoredVector, cell_columns,
)

# Advisory lock keys (any fixed bigints; they only need to be distinct within the database).
MIGRATION_LOCK = 0x616D706B_0001  # "ampk" + 1
LIFECYCLE_LOCK = 0x616D706B_0002
VECTOR_INDEX_LOCK = 0x616D706B_0003

KEYWORD_RANKERS = ("bm25", "ts_rank_cd")
PRUNE_EVERY = 1000  # write transactions between two prunes of search_changes (per process)
# A reader-wide dense search whose filter admits at most this many rows ranks them all exactly
# (their rows from the wide keyword leg's arrays) instead of walking the HNSW graph: a reader
# who may read a few hundred cells of a million made the iterative scan visit thousands of
# others' vectors and then fall back to an exact scan of the table.
EXACT_ADMITTED_MAX = 5_000
# When the graph walk comes back short for a larger reader-wide filter, the exact ranking
# reads those rows by their ids instead of scanning the table under the filter, up to this
# many (past it the scan is cheaper).
FALLBACK_ADMITTED_MAX = 200_000
GRAPH_LOOK_SECONDS = 2.0  # how often a search looks again for a graph of a width it has not seen

# The query's words go through the same parser as the indexed text (stemming, stop words);
# the resulting lexemes are OR-ed, as the FTS5 query is. Placeholders: config, query text,
# then the filter's, then k.
_TS_RANK_CD = """
WITH q AS (SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery AS tsq
           FROM unnest(tsvector_to_array(to_tsvector(%s::regconfig, %s))) AS lexeme)
SELECT s.cell_id, ts_rank_cd(s.tsv, q.tsq, 1) AS score
FROM q, cell_search s JOIN cells c ON c.id = s.cell_id
WHERE s.tsv @@ q.tsq AND {where} ORDER BY score DESC, s.cell_id LIMIT %s
"""

# Okapi BM25 in SQL, with its statistics taken over the cells the filter admits (the caller's
# readable scope), never the whole corpus: number of documents and mean length from `scope`,
# document frequencies from the matches themselves. Term frequency comes from the tsvector's
# positions, document length from cell_search.len. The per-document sum runs in lexeme order,
# so equal inputs give bit-identical scores. Placeholders: the query's lexemes, the filter's,
# the scope's N and mean length (`_BM25_SCOPE`, kept per filter until the data changes), k.
# Both join a window to its cell by seq (equal in both tables): a wide reader's filter is then
# read from the narrow `cells_read_rule` index rather than the cells' rows (migration 13).
_BM25_SCOPE = """SELECT COUNT(*)::float8 AS n, GREATEST(COALESCE(AVG(s.len), 1), 1)::float8 AS avgdl
FROM cell_search s JOIN cells c ON c.seq = s.seq WHERE {where}"""
_BM25 = f"""
WITH weights AS (SELECT * FROM unnest(%s::text[]) AS w(lexeme)),
matches AS MATERIALIZED (  -- each match's tsvector cut down to the query's lexemes (setweight marks them, ts_filter keeps them)
    SELECT s.cell_id, ts_filter(setweight(s.tsv, 'A', (SELECT array_agg(lexeme) FROM weights)), '{{{{a}}}}') AS hits, s.len
    FROM cell_search s JOIN cells c ON c.seq = s.seq
    WHERE s.tsv @@ (SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery FROM weights) AND {{where}}),
terms AS (SELECT m.cell_id, m.len, u.lexeme, cardinality(u.positions) AS tf FROM matches m CROSS JOIN LATERAL unnest(m.hits) AS u),
scope AS (SELECT %s::float8 AS n, %s::float8 AS avgdl),
idf AS (SELECT t.lexeme, {sql_plus_one_idf("scope.n", "COUNT(*)")} AS idf
        FROM terms t CROSS JOIN scope GROUP BY t.lexeme, scope.n)
SELECT t.cell_id,
       SUM({sql_term_score("i.idf", "t.tf", "t.len", "scope.avgdl")}
           ORDER BY t.lexeme) AS score
FROM terms t JOIN idf i ON i.lexeme = t.lexeme CROSS JOIN scope
GROUP BY t.cell_id ORDER BY score DESC, t.cell_id LIMIT %s
"""
_LEXEMES = "SELECT DISTINCT unnest(tsvector_to_array(to_tsvector(%s::regconfig, %s)))"

_CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout)


def _one(cursor: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    """The row of a query that always returns one (an aggregate, a function call)."""
    row = cursor.fetchone()
    assert row is not None
    return row


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


@contextmanager
def _unavailable_on_connection_error(what: str) -> Iterator[None]:
    try:
        yield
    except _CONNECTION_ERRORS as exc:
        raise Unavailable(f"PostgreSQL is unavailable ({what}): {_first_line(exc)}") from exc
    except psycopg.DataError as exc:
        if POSTGRES.is_unstorable_text(exc):  # the same 422 SQLite's store gives (ampkit.store.sql)
            raise ValidationFailed("text must not contain NUL (\\u0000)") from exc
        raise


# ------------------------------------------------------------------ rows
def check_idle_connection(conn: psycopg.Connection) -> None:
    """The pool's check of a connection it hands out: a round trip (psycopg_pool's
    `check_connection`) only when the idle connection's socket has something to read. A server
    that ends a connection (a restart, a crash, `pg_terminate_backend`) says so or closes the
    socket, which makes it readable; a healthy idle connection has nothing to read. A round
    trip on every checkout was a visible share of a single create's time."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    if _readable(conn.fileno()):  # a goodbye, an EOF, or a notice: ask the server
        ConnectionPool.check_connection(conn)


def _readable(fd: int) -> bool:
    if hasattr(select, "poll"):  # poll, not select: a busy server's descriptors pass 1024
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))  # POLLHUP and POLLERR count too
    return bool(select.select([fd], [], [], 0)[0])


def cell_to_row(cell: MemoryCell) -> dict[str, Any]:
    columns, body = cell_columns(cell)
    return {
        **columns,
        "reader_patterns": sorted({POSTGRES.reader_pattern(p) for p in cell.access_policy.readable_by}),
        "metadata": Jsonb(body["content"].get("metadata") or {}),
        "body": Json(body),
        "text_key": text_key(columns["text"]),  # dedup's exact-duplicate probe (migration 11)
    }


def as_vector(vector: Any) -> np.ndarray:
    return np.asarray(vector, dtype=np.float32).ravel()


def filter_sql(flt: CellFilter, alias: str = "c") -> tuple[sql.Composable, list[Any]]:
    """WHERE clause (without the keyword) for a CellFilter (the one compiler, PostgreSQL's spelling)."""
    where, params = compile_filter(flt, POSTGRES, alias)
    return sql.SQL(where), params  # compiled from our own fragments: values are parameters


def sql_quote(text: str) -> str:
    """`text` as PostgreSQL prints a string literal (in pg_indexes.indexdef)."""
    return "'" + text.replace("'", "''") + "'"


class _PostgresWriteTx(PostgresFileTx, SQLWriteTx):
    dialect = POSTGRES

    def __init__(self, conn: psycopg.Connection, store: "PostgresStore"):
        super().__init__(conn)
        self.store = store
        self._dirty_windows: set[str] = set()
        # Vector rows replaced (their new keys are read at flush) and the keys they had, or
        # that rows about to be deleted have: `settle_canonical_vectors` gives each vector a
        # canonical row again. (A new cell's row chooses its own, in the insert's trigger.)
        self._vectors_written: set[str] = set()
        self._vector_keys: set[tuple[str, int, Any]] = set()
        self.graphs_made: set[str] = set()  # HNSW indexes made here: known to exist once committed
        self.windows_rewritten = 0  # keyword rows this transaction rewrote (`WideKeywordIndex.rows_written`)

    def _lock_key(self, owner_id: str, key: str) -> None:
        # Concurrent writers of one (owner, key) take turns on a transaction-scoped lock, so
        # the second sees the first's cell instead of tripping the unique index.
        self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (json.dumps([owner_id, key]),))

    def _write_vector(self, cell_id: str, vector: Optional[StoredVector], new_cell: bool = False) -> None:
        if vector is None:
            return
        whole = as_vector(vector.vector)
        stored = stored_vector(whole)
        dim = stored.size
        self.store._ensure_vector_index(self.conn, vector.model, dim, self.graphs_made)
        if not new_cell:
            self._note_vector_key(cell_id)
            self._vectors_written.add(cell_id)
        self.conn.execute(
            "INSERT INTO cell_vectors (cell_id, model, dim, embedding) VALUES (%s, %s, %s, %s::vector) "
            "ON CONFLICT (cell_id) DO UPDATE SET model = EXCLUDED.model, dim = EXCLUDED.dim, embedding = EXCLUDED.embedding",
            (cell_id, vector.model, dim, stored),
        )

    def _touch(self, cell_id: str) -> None:
        """Mark this cell's keyword window, and its session neighbours' windows, for rewriting
        (the neighbours are looked up at flush time, in one query for the whole transaction)."""
        self._dirty_windows.add(cell_id)

    def flush(self) -> None:
        """Rewrite the marked windows once, just before COMMIT (a batch of turns of one
        session rewrites each window once, not once per turn); settle the canonical rows of
        the vectors this transaction replaced or removed."""
        if self._dirty_windows:
            neighbours = self.conn.execute(SESSION_NEIGHBOURS, (CONTEXT_RADIUS, CONTEXT_RADIUS, list(self._dirty_windows)))
            rewritten = self._dirty_windows | {r[0] for r in neighbours}
            refresh_windows(self.conn, rewritten)
            self.windows_rewritten += len(rewritten)
        self._dirty_windows.clear()
        if self._vectors_written:
            self._vector_keys.update(self.conn.execute(
                "SELECT model, dim, vec_key FROM cell_vectors WHERE cell_id = ANY(%s)", (list(self._vectors_written),)).fetchall())
        settle_canonical_vectors(self.conn, self._vector_keys)
        self._vectors_written.clear()
        self._vector_keys.clear()

    def insert(self, cell: MemoryCell, vector: Optional[StoredVector] = None) -> None:
        row = cell_to_row(cell)
        self.conn.execute(
            sql.SQL("INSERT INTO cells ({}) VALUES ({})").format(
                sql.SQL(",").join(map(sql.Identifier, row)), sql.SQL(",").join(sql.Placeholder() * len(row))
            ),
            list(row.values()),
        )
        self._touch(cell.id)
        self._write_vector(cell.id, vector, new_cell=True)
        if vector is None and self.store.embed_queue:
            self._queue(cell.id)

    def _note_vector_key(self, cell_id: str) -> None:
        """The key of the cell's vector row as it is now, locked (before a replace or a delete)."""
        self._vector_keys.update((m, d, v) for m, d, v, _ in self.conn.execute(
            f"SELECT model, dim, vec_key, {vector_key_lock('model', 'dim', 'vec_key')} FROM cell_vectors WHERE cell_id = %s",
            (cell_id,)).fetchall())

    def _queue(self, cell_id: str) -> None:
        self.conn.execute("INSERT INTO embed_queue (cell_id) VALUES (%s) ON CONFLICT (cell_id) DO NOTHING", (cell_id,))

    def set_vector(self, cell_id: str, vector: StoredVector) -> None:
        self._write_vector(cell_id, vector)
        self.conn.execute("DELETE FROM embed_queue WHERE cell_id = %s", (cell_id,))

    def update(self, cell: MemoryCell, vector: Optional[StoredVector] = None) -> None:
        row = cell_to_row(cell)
        cols = [k for k in row if k != "id"]
        # The CTE reads the row as it was before the UPDATE: re-index only when the text or the
        # window class (policy, status, session...) moved; a cell leaving a class also
        # rewrites the windows of the neighbours it had there.
        changed = self.conn.execute(
            sql.SQL("WITH prev AS (SELECT text, window_class FROM cells WHERE id = %s) "
                    "UPDATE cells SET {} WHERE id = %s RETURNING (SELECT text FROM prev) IS DISTINCT FROM text, "
                    "(SELECT window_class FROM prev), seq").format(
                sql.SQL(",").join(sql.SQL("{} = %s").format(sql.Identifier(k)) for k in cols)
            ),
            [cell.id, *(row[k] for k in cols), cell.id],
        ).fetchone()
        if changed is not None:
            text_moved, old_class, seq = changed
            if old_class != row["window_class"] and old_class is not None:
                left = self.conn.execute(CLASS_NEIGHBOURS, (old_class, seq, CONTEXT_RADIUS, old_class, seq, CONTEXT_RADIUS))
                self._dirty_windows.update(r[0] for r in left)
            if text_moved or old_class != row["window_class"]:
                self._touch(cell.id)
            if text_moved and vector is None and self.store.embed_queue:
                self._queue(cell.id)
        self._write_vector(cell.id, vector)

    def _forget(self, cell_id: str) -> None:
        # Erasure: its text leaves its neighbours' windows too (found now, while it exists);
        # the row's delete cascades to its keyword entry and its vector.
        neighbours = self.conn.execute(SESSION_NEIGHBOURS, (CONTEXT_RADIUS, CONTEXT_RADIUS, [cell_id])).fetchall()
        self._dirty_windows.update(r[0] for r in neighbours)
        self._note_vector_key(cell_id)  # if it was its vector's canonical row, a copy takes over
        self._vectors_written.discard(cell_id)


class PostgresStore(SQLFileReads, SQLStore):
    backend = "postgresql"
    dialect = POSTGRES
    PARAM = POSTGRES.param  # _files.SQLFileReads
    MIGRATIONS = MIGRATIONS
    MIGRATION_STEPS = MIGRATION_STEPS
    KEYWORD_RANKERS = KEYWORD_RANKERS

    def __init__(self, url: str, *, pool_min: int = 1, pool_max: int = 10, pool_timeout: float = 5.0,
                 ef_search: int = 100, keyword_ranker: str = "bm25", prepare_threshold: Optional[int] = 5,
                 keyword_cache_mb: int = 512, keyword_warm_inline: bool = False, approximate: bool = True,
                 scheduler: Optional[Scheduler] = None):
        self.conninfo, from_url = split_url(url)
        # Runs the keyword arrays' warm-up loop (the composition root's, or the store's own).
        self.scheduler = scheduler or Scheduler()
        self.display_url = redact(self.conninfo)
        self.pool_min = from_url.get("pool_min", pool_min)
        self.pool_max = from_url.get("pool_max", pool_max)
        self.pool_timeout = from_url.get("pool_timeout", pool_timeout)
        self.ef_search = from_url.get("ef_search", ef_search)
        # False: the dense leg never walks the HNSW graph, which holds every cell's vector
        # (`approximate_search` off: docs/security.md, "Approximate search").
        self.approximate = from_url.get("approximate", approximate)
        self.prepare_threshold = from_url.get("prepare_threshold", prepare_threshold)
        self.keyword_ranker = from_url.get("keyword_ranker", keyword_ranker)
        if self.keyword_ranker not in KEYWORD_RANKERS:
            raise ValueError(f"keyword_ranker must be one of {', '.join(KEYWORD_RANKERS)}")
        # The wide keyword leg's arrays (`_pg_keyword`): up to keyword_cache_mb of the lexemes' rows
        # and as much again of the readers' term scores; keyword_cache_mb=0 ranks every search in SQL.
        self.keyword_cache_mb = from_url.get("keyword_cache_mb", keyword_cache_mb)
        self.wide_keywords = (WideKeywordIndex(self.keyword_cache_mb * 1024 * 1024, TEXT_CONFIG, self._connection,
                                               warm_inline=keyword_warm_inline, scheduler=self.scheduler)
                              if self.keyword_cache_mb > 0 else None)
        self._writes = 0  # write transactions of this process: every PRUNE_EVERY-th prunes search_changes
        self._pool: Optional[ConnectionPool] = None
        self._vector_indexes: set[str] = set()  # the graphs known to exist (committed; `_graph_widths`)
        self._graphs_looked: dict[str, float] = {}  # model -> when its unseen graphs were last looked for
        # (snapshot, {filter: (valid-from time, N, mean length)}, [sorted expiry times]): `_keyword_scope`
        self._scope_lock = new_lock()
        self._scope_cache: tuple[str, dict[tuple[str, str, bool], tuple[float, float, float]], builtins.list[builtins.list[float]]] = ("", {}, [])

    # ------------------------------------------------------------ connections
    @staticmethod
    def _configure(conn: psycopg.Connection) -> None:
        conn.execute("SET TIME ZONE 'UTC'")
        register_vector(conn)  # numpy arrays travel as binary vectors

    def open(self) -> None:
        if self._pool is not None:  # already open (`ampkit serve` hands its checked store to the app)
            return
        self._check_reachable()
        self.migrate()  # first, on its own connection: the pool's connections need the vector type
        if self.wide_keywords is not None:
            self.wide_keywords.open()
        self._pool = ConnectionPool(
            self.conninfo,
            min_size=self.pool_min,
            max_size=max(self.pool_max, self.pool_min),
            timeout=self.pool_timeout,
            kwargs={"autocommit": True, "prepare_threshold": self.prepare_threshold},
            configure=self._configure,
            # Check each connection as it is handed out: after a database restart the stale
            # ones are replaced instead of failing the next request.
            check=check_idle_connection,
            open=False,
            name="ampkit",
        )
        try:
            self._pool.open(wait=True, timeout=max(self.pool_timeout, 5.0))
        except BaseException:
            self._pool.close()
            self._pool = None
            raise

    def _check_reachable(self) -> None:
        """One plain connection first, so a wrong URL fails with libpq's own words."""
        try:
            psycopg.connect(self.conninfo, connect_timeout=5).close()
        except psycopg.Error as exc:
            reason = _first_line(exc).removeprefix("connection is bad: ")
            raise Unavailable(f"PostgreSQL is unreachable: {reason}") from exc

    def close(self) -> None:
        if self.wide_keywords is not None:
            self.wide_keywords.close()
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    @contextmanager
    def _connection(self, what: str = "query") -> Iterator[psycopg.Connection]:
        if self._pool is None:
            raise Unavailable("store is not open")
        with _unavailable_on_connection_error(what):
            with self._pool.connection() as conn:
                yield conn

    def _query(self, query: Any, params: Sequence[Any] = ()) -> builtins.list[tuple]:
        with self._connection() as conn:
            return conn.execute(query, params).fetchall()

    # ------------------------------------------------------------ migrations (the loop: SQLStore)
    def _applied_versions(self) -> Optional[set[int]]:
        self._check_reachable()
        with psycopg.connect(self.conninfo) as conn:
            if not _one(conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL"))[0]:
                return None
            return {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}

    @contextmanager
    def _migration_connection(self) -> Iterator[psycopg.Connection]:
        """Its own connection (the pool's connections need the vector type, which migration 1
        creates), under an advisory lock: servers that start together take turns, the first
        applies, the others then find nothing left to do."""
        with _unavailable_on_connection_error("migrations"), psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
            try:
                yield conn
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))

    @contextmanager
    def _migration_transaction(self, conn: psycopg.Connection, version: int, name: str) -> Iterator[None]:
        try:
            with conn.transaction():
                yield
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.FeatureNotSupported) as exc:
            raise Unavailable(
                f"migration {version} ({name}) failed: {_first_line(exc).rstrip('.')}. ampkit needs pgvector >= 0.8 "
                "and the right to CREATE EXTENSION vector once (or an administrator runs it first)"
            ) from exc

    def _ensure_vector_index(self, conn: psycopg.Connection, model: str, dim: int, made: set[str]) -> None:
        """A partial HNSW cosine index per (model, dimension), made on the first such vector
        (its name goes into `made`, and into `_vector_indexes` when the transaction commits)."""
        name = vector_index_name(model, dim)
        if name in self._vector_indexes or name in made:
            return
        # Transaction-scoped lock: two servers creating the same index take turns.
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (VECTOR_INDEX_LOCK,))
        conn.execute(vector_index_sql(model, dim))
        made.add(name)

    # ------------------------------------------------------------ writes
    @contextmanager
    def _write_transaction(self) -> Iterator[_PostgresWriteTx]:
        with self._connection("write") as conn:
            # Pipeline mode: statements whose results nobody reads (inserts, history) are sent
            # without waiting for each answer; a fetch (tx.get) syncs. Faster batch writes.
            # (It needs libpq >= 14, which psycopg[binary] bundles; older ones go one by one.)
            pipeline = conn.pipeline() if psycopg.Pipeline.is_supported() else nullcontext()
            with pipeline, conn.transaction():
                tx = _PostgresWriteTx(conn, self)
                yield tx
            self._vector_indexes |= tx.graphs_made
            if self.wide_keywords is not None:
                self.wide_keywords.rows_written(tx.windows_rewritten)
            self._writes += 1
            if self._writes % PRUNE_EVERY == 0:  # after COMMIT: its own short transaction
                with conn.transaction():
                    conn.execute(PRUNE)

    # ------------------------------------------------------------ reads
    def keyword_candidates(self, query: str, flt: CellFilter, k: int) -> builtins.list[Candidate]:
        terms = query_terms(query)
        if not terms:
            return []
        if self.keyword_ranker == "bm25" and self.wide_keywords is not None and flt.owner_id is None and flt.session_id is None:
            # A reader across owners: the same BM25 from arrays kept between searches (an
            # owner's or a session's filter admits few cells: the statement is fast there).
            with self._connection() as conn:
                return self.wide_keywords.candidates(conn, terms, flt, k)
        where, params = filter_sql(flt)
        with self._connection() as conn:
            if self.keyword_ranker == "ts_rank_cd":
                rows = conn.execute(sql.SQL(_TS_RANK_CD).format(where=where), [TEXT_CONFIG, " ".join(terms), *params, k])
            else:
                # The words go through the same parser as the indexed text (stemming, stop words).
                lexemes = [r[0] for r in conn.execute(_LEXEMES, (TEXT_CONFIG, " ".join(terms)))]
                if not lexemes:
                    return []
                n, avgdl = self._keyword_scope(conn, flt)
                if not n:
                    return []
                rows = conn.execute(sql.SQL(_BM25).format(where=where), [sorted(lexemes), *params, n, avgdl, k])
            return [Candidate(cid, float(score)) for cid, score in rows]

    def _keyword_scope(self, conn: psycopg.Connection, flt: CellFilter) -> tuple[float, float]:
        """BM25's N and mean length over the cells `flt` admits. A reader-wide filter admits
        most of the store, so this is a scan: it is kept per filter while the database
        cluster's snapshot (`pg_current_snapshot()`: which transactions have committed) stays
        the same and no cell expires in between, the way the SQLite store keys its cache on
        `PRAGMA data_version`."""
        snapshot = _one(conn.execute("SELECT pg_current_snapshot()::text"))[0]
        at = flt.not_expired_at.timestamp() if flt.not_expired_at is not None else None
        where_text, params = compile_filter(replace(flt, not_expired_at=None), POSTGRES)
        key = (where_text, repr(params), at is None)
        with self._scope_lock:
            if self._scope_cache[0] != snapshot:
                self._scope_cache = (snapshot, {}, [])
            cache = self._scope_cache
            hit = cache[1].get(key)
        if hit is not None and at is not None and at != hit[0]:
            if not cache[2]:  # the store's expiry times, sorted, once per snapshot
                cache[2].append(sorted(t.timestamp() for (t,) in conn.execute(
                    "SELECT expires_at FROM cells WHERE expires_at IS NOT NULL")))
            expiries = cache[2][0]
            if at < hit[0] or bisect.bisect_right(expiries, at) != bisect.bisect_right(expiries, hit[0]):
                hit = None  # a cell expired in between (or the clock went back)
        if hit is None:
            where, params = filter_sql(flt)
            n, avgdl = _one(conn.execute(sql.SQL(_BM25_SCOPE).format(where=where), params))
            hit = (at or 0.0, float(n), float(avgdl))
            with self._scope_lock:
                if len(cache[1]) >= 256:
                    cache[1].clear()
                cache[1][key] = hit
        return hit[1], hit[2]

    def vector_query(self, vector: Any, model: str, flt: CellFilter, k: int, exact: bool = False,
                     among: Optional[Sequence[int]] = None,
                     graphs: Optional[Sequence[int]] = None) -> tuple[sql.Composed, builtins.list[Any]]:
        """The dense leg's SQL (public so tests and operators can EXPLAIN it). `among`: only
        these rows (seqs; the filter still applies), ranked exactly. `graphs`: the widths whose
        graphs a walk goes through (`_graph_widths`; default: every width the model has)."""
        query_vector = as_vector(vector)
        where, params = filter_sql(flt)
        if among is not None:
            exact = True
            where = sql.SQL("{} AND c.seq = ANY(%s)").format(where)
            params = [*params, list(among)]
        # A model's rows have up to two widths (`stored_widths`: the last block of zeros is not
        # stored). A row of width w is compared with the query's first w components: the dot
        # product is the whole one, and the cosine is put right for the part of the query's
        # length those components hold (`scale`: 1 when the query's own block is zero, as for
        # any Latin text with the default model). Model and widths are literals so the planner
        # can match each width's partial HNSW index.
        norm = float(np.linalg.norm(query_vector))
        widths = []
        for width in stored_widths(query_vector.size):
            part = query_vector[:width]
            scale = float(np.linalg.norm(part)) / norm if norm > 0 else 1.0
            typed = sql.SQL("vector({})").format(sql.Literal(width))
            distance = (sql.SQL("((v.embedding::{typed}) <=> %s::{typed})").format(typed=typed) if scale > 0
                        else sql.SQL("1.0::float8"))  # (none of the query in these components: a cosine of 0)
            if 0 < scale < 1 - 1e-7:
                distance = sql.SQL("(1 - {s} + {s} * {d})").format(s=sql.Literal(scale), d=distance)
            widths.append((width, typed, part, scale, distance))
        if exact:
            # One scan of the cells the filter admits, each compared at its own width; ordered
            # by an expression no index has: the filters pick the rows first, then every
            # distance is computed. Ties break by id before the LIMIT (identical texts have
            # equal distances): which of them make the top k must not depend on the plan or on
            # where rows lie in the table.
            cases, case_params = [], []
            for width, _, part, scale, distance in widths:
                cases.append(sql.SQL("WHEN {w} THEN {d}").format(w=sql.Literal(width), d=distance))
                case_params += [part] if scale > 0 else []
            query = sql.SQL(
                "WITH hits AS MATERIALIZED ("
                " SELECT v.cell_id, CASE v.dim {cases} END AS distance"
                " FROM cell_vectors v JOIN cells c ON c.id = v.cell_id"
                " WHERE v.model = {model} AND v.dim IN ({dims}) AND {where}"
                " ORDER BY 2, v.cell_id LIMIT %s)"
                " SELECT cell_id, distance FROM hits ORDER BY distance, cell_id"
            ).format(cases=sql.SQL(" ").join(cases), model=sql.Literal(model),
                     dims=sql.SQL(", ").join(sql.Literal(w) for w, *_ in widths), where=where)
            return query, [*case_params, *params, k]
        # The graph holds one canonical row per distinct vector (migration 15): a walk joins
        # each row it reaches to every cell with that vector (`t`, itself included) and filters
        # those. Iterative scans keep walking until k rows pass the filters (access, owner,
        # status...), so a selective filter does not starve the result; relaxed order is then
        # put right by the outer ORDER BY. Each width's index is walked for k rows.
        walks, walk_params = [], []
        for width, typed, part, scale, distance in widths:
            if scale == 0 or (graphs is not None and width not in graphs):
                continue  # (no graph, or every such row at a cosine of 0: the exact fallback's)
            walks.append(sql.SQL(
                "(SELECT t.cell_id, {distance} AS distance"
                " FROM cell_vectors v JOIN cell_vectors t ON t.vec_key = v.vec_key AND t.model = v.model AND t.dim = v.dim"
                " JOIN cells c ON c.id = t.cell_id"
                " WHERE v.model = {model} AND v.dim = {width} AND v.canonical AND {where}"
                " ORDER BY (v.embedding::{typed}) <=> %s::{typed} LIMIT %s)"
            ).format(distance=distance, model=sql.Literal(model), width=sql.Literal(width), where=where, typed=typed))
            walk_params += [part, *params, part, k]
        if not walks:  # nothing to walk: a query that answers nothing (the exact fallback follows)
            return sql.Composed([sql.SQL("SELECT NULL::text, NULL::float8 WHERE false")]), []
        query = sql.SQL(
            "WITH hits AS MATERIALIZED ({walks})"
            " SELECT cell_id, distance FROM hits ORDER BY distance, cell_id LIMIT %s"
        ).format(walks=sql.SQL(" UNION ALL ").join(walks))
        return query, [*walk_params, k]

    def vector_candidates(self, vector: Any, model: str, flt: CellFilter, k: int) -> builtins.list[Candidate]:
        with self._connection() as conn:
            with conn.transaction():
                rows: builtins.list[Any] = []
                admitted = self._wide_admitted(conn, flt)
                if admitted is not None and admitted.size <= EXACT_ADMITTED_MAX:
                    return [Candidate(cid, 1.0 - float(distance)) for cid, distance
                            in conn.execute(*self.vector_query(vector, model, flt, k, among=admitted.tolist()))]
                graphs = self._graph_widths(conn, model, int(np.asarray(vector).size))
                if self.approximate and graphs:  # off: never walk a graph (it holds every cell's vector)
                    self.set_search_options(conn, k)
                    rows = conn.execute(*self.vector_query(vector, model, flt, k, graphs=graphs)).fetchall()
                if len(rows) < k:
                    # Off, or short: fewer than k admissible vectors exist, or the walk gave up
                    # (hnsw.max_scan_tuples) or ran out of vectors it can reach before k passed
                    # the filter. Exact never comes back short.
                    among = admitted.tolist() if admitted is not None and admitted.size <= FALLBACK_ADMITTED_MAX else None
                    rows = conn.execute(*self.vector_query(vector, model, flt, k, exact=True, among=among)).fetchall()
        return [Candidate(cid, 1.0 - float(distance)) for cid, distance in rows]

    def _graph_widths(self, conn: psycopg.Connection, model: str, dim: int) -> builtins.list[int]:
        """The widths of `model`'s vectors that have a graph (an index: made with the first
        vector of that width, `_ensure_vector_index`), so a walk never plans one that has none
        (a second walk would add its planning to every search). A graph, once seen, stays; one not
        seen is looked for again at most every GRAPH_LOOK_SECONDS: another server may have
        made it (with the first vector of its width: `AMPKIT_EMBEDDER=static` meeting CJK
        text), and until this one looks, its walks miss those rows (its exact rankings do
        not)."""
        names = {width: vector_index_name(model, width) for width in stored_widths(dim)}
        unseen = [name for name in names.values() if name not in self._vector_indexes]
        now = time.monotonic()
        if unseen and now - self._graphs_looked.get(model, -GRAPH_LOOK_SECONDS) >= GRAPH_LOOK_SECONDS:
            self._vector_indexes.update(name for (name,) in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND indexname = ANY(%s)", (unseen,)))
            self._graphs_looked[model] = now
        return [width for width, name in names.items() if name in self._vector_indexes]

    def _wide_admitted(self, conn: psycopg.Connection, flt: CellFilter) -> Optional[np.ndarray]:
        """For a reader-wide filter, the rows (seqs) it admits, as the wide keyword leg holds
        them, in this transaction's snapshot (which this makes REPEATABLE READ); None for an
        owner's or a session's filter (an index narrows those) or without the keyword arrays."""
        if self.wide_keywords is None or flt.owner_id is not None or flt.session_id is not None:
            return None
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        return self.wide_keywords.admitted_rows(conn, flt)

    def set_search_options(self, conn: psycopg.Connection, k: int) -> None:
        """Transaction-local HNSW settings (local, so they also work behind pgbouncer)."""
        conn.execute(
            "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true), set_config('hnsw.ef_search', %s, true)",
            (str(min(1000, max(self.ef_search, k))),),  # pgvector caps ef_search at 1000
        )

    def has_vectors(self, model: str, flt: CellFilter) -> bool:
        # Shortcut: the model's HNSW index is made with its first vector; without one (an
        # English store) no vector of it exists anywhere.
        indexed = self._query("SELECT 1 FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'cell_vectors' "
                              "AND position(%s in indexdef) > 0",
                              ("model = " + sql_quote(model),))
        if not indexed:
            return False
        where, params = filter_sql(flt)
        return bool(self._query(sql.SQL(
            "SELECT 1 FROM cells c JOIN cell_vectors v ON v.cell_id = c.id WHERE {where} AND v.model = %s LIMIT 1"
        ).format(where=where), [*params, model]))

    def vector_index_state(self) -> dict[str, Any]:
        """For /health: the wide keyword leg's arrays (`keyword_warmup`); the dense leg's index
        is pgvector's, in the database."""
        return {"keyword_warmup": self.wide_keywords.state() if self.wide_keywords is not None else "none",
                **({} if self.approximate else {"approximate": "off"})}

    def vector_models(self, cell_ids: Sequence[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(cell_ids))
        if not ids:
            return {}
        return dict(self._query("SELECT cell_id, model FROM cell_vectors WHERE cell_id = ANY(%s)", (ids,)))

    @contextmanager
    def try_lifecycle_lock(self) -> Iterator[bool]:
        """A session advisory lock on one pooled connection: one run at a time across servers.
        If that connection dies mid-run, PostgreSQL releases the lock with it."""
        with self._connection("lifecycle lock") as conn:
            got = bool(_one(conn.execute("SELECT pg_try_advisory_lock(%s)", (LIFECYCLE_LOCK,)))[0])
            try:
                yield got
            finally:
                if got:
                    conn.execute("SELECT pg_advisory_unlock(%s)", (LIFECYCLE_LOCK,))

    def claim_scheduled_lifecycle(self, interval_seconds: float) -> bool:
        """One atomic upsert: the first server whose timer fires in an interval claims it; the
        others see a recent `last_run` and skip. (A tenth of the interval is allowed for
        timers that drift.) The run itself still takes `try_lifecycle_lock`."""
        rows = self._query(
            "INSERT INTO lifecycle_schedule (name, last_run) VALUES ('scheduled', now()) "
            "ON CONFLICT (name) DO UPDATE SET last_run = now() "
            "WHERE lifecycle_schedule.last_run <= now() - make_interval(secs => %s) RETURNING 1",
            (0.9 * interval_seconds,),
        )
        return bool(rows)

    def claim_scheduled_job(self, name: str, interval_seconds: float) -> bool:
        """The same atomic upsert as the lifecycle's, on the job's own row."""
        rows = self._query(
            "INSERT INTO lifecycle_schedule (name, last_run) VALUES (%s, now()) "
            "ON CONFLICT (name) DO UPDATE SET last_run = now() "
            "WHERE lifecycle_schedule.last_run <= now() - make_interval(secs => %s) RETURNING 1",
            (f"job:{name}", 0.9 * interval_seconds),
        )
        return bool(rows)

    def _execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        with self._connection("write") as conn:  # autocommit: durable when it returns
            return conn.execute(statement, params).rowcount

    def stats(self) -> dict[str, Any]:
        cells, size = self._query("SELECT (SELECT COUNT(*) FROM cells), pg_database_size(current_database())")[0]
        return {"backend": self.backend, "url": self.display_url, "cells": cells, "bytes": size}

    # ------------------------------------------------------------ embedding queue
    def embedding_queue_depth(self) -> int:
        return int(self._query("SELECT COUNT(*) FROM embed_queue")[0][0])

    def queued_embeddings(self, limit: int) -> builtins.list[tuple[str, str]]:
        return [(cid, text) for cid, text in self._query(
            "SELECT q.cell_id, c.text FROM embed_queue q JOIN cells c ON c.id = q.cell_id ORDER BY q.seq LIMIT %s", (limit,))]

    def queue_stale_embeddings(self, model: str, batch_size: int = 10000, cjk_model: Optional[str] = None) -> int:
        if cjk_model is None:
            wanted, params = sql.SQL("%s"), [model]
        else:
            wanted, params = sql.SQL("(CASE WHEN c.text ~ %s THEN %s ELSE %s END)"), [CJK_CLASS, cjk_model, model]
        # Batch by batch of ids, each bounded by its last id in SQL: the ids never travel to
        # Python and back (as array parameters they cost CPU on a large store at every start).
        queued, after = 0, ""
        while True:
            with self._connection("write") as conn, conn.transaction():
                row = conn.execute("SELECT MAX(id) FROM (SELECT id FROM cells WHERE id > %s ORDER BY id LIMIT %s) b",
                                   (after, batch_size)).fetchone()
                last = row[0] if row is not None else None  # (an aggregate: always one row)
                if last is None:
                    return queued
                queued += conn.execute(sql.SQL(
                    "INSERT INTO embed_queue (cell_id) SELECT c.id FROM cells c LEFT JOIN cell_vectors v ON v.cell_id = c.id "
                    "WHERE c.id > %s AND c.id <= %s AND v.model IS DISTINCT FROM {wanted} ORDER BY c.seq "
                    "ON CONFLICT (cell_id) DO NOTHING"
                ).format(wanted=wanted), (after, last, *params)).rowcount
                after = last

