"""The embedding queue: with a slow embedder, a write stores the cell without its vector and
the store queues it; a worker embeds the queue in batches. The queue is a table in the store
(it survives a restart, on a real SQLite file and on PostgreSQL); a search finds queued cells
by keyword and says so in `explain`; GET /health shows the queue's depth as one count.

The embedder here is a fake (a hashed bag of words) whose `embed` can be held at a gate, so a
test decides when the worker's batch completes."""

from __future__ import annotations

import threading
import zlib

import httpx
import numpy as np
import pytest

from ampkit.embed_queue import EmbeddingWorker
from ampkit.models import CellCreate, CellPatch, SearchRequest
from ampkit.retrieval import Retriever
from ampkit.service import MemoryService
from ampkit.store import store_from_url
from ampkit.store.base import CellFilter
from support import TLS


class GatedEmbedder:
    """Bag of words hashed into 32 dimensions; `gate` cleared = `embed` waits for it."""

    name = "fake-bow-32"
    dim = 32
    background = True

    def __init__(self):
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()  # set when a call has started (and may wait at the gate)
        self.batches: list[list[str]] = []

    def vector(self, text: str) -> np.ndarray:
        out = np.zeros(self.dim, dtype=np.float32)
        for word in text.lower().split():
            out[zlib.crc32(word.encode()) % self.dim] += 1.0
        return out / max(float(np.linalg.norm(out)), 1e-12)

    def embed(self, texts):
        self.waiting.set()
        assert self.gate.wait(30), "the test never opened the gate"
        self.batches.append(list(texts))
        return np.stack([self.vector(t) for t in texts])

    def embed_query(self, texts):  # a search never waits at the gate
        return np.stack([self.vector(t) for t in texts])


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/queue.db"
    try:
        return request.getfixturevalue("pg_url")
    except pytest.FixtureLookupError:
        pytest.skip("PostgreSQL fixture not available")


def queued_service(url: str, embedder: GatedEmbedder) -> MemoryService:
    store = store_from_url(url)
    store.embed_queue = True
    store.open()
    return MemoryService(store=store, retriever=Retriever(embedder=embedder, background=True))


def new(text: str, owner: str = "kim") -> CellCreate:
    return CellCreate(content={"text": text}, identity={"owner_id": owner}, dedup="off")


def test_written_cells_wait_in_the_queue_and_survive_a_restart(store_url):
    embedder = GatedEmbedder()
    service = queued_service(store_url, embedder)
    cells = service.create_many("kim", [new("the cat sleeps on the sofa"), new("we fly to Oslo in May"),
                                        new("tea with oat milk")])
    assert embedder.batches == []  # the write did not embed
    assert service.store.embedding_queue_depth() == 3
    assert service.store.vector_models([c.id for c in cells]) == {}
    service.store.close()

    restarted = queued_service(store_url, embedder)  # a new process on the same store
    try:
        assert restarted.store.embedding_queue_depth() == 3
        assert [cid for cid, _ in restarted.store.queued_embeddings(10)] == [c.id for c in cells]  # oldest first
        assert restarted.embed_queued(batch_size=2) == 2
        assert restarted.store.embedding_queue_depth() == 1
        assert restarted.drain_embeddings(batch_size=2) == 1
        assert embedder.batches == [[c.content.text for c in cells[:2]], [cells[2].content.text]]
        assert restarted.store.embedding_queue_depth() == 0
        assert restarted.store.vector_models([c.id for c in cells]) == {c.id: embedder.name for c in cells}
        hits = restarted.store.vector_candidates(embedder.vector("oslo in may"), embedder.name,
                                                 CellFilter(reader="kim", owner_id="kim"), 1)
        assert hits[0].cell_id == cells[1].id
    finally:
        restarted.store.close()


def test_a_changed_text_is_embedded_as_changed_and_a_purged_cell_leaves_the_queue(store_url):
    embedder = GatedEmbedder()
    service = queued_service(store_url, embedder)
    try:
        kept, gone = service.create_many("kim", [new("first words"), new("soon deleted")])
        service.drain_embeddings()
        service.update("kim", kept.id, CellPatch(content={"text": "second words entirely"}))
        assert [cid for cid, _ in service.store.queued_embeddings(10)] == [kept.id]  # a new text queues it again

        # The text changes again while the worker embeds the previous one: the cell stays
        # queued, and the next batch embeds the newest text.
        embedder.gate.clear()
        embedder.waiting.clear()
        worker = threading.Thread(target=service.embed_queued)
        worker.start()
        assert embedder.waiting.wait(30)
        service.update("kim", kept.id, CellPatch(content={"text": "third version"}))
        embedder.gate.set()
        worker.join(30)
        assert embedder.batches[-1] == ["second words entirely"]
        assert [cid for cid, _ in service.store.queued_embeddings(10)] == [kept.id]
        service.drain_embeddings()
        assert embedder.batches[-1] == ["third version"]
        assert service.store.embedding_queue_depth() == 0
        hits = service.store.vector_candidates(embedder.vector("third version"), embedder.name,
                                               CellFilter(reader="kim", owner_id="kim"), 1)
        assert hits[0].cell_id == kept.id and hits[0].score > 0.99

        service.update("kim", gone.id, CellPatch(content={"text": "changed, then erased"}))
        assert service.store.embedding_queue_depth() == 1
        with service.store.write() as tx:
            tx.purge(gone.id)
        assert service.store.embedding_queue_depth() == 0
    finally:
        service.store.close()


