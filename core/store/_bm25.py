"""Okapi BM25 over the cells a search may see, vectorised (numpy), for the SQLite keyword leg
(the formula itself: `ampkit.bm25`).

The statistics (number of documents N, mean window length, document frequencies) are taken
over an *admitted set*: the rows the search's filter admits (its caller's access rule
included), so a score never depends on a cell the caller cannot read (non-interference).

`bm25_scores` computes exactly what the straightforward loop computes (the same IEEE
operations in the same order, term by term: equal inputs, equal bits; `tests/test_retrieval.py`
compares them). What makes it fast is what it is fed: sorted integer arrays of the rows that
hold each term, kept between queries until the database changes (`AdmittedSet`,
`PostingsCache`), instead of one SQL row per match with its term counts parsed from JSON.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterator, Optional, TypeVar

import numpy as np

from ..bm25 import fts5_idf, length_norm, term_score


K = TypeVar("K", bound=Hashable)


class BytesLRU(OrderedDict[K, Any]):
    """key -> value holding numpy arrays (`arrays_of(value)`), least recently used out past
    `max_bytes` (the value just kept always stays). Not thread-safe: the owner locks."""

    def __init__(self, max_bytes: int, arrays_of: Callable[[Any], Any] = lambda value: value) -> None:
        super().__init__()
        self.max_bytes = max_bytes
        self.held = 0  # bytes
        self._arrays_of = arrays_of

    def _bytes(self, value: Any) -> int:
        arrays = self._arrays_of(value)
        return _nbytes(arrays if isinstance(arrays, tuple) else (arrays,))

    def hit(self, key: K) -> Any:
        """The value (now the most recently used), or None."""
        found = self.get(key)
        if found is not None:
            self.move_to_end(key)
        return found

    def keep(self, key: K, value: Any) -> Any:
        old = self.pop(key, None)
        if old is not None:
            self.held -= self._bytes(old)
        self[key] = value
        self.held += self._bytes(value)
        while self.held > self.max_bytes and len(self) > 1:
            _, dropped = self.popitem(last=False)
            self.held -= self._bytes(dropped)
        return value

    def discard(self, key: K) -> None:
        old = self.pop(key, None)
        if old is not None:
            self.held -= self._bytes(old)

    def clear(self) -> None:
        super().clear()
        self.held = 0


_HOLDER_SERIALS = itertools.count()  # `SharedArrays` keys: one number per holder, never reused


class SharedArrays:
    """Arrays kept for many holders (each filter's admitted set, each view of one) in one byte
    budget, least recently used out, under `(holder serial, key)`: an analyst's common word
    holds far more term scores than a team member's, so each
    holder takes what its searches use rather than a fixed share, and the whole stays bounded
    however many holders there are. A holder's entries go with it: once it is garbage (a
    write replaced the set, its filter was dropped) they are dropped at the next call, so
    the budget is not spent on arrays nobody can ask for again."""

    def __init__(self, max_bytes: int) -> None:
        self._held: BytesLRU[tuple[int, str]] = BytesLRU(max_bytes)
        self._lock = threading.Lock()
        self._gone: list[int] = []  # serials of holders collected since the last call

    def register(self, holder: object, serial: Optional[int] = None) -> int:
        """A serial for `holder`'s keys (or `serial`, shared with other budgets), whose entries
        are dropped once `holder` is garbage."""
        serial = next(_HOLDER_SERIALS) if serial is None else serial
        # (list.append: atomic, and takes no lock a finalizer could find held by its own thread)
        weakref.finalize(holder, self._gone.append, serial)
        return serial

    def _drop_gone(self) -> None:
        """The entries of holders collected since the last call (under the lock)."""
        if not self._gone:
            return
        gone = set()
        while self._gone:
            gone.add(self._gone.pop())
        for key in [key for key in self._held if key[0] in gone]:
            self._held.discard(key)

    @property
    def held_bytes(self) -> int:
        return self._held.held

    def __len__(self) -> int:
        return len(self._held)

    def keys(self) -> list[tuple[int, str]]:
        with self._lock:
            self._drop_gone()
            return list(self._held)

    def hit(self, key: tuple[int, str]) -> Any:
        with self._lock:
            self._drop_gone()
            return self._held.hit(key)

    def keep(self, key: tuple[int, str], value: Any) -> Any:
        with self._lock:
            self._drop_gone()
            return self._held.keep(key, value)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()


@dataclass
class SetArrays:
    """What every admitted set of a store keeps per term, one `SharedArrays` budget per kind
    (`indexes.CacheBudgets`: a set lives as long as the data does not change, and a server asked
    about ever new words by ever new readers must not grow with them)."""

    postings: SharedArrays
    matches: SharedArrays
    contributions: SharedArrays

    def register(self, holder: object) -> int:
        """One serial for `holder`'s entries of every kind, dropped once it is garbage."""
        serial = self.postings.register(holder)
        self.matches.register(holder, serial)
        self.contributions.register(holder, serial)
        return serial

    def clear(self) -> None:
        for kind in (self.postings, self.matches, self.contributions):
            kind.clear()


