"""An in-memory copy of every cell's access columns, for the SQLite store's reader-wide filters.

A reader across owners (a team member, an analyst) admits most of the store; finding those
rows in SQL is a scan with a GLOB per row (slow on a large store), and its answer used to
be cached only until the next commit. This snapshot holds, per row id, what the read rule and
the filter look at (owner, creator, type, status, public, superseded, expiry, the
`readable_by` patterns, the keyword window's length), so an admitted set is a few numpy
operations. The rule itself is `ampkit.access.can_read_columns` (the column form of
`can_read`, same pattern matcher): nothing here decides who may read.

It is kept in step row by row: every writer logs the rows it touches in the file
(`change_log`, SQLite migration 11), and the store hands over the current state of the rows
logged since it last looked (`RowState`, read inside a transaction, applied after it), at
its own commits and when it notices another connection's (`SQLiteStore._foreign_generation`),
so a write by any process costs the next search nothing but the changed rows. Only when the
log cannot say (pruned past, or very long) is the snapshot rebuilt from the table.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..access import can_read_columns
from ..models import Status
from ._bm25 import int_list, replace_rows
from .base import CellFilter

Query = Callable[[str], Sequence[Sequence[Any]]]  # SQL text -> its rows

# One row per cell with its window length (NULL: no keyword window, so never admitted, as the
# SQL join with cell_context admits it never) and its `readable_by` patterns: the `readers` column
# (SQLite migration 13), the body's `access_policy.readable_by` as JSON text, which SQLite's
# triggers hold to the body whoever writes it (tests/test_access_snapshot_load.py).
SNAPSHOT_COLUMNS = (
    "c.rowid, c.owner_id, c.created_by, c.type, c.status, c.public, c.superseded_by IS NOT NULL, c.expires_at, "
    "c.readers, x.len"
)
SNAPSHOT_FROM = "cells c LEFT JOIN cell_context x ON x.rowid = c.rowid"
# The same, for the whole table at once (`AccessSnapshot.load`), grouped in SQL; the values
# in two halves of the rowids, read side by side. (The `readers` column of migration 13 spares
# parsing every body for `readable_by`.)
_LENGTHS = "SELECT group_concat(rowid), group_concat(len) FROM cell_context"
_BY_OWNER = "SELECT owner_id, group_concat(rowid) FROM cells GROUP BY owner_id"  # an index covers it
_TOP = "SELECT COALESCE(MAX(rowid), 0) FROM cells"
_BY_VALUES = (
    "SELECT created_by, type, status, public, superseded_by IS NOT NULL, expires_at, "
    "readers, group_concat(rowid) FROM cells "
    "WHERE rowid BETWEEN {} AND {} GROUP BY 1, 2, 3, 4, 5, 6, 7"
)


# An admitted set asked again after a few rows changed is the last one computed for that
# filter with those rows taken out and put back by the same rule (`AccessSnapshot.admitted`),
# not the rule over every row again (which every search of a team that follows a write
# would pay). The changed rows are kept for this up to PATCH_ROWS in all, and the last
# sets of up to PATCH_FILTERS filters.
PATCH_ROWS = 20_000
PATCH_FILTERS = 32
PATCH_KEPT_ROWS = 4_000_000  # rows of those sets (16 bytes each), as the store's own cache

# A saved snapshot (`AccessSnapshot.save`, read back by `saved`): numpy's npz of these arrays
# (no pickles) and a JSON header with the interned strings, the reader sets and the caller's
# `meta` (for the store: the change-log entry the snapshot is current with).
SAVED_FORMAT = 1
_SAVED_ARRAYS = ("present", "owner", "creator", "type", "status", "public", "superseded", "expires", "length", "reader_set")


@dataclass(frozen=True)
class RowState:
    """One row's access columns as stored (None in its place: the row is gone)."""

    owner: str
    creator: Optional[str]
    type: str
    status: str
    public: bool
    superseded: bool
    expires: Optional[float]
    readers: tuple[str, ...]
    length: Optional[int]