def test_search_uses_the_keyword_leg_for_queued_cells_and_says_so(store_url):
    embedder = GatedEmbedder()
    service = queued_service(store_url, embedder)
    try:
        embedded = service.create("kim", new("the garden shed needs paint"))
        service.drain_embeddings()
        # Written by another agent: kim's search leaves it to the worker (it embeds only its
        # caller's own recent writes, below).
        waiting = service.create("lee", new("paint the fence green"))
        request = SearchRequest(query="paint", owner_id="kim", explain=True)
        hits = {h.id: h.explain for h in service.search("kim", request).results}
        assert hits[waiting.id]["dense_pending"] == 1.0 and "keyword" in hits[waiting.id]
        assert "dense" not in hits[waiting.id]
        assert "dense_pending" not in hits[embedded.id] and "dense" in hits[embedded.id]

        service.drain_embeddings()
        hits = {h.id: h.explain for h in service.search("kim", request).results}
        assert "dense_pending" not in hits[waiting.id] and "dense" in hits[waiting.id]
    finally:
        service.store.close()


class MeaningEmbedder(GatedEmbedder):
    """The bag of words over meanings: synonyms share a dimension, so "hound" finds "puppy"
    by meaning alone, with no word in common."""

    name = "fake-meaning-32"
    SAME = {"puppy": "dog", "hound": "dog", "pooch": "dog", "slippers": "shoes", "sneakers": "shoes"}

    def vector(self, text: str) -> np.ndarray:
        return super().vector(" ".join(self.SAME.get(w, w) for w in text.lower().split()))


def test_the_writer_finds_its_write_by_meaning_right_after_it(store_url):
    """Issue 43, read-your-writes: no worker runs, so only the search can embed; it embeds
    its caller's own queued writes and no one else's."""
    embedder = MeaningEmbedder()
    service = queued_service(store_url, embedder)
    try:
        service.create("kim", new("we bought bread and milk"))
        service.drain_embeddings()
        mine = service.create("kim", new("my puppy chews slippers"))
        theirs = service.create("lee", CellCreate(content={"text": "a pooch ate sneakers"}, identity={"owner_id": "lee"},
                                                  access_policy={"public": True}, dedup="off"))
        assert {cid for cid, _ in service.store.queued_embeddings(10)} == {mine.id, theirs.id}

        hits = {h.id: h for h in service.search("kim", SearchRequest(query="hound", explain=True)).results}
        assert "dense" in hits[mine.id].explain and "dense_pending" not in hits[mine.id].explain
        assert "keyword" not in hits[mine.id].explain  # found by meaning alone
        assert theirs.id not in hits  # another writer's: found by meaning once the worker has been by
        assert [cid for cid, _ in service.store.queued_embeddings(10)] == [theirs.id]
        assert all(batch == ["my puppy chews slippers"] for batch in embedder.batches[1:])
    finally:
        service.store.close()


def test_a_search_embeds_only_recent_writes_and_not_when_switched_off(store_url, monkeypatch):
    embedder = MeaningEmbedder()
    service = queued_service(store_url, embedder)
    try:
        cell = service.create("kim", new("my puppy chews slippers"))
        hound = SearchRequest(query="hound", owner_id="kim")
        service.search_embeds_pending = 0
        assert service.search("kim", hound).results == []  # not found by meaning: the vector is queued
        service.search_embeds_pending = 16
        monkeypatch.setattr("ampkit.service_reads.RECENT_WRITES_SECONDS", -3600.0)  # every write is older than asked
        assert service.search("kim", hound).results == [] and embedder.batches == []
        monkeypatch.undo()
        assert [h.id for h in service.search("kim", hound).results] == [cell.id]
    finally:
        service.store.close()


def test_a_synchronous_retriever_queues_nothing(tmp_path):
    store = store_from_url(f"sqlite:///{tmp_path}/sync.db")
    store.open()
    try:
        service = MemoryService(store=store, retriever=Retriever(embedder=GatedEmbedder()))
        cell = service.create("kim", new("embedded in the write"))
        assert store.embedding_queue_depth() == 0
        assert store.vector_models([cell.id]) == {cell.id: GatedEmbedder.name}
    finally:
        store.close()


