"""`ampkit serve --workers N`: N server processes on one port and one store, each its own app
and caches, behaving as one server: every acknowledged write is read back through any
connection, an inspector cookie signed by one worker is good at the others, a worker killed
outright is replaced, the scheduled lifecycle runs once per interval across them, and /spec
says the rate limit counts per process."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from ampkit.store.sqlite import SQLiteStore
from support import TLS, ServerProcess, process_cpu_seconds, process_tree


def worker_pids(server_pid: int) -> list[int]:
    """uvicorn's worker processes (spawned), not multiprocessing's resource tracker."""
    def cmdline(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""
    return [pid for pid in process_tree(server_pid)[1:] if b"spawn_main" in cmdline(pid) and b"resource_tracker" not in cmdline(pid)]


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/shared.db"
    return request.getfixturevalue("pg_url")


@pytest.mark.slow
def test_two_workers_serve_one_store_as_one_server(store_url: str, tmp_path: Path) -> None:
    with ServerProcess(store_url, args=["--workers", "2", "--rate-limit", "1000", "--lifecycle-interval", "0"],
                       log_path=tmp_path / "serve.log") as server:
        assert server.proc is not None
        workers = worker_pids(server.proc.pid)
        assert len(workers) == 2, workers
        cpu_before = {pid: process_cpu_seconds(pid) for pid in workers}

        spec = httpx.get(f"{server.base_url}/spec", verify=TLS).json()
        assert spec["capabilities"]["auth"]["rate_limit"] == {
            "requests_per_second": 1000.0, "burst": 2000, "per": "agent and server process", "processes": 2}

        acked: dict[str, str] = {}
        errors: list[str] = []
        lock = threading.Lock()

        def client(n: int) -> None:
            agent = f"agent-{n}"
            for i in range(25):  # a new connection for each write: the workers accept in turn
                text = f"{agent} remembers fact {i}: the kettle is blue"
                r = httpx.post(f"{server.base_url}/memories", headers={"X-AMP-Agent-ID": agent},
                               json={"content": {"text": text}, "identity": {"owner_id": agent, "session_id": f"{agent}-s"}}, verify=TLS)
                with lock:
                    if r.status_code == 201:
                        acked[r.json()["id"]] = text
                    else:
                        errors.append(f"{r.status_code} {r.text[:200]}")

        threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and len(acked) == 200
        # Both workers answered some of them (each spent CPU on the writes).
        assert all(process_cpu_seconds(pid) > cpu_before[pid] for pid in workers), (cpu_before, {pid: process_cpu_seconds(pid) for pid in workers})

        # Every write reads back, by id and by search, through fresh connections (either worker).
        for cid, text in acked.items():
            agent = text.split(" ", 1)[0]
            r = httpx.get(f"{server.base_url}/memories/{cid}", headers={"X-AMP-Agent-ID": agent}, verify=TLS)
            assert r.status_code == 200 and r.json()["content"]["text"] == text
        for n in range(8):
            found = set()
            for _ in range(4):  # searches land on either worker: each must see all 25
                r = httpx.post(f"{server.base_url}/memories/search", headers={"X-AMP-Agent-ID": f"agent-{n}"},
                               json={"query": "kettle blue fact", "owner_id": f"agent-{n}", "limit": 50}, verify=TLS)
                assert r.status_code == 200
                ids = {hit["id"] for hit in r.json()["results"]}
                assert len(ids) == 25
                found |= ids
            assert found == {cid for cid, text in acked.items() if text.startswith(f"agent-{n} ")}

        # The inspector: each step on a new connection (either worker), the cookies signed by
        # whichever worker answered: sign-in form, sign-in, then pages.
        ui = f"http://127.0.0.1:{server.port}/ui"
        form = httpx.get(f"{ui}/signin", verify=TLS)
        token = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert form.status_code == 200 and token
        r = httpx.post(f"{ui}/signin", data={"csrf": token.group(1), "credential": "agent-3", "next": ""},
                       cookies=form.cookies, follow_redirects=False, verify=TLS)
        assert r.status_code == 303, r.text[:300]
        for _ in range(12):
            page = httpx.get(f"{ui}/owners", cookies=r.cookies, follow_redirects=False, verify=TLS)
            assert page.status_code == 200, page.status_code

        # A worker killed outright is replaced at once, even while the supervisor waits for the
        # answer to its ping (stopped first for longer than the supervisor's half-second round,
        # so that a ping is pending: uvicorn alone waited out its 30 s healthcheck timeout);
        # nothing it acknowledged is lost.
        os.kill(workers[0], signal.SIGSTOP)
        time.sleep(1.5)
        os.kill(workers[0], signal.SIGKILL)
        killed, deadline = time.monotonic(), time.monotonic() + 60
        while time.monotonic() < deadline:
            now = worker_pids(server.proc.pid)
            if len(now) == 2 and workers[0] not in now:
                break
            time.sleep(0.1)
        assert len(now) == 2 and workers[0] not in now, now
        assert time.monotonic() - killed < 10
        workers = now
        for n in range(8):  # either worker answers: the survivor, or the new one once it has started
            r = httpx.post(f"{server.base_url}/memories/search", headers={"X-AMP-Agent-ID": f"agent-{n}"},
                           json={"query": "kettle blue fact", "owner_id": f"agent-{n}", "limit": 50}, verify=TLS)
            assert r.status_code == 200 and len(r.json()["results"]) == 25

        # SIGTERM stops every worker (on SQLite, a clean stop leaves no keyword window pending).
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
    if not store_url.startswith("sqlite"):
        return
    conn = sqlite3.connect(store_url[len("sqlite:///"):])
    try:
        assert conn.execute("SELECT COUNT(*) FROM pending_windows").fetchone()[0] == 0
        assert conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0] == 200
    finally:
        conn.close()


def test_workers_need_a_store_the_processes_share() -> None:
    r = subprocess.run([sys.executable, "-m", "ampkit.cli", "serve", "--store", "memory://", "--workers", "2"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "AMPKIT_UI": "false"})
    assert r.returncode == 2 and "needs a store the processes share" in r.stderr


def test_processes_on_one_sqlite_file_claim_each_scheduled_interval_once(tmp_path: Path) -> None:
    db = str(tmp_path / "m.db")
    now = [1_000_000.0]
    first, second = SQLiteStore(db), SQLiteStore(db)
    for store in (first, second):
        store.wall_clock = lambda: now[0]
        store.open()
    try:
        assert first.claim_scheduled_lifecycle(3600)  # the first whose timer fires runs it
        assert not second.claim_scheduled_lifecycle(3600)  # the other skips this interval
        assert second.claim_scheduled_job("consolidation", 3600)  # a job of its own row
        now[0] += 3000
        assert not first.claim_scheduled_lifecycle(3600) and not second.claim_scheduled_lifecycle(3600)
        now[0] += 300  # 0.9 of the interval since the claim: a timer that drifted early still runs
        assert second.claim_scheduled_lifecycle(3600)
        assert not first.claim_scheduled_lifecycle(3600)
    finally:
        first.close()
        second.close()
