"""The PostgreSQL keyword leg for a reader across owners: BM25 from numpy arrays kept between
queries, invalidated from the database.

A team member's or an analyst's filter admits a large part of the store, and the query words
of everyday memories match a large part of it too: the one-statement BM25 (`postgres._BM25`)
joins every global match to `cells` to apply the filter, row by row, which is most of its
time (EXPLAIN ANALYZE shows it). Here the same answer comes from arrays:

- per filter (its time bound aside), the admitted rows (`cells.seq`, sorted), their window
  lengths, and the expiry of the few that expire; per expiry interval a view of them with
  BM25's N and mean length (the mean computed by PostgreSQL's own numeric AVG arithmetic, so
  the bits are the statement's);
- per lexeme, every row holding it (`cell_search.seq`) and its term frequency, whatever the
  filter;
- per view and lexeme, the lexeme's BM25 term score at each admitted row holding it.

A query intersects, adds the lexemes' scores in the database's lexeme order (as the
statement's `SUM(... ORDER BY lexeme)` does), breaks ties by cell id: equal scores, bit for
bit (`tests/test_keyword_bm25.py` compares them with the one statement).

Stateless servers: nothing here is believed past what the database says. Every transaction
that changes what a keyword search reads (a window, a length, a column the filter looks at)
leaves one row in `search_changes` (triggers, PostgreSQL migration 10, whatever the writer)
and one per changed window in `search_change_rows` (its `cell_search.seq`, migration 12);
each wide search runs in a REPEATABLE READ transaction and first asks whether a change is
visible in its snapshot that was not in the snapshot the arrays were read at (`_CHECK`).
If so, the next `_Generation` is this one's arrays patched with those rows, read in the
search's snapshot (each filter's admitted rows among them, their lexemes' term counts): a
few small queries and copies of the touched arrays, where reading afresh is long on a large
store. A bulk change (more than PATCH_ROWS rows), a TRUNCATE, or a log pruned
past the anchor starts afresh, as a restarted server does: a search reads what the fresh
arrays lack for it (its filter's admitted rows, its query's lexemes) in its own snapshot,
and once it is answered the background warm-up reads the filters asked lately and the
frequent lexemes; no search waits for it. Snapshots are taken in the
order of this lock, so the newest one is always the anchor; a search that started under an
older generation only reads and fills that generation's arrays.
"""

from __future__ import annotations

import bisect
import threading
import time
import weakref
from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Callable, Optional

import numpy as np
import psycopg
from psycopg import sql

from ..bm25 import length_norm, plus_one_idf, term_score
from ..scheduler import Loop, Scheduler
from ._bm25 import (BytesLRU, RowPositions, SharedArrays, count_dtype, int_list, members,
                    replace_rows, row_dtype, sum_term_scores, top_k)
from .base import Candidate, CellFilter
from .sql import POSTGRES, compile_filter

# `PRUNE` removes the rows of transactions that ended before a horizon recorded at least this
# long ago, and records below which transaction it removed them (`deleted_below`): a server
# whose anchor is older (idle that long) can no longer tell what changed, and starts afresh.
PRUNE_AFTER = "1 hour"
ADMITTED_SETS = 64  # filters kept per generation (least recently used out)
# Past this many changed rows since the anchor, the arrays are read afresh rather than patched
# (a bulk import): patching costs a few small queries and a copy of each touched array.
PATCH_ROWS = 20_000
# Once this many keyword rows have changed since the anchor, the arrays are patched up to the
# database in the background (`WideKeywordIndex.rows_written`, `_others_wrote`), so the wide
# search after an import (through this server or another) neither reads them afresh nor
# patches them itself. (Patching after every small batch would slow an import down: each
# patch copies the touched lexemes' arrays.)
CATCH_UP_ROWS = 5_000
# How often the keyword thread of a server that holds arrays counts the rows changed since
# their anchor (another server's writes reach this one only through the database).
CATCH_UP_LOOK_SECONDS = 1.0

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