def test_the_worker_queues_cells_of_another_model_on_start(tmp_path):
    """After a model change, cells embedded by the old model (or by none) are queued again."""
    url = f"sqlite:///{tmp_path}/switch.db"
    store = store_from_url(url)
    store.open()
    old = MemoryService(store=store, retriever=Retriever(embedder=None))
    cells = old.create_many("kim", [new("written before any model"), new("also keyword only")])
    store.close()

    embedder = GatedEmbedder()
    service = queued_service(url, embedder)
    try:
        assert service.store.embedding_queue_depth() == 0
        assert EmbeddingWorker(service).backfill() == 2  # what the worker does first when it starts
        assert EmbeddingWorker(service).backfill() == 0  # queued once
        service.drain_embeddings()
        assert service.store.vector_models([c.id for c in cells]) == {c.id: embedder.name for c in cells}
    finally:
        service.store.close()


def test_health_shows_the_queue_as_one_count_the_same_for_every_caller(tmp_path):
    """The depth is visible in GET /health while the worker is held, and drains when it is
    not. It is a count over all owners: every caller, whatever it may read, gets the same
    bytes, and nothing in them names a cell or an owner."""
    from support import AppServer

    embedder = GatedEmbedder()
    server = AppServer(f"sqlite:///{tmp_path}/health.db")
    server.service = queued_service(server.store_url, embedder)
    server.service.store.close()  # the app opens it
    embedder.gate.clear()
    with server:
        with httpx.Client(base_url=server.base_url, timeout=30, verify=TLS) as http:
            # written by another agent into kim's memory: kim's search leaves them queued (it
            # embeds only its own writes), so it ranks them by keyword while the worker is held
            created = http.post("/memories/batch", headers={"X-AMP-Agent-ID": "bot"}, json={"cells": [
                {"content": {"text": f"private note {i}"}, "identity": {"owner_id": "kim"}} for i in range(3)]})
            assert created.status_code == 201, created.text
            bodies = [http.get("/health", headers={"X-AMP-Agent-ID": agent}).json()["embedding"] for agent in ("kim", "lee")]
            bodies.append(http.get("/health").json()["embedding"])
            assert bodies[0] == bodies[1] == bodies[2] == {"model": embedder.name, "multilingual_model": None, "background": True, "queued": 3}
            search = http.post("/memories/search", headers={"X-AMP-Agent-ID": "kim"},
                               json={"query": "private note", "explain": True}).json()
            assert {h["explain"].get("dense_pending") for h in search["results"]} == {1.0}

            embedder.gate.set()
            server.service.drain_embeddings()  # alongside the server's worker: the queue ends empty
            assert http.get("/health").json()["embedding"]["queued"] == 0
            search = http.post("/memories/search", headers={"X-AMP-Agent-ID": "kim"},
                               json={"query": "private note", "explain": True}).json()
            assert all("dense_pending" not in h["explain"] and "dense" in h["explain"] for h in search["results"])


class ScriptRouted(GatedEmbedder):
    """Like the default embedder: Latin text inline (this fake), CJK text by `cjk_embedder`
    (another fake, named `cjk_model`) from the queue."""

    cjk_model = "fake-cjk-32"  # Latin text keeps GatedEmbedder's name: the old default's vectors stay current

    def __init__(self):
        super().__init__()
        self.cjk_embedder = GatedEmbedder()
        self.cjk_embedder.name = self.cjk_model


def test_script_routing_queues_only_cjk_cells_and_backfills_only_them(store_url):
    """With the script-routed default, an English cell is embedded in the write and never
    queued; a Korean one is. A store written before (every cell with the Latin model's
    vector, as the old default did) gets only its CJK cells queued when the worker starts."""
    before = store_from_url(store_url)
    before.open()
    old = MemoryService(store=before, retriever=Retriever(embedder=GatedEmbedder()))  # one model for every text
    # (Latin text beyond ASCII is matched against the CJK class, ASCII alone is not: neither is CJK.)
    old_cells = old.create_many("kim", [new("tea with oat milk"), new("우리 집 강아지는 세 살이에요"), new("東京で寿司"),
                                        new("café crème à Zürich")])
    before.close()

    embedder = ScriptRouted()
    service = queued_service(store_url, embedder)
    try:
        assert service.store.embedding_queue_depth() == 0
        assert EmbeddingWorker(service).backfill() == 2  # the Korean and the Japanese cell, not the English one
        english, korean = service.create_many("kim", [new("we fly to Oslo in May"), new("내일 부산으로 출장을 가요")])
        assert service.store.embedding_queue_depth() == 3
        assert service.store.vector_models([english.id]) == {english.id: embedder.name}
        assert service.drain_embeddings() == 3
        ids = [c.id for c in [*old_cells, english, korean]]
        assert service.store.vector_models(ids) == dict(zip(ids, [
            embedder.name, "fake-cjk-32", "fake-cjk-32", embedder.name, embedder.name, "fake-cjk-32"]))
        assert [len(b) for b in embedder.cjk_embedder.batches] == [3]  # one batch, only CJK texts
        assert EmbeddingWorker(service).backfill() == 0
    finally:
        service.store.close()


