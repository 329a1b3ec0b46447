"""The installed package, the CLI's defaults and the numbered migrations."""

from __future__ import annotations

import importlib
import pkgutil
import socket
import sqlite3
import subprocess
import sys
import time

import httpx

import ampkit
from ampkit.store import store_from_url
from ampkit.store.sqlite import MIGRATIONS
from support import ROOT, TLS, free_port, run_cli

OPTIONAL = ("ampkit.adapters.", "ampkit.store.postgres")


def test_every_module_imports():
    failures = {}
    for info in pkgutil.walk_packages(ampkit.__path__, "ampkit."):
        if info.name.startswith(OPTIONAL):
            continue  # need their extra; tested in their own files
        try:
            importlib.import_module(info.name)
        except Exception as exc:  # noqa: BLE001
            failures[info.name] = repr(exc)
    assert failures == {}


def test_import_ampkit_needs_no_framework():
    code = "import sys, ampkit; bad = [m for m in ('langchain_core','llama_index','crewai','autogen_core','fastapi') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_serve_defaults_to_sqlite_in_user_data_dir(tmp_path):
    port = free_port()
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "ampkit.cli", "serve", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    try:
        lines = []
        while not any("listening on" in line for line in lines) and len(lines) < 20:
            lines.append(proc.stdout.readline())
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/amp/v1/health", timeout=1, verify=TLS).json()
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise AssertionError("server did not start")
    finally:
        proc.terminate()
        proc.wait(10)
    assert health["status"] == "ok" and health["amp_version"] == "0.1.0"
    assert set(health["embedding"]) == {"model", "multilingual_model", "background", "queued"}
    printed = "".join(lines)
    assert f"store sqlite:///{tmp_path}/xdg/ampkit/memory.db" in printed
    assert f"listening on http://127.0.0.1:{port}/amp/v1" in printed
    assert (tmp_path / "xdg" / "ampkit" / "memory.db").exists()


def test_serve_refuses_an_unopenable_store(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    # The store is opened before the server binds, so this runs in this process; the port is
    # held here, so that a server that did not refuse would fail to bind instead of listening.
    with socket.create_server(("127.0.0.1", 0)) as held:
        proc = run_cli("serve", "--port", str(held.getsockname()[1]), "--store", f"sqlite:///{tmp_path}/file/memory.db")
    assert proc.returncode == 3
    assert "cannot open store" in proc.stderr


def test_migrations_upgrade_an_old_database_in_order(tmp_path):
    path = tmp_path / "old.db"
    store = store_from_url(f"sqlite:///{path}")
    first_only = MIGRATIONS[:1]
    import ampkit.store.sqlite as sqlite_module

    full = list(sqlite_module.MIGRATIONS)
    sqlite_module.MIGRATIONS[:] = first_only
    try:
        store.open()
        with store.write() as tx:
            tx.conn.execute(
                "INSERT INTO cells(id, owner_id, type, status, text, body) VALUES (?,?,?,?,?,?)",
                ("mem_01KBX0Y3Q0W4ZJ7W0GQK0P3V2M", "u", "semantic", "active", "old fact",
                 '{"amp_version":"0.1.0","id":"mem_01KBX0Y3Q0W4ZJ7W0GQK0P3V2M","type":"semantic","content":{"metadata":{}},'
                 '"identity":{"owner_id":"u"},"lifecycle":{"created_at":"2026-01-01T00:00:00Z"}}'),
            )
        store.close()
    finally:
        sqlite_module.MIGRATIONS[:] = full
    store = store_from_url(f"sqlite:///{path}")
    store.open()
    try:
        versions = [r[0] for r in sqlite3.connect(path).execute("SELECT version FROM schema_migrations ORDER BY version")]
        assert versions == [v for v, _, _ in full]
        assert versions == sorted(versions)
        assert store.get("mem_01KBX0Y3Q0W4ZJ7W0GQK0P3V2M").content.text == "old fact"
    finally:
        store.close()


def test_version_licence_and_notice_come_from_one_place():
    import importlib.metadata

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert ampkit.__version__ == importlib.metadata.version("ampkit") == project["version"]
    assert project["license"] == "Apache-2.0" and set(project["license-files"]) == {"LICENSE", "NOTICE"}
    assert any(dep.startswith("anyio") for dep in project["dependencies"])  # the in-process async client uses it
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    notice = (ROOT / "NOTICE").read_text()
    assert "sentence-transformers/all-MiniLM-L6-v2" in notice and "Apache License, Version 2.0" in notice


def test_the_wheel_builds_without_warnings_and_carries_every_data_file(tmp_path):
    """A wheel build of the sources (setuptools from this environment, offline) prints no
    Python warning (a directory of data files missing from `packages` is one, and an error in
    a future setuptools), and the wheel holds every data file the package reads at run time."""
    import re
    import shutil
    import zipfile

    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "NOTICE"):
        shutil.copy(ROOT / name, src / name)
    for name in ("core", "adapters", "spec"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))",
         str(tmp_path / "dist")], cwd=src, capture_output=True, text=True)
    output = build.stdout + build.stderr
    assert build.returncode == 0, output
    assert re.findall(r"^.*\w+Warning: .*$", output, re.MULTILINE) == []
    assert "absent from" not in output

    wheel = zipfile.ZipFile(tmp_path / "dist" / build.stdout.strip().splitlines()[-1])
    shipped = set(wheel.namelist())
    data = [path for folder in ("core/data", "core/inspector/static", "core/inspector/templates", "spec")
            for path in (ROOT / folder).rglob("*") if path.is_file() and path.suffix not in (".py", ".pyc")]
    assert len(data) > 20
    expected = {"ampkit/" + str(p.relative_to(ROOT / "core")) if p.is_relative_to(ROOT / "core")
                else "ampkit/spec/" + str(p.relative_to(ROOT / "spec")) for p in data}
    assert expected - shipped == set()
    assert "ampkit/py.typed" in shipped
