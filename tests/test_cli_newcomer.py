"""The command line as a newcomer meets it (issue 44): help on every command and option, one
store default, import and export through a running server, progress and summaries, and
errors that say what went wrong once."""

from __future__ import annotations

import socket

import click
import pytest

import ampkit
from ampkit.auth import create_key
from ampkit.cli import main
from ampkit.cli_common import STORE_HELP
from ampkit.store import store_from_url
from support import run_cli

BAD_TOOLS = '{"mcpServers": {"gh": {"command": "", "args": "x"}, "web": {"url": "ftp://x", "tools": [1]}}, "extra": true}'


def _commands(group: click.Group, prefix: str = ""):
    for name, command in group.commands.items():
        yield f"{prefix}{name}", command
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix}{name} ")


def test_every_command_and_option_has_help():
    missing = []
    for name, command in _commands(main):
        if not (command.help or command.short_help):
            missing.append(name)
        for param in command.params:
            if isinstance(param, click.Option) and not param.help:
                missing.append(f"{name} {param.opts[0]}")
    assert missing == []


def test_store_has_one_default_stated_the_same_everywhere():
    for name, command in _commands(main):
        for param in command.params:
            if isinstance(param, click.Option) and "--store" in param.opts and name != "mcp":
                assert not param.required and param.default is None, name
                assert param.help == STORE_HELP, name
    scopes = next(p for p in main.commands["keys"].commands["create"].params if p.name == "scopes")
    assert "approve" in scopes.help


def test_a_store_path_with_a_missing_directory_is_refused_and_a_new_store_is_announced(tmp_path):
    # Refused before the bind; the port is held here, so a server that did not refuse fails to bind.
    with socket.create_server(("127.0.0.1", 0)) as held:
        typo = run_cli("serve", "--store", f"sqlite:///{tmp_path}/no-such-dir/m.db", "--port", str(held.getsockname()[1]))
    assert typo.returncode == 3
    assert f"the directory {tmp_path}/no-such-dir does not exist" in typo.stderr
    assert not (tmp_path / "no-such-dir").exists()

    made = run_cli("keys", "create", "--agent", "ops", "--store", f"sqlite:///{tmp_path}/new.db")
    assert made.returncode == 0 and made.stdout.startswith("ampk_")  # stdout: only the key
    assert made.stderr.count(f"creating a new store at {tmp_path}/new.db") == 1
    again = run_cli("keys", "list", "--store", f"sqlite:///{tmp_path}/new.db")
    assert "creating" not in again.stderr

    missing = run_cli("export", "-", "--store", f"sqlite:///{tmp_path}/nothing.db")
    assert missing.returncode == 3 and "there is no store file at" in missing.stderr
    assert not (tmp_path / "nothing.db").exists()


def test_keys_list_has_a_header_and_aligned_columns(tmp_path):
    url = f"sqlite:///{tmp_path}/k.db"
    run_cli("keys", "create", "--agent", "ops", "--scopes", "read,admin", "--store", url)
    run_cli("keys", "create", "--agent", "a-much-longer-agent-id", "--store", url)
    lines = run_cli("keys", "list", "--store", url).stdout.splitlines()
    assert lines[0].split() == ["KEY", "ID", "STATE", "AGENT", "SCOPES", "CREATED", "EXPIRES"]
    assert len(lines) == 3
    for title in ("STATE", "AGENT", "SCOPES", "CREATED", "EXPIRES"):
        column = lines[0].index(title)
        assert all(line[column - 2:column] == "  " and line[column] != " " for line in lines[1:]), title


def _seed(url: str, n: int = 30) -> None:
    with ampkit.connect(url, agent_id="ann") as mem:
        mem.remember_many([{"text": f"fact number {i}", "owner_id": "ann"} for i in range(n)])