def row_state_readers(readers_json: Optional[str], patterns: dict[Optional[str], tuple[str, ...]]) -> tuple[str, ...]:
    """A row's `readable_by` (its `readers` column: JSON text) as a sorted tuple; `patterns` caches
    the parsed texts (a store has few distinct ones)."""
    readers = patterns.get(readers_json)
    if readers is None:
        readers = patterns[readers_json] = tuple(sorted(set(json.loads(readers_json)))) if readers_json else ()
    return readers


def row_state(row: Sequence[Any], patterns: dict[Optional[str], tuple[str, ...]]) -> RowState:
    """A `SNAPSHOT_COLUMNS` row (without its rowid) as a RowState."""
    owner, creator, type_, status, public, superseded, expires, readers_json, length = row
    return RowState(owner, creator, type_, status, bool(public), bool(superseded), expires,
                    row_state_readers(readers_json, patterns), length)


def _saved_header(saved: Any) -> dict[str, Any]:
    """The JSON header of an opened saved snapshot (`np.load`'s archive), checked for its format."""
    header = json.loads(str(saved["header"]))
    if header.get("format") != SAVED_FORMAT:
        raise ValueError(f"saved access snapshot of format {header.get('format')!r}")
    return header


@dataclass(frozen=True)
class FrozenSnapshot:
    """An access snapshot's columns and interned values as of one moment (`AccessSnapshot.frozen`)."""

    arrays: dict[str, Any]  # (numpy arrays; Any for np.savez's keyword typing)
    codes: list[str]
    reader_sets: list[list[str]]

    def save(self, path: str, meta: dict[str, Any]) -> None:
        header = {"format": SAVED_FORMAT, "codes": self.codes, "reader_sets": self.reader_sets, "meta": meta}
        with open(path + ".tmp", "wb") as f:
            np.savez(f, header=np.array(json.dumps(header)), **self.arrays)
        os.replace(path + ".tmp", path)


