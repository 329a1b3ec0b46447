"""Group commit: concurrent creates written and committed together, each answered after it.

A store with one writer at a time (SQLite) spends much of a single-cell create on what every
transaction costs once: BEGIN, the keyword-window rewrite, the tokenizer round trip, COMMIT,
and an embedding call. Requests that arrive while a transaction is running queue here; the
first of them leads: it takes the queue as one group, the service writes the group in one
transaction (each request in its own savepoint, so one request's error is its own), and
every request of the group returns only after that transaction has committed. No timer: a
lone request is a group of one, written at once.

Two requests whose dedup stripes (`MemoryService._dedup_stripes`) overlap never share a
group: the service checks a group's duplicates against committed cells before writing it,
so identical writes racing each other must still be written one after the other.

An event loop's request (`submit_async`, the server's creates) waits without a thread of its
own: when no request is leading, the group commit's own thread leads until the queue is empty,
and a group's answers reach each loop in one call. A request per worker thread cost each
write two thread wake-ups and a wake-up of the loop, all contending for the interpreter lock
with the loop that parses the next requests (bench/writes.py: ~0.25 ms of CPU a write).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
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
        self._future: Optional[asyncio.Future[None]] = None  # an event loop's waiter (submit_async)


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
        # Leads for loops' requests; made on first use. Its idle thread ends when this object is
        # collected (as the server's worker pool's).
        self._runner: Optional[ThreadPoolExecutor] = None

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

    async def submit_async(self, sub: Submission[T]) -> Any:
        """`submit` for a request on an event loop: it waits for its group's commit without
        holding a thread. (Cancelled meanwhile, it is still written: as with `submit`.)"""
        sub._future = asyncio.get_running_loop().create_future()
        with self._lock:
            self._queue.append(sub)
            lead = not self._leading
            self._leading = True
        if lead:
            self._start_runner()
        await sub._future
        if sub.error is not None:
            raise sub.error
        return sub.result

    def _start_runner(self) -> None:
        with self._lock:
            if self._runner is None:
                self._runner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ampkit-group-commit")
        self._runner.submit(self._lead_until_empty)

    def _lead_until_empty(self) -> None:
        """The runner's turn as leader (it has no request of its own): groups until none is queued."""
        while True:
            with self._lock:
                if not self._queue:
                    self._leading = False
                    return
            self._execute(self._take())

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
            waiting: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
            for sub in group:
                sub.finished = True
                if sub._future is not None:
                    waiting.setdefault(sub._future.get_loop(), []).append(sub._future)
                elif not sub.leader:
                    sub._wake.set()
            for loop, futures in waiting.items():
                try:
                    loop.call_soon_threadsafe(_resolve, futures)
                except RuntimeError:  # the loop has closed: nobody waits any more
                    pass

    def _hand_over(self) -> None:
        """The leader's own request is done: the oldest waiting request leads next, or the
        runner when that one waits on an event loop."""
        with self._lock:
            if not self._queue:
                self._leading = False
                return
            nxt = self._queue[0]
            if nxt._future is None:
                nxt.leader = True
                nxt._wake.set()
                return
        self._start_runner()


def _resolve(futures: list[asyncio.Future[None]]) -> None:
    """On the loop: a group is committed; its requests carry on (a cancelled one is gone)."""
    for future in futures:
        if not future.done():
            future.set_result(None)


__all__ = ["GroupCommit", "Submission"]
