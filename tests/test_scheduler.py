"""The server runs the lifecycle on its own interval, without the admin endpoint."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from support import TLS


def test_server_runs_lifecycle_on_its_interval(server_factory):
    srv = server_factory(args=["--lifecycle-interval", "0.3"])
    headers = {"X-AMP-Agent-ID": "sched"}
    with httpx.Client(base_url=srv.base_url, headers=headers, timeout=5, verify=TLS) as http:
        spec = http.get("/spec").json()["capabilities"]["lifecycle_scheduler"]
        assert spec["interval_seconds"] == 0.3
        body = {"content": {"text": "faint memory"}, "identity": {"owner_id": "u"}, "scoring": {"importance": 0.1}}
        cell_id = http.post("/memories", json=body).json()["id"]
        deadline = time.monotonic() + 10
        status = "active"
        while status == "active" and time.monotonic() < deadline:
            time.sleep(0.1)
            page = http.get("/memories", params={"owner_id": "u", "status": "stale"}).json()
            status = "stale" if any(c["id"] == cell_id for c in page["results"]) else "active"
        assert status == "stale"
        history = http.get(f"/memories/{cell_id}/history").json()["results"]
        assert any(h["actor"] == "system:lifecycle" and h["changes"]["lifecycle.status"] == ["active", "stale"] for h in history)


# ---------------------------------------------------------------- the scheduler of background loops


def test_a_loop_runs_when_woken_reports_idle_and_stops():
    from ampkit.scheduler import Scheduler

    scheduler = Scheduler()
    runs: list[int] = []

    def body(loop):
        while True:
            loop.wait()
            if loop.stopping:
                return
            loop.take()
            runs.append(len(runs))
            loop.done(again=len(runs) < 3)  # work left over twice: it wakes itself

    handle = scheduler.loop("counter", body)
    assert scheduler.loop("counter", body) is handle  # a running loop is not started twice
    handle.wake()
    assert handle.idle(5) and runs == [0, 1, 2]
    assert scheduler.states() == [{"name": "counter", "state": "idle"}]
    scheduler.stop("counter", timeout=5)
    assert not handle.running and scheduler.states() == [{"name": "counter", "state": "stopped"}]


def test_a_task_runs_once_and_a_failure_shows_by_name():
    from ampkit.scheduler import Scheduler

    scheduler = Scheduler()
    done: list[str] = []
    scheduler.run("warm.ok", done.append, "ok")

    def fail() -> None:
        raise RuntimeError("boom")

    scheduler.run("warm.bad", fail)
    assert scheduler.join("warm.", timeout=5)
    assert done == ["ok"]
    assert scheduler.states() == [{"name": "warm.bad", "state": "failed"}, {"name": "warm.ok", "state": "done"}]


def test_a_sqlite_store_runs_its_loops_on_the_scheduler_it_is_given(tmp_path):
    from ampkit.scheduler import Scheduler
    from ampkit.store.sqlite import SQLiteStore

    scheduler = Scheduler()
    store = SQLiteStore(str(tmp_path / "s.db"), scheduler=scheduler)
    before = set(threading.enumerate())  # other stores of this test process (session servers) keep theirs
    store.open()
    try:
        names = {item["name"]: item["state"] for item in scheduler.states()}
        assert names["sqlite.checkpoint"] in ("idle", "busy") and names["sqlite.windows"] in ("idle", "busy")
        store.wait_for_vector_index(30)
        assert scheduler.states() and not scheduler.running("vectors.")
    finally:
        store.close()
    assert {item["name"]: item["state"] for item in scheduler.states()}["sqlite.windows"] == "stopped"
    assert not [t for t in threading.enumerate() if t.name.startswith("ampkit-sqlite.") and t not in before]


def test_health_lists_the_background_loops(server_factory):
    srv = server_factory()
    with httpx.Client(base_url=srv.base_url, timeout=5, verify=TLS) as http:
        background = {item["name"]: item["state"] for item in http.get("/health").json()["background"]}
    assert background["sqlite.checkpoint"] in ("idle", "busy")
    assert background["sqlite.windows"] in ("idle", "busy")
    assert background["vectors.warmup"] in ("running", "done")


def test_the_embedding_worker_runs_as_a_loop_of_the_stores_scheduler(tmp_path):
    import numpy as np

    from ampkit.embed_queue import EmbeddingWorker
    from ampkit.models import CellCreate
    from ampkit.retrieval import Retriever
    from ampkit.service import MemoryService
    from ampkit.store.sqlite import SQLiteStore

    class Embedder:
        name, dim = "ones4", 4

        def embed(self, texts):
            return np.ones((len(texts), 4), dtype=np.float32) / 2

        embed_query = embed

    store = SQLiteStore(str(tmp_path / "e.db"))
    store.embed_queue = True
    store.open()
    try:
        service = MemoryService(store=store, retriever=Retriever(embedder=Embedder(), background=True))
        service.create("kim", CellCreate(content={"text": "queued"}, identity={"owner_id": "kim"}))
        worker = EmbeddingWorker(service, idle_seconds=0.05)
        worker.start()
        assert {item["name"]: item["state"] for item in store.scheduler.states()}["embedding"] in ("idle", "busy")
        deadline = time.monotonic() + 30
        while store.embedding_queue_depth() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.embedding_queue_depth() == 0  # embedded by the loop
        worker.stop()
        assert {item["name"]: item["state"] for item in store.scheduler.states()}["embedding"] == "stopped"
    finally:
        store.close()


@pytest.mark.postgres
def test_a_postgres_store_runs_its_keyword_loop_on_the_scheduler_it_is_given(pg_url):
    from ampkit.scheduler import Scheduler
    from ampkit.store import store_from_url

    scheduler = Scheduler()
    store = store_from_url(pg_url, scheduler=scheduler)
    store.open()
    try:
        assert scheduler.states() == []  # started when a wide search first needs it
        store.wide_keywords._request_warmup()
        assert {item["name"]: item["state"] for item in scheduler.states()}["pg.keywords"] in ("idle", "busy")
        assert store.vector_index_state()["keyword_warmup"] in ("warming", "none")  # /health asks the loop
    finally:
        store.close()
    assert scheduler.states() == [{"name": "pg.keywords", "state": "stopped"}]