class AccessSnapshot:
    """The access columns of every row (indexed by rowid), a generation that moves with every
    applied change, and the admitted sets computed at the current generation (`entries`,
    owned by the store). Every read and change happens under `lock`."""

    def __init__(self, foreign: int):
        self.foreign = foreign  # the store's foreign-commit generation it was loaded at
        self.generation = 0
        self.lock = threading.RLock()
        self.entries: dict[Any, list[Any]] = {}
        self._codes: dict[str, int] = {}  # interned owner / creator / type / status strings
        self._sets: dict[tuple[str, ...], int] = {}
        self.reader_sets: list[tuple[str, ...]] = []
        self._patterns: dict[Optional[str], tuple[str, ...]] = {}
        self._expiries: Optional[tuple[int, np.ndarray]] = None
        self._expiries_rebuilt = 0  # how many expiry times the last pass over every row found
        self.size = 0  # highest rowid + 1
        self.present = np.zeros(0, dtype=bool)
        self.owner = np.zeros(0, dtype=np.int32)  # interned string codes, -1: none
        self.creator = np.zeros(0, dtype=np.int32)
        self.type = np.zeros(0, dtype=np.int32)
        self.status = np.zeros(0, dtype=np.int32)
        self.public = np.zeros(0, dtype=bool)
        self.superseded = np.zeros(0, dtype=bool)
        self.expires = np.zeros(0, dtype=np.float64)  # NaN: never
        self.length = np.zeros(0, dtype=np.int64)  # keyword window length, -1: no window
        self.reader_set = np.zeros(0, dtype=np.int32)  # index into reader_sets
        # For `admitted`'s patches: (generation, sorted rowids) of each change since
        # (PATCH_ROWS in all), and per filter key the last (generation, expiry time, rowids, lengths).
        self._touched: list[tuple[int, np.ndarray]] = []
        self._touched_rows = 0
        self._last: dict[Any, tuple[int, Optional[float], np.ndarray, np.ndarray]] = {}
        self._alloc(1024)

    def _alloc(self, capacity: int) -> None:
        def grown(arr: np.ndarray, fill: Any) -> np.ndarray:
            out = np.full(capacity, fill, dtype=arr.dtype)
            out[: arr.size] = arr
            return out

        self.present = grown(self.present, False)
        self.owner = grown(self.owner, -1)
        self.creator = grown(self.creator, -1)
        self.type = grown(self.type, -1)
        self.status = grown(self.status, -1)
        self.public = grown(self.public, False)
        self.superseded = grown(self.superseded, False)
        self.expires = grown(self.expires, np.nan)
        self.length = grown(self.length, -1)
        self.reader_set = grown(self.reader_set, 0)

    def code(self, value: Optional[str]) -> int:
        if value is None:
            return -1
        found = self._codes.get(value)
        if found is None:
            found = self._codes[value] = len(self._codes)
        return found

    def _set_code(self, readers: tuple[str, ...]) -> int:
        found = self._sets.get(readers)
        if found is None:
            found = self._sets[readers] = len(self.reader_sets)
            self.reader_sets.append(readers)
        return found

    # ------------------------------------------------------------ loading and changes
    def load(self, query: Query, beside: Optional[Query] = None) -> None:
        """Every row, read as groups of row ids sharing their values: the table is scanned in
        SQL and Python handles a group, not a row (a store has few distinct owners, creators,
        statuses and reader sets). `query` and `beside` (a second connection, or None: the
        same) must read inside one read snapshot of the file; `beside` reads the upper half
        of the rowids' values in a thread of its own (the driver lets go of the GIL while
        SQLite runs), `query` the rest."""
        top = int(query(_TOP)[0][0])
        half = top // 2
        upper: dict[str, Any] = {}

        def read_upper() -> None:
            try:
                upper["rows"] = (beside or query)(_BY_VALUES.format(half + 1, top))
            except BaseException as exc:  # noqa: BLE001  (raised below, in the caller's thread)
                upper["error"] = exc

        thread = threading.Thread(target=read_upper, daemon=True, name="ampkit-snapshot-half")
        if beside is not None:
            thread.start()
        try:
            lengths = query(_LENGTHS)[0]
            by_owner = query(_BY_OWNER)
            lower = query(_BY_VALUES.format(-(2**63), half))
        finally:
            if beside is not None:
                thread.join()
        if beside is None:
            read_upper()
        if "error" in upper:
            raise upper["error"]
        with self.lock:
            rowids, lengths_text = lengths
            ids = int_list(rowids)
            if ids.size:
                self._reserve(int(ids.max()) + 1)
                self.length[ids] = int_list(lengths_text)
            for owner, group in by_owner:
                ids = int_list(group)
                self._reserve(int(ids.max()) + 1)
                self.present[ids] = True
                self.owner[ids] = self.code(owner)
            for creator, type_, status, public, superseded, expires, readers, group in lower + upper["rows"]:
                ids = int_list(group)
                self.creator[ids] = self.code(creator)
                self.type[ids] = self.code(type_)
                self.status[ids] = self.code(status)
                self.public[ids] = bool(public)
                self.superseded[ids] = bool(superseded)
                self.expires[ids] = np.nan if expires is None else expires
                self.reader_set[ids] = self._set_code(row_state_readers(readers, self._patterns))
            self._changed()
            self._touched, self._touched_rows, self._last = [], 0, {}

    def save(self, path: str, meta: dict[str, Any]) -> None:
        """Write the snapshot and `meta` to `path` (atomically: a temporary file, then a rename)."""
        self.frozen().save(path, meta)

    def frozen(self) -> "FrozenSnapshot":
        """A copy of what `save` writes, taken under the lock (short), to be
        written without holding it."""
        with self.lock:
            return FrozenSnapshot(
                {name: getattr(self, name)[: self.size].copy() for name in _SAVED_ARRAYS},
                sorted(self._codes, key=self._codes.__getitem__), [list(s) for s in self.reader_sets])

    @staticmethod
    def saved_meta(path: str) -> dict[str, Any]:
        """The `meta` a saved snapshot was written with, reading nothing else of the file."""
        with np.load(path, allow_pickle=False) as saved:
            return _saved_header(saved)["meta"]

    @classmethod
    def saved(cls, path: str, foreign: int) -> tuple["AccessSnapshot", dict[str, Any]]:
        """A snapshot `save` wrote, and its `meta`; ValueError (or the reader's own error) when
        the file is not one, in whole and in this format."""
        with np.load(path, allow_pickle=False) as saved:
            header = _saved_header(saved)
            snapshot = cls(foreign)
            size = len(saved["present"])
            snapshot._alloc(max(size, 1024))
            for name in _SAVED_ARRAYS:
                column, target = saved[name], getattr(snapshot, name)
                if column.shape != (size,) or column.dtype != target.dtype:
                    raise ValueError(f"saved access snapshot: column {name} is {column.dtype}{column.shape}")
                target[:size] = column
        snapshot.size = size
        snapshot._codes = {value: code for code, value in enumerate(header["codes"])}
        snapshot.reader_sets = [tuple(s) for s in header["reader_sets"]]
        snapshot._sets = {s: code for code, s in enumerate(snapshot.reader_sets)}
        interned = [snapshot.owner, snapshot.creator, snapshot.type, snapshot.status]
        if (len(snapshot._codes) != len(header["codes"]) or len(snapshot._sets) != len(snapshot.reader_sets)
                or any(size and (column[:size].min() < -1 or column[:size].max() >= len(snapshot._codes)) for column in interned)
                or (size and (snapshot.reader_set[:size].min() < 0 or snapshot.reader_set[:size].max() >= max(len(snapshot.reader_sets), 1)))):
            raise ValueError("saved access snapshot: a code out of range")
        return snapshot, header["meta"]

    def _reserve(self, top: int) -> None:
        if top > len(self.present):
            self._alloc(max(top, 2 * len(self.present)))
        self.size = max(self.size, top)

    def apply(self, changes: dict[int, Optional[RowState]]) -> None:
        """Rows a committed write touched: their state after the commit (None: gone)."""
        if not changes:
            return
        with self.lock:
            for rowid, state in changes.items():
                if state is None:
                    if rowid < self.size:
                        self.present[rowid] = False
                else:
                    self._set(rowid, state)
            kept = self._expiries
            self._changed()
            if kept is not None and kept[1].size < 2 * self._expiries_rebuilt + 1024:
                # The changed rows' expiry times added, none taken out: `expiries` is a superset
                # (a time that no longer applies only makes a kept answer be decided afresh),
                # kept in step without a pass over every row at each commit.
                times = [state.expires for state in changes.values() if state is not None and state.expires is not None]
                self._expiries = (self.generation, np.sort(np.concatenate([kept[1], times])) if times else kept[1])
            rows = np.fromiter(sorted(changes), dtype=np.int64, count=len(changes))
            self._touched.append((self.generation, rows))
            self._touched_rows += rows.size
            while self._touched_rows > PATCH_ROWS:
                self._touched_rows -= self._touched.pop(0)[1].size

    def _changed(self) -> None:
        self.generation += 1
        self.entries.clear()
        self._expiries = None

    def _set(self, rowid: int, s: RowState) -> None:
        self._reserve(rowid + 1)
        self.present[rowid] = True
        self.owner[rowid] = self.code(s.owner)
        self.creator[rowid] = self.code(s.creator)
        self.type[rowid] = self.code(s.type)
        self.status[rowid] = self.code(s.status)
        self.public[rowid] = s.public
        self.superseded[rowid] = s.superseded
        self.expires[rowid] = np.nan if s.expires is None else s.expires
        self.length[rowid] = -1 if s.length is None else s.length
        self.reader_set[rowid] = self._set_code(s.readers)

    # ------------------------------------------------------------ reads
    def expiries(self) -> np.ndarray:
        """The sorted expiry times of the present rows, and perhaps some of rows since changed
        or gone (`apply`): enough to tell whether a cell may have expired between two times
        (a kept admitted set's validity)."""
        with self.lock:
            if self._expiries is None or self._expiries[0] != self.generation:
                n = self.size
                e = self.expires[:n][self.present[:n]]
                self._expiries = (self.generation, np.sort(e[~np.isnan(e)]))
                self._expiries_rebuilt = self._expiries[1].size
            return self._expiries[1]

    def may_have_expired(self, then: float, at: float) -> bool:
        """Whether a row admitted at time `then` may be expired at `at` (an expiry time lies
        between them), or the clock went back: an answer kept from `then` is not `at`'s."""
        if at == then:
            return False
        expiries = self.expiries()
        return at < then or bool(np.searchsorted(expiries, at, "right") != np.searchsorted(expiries, then, "right"))

    def admitted(self, flt: CellFilter, key: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """(sorted rowids, window lengths) of the rows `flt` admits, as `compile_filter`'s
        condition joined with cell_context admits them. Only for what a snapshot holds: no
        owner, session or metadata condition (`supports`). With a `key` (the filter's, as
        the store caches it): from the key's last answer when only logged rows changed since,
        those rows re-decided by the same rule (`_admits`); equal to deciding every row."""
        with self.lock:
            at = flt.not_expired_at.timestamp() if flt.not_expired_at is not None else None
            last = self._last.pop(key, None) if key is not None else None
            found = self._patched(flt, at, last) if last is not None else None
            if found is None:
                rowids = np.flatnonzero(self._admits(flt, None))
                found = rowids, self.length[rowids]
            if key is not None:
                self._last[key] = (self.generation, at, *found)
                while len(self._last) > 1 and (len(self._last) > PATCH_FILTERS or
                                               sum(e[2].size for e in self._last.values()) > PATCH_KEPT_ROWS):
                    del self._last[next(iter(self._last))]  # the least recently asked
            return found

    def _patched(self, flt: CellFilter, at: Optional[float],
                 last: tuple[int, Optional[float], np.ndarray, np.ndarray]) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """`last` (this filter's answer at an earlier generation and expiry time) brought to
        now, or None when the change log does not reach back to it or a row's expiry lies
        between the two times (an unchanged row may have expired)."""
        generation, then, rowids, lengths = last
        if (at is None) != (then is None):
            return None
        if at is not None and then is not None and self.may_have_expired(then, at):
            return None
        if generation == self.generation:
            return rowids, lengths
        if not self._touched or self._touched[0][0] > generation + 1:
            return None  # changes since then were dropped from the log (or a load came between)
        changed = np.unique(np.concatenate([rows for g, rows in self._touched if g > generation]))
        admitted = changed[self._admits(flt, changed)]
        return replace_rows(rowids, lengths, changed, admitted, self.length[admitted], lambda _: np.int64)

    def _admits(self, flt: CellFilter, rows: Optional[np.ndarray]) -> np.ndarray:
        """Whether `flt` admits each of `rows` (None: every row id below `size`)."""
        n = self.size

        def col(column: np.ndarray) -> np.ndarray:
            return column[:n] if rows is None else column[rows]

        mask = col(self.present) & (col(self.length) >= 0)
        mask &= self._one_of(col(self.status), flt.statuses)
        if flt.types:
            mask &= self._one_of(col(self.type), flt.types)
        if not flt.include_superseded:
            mask &= ~col(self.superseded)
        if flt.not_expired_at is not None:
            e = col(self.expires)
            mask &= np.isnan(e) | (e > flt.not_expired_at.timestamp())
        if flt.reader is not None:
            agent = self._codes.get(flt.reader, -2)
            mask &= can_read_columns(
                flt.reader,
                deleted=col(self.status) == self._codes.get(Status.deleted.value, -2),
                owner_is_agent=col(self.owner) == agent,
                creator_is_agent=col(self.creator) == agent,
                public=col(self.public),
                reader_set=col(self.reader_set),
                reader_sets=self.reader_sets,
            )
        return mask

    def _one_of(self, column: np.ndarray, values: Sequence[str]) -> np.ndarray:
        codes = [self._codes[v] for v in values if v in self._codes]
        if not codes:
            return np.zeros(column.size, dtype=bool)
        if len(codes) == 1:
            return column == codes[0]
        return np.isin(column, codes)

    @staticmethod
    def supports(flt: CellFilter) -> bool:
        """Whether the snapshot can answer this filter: a reader-wide one (no owner, session
        or metadata condition; those stay in SQL, where an index makes them cheap)."""
        return flt.owner_id is None and flt.session_id is None and not flt.metadata
