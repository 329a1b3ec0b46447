"""The keyword leg of a SQLite store: Okapi BM25 over the keyword windows its caller may read.

The windows themselves (`cell_context`, indexed by FTS5 as `cells_fts`) are rows, written by
the store's write transaction; this module reads them. FTS5 is also the tokenizer: a
contentless temporary index per connection turns texts into the exact terms (porter stems)
and counts the keyword index uses (`tokenize`).

Wide searches (a reader across owners) intersect each query term's rows, read from the FTS
index and kept in the postings cache, with the filter's admitted rows (`SQLiteAccessIndex`).
A large store reads its most common words' rows ahead in the background (`warm`).
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections import OrderedDict
from typing import Any, Optional, Sequence

import numpy as np

from ..errors import Unavailable
from ..textindex import STOP_WORDS, fts_match, owner_token, query_terms
from ._bm25 import AdmittedSet, PostingsCache, bm25_scores, doc_counts, int_list, top_k, union_positions
from .base import Candidate, CellFilter
from .indexes import CacheBudgets, SQLiteRows
from .sqlite_access import SQLiteAccessIndex, filter_sql
from .sqlite_changes import ChangeFeed

# Every occurrence of one term in the window text (column 0 of cells_fts), read from the FTS
# index itself, as one comma-separated string of rowids in rowid order (fts5vocab `instance`
# has a row per occurrence): one string instead of a Python row per match.
_TERM_ROWS = "SELECT group_concat(doc) FROM temp.ampkit_vocab WHERE term = ? AND col = 'text'"
# The same for a term the `owner` column cannot hold (it holds only owner tokens, "o" and 16
# hex digits: `owner_token`): without the column test, which fts5vocab evaluates per occurrence.
_TERM_ROWS_ANY_COLUMN = "SELECT group_concat(doc) FROM temp.ampkit_vocab WHERE term = ?"
_OWNER_TOKEN = re.compile(r"o[0-9a-f]{16}")
_UNIT_ROWS = "SELECT group_concat(rowid) FROM cells_fts WHERE cells_fts MATCH ?"

# The tokenizer's tables, made on every connection the store opens (`TOKENIZER`).
TOKENIZER = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.ampkit_tokens USING fts5("
    "text, content='', tokenize='porter unicode61 remove_diacritics 2')",
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.ampkit_token_instances USING fts5vocab(temp, ampkit_tokens, instance)",
    # One text (a single-cell create's new turn): its terms with their counts directly, one
    # row per term, instead of one per occurrence grouped.
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.ampkit_token_rows USING fts5vocab(temp, ampkit_tokens, row)",
)
_VOCAB = "CREATE VIRTUAL TABLE IF NOT EXISTS temp.ampkit_vocab USING fts5vocab(main, cells_fts, instance)"
_VOCAB_COLUMNS = "CREATE VIRTUAL TABLE IF NOT EXISTS temp.ampkit_vocab_columns USING fts5vocab(main, cells_fts, col)"
# Past this many cells, open() reads the most common words' term rows in the background, up
# to this share of the postings cache (the rest is left for the words searches ask for); so
# does a reader-wide search of a store that grew past it while open, whose term cache started
# afresh since, or that has grown this many times over since they were read.
WARM_TERMS_MIN_CELLS = 100_000
WARM_TERMS_SHARE = 0.75
WARM_TERMS_REGROWTH = 2.0


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


class SQLiteKeywordIndex:
    """The keyword leg over one SQLite store's windows (`KeywordIndex`)."""

    def __init__(self, rows: SQLiteRows, changes: ChangeFeed, access: SQLiteAccessIndex, *,
                 budgets: CacheBudgets = CacheBudgets(), warm_terms_min_cells: Optional[int] = WARM_TERMS_MIN_CELLS):
        self.rows = rows
        self.changes = changes
        self.access = access
        self.postings_bytes = budgets.postings_bytes
        # Past this many cells, open() reads the term rows of the words in the most windows
        # in the background (`warm`); None: never.
        self.warm_terms_min_cells = warm_terms_min_cells
        self.postings: Optional[tuple[int, PostingsCache]] = None  # (the change feed's generation, cache)
        self.warm_lock = threading.Lock()  # held by `warm` per word, and by the store's close()
        self._idle = threading.Event()  # set: no term warm-up running
        self._idle.set()
        self._start_lock = threading.Lock()
        # What the last finished warm-up left warm: ((the postings cache's generation, its
        # epoch), the store's rows then); None: nothing since open().
        self._warmed: Optional[tuple[tuple[int, int], int]] = None

    # ------------------------------------------------------------ lifetime
    def opened(self) -> bool:
        """At open: whether this open warms the common words (`start_warmup`)."""
        self._warmed = None
        self._idle.set()
        return self.warm_terms_min_cells is not None and self.changes.tracking

    def closed(self) -> None:
        self.postings = None

    # ------------------------------------------------------------ change feed
    def wants_changes(self) -> bool:
        return self.postings is not None

    def take(self, states: dict[int, Any], terms: dict[int, Optional[dict[str, int]]]) -> None:
        postings = self.postings
        if postings is not None:
            postings[1].record(terms)

    def convert_closed(self) -> None:
        """The postings log's closed entries converted now rather than at the next search."""
        postings = self.postings
        if postings is not None:
            postings[1].convert_closed()

    def postings_cache(self) -> PostingsCache:
        """Every row's postings per term (all threads): patched with every logged commit,
        started afresh when the change log cannot say what changed."""
        foreign = self.changes.generation()
        cached = self.postings
        if cached is None or cached[0] != foreign:
            # Made under the write lock: no transaction is between its change capture and
            # its commit, so every later commit is recorded into this cache's log.
            with self.rows._write_lock:
                cached = self.postings = (foreign, PostingsCache(self.postings_bytes))
        return cached[1]

    # ------------------------------------------------------------ search
    def candidates_many(self, queries: Sequence[str], flt: CellFilter, k: int) -> list[list[Candidate]]:
        """BM25 (FTS5's formula and constants) of each query over one filter, with its
        statistics (number of documents, mean length, document frequencies) taken over the
        cells `flt` admits, not the whole index: a caller's scores then depend only on cells
        it may read (non-interference).

        Three ways to the same matches and scores (tested against the straightforward loop):
        a filter admitting few cells (an owner's search) scans their windows' stored term
        counts once for all the queries; a wide filter (a reader across owners) intersects
        each query term's rows from the FTS index with the admitted rows (`_bm25`); a small
        filter with a word the tokenizer splits (a phrase) runs the FTS OR query."""
        conn = self.rows._reader()
        parsed = []
        for query in queries:
            words = query_terms(query)
            per_word = tokenize(conn, words) if words else []
            terms = sorted({t for tf in per_word for t in tf if '"' not in t and "\\" not in t})
            parsed.append((query, words, per_word, terms))
        out: list[list[Candidate]] = [[] for _ in queries]
        todo = [i for i, (_, words, _, terms) in enumerate(parsed) if words and terms]
        if not todo:
            return out
        entry = self.access.entry(flt)
        n, total_len = entry[1], entry[2]
        if not n:
            return out
        if self.access.wide(flt, n):
            for i in todo:
                _, words, per_word, terms = parsed[i]
                out[i] = self._wide(flt, entry, words, per_word, terms, k)
            return out
        # The scan matches exactly what the FTS query matches when every query word is one
        # index term (a word the tokenizer splits would be a phrase in FTS).
        scanned = [i for i in todo if all(len(tf) == 1 for tf in parsed[i][2])]
        for i in todo:
            if i not in scanned:
                out[i] = self._fts(parsed[i][0], flt, parsed[i][3], n, total_len, k)
        if scanned:
            union = sorted({t for i in scanned for t in parsed[i][3]})
            where, params = filter_sql(flt)
            tf_columns = ", ".join("coalesce(json_extract(x.terms, ?), 0)" for _ in union)
            paths = ['$."' + t + '"' for t in union]
            ids, lengths, tfs = _term_matrix(self.rows._query(
                f"SELECT c.id, x.len, {tf_columns} FROM cells c JOIN cell_context x ON x.rowid = c.rowid WHERE {where}",
                [*paths, *params],
            ), len(union))
            column = {t: j for j, t in enumerate(union)}
            for i in scanned:
                mine = tfs[:, [column[t] for t in parsed[i][3]]]
                rows = np.flatnonzero(mine.any(axis=1))  # the windows holding one of its terms
                out[i] = _rank_rows([ids[r] for r in rows], lengths[rows], mine[rows], n, total_len, k)
        return out

    def _fts(self, query: str, flt: CellFilter, terms: list[str], n: int, total_len: int, k: int) -> list[Candidate]:
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
        rows = self.rows._query(
            f"SELECT c.id, x.len, {tf_columns} FROM cells_fts CROSS JOIN cells c ON c.rowid = cells_fts.rowid "
            f"CROSS JOIN cell_context x ON x.rowid = c.rowid WHERE cells_fts MATCH ? AND {where}",
            [*paths, match, *params],
        )
        ids, lengths, tfs = _term_matrix(rows, len(terms))
        return _rank_rows(ids, lengths, tfs, n, total_len, k)

    def _wide(self, flt: CellFilter, entry: list[Any], words: list[str], per_word: list[dict[str, int]],
              terms: list[str], k: int) -> list[Candidate]:
        """The keyword leg for a filter admitting many cells: every term's rows (FTS doclists,
        with term frequencies from the FTS vocabulary) intersected with the admitted rows."""
        admitted = self.access.admitted_set(flt, entry)
        postings = self.postings_cache()
        if self._idle.is_set() and self.warmup_due():  # e.g. grown past the threshold by writes
            self.start_warmup()
        conn = self.rows._reader()
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
            scores, best, rowids = self._wide_phrases(admitted, words, per_word, terms, k, load_term, load_unit)
            if not rowids.size:
                return []
        ids = dict(conn.execute("SELECT rowid, id FROM cells WHERE rowid IN (SELECT value FROM json_each(?))",
                                (json.dumps(rowids.tolist()),)).fetchall())
        ranked = sorted((-float(scores[b]), ids[int(r)]) for b, r in zip(best, rowids))
        return [Candidate(cid, -neg) for neg, cid in ranked[:k]]

    @staticmethod
    def _wide_phrases(admitted: AdmittedSet, words: list[str], per_word: list[dict[str, int]],
                      terms: list[str], k: int, load_term: Any, load_unit: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`_wide` for a query with a phrase: its matches are marked first (a phrase's rows
        come from FTS), document frequencies count matched rows. (scores of the matched rows,
        the best of them, their rowids)."""
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

    # ------------------------------------------------------------ warm-up
    def start_warmup(self) -> None:
        """The background term warm-up (`warm`), unless one is running."""
        with self._start_lock:
            if not self._idle.is_set():
                return
            self._idle.clear()
        self.rows.scheduler.run("keyword.warmup", self.warm, self.rows.opened)

    def warmup_due(self) -> bool:
        """Whether the common words' term rows should be read ahead now, for a store past
        `warm_terms_min_cells`: none were read since open() (it grew past the threshold
        while open: open() had nothing to read), the postings cache started afresh since they
        were (the change log overflowed it, or could not say what another process changed),
        or the store has grown WARM_TERMS_REGROWTH times over since (words common now were
        rare then). A reader-wide search asks (`_wide`), never a write: a store loading by
        writes alone keeps no cache to patch."""
        if self.warm_terms_min_cells is None or not self.changes.tracking or not self.rows.current(self.rows.opened):
            return False
        rows = self.rows._query("SELECT COALESCE(MAX(rowid), 0) FROM cells")[0][0]
        if rows < self.warm_terms_min_cells:
            return False
        warmed, postings = self._warmed, self.postings
        return (warmed is None or postings is None or warmed[0] != (postings[0], postings[1].epoch)
                or rows >= WARM_TERMS_REGROWTH * max(warmed[1], 1))

    def warm(self, opened: int) -> None:
        """Background, from open() of a store past `warm_terms_min_cells`, or from a
        reader-wide search when it is due again (`warmup_due`): the access snapshot first,
        then the term rows of the words in the most keyword windows (stop words aside: a
        query drops them) into the postings cache, up to WARM_TERMS_SHARE of it, most common
        first. The snapshot comes first because the first reader-wide search waits for it,
        and only for it (a search reads a word it needs itself). Each step holds a lock the
        store's close() takes before closing connections; one that needs the snapshot while
        it loads waits for that load. `/health` says `keyword_warmup: warming` until both end."""
        try:
            try:
                with self.warm_lock:
                    if not self.rows.current(opened):
                        return
                    rows = self.rows._query("SELECT COALESCE(MAX(rowid), 0) FROM cells")[0][0]
                    if rows < (self.warm_terms_min_cells or 0):
                        return
                self.access.warm(opened)
            finally:
                self.access.first.set()
            with self.warm_lock:
                if not self.rows.current(opened):
                    return
                conn = self.rows._reader()
                conn.execute(_VOCAB)
                conn.execute(_VOCAB_COLUMNS)
                terms = [t for (t,) in conn.execute(
                    "SELECT term FROM temp.ampkit_vocab_columns WHERE col = 'text' ORDER BY doc DESC LIMIT 5000")
                    if t not in STOP_WORDS]
                postings = self.postings_cache()
                # The cache these rows go to, as it is now: one started afresh meanwhile
                # (they are gone with it) makes the next wide search ask again.
                cache = (self.postings[0] if self.postings else -1, postings.epoch)
            for term in terms:
                with self.warm_lock:
                    if not self.rows.current(opened):
                        return
                    postings = self.postings_cache()
                    if postings.size > self.postings_bytes * WARM_TERMS_SHARE:
                        break
                    postings.get("t:" + term, lambda: doc_counts(int_list(
                        conn.execute(term_rows_sql(term), (term,)).fetchone()[0])))
            self._warmed = (cache, rows)
        except Exception:  # noqa: BLE001  (closed meanwhile: searches read words themselves)
            return
        finally:
            if self.rows.opened == opened:
                self._idle.set()

    def wait_for_warmup(self, timeout: Optional[float] = None) -> bool:
        """Until the background term warm-up started by open() is done; False on timeout."""
        return self._idle.wait(timeout)

    def warmup_state(self) -> str:
        """warming: a term warm-up runs; none: the store is past `warm_terms_min_cells` and
        its common words were not read ahead for what it holds now (the next reader-wide
        search starts that); ready: they were, or the store is too small to need it."""
        if not self._idle.is_set():
            return "warming"
        try:
            return "none" if self.warmup_due() else "ready"
        except Unavailable:  # closed
            return "ready"


__all__ = ["TOKENIZER", "WARM_TERMS_MIN_CELLS", "SQLiteKeywordIndex", "term_rows_sql", "tokenize"]
