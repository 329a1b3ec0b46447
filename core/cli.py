"""`ampkit` command line. Each command is a shim over a library function; settings come
from `AMPKIT_*` variables and flags override them."""

from __future__ import annotations

import sys
from typing import Any, Callable, Iterable, Iterator, Optional, Union

try:
    import click
except ModuleNotFoundError as missing:  # a base or framework-only install has no CLI dependencies
    from .errors import install_hint

    raise SystemExit(f"the ampkit command needs the server extra ({missing.name} is not installed): "
                     f"{install_hint('server')}") from None

from .errors import install_hint
from .cli_common import EXIT_STARTUP_FAILURE, STORE_HELP, check_store, progress, shown, store_option

EXIT_USAGE = 2

# The module a command lacks -> the extra that installs it.
EXTRA_OF_MODULE = {"psycopg": "postgres", "psycopg_pool": "postgres", "pgvector": "postgres", "hnswlib": "ann"}


class _Commands(click.Group):
    """A command whose dependency is not installed names the extra to add, not a traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as missing:
            top = (missing.name or "").split(".")[0]
            extra = EXTRA_OF_MODULE.get(top, "server")
            raise click.ClickException(f"this command needs the {extra} extra ({top} is not installed): "
                                       f"{install_hint(extra)}") from None


@click.group(cls=_Commands)
@click.version_option(package_name="ampkit")
def main() -> None:
    """ampkit: one shared long-term memory for AI agents (AMP v0.1 wire protocol)."""


def _register_files() -> None:
    from .cli_files import register

    register(main)


_register_files()


@main.command()
@click.option("--host", default=None, help="interface to listen on [default: 127.0.0.1]")
@click.option("--port", default=None, type=int, help="port [default: 8765]")
@click.option("--store", "store", default=None, metavar="URL", help=STORE_HELP)
@click.option("--lifecycle-interval", default=None, type=float, help="seconds between lifecycle runs (0 = off)")
@click.option("--auth", "auth", flag_value="required", default=None,
              help="require API keys (Authorization: Bearer); same as AMPKIT_AUTH=required")
@click.option("--allowed-hosts", "allowed_hosts", default=None,
              help="comma-separated host names to answer besides localhost, 127.0.0.1 and ::1, for a proxy in front "
                   "(`*.example.com`, `*` for any) [default: only those on loopback, any elsewhere]; same as "
                   "AMPKIT_ALLOWED_HOSTS")
@click.option("--insecure", is_flag=True, help="allow a non-loopback --host without --auth (anyone can claim any agent id)")
@click.option("--rate-limit", default=None, type=float,
              help="sustained requests/s per agent, bursts of twice that (0 = off) [default: off; 50 with --auth]")
@click.option("--allow-clock-override", "allow_clock_override", flag_value=True, default=None,
              help="TESTING ONLY: accept `as_of` on lifecycle runs and purges (moves the clock for every cell; "
                   "breaks the retention promise); same as AMPKIT_ALLOW_CLOCK_OVERRIDE=true; refused with --auth")
@click.option("--no-mcp", "no_mcp", is_flag=True, help="do not serve MCP at /mcp; same as AMPKIT_MCP_HTTP=false")
@click.option("--ui/--no-ui", "ui", default=None,
              help="serve the memory inspector at /ui [default: on]; same as AMPKIT_UI")
@click.option("--access-log/--no-access-log", "access_log", default=None,
              help="log one line per request [default: on]; same as AMPKIT_ACCESS_LOG")
@click.option("--workers", default=None, type=click.IntRange(1, 64),
              help="server processes sharing the port and the store (a SQLite file or PostgreSQL) [default: 1]; "
                   "same as AMPKIT_WORKERS")
def serve(host: Optional[str], port: Optional[int], store: Optional[str], lifecycle_interval: Optional[float],
          auth: Optional[str], insecure: bool, rate_limit: Optional[float], allow_clock_override: Optional[bool],
          no_mcp: bool, ui: Optional[bool], access_log: Optional[bool], workers: Optional[int],
          allowed_hosts: Optional[str]) -> None:
    """Run the /amp/v1 server (and MCP over streamable HTTP at /mcp)."""
    from .bootstrap import build_service, load_settings
    from .server.identity import is_loopback_host

    flags: dict[str, Any] = dict(
        host=host, port=port, store=store, lifecycle_interval_seconds=lifecycle_interval, auth=auth,
        rate_limit=rate_limit, allow_clock_override=allow_clock_override, mcp_http=False if no_mcp else None,
        ui=ui, access_log=access_log, workers=workers, allowed_hosts=allowed_hosts)
    settings = load_settings(**flags)
    if settings.workers > 1 and settings.store_url().startswith("memory"):
        click.echo(f"ampkit: --workers {settings.workers} needs a store the processes share (a SQLite file or "
                   "PostgreSQL); each would have a memory:// store of its own.", err=True)
        sys.exit(EXIT_USAGE)
    if settings.auth == "required" and settings.allow_clock_override:
        click.echo(
            "ampkit: refusing to start with auth required and the clock override on: `as_of` lets any admin key "
            "purge cells deleted moments ago. The clock override is for test servers; drop --allow-clock-override "
            "(or AMPKIT_ALLOW_CLOCK_OVERRIDE).",
            err=True,
        )
        sys.exit(EXIT_USAGE)
    if settings.auth != "required" and not insecure and not is_loopback_host(settings.host):
        click.echo(
            f"ampkit: refusing to listen on {settings.host} with auth off: any client on the network could read "
            "and write any agent's memory by naming it in X-AMP-Agent-ID. Use --auth (and `ampkit keys create`), "
            "or --insecure if something in front of this server authenticates callers.",
            err=True,
        )
        sys.exit(EXIT_USAGE)
    from .server import create_app, run, run_workers

    check_store(settings.store_url())
    try:
        service = build_service(settings)
        # The app (FastAPI, MCP, the inspector: heavy imports) is built before the store
        # opens: open() starts background warm-ups (access snapshot, term rows, vectors) that
        # would otherwise share the interpreter with those imports and delay the first search
        # after a restart.
        app = create_app(settings, service)
        # Fail fast with a clear message, before binding the port. The app then serves this
        # open store (its start-up open() changes nothing): closing it here would wait for the
        # background warm-ups it started (long on a large store) and start them again.
        service.store.open()
        try:
            active_keys = _active_keys(service.store) if settings.auth == "required" else None
        except BaseException:
            service.store.close()
            raise
    except Exception as exc:  # noqa: BLE001
        click.echo(f"ampkit: cannot open store {_shown(settings.store_url())}: {exc}", err=True)
        sys.exit(EXIT_STARTUP_FAILURE)
    click.echo(f"ampkit: store {_shown(settings.store_url())}")
    click.echo(f"ampkit: auth {settings.auth}" + ("" if settings.auth == "required" else " (X-AMP-Agent-ID is trusted)"))
    if active_keys == 0:
        click.echo("ampkit: warning: auth is required but this store has no active API key; "
                   "create one with `ampkit keys create --agent ID`", err=True)
    click.echo(f"ampkit: listening on http://{settings.host}:{settings.port}/amp/v1"
               + (f" and MCP at http://{settings.host}:{settings.port}/mcp" if settings.mcp_http else ""))
    if settings.ui:
        click.echo(f"ampkit: inspector at http://{settings.host}:{settings.port}/ui")
    if settings.workers > 1:
        # Each worker process builds its own app and service from these settings, passed on
        # through the environment; this process only checked the store (and migrated it).
        service.store.close()
        click.echo(f"ampkit: {settings.workers} worker processes")
        run_workers(settings, {name: value for name, value in flags.items() if value is not None})
    else:
        run(settings, app)  # the checked service's app, so the embedding model loads once


# ---------------------------------------------------------------- MCP over stdio
@main.command("mcp")
@click.option("--url", default=None, help="an ampkit server, http(s)://HOST:PORT [default: AMPKIT_URL or the config file]")
@click.option("--store", "store_url", default=None, metavar="URL",
              help="use a store in process instead: sqlite:///PATH, postgresql://... "
                   "[default, without --url, AMPKIT_URL or a config file: AMPKIT_STORE, else memory.db in the user data dir]")
@click.option("--agent-id", default=None, help="the agent to act as [default: AMPKIT_AGENT_ID]; a key in AMPKIT_API_KEY decides instead")
def mcp_stdio(url: Optional[str], store_url: Optional[str], agent_id: Optional[str]) -> None:
    """Serve MCP over stdio (for desktop, IDE and CLI agents): the same memory, identities and
    access rules as the HTTP API. Nothing but MCP is written to stdout."""
    import os

    from .client import ConfigError, resolve

    if url and store_url:
        raise click.UsageError("give --url (a server) or --store (in process), not both")
    config = None
    if not store_url:
        try:
            config = resolve(url, agent_id=agent_id)
        except ConfigError:
            if url:
                raise
    api_key = config.api_key if config else os.environ.get("AMPKIT_API_KEY")
    agent_id = config.agent_id if config else (agent_id or os.environ.get("AMPKIT_AGENT_ID"))
    if config is not None and config.is_http:
        _mcp_remote(config.url, agent_id, api_key)
    else:
        from .bootstrap import load_settings

        _mcp_local(store_url or (config.url if config else load_settings().store_url()), agent_id, api_key)


def _mcp_remote(url: str, agent_id: Optional[str], api_key: Optional[str]) -> None:
    import anyio

    from .client._http import AsyncHTTPTransport
    from .mcp_server import ClientGateway, build_mcp_server

    if not agent_id and not api_key:
        click.echo("ampkit: name the agent to act as: --agent-id (or AMPKIT_AGENT_ID), or a key in AMPKIT_API_KEY", err=True)
        sys.exit(EXIT_USAGE)
    transport = AsyncHTTPTransport(url, agent_id=agent_id, api_key=api_key)
    server = build_mcp_server(ClientGateway(transport, agent_id))
    click.echo(f"ampkit: MCP over stdio, through {url}" + (f" as {agent_id}" if agent_id else " as the key's agent"), err=True)

    async def serve() -> None:
        try:
            await server.run_stdio_async()
        finally:
            await transport.close()

    anyio.run(serve)


def _mcp_local(store_url: str, agent_id: Optional[str], api_key: Optional[str]) -> None:
    import anyio

    from .access import check_agent_id
    from .auth import verify_key
    from .bootstrap import build_service, load_settings
    from .embed_queue import EmbeddingWorker
    from .errors import APIError
    from .mcp_server import ServiceGateway, build_mcp_server, fixed_caller
    from .server.identity import Caller

    check_store(store_url)
    service = build_service(load_settings(store=store_url))
    try:
        service.store.open()
    except Exception as exc:  # noqa: BLE001 - any failure to open is reported the same way
        click.echo(f"ampkit: cannot open store {_shown(store_url)}: {exc}", err=True)
        sys.exit(EXIT_STARTUP_FAILURE)
    try:
        try:
            if api_key:
                key = verify_key(service.store, api_key)
                if agent_id and check_agent_id(agent_id) != key.agent_id:
                    raise click.UsageError(f"--agent-id {agent_id!r} is not the key's agent {key.agent_id!r}")
                caller = Caller(key.agent_id, frozenset(key.scopes), key.key_id)
            else:
                caller = Caller(check_agent_id(agent_id))
        except APIError as exc:
            click.echo(f"ampkit: {exc.message}: name the agent with --agent-id (or AMPKIT_AGENT_ID), "
                       "or give a key in AMPKIT_API_KEY", err=True)
            sys.exit(EXIT_USAGE)
        server = build_mcp_server(ServiceGateway(service, fixed_caller(caller)))
        click.echo(f"ampkit: MCP over stdio, store {_shown(store_url)}, as {caller.agent_id}", err=True)
        embedding = EmbeddingWorker(service)  # with a slow embedder, cells are embedded after the write
        embedding.start()
        try:
            anyio.run(server.run_stdio_async)
        finally:
            embedding.stop()
    finally:
        service.store.close()


# ---------------------------------------------------------------- keys
def _store(url: Optional[str]):
    from .cli_common import store_url

    return _open_or_exit(store_url(url))


def _active_keys(store) -> int:
    from .auth import key_state

    return sum(1 for key in store.keys.list() if key_state(key) == "active")


def _key_id(value: str) -> str:
    # Accept the key id or a whole key (its id is the part between the prefix and the secret).
    return value.split("_")[1] if value.startswith("ampk_") and value.count("_") >= 2 else value




@main.group()
def keys() -> None:
    """Manage API keys (used when the server runs with --auth)."""


@keys.command("create")
@click.option("--agent", "agent_id", required=True, help="the agent id this key acts as")
@click.option("--scopes", default="read,write", show_default=True,
              help="comma list of read, write, approve (decide memory-file proposals), admin")
@click.option("--expires", default=None, help="lifetime, e.g. 30d, 12h [default: never]")
@store_option
def keys_create(agent_id: str, scopes: str, expires: Optional[str], store_url: Optional[str]) -> None:
    """Create a key and print it once (on stdout; details on stderr)."""
    from .auth import create_key, parse_duration

    try:
        lifetime = parse_duration(expires) if expires else None
        store = _store(store_url)
        try:
            issued = create_key(store, agent_id, scopes, lifetime)
        finally:
            store.close()
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    rec = issued.record
    click.echo(f"created key {rec.key_id} for agent {rec.agent_id!r}, scopes {','.join(rec.scopes)}, "
               f"expires {rec.expires_at.isoformat() if rec.expires_at else 'never'}; it is shown only once:", err=True)
    click.echo(issued.token)


@keys.command("list")
@click.option("--agent", "agent_id", default=None, help="only this agent's keys")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per line")
@store_option
def keys_list(agent_id: Optional[str], as_json: bool, store_url: Optional[str]) -> None:
    """List keys (ids, agents, scopes, state; never secrets)."""
    import json

    from .auth import key_state

    store = _store(store_url)
    try:
        records = store.keys.list(agent_id)
    finally:
        store.close()
    fmt = lambda dt: dt.isoformat(timespec="seconds") if dt else "-"  # noqa: E731
    rows = [{"key_id": rec.key_id, "agent_id": rec.agent_id, "scopes": list(rec.scopes), "state": key_state(rec),
             "created_at": fmt(rec.created_at), "expires_at": fmt(rec.expires_at),
             "revoked_at": fmt(rec.revoked_at), "replaced_by": rec.replaced_by} for rec in records]
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    if not rows:
        click.echo("no keys" + (f" for agent {agent_id!r}" if agent_id else ""), err=True)
        return
    columns = (("KEY ID", "key_id"), ("STATE", "state"), ("AGENT", "agent_id"), ("SCOPES", "scopes"),
               ("CREATED", "created_at"), ("EXPIRES", "expires_at"))
    cells = [[title for title, _ in columns]] + [
        [",".join(row[name]) if name == "scopes" else str(row[name]) for _, name in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        click.echo("  ".join(value.ljust(width) for value, width in zip(line, widths)).rstrip())


@keys.command("revoke")
@click.argument("key_id")
@store_option
def keys_revoke(key_id: str, store_url: Optional[str]) -> None:
    """Revoke a key now."""
    from .auth import revoke_key

    store = _store(store_url)
    try:
        rec = revoke_key(store, _key_id(key_id))
    except KeyError as exc:
        raise click.BadParameter(f"no key {key_id!r}") from exc
    finally:
        store.close()
    click.echo(f"revoked key {rec.key_id} (agent {rec.agent_id!r})", err=True)


@keys.command("rotate")
@click.argument("key_id")
@click.option("--overlap", default="24h", show_default=True, help="how long the old key stays valid")
@store_option
def keys_rotate(key_id: str, overlap: str, store_url: Optional[str]) -> None:
    """Issue a replacement key; the old one expires after the overlap. Prints the new key once."""
    from .auth import parse_duration, rotate_key

    store = _store(store_url)
    try:
        issued = rotate_key(store, _key_id(key_id), parse_duration(overlap))
    except (KeyError, ValueError) as exc:
        raise click.BadParameter(str(exc).strip("'\"")) from exc
    finally:
        store.close()
    rec = issued.record
    click.echo(f"new key {rec.key_id} for agent {rec.agent_id!r} replaces {_key_id(key_id)}, "
               f"which stays valid for {overlap}; the new key is shown only once:", err=True)
    click.echo(issued.token)


# ---------------------------------------------------------------- stores
_shown = shown


def _open_or_exit(url: str, *, create: bool = True):
    from .store import store_from_url

    check_store(url, create=create)
    try:
        store = store_from_url(url)
        store.open()
    except Exception as exc:  # noqa: BLE001 - any failure to open is reported the same way
        click.echo(f"ampkit: cannot open store {_shown(url)}: {exc}", err=True)
        sys.exit(EXIT_STARTUP_FAILURE)
    return store


@main.command()
@store_option
@click.option("--dry-run", is_flag=True, help="only list the migrations that would be applied")
def migrate(store_url: Optional[str], dry_run: bool) -> None:
    """Bring a store's schema up to date (servers also do this when they start)."""
    from .cli_common import store_url as resolved
    from .store.transfer import pending_migrations

    store_url = resolved(store_url)
    if not dry_run:  # a dry run of a store not made yet lists every migration and creates nothing
        check_store(store_url)
    try:
        pending = pending_migrations(store_url)
    except Exception as exc:  # noqa: BLE001
        click.echo(f"ampkit: cannot open store {_shown(store_url)}: {exc}", err=True)
        sys.exit(EXIT_STARTUP_FAILURE)
    for version, name in pending:
        click.echo(f"{'would apply' if dry_run else 'applying'} migration {version}: {name}")
    if not pending:
        click.echo(f"{_shown(store_url)}: schema is up to date")
    elif not dry_run:
        _open_or_exit(store_url).close()  # open() applies them, under the store's migration lock
        click.echo(f"{_shown(store_url)}: applied {len(pending)} migration(s)")