def test_export_and_import_through_a_running_server(tmp_path, server_factory):
    source_url = f"sqlite:///{tmp_path}/source.db"
    _seed(source_url)
    store = store_from_url(source_url)
    store.open()
    admin, reader = create_key(store, "ops", "read,admin").token, create_key(store, "ann", "read").token
    store.close()
    source = server_factory(source_url, args=["--auth"])
    dump = tmp_path / "dump.ndjson"

    exported = run_cli("export", str(dump), "--url", source.base_url, env={"AMPKIT_API_KEY": admin})
    assert exported.returncode == 0, exported.stderr
    assert f"exported {len(dump.read_text().splitlines())} lines (30 cells) from {source.base_url}" in exported.stderr
    local = run_cli("export", "-", "--store", source_url)
    assert local.stdout == dump.read_text()  # the same bytes as from the store itself

    refused = run_cli("export", "-", "--url", source.base_url, env={"AMPKIT_API_KEY": reader})
    assert refused.returncode == 1 and "FORBIDDEN" in refused.stderr and refused.stdout == ""
    both = run_cli("export", "-", "--url", source.base_url, "--store", source_url)
    assert both.returncode == 2 and "not both" in both.stderr

    target = server_factory(f"sqlite:///{tmp_path}/target.db")  # auth off: the agent id is trusted
    env = {"AMPKIT_URL": target.base_url, "AMPKIT_AGENT_ID": "ops"}
    imported = run_cli("import", str(dump), "--url", env=env)  # --url alone: AMPKIT_URL
    assert imported.returncode == 0, imported.stderr
    assert "imported 30 cells" in imported.stdout and target.base_url in imported.stdout
    with ampkit.connect(target.base_url, agent_id="ann") as mem:
        assert len(list(mem.list(owner_id="ann"))) == 30
    assert "imported 0 cells" in run_cli("import", str(dump), "--url", env=env).stdout


def test_import_over_http_reports_the_lines_in_error(tmp_path, server_factory):
    bad = tmp_path / "bad.ndjson"
    bad.write_text('{"kind":"header","format":"ampkit-export","format_version":1,"amp_version":"0.1.0","owner_id":null}\n'
                   '{"kind":"cell","cursor":"cell:x","cell":{}}\n{"kind":"end"}\n')
    target = server_factory()
    refused = run_cli("import", str(bad), "--from", "ampkit", "--url", target.base_url, env={"AMPKIT_AGENT_ID": "ops"})
    assert refused.returncode == 1
    assert f"{bad}:2: " in refused.stderr and "VALIDATION_ERROR" in refused.stderr


def test_long_commands_show_progress_and_a_summary(tmp_path):
    url = f"sqlite:///{tmp_path}/m.db"
    _seed(url, 12)
    exported = run_cli("export", str(tmp_path / "out.ndjson"), "--store", url)
    assert "export: " in exported.stderr and "line/s" in exported.stderr
    assert "(12 cells)" in exported.stderr and exported.stderr.rstrip().endswith(" s")

    filled = run_cli("copy", "--from", url, "--to", url)  # the destination holds cells
    assert filled.returncode == 2 and "already holds cells" in filled.stderr
    assert "copy:" not in filled.stderr  # refused before any bar is drawn


def test_import_into_a_memory_store_warns_that_it_is_gone_at_exit(tmp_path):
    url = f"sqlite:///{tmp_path}/m.db"
    _seed(url, 3)
    run_cli("export", str(tmp_path / "out.ndjson"), "--store", url)
    done = run_cli("import", str(tmp_path / "out.ndjson"), "--store", "memory://")
    assert done.returncode == 0 and "imported 3 cells" in done.stdout
    assert "memory:// lives in this process only" in done.stderr
    kept = run_cli("import", str(tmp_path / "out.ndjson"), "--store", f"sqlite:///{tmp_path}/kept.db")
    assert "lives in this process only" not in kept.stderr


def test_file_validation_prints_each_problem_once_on_its_own_line(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "tools.json").write_text(BAD_TOOLS)
    done = run_cli("files", "import", str(folder), "--owner", "ann", "--store", f"sqlite:///{tmp_path}/m.db")
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if "creating a new store" not in line]
    assert lines[0] == "ampkit: VALIDATION_ERROR: 5 problem(s), nothing was changed:"
    assert len(lines) == 6 and all(line.startswith("  tools.json ") for line in lines[1:])
    assert done.stderr.count("should be non-empty") == 1


def test_proposals_and_files_that_do_not_exist_are_named(tmp_path):
    url = f"sqlite:///{tmp_path}/m.db"
    for command in ("approve", "reject", "show"):
        done = run_cli("proposals", command, "prop_nope", "--store", url)
        assert done.returncode == 1 and "proposal not found: prop_nope" in done.stderr, command
        assert "memory" not in done.stderr
    missing = run_cli("files", "read", "AGENTS.md", "--owner", "ann", "--store", url)
    assert missing.returncode == 1 and "no file AGENTS.md in ann's folder" in missing.stderr


@pytest.mark.parametrize("args", [("export", "-"), ("import", "x.ndjson")])
def test_url_must_name_a_server(tmp_path, args):
    (tmp_path / "x.ndjson").write_text("")
    done = run_cli(*args[:1], str(tmp_path / args[1]) if args[1] != "-" else "-", "--url", f"sqlite:///{tmp_path}/m.db")
    assert done.returncode == 2 and "--url names a server" in done.stderr