class RowPositions:
    """Where each of a sorted array of row numbers stands in it: one lookup per row in a
    row number -> position map (built at first use, 4 bytes per row number up to the highest),
    not a binary search (half a million rows for a common word). Both stores' wide keyword
    legs map a term's rows into their admitted rows with it."""

    def __init__(self, rows: np.ndarray):
        self.rows = rows
        self._where: Optional[np.ndarray] = None

    def of(self, rowids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions in `rows`, mask over `rowids`) of the given sorted row numbers that
        `rows` holds."""
        if not self.rows.size or not rowids.size:
            return np.empty(0, dtype=np.int32), np.zeros(rowids.size, dtype=bool)
        if self._where is None:
            where = np.full(int(self.rows[-1]) + 1, -1, dtype=np.int32)
            where[self.rows] = np.arange(self.rows.size, dtype=np.int32)
            self._where = where
        if rowids[-1] < self._where.size:  # sorted: every one inside the map
            at = self._where[rowids]
        else:
            inside = rowids < self._where.size
            at = np.full(rowids.size, -1, dtype=np.int32)
            at[inside] = self._where[rowids[inside]]
        mask = at >= 0
        return at[mask], mask


def sum_term_scores(n: int, terms: list[str], contribution: Callable[[str], tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """BM25 of each of `n` rows (0 where no term is held): each term's (positions, score at
    each) from `contribution`, added term by term in the order given, as the reference (and
    PostgreSQL's statement) adds them: equal inputs, equal bits."""
    scores = np.zeros(n, dtype=np.float64)
    if not n:
        return scores
    for i, term in enumerate(terms):
        pos, value = contribution(term)
        if i:
            scores[pos] += value
        else:  # 0.0 + x is x: the first term's scores are placed, not added
            scores[pos] = value
    return scores


@dataclass
class AdmittedSet:
    """The rows a filter admits (sorted rowids) with their window lengths, and the admitted
    postings of the terms asked recently (positions into `rowids`, term frequencies), and
    each such term's BM25 term score per row (its statistics are this set's: fixed with it),
    those kept in the store's `SetArrays` under this set's serial."""

    rowids: np.ndarray
    lengths: np.ndarray
    total: int
    arrays: SetArrays
    serial: int = field(init=False)
    _norm: Optional[np.ndarray] = None
    _positions: RowPositions = field(init=False)

    def __post_init__(self) -> None:
        self._positions = RowPositions(self.rowids)  # its map is built at first use
        self.serial = self.arrays.register(self)

    @property
    def n(self) -> int:
        return int(self.rowids.size)

    def positions(self, rowids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions in this set, mask over `rowids`) of the given sorted rowids it admits."""
        return self._positions.of(rowids)

    def term(self, term: str, load: Callable[[str], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """Admitted (positions, tf) of the rows holding `term`; `load` gives every row's."""
        key = (self.serial, term)
        hit = self.arrays.postings.hit(key)
        if hit is None:
            rowids, tf = load(term)
            pos, mask = self.positions(rowids)
            hit = self.arrays.postings.keep(key, (pos, tf[mask]))
        return hit

    def contribution(self, term: str, load: Callable[[str], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """(positions, the term's BM25 score at each) for a query whose words are each one
        term: every row holding a term is matched, so its document frequency is its row
        count here, and its score per row depends on this set alone (kept with it: a
        query then only adds them up). The operations of `bm25_scores` (equal bits)."""
        key = (self.serial, term)
        hit = self.arrays.contributions.hit(key)
        if hit is None:
            pos, tf = self.term(term, load)
            hit = self.arrays.contributions.keep(key, (pos, term_score(fts5_idf(self.n, int(pos.size)), tf, self.norm()[pos])))
        return hit

    def scores(self, terms: list[str], load: Callable[[str], tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """BM25 of every admitted row for a query whose words are each one term: the terms'
        scores (`contribution`) added up (`sum_term_scores`)."""
        return sum_term_scores(self.n, terms, lambda term: self.contribution(term, load))

    def norm(self) -> np.ndarray:
        """Each admitted row's BM25 length normalisation, as `bm25_scores` computes it."""
        if self._norm is None:
            self._norm = length_norm(self.lengths, self.total / self.n if self.n else 0)
        return self._norm

    def unit(self, unit: str, load: Callable[[str], np.ndarray]) -> np.ndarray:
        """Admitted positions of the rows an FTS unit (a word, perhaps a phrase) matches."""
        key = (self.serial, unit)
        hit = self.arrays.matches.hit(key)
        if hit is None:
            hit = self.arrays.matches.keep(key, self.positions(load(unit))[0])
        return hit


TermCounts = dict[int, Optional[dict[str, int]]]  # rowid -> its window's term counts now (None: gone)


class ChangedWindows:
    """One or more consecutive commits' changed keyword windows (commits `first`..`last`), as
    the postings cache patches from them. Filled as raw term counts while it is the log's
    open tail, then read as arrays (`arrays`, `postings`), converted once on first use: every
    changed row, and their windows' postings sorted by term id, so one term's are found by
    a binary search instead of a pass over every changed row per term (slow after a large
    import)."""

    __slots__ = ("first", "last", "_counts", "_arrays")

    def __init__(self, seq: int):
        self.first = self.last = seq
        self._counts: Optional[TermCounts] = {}
        self._arrays: Optional[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = None

    def add(self, seq: int, counts: TermCounts) -> None:
        """A later commit's changed windows (only while this is the open tail)."""
        assert self._counts is not None
        self._counts.update(counts)  # a row changed again keeps its latest window
        self.last = seq

    @property
    def size(self) -> int:
        """Changed rows (while this is the open tail)."""
        assert self._counts is not None
        return len(self._counts)

    def convert(self, term_ids: dict[str, int], next_id: Iterator[int]) -> None:
        """Into `arrays`, once (the cache's convert lock held): words interned in `term_ids`,
        new ones numbered from `next_id`."""
        if self._arrays is None:
            assert self._counts is not None
            counts = self._counts
            ids: list[int] = []
            holders: list[int] = []
            tf: list[int] = []
            for row, counted in counts.items():
                if counted:
                    ids.extend(map(term_ids.setdefault, counted, next_id))  # (C loops: ~60 ns a posting)
                    tf.extend(counted.values())
                    holders.extend(itertools.repeat(row, len(counted)))
            rows = np.fromiter(counts, dtype=np.int64, count=len(counts))
            rows.sort()
            ids_a, holders_a = np.asarray(ids, dtype=np.int64), np.asarray(holders, dtype=np.int64)
            order = np.lexsort((holders_a, ids_a))
            self._arrays = (rows, ids_a[order], holders_a[order], np.asarray(tf, dtype=np.int64)[order])
            self._counts = None

    @property
    def converted(self) -> bool:
        return self._arrays is not None

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(changed rows sorted, and their postings: term ids, rows, counts, sorted by term id
        then row), once converted (`convert`)."""
        assert self._arrays is not None
        return self._arrays

    def postings(self, term_id: Optional[int]) -> tuple[np.ndarray, np.ndarray]:
        """The changed rows whose window holds the term (sorted), and its count in each."""
        _, ids, holders, tf = self.arrays
        if term_id is None:
            return holders[:0], tf[:0]
        lo, hi = np.searchsorted(ids, [term_id, term_id + 1])
        return holders[lo:hi], tf[lo:hi]


class PostingsCache:
    """Every row's postings per term (filter-independent), bounded by the bytes its arrays
    hold. Kept across commits: each commit's changed windows (their rows and new term
    counts, from the store's change log) go to a log (`record`), and a cached term's rows are
    patched from the entries it has not seen when it is next asked for (`get`); a key that
    cannot be patched (an FTS phrase, "u:") is loaded again. The store replaces the whole
    cache when the change log cannot say what changed (its foreign generation).

    Commits are numbered; a cached term remembers the last one it has seen. Small commits
    (single writes) share one log entry up to TAIL_ROWS changed rows, so a term long unasked
    is patched from a few hundred entries, not from one per write; patching with a change a
    term had already seen changes nothing (a row takes its latest window either way)."""

    MAX_LOG_ROWS = 200_000  # changed rows kept for patching; past this, start afresh
    TAIL_ROWS = 256  # commits share the open log entry until it holds this many rows

    def __init__(self, max_bytes: int):
        self.items: BytesLRU[str] = BytesLRU(max_bytes, lambda item: item[0])  # key -> (arrays, last commit seen)
        self.log: list[ChangedWindows] = []
        self.log_rows = 0
        self.seq = 0  # commits recorded
        self.epoch = 0  # moves when the log starts afresh
        self.lock = threading.Lock()
        self._tail: Optional[ChangedWindows] = None  # the open entry small commits join
        self._convert_lock = threading.Lock()
        # Words of logged windows -> ids, and the next id, for this epoch's entries only.
        self._words: tuple[dict[str, int], Iterator[int]] = ({}, itertools.count())
        self._merged: OrderedDict[tuple[int, int, int], tuple[np.ndarray, np.ndarray, bool]] = OrderedDict()

    def record(self, counts: TermCounts) -> None:
        """A commit's changed windows: each changed row's term counts now (None: gone)."""
        if not counts:
            return
        with self.lock:
            if self.log_rows + len(counts) > self.MAX_LOG_ROWS:
                self.items.clear()
                self.log.clear()
                self.log_rows = 0
                self.epoch += 1
                self._tail = None
                self._words = ({}, itertools.count())
                self._merged.clear()
                return
            self.seq += 1
            tail = self._tail
            if tail is None or tail.size + len(counts) > self.TAIL_ROWS:
                tail = ChangedWindows(self.seq)
                self.log.append(tail)
                self._tail = tail if len(counts) < self.TAIL_ROWS else None  # a large commit keeps its own
            tail.add(self.seq, counts)
            self.log_rows += len(counts)

    def get(self, key: str, load: Callable[[], tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
        with self.lock:
            seen, epoch, words = self.seq, self.epoch, self._words  # before loading: a later commit is patched in later
            hit = self.items.get(key)
            pending: list[ChangedWindows] = []
            if hit is not None and hit[1] < seen:
                self._tail = None  # no commit joins an entry being read
                start = bisect.bisect_right(self.log, hit[1], key=lambda entry: entry.last)
                pending, span = self.log[start:], (epoch, start, len(self.log))
            if hit is not None and pending and not key.startswith("t:"):
                hit = None
        if hit is not None and not pending:
            with self.lock:
                if self.items.get(key) is hit:
                    self.items.move_to_end(key)  # the most recently used last (evicted last)
            return hit[0]
        if hit is not None:
            arrays = self._patched(key[2:], hit[0], pending, span, words)
        else:
            arrays = load()
        with self.lock:
            if self.epoch == epoch:  # not started afresh meanwhile
                self.items.keep(key, (arrays, seen))
        return arrays

    def convert_closed(self) -> None:
        """Convert the log's closed entries now, while terms are cached to patch (a background
        thread after commits), so that the first search after an import does not: the
        conversion is most of that search's time."""
        with self.lock:
            if not self.items:
                return
            waiting = [entry for entry in self.log if entry is not self._tail and not entry.converted]
            term_ids, next_id = self._words
        with self._convert_lock:
            for entry in waiting:
                entry.convert(term_ids, next_id)

    def _patched(self, term: str, arrays: tuple[np.ndarray, ...], pending: list[ChangedWindows],
                 span: tuple[int, int, int], words: tuple[dict[str, int], Iterator[int]]) -> tuple[np.ndarray, ...]:
        term_ids, next_id = words  # (the entries' epoch's, even if the log started afresh since)
        with self._convert_lock:  # (each entry converted once, whoever asks first)
            for entry in pending:
                entry.convert(term_ids, next_id)
            merged = self._merged.get(span)
            if merged is None:
                merged = self._merged[span] = latest_changes(pending)
                while len(self._merged) > 8:
                    self._merged.popitem(last=False)
        return patch_postings(term_ids.get(term), arrays, pending, merged)

    @property
    def size(self) -> int:
        """Bytes held."""
        return self.items.held


def _nbytes(arrays: tuple[np.ndarray, ...]) -> int:
    return sum(int(a.nbytes) for a in arrays)


def latest_changes(entries: list[ChangedWindows]) -> tuple[np.ndarray, np.ndarray, bool]:
    """Over consecutive log entries: every changed row (sorted, distinct), the index of the
    last entry that changed each, and whether any row is in more than one entry."""
    parts = [entry.arrays[0] for entry in entries]
    rows = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    index = np.repeat(np.arange(len(parts)), [part.size for part in parts])
    order = np.lexsort((index, rows))
    rows, index = rows[order], index[order]
    last = np.append(rows[1:] != rows[:-1], True) if rows.size else np.empty(0, dtype=bool)
    return rows[last], index[last], bool(not last.all())


def patch_postings(term_id: Optional[int], arrays: tuple[np.ndarray, ...], entries: list[ChangedWindows],
                   merged: tuple[np.ndarray, np.ndarray, bool]) -> tuple[np.ndarray, ...]:
    """A term's (sorted rowids, tf) with the changed rows' postings replaced by their latest
    ones (`merged`: `latest_changes(entries)`)."""
    changed, last_entry, repeated = merged
    found = [entry.postings(term_id) for entry in entries]
    rows = np.concatenate([f[0] for f in found]) if found else np.empty(0, dtype=np.int64)
    counts = np.concatenate([f[1] for f in found]) if found else np.empty(0, dtype=np.int64)
    if len(found) > 1:
        if repeated:  # a row some later entry changed again takes its window from that one
            index = np.repeat(np.arange(len(found)), [f[0].size for f in found])
            keep = last_entry[np.searchsorted(changed, rows)] == index
            rows, counts = rows[keep], counts[keep]
        order = np.argsort(rows, kind="stable")
        rows, counts = rows[order], counts[order]
    rowids, tf = arrays
    return replace_rows(rowids, tf, changed, rows, counts, count_dtype)


# Sorted row numbers with a parallel column, patched by changed rows (both stores' caches).
def row_dtype(top: int) -> Any:
    """The type row numbers (SQLite rowids, PostgreSQL seqs) up to `top` are kept in: int32 while they fit."""
    return np.int32 if top < 2**31 else np.int64


def members(sorted_values: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The positions in `sorted_values` of those of `values` it holds."""
    values = _as_type_of(sorted_values, values)
    at = np.searchsorted(sorted_values, values)
    inside = at < sorted_values.size
    at = at[inside]
    return at[sorted_values[at] == values[inside]]


def _as_type_of(sorted_values: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`values` in `sorted_values`' type (those it cannot hold left out: none of them is there),
    so that searching does not first convert the whole sorted array to the wider type."""
    if values.dtype == sorted_values.dtype:
        return values
    return values[values <= np.iinfo(sorted_values.dtype).max].astype(sorted_values.dtype)


def _widened(values: np.ndarray, top: int, dtype: Callable[[int], Any]) -> np.ndarray:
    """`values` in a type that also holds `top` (`dtype(top)`: the smallest that does); never narrower."""
    wanted = np.promote_types(values.dtype, dtype(top))
    return values if wanted == values.dtype else values.astype(wanted)


def replace_rows(seqs: np.ndarray, column: np.ndarray, changed: np.ndarray, new_seqs: np.ndarray,
                 new_column: np.ndarray, column_dtype: Callable[[int], Any]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted `seqs` (row numbers) and their parallel `column` with the `changed` rows taken
    out and `new_seqs` (sorted, among the changed) with their values put in their place;
    either array widened when a new value does not fit its type (`column_dtype(largest)`)."""
    gone = members(seqs, changed)
    if not gone.size and not new_seqs.size:  # none of the changed rows is or was here
        return seqs, column
    kept, values = (np.delete(seqs, gone), np.delete(column, gone)) if gone.size else (seqs, column)
    top = int(new_seqs.max()) if new_seqs.size else 0
    kept = _widened(kept, top, row_dtype)
    values = _widened(values, int(new_column.max()) if new_column.size else 0, column_dtype)
    new_seqs = new_seqs.astype(kept.dtype)  # (widened above to hold them)
    at = np.searchsorted(kept, new_seqs)
    return np.insert(kept, at, new_seqs), np.insert(values, at, new_column.astype(values.dtype))


def bm25_scores(n: int, total_len: int, lengths: np.ndarray, matched: np.ndarray,
                term_hits: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """BM25 of each matched row. `matched`: sorted positions of the rows the query matches;
    `lengths`: every admitted row's window length (indexed by position); `term_hits`: per query
    term, in term order, the sorted positions and frequencies of the admitted rows holding it.
    A term's document frequency counts the matched rows holding it (as FTS5 counts over the
    rows its query matches)."""
    scores = np.zeros(matched.size, dtype=np.float64)
    if not matched.size or not n:
        return scores
    norm = length_norm(lengths[matched], total_len / n)
    # Where each admitted position sits among the matched ones (-1: not matched): one lookup
    # per posting instead of a binary search (a common word at a million rows).
    where = np.full(lengths.size, -1, dtype=np.int64)
    where[matched] = np.arange(matched.size, dtype=np.int64)
    for pos, tf in term_hits:  # always in term order: equal inputs, equal bits
        at = where[pos]
        keep = at >= 0
        at, tf = at[keep], tf[keep]
        scores[at] += term_score(fts5_idf(n, int(at.size)), tf, norm[at])
    return scores


TOP_K_BLOCK = 64


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the positive scores that can be among the best k once ties are broken by id:
    the best k and every score equal to the k-th."""
    if k > 0 and scores.size >= 16 * TOP_K_BLOCK * k:
        # Over a million scores, most of them positive: a floor first. At least k blocks
        # hold a score >= the k-th best block maximum, so the k-th best score is at least
        # that: only the scores past it are partitioned (the same rows, in the same order).
        # Any partition into blocks will do: block j holds every (size // 64)-th score from
        # j, so the maxima are 64 rows' elementwise maximum (SIMD), not a maximum of each
        # 64 neighbours.
        whole = scores.size // TOP_K_BLOCK * TOP_K_BLOCK
        maxima = scores[:whole].reshape(TOP_K_BLOCK, -1).max(axis=0)
        floor = np.partition(maxima, maxima.size - k)[maxima.size - k]
        if floor > 0:
            candidates = np.flatnonzero(scores >= floor)
            kth = -np.partition(-scores[candidates], k - 1)[k - 1]
            return candidates[scores[candidates] >= kth]
    positive = np.flatnonzero(scores > 0)
    if positive.size <= k:
        return positive
    kth = -np.partition(-scores[positive], k - 1)[k - 1]
    return positive[scores[positive] >= kth]


def admitted_lengths(rows: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, int]:
    """(rowids, lengths, summed length) from (rowid, length) rows, sorted by rowid."""
    arr = np.array(rows, dtype=np.int64).reshape(-1, 2)
    arr = arr[np.argsort(arr[:, 0], kind="stable")]
    return arr[:, 0].copy(), arr[:, 1].copy(), int(arr[:, 1].sum())


def int_list(text: Optional[str]) -> np.ndarray:
    """A comma-separated list of integers (SQL `group_concat`) as an array."""
    if not text:
        return np.empty(0, dtype=np.int64)
    return np.fromstring(text, dtype=np.int64, sep=",")  # text mode: parsed in C


def count_dtype(largest: int) -> np.dtype:
    """The smallest unsigned integer type holding term counts up to `largest` (most words
    occur once or twice in a window: one byte a cached posting instead of four; the scores
    computed from them are the same, exact integers promoted to float64)."""
    return np.dtype(np.uint8 if largest < 256 else np.uint16 if largest < 65536 else np.uint32)


def doc_counts(docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct row ids as int32, occurrences of each in the smallest type that holds them:
    5 bytes a cached posting for most words); in row id order, as FTS lists them, without a sort."""
    if not docs.size:
        return np.empty(0, dtype=np.int32), np.empty(0, dtype=np.uint8)
    if not (docs[1:] >= docs[:-1]).all():
        docs = np.sort(docs)
    starts = np.flatnonzero(np.concatenate(([True], docs[1:] != docs[:-1])))
    counts = np.diff(np.append(starts, docs.size))
    return docs[starts].astype(np.int32), counts.astype(count_dtype(int(counts.max())))


def union_positions(parts: list[np.ndarray], n: int) -> np.ndarray:
    """The sorted distinct positions (each < n) of several arrays: a mark per position, not
    a sort of their concatenation (a million rows for a common word)."""
    mask = np.zeros(n, dtype=bool)
    for part in parts:
        mask[part] = True
    return np.flatnonzero(mask)
