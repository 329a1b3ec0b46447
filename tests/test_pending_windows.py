"""A create commits its cell and leaves its keyword windows pending (SQLite migration 12); they
are indexed after the commit: in the background, before any search, and at open after a crash.
Searches answer exactly as if every window had been rewritten before its write's COMMIT."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone

import httpx

from ampkit.models import CellCreate, CellPatch
from ampkit.service import MemoryService
from ampkit.store.base import CellFilter
from ampkit.store.sqlite import SQLiteStore
from support import TLS, AppServer

WORDS = "tea coffee piano garden budget oslo lena quokka deploy runbook travel chess".split()


def pending(path: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT COUNT(*) FROM pending_windows").fetchone()[0]
    finally:
        conn.close()


def windows(path: str) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT rowid, text, owner, terms, len FROM cell_context ORDER BY rowid").fetchall()
    finally:
        conn.close()


def test_a_search_right_after_a_write_finds_it_over_http(tmp_path):
    """Each write is searched for at once (well inside the background pass's delay) and found
    by the keyword leg: without the indexing before a read, its window is not indexed yet."""
    store = f"sqlite:///{tmp_path}/rw.db"
    headers = {"X-AMP-Agent-ID": "ada"}
    with AppServer(store) as server, httpx.Client(base_url=server.base_url, headers=headers, timeout=10, verify=TLS) as http:
        for i in range(40):
            text = f"{WORDS[i % len(WORDS)]} note zq{i}x in session {i // 10}"
            body = {"content": {"text": text}, "identity": {"owner_id": "ada", "session_id": f"s{i // 10}"}}
            created = http.post("/memories", json=body)
            assert created.status_code == 201, created.text
            found = http.post("/memories/search", json={"query": f"zq{i}x", "owner_id": "ada", "limit": 5, "explain": True}).json()
            mine = [h for h in found["results"] if h["id"] == created.json()["id"]]
            assert mine and "keyword" in mine[0]["explain"], (i, found)  # found by its words, not only its vector


def test_deferred_windows_answer_bit_for_bit_as_windows_written_at_commit(tmp_path, monkeypatch):
    """Two stores take the same writes in the same order (creates in sessions, single and in
    batches, an update that moves a cell, a delete, a purge); one rewrites windows before each
    COMMIT, the other leaves them pending. Keyword answers between the writes, for an owner and
    for a reader across owners, are identical (scores to the bit), and so are the windows.
    (No background pass here: each search finds windows pending and indexes them first.)"""
    import ampkit.store.sqlite as sqlite_store

    monkeypatch.setattr(sqlite_store, "PENDING_WINDOWS_DELAY_S", 600.0)
    eager = SQLiteStore(str(tmp_path / "eager.db"), defer_windows=False, keyword_scan_max=0)
    deferred = SQLiteStore(str(tmp_path / "deferred.db"), keyword_scan_max=0)
    services = []
    now = [datetime(2026, 1, 1, tzinfo=timezone.utc)]
    for store in (eager, deferred):
        store.open()
        services.append(MemoryService(store=store, clock=lambda: now[0]))

    def cell(i: int, owner: str) -> CellCreate:
        words = " ".join(WORDS[(i * k + 3) % len(WORDS)] for k in range(1, 4))
        return CellCreate(content={"text": f"{words} fact {i}"}, identity={"owner_id": owner, "session_id": f"{owner}-s{i // 7}"},
                          access_policy={"readable_by": ["team-*"]} if i % 3 else {"public": True}, dedup="off")

    def answers() -> list:
        out = []
        for store in (eager, deferred):
            texts = {c.id: c.content.text for c in store.list(CellFilter(), limit=10_000)}
            per_store = []
            for query in ("tea piano", "quokka", "oslo budget", "fact 7", "runbook chess lena"):
                for flt in (CellFilter(owner_id="ada", reader="ada"), CellFilter(reader="team-1")):
                    per_store.append([(texts[c.cell_id], c.score) for c in store.keyword_candidates(query, flt, 20)])
            out.append(per_store)
        return out

    try:
        ids: list[list[str]] = [[], []]
        for i in range(60):
            owner = "ada" if i % 4 else "bob"
            for n, service in enumerate(services):
                if i % 10 == 9:
                    ids[n] += [c.id for c in service.create_many(owner, [cell(100 * i + k, owner) for k in range(4)])]
                else:
                    ids[n].append(service.create(owner, cell(i, owner)).id)
            if i == 30:
                for n, service in enumerate(services):
                    service.update("ada", ids[n][5], CellPatch(content={"text": "quokka moved out"}, identity={"session_id": "ada-other"}))
                    for gone in (ids[n][9], ids[n][13]):
                        service.update("ada", gone, CellPatch(lifecycle={"status": "archived"}))
                        service.delete("ada", gone)
                    now[0] += timedelta(days=3650)  # past the retention window
                    assert service.purge("ada", [ids[n][13]]).purged
                    now[0] -= timedelta(days=3650)
            if i % 6 == 5:
                assert pending(deferred.path) > 0
                eager_answers, deferred_answers = answers()
                assert deferred_answers == eager_answers, i
        deferred.index_pending_windows()
        assert windows(deferred.path) == windows(eager.path)
    finally:
        eager.close()
        deferred.close()


CRASH = textwrap.dedent("""
    import os, signal, sys
    from ampkit.models import CellCreate
    from ampkit.service import MemoryService
    from ampkit.store.sqlite import SQLiteStore
    import ampkit.store.sqlite
    ampkit.store.sqlite.PENDING_WINDOWS_DELAY_S = 600.0  # no background pass before the kill, however slow the creates
    store = SQLiteStore(sys.argv[1])
    store.open()
    service = MemoryService(store=store)
    for i in range(30):
        service.create("ada", CellCreate(content={"text": f"crash note zq{i}x"}, identity={"owner_id": "ada", "session_id": "s"}))
    print("written", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # before the background pass runs
""")


def test_windows_left_pending_by_sigkill_are_indexed_after_open(tmp_path):
    """A process killed right after its creates committed leaves their windows pending, in
    the file: every write is there, and found by keyword once the store is open again (open
    starts the pass; a search would not wait for it anyway)."""
    path = str(tmp_path / "crash.db")
    run = subprocess.run([sys.executable, "-c", CRASH, path], capture_output=True, text=True, timeout=120)
    assert "written" in run.stdout and run.returncode == -9, run.stderr
    assert pending(path) > 0
    store = SQLiteStore(path)
    store.open()
    try:
        deadline = time.monotonic() + 30
        while pending(path) and time.monotonic() < deadline:  # the background pass, with no search asking
            time.sleep(0.05)
        assert pending(path) == 0
        for i in range(30):
            hits = store.keyword_candidates(f"zq{i}x", CellFilter(owner_id="ada", reader="ada"), 5)
            assert f"crash note zq{i}x" in {store.get(c.cell_id).content.text for c in hits}
    finally:
        store.close()
    eager = SQLiteStore(str(tmp_path / "eager.db"), defer_windows=False)
    eager.open()
    try:
        service = MemoryService(store=eager)
        for i in range(30):
            service.create("ada", CellCreate(content={"text": f"crash note zq{i}x"}, identity={"owner_id": "ada", "session_id": "s"}))
    finally:
        eager.close()
    assert windows(path) == windows(str(tmp_path / "eager.db"))
