"""Which keyword windows a write changes, and what they hold (the write transaction's part).

A cell's keyword window is its text with the texts of the nearest CONTEXT_RADIUS cells of the
same window class each side (`ampkit.store.base.window_class`), in insertion order; a write
marks the windows it changes (`_touch`, `_touch_new`) and the transaction rewrites them once,
before COMMIT (`_SQLiteWriteTx.flush` in `sqlite.py`), reading them with `_windows`.
"""

from __future__ import annotations

import sqlite3
from typing import Optional, Sequence

from .base import CONTEXT_RADIUS


class WindowMarks:
    """The window-finding half of the SQLite write transaction (a mixin of `_SQLiteWriteTx`)."""

    conn: sqlite3.Connection
    _dirty_windows: set[int]

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


__all__ = ["WindowMarks"]