# The snapshot of this search; whether the arrays cannot follow it (no anchor yet, or the log
# was pruned past the anchor: start afresh); whether a change is visible in it that was not in
# the anchor's; the query's lexemes in the database's order (the order the statement sums them in).
_CHECK = """
SELECT pg_current_snapshot()::text,
       %s::text IS NULL OR (SELECT deleted_below FROM search_changes_pruned) > pg_snapshot_xmin(%s::pg_snapshot),
       EXISTS (SELECT 1 FROM search_changes
               WHERE xid >= pg_snapshot_xmin(%s::pg_snapshot) AND NOT pg_visible_in_snapshot(xid, %s::pg_snapshot)),
       ARRAY(SELECT DISTINCT l FROM unnest(tsvector_to_array(to_tsvector(%s::regconfig, %s))) AS l ORDER BY l)
"""
# The rows those changes touched (migration 12; NULL: every row, a TRUNCATE), at most `%s`.
_CHANGED_SINCE = """
SELECT seq FROM search_change_rows
WHERE xid >= pg_snapshot_xmin(%s::pg_snapshot) AND NOT pg_visible_in_snapshot(xid, %s::pg_snapshot) LIMIT %s
"""
# Those rows as one text (-1: a TRUNCATE); how many of them there are (the background look).
_CHANGED_ROWS = f"SELECT string_agg(COALESCE(seq, -1)::text, ',') FROM ({_CHANGED_SINCE}) AS changed"
_CHANGED_COUNT = f"SELECT count(*) FROM ({_CHANGED_SINCE}) AS changed"
# The admitted rows of a filter whose time bound is left out (an expiring row carries its
# expiry), as `_admitted_arrays` reads them; joined by seq, so both sides can be read from
# indexes (migration 13).
_ADMITTED_COLUMNS = """
SELECT string_agg(s.seq::text, ','), string_agg(s.len::text, ','),
       string_agg(s.seq::text, ',') FILTER (WHERE c.expires_at IS NOT NULL),
       string_agg((extract(epoch FROM c.expires_at) * 1000000)::int8::text, ',') FILTER (WHERE c.expires_at IS NOT NULL)
"""
_ADMITTED = _ADMITTED_COLUMNS + "FROM cells c JOIN cell_search s ON s.seq = c.seq WHERE {where}"
# The same among some rows (those a change touched: `%s`, an int8[] literal, which psycopg
# sends as one string rather than dumping thousands of numbers one by one), found by seq.
_ADMITTED_AMONG = _ADMITTED_COLUMNS + "FROM cell_search s JOIN cells c ON c.id = s.cell_id WHERE s.seq = ANY(%s::int8[]) AND {where}"
# Of some rows, those holding each of some lexemes (the arrays the generation holds), with
# their term frequencies, as `_FREQUENT_POSTINGS` reads them: one row a lexeme.
_TERMS_AMONG = """
SELECT u.lexeme, string_agg(s.seq::text, ','), string_agg(cardinality(u.positions)::text, ',')
FROM cell_search s CROSS JOIN LATERAL unnest(s.tsv) u
WHERE s.seq = ANY(%s::int8[]) AND u.lexeme = ANY(%s::text[]) AND u.positions IS NOT NULL
GROUP BY u.lexeme
"""
# What AVG(len) of `_BM25_SCOPE` gives (int8 sums divided as numeric), from the sum and count.
_MEAN_LENGTH = "SELECT GREATEST(COALESCE(%s::int8::numeric / NULLIF(%s::int8, 0)::numeric, 1), 1)::float8"
# Every row holding one lexeme, with its term frequency (as the statement counts it).
_POSTINGS = """
SELECT string_agg(s.seq::text, ','),
       string_agg((SELECT cardinality(u.positions) FROM unnest(ts_filter(setweight(s.tsv, 'A', ARRAY[%s]), '{a}')) u)::text, ',')
FROM cell_search s WHERE s.tsv @@ quote_literal(%s)::tsquery
"""
_IDS = "SELECT seq, cell_id FROM cell_search WHERE seq = ANY(%s)"
# For a search that reads lexemes' rows itself: the bitmap of a common word's rows stays exact
# (at the default 4 MB it turns lossy and every row of its pages is checked again).
_READ_MEMORY = "SET LOCAL work_mem = '64MB'"

PRUNE = f"""
UPDATE search_changes_pruned SET deleted_below = horizon, horizon = pg_snapshot_xmin(pg_current_snapshot()), at = now()
WHERE at <= now() - interval '{PRUNE_AFTER}';
DELETE FROM search_changes WHERE xid < (SELECT deleted_below FROM search_changes_pruned);
DELETE FROM search_change_rows WHERE xid < (SELECT deleted_below FROM search_changes_pruned);
"""


def _micros(at: datetime) -> int:
    """Microseconds since 1970 (a naive time is UTC, as the connection's time zone reads it)."""
    return ((at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)) - _EPOCH) // _MICROSECOND


_MICROSECOND = datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=timezone.utc) - _EPOCH


def _one(cursor: "psycopg.Cursor[Any]") -> tuple[Any, ...]:
    """The row of a query that always returns one (an aggregate)."""
    row = cursor.fetchone()
    assert row is not None
    return row


def _rows(values: Optional[str]) -> np.ndarray:
    """Row numbers (cells.seq) as the smallest signed type that holds them."""
    arr = int_list(values)
    return arr.astype(row_dtype(int(arr.max()))) if arr.size else arr


