"""The ampkit HTTP server (needs the `server` extra)."""

from __future__ import annotations

import gc
import os
import pickle
import secrets
from multiprocessing.connection import wait
from typing import Any, Optional

import uvicorn  # imported with the app, before a store's warm-ups start (see `ampkit serve`)
import uvicorn.supervisors.multiprocess as uvicorn_multiprocess

from ..config import Settings
from .app import create_app
from .http import uvicorn_options, worker_uvicorn_options

__all__ = ["create_app", "run", "run_workers", "worker_app"]


def freeze_startup_objects() -> None:
    """Take every object alive now (imported modules, the app, its models) out of the cyclic
    garbage collector's walks: a serving process holds many of them, and each full
    collection walked them all with every request waiting, several times a second under
    single writes (bench/writes.py shows the pauses). Objects made later are
    collected as before; a startup object that later becomes cyclic garbage is kept (they
    live as long as the process anyway)."""
    gc.collect()
    gc.freeze()


def run(settings: Settings, app: Any = None) -> None:
    """Serve `app` (by default one built from `settings`) until interrupted; the app opens
    its service's store."""
    app = app if app is not None else create_app(settings)
    freeze_startup_objects()
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info",
                access_log=settings.access_log,
                **uvicorn_options(settings.max_header_bytes))


def run_workers(settings: Settings, overrides: dict[str, Any]) -> None:
    """Serve with `settings.workers` processes on one port (uvicorn's supervisor: it binds the
    socket, starts the workers, restarts one that dies and stops them on SIGTERM or SIGINT).
    Each worker builds its app from the environment, as `create_app()` does: `overrides` (the
    command line's settings) are passed on as `AMPKIT_*` variables, and so is one inspector
    secret, so that a cookie signed by one worker is good at every other."""
    for name, value in overrides.items():
        os.environ[f"AMPKIT_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    if settings.ui and settings.ui_secret is None:
        os.environ["AMPKIT_UI_SECRET"] = secrets.token_urlsafe(32)
    if hasattr(uvicorn_multiprocess.Process, "_healthcheck"):  # (the method refined; else uvicorn's own)
        # The supervisor makes each worker's handle by this module-level name.
        setattr(uvicorn_multiprocess, "Process", WorkerProcess)
    uvicorn.run("ampkit.server:worker_app", factory=True, workers=settings.workers, host=settings.host,
                port=settings.port, log_level="info", access_log=settings.access_log,
                # The supervisor kills a worker that has not answered its ping for this long: a
                # large store's start-up warm-ups share the worker's interpreter with the answer.
                timeout_worker_healthcheck=30,
                **worker_uvicorn_options(settings.max_header_bytes))


class WorkerProcess(uvicorn_multiprocess.Process):
    """uvicorn's handle on one worker process, whose health check also ends when the worker
    dies. uvicorn pings each worker every half second and waits up to the healthcheck timeout
    for the answer; a worker killed (out of memory, say) after the ping was sent never
    answers, and the supervisor held both ends of the pipe, so it waited the whole timeout
    before replacing it. The process's sentinel ends the wait at its death."""

    def _healthcheck(self, timeout: float) -> Optional[bool]:
        try:
            self.parent_conn.send(b"ping")
            if self.parent_conn in wait([self.parent_conn, self.process.sentinel], timeout):
                started: bool = self.parent_conn.recv()
                return started
            return None  # no answer in time, or the worker is gone
        except (OSError, EOFError, pickle.UnpicklingError):
            return None


def worker_app() -> Any:
    """A worker process's app (`run_workers`): built from the environment, its startup objects
    frozen as `run` does."""
    app = create_app()
    freeze_startup_objects()
    return app
