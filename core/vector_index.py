"""An in-memory vector index for one embedding model, keyed by the store's row ids.

The database stays the truth; this is a cache of its vectors, caught up incrementally (the
store hands over rows whose vector changed since the last catch-up, see `SQLiteStore`).
It never decides *which* rows may be returned: the caller passes the row ids its SQL filter
allowed (access, owner, type, status, metadata), so a vector of a since-deleted or unreadable
cell left here can never leak, and a top-k is never short because better, unreadable rows
took the places.

Search is exact (each allowed row's dot product with the query, `row_dots`). Past
`ann_threshold` vectors, and when `hnswlib` is installed (`pip install 'ampkit[ann]'`), an
HNSW graph, built (or loaded from where the store saved it) in a background thread while the
exact scan answers, serves the wide queries; its hits are intersected with the allowed rows, and when
that leaves fewer than k the search falls back to the exact scan, so the ANN only ever makes
a query faster, never shorter.

A few new vectors go into the graph as they are caught up; more (an import's) wait in a
backlog the store's background thread adds a chunk at a time (`drain_graph`): inserting
is slow per vector, and the first search after an import would otherwise pay for them all. Meanwhile the rows of the backlog are scored exactly beside the graph's hits, so a
search never misses a row because the graph does not hold it yet.

The vectors sit in blocks of `block_rows` rows: the index grows by a block, never by a copy of
what it holds (doubling one large matrix would stall the first search after an import, with
the index's lock held).

Only a vector's leading `width` dimensions are kept, the rest being zero in every vector held:
the default model's vectors of Latin text end in a 128-dimension block for Korean, Japanese and
Chinese character pairs that is all zero (that text gets another model's vector), a third of
each vector. A dot product over the kept dimensions equals the whole one (every product left
out is 0). A vector that uses more widens every row (a copy) and drops the graph, which is
built again (`_widen`).
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import numpy as np

DEFAULT_ANN_THRESHOLD = 200_000
MAX_ANN_FETCH = 5_000  # neighbours one approximate query may ask the graph for
GRAPH_SYNC_ROWS = 64  # up to this many caught-up vectors go into the graph at once (a short pause)
BLOCK_ROWS = 1 << 16  # vectors per block (96 MB at 384 dimensions; its pages are taken as rows fill it)


class VectorIndex:
    def __init__(self, dim: int, ann_threshold: Optional[int] = DEFAULT_ANN_THRESHOLD,
                 block_rows: int = BLOCK_ROWS):
        if block_rows <= 0 or block_rows & (block_rows - 1):
            raise ValueError("block_rows must be a power of two")
        self.dim = dim  # the model's vector size
        self.width = 0  # leading dimensions kept: past them every vector held is zero
        self.ann_threshold = ann_threshold  # None: exact search only, at any size
        # slot -> self._blocks[slot >> self._shift][slot & self._mask]. The first block doubles
        # from 1,024 rows up to block_rows (a small index stays small); then one more block
        # at a time.
        self._shift, self._mask = block_rows.bit_length() - 1, block_rows - 1
        self._blocks = [np.zeros((min(1024, block_rows), 0), dtype=np.float32)]
        self._rowids = np.zeros(1024, dtype=np.int64)  # slot -> rowid
        self._slot_of = np.full(1024, -1, dtype=np.int64)  # rowid -> slot (rowids are dense ints)
        self._count = 0
        self._backlog = np.zeros(1024, dtype=bool)  # slot -> its current vector is not in the graph yet
        self._backlog_n = 0
        self._draining = False  # a background drain is claimed (`claim_drain`)
        self._ann: Any = None  # hnswlib.Index (untyped), built in the background past the threshold
        self.ann_state = "none"  # none | building | ready | unavailable
        self.ann_dirty = False  # changed since it was last saved
        self._lock = threading.Lock()
        # The slots of recent allowed sets (a wide filter's admitted rows, the same array
        # object while its cache holds it), valid until a row is placed or forgotten:
        # id(allowed) -> (allowed, version, slots, [mark per slot or None]).
        self._version = 0
        self._allowed_slots: dict[int, tuple[np.ndarray, int, np.ndarray, list[Optional[np.ndarray]]]] = {}

    def __len__(self) -> int:
        return self._count

    @property
    def uses_ann(self) -> bool:
        return self._ann is not None

    def upsert(self, rowids: np.ndarray, vectors: np.ndarray) -> None:
        """Add or replace the vectors of these rows."""
        if len(rowids) == 0:
            return
        vectors = np.asarray(vectors, dtype=np.float32).reshape(len(rowids), self.dim)
        added_rowids = rowids
        with self._lock:
            self._version += 1
            used = np.flatnonzero(vectors[:, self.width :].any(axis=0))
            if used.size:
                self._widen(self.width + int(used[-1]) + 1)
            vectors = vectors[:, : self.width]
            top = int(rowids.max())
            if top >= len(self._slot_of):
                grown = np.full(max(top + 1, 2 * len(self._slot_of)), -1, dtype=np.int64)
                grown[: len(self._slot_of)] = self._slot_of
                self._slot_of = grown
            if np.unique(rowids).size == rowids.size and (self._slot_of[rowids] < 0).all():
                # All new rows (a warm-up's chunk, a batch of creates): placed at once.
                start, end = self._count, self._count + len(rowids)
                while end > self._capacity:
                    self._grow()
                self._slot_of[rowids] = np.arange(start, end, dtype=np.int64)
                self._rowids[start:end] = rowids
                self._put_span(start, vectors)
                self._count = end
                rowids, vectors = rowids[:0], vectors[:0]
            for rowid, vec in zip(rowids.tolist(), vectors):
                slot = int(self._slot_of[rowid])
                if slot < 0:
                    slot = self._count
                    if slot == self._capacity:
                        self._grow()
                    self._slot_of[rowid] = slot
                    self._rowids[slot] = rowid
                    self._count += 1
                self._blocks[slot >> self._shift][slot & self._mask] = vec
            if self._ann is not None:
                self._into_graph(self._slot_of[added_rowids])
            elif self.ann_state == "building":  # (the graph being built may hold their old vectors)
                self._to_backlog(self._slot_of[added_rowids])

    def discard(self, rowids: np.ndarray) -> None:
        """Forget these rows (their vector is now another model's); a search never returns
        them (a row stays in the graph, unreachable: its slot is gone)."""
        with self._lock:
            self._version += 1
            rowids = rowids[(rowids >= 0) & (rowids < len(self._slot_of))]
            self._slot_of[rowids] = -1

    def _grow(self) -> None:
        """(The lock held.) Room for more slots: the first block doubles until it is full
        size, then a new block (its memory taken as rows fill it). Slot arrays double."""
        first = self._blocks[0]
        if len(self._blocks) == 1 and len(first) <= self._mask:
            grown = np.zeros((2 * len(first), self.width), dtype=np.float32)
            grown[: len(first)] = first
            self._blocks[0] = grown
        else:
            self._blocks.append(np.zeros((self._mask + 1, self.width), dtype=np.float32))
        capacity = self._capacity
        if capacity > len(self._rowids):
            size = max(capacity, 2 * len(self._rowids))
            rowids = np.zeros(size, dtype=np.int64)
            rowids[: len(self._rowids)] = self._rowids
            backlog = np.zeros(size, dtype=bool)
            backlog[: len(self._backlog)] = self._backlog
            self._rowids, self._backlog = rowids, backlog

    def _widen(self, width: int) -> None:
        """(The lock held.) Keep `width` leading dimensions from now on: every block copied
        wider (its new columns zero, as the vectors held are there), and the graph, whose
        vectors are narrower, dropped: the next search builds one anew (exact meanwhile)."""
        self._blocks = [np.pad(block, ((0, 0), (0, width - self.width))) for block in self._blocks]
        self.width = width
        if self._ann is not None or self.ann_state == "building":
            self._ann = None  # (a graph being built is refused at install: `install_ann`)
            self.ann_state = "none"
            self.ann_dirty = False
            self._backlog[:] = False
            self._backlog_n = 0

    @property
    def _capacity(self) -> int:
        """Slots the blocks have room for (every block but the last is full size)."""
        return (len(self._blocks) - 1) * (self._mask + 1) + len(self._blocks[-1])

    def _pieces(self, lo: int, hi: int) -> list[np.ndarray]:
        """(The lock held.) Slots lo..hi-1 as views, one per block they lie in."""
        pieces = []
        while lo < hi:
            block, offset = lo >> self._shift, lo & self._mask
            take = min(hi - lo, self._mask + 1 - offset)
            pieces.append(self._blocks[block][offset : offset + take])
            lo += take
        return pieces

    def _put_span(self, start: int, vectors: np.ndarray) -> None:
        done = 0
        for piece in self._pieces(start, start + len(vectors)):
            piece[:] = vectors[done : done + len(piece)]
            done += len(piece)

    def _by_block(self, slots: np.ndarray) -> list[tuple[Any, np.ndarray]]:
        """(The lock held.) For each block these slots lie in: the positions in `slots` of
        those in it, and their rows there."""
        blocks = slots >> self._shift
        if slots.size == 0 or blocks.min() == blocks.max():
            return [(slice(None), self._blocks[int(blocks[0]) if slots.size else 0][slots & self._mask])]
        parts: list[tuple[Any, np.ndarray]] = []
        for block in np.unique(blocks).tolist():
            at = np.flatnonzero(blocks == block)
            parts.append((at, self._blocks[block][slots[at] & self._mask]))
        return parts

    def _rows(self, slots: np.ndarray) -> np.ndarray:
        """(The lock held.) These slots' vectors, gathered into one array in their order."""
        parts = self._by_block(slots)
        if len(parts) == 1:
            return parts[0][1]
        rows = np.empty((slots.size, self.width), dtype=np.float32)
        for at, part in parts:
            rows[at] = part
        return rows

    # ------------------------------------------------------------ approximate index
    def wants_ann(self) -> bool:
        return (self.ann_state == "none" and self.ann_threshold is not None and self._count >= self.ann_threshold
                and self.width > 0)  # (vectors all zero: nothing to build a graph of)

    def build_ann(self) -> None:
        """Build the HNSW graph, outside the lock: searches keep using the exact scan
        meanwhile; then install it (`install_ann`)."""
        prepared = self.prepare_ann()
        if prepared is not None:
            self.install_ann(prepared)

    def prepare_ann(self, saved: Optional[str] = None, saved_width: int = 0) -> Optional[tuple[Any, bool, int]]:
        """The graph of the vectors held now (of their kept dimensions: `width`), built, or
        loaded from `saved` when it has `saved_width` dimensions as they do (outside the lock),
        to install (`install_ann`); None without hnswlib."""
        try:
            import hnswlib
        except ImportError:  # the exact scan keeps working, only slower
            self.ann_state = "unavailable"
            return None
        self.ann_state = "building"
        with self._lock:
            n, width = self._count, self.width
            if saved_width != width:
                saved = None
            if saved is None:  # (a copy: rows may change while the graph is built)
                pieces = self._pieces(0, n)
                matrix = np.concatenate(pieces) if pieces else np.zeros((0, width), dtype=np.float32)
                rowids = self._rowids[:n].copy()
        index = hnswlib.Index(space="ip", dim=width)  # vectors are L2-normalised
        if saved is not None:
            index.load_index(saved, max_elements=max(2 * n, 1024))
        else:
            index.init_index(max_elements=max(2 * n, 1024), ef_construction=100, M=16)
            index.add_items(matrix, rowids)
        index.set_ef(128)
        return index, saved is not None, width

    def install_ann(self, prepared: tuple[Any, bool, int], changed: Optional[np.ndarray] = None) -> None:
        """Serve wide searches from a prepared graph. The `changed` row ids (changed since a
        loaded graph was saved) join it through `_into_graph`: a few at once, more through the
        backlog, so /health's `approximate: ready` and the backlog it must still take in are
        set together. (Rows placed or changed while it was prepared are in the backlog
        already: `upsert`; a graph of fewer dimensions than are kept now is refused: `_widen`.)"""
        index, loaded, width = prepared
        with self._lock:
            if width != self.width:
                return
            self._ann = index
            self.ann_dirty = not loaded
            if changed is not None and changed.size:
                found = self._slot_of[changed[(changed >= 0) & (changed < len(self._slot_of))]]
                if (found >= 0).any():
                    self._into_graph(found[found >= 0])
            self.ann_state = "ready"

    def _into_graph(self, slots: np.ndarray) -> None:
        """(The lock held.) These slots' current vectors into the graph: at once when they are
        few and none wait, else into the backlog (`drain_graph`), which keeps them in order."""
        slots = np.unique(slots)
        if not self._backlog_n and slots.size <= GRAPH_SYNC_ROWS:
            self._ann_add(self._rowids[slots], self._rows(slots))
        else:
            self._to_backlog(slots)

    def _to_backlog(self, slots: np.ndarray) -> None:
        """(The lock held.) These slots wait for the graph: `drain_graph` adds them, searches
        score them exactly until then. Rows placed or changed while a graph is built wait
        here too, to join it once it is installed (its copy may hold their old vectors)."""
        slots = np.unique(slots)
        self._backlog_n += int((~self._backlog[slots]).sum())
        self._backlog[slots] = True

    @property
    def graph_backlog(self) -> int:
        """Vectors caught up but not in the approximate graph yet."""
        return self._backlog_n

    def claim_drain(self) -> bool:
        """Whether the caller should start draining the backlog (none is, and there is one)."""
        if self._draining or not self._backlog_n:  # (every search asks: no wait for a drain's chunk)
            return False
        with self._lock:
            if self._draining or not self._backlog_n or self._ann is None:
                return False
            self._draining = True
            return True

    def drain_graph(self, max_rows: int) -> int:
        """Add up to `max_rows` vectors of the backlog to the graph (holding the lock: hnswlib
        cannot search and insert at once) and return how many are left; at none, the claim
        ends (`claim_drain`)."""
        with self._lock:
            if self._ann is None:
                self._draining = False
                return 0
            slots = np.flatnonzero(self._backlog[: self._count])[:max_rows]
            self._backlog[slots] = False
            self._backlog_n -= slots.size
            rowids = self._rowids[slots]
            live = self._slot_of[rowids] == slots  # (a row forgotten since is left out)
            if live.any():
                self._ann_add(rowids[live], self._rows(slots[live]), threads=1)  # a core left for searches
            if not self._backlog_n:
                self._draining = False
            return self._backlog_n

    def release_drain(self) -> None:
        """The drain stopped (a store closed meanwhile): the next catch-up may claim it again."""
        with self._lock:
            self._draining = False

    def save_ann(self, path: str) -> bool:
        """Save the graph; not while it lacks vectors of its backlog (the file saved before,
        with the vector sequence it covers, stays, and a restart adds what changed since)."""
        with self._lock:
            if self._ann is None or self._backlog_n:
                return False
            self._ann.save_index(path)
            self.ann_dirty = False
            return True

    def _ann_add(self, rowids: np.ndarray, vectors: np.ndarray, threads: int = -1) -> None:
        """(The lock held.) Every change to the graph: it then differs from the one saved."""
        self.ann_dirty = True
        index = self._ann
        needed = index.get_current_count() + len(rowids)
        if needed > index.get_max_elements():
            index.resize_index(2 * needed)
        index.add_items(vectors, rowids, num_threads=threads)  # an existing label is updated in place

    # ------------------------------------------------------------ search
    def search(self, query: np.ndarray, allowed: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Top-k (rowid, cosine) among the `allowed` row ids, best first."""
        query = np.asarray(query, dtype=np.float32).reshape(self.dim)
        with self._lock:
            query = np.ascontiguousarray(query[: self.width])  # (past it every product is 0)
            slots, marks = self._slots(allowed)
            if len(slots) == 0 or k <= 0:
                return []
            if self._ann is not None and len(slots) > 4 * k:
                hits = self._search_ann(query, slots, k, marks)
                if hits is not None:
                    return hits
            scores = self._dots(slots, query)
            top = _top_k(scores, k)
            return [(int(self._rowids[slots[i]]), float(scores[i])) for i in top]

    def _dots(self, slots: np.ndarray, query: np.ndarray) -> np.ndarray:
        """(The lock held.) These slots' dot products with the query. `row_dots` gives a row
        the same bits wherever it sits, so both ways give the same scores: when the slots fill
        at least an eighth of the span they lie in (where gathering a row costs ~8 times its
        product), every row of the span's product, then theirs (no copy); else the slots'
        rows gathered. (Which one runs changes a search's time, never its answer.)"""
        lo, hi = int(slots.min()), int(slots.max()) + 1
        if hi - lo <= 8 * len(slots):
            return np.concatenate([row_dots(piece, query) for piece in self._pieces(lo, hi)])[slots - lo]
        dots = np.empty(slots.size, dtype=np.float32)
        for at, rows in self._by_block(slots):
            dots[at] = row_dots(rows, query)
        return dots

    def holds_any(self, allowed: np.ndarray) -> bool:
        """Whether any of the `allowed` row ids has a vector here (their slots are kept for
        the search that usually follows, as `search` keeps them)."""
        with self._lock:
            return bool(len(self._slots(allowed)[0]))

    def _slots(self, allowed: np.ndarray) -> tuple[np.ndarray, list[Optional[np.ndarray]]]:
        """The current slots of the allowed rows, and a holder for their mark per slot; kept
        for an allowed array searched again (a million rows for an analyst's filter) until a
        row is placed or forgotten."""
        memo = self._allowed_slots.get(id(allowed))
        if memo is not None and memo[0] is allowed and memo[1] == self._version:
            return memo[2], memo[3]
        given = allowed
        allowed = allowed[(allowed >= 0) & (allowed < len(self._slot_of))]
        slots = self._slot_of[allowed]
        slots = slots[slots >= 0]
        marks: list[Optional[np.ndarray]] = [None]
        if given.size > 10_000:  # small sets cost little to find again
            if len(self._allowed_slots) >= 16:
                self._allowed_slots.clear()
            self._allowed_slots[id(given)] = (given, self._version, slots, marks)
        return slots, marks

    def _search_ann(self, query: np.ndarray, slots: np.ndarray, k: int,
                    marks: list[Optional[np.ndarray]]) -> Optional[list[tuple[int, float]]]:
        # A selective filter (a team's tenth of the store) keeps about its share of the graph's
        # neighbours: ask for enough that k survive, rather than fall back to an exact scan
        # of a hundred thousand gathered rows; past MAX_ANN_FETCH the exact scan is cheaper.
        fetch = min(self._count, max(10 * k, 200, int(3 * k * self._count / len(slots))))
        if fetch > MAX_ANN_FETCH:
            return None
        labels, distances = self._ann.knn_query(query, k=fetch)
        # Membership by slot (a mark per slot, not a set of up to a million Python ints):
        # a label counts when its row's current slot is among the allowed ones.
        allowed = marks[0]
        if allowed is None or allowed.size != self._count:
            allowed = marks[0] = np.zeros(self._count, dtype=bool)
            allowed[slots] = True
        rows = labels[0].astype(np.int64)
        in_range = (rows >= 0) & (rows < len(self._slot_of))
        label_slots = np.full(rows.size, -1, dtype=np.int64)
        label_slots[in_range] = self._slot_of[rows[in_range]]
        ok = label_slots >= 0
        ok[ok] = allowed[label_slots[ok]]
        if self._backlog_n:  # (the graph may hold an older vector of a row in the backlog)
            ok[ok] = ~self._backlog[label_slots[ok]]
        hits = [(int(r), 1.0 - float(d)) for r, d, keep in zip(rows, distances[0], ok) if keep]
        if self._backlog_n:  # the allowed rows the graph does not hold yet, scored exactly
            waiting = np.flatnonzero(self._backlog[: self._count] & allowed)
            if waiting.size:
                scores = self._dots(waiting, query)  # (an import's rows: side by side at the end)
                hits += [(int(self._rowids[waiting[i]]), float(scores[i])) for i in _top_k(scores, k)]
                hits.sort(key=lambda hit: -hit[1])
        return hits[:k] if len(hits) >= k else None


def row_dots(rows: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Each row's dot product with `query`, each summed in one order of its own (numpy's
    einsum loop), so a row's bits never depend on the rows beside it. A BLAS matrix-vector
    product's can (by where a row falls in its blocks), which made the exact scan gather a
    caller's rows before multiplying: a copy of every row an analyst may read, dearer than
    an einsum over every row."""
    return np.einsum("ij,j->i", rows, query)


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    if len(scores) > k:
        part = np.argpartition(-scores, k - 1)[:k]
    else:
        part = np.arange(len(scores))
    return part[np.argsort(-scores[part], kind="stable")]
