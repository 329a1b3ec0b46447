"""Every background thread of a store, by name: started here, stopped here, listed in `/health`.

Two kinds of work run in the background:

- a *loop* (`Scheduler.loop`): a body that runs until stopped, waking when asked (`wake`) or
  after its own interval; the body gets its `Loop` handle and waits through it
  (`Loop.wait`, `Loop.sleep`), so a stop ends any wait at once. A loop tells whether it is
  asked for or busy (`Loop.idle` waits until neither).
- a *task* (`Scheduler.run`): a function run once in the background (a warm-up, a graph
  build, a drain). Tasks started under one name run one after another's end, never two at
  once unless named apart.

The composition root (`ampkit.bootstrap`) makes one scheduler per service and gives it to the
store; a store built without one makes its own. Persistence modules start no threads
themselves: what they need in the background they hand to the scheduler.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

log = logging.getLogger("ampkit.scheduler")


class Loop:
    """The handle of one background loop: the body's way to wait, and the caller's way to
    wake it, stop it, and wait until it has nothing to do."""

    def __init__(self, name: str, body: Callable[["Loop"], None]):
        self.name = name
        self._body = body
        self._wanted = threading.Event()
        self._stop = threading.Event()
        self._state = threading.Condition()
        self._busy = False
        self.thread: Optional[threading.Thread] = None
        self.failed = False

    # ---------------------------------------------------------------- the body's side
    def wait(self, timeout: Optional[float] = None) -> bool:
        """Until woken (True) or `timeout` passes (False); a stop wakes it too (`stopping`)."""
        return self._wanted.wait(timeout)

    def sleep(self, seconds: float) -> bool:
        """Pause; True when stopped meanwhile."""
        return self._stop.wait(seconds)

    def take(self) -> None:
        """The wake-up is being served: later wakes count again, and the loop is busy until
        `done` (or the next `wait`)."""
        with self._state:
            self._wanted.clear()
            self._busy = True

    def done(self, again: bool = False) -> None:
        """The work taken is done; `again`: wake the loop once more (work left over)."""
        with self._state:
            if again:
                self._wanted.set()
            self._busy = False
            self._state.notify_all()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def asked(self) -> bool:
        """Woken, and the wake-up not taken yet."""
        return self._wanted.is_set()

    # ---------------------------------------------------------------- the caller's side
    def wake(self) -> None:
        self._wanted.set()

    def idle(self, timeout: Optional[float] = None) -> bool:
        """Until the loop is neither asked for nor busy (or has ended); False on timeout."""
        with self._state:
            return self._state.wait_for(
                lambda: not self.running or not (self._wanted.is_set() or self._busy), timeout)

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    @property
    def state(self) -> str:
        if self.running:
            return "busy" if self._busy or self._wanted.is_set() else "idle"
        return "failed" if self.failed else "stopped"

    def _run(self) -> None:
        try:
            self._body(self)
        except Exception:  # noqa: BLE001 - logged and shown in /health; the owner starts it again
            self.failed = True
            log.exception("background loop %s failed", self.name)
        finally:
            with self._state:
                self._busy = False
                self._state.notify_all()

    def _stop_and_join(self, timeout: Optional[float]) -> None:
        self._stop.set()
        self._wanted.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)


@dataclass
class Task:
    """One run of a background function (`Scheduler.run`)."""

    name: str
    thread: threading.Thread
    failed: bool = False

    @property
    def state(self) -> str:
        return "running" if self.thread.is_alive() else "failed" if self.failed else "done"


class Scheduler:
    """The background loops and tasks of one store (and whatever else the composition root
    gives it), each under a name."""

    def __init__(self, thread_prefix: str = "ampkit"):
        self.thread_prefix = thread_prefix
        self._loops: dict[str, Loop] = {}
        self._tasks: dict[str, list[Task]] = {}
        self._lock = threading.Lock()
        self.started = 0  # loops and tasks started so far

    def loop(self, name: str, body: Callable[[Loop], None]) -> Loop:
        """Start `body` as the loop `name` (the running one when it is running and not stopping)."""
        with self._lock:
            current = self._loops.get(name)
            if current is not None and current.running and not current.stopping:
                return current
            handle = self._loops[name] = Loop(name, body)
            handle.thread = threading.Thread(target=handle._run, daemon=True, name=f"{self.thread_prefix}-{name}")
            handle.thread.start()
            self.started += 1
            return handle

    def get(self, name: str) -> Optional[Loop]:
        return self._loops.get(name)

    def wake(self, name: str) -> None:
        handle = self._loops.get(name)
        if handle is not None:
            handle.wake()

    def stop(self, name: str, timeout: Optional[float] = None) -> None:
        """Stop the loop `name` and wait for its thread to end."""
        with self._lock:
            handle = self._loops.get(name)
        if handle is not None:
            handle._stop_and_join(timeout)

    def run(self, name: str, fn: Callable[..., Any], *args: Any) -> Task:
        """Run `fn(*args)` once in the background, as the task `name`."""
        holder: list[Task] = []

        def body() -> None:
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - a task's failure is its own; shown in /health
                holder[0].failed = True
                log.exception("background task %s failed", name)

        task = Task(name, threading.Thread(target=body, daemon=True, name=f"{self.thread_prefix}-{name}"))
        holder.append(task)
        with self._lock:
            runs = [t for t in self._tasks.get(name, []) if t.thread.is_alive()]
            runs.append(task)
            self._tasks[name] = runs
            self.started += 1
        task.thread.start()
        return task

    def running(self, prefix: str = "") -> list[Task]:
        """The tasks still running whose names start with `prefix`."""
        with self._lock:
            return [t for name, runs in self._tasks.items() if name.startswith(prefix)
                    for t in runs if t.thread.is_alive()]

    def join(self, prefix: str = "", timeout: Optional[float] = None) -> bool:
        """Until the tasks named `prefix...` are done, including those they start meanwhile;
        False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while alive := self.running(prefix):
            for task in alive:
                if task.thread is threading.current_thread():
                    continue
                task.thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if deadline is not None and time.monotonic() >= deadline:
                return not self.running(prefix)
            if all(t.thread is threading.current_thread() for t in alive):
                return True
        return True

    def stop_all(self, timeout: Optional[float] = None) -> None:
        """Stop every loop (tasks end on their own: they watch their owner's state)."""
        with self._lock:
            handles = list(self._loops.values())
        for handle in handles:
            handle._stop_and_join(timeout)

    def states(self) -> list[dict[str, str]]:
        """Each loop's and each task name's latest run's state, by name (for `/health`)."""
        with self._lock:
            out = [{"name": name, "state": handle.state} for name, handle in self._loops.items()]
            for name, runs in self._tasks.items():
                if runs:
                    latest = next((t for t in runs if t.thread.is_alive()), runs[-1])
                    out.append({"name": name, "state": latest.state})
        return sorted(out, key=lambda item: item["name"])


def new_lock() -> threading.Lock:
    """A mutex, for modules that hand their background work to a scheduler and only guard state."""
    return threading.Lock()


def new_rlock() -> threading.RLock:
    return threading.RLock()


def thread_local() -> threading.local:
    """A slot per thread (a store's reader connection)."""
    return threading.local()


__all__ = ["Loop", "Scheduler", "Task", "new_lock", "new_rlock", "thread_local"]
