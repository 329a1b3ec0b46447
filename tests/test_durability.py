"""SIGKILL during a stream of writes loses no acknowledged write. The killed server is a real
`ampkit serve` process; what it left is read back through the app served in this process (the
store file recovers the same on any open)."""

from __future__ import annotations

import threading
import time
from typing import Callable, Sized

import httpx
import pytest

from support import TLS, AppServer, ServerProcess


def kill_mid_stream(server: ServerProcess, write_stream: Callable[[int], None], *, clients: int, acked: Sized,
                    enough: int, within: float, stop: threading.Event) -> None:
    """Run `clients` write streams, SIGKILL the server once `enough` writes are acknowledged,
    then stop and join the streams."""
    writers = [threading.Thread(target=write_stream, args=(n,)) for n in range(clients)]
    for t in writers:
        t.start()
    deadline = time.monotonic() + within
    while len(acked) < enough and time.monotonic() < deadline:
        time.sleep(0.02)
    server.kill()
    stop.set()
    for t in writers:
        t.join(10)
    assert len(acked) >= enough, "the write stream never got going"


@pytest.mark.slow
def test_sigkill_during_writes_keeps_every_acknowledged_write(tmp_path):
    store = f"sqlite:///{tmp_path}/durable.db"
    server = ServerProcess(store, log_path=tmp_path / "server.log").start()
    acked: list[str] = []
    stop = threading.Event()
    headers = {"X-AMP-Agent-ID": "writer"}

    def write_stream(n: int) -> None:
        with httpx.Client(base_url=server.base_url, headers=headers, timeout=5, verify=TLS) as http:
            i = 0
            while not stop.is_set() and i < 5000:
                body = {"content": {"text": f"writer {n} fact {i}"}, "identity": {"owner_id": "user_d"}}
                try:
                    r = http.post("/memories", json=body)
                except httpx.HTTPError:
                    return  # the server died mid-request: that write was never acknowledged
                if r.status_code == 201:
                    acked.append(r.json()["id"])
                i += 1

    kill_mid_stream(server, write_stream, clients=4, acked=acked, enough=150, within=20, stop=stop)

    with AppServer(store) as restarted, httpx.Client(base_url=restarted.base_url, headers=headers, timeout=10, verify=TLS) as http:
        missing = [cid for cid in acked if http.get(f"/memories/{cid}").status_code != 200]
        listed = http.get("/memories", params={"owner_id": "user_d", "limit": 1}).json()["total"]
    assert missing == []
    assert listed >= len(acked)


@pytest.mark.slow
def test_sigkill_during_grouped_writes_keeps_every_acknowledged_write(tmp_path):
    """Eight clients at once, single cells and small batches into sessions: the server commits
    concurrent creates together (group commit, ampkit.store.grouped_writes) and answers each only after
    its group's commit, so a SIGKILL mid-stream still loses none it acknowledged, batch or not."""
    store = f"sqlite:///{tmp_path}/grouped.db"
    server = ServerProcess(store, log_path=tmp_path / "server.log").start()
    acked: dict[str, str] = {}
    lock = threading.Lock()
    stop = threading.Event()
    headers = {"X-AMP-Agent-ID": "writer"}

    def write_stream(n: int) -> None:
        with httpx.Client(base_url=server.base_url, headers=headers, timeout=5, verify=TLS) as http:
            i = 0
            while not stop.is_set() and i < 5000:
                cells = [{"content": {"text": f"grouped writer {n} fact {i} part {k}"},
                          "identity": {"owner_id": "user_g", "session_id": f"s{n}-{i // 10}"}}
                         for k in range(1 + (i % 3 == 0) * 4)]
                try:
                    if len(cells) == 1:
                        r = http.post("/memories", json=cells[0])
                        done = [r.json()] if r.status_code == 201 else []
                    else:
                        r = http.post("/memories/batch", json={"cells": cells})
                        done = r.json()["results"] if r.status_code == 201 else []
                except (httpx.HTTPError, ValueError):
                    return  # the server died mid-request: that write was never acknowledged
                with lock:
                    acked.update({c["id"]: c["content"]["text"] for c in done})
                i += 1

    kill_mid_stream(server, write_stream, clients=8, acked=acked, enough=300, within=30, stop=stop)

    with AppServer(store) as restarted, httpx.Client(base_url=restarted.base_url, headers=headers, timeout=10, verify=TLS) as http:
        found = {c["id"]: c["content"]["text"] for c in http.get("/export", params={"owner_id": "user_g"}).json()["cells"]}
    assert [cid for cid, text in acked.items() if found.get(cid) != text] == []


def test_checkpoints_run_in_the_background_after_commits(tmp_path):
    """A commit is durable once it is in the WAL; copying the WAL back into the database file
    (the checkpoint, with its fsyncs) runs on a background thread after commits, not inside
    one. Once it has run, the database file alone holds every committed cell."""
    import shutil
    import sqlite3

    from ampkit.models import CellCreate
    from ampkit.service import MemoryService
    from ampkit.store.sqlite import SQLiteStore

    store = SQLiteStore(str(tmp_path / "ck.db"), checkpoint_interval_s=0.0)
    store.open()
    try:
        service = MemoryService(store=store)
        service.create_many("writer", [CellCreate.model_validate(
            {"content": {"text": f"fact number {i}"}, "identity": {"owner_id": "u"}}) for i in range(20)])
        service.create("writer", CellCreate.model_validate({"content": {"text": "the last one"}, "identity": {"owner_id": "u"}}))
        assert store.wait_for_checkpoint(timeout=60)
        assert store.checkpoints >= 1
        shutil.copyfile(tmp_path / "ck.db", tmp_path / "main-file-only.db")  # without the -wal file
    finally:
        store.close()
    conn = sqlite3.connect(tmp_path / "main-file-only.db")
    try:
        assert conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0] == 21
    finally:
        conn.close()


def test_checkpoints_catch_up_once_a_reader_lets_go(tmp_path):
    """A reader that began before a commit holds that commit's frames back from a PASSIVE
    checkpoint. The thread tries again until they are copied, so the database file catches
    up once the reader ends, with no further commit to ask for it."""
    import shutil
    import sqlite3

    from ampkit.models import CellCreate
    from ampkit.service import MemoryService
    from ampkit.store.sqlite import SQLiteStore

    def create(service, text):
        service.create("writer", CellCreate.model_validate({"content": {"text": text}, "identity": {"owner_id": "u"}}))

    def cells_in_main_file_only() -> int:
        shutil.copyfile(tmp_path / "ck.db", tmp_path / "main-file-only.db")  # without the -wal file
        conn = sqlite3.connect(tmp_path / "main-file-only.db")
        try:
            return conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
        finally:
            conn.close()

    store = SQLiteStore(str(tmp_path / "ck.db"), checkpoint_interval_s=0.0)
    store.open()
    reader = sqlite3.connect(tmp_path / "ck.db", isolation_level=None)
    try:
        service = MemoryService(store=store)
        create(service, "the first fact")
        store.index_pending_windows()
        assert store.wait_for_checkpoint(timeout=60)
        reader.execute("BEGIN")
        assert reader.execute("SELECT COUNT(*) FROM cells").fetchone()[0] == 1  # its snapshot starts here
        create(service, "the second fact")
        assert not store.wait_for_checkpoint(timeout=0.3)  # held back, and still trying
        reader.execute("COMMIT")
        assert store.wait_for_checkpoint(timeout=60)
        assert cells_in_main_file_only() == 2
    finally:
        reader.close()
        store.close()