def test_the_stale_scan_queues_every_stale_cell_across_its_batches(store_url):
    """The start-up scan walks the store in batches (each bounded by its last id or rowid):
    with batches of 2, five cells without a vector and two with the wanted model's give five
    queued, once, whatever batch a cell falls in."""
    store = store_from_url(store_url)
    store.open()
    try:
        MemoryService(store=store, retriever=Retriever(embedder=None)).create_many(
            "kim", [new(f"keyword only note {i}") for i in range(5)])
        embedder = GatedEmbedder()
        MemoryService(store=store, retriever=Retriever(embedder=embedder)).create_many(
            "kim", [new("tea with oat milk"), new("we fly to Oslo in May")])
        assert store.queue_stale_embeddings(embedder.name, batch_size=2) == 5
        assert store.embedding_queue_depth() == 5
        assert store.queue_stale_embeddings(embedder.name, batch_size=2) == 0
    finally:
        store.close()


def test_the_stale_scan_takes_the_write_lock_only_to_queue(tmp_path):
    """A start's backfill finds stale cells by reads and writes only when a batch has some:
    holding the write lock batch after batch (~10 s at a million cells) kept other writers,
    and a search indexing new keyword windows, waiting until their busy timeout."""
    store = store_from_url(f"sqlite:///{tmp_path}/stale.db")
    store.open()
    try:
        service = MemoryService(store=store)
        for i in range(30):
            service.create("ada", CellCreate(content={"text": f"note {i}"}, identity={"owner_id": "ada"}))
        assert store.queue_stale_embeddings("m", batch_size=7) == 30  # no vector of "m" yet
        with store.write() as tx:
            tx.conn.execute("UPDATE cells SET embed_model = 'm'")
            tx.conn.execute("DELETE FROM embed_queue")
        statements: list[str] = []
        store._writer.set_trace_callback(statements.append)
        try:
            assert store.queue_stale_embeddings("m", batch_size=7) == 0
        finally:
            store._writer.set_trace_callback(None)
        assert not [s for s in statements if s.startswith("BEGIN")], statements
    finally:
        store.close()


def test_of_processes_sharing_a_sqlite_file_one_embeds_the_queue_and_another_takes_over(tmp_path, monkeypatch):
    """Two stores on one file stand for two processes (each its own lock file descriptor, as
    `ampkit serve --workers 2` has): the first worker to ask holds the embedding lease and
    embeds everything; the other's embedder is never called, until the holder closes."""
    import ampkit.embed_queue as embed_queue

    monkeypatch.setattr(embed_queue, "LEASE_RETRY_SECONDS", 0.05)
    url = f"sqlite:///{tmp_path}/shared.db"
    first_embedder, second_embedder = GatedEmbedder(), GatedEmbedder()
    first, second = queued_service(url, first_embedder), queued_service(url, second_embedder)
    assert first.store.holds_embedding_lease() and not second.store.holds_embedding_lease()
    workers = [EmbeddingWorker(first, idle_seconds=0.02), EmbeddingWorker(second, idle_seconds=0.02)]
    try:
        first_embedder.gate.clear()  # the holder's first batch waits at the gate...
        for worker in workers:
            worker.start()
        second.create_many("kim", [new(f"note {i} about tea and maps") for i in range(20)])
        assert first_embedder.waiting.wait(10)
        # ...while the other worker looks at the queue every 0.02 s: it must not take the same cells
        assert not second_embedder.waiting.wait(0.3)
        first_embedder.gate.set()
        for _ in range(500):
            if first.store.embedding_queue_depth() == 0:
                break
            threading.Event().wait(0.01)
        assert first.store.embedding_queue_depth() == 0
        assert sum(len(b) for b in first_embedder.batches) == 20 and second_embedder.batches == []

        workers[0].stop()
        first.store.close()  # the holder is gone: its lease with it
        second.create_many("kim", [new(f"later note {i}") for i in range(5)])
        for _ in range(500):
            if second.store.embedding_queue_depth() == 0:
                break
            threading.Event().wait(0.01)
        assert second.store.embedding_queue_depth() == 0
        assert sum(len(b) for b in second_embedder.batches) == 5
    finally:
        for worker in workers:
            worker.stop()
        second.store.close()