@dataclass
class _View:
    """The admitted rows not expired in one expiry interval, with BM25's N, mean length and
    each asked lexeme's term scores (kept in the server's `SharedArrays` under this view's serial)."""

    seqs: np.ndarray
    lengths: np.ndarray
    avgdl: float
    term_scores: SharedArrays
    serial: int = field(init=False)
    _norm: Optional[np.ndarray] = None
    _positions: RowPositions = field(init=False)

    def __post_init__(self) -> None:
        self._positions = RowPositions(self.seqs)  # its map is built at first use
        self.serial = self.term_scores.register(self)

    @property
    def n(self) -> int:
        return int(self.seqs.size)

    def norm(self) -> np.ndarray:
        """BM25's length normalisation per row, the statement's operations in its order."""
        if self._norm is None:
            self._norm = length_norm(self.lengths, self.avgdl)
        return self._norm

    def positions(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions here, mask over `seqs`) of the sorted rows this view admits."""
        return self._positions.of(seqs)

    def contribution(self, lexeme: str, postings: Callable[[str], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """(positions, the lexeme's BM25 term score at each): its document frequency is its
        admitted row count (every row holding a query lexeme is a match)."""
        key = (self.serial, lexeme)
        hit = self.term_scores.hit(key)
        if hit is not None:
            return hit
        seqs, tf = postings(lexeme)
        pos, mask = self.positions(seqs)
        tf = tf[mask]
        value = (pos, term_score(plus_one_idf(float(self.n), float(pos.size)), tf, self.norm()[pos]))
        return self.term_scores.keep(key, value)

    def scores(self, lexemes: list[str], postings: Callable[[str], tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        # The database's lexeme order: the statement's sum.
        return sum_term_scores(self.n, lexemes, lambda lexeme: self.contribution(lexeme, postings))


@dataclass
class _Admitted:
    """A filter's admitted rows (its time bound aside) and their views per expiry interval."""

    seqs: np.ndarray
    lengths: np.ndarray
    expiring: np.ndarray  # seqs of the admitted rows that expire, by `expiry`
    expiry: np.ndarray  # their expiry times (microseconds since 1970), ascending
    times: list[int]  # the distinct expiry times, ascending
    params: list[Any]  # the filter's parameters (its SQL text is its key's first half)
    views: dict[int, _View] = field(default_factory=dict)

    @classmethod
    def of(cls, seqs: np.ndarray, lengths: np.ndarray, expiring: np.ndarray, expiry: np.ndarray,
           params: list[Any]) -> "_Admitted":
        """The set, its expiring rows (in any order, with their expiry times) ordered by time."""
        by_time = np.argsort(expiry, kind="stable")
        return cls(seqs, lengths, expiring[by_time], expiry[by_time], sorted(set(expiry.tolist())), params)


class _Generation:
    """The arrays read at one anchor snapshot; when the database changes, the next generation
    is this one patched with the changed rows (`WideKeywordIndex._patched`), or read afresh.
    `warm`: the background warm-up has loaded the frequent lexemes (before, a search reads
    its query's lexemes itself, as it does a rare one's)."""

    def __init__(self, anchor: Optional[str], term_bytes: int) -> None:
        self.anchor = anchor
        self.lock = threading.Lock()
        self.admitted: OrderedDict[tuple[str, str], _Admitted] = OrderedDict()
        self.postings: BytesLRU[str] = BytesLRU(term_bytes, _held_arrays)
        self.warm = False


# The lexemes in the most windows, estimated from a sample of about SAMPLE_ROWS windows; those
# estimated in at least FREQUENT_SHARE of them are loaded in one pass by the warm-up (a rarer one
# costs a search a few milliseconds to load itself).
SAMPLE_ROWS = 20_000
FREQUENT_SHARE = 0.002
_FREQUENT = """
SELECT word, ndoc FROM ts_stat(format('SELECT tsv FROM cell_search TABLESAMPLE SYSTEM (%%s)', %s::float8))
ORDER BY ndoc DESC, word LIMIT 5000
"""
_BULK_POSTINGS = """
SELECT u.lexeme, string_agg(s.seq::text, ','), string_agg(cardinality(u.positions)::text, ',')
FROM cell_search s CROSS JOIN LATERAL unnest(ts_filter(setweight(s.tsv, 'A', %s::text[]), '{a}')) u
WHERE s.tsv @@ (SELECT string_agg(quote_literal(l), ' | ')::tsquery FROM unnest(%s::text[]) l)
GROUP BY u.lexeme
"""
# The same for the warm-up's many frequent lexemes: one pass over every window (in parallel
# where PostgreSQL plans it) rather than the index's bitmap of the rows holding any of them,
# by then nearly every row, each of whose vectors `_BULK_POSTINGS` copies twice (setweight,
# ts_filter) before unnesting it. The same arrays (an entry without positions, which
# ts_filter drops, is left out here too).
_FREQUENT_POSTINGS = """
SELECT u.lexeme, string_agg(s.seq::text, ','), string_agg(cardinality(u.positions)::text, ',')
FROM cell_search s CROSS JOIN LATERAL unnest(s.tsv) u
WHERE u.lexeme = ANY(%s::text[]) AND u.positions IS NOT NULL
GROUP BY u.lexeme
"""


def _patched_admitted(admitted: _Admitted, changed: np.ndarray, now: _Admitted) -> _Admitted:
    """A filter's admitted set after the `changed` rows, given those of them it admits now
    (`now`, read as `_ADMITTED_AMONG`). Untouched (no changed row was or is admitted), the
    same set, with its views and term scores."""
    if not now.seqs.size and not members(admitted.seqs, changed).size:
        return admitted
    seqs, lengths = _patched_rows(admitted.seqs, admitted.lengths, changed, now.seqs, now.lengths, lambda _: np.int32)
    keep = ~np.isin(admitted.expiring, changed)
    return _Admitted.of(seqs, lengths, np.concatenate([admitted.expiring[keep], now.expiring]),
                        np.concatenate([admitted.expiry[keep], now.expiry]), admitted.params)


def _patched_postings(postings: tuple[np.ndarray, np.ndarray], changed: np.ndarray,
                      now: Optional[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """A lexeme's rows and term frequencies after the `changed` rows (sorted), given those of
    them that hold it now (`now`, sorted rows and their frequencies); untouched, the same
    arrays."""
    seqs, tf = postings
    now_seqs, now_tf = now if now is not None else (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
    return _patched_rows(seqs, tf, changed, now_seqs, now_tf, count_dtype)


def _patched_rows(seqs: np.ndarray, column: np.ndarray, changed: np.ndarray, now_seqs: np.ndarray,
                  now_column: np.ndarray, column_dtype: Callable[[int], Any]) -> tuple[np.ndarray, np.ndarray]:
    """`replace_rows`, except that when every changed row is newer than the last of `seqs`
    (an import's new rows) the new ones are appended in the room after the arrays
    (`_appended`) instead of copied with them: a lexeme's rows, and a filter's admitted rows
    (copying them was most of a small patch's time, paid by each wide search during an
    import)."""
    if (now_seqs.size and seqs.size and changed[0] > seqs[-1]
            and np.can_cast(row_dtype(int(now_seqs[-1])), seqs.dtype)
            and np.can_cast(column_dtype(int(now_column.max())), column.dtype)):
        return _appended(seqs, now_seqs), _appended(column, now_column)
    return replace_rows(seqs, column, changed, now_seqs, now_column, column_dtype)


# An array grown by a patch gets this much room for the next patches' rows (otherwise each
# patch of an import copies every touched lexeme's rows).
GROWTH_ROOM = 0.25


def _appended(values: np.ndarray, more: np.ndarray) -> np.ndarray:
    """`values` followed by `more`: written into the room after `values` when its buffer has
    some (the result is a longer view of the same buffer), else copied into a new buffer with
    GROWTH_ROOM to spare. Safe because a generation's arrays are never written below their
    end, and only the newest generation is ever patched (`_begin`, under the index's lock), so
    no published array reaches into the room being written: an older generation's searches
    read only up to their own arrays' end. (A patch that failed wrote into room no one reads.)"""
    n, k = values.size, more.size
    buffer = _buffer_of(values)
    if buffer is None or buffer.size < n + k:
        buffer = np.empty(n + k + int((n + k) * GROWTH_ROOM) + 16, dtype=values.dtype)
        buffer[:n] = values
        _BUFFERS[id(buffer)] = buffer
    buffer[n:n + k] = more
    return buffer[:n + k]


# The buffers `_appended` made (by id; gone with them), so that only those are ever written past an array's end.
_BUFFERS: "weakref.WeakValueDictionary[int, np.ndarray]" = weakref.WeakValueDictionary()


def _buffer_of(values: np.ndarray) -> Optional[np.ndarray]:
    """The buffer `_appended` made that `values` is the start of, or None."""
    buffer = values.base
    if buffer is None or _BUFFERS.get(id(buffer)) is not buffer:
        return None
    return buffer if np.shares_memory(buffer[:1], values[:1]) else None


def _held_arrays(postings: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, ...]:
    """What a lexeme's arrays hold in memory, for the cache's budget: a grown one's whole buffer."""
    held = []
    for values in postings:
        buffer = _buffer_of(values)
        held.append(values if buffer is None else buffer)
    return tuple(held)


def _admitted_arrays(row: tuple[Any, ...], params: list[Any]) -> _Admitted:
    """A filter's admitted rows from the row `_ADMITTED` (or `_ADMITTED_AMONG`) returns, sorted."""
    seqs, lengths, expiring, expiry = row
    rows, lens = _rows(seqs), int_list(lengths).astype(np.int32)
    order = np.argsort(rows, kind="stable")
    return _Admitted.of(rows[order], lens[order], _rows(expiring), int_list(expiry), params)


def _postings_arrays(seqs: Optional[str], tf: Optional[str]) -> tuple[np.ndarray, np.ndarray]:
    rows, counts = _rows(seqs), int_list(tf)
    order = np.argsort(rows, kind="stable")
    rows, counts = rows[order], counts[order]
    return rows, counts.astype(count_dtype(int(counts.max()) if counts.size else 0))


class WideKeywordIndex:
    """One per PostgresStore: the generations, their anchor, and the warm-up loop (`pg.keywords`
    on the store's scheduler; see the module's docstring). `connection` hands out a pool
    connection (a context manager)."""

    def __init__(self, term_bytes: int, text_config: str, connection: Callable[[], Any], warm_inline: bool = False,
                 scheduler: Optional[Scheduler] = None) -> None:
        # Up to `term_bytes` of the lexemes' rows (`_Generation.postings`), as much of term scores.
        self.term_bytes = term_bytes
        self.term_scores = SharedArrays(term_bytes)
        # Tests: a search that finds the arrays missing loads them itself, so every search
        # takes this path (the differential non-interference test's "postgres-wide").
        self.warm_inline = warm_inline
        self.text_config = text_config
        self._connection = connection
        self._lock = threading.Lock()
        self._generation = _Generation(None, term_bytes)
        self._anchor: Optional[str] = None
        self.generations = 0  # how many times the arrays started afresh (tests)
        self.patches = 0  # how many times they were patched with changed rows instead (tests)
        self.served = 0  # searches answered from the arrays (tests)
        self._recent: OrderedDict[tuple[str, str], list[Any]] = OrderedDict()  # filters asked lately
        self.scheduler = scheduler or Scheduler()
        self._stopped = False
        self._worker: Optional[Loop] = None
        self._not_before = 0.0  # after an abandoned warm-up, the next waits as long as it took
        self._warming = False
        self._catch_up = False  # patch the arrays up to the database in the background (`rows_written`)
        self._uncaught_rows = 0  # keyword rows this server wrote since it last asked for a catch-up
        self.looks = 0  # background counts of the rows other servers changed (tests)

    # ------------------------------------------------------------ searches
    def candidates(self, conn: psycopg.Connection, words: list[str], flt: CellFilter, k: int) -> list[Candidate]:
        """The one-statement BM25's answer for `flt` (which has no owner or session: a wide
        filter), from the arrays; what they lack for it (the filter's admitted rows, the
        query's lexemes) read by this search in its own snapshot, so a restarted server's
        first wide search waits for neither the warm-up nor the statement. `conn`: an
        autocommit pool connection."""
        found, cold = self._answer(conn, words, flt, k)
        if cold:  # the frequent lexemes, for the searches after this one: started once it is answered, not beside it
            self._request_warmup()
        return found

    def _answer(self, conn: psycopg.Connection, words: list[str], flt: CellFilter, k: int) -> tuple[list[Candidate], bool]:
        """`candidates`, and whether the arrays it was answered from lack the warm-up's."""
        at = flt.not_expired_at
        where_text, params, key = self._filter_key(flt)
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            generation, lexemes = self._begin(conn, " ".join(words))
            with self._lock:
                self._recent[key] = params
                self._recent.move_to_end(key)
                while len(self._recent) > ADMITTED_SETS:
                    self._recent.popitem(last=False)
            if self.warm_inline and not generation.warm:
                self._warm(generation)  # tests: the warm-up's arrays too before the first answer
            # (A filter not loaded in this generation, a restarted server's first searches too:
            # its rows read now; the query's lexemes below likewise.)
            admitted = self._admitted_in(conn, generation, where_text, params, key)
            cold = not generation.warm
            if not lexemes or k <= 0:
                self.served += 1
                return [], cold
            view = self._view(conn, admitted, at)
            if not view.n:
                self.served += 1
                return [], cold

            with generation.lock:
                missing = [lexeme for lexeme in lexemes if lexeme not in generation.postings]
            if missing:
                conn.execute(_READ_MEMORY)
            # Not among the frequent ones the warm-up loaded (a rare one, or it has not yet):
            # read in one pass when there are several (a cold server's query: all of them).
            fetched = self._bulk_postings(conn, missing) if len(missing) > 1 else {}
            if fetched:
                with generation.lock:
                    for lexeme, held in fetched.items():
                        generation.postings.keep(lexeme, held)

            def postings(lexeme: str) -> tuple[np.ndarray, np.ndarray]:
                hit = fetched.get(lexeme)
                if hit is not None:
                    return hit
                with generation.lock:
                    hit = generation.postings.hit(lexeme)
                if hit is None:
                    hit = _postings_arrays(*_one(conn.execute(_POSTINGS, (lexeme, lexeme))))
                    with generation.lock:
                        generation.postings.keep(lexeme, hit)
                return hit

            scores = view.scores(lexemes, postings)
            best = top_k(scores, k)
            if not best.size:
                self.served += 1
                return [], cold
            seqs = view.seqs[best]
            ids: dict[int, str] = dict(conn.execute(_IDS, (seqs.astype(np.int64).tolist(),)).fetchall())
        self.served += 1
        ranked = sorted((-float(scores[b]), ids[int(s)]) for b, s in zip(best, seqs))
        return [Candidate(cid, -neg) for neg, cid in ranked[:k]], cold

    def admitted_rows(self, conn: psycopg.Connection, flt: CellFilter) -> np.ndarray:
        """The rows (seqs) a wide filter admits, its time bound aside, in `conn`'s REPEATABLE
        READ snapshot: the generation brought to it (as a search does) and the filter's rows
        read if the generation holds none (a search of the same filter has just read them)."""
        where_text, params, key = self._filter_key(flt)
        generation, _ = self._begin(conn, "")
        return self._admitted_in(conn, generation, where_text, params, key).seqs

    @staticmethod
    def _filter_key(flt: CellFilter) -> tuple[str, list[Any], tuple[str, str]]:
        """A wide filter's SQL condition and parameters without its time bound, and the key
        its admitted rows are kept under."""
        where_text, params = compile_filter(replace(flt, not_expired_at=None), POSTGRES)
        return where_text, params, (where_text, repr(params))

    def _admitted_in(self, conn: psycopg.Connection, generation: _Generation, where_text: str, params: list[Any],
                     key: tuple[str, str]) -> _Admitted:
        """The filter's admitted rows in `generation` (now its most recently used), read in
        `conn`'s snapshot (what the generation holds) when it has none, as the statement would
        read them."""
        with generation.lock:
            admitted = generation.admitted.get(key)
            if admitted is not None:
                generation.admitted.move_to_end(key)
        if admitted is None:
            admitted = self._keep_admitted(generation, key, self._load_admitted(conn, where_text, params))
        return admitted

    def _begin(self, conn: psycopg.Connection, text: str) -> tuple[_Generation, list[str]]:
        """This search's snapshot (taken under the lock: the anchor is always the newest),
        checked against the anchor; the generation whose arrays equal what it sees."""
        with self._lock:
            anchor = self._anchor
            snapshot, afresh, changed, lexemes = _one(conn.execute(_CHECK, (anchor,) * 4 + (self.text_config, text)))
            if afresh or changed:
                generation = self._patched(conn, self._generation, anchor, snapshot) if anchor and not afresh else None
                if generation is None:
                    generation = _Generation(snapshot, self.term_bytes)
                    self.generations += 1
                self._generation = generation
            # Unchanged since the anchor: what this snapshot sees equals what the arrays hold.
            self._anchor = snapshot
            return self._generation, list(lexemes)

    def _patched(self, conn: psycopg.Connection, old: _Generation, anchor: str, snapshot: str) -> Optional[_Generation]:
        """`old` with the rows changed since `anchor` read again in this search's snapshot:
        each kept filter's admitted rows among them, their lexemes' term frequencies (warm or
        not: what the warm-up has not loaded, the searches read). None (read afresh) when the
        changes are too many or a TRUNCATE."""
        rows = int_list(_one(conn.execute(_CHANGED_ROWS, (anchor, anchor, PATCH_ROWS + 1)))[0])
        if rows.size > PATCH_ROWS or (rows < 0).any():
            return None
        changed = np.unique(rows)
        ids = "{" + ",".join(map(str, changed.tolist())) + "}"
        with old.lock:
            admitted, postings = list(old.admitted.items()), list(old.postings.items())
        new = _Generation(snapshot, self.term_bytes)
        new.warm = old.warm
        # Sent together, answered in one round trip (pipeline mode, where libpq has it).
        with conn.pipeline() if psycopg.Pipeline.is_supported() else nullcontext():
            among = [conn.execute(sql.SQL(_ADMITTED_AMONG).format(where=sql.SQL(key[0])), [ids, *kept.params])
                     for key, kept in admitted]
            among_terms = conn.execute(_TERMS_AMONG, (ids, [lexeme for lexeme, _ in postings])) if postings else None
            for (key, kept), cursor in zip(admitted, among):
                new.admitted[key] = _patched_admitted(kept, changed, _admitted_arrays(_one(cursor), kept.params))
            terms = {lexeme: _postings_arrays(seqs, tf) for lexeme, seqs, tf in
                     (among_terms.fetchall() if among_terms is not None else ())}
        for lexeme, held in postings:  # least recently used first, as they were kept
            new.postings.keep(lexeme, _patched_postings(held, changed, terms.get(lexeme)))
        self.patches += 1
        return new

    def _view(self, conn: psycopg.Connection, admitted: _Admitted, at: Optional[datetime]) -> _View:
        # Which expiry interval `at` falls in decides which expiring rows are gone.
        interval = bisect.bisect_right(admitted.times, _micros(at)) if at is not None and admitted.times else 0
        view = admitted.views.get(interval)
        if view is None:
            seqs, lengths = admitted.seqs, admitted.lengths
            if interval:
                gone = admitted.expiring[: bisect.bisect_right(admitted.expiry.tolist(), admitted.times[interval - 1])]
                keep = ~np.isin(seqs, gone)
                seqs, lengths = seqs[keep], lengths[keep]
            avgdl = _one(conn.execute(_MEAN_LENGTH, (int(lengths.sum()), int(seqs.size))))[0]
            view = _View(seqs, lengths, float(avgdl), self.term_scores)
            if len(admitted.views) >= 4:
                admitted.views.clear()
            view = admitted.views.setdefault(interval, view)
        return view

    # ------------------------------------------------------------ the warm-up
    def _request_warmup(self) -> None:
        with self._lock:
            if self._stopped:
                return
            if self._worker is None:
                self._worker = self.scheduler.loop("pg.keywords", self._warm_loop)
            worker = self._worker
        worker.wake()

    def rows_written(self, rows: int) -> None:
        """This server committed a write that rewrote `rows` keyword rows: once they add up to
        CATCH_UP_ROWS (an import's batches), the arrays are patched up to the database in the
        background, without waiting for the next look (`_others_wrote`)."""
        with self._lock:
            self._uncaught_rows += rows
            if self._uncaught_rows < CATCH_UP_ROWS:
                return
            self._uncaught_rows = 0
            if self._anchor is None or self._stopped:  # nothing held yet: nothing to patch
                return
            self._catch_up = True
        self._request_warmup()

    def _others_wrote(self) -> bool:
        """Whether CATCH_UP_ROWS keyword rows have changed since the anchor (whoever wrote
        them): the keyword thread's look every CATCH_UP_LOOK_SECONDS while it holds arrays, so
        an import through another server is patched in here as it goes."""
        with self._lock:
            anchor = None if self._stopped else self._anchor
        if anchor is None:
            return False
        self.looks += 1
        try:
            with self._connection() as conn:
                return bool(_one(conn.execute(_CHANGED_COUNT, (anchor, anchor, CATCH_UP_ROWS)))[0] >= CATCH_UP_ROWS)
        except Exception:  # noqa: BLE001  (closed, or the database went away: the next search catches up)
            return False

    def wait_until_warm(self, timeout: float = 60.0) -> bool:
        """Until the current generation is warm (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            generation = self._generation
            with generation.lock:
                if generation.warm:
                    return True
            time.sleep(0.01)
        return False

    def open(self) -> None:
        with self._lock:
            self._stopped = False

    def close(self) -> None:
        """Stop the warm-up (it ends its current statement) and drop the arrays."""
        with self._lock:
            self._stopped = True
            worker, self._worker = self._worker, None
            self._generation, self._anchor = _Generation(None, self.term_bytes), None
            self.term_scores.clear()
        if worker is not None:
            self.scheduler.stop(worker.name, timeout=60)

    def _warm_loop(self, loop: Loop) -> None:
        while True:
            asked = loop.wait(CATCH_UP_LOOK_SECONDS)
            loop.take()
            again = False
            try:
                with self._lock:
                    if self._stopped or loop.stopping or self._worker is not loop:
                        return
                again = self._warm_step(asked, loop)
            finally:
                loop.done(again=again)

    def _warm_step(self, asked: bool, loop: Loop) -> bool:
        """One turn of the warm-up loop: a catch-up when asked for or due, then the warm-up;
        True when it should run again at once (it waited out an abandoned warm-up's delay)."""
        if not asked:  # nobody asked: has the database moved far from the arrays?
            if not self._others_wrote():
                return False
            self._catch_up = True
        if self._catch_up:
            self._catch_up = False
            try:
                with self._connection() as conn, conn.transaction():
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    self._begin(conn, "")  # patched, as a search would (or afresh: warmed below)
            except Exception:  # noqa: BLE001  (closed, or the database went away: the next search catches up)
                pass
        delay = self._not_before - time.monotonic()
        if delay > 0:
            return not loop.sleep(min(delay, 5.0))
        generation = self._generation
        started = time.monotonic()
        self._warming = True
        try:
            current = self._warm(generation)
        except Exception:  # noqa: BLE001  (closed, or the database went away: searches read what they need)
            current = False
        finally:
            self._warming = False
        if not current:  # the database changed meanwhile: the next search starts a new generation
            self._not_before = time.monotonic() + (time.monotonic() - started)
        return False

    def _warm(self, generation: _Generation) -> bool:
        """Load what `generation` lacks (the last generation's filters, then the frequent
        lexemes' rows) in one REPEATABLE READ transaction whose snapshot must show what the generation's
        anchor showed; False if it does not (the arrays would not be the generation's)."""
        with self._lock:  # the newest anchor, if the generation is still this server's
            if self._generation is not generation:
                return False
            anchor = self._anchor
        with self._connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            _, afresh, changed, _ = _one(conn.execute(_CHECK, (anchor,) * 4 + (self.text_config, "")))
            if afresh or changed or self._stopped:
                return False
            conn.execute("SET LOCAL work_mem = '256MB'")
            with generation.lock:
                wanted: dict[tuple[str, str], list[Any]] = {}
                if not generation.warm:
                    with self._lock:
                        wanted.update(self._recent)  # the filters asked lately (the last generation's)
                for key in generation.admitted:  # loaded meanwhile (by the searches themselves)
                    wanted.pop(key, None)
            for key, params in wanted.items():
                if self._stopped:
                    return False
                self._keep_admitted(generation, key, self._load_admitted(conn, key[0], params))
            if not generation.warm:
                for lexeme, postings in self._frequent_postings(conn).items():
                    with generation.lock:
                        generation.postings.keep(lexeme, postings)
                with generation.lock:
                    generation.warm = True
        return True

    @staticmethod
    def _bulk_postings(conn: psycopg.Connection, lexemes: list[str],
                       frequent: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Every row of each of `lexemes`, in one pass (a lexeme in no row: empty arrays);
        `frequent`: lexemes in most rows (the warm-up's), read by scanning every window
        rather than through the index."""
        rows = (conn.execute(_FREQUENT_POSTINGS, (lexemes,)) if frequent
                else conn.execute(_BULK_POSTINGS, (lexemes, lexemes)))
        found = {lexeme: _postings_arrays(seqs, tf) for lexeme, seqs, tf in rows}
        return {lexeme: found.get(lexeme) or _postings_arrays(None, None) for lexeme in lexemes}

    def _frequent_postings(self, conn: psycopg.Connection) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Every row of the lexemes in at least FREQUENT_SHARE of the windows (estimated from
        a sample; the most frequent first, up to half the budget), read in one pass."""
        windows = max(1.0, float(_one(conn.execute(
            "SELECT GREATEST(reltuples, 0) FROM pg_class WHERE oid = 'cell_search'::regclass"))[0]))
        percent = min(100.0, 100.0 * SAMPLE_ROWS / windows)
        chosen, budget = [], self.term_bytes // 2
        for word, ndoc in conn.execute(_FREQUENT, (percent,)).fetchall():
            share = ndoc * 100.0 / percent / windows
            if share < FREQUENT_SHARE:
                break
            budget -= int(share * windows * 5)  # about 5 bytes a posting (int32 row, uint8 count)
            if budget < 0:
                break
            chosen.append(word)
        if not chosen:
            return {}
        return self._bulk_postings(conn, chosen, frequent=True)

    @staticmethod
    def _keep_admitted(generation: _Generation, key: tuple[str, str], admitted: _Admitted) -> _Admitted:
        with generation.lock:
            generation.admitted[key] = admitted
            while len(generation.admitted) > ADMITTED_SETS:
                generation.admitted.popitem(last=False)
        return admitted

    def state(self) -> str:
        """For /health: warming (the warm-up runs), ready (the frequent lexemes are loaded),
        none (nothing asked since the database last changed)."""
        generation = self._generation
        with generation.lock:
            if generation.warm:
                return "ready"
        worker = self._worker
        return "warming" if worker is not None and (self._warming or worker.asked) else "none"

    @staticmethod
    def _load_admitted(conn: psycopg.Connection, where_text: str, params: list[Any]) -> _Admitted:
        return _admitted_arrays(_one(conn.execute(sql.SQL(_ADMITTED).format(where=sql.SQL(where_text)), params)), params)
