"""What the `ampkit` commands share: the --store option and its one default, the check that a
SQLite path names a store (or says it starts a new one), and progress on stderr."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

import click

EXIT_STARTUP_FAILURE = 3

STORE_HELP = ("store URL: sqlite:///PATH, postgresql://..., memory:// "
              "[default: AMPKIT_STORE, else memory.db in the user data dir]")
store_option = click.option("--store", "store_url", default=None, metavar="URL", help=STORE_HELP)

OWNER_HELP = "the owner (user or agent id) whose memory folder this is"


def shown(url: str) -> str:
    from .store._pg_url import redact

    return redact(url)  # never print a database password


def store_url(url: Optional[str]) -> str:
    """The store a command opens: --store, else AMPKIT_STORE (or `.env`), else the default."""
    from .bootstrap import load_settings

    return load_settings(store=url).store_url()


def _sqlite_path(url: str) -> Optional[str]:
    """The file a sqlite:/// URL names; None for any other store and for :memory:."""
    if not url.lower().startswith("sqlite:"):
        return None
    path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else url[len("sqlite://"):]
    return None if path in ("", ":memory:") else os.path.abspath(path)


def check_store(url: str, *, create: bool = True) -> None:
    """Before a command opens `url`: a SQLite file that does not exist yet becomes a new, empty
    store, which a typo in the path would also do silently. So a missing directory is refused
    (except the default store's, made on first use), reading commands (`create=False`) refuse
    a missing file, and a command that creates one says so in one line on stderr."""
    from .config import default_store_url

    path = _sqlite_path(url)
    if path is None or os.path.exists(path):
        return
    if not create:
        fail(f"cannot open store {shown(url)}: there is no store file at {path}")
    directory = os.path.dirname(path)
    if not os.path.isdir(directory) and url != default_store_url():
        fail(f"cannot open store {shown(url)}: the directory {directory} does not exist "
             "(create it first if a new store belongs there)")
    click.echo(f"ampkit: creating a new store at {path}", err=True)


def fail(message: str, code: int = EXIT_STARTUP_FAILURE) -> None:
    click.echo(f"ampkit: {message}", err=True)
    sys.exit(code)


def progress(desc: str, unit: str, total: Optional[int] = None) -> Any:
    """A progress bar on stderr (stdout may carry the command's output, e.g. `export -`)."""
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, mininterval=0.5)
