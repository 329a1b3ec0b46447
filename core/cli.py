"""`ampkit` command line. Each command is a shim over a library function; settings come
from `AMPKIT_*` variables and flags override them."""

from __future__ import annotations

import sys
from typing import Optional

import click

EXIT_STARTUP_FAILURE = 3


@click.group()
@click.version_option(package_name="ampkit")
def main() -> None:
    """ampkit: one shared long-term memory for AI agents (AMP v0.1 wire protocol)."""


@main.command()
@click.option("--host", default=None, help="interface to listen on [default: 127.0.0.1]")
@click.option("--port", default=None, type=int, help="port [default: 8765]")
@click.option("--store", "store", default=None, help="store URL: sqlite:///PATH, memory://, postgresql://...")
@click.option("--lifecycle-interval", default=None, type=float, help="seconds between lifecycle runs (0 = off)")
def serve(host: Optional[str], port: Optional[int], store: Optional[str], lifecycle_interval: Optional[float]) -> None:
    """Run the /amp/v1 server."""
    from .config import Settings

    overrides = {"host": host, "port": port, "store": store, "lifecycle_interval_seconds": lifecycle_interval}
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    from .server import run
    from .server.app import build_service

    try:
        service = build_service(settings)
        service.store.open()  # fail fast with a clear message, before binding the port
        service.store.close()
    except Exception as exc:  # noqa: BLE001
        click.echo(f"ampkit: cannot open store {settings.store_url()}: {exc}", err=True)
        sys.exit(EXIT_STARTUP_FAILURE)
    click.echo(f"ampkit: store {settings.store_url()}")
    click.echo(f"ampkit: listening on http://{settings.host}:{settings.port}/amp/v1")
    run(settings)


@main.command()
@click.option("--base-url", required=True, help="server base URL, e.g. http://127.0.0.1:8765/amp/v1")
@click.option("--vectors", default=None, help="vector file or directory [default: the bundled suite]")
@click.option("--only", default=None, help="run only cases whose id contains this text")
def conformance(base_url: str, vectors: Optional[str], only: Optional[str]) -> None:
    """Run the AMP conformance suite against any server over HTTP."""
    from .conformance import main as run_suite

    sys.exit(run_suite(base_url, vectors, only))


if __name__ == "__main__":
    main()
