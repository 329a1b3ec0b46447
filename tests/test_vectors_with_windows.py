"""A SQLite store embeds a new cell's text with its keyword window, after the commit, in one
call per pass (`SQLiteStore.embed_new`, set by the composition root): a single create neither
waits for its embedding nor pays a one-text call. Every read that ranks by vector sees the
vector of every write acknowledged before it, the vectors are those the write would have
stored, and a crash before the pass loses none of them."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from ampkit.bootstrap import build_service, load_settings
from ampkit.models import CellCreate, CellPatch
from support import TLS, AppServer

TEXTS = [
    "Lena moved to Oslo in March and took her piano with her",
    "The quarterly budget review is on Thursday at ten",
    "Ravi prefers green tea without sugar in the afternoon",
    "Deploys go out on Tuesdays after the runbook check",
    "Mina adopted a rescue greyhound called Pepper",
]


def rows(path: str) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT text, embed_model, embed_dim, embedding FROM cells ORDER BY text").fetchall()
    finally:
        conn.close()


def queued_texts(path: str) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return sorted(t for (t,) in conn.execute("SELECT c.text FROM embed_queue q JOIN cells c ON c.id = q.cell_id"))
    finally:
        conn.close()


def test_a_search_right_after_a_write_finds_it_by_its_vector_over_http(tmp_path):
    """Each write is searched for at once, well inside the background pass's delay: its
    vector is there for the dense leg (the read runs the pass first)."""
    headers = {"X-AMP-Agent-ID": "ada"}
    with AppServer(f"sqlite:///{tmp_path}/rw.db") as server, \
            httpx.Client(base_url=server.base_url, headers=headers, timeout=10, verify=TLS) as http:
        assert server.service is None or server.service.store.embed_new is not None
        for i, text in enumerate(TEXTS * 4):
            body = {"content": {"text": f"{text} ({i})"}, "identity": {"owner_id": "ada", "session_id": f"s{i // 5}"}}
            created = http.post("/memories", json=body)
            assert created.status_code == 201, created.text
            found = http.post("/memories/search", json={"query": text, "owner_id": "ada", "limit": 10, "explain": True}).json()
            mine = [h for h in found["results"] if h["id"] == created.json()["id"]]
            assert mine and "dense_rank" in mine[0]["explain"], (i, found)


def test_vectors_stored_with_the_windows_equal_those_embedded_in_the_write(tmp_path, monkeypatch):
    """Two stores take the same writes: one embeds in the write (as PostgreSQL does), the
    other leaves new rows without a vector until its windows pass. Single creates, a batch
    past the deferral limit (embedded before its COMMIT), a text changed before the pass, a
    near-duplicate check (which embeds in the write), Korean text (queued for the background
    model either way): the same vectors to the bit, and the same queue."""
    import ampkit.store.sqlite as sqlite_store

    monkeypatch.setattr(sqlite_store, "PENDING_WINDOWS_DELAY_S", 600.0)  # no background pass: only the explicit one
    services = []
    for name in ("inline", "later"):
        service = build_service(load_settings(env=False, store=f"sqlite:///{tmp_path}/{name}.db", embedder="default"))
        if name == "inline":
            service.store.embed_new = None
        service.store.open()
        services.append(service)
    inline, later = services
    try:
        for service in services:
            # (first: its near-duplicate search runs the pass, as any read by vector does)
            service.create("ada", CellCreate(content={"text": "Ravi likes green tea without any sugar"}, type="semantic",
                                             identity={"owner_id": "ada"}, dedup="skip"))
            for i, text in enumerate(TEXTS):
                service.create("ada", CellCreate(content={"text": text}, identity={"owner_id": "ada", "session_id": "s1"}))
            service.create("ada", CellCreate(content={"text": "우리 고양이 이름은 나비예요"}, identity={"owner_id": "ada"}))
            cell = service.create("ada", CellCreate(content={"text": "a draft that changes"}, identity={"owner_id": "ada"}))
            service.update("ada", cell.id, CellPatch(content={"text": "the draft as it was sent"}))
            service.create_many("bob", [CellCreate(content={"text": f"{TEXTS[k % 5]} - batch {k}"},
                                                   identity={"owner_id": "bob", "session_id": f"b{k // 10}"}) for k in range(100)])
        # Before the pass: the single creates of `later` have no vector yet (the near-duplicate
        # check's and the update's were embedded in the write; the batch before its COMMIT).
        without = {text for text, model, _, _ in rows(later.store.path) if model is None}
        assert without == {*TEXTS, "우리 고양이 이름은 나비예요"}
        assert queued_texts(later.store.path) == []
        # A restarted server's scan for missing vectors may queue them before the pass runs:
        # the pass takes those it embeds off the queue.
        retriever = later.retriever
        assert later.store.queue_stale_embeddings(retriever.embedder.name, cjk_model=retriever.cjk_model) == len(without)
        assert later.store.index_pending_windows() > 0
        assert rows(later.store.path) == rows(inline.store.path)
        assert queued_texts(later.store.path) == queued_texts(inline.store.path) == ["우리 고양이 이름은 나비예요"]
        # Each vector change has its own vec_seq, below the stored counter (every process's
        # in-memory index catches up by it)
        conn = sqlite3.connect(later.store.path)
        try:
            seqs = [s for (s,) in conn.execute("SELECT vec_seq FROM cells")]
            counter = conn.execute("SELECT value FROM store_counters WHERE name = 'vec_seq'").fetchone()[0]
        finally:
            conn.close()
        assert len(set(seqs)) == len(seqs) and max(seqs) <= counter
    finally:
        for service in services:
            service.store.close()


CRASH = textwrap.dedent("""
    import os, signal, sys
    from ampkit.bootstrap import build_service, load_settings
    from ampkit.models import CellCreate
    import ampkit.store.sqlite
    ampkit.store.sqlite.PENDING_WINDOWS_DELAY_S = 600.0  # no background pass before the kill, however slow the creates
    service = build_service(load_settings(env=False, store="sqlite:///" + sys.argv[1], embedder="default"))
    service.store.open()
    for i in range(30):
        service.create("ada", CellCreate(content={"text": f"crash note {i} about the garden"},
                                         identity={"owner_id": "ada", "session_id": "s"}))
    print("written", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # before the background pass runs
""")


@pytest.mark.slow
def test_vectors_left_pending_by_sigkill_are_stored_after_open(tmp_path):
    """A process killed right after its creates committed leaves them without vectors, in
    the file; the next open's pass embeds every one of them."""
    path = str(tmp_path / "crash.db")
    run = subprocess.run([sys.executable, "-c", CRASH, path], capture_output=True, text=True, timeout=120)
    assert "written" in run.stdout and run.returncode == -9, run.stderr
    assert len(rows(path)) == 30 and all(model is None for _, model, _, _ in rows(path))
    service = build_service(load_settings(env=False, store=f"sqlite:///{path}", embedder="default"))
    service.store.open()
    try:
        deadline = time.monotonic() + 30
        while any(model is None for _, model, _, _ in rows(path)) and time.monotonic() < deadline:
            time.sleep(0.05)  # the background pass, with no search asking
        expected = service.retriever.vectors_for([text for text, *_ in rows(path)])
        assert [(m, e) for _, m, _, e in rows(path)] == [
            (v.model, sqlite_store_bytes(v)) for v in expected]
    finally:
        service.store.close()


def sqlite_store_bytes(vector) -> bytes:
    import numpy as np

    return np.asarray(vector.vector, dtype=np.float32).ravel().astype(np.float16).tobytes()
