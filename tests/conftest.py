"""Shared fixtures. The environment is isolated first, before any framework is imported:
crewai writes under $HOME at import time, so HOME and the XDG dirs point into a temp dir."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_SANDBOX = Path(tempfile.mkdtemp(prefix="ampkit-tests-"))
for _var, _sub in (("HOME", "home"), ("XDG_DATA_HOME", "data"), ("XDG_CONFIG_HOME", "config"),
                   ("XDG_CACHE_HOME", "cache"), ("CREWAI_STORAGE_DIR", "crewai")):
    (_SANDBOX / _sub).mkdir(parents=True, exist_ok=True)
    os.environ[_var] = str(_SANDBOX / _sub)
os.environ.update({
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "OTEL_SDK_DISABLED": "true",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
})
for _var in [v for v in os.environ if v.startswith("AMPKIT_")]:
    del os.environ[_var]

import pytest  # noqa: E402

from support import ServerProcess  # noqa: E402
from pg import pg_server, pg_url  # noqa: E402,F401  (embedded PostgreSQL fixtures)


@pytest.fixture(scope="session")
def sandbox() -> Path:
    return _SANDBOX


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> ServerProcess:
    """One real `ampkit serve` on a temp SQLite file, shared by the session."""
    tmp = tmp_path_factory.mktemp("server")
    proc = ServerProcess(f"sqlite:///{tmp}/memory.db", log_path=tmp / "server.log")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def server_factory(tmp_path):
    """Start extra servers with custom stores or flags; all stopped at the end of the test."""
    started: list[ServerProcess] = []

    def start(store_url: str | None = None, args=(), env=None) -> ServerProcess:
        url = store_url or f"sqlite:///{tmp_path}/memory-{len(started)}.db"
        proc = ServerProcess(url, args=args, env=env, log_path=tmp_path / f"server-{len(started)}.log")
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        proc.stop()
