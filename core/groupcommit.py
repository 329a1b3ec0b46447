"""Group commit: concurrent creates written and committed together, each answered after it.

A store with one writer at a time (SQLite) spends much of a single-cell create on what every
transaction costs once: BEGIN, the keyword-window rewrite, the tokenizer round trip, COMMIT,
and an embedding call. Requests that arrive while a transaction is running queue here; the
first of them leads: it takes the queue as one group, the service writes the group in one
transaction (each request in its own savepoint, so one request's error is its own), and
every request of the group returns only after that transaction has committed. No timer and
no background thread: a lone request is a group of one, written at once.

Two requests whose dedup stripes (`MemoryService._dedup_stripes`) overlap never share a
group: the service checks a group's duplicates against committed cells before writing it,
so identical writes racing each other must still be written one after the other.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable, Generic, Optional, Sequence, TypeVar

T = TypeVar("T")


class Submission(Generic[T]):
    """One request waiting for its group: its payload, then its result or its error."""

    def __init__(self, payload: T, size: int, stripes: frozenset[int]):
        self.payload = payload
        self.size = size
        self.stripes = stripes
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.finished = False
        self.leader = False
        self._wake = threading.Event()


class GroupCommit(Generic[T]):
    """Leader/follower batching of submissions into groups run by `run_group`.

    `run_group(group)` sets each submission's `result` or `error`; if it raises, every
    submission of the group without an error gets that exception (nothing was committed)."""

    def __init__(self, run_group: Callable[[Sequence[Submission[T]]], None], max_size: int):
        self._run_group = run_group
        self._max_size = max_size
        self._lock = threading.Lock()
        self._queue: deque[Submission[T]] = deque()
        self._leading = False

    def submit(self, sub: Submission[T]) -> Any:
        with self._lock:
            self._queue.append(sub)
            if not self._leading:
                self._leading = sub.leader = True
        if not sub.leader:
            sub._wake.wait()  # done by a leader, or made the leader
        if sub.leader:
            try:
                while not sub.finished:
                    self._execute(self._take())
            finally:
                self._hand_over()
        if sub.error is not None:
            raise sub.error
        return sub.result

    def _take(self) -> list[Submission[T]]:
        """The oldest submission, and after it every queued one that fits: disjoint stripes,
        within `max_size` in all."""
        with self._lock:
            group = [self._queue.popleft()]
            size, stripes = group[0].size, set(group[0].stripes)
            rest: deque[Submission[T]] = deque()
            while self._queue:
                sub = self._queue.popleft()
                if size + sub.size <= self._max_size and stripes.isdisjoint(sub.stripes):
                    group.append(sub)
                    size += sub.size
                    stripes |= sub.stripes
                else:
                    rest.append(sub)
            self._queue = rest
        return group

    def _execute(self, group: list[Submission[T]]) -> None:
        try:
            self._run_group(group)
        except BaseException as exc:  # nothing of this group was committed
            for sub in group:
                sub.result, sub.error = None, sub.error or exc
        finally:
            for sub in group:
                sub.finished = True
                if not sub.leader:
                    sub._wake.set()

    def _hand_over(self) -> None:
        """The leader's own request is done: the oldest waiting request leads next."""
        with self._lock:
            if self._queue:
                nxt = self._queue[0]
                nxt.leader = True
                nxt._wake.set()
            else:
                self._leading = False


__all__ = ["GroupCommit", "Submission"]
