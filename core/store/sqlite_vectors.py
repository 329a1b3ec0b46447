"""The dense leg of a SQLite store: its stored vectors in memory, exact or approximate.

Vectors are rows (`cells.embedding`, float16, ordered by `vec_seq`, migration 10); this
module keeps them in one in-memory `ampkit.vector_index.VectorIndex` per embedding model,
caught up from the rows any process writes (`catch_up`). After an open the index loads in the
background (`warm`), and past the approximate threshold it builds or loads an HNSW graph
(`build`) and drains what a catch-up left out of it (`drain`), all on the store's scheduler.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from typing import Any, Optional, Sequence

import numpy as np

from ..errors import Unavailable
from ..vector_index import DEFAULT_ANN_THRESHOLD, VectorIndex, _top_k, row_dots
from .base import Candidate, CellFilter
from .indexes import SQLiteRows
from .sqlite_access import SQLiteAccessIndex, filter_sql

# The warm-up of an open() waits at most this long for the term warm-up to load the access
# snapshot (`SQLiteAccessIndex.first`), so the two loads do not share the cores.
SNAPSHOT_FIRST_WAIT_S = 30.0
# Vectors an import left out of the approximate graph go in this many at a time, in the
# background (`drain`); then the drain pauses so that searches waiting for the graph go first.
GRAPH_DRAIN_ROWS = 64
GRAPH_DRAIN_PAUSE_S = 0.005


def _decode_vectors(blobs: Sequence[bytes], dims: Sequence[Optional[int]]) -> Optional[np.ndarray]:
    """Many stored float16 embeddings of one size as one float32 matrix, decoded at once;
    None when they differ."""
    dim = dims[0]
    if not dim or any(d != dim for d in dims) or any(len(b) != 2 * dim for b in blobs):
        return None
    return np.frombuffer(b"".join(blobs), dtype=np.float16).reshape(len(blobs), dim).astype(np.float32)


def decode_vector(blob: bytes, dim: Optional[int]) -> np.ndarray:
    """A stored embedding as float32: float16 since migration 2, float32 before it."""
    dtype = np.float16 if dim and len(blob) == 2 * dim else np.float32
    return np.frombuffer(blob, dtype=dtype).astype(np.float32)


def _saved_graph_meta(path: str) -> Optional[dict[str, Any]]:
    """What `SQLiteVectorIndex.save_graph` wrote beside a saved graph (the vector sequence it
    covers, its dimension, its model), when both files are there."""
    try:
        with open(path + ".json") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    ok = isinstance(meta, dict) and isinstance(meta.get("dim"), int) and isinstance(meta.get("vec_seq"), int)
    return meta if ok and os.path.exists(path) else None


class SQLiteVectorIndex:
    """The dense leg over one SQLite store's vectors (`VectorIndex` protocol)."""

    def __init__(self, rows: SQLiteRows, access: SQLiteAccessIndex, *,
                 ann_threshold: Optional[int] = DEFAULT_ANN_THRESHOLD, warm_exact_max: int = 20000):
        self.rows = rows
        self.access = access
        # Vectors past which wide searches use the approximate graph; None: never
        # (`approximate_search` off: docs/security.md, "Approximate search").
        self.ann_threshold = ann_threshold
        self.warm_exact_max = warm_exact_max  # admitted rows ranked from the table while the index loads
        self.by_model: dict[str, VectorIndex] = {}  # embedding model -> in-memory index
        self.seq = 0  # highest cells.vec_seq loaded
        # Held per chunk of a catch-up and by the store's close() (which closes the connections).
        self.lock = threading.Lock()
        self.ready = threading.Event()

    # ------------------------------------------------------------ lifetime
    def opened(self) -> None:
        """The index loads in the background (`warm`): a restarted server answers at once (the
        dense leg meanwhile ranks small filtered sets from the table)."""
        self.ready.clear()
        self.rows.scheduler.run("vectors.warmup", self.warm, self.rows.opened)

    def save_graphs(self) -> None:
        """At close: the graphs changed since saved, so that a restart loads them."""
        for model, index in list(self.by_model.items()):
            if index.ann_state == "ready" and index.ann_dirty:
                try:
                    self.save_graph(model, index)
                except OSError:
                    pass

    def wait(self, timeout: Optional[float] = None) -> None:
        """Until the background loading and graph building started so far are done, and what
        they started meanwhile (a graph built or loaded starts draining its backlog)."""
        self.rows.scheduler.join("vectors.", timeout)

    @property
    def warming(self) -> bool:
        """True while the index is still loading after open, or while its approximate graph is
        being built or loaded."""
        return not self.ready.is_set() or any(index.ann_state == "building" for index in list(self.by_model.values()))

    def state(self) -> dict[str, Any]:
        states = {index.ann_state for index in self.by_model.values()} - {"none"}
        return {
            "state": "loading" if not self.ready.is_set() else "ready" if self.by_model else "none",
            "vectors": sum(len(index) for index in self.by_model.values()),
            "approximate": "off" if self.ann_threshold is None
            else next((s for s in ("building", "ready", "unavailable") if s in states), "none"),
            # caught-up vectors not in the approximate graph yet (scored exactly meanwhile)
            "approximate_backlog": sum(index.graph_backlog for index in list(self.by_model.values())),
        }

    # ------------------------------------------------------------ catching up
    def catch_up(self) -> None:
        """Load vectors written since the last call (by this process or any other)."""
        while True:
            # One chunk per hold of the lock: close() takes it before closing the connections,
            # so the background warm-up never reads from a connection being closed (a crash in
            # the sqlite3 module), and never holds close() up for the whole load.
            with self.lock:
                if not self.rows.current(self.rows.opened):  # closed meanwhile
                    return
                rows = self.rows._query(
                    "SELECT rowid, embed_model, embedding, vec_seq, embed_dim FROM cells "
                    "WHERE vec_seq > ? ORDER BY vec_seq LIMIT 20000",
                    (self.seq,),
                )
                if not rows:
                    for held in self.by_model.values():
                        self._start_drain(held)
                    return
                # Each row's vector is now its model's, or none (a row written without one):
                # every other index forgets the rowid. So a vector that moved to another model
                # leaves the old index, and a purged row's vector never stays under its rowid
                # when a new row reuses it (it would rank a readable cell by the text of one
                # its reader could not read).
                changed = np.asarray([row[0] for row in rows], dtype=np.int64)
                now_of = np.asarray([row[1] if row[2] is not None else None for row in rows], dtype=object)
                for name, loaded in self.by_model.items():
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
                    index = self.by_model.get(model)
                    if index is None or index.dim != matrix.shape[1]:
                        index = self.by_model[model] = VectorIndex(matrix.shape[1], self.ann_threshold)
                    index.upsert(np.asarray(ids, dtype=np.int64), matrix)
                self.seq = rows[-1][3]

    def catch_up_if_ready(self) -> None:
        """New vectors into the index now rather than at the next search, once it is loaded."""
        if self.ready.is_set():
            try:
                self.catch_up()
            except (Unavailable, sqlite3.Error):  # (closed meanwhile: the next search catches up)
                pass

    # ------------------------------------------------------------ background
    def graph_path(self, model: str) -> str:
        return f"{self.rows.path}.ann-{hashlib.blake2b(model.encode(), digest_size=6).hexdigest()}"

    def warm(self, opened: int) -> None:
        """Background, from open(): load every vector, then the saved (or a new) HNSW graph.
        Closed meanwhile (and perhaps opened again, with a warm-up of its own): it stops,
        neither marking the index ready nor building a graph over what it had loaded (a later
        warm-up would then add the rest to the graph one by one)."""
        self.access.first.wait(SNAPSHOT_FIRST_WAIT_S)
        try:
            self.catch_up()
        except Exception:  # noqa: BLE001  (closed meanwhile: the next search catches up)
            pass
        finally:
            if self.rows.opened == opened:
                self.ready.set()
        for model, index in list(self.by_model.items()):
            if not self.rows.current(opened):
                return
            if index.wants_ann():
                self.build(model, index)

    def build(self, model: str, index: VectorIndex) -> None:
        """Load the model's saved HNSW graph, or build one and save it next to the database
        with the vector sequence it covers, so a restart loads instead of rebuilding; in the
        background."""
        path = self.graph_path(model)
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
                with self.lock:
                    if not self.rows.current(self.rows.opened):  # closed meanwhile
                        return
                    changed = self.rows._query("SELECT rowid FROM cells WHERE vec_seq > ? AND embed_model = ?",
                                               (int(meta["vec_seq"]), model))
                    index.install_ann(prepared, np.asarray([r for (r,) in changed], dtype=np.int64))
            else:
                index.install_ann(prepared)
            self._start_drain(index)  # rows changed since the saved graph, or while it was built
            # A built graph is saved now. A loaded one waits for close(): it lacks only the rows
            # changed since its file, which a start adds again from `vec_seq`, and hnswlib holds
            # the interpreter lock while it saves (every request would wait).
            if not loaded:
                self.save_graph(model, index)
        except Exception:  # noqa: BLE001  (a closed store or a bad file: the exact scan answers)
            if index.ann_state == "building":
                index.ann_state = "none"

    def _start_drain(self, index: VectorIndex) -> None:
        """`drain` in the background, when the index has a backlog none drains."""
        if index.claim_drain():
            self.rows.scheduler.run("vectors.drain", self.drain, self.rows.opened, index)

    def drain(self, opened: int, index: VectorIndex) -> None:
        """Background: the vectors a catch-up left out of the approximate graph (an import's),
        added GRAPH_DRAIN_ROWS at a time; searches score them exactly until then
        (`VectorIndex`). `/health` says how many wait."""
        try:
            while self.rows.current(opened) and index.drain_graph(GRAPH_DRAIN_ROWS):
                # A pause between chunks: a lock released and at once taken again by the same
                # thread starves the searches waiting for it.
                time.sleep(GRAPH_DRAIN_PAUSE_S)
        finally:
            index.release_drain()

    def save_graph(self, model: str, index: VectorIndex) -> None:
        path = self.graph_path(model)
        with self.lock:  # the graph then covers exactly the vectors up to this sequence
            seq, width = self.seq, index.width  # (its graph's dimensions)
            if not index.ann_dirty or not index.save_ann(path + ".tmp"):
                return
        with open(path + ".json.tmp", "w") as f:
            json.dump({"vec_seq": seq, "dim": width, "model": model}, f)
        os.replace(path + ".tmp", path)
        os.replace(path + ".json.tmp", path + ".json")

    # ------------------------------------------------------------ search
    def has_vectors(self, model: str, flt: CellFilter) -> bool:
        """Whether a row `flt` admits has a vector of `model`, decided on those rows alone.

        A reader-wide filter asks the index about its admitted set (the slots the dense leg's
        search keeps for it): in SQL, the access condition and then the model column were
        read on every admitted row whenever none has such a vector. While the index loads, a
        wide filter's dense legs find nothing (`_candidates_from_rows`): no. An owner's or a
        session's filter asks SQL, where its index serves it. No store-wide shortcut: the cost
        does not depend on whether any other cell has such a vector."""
        entry = self.access.entry(flt)
        if self.access.wide(flt, entry[1]):
            if self.ready.is_set():
                self.catch_up()
                index = self.by_model.get(model)
                return index is not None and index.holds_any(self.access.admitted_set(flt, entry).rowids)
            if entry[1] > self.warm_exact_max:
                return False
        where, params = filter_sql(flt)
        return bool(self.rows._query(f"SELECT 1 FROM cells c WHERE {where} AND c.embed_model = ? LIMIT 1", [*params, model]))

    def _candidates_from_rows(self, vector: Any, model: str, flt: CellFilter, k: int) -> list[Candidate]:
        """While the index loads: an exact ranking of the admitted rows read straight from the
        table, when there are few (an owner's search); none for a wide filter (keyword only)."""
        if self.access.entry(flt)[1] > self.warm_exact_max:  # wide: not read only to be dropped
            return []
        where, params = filter_sql(flt)
        rows = self.rows._query(
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

    def candidates(self, vector: Any, model: str, flt: CellFilter, k: int) -> list[Candidate]:
        self.rows._windows_current()  # (new rows get their vectors with their windows: `embed_new`)
        if not self.ready.is_set():  # still loading: small filtered sets from the table
            return self._candidates_from_rows(vector, model, flt, k)
        self.catch_up()
        index = self.by_model.get(model)
        if index is None:
            return []
        if index.wants_ann():  # crossed the threshold: build in the background, exact meanwhile
            index.ann_state = "building"
            self.rows.scheduler.run("vectors.build", self.build, model, index)
        # The filter runs first, so the index only ranks rows the caller may see. A wide
        # filter's rows are the keyword leg's admitted set (cached until the data changes);
        # the index holds exactly the rows whose current vector is of this model.
        entry = self.access.entry(flt)
        if self.access.wide(flt, entry[1]):
            allowed = self.access.admitted_set(flt, entry).rowids
        else:
            where, params = filter_sql(flt)
            cur = self.rows._reader().execute(f"SELECT c.rowid FROM cells c WHERE {where} AND c.embed_model = ?",
                                              [*params, model])
            allowed = np.fromiter((r[0] for r in cur), dtype=np.int64)
        if index.ann_state == "building" and len(allowed) > self.warm_exact_max:
            # An exact scan of this many rows (a gather of the allowed rows, then a product)
            # would hold the search up: keyword only until the graph is ready.
            return []
        hits = index.search(vector, allowed, k)
        if not hits:
            return []
        ids = dict(self.rows._query(
            f"SELECT rowid, id FROM cells WHERE rowid IN ({','.join('?' * len(hits))})", [r for r, _ in hits]
        ))
        return [Candidate(ids[r], score) for r, score in hits if r in ids]


__all__ = ["SQLiteVectorIndex", "decode_vector"]
