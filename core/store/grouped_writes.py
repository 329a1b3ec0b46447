"""How a store's write transactions run: one request in one transaction, or, on a store with
one writer at a time (SQLite), concurrent requests grouped into one transaction.

The service describes a request's write as a `WriteUnit`: `prepare` (what needs neither a
lock nor a transaction: building the cells, embedding), `check` (reads of committed cells the
write relies on: duplicates), `write(tx)` (the transaction's statements), and `keys`: no
other unit with one of its keys runs between this one's `check` and its COMMIT, so two
identical creates racing each other in this process store one cell, not two (`KeyLocks`;
across server processes the duplicate check stays best effort). `Writes` runs a unit as
plain code; `GroupedWrites` groups them; `writes_for(store)` picks the store's way.

Group commit. A store with one writer at a time spends much of a single-cell create on what
every transaction costs once: BEGIN, the keyword-window rewrite, the tokenizer round trip,
COMMIT, and an embedding call. Requests that arrive while a transaction is running queue
here; the first of them leads: it takes the queue as one group, prepares and checks its
units and writes them in one transaction (each unit in its own savepoint, so one request's
error is its own), and every request of the group returns only after that transaction has
committed. No timer: a lone request is a group of one, written at once. Two units whose keys
overlap never share a group: a unit's check reads committed cells, so identical writes
racing each other must still be written one after the other.

An event loop's request (`run_async`, the server's creates) waits without a thread of its
own: when no request is leading, the group commit's own thread leads until the queue is empty,
and a group's answers reach each loop in one call. A request per worker thread cost each
write two thread wake-ups and a wake-up of the loop, all contending for the interpreter lock
with the loop that parses the next requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Generic, Hashable, Optional, Protocol, Sequence, TypeVar

from ..errors import APIError
from .base import Store, WriteTx

T = TypeVar("T")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


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


class WriteUnit(Protocol[R_co]):
    """One request's write, in the steps a writes runner takes (see the module's docstring)."""

    @property
    def size(self) -> int:
        """Its share of a group's limit (its cells)."""

    @property
    def keys(self) -> frozenset[Hashable]:
        """Held from its `check` to its COMMIT: no other unit with one of them runs meanwhile."""

    def prepare(self) -> None:
        """Before its keys and the transaction: no store access needed (build, embed)."""

    def check(self) -> None:
        """Under its keys, before the transaction: reads of committed cells."""

    def write(self, tx: WriteTx) -> R_co:
        """In the transaction; raises the request's own `APIError` to undo its part alone."""


class KeyLocks:
    """A fixed set of locks that units' keys hash onto (a few false sharings, no growth)."""

    def __init__(self, count: int = 64):
        self._locks = [threading.Lock() for _ in range(count)]

    def stripes(self, keys: frozenset[Hashable]) -> frozenset[int]:
        return frozenset(hash(key) % len(self._locks) for key in keys)

    def holding(self, stripes: frozenset[int]) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        for i in sorted(stripes):  # in order: no two holders wait for each other
            stack.enter_context(self._locks[i])
        return stack


# One set for the process: the keys guard against writers of any service over the same cells.
KEY_LOCKS = KeyLocks()


class Writes:
    """One unit, one transaction: prepare, then under its keys check, write and commit."""

    grouped = False

    def __init__(self, store: Store, locks: KeyLocks = KEY_LOCKS):
        self.store = store
        self.locks = locks

    def run(self, unit: WriteUnit[R]) -> R:
        unit.prepare()
        with self.locks.holding(self.locks.stripes(unit.keys)):
            unit.check()
            with self.store.write() as tx:
                return unit.write(tx)

    async def run_async(self, unit: WriteUnit[R]) -> R:
        raise RuntimeError("these writes are not grouped: call run in a thread")


class GroupedWrites(Writes):
    """Concurrent units grouped into one transaction (group commit; the module's docstring),
    at most `max_size` (units' sizes) a group."""

    grouped = True

    def __init__(self, store: Store, max_size: int, locks: KeyLocks = KEY_LOCKS):
        super().__init__(store, locks)
        self.group_commit: GroupCommit[WriteUnit[Any]] = GroupCommit(self._run_group, max_size)

    def run(self, unit: WriteUnit[R]) -> R:
        result: R = self.group_commit.submit(self._submission(unit))
        return result

    async def run_async(self, unit: WriteUnit[R]) -> R:
        """`run` for a request on an event loop: it waits for its group's commit without a
        thread of its own."""
        result: R = await self.group_commit.submit_async(self._submission(unit))
        return result

    def _submission(self, unit: WriteUnit[Any]) -> Submission[WriteUnit[Any]]:
        return Submission(unit, max(1, unit.size), self.locks.stripes(unit.keys))

    def _run_group(self, group: Sequence[Submission[WriteUnit[Any]]]) -> None:
        """The group's units prepared and checked, then written in one transaction, each in its
        savepoint. A request's `APIError` (validation, access, conflict) is its own; the
        others still commit. Any other exception (the store's) fails the group."""
        prepared = _surviving(group, lambda unit: unit.prepare())
        with self.locks.holding(frozenset().union(*(sub.stripes for sub in prepared))):
            checked = _surviving(prepared, lambda unit: unit.check())
            if not checked:
                return
            with self.store.write() as tx:
                for sub in checked:
                    try:
                        with tx.savepoint():
                            sub.result = sub.payload.write(tx)
                    except APIError as exc:  # undone alone; a store failure fails the group
                        sub.error = exc


def _surviving(group: Sequence[Submission[WriteUnit[Any]]],
               step: Callable[[WriteUnit[Any]], Any]) -> list[Submission[WriteUnit[Any]]]:
    """The submissions whose unit passed `step`; a request's `APIError` stays its own."""
    kept = []
    for sub in group:
        try:
            step(sub.payload)
            kept.append(sub)
        except APIError as exc:
            sub.error = exc
    return kept


def writes_for(store: Store, max_group_size: int) -> Writes:
    """The store's way: grouped where it has one writer at a time (`Store.serialised_writes`,
    which also promises `WriteTx.savepoint`), one at a time elsewhere."""
    return GroupedWrites(store, max_group_size) if store.serialised_writes else Writes(store)


__all__ = ["GroupCommit", "GroupedWrites", "KEY_LOCKS", "KeyLocks", "Submission", "WriteUnit", "Writes", "writes_for"]