@main.command()
@click.option("--from", "source_url", required=True, help="store to read, e.g. sqlite:///memory.db")
@click.option("--to", "dest_url", required=True, help="empty store to fill, e.g. postgresql://user@host/db")
@click.option("--batch-size", default=200, show_default=True, help="cells per destination transaction")
def copy(source_url: str, dest_url: str, batch_size: int) -> None:
    """Copy every cell (any status), its history and the API keys into an empty store, then
    verify the counts. Vectors are recomputed with the configured embedder (AMPKIT_EMBEDDER)."""
    from .bootstrap import load_settings, retriever_from_settings
    from .store.transfer import DestinationNotEmpty, copy_store, everything

    source = _open_or_exit(source_url, create=False)
    dest = _open_or_exit(dest_url)
    try:
        if dest.count(everything()) or dest.keys.list():  # refused before a bar is drawn
            raise DestinationNotEmpty(f"{_shown(dest_url)} already holds cells or keys; copy only fills an empty store")
        with progress("copy", "cell", source.count(everything())) as bar:
            report = copy_store(source, dest, retriever_from_settings(load_settings()), batch_size, bar.update)
    except DestinationNotEmpty as exc:
        click.echo(f"ampkit: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    finally:
        source.close()
        dest.close()
    click.echo(f"copied {report.cells} cells, {report.history} history entries, {report.folders} folder settings, "
               f"{report.proposals} file proposals, {report.keys} API keys, {report.vectors} vectors: "
               f"{_shown(source_url)} -> {_shown(dest_url)}")
    if not report.verified:
        for problem in report.mismatches:
            click.echo(f"ampkit: verification failed: {problem}", err=True)
        sys.exit(1)
    click.echo("verified: cell counts per status, history per cell and API keys match")


_url_option = click.option(
    "--url", "server_url", is_flag=False, flag_value="", default=None, metavar="[URL]",
    help="a running server instead of a store: http(s)://HOST:PORT[/amp/v1]; --url alone takes AMPKIT_URL "
         "or the client config file. The caller is AMPKIT_API_KEY (a key with the admin scope; needed when "
         "the server runs with --auth), else AMPKIT_AGENT_ID, else human:<your login name>")


def _server(server_url: str, store_url: Optional[str]):
    """A client of the server --url names, acting as the client settings say (docs/clients.md)."""
    import getpass

    import ampkit
    from .client import ConfigError, resolve

    if store_url:
        raise click.UsageError("give --url (a server) or --store (a store), not both")
    try:
        config = resolve(server_url or None)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if not config.is_http:
        raise click.UsageError(f"--url names a server (http:// or https://), not {shown(config.url)}; use --store")
    agent_id = config.agent_id or (None if config.api_key else f"human:{getpass.getuser()}")
    return ampkit.connect(config.url, agent_id=agent_id, api_key=config.api_key)


def _exit_on_api_error(exc: Exception, where: str) -> None:
    from .errors import APIError

    if isinstance(exc, APIError):
        for err in exc.details.get("errors", []) if isinstance(exc.details.get("errors"), list) else []:
            if isinstance(err, dict) and "line" in err:
                click.echo(f"{where}:{err['line']}: {err['error']}", err=True)
        if isinstance(exc.details.get("line"), int):  # one line the server could not decode
            click.echo(f"{where}:{exc.details['line']}: {exc.message}", err=True)
        click.echo(f"ampkit: {exc.code}: {exc.message}", err=True)
    else:
        click.echo(f"ampkit: {exc}", err=True)
    sys.exit(1)


def _is_cell_line(line: str) -> bool:
    return line.startswith('{"kind":"cell"')


@main.command("export")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@store_option
@_url_option
@click.option("--owner", "owner_id", default=None, help="only this owner's cells (and their history)")
@click.option("--resume", is_flag=True, help="continue an interrupted export into FILE after its last complete line")
@click.option("--cursor", default=None, help="start after the line carrying this cursor (for FILE = -)")
def export_command(file: str, store_url: Optional[str], server_url: Optional[str], owner_id: Optional[str],
                   resume: bool, cursor: Optional[str]) -> None:
    """Export a store, or a running server's store (--url), as NDJSON (cells, history,
    supersession links, file approvals), streamed page by page. FILE - writes to stdout.
    The format is in docs/time-travel.md."""
    import time

    from .cli_common import store_url as resolved
    from .errors import AmpkitError, ValidationFailed
    from .portable import check_cursor, export_lines, last_cursor

    try:
        if resume:
            if file == "-":
                raise click.BadParameter("--resume needs a FILE, not -")
            cursor = last_cursor(file)
        check_cursor(cursor)
    except (OSError, ValueError, ValidationFailed) as exc:
        raise click.BadParameter(str(exc)) from exc
    client = store = None
    if server_url is not None:
        client = _server(server_url, store_url)
        source = shown(client.url)
        lines = client.export_ndjson(owner_id=owner_id, cursor=cursor)
    else:
        url = resolved(store_url)
        store = _open_or_exit(url, create=False)
        source = shown(url)
        lines = export_lines(store, owner_id, cursor)
    count = cells = 0
    started = time.monotonic()
    try:
        out = sys.stdout if file == "-" else open(file, "a" if resume else "w", encoding="utf-8")
        try:
            with progress("export", "line") as bar:
                for line in lines:
                    out.write(line)
                    count += 1
                    cells += _is_cell_line(line)
                    bar.update()
        finally:
            if out is not sys.stdout:
                out.close()
    except AmpkitError as exc:
        _exit_on_api_error(exc, file)
    finally:
        if store is not None:
            store.close()
        if client is not None:
            client.close()
    click.echo(f"exported {count} lines ({cells} cells) from {source}" + (f" to {file}" if file != "-" else "")
               + f" in {time.monotonic() - started:.1f} s", err=True)


@main.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@store_option
@_url_option
@click.option("--from", "source_format", default="auto", show_default=True,
              type=click.Choice(["auto", "ampkit", "amp", "mem0", "letta", "langgraph"]),
              help="what FILE is: an ampkit NDJSON export or a peer's data (docs/time-travel.md#importers)")
@click.option("--owner", "owner_id", default=None, help="owner id for peer data that names none (Letta .af)")
@click.option("--agent", "agent_id", default=None, help="recorded as created_by where the peer data names no author")
def import_command(file: str, store_url: Optional[str], server_url: Optional[str], source_format: str,
                   owner_id: Optional[str], agent_id: Optional[str]) -> None:
    """Import FILE into a store, or into a running server's store (--url): all of it in one
    transaction, or nothing. Importing the same file twice changes nothing; problems are
    reported by line number. Over --url the file is one request, bounded by the server's
    max_request_bytes (4 MiB by default); import larger files with --store."""
    from .bootstrap import load_settings, retriever_from_settings
    from .cli_common import store_url as resolved
    from .errors import AmpkitError
    from .importers import ImporterError, detect_format, to_export_lines
    from .portable import import_lines, iter_file

    open_lines: Callable[[], Iterable[Union[str, bytes]]]
    try:
        fmt = detect_format(file) if source_format == "auto" else source_format
        if fmt == "ampkit":
            open_lines = iter_file(file)
        else:
            converted = to_export_lines(fmt, file, owner_id=owner_id, agent_id=agent_id)
            open_lines = lambda: iter(converted)  # noqa: E731
    except ImporterError as exc:
        click.echo(f"ampkit: {exc}", err=True)
        sys.exit(1)
    total = sum(1 for _ in open_lines())
    if server_url is not None:
        client = _server(server_url, store_url)
        target = shown(client.url)
        try:
            with progress(f"import ({fmt})", "line", total) as bar:
                def sent() -> Iterator[Union[str, bytes]]:
                    for line in open_lines():
                        yield line
                        bar.update()
                report = client.import_ndjson(sent())
        except AmpkitError as exc:
            _exit_on_api_error(exc, file)
        finally:
            client.close()
    else:
        url = resolved(store_url)
        target = shown(url)
        store = _open_or_exit(url)
        try:
            settings = load_settings()
            with progress(f"import ({fmt})", "line", total) as bar:
                report = import_lines(store, open_lines, retriever_from_settings(settings), bar.update,
                                      limits=settings.limits())
        except AmpkitError as exc:
            _exit_on_api_error(exc, file)
        finally:
            store.close()
    click.echo(f"imported {report.cells_written} cells and {report.history_written} history entries "
               f"({report.cells_unchanged} cells and {report.history_unchanged} entries already there, unchanged) "
               f"into {target}")
    if report.folders_written + report.folders_unchanged + report.proposals_written + report.proposals_unchanged:
        click.echo(f"and {report.folders_written} folder settings and {report.proposals_written} file proposals "
                   f"({report.folders_unchanged} and {report.proposals_unchanged} already there, unchanged)")
    if server_url is None and _is_ephemeral(url):
        click.echo(f"ampkit: warning: {shown(url)} lives in this process only: what was imported is gone now "
                   "that the command exits; import into sqlite:///PATH or postgresql://... to keep it", err=True)


def _is_ephemeral(url: str) -> bool:
    return url.lower().startswith("memory:") or url.lower() in ("sqlite://", "sqlite:///", "sqlite:///:memory:")


@main.command()
@store_option
@click.option("--embedder", default=None, help="embedder to use [default: AMPKIT_EMBEDDER]")
@click.option("--all", "everything", is_flag=True, help="re-embed every cell, not only those from another model")
@click.option("--batch-size", default=256, show_default=True, help="cells per embedding call and transaction")
def reindex(store_url: Optional[str], embedder: Optional[str], everything: bool, batch_size: int) -> None:
    """Re-embed a store's cells after an embedding-model change (a running server picks the
    new vectors up)."""
    from .bootstrap import load_settings, retriever_from_settings
    from .embeddings import reindex as reindex_store
    from .store.transfer import everything as every_cell

    settings = load_settings(store=store_url or None, embedder=embedder or None)
    retriever = retriever_from_settings(settings)
    if retriever.embedder is None:
        click.echo("ampkit: the embedder is 'none': nothing to index (set AMPKIT_EMBEDDER or --embedder)", err=True)
        sys.exit(EXIT_USAGE)
    store = _store(settings.store_url())
    try:
        total = store.count(every_cell())
        with progress("reindex", "cell", total) as bar:
            done = reindex_store(store, retriever, batch_size, bar.update, only_stale=not everything)
    finally:
        store.close()
    click.echo(f"re-embedded {done} cells with {retriever.embedder.name}")


@main.command()
@click.option("--owner", "owner_id", required=True, help="whose episodes to consolidate")
@click.option("--session", "session_id", default=None, help="one session [default: every session of the owner]")
@click.option("--agent-id", "--agent", "agent_id", default=None,
              help="the agent that consolidates: it reads the episodes and is the creator of what is written "
                   "[default: the owner]")
@click.option("--playbooks", type=click.Choice(["propose", "apply"]), default="propose", show_default=True,
              help="write playbook changes (apply) or only list them (propose)")
@click.option("--files", type=click.Choice(["off", "propose"]), default="off", show_default=True,
              help="propose: also propose AGENTS.md edits (for `ampkit proposals` to approve)")
@click.option("--dry-run", is_flag=True, help="decide everything, write nothing")
@click.option("--json", "as_json", is_flag=True, help="print each session's response as one JSON line")
@store_option
def consolidate(owner_id: str, session_id: Optional[str], agent_id: Optional[str], playbooks: str, files: str,
                dry_run: bool, as_json: bool, store_url: Optional[str]) -> None:
    """Distil an owner's episodes into facts and playbooks with the configured model
    (AMPKIT_LLM_URL, AMPKIT_LLM_MODEL), printing every decision and its reason. A fact may
    be read by the agents that may read all of its episodes (docs/consolidation.md)."""
    from .bootstrap import build_service, load_settings
    from .consolidation import sessions_of
    from .errors import APIError
    from .llm import NOT_CONFIGURED_MESSAGE
    from .models import ConsolidateRequest

    settings = load_settings(store=store_url)
    service = build_service(settings)
    if service.model is None:
        click.echo(f"ampkit: {NOT_CONFIGURED_MESSAGE}", err=True)
        sys.exit(EXIT_USAGE)
    agent = agent_id or owner_id
    check_store(settings.store_url(), create=False)
    try:
        service.store.open()
    except Exception as exc:  # noqa: BLE001 - any failure to open is reported the same way
        click.echo(f"ampkit: cannot open store {_shown(settings.store_url())}: {exc}", err=True)
        sys.exit(EXIT_STARTUP_FAILURE)
    try:
        sessions = [session_id] if session_id else sessions_of(service, agent, owner_id)
        requests = [ConsolidateRequest(owner_id=owner_id, session_id=s, playbooks=playbooks, dry_run=dry_run,
                                       files=files) for s in sessions]
        consolidator_episodes = service.consolidator().episodes
        total = sum(len(consolidator_episodes(agent, r)) for r in requests)
        with progress("consolidate", "episode", total) as bar:
            for req in requests:
                result = service.consolidate(agent, req, progress=bar.update)
                if as_json:
                    click.echo(result.model_dump_json())
                    continue
                for d in result.decisions:
                    state = "written" if d.applied else f"proposed {d.proposal_id}" if d.proposal_id else "not written"
                    click.echo(f"{req.session_id}\t{d.action}\t{state}\t{d.path or d.text}\t({d.reason})")
    except APIError as exc:
        click.echo(f"ampkit: {exc.code}: {exc.message}", err=True)
        sys.exit(1)
    finally:
        service.store.close()


@main.command()
@click.option("--base-url", required=True, help="server base URL, e.g. http://127.0.0.1:8765/amp/v1")
@click.option("--vectors", default=None, help="vector file or directory [default: the bundled suite]")
@click.option("--only", default=None, help="run only cases whose id contains this text")
def conformance(base_url: str, vectors: Optional[str], only: Optional[str]) -> None:
    """Run the AMP conformance suite against any server over HTTP."""
    from .spec.conformance import main as run_suite

    sys.exit(run_suite(base_url, vectors, only))


if __name__ == "__main__":
    main()
