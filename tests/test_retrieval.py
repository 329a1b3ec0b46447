"""Retrieval: fusion, filters inside both legs, the dense leg, reindex, the vector index.

Fusion and the vector index are exercised in process on a real SQLite file with a fake
embedder (the test is about ranking, not about a model); what users see (a paraphrase found
by meaning, reindex after a model change) goes through real servers over HTTP and the
`ampkit reindex` command with the shipped default model.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
import math
from datetime import datetime, timedelta, timezone

import httpx
import numpy as np
import pytest

from ampkit.models import CellCreate, CellPatch, SearchRequest
from ampkit.retrieval import RetrievalConfig, Retriever
from ampkit.service import MemoryService
from ampkit.store.base import CellFilter, StoredVector
from ampkit.store.sqlite import SQLiteStore
from ampkit.store.sqlite_vectors import SQLiteVectorIndex
from ampkit.textindex import index_text
from support import TLS, run_cli

CONCEPTS = {"pet": {"pet", "cat", "kitten"}, "money": {"invoice", "money"}, "travel": {"travel", "trip"}}


class ConceptEmbedder:
    """Fake embedder: one dimension per concept whose words the text uses (plus a bias)."""

    name = "fake-concepts"
    dim = len(CONCEPTS) + 1

    def embed(self, texts):
        rows = []
        for text in texts:
            words = set(text.lower().split())
            row = [1.0 if words & synonyms else 0.0 for synonyms in CONCEPTS.values()] + [0.1]
            rows.append(np.array(row, dtype=np.float32) / np.linalg.norm(row))
        return np.stack(rows)


@pytest.fixture
def store(tmp_path):
    s = SQLiteStore(str(tmp_path / "retrieval.db"))
    s.open()
    yield s
    s.close()


def cell(text, owner="alice", **extra) -> CellCreate:
    return CellCreate(content={"text": text}, identity={"owner_id": owner}, **extra)


def test_fusion_ranks_a_cell_both_legs_found_above_single_leg_hits(store):
    service = MemoryService(store=store, retriever=Retriever(embedder=ConceptEmbedder()))
    both, keyword_only, dense_only = service.create_many("alice", [
        cell("walking the dog is a pet chore"),        # keywords dog, pet + concept pet
        cell("dog sitter invoice"),                    # keyword dog; concept money
        cell("the kitten sleeps all day"),             # concept pet only
    ])
    hits = service.search("alice", SearchRequest(query="dog pet", explain=True)).results
    ids = [h.id for h in hits]
    assert ids[0] == both.id
    assert set(ids) >= {keyword_only.id, dense_only.id}
    top = hits[0].explain
    assert top["keyword_rank"] == 1 and top["dense_rank"] == 1 and top["fused"] > hits[1].explain["fused"]
    # a dense-only hit says so: no keyword part in its breakdown
    dense_hit = next(h for h in hits if h.id == dense_only.id)
    assert "keyword" not in dense_hit.explain and dense_hit.explain["dense"] > 0


def test_weights_decide_which_leg_wins(store):
    # The own-text boost and the learned ranker are off: this is about the legs' weights alone.
    keyword_heavy = Retriever(embedder=ConceptEmbedder(),
                              config=RetrievalConfig(dense_weight=0.1, own_text_weight=0, relevance_models={}))
    dense_heavy = Retriever(embedder=ConceptEmbedder(),
                            config=RetrievalConfig(dense_weight=5.0, own_text_weight=0, relevance_models={}))
    service = MemoryService(store=store, retriever=keyword_heavy)
    words, meaning = service.create_many("alice", [cell("cheap flights to Rome"), cell("travel plans")])
    ask = SearchRequest(query="cheap flights travel")
    assert service.search("alice", ask).results[0].id == words.id
    service.retriever = dense_heavy
    assert service.search("alice", ask).results[0].id == meaning.id


def test_both_legs_filter_before_ranking_so_topk_is_full_and_readable(store):
    """200 better-matching cells the reader cannot read must neither leak nor crowd out."""
    service = MemoryService(store=store, retriever=Retriever(embedder=ConceptEmbedder()))
    service.create_many("mallory", [cell("pet pet pet travel secret", owner="mallory") for _ in range(200)])
    mine = service.create_many("bob", [cell(f"pet note {i}", owner="bob") for i in range(12)])
    flt = CellFilter(reader="bob")
    keyword = store.keyword_candidates("pet travel secret", flt, 10)
    qvec = ConceptEmbedder().embed(["pet travel secret"])[0]
    dense = store.vector_candidates(qvec, ConceptEmbedder.name, flt, 10)
    mine_ids = {c.id for c in mine}
    for leg in (keyword, dense):
        assert len(leg) == 10 and {c.cell_id for c in leg} <= mine_ids
    hits = service.search("bob", SearchRequest(query="pet travel secret", limit=10)).results
    assert len(hits) == 10 and {h.id for h in hits} <= mine_ids


def test_filters_inside_legs_over_http(server):
    """Same guarantee through a real server: owner, type and metadata filters, and access."""
    base = server.base_url
    other = {"X-AMP-Agent-ID": "eve"}
    me = {"X-AMP-Agent-ID": "dan"}
    with httpx.Client(timeout=30, verify=TLS) as http:
        r = http.post(f"{base}/memories/batch", headers=other, json={"cells": [
            {"content": {"text": "zebra zebra zebra zebra"}, "identity": {"owner_id": "eve"}} for _ in range(60)
        ]})
        assert r.status_code == 201
        r = http.post(f"{base}/memories/batch", headers=me, json={"cells": [
            {"type": "semantic" if i % 2 else "episodic", "content": {"text": f"zebra fact {i}", "metadata": {"n": i % 3}},
             "identity": {"owner_id": "dan"}} for i in range(12)
        ]})
        assert r.status_code == 201
        mine = {c["id"] for c in r.json()["results"]}
        hits = http.post(f"{base}/memories/search", headers=me, json={"query": "zebra", "limit": 5}).json()["results"]
        assert len(hits) == 5 and all(h["identity"]["owner_id"] == "dan" for h in hits)
        typed = http.post(f"{base}/memories/search", headers=me,
                          json={"query": "zebra", "types": ["episodic"], "metadata": {"n": 0}, "limit": 10}).json()["results"]
        assert typed and all(h["type"] == "episodic" and h["content"]["metadata"]["n"] == 0 for h in typed)
        assert len(typed) == len([i for i in range(12) if i % 2 == 0 and i % 3 == 0])
        assert {h["id"] for h in hits} <= mine


def test_dense_leg_finds_a_paraphrase_keyword_search_misses(server_factory):
    """With the shipped default model, over HTTP: no word in common, found by meaning."""
    srv = server_factory(env={"AMPKIT_EMBEDDER": "default"})
    me = {"X-AMP-Agent-ID": "ana"}
    with httpx.Client(base_url=srv.base_url, headers=me, timeout=30, verify=TLS) as http:
        r = http.post("/memories/batch", json={"cells": [
            {"content": {"text": text}, "identity": {"owner_id": "ana"}} for text in (
                "My daughter adopted a puppy last week",
                "The quarterly invoice is due on Friday",
                "We repainted the kitchen cabinets blue",
            )
        ]})
        assert r.status_code == 201
        hits = http.post("/memories/search", json={"query": "canine companion", "explain": True}).json()["results"]
        assert hits and hits[0]["content"]["text"] == "My daughter adopted a puppy last week"
        assert "keyword" not in hits[0]["explain"] and hits[0]["explain"]["dense_rank"] == 1


def test_reindex_after_a_model_change(tmp_path, server_factory):
    url = f"sqlite:///{tmp_path}/reindex.db"
    srv = server_factory(store_url=url, env={"AMPKIT_EMBEDDER": "none"})  # keyword only: no vectors stored
    me = {"X-AMP-Agent-ID": "ana"}
    texts = ["My daughter adopted a puppy last week", "The quarterly invoice is due on Friday"]
    with httpx.Client(base_url=srv.base_url, headers=me, timeout=30, verify=TLS) as http:
        assert http.post("/memories/batch", json={"cells": [
            {"content": {"text": t}, "identity": {"owner_id": "ana"}} for t in texts]}).status_code == 201
        assert http.post("/memories/search", json={"query": "canine companion"}).json()["results"] == []
    srv.stop()

    run = run_cli("reindex", "--store", url, "--embedder", "default")
    assert run.returncode == 0, run.stderr
    assert "re-embedded 2 cells" in run.stdout and "reindex" in run.stderr  # the tqdm bar
    again = run_cli("reindex", "--store", url, "--embedder", "default")
    assert "re-embedded 0 cells" in again.stdout  # already current: skipped

    srv = server_factory(store_url=url, env={"AMPKIT_EMBEDDER": "default"})
    with httpx.Client(base_url=srv.base_url, headers=me, timeout=30, verify=TLS) as http:
        hits = http.post("/memories/search", json={"query": "canine companion"}).json()["results"]
        assert hits and hits[0]["content"]["text"] == texts[0]


def _exact(store: SQLiteStore, q: np.ndarray, model: str, flt: CellFilter, k: int) -> list[str]:
    from ampkit.store.sqlite_access import filter_sql
    from ampkit.store.sqlite_vectors import decode_vector

    where, params = filter_sql(flt)
    rows = store._query(
        f"SELECT c.id, c.embedding, c.embed_dim FROM cells c WHERE {where} AND c.embed_model = ?", [*params, model]
    )
    scored = sorted(((float(decode_vector(b, dim) @ q), cid) for cid, b, dim in rows), reverse=True)
    return [cid for _, cid in scored[:k]]


def test_ann_index_stays_consistent_with_the_database(tmp_path):
    """Past the threshold the hnswlib graph answers; after updates, deletes and purges its
    results equal an exact scan of what the database holds, and another process sees it too."""
    pytest.importorskip("hnswlib")
    rng = np.random.default_rng(7)
    store = SQLiteStore(str(tmp_path / "ann.db"), ann_threshold=100)
    store.open()
    fixed = datetime(2026, 1, 1, tzinfo=timezone.utc)
    service = MemoryService(store=store, clock=lambda: fixed)
    cells = service.create_many("ann", [cell(f"vector cell {i}", owner="ann") for i in range(300)])

    def put(cell_ids):
        with store.write() as tx:
            for cid in cell_ids:
                v = rng.normal(size=16).astype(np.float32)
                tx.update(tx.get(cid), StoredVector("rand16", v / np.linalg.norm(v)))

    put([c.id for c in cells])
    flt = CellFilter(reader="ann", owner_id="ann")
    queries = [q / np.linalg.norm(q) for q in rng.normal(size=(20, 16)).astype(np.float32)]
    store.wait_for_vector_index()
    store.vector_candidates(queries[0], "rand16", flt, 10)  # crosses the threshold: builds in the background
    store.wait_for_vector_index()
    assert store.vectors.by_model["rand16"].uses_ann

    put([c.id for c in cells[:50]])  # new vectors for some cells
    with store.write() as tx:  # deleted status (filtered out) and purged rows (gone)
        for c in cells[50:70]:
            current = tx.get(c.id)
            tx.update(current.model_copy(update={"lifecycle": current.lifecycle.model_copy(update={"status": "deleted"})}))
        for c in cells[70:80]:
            tx.purge(c.id)

    for q in queries:
        got = [c.cell_id for c in store.vector_candidates(q, "rand16", flt, 10)]
        assert got == _exact(store, q, "rand16", flt, 10)

    other = SQLiteStore(store.path)  # a second process on the same file catches up on read
    other.open()
    put([c.id for c in cells[100:120]])
    for q in queries[:5]:
        assert [c.cell_id for c in other.vector_candidates(q, "rand16", flt, 10)] == _exact(store, q, "rand16", flt, 10)
    other.close()
    store.close()


def test_keyword_window_follows_updates_and_purges(store):
    """The keyword index covers each turn with its session neighbours; edits and erasure
    keep that window in step (a purged text is no longer findable through a neighbour)."""
    service = MemoryService(store=store)
    ask, answer = service.create_many("kim", [
        CellCreate(content={"text": "What is your cat called?"}, identity={"owner_id": "kim", "session_id": "s1"}),
        CellCreate(content={"text": "Her name is Mochi."}, identity={"owner_id": "kim", "session_id": "s1"}),
    ])
    found = [c.cell_id for c in store.keyword_candidates("cat name", CellFilter(reader="kim"), 10)]
    assert answer.id in found  # "cat" only appears in the neighbouring question
    service.update("kim", ask.id, CellPatch(content={"text": "Where do you live?"}))
    assert answer.id not in [c.cell_id for c in store.keyword_candidates("cat", CellFilter(reader="kim"), 10)]
    assert answer.id in [c.cell_id for c in store.keyword_candidates("live", CellFilter(reader="kim"), 10)]
    with store.write() as tx:
        tx.purge(ask.id)
    assert store.keyword_candidates("live", CellFilter(reader="kim"), 10) == []


def _windows_are_current(store) -> None:
    """Every stored keyword window equals the one the per-row definition (`_window`) gives,
    once the windows new cells left pending (SQLite, migration 12) are indexed."""
    if hasattr(store, "index_pending_windows"):
        store.index_pending_windows()
    with store.write() as tx:
        conn = tx.conn  # type: ignore[attr-defined]
        stored = dict(conn.execute("SELECT rowid, text FROM cell_context").fetchall())
        expected = {}
        for (rowid,) in conn.execute("SELECT rowid FROM cells").fetchall():
            before, own, after = tx._window(rowid)  # type: ignore[attr-defined]
            expected[rowid] = index_text("\n".join([*(t for _, t in before), own[1], *(t for _, t in after)]))
    assert stored == expected


def test_incremental_keyword_windows_match_a_rebuild_from_scratch(store):
    """The write path rewrites only the windows a transaction changes, reading the rows of a
    window class together; after each batch across sessions, single write, edit, session
    move and purge, every window equals the one the per-row definition gives."""
    import random

    service = MemoryService(store=store)
    rng = random.Random(7)
    words = "cat dog river piano lisbon coffee tea rain snow bike".split()
    ids: list[str] = []
    for round_ in range(6):
        batch = [CellCreate(content={"text": " ".join(rng.sample(words, 3)) + f" {round_}-{k}"},
                            identity={"owner_id": "kim", "session_id": f"s{rng.randrange(3)}"})
                 for k in range(rng.randrange(1, 12))]
        ids += [c.id for c in service.create_many("kim", batch)]
        _windows_are_current(store)
        ids.append(service.create("kim", CellCreate(content={"text": f"single {round_}"},
                                                    identity={"owner_id": "kim", "session_id": "s1"})).id)
        _windows_are_current(store)
        service.update("kim", rng.choice(ids), CellPatch(content={"text": f"edited {round_}"}))
        _windows_are_current(store)
        service.update("kim", rng.choice(ids), CellPatch(identity={"session_id": f"s{rng.randrange(3)}"}))
        _windows_are_current(store)
        if round_ % 2:
            gone = ids.pop(rng.randrange(len(ids)))
            with store.write() as tx:
                tx.purge(gone)
            _windows_are_current(store)


def test_entity_boost_prefers_the_cell_naming_the_query_names(store):
    from ampkit.retrieval import query_names

    assert query_names("What did Caroline's sister buy in Lisbon?") == ["caroline", "lisbon"]
    assert query_names("Caroline went where?") == []  # the first word is capitalised anyway
    service = MemoryService(store=store)
    other, named = service.create_many("alice", [
        cell("my sister bought shoes, a lovely pair of shoes"),
        cell("Caroline: my sister bought shoes"),
    ])
    hits = service.search("alice", SearchRequest(query="What shoes did Caroline's sister buy?", explain=True)).results
    assert hits[0].id == named.id and hits[0].explain["entity"] == 1.0
    assert next(h for h in hits if h.id == other.id).explain["entity"] == 0.0


def test_own_text_boost_puts_the_turn_that_says_it_above_its_window_neighbours(store):
    """The keyword window makes neighbours match equally; the turn whose own text holds the
    query's words comes first, and `explain` shows the match (0 turns the stage off)."""
    session = {"owner_id": "alice", "session_id": "s1"}
    service = MemoryService(store=store)
    said, before, after = (CellCreate(content={"text": t}, identity=session) for t in (
        "we finally went camping in the mountains", "how was your weekend?", "sounds lovely"))
    c_before, c_said, c_after = service.create_many("alice", [before, said, after])
    req = SearchRequest(query="where did they go camping?", explain=True)
    hits = service.search("alice", req).results
    assert hits[0].id == c_said.id and hits[0].explain["own_text"] == 1.0
    assert {h.id for h in hits[1:]} >= {c_before.id, c_after.id}
    assert all(h.explain["own_text"] == 0.0 for h in hits[1:])
    off = replace(service, retriever=Retriever(config=RetrievalConfig(own_text_weight=0)))
    assert "own_text" not in off.search("alice", req).results[0].explain


def test_feedback_leg_is_explained_and_never_borrows_words_of_unreadable_cells(tmp_path, monkeypatch):
    """Pseudo-relevance feedback builds a second query from the first hits. A cell the caller
    cannot read, sitting right next to those hits, must change nothing the caller gets."""
    import ampkit.service_base as service_module  # where cell ids are made

    feedback = Retriever(config=RetrievalConfig(prf_docs=3, prf_terms=4))
    next_id: list[str] = []
    monkeypatch.setattr(service_module, "new_cell_id", lambda: next_id.pop())
    answers = []
    for noisy in (False, True):
        s = SQLiteStore(str(tmp_path / f"fb-{noisy}.db"))
        s.open()
        service = MemoryService(store=s, retriever=feedback, clock=lambda: datetime(2025, 1, 1, tzinfo=timezone.utc))

        def create(n: int, owner: str, text: str) -> None:
            next_id.append(f"mem_{n:026d}")
            service.create(owner, CellCreate(content={"text": text}, identity={"owner_id": owner, "session_id": "s1"}))

        create(1, "alice", "the budget review is on friday")
        if noisy:  # bob's private cell shares alice's words and brings its own
            create(2, "bob", "budget review secret zanzibar merger")
        create(3, "alice", "friday lunch with the finance team")
        create(4, "alice", "zanzibar holiday photos")
        resp = service.search("alice", SearchRequest(query="budget review", explain=True, limit=10))
        answers.append(resp.model_dump_json())
        s.close()
    assert answers[0] == answers[1]
    assert "prf_keyword" in answers[0]  # the feedback leg ran and is explained


@pytest.fixture
def fake_openai_endpoint():
    """A tiny local OpenAI-compatible /v1/embeddings endpoint backed by ConceptEmbedder."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    calls = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append((self.path, body["model"], self.headers.get("Authorization")))
            vectors = ConceptEmbedder().embed(body["input"])
            data = [{"index": i, "embedding": v.tolist(), "object": "embedding"} for i, v in enumerate(vectors)]
            out = json.dumps({"data": data[::-1], "model": body["model"]}).encode()  # any order
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", calls
    httpd.shutdown()
    httpd.server_close()


def test_openai_compatible_embedder_through_a_real_server(server_factory, fake_openai_endpoint):
    url, calls = fake_openai_endpoint
    srv = server_factory(env={"AMPKIT_EMBEDDER": f"openai:{url}?model=fake-embed", "AMPKIT_EMBEDDER_API_KEY": "k1"},
                         process=True)  # the key is read from the server process's environment
    with httpx.Client(base_url=srv.base_url, headers={"X-AMP-Agent-ID": "ana"}, timeout=30, verify=TLS) as http:
        assert http.post("/memories/batch", json={"cells": [
            {"content": {"text": t}, "identity": {"owner_id": "ana"}} for t in ("the kitten sleeps", "invoice paid")
        ]}).status_code == 201
        hits = http.post("/memories/search", json={"query": "my cat", "explain": True}).json()["results"]
    assert hits[0]["content"]["text"] == "the kitten sleeps" and "keyword" not in hits[0]["explain"]
    assert calls[0] == ("/v1/embeddings", "fake-embed", "Bearer k1")
    assert len(calls) == 2  # one call for the whole batch, one for the query


def test_migration_2_reindexes_a_version_1_store(tmp_path):
    """A store written before migration 2 (plain FTS over cells.text, float32 vectors) keeps
    its keyword search (now windowed, CJK-aware) and its vectors after the upgrade."""
    import sqlite3

    from ampkit.store.sqlite import MIGRATIONS, cell_to_row
    from ampkit.store.sqlite_schema import split_sql as _split_sql

    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")
    for statement in _split_sql(MIGRATIONS[0][2]):
        conn.execute(statement)
    conn.execute("INSERT INTO schema_migrations VALUES (1, 'v1', '2026-01-01')")
    fixed = datetime(2026, 1, 1, tzinfo=timezone.utc)
    built = MemoryService(store=SQLiteStore(str(tmp_path / "scratch.db")), clock=lambda: fixed)._build
    texts = ["What is your cat called?", "Her name is Mochi.", "저는 서울에서 살아요"]
    for text in texts:
        row = cell_to_row(built(CellCreate(content={"text": text}, identity={"owner_id": "kim", "session_id": "s1"}), "kim", fixed))
        row.update(embed_model="old", embedding=np.ones(4, dtype=np.float32).tobytes())
        for later in ("cell_key", "window_class", "cell_path", "text_key", "readers"):  # columns a version-1 table lacks
            row.pop(later)
        conn.execute(f"INSERT INTO cells({','.join(row)}) VALUES ({','.join('?' * len(row))})", list(row.values()))
    conn.close()

    store = SQLiteStore(str(path))
    store.open()
    try:
        assert store.schema_version() >= 2
        flt = CellFilter(reader="kim", owner_id="kim")
        answer = [c.cell_id for c in store.keyword_candidates("Mochi", flt, 10)]
        assert len(answer) == 3  # every turn's window holds "Mochi" (radius 2)
        assert len(store.keyword_candidates("서울", flt, 10)) == 3
        hits = store.vector_candidates(np.ones(4, dtype=np.float32) / 2, "old", flt, 10)
        assert len(hits) == 3 and abs(hits[0].score - 2.0) < 1e-6
    finally:
        store.close()


def test_keyword_scan_of_a_few_admitted_cells_equals_the_fts_query(tmp_path):
    """An owner's keyword search scans its windows' stored term counts instead of running
    the FTS OR query: the same matches and the same scores, bit for bit."""
    stores = [SQLiteStore(str(tmp_path / f"k{i}.db"), keyword_scan_max=limit) for i, limit in enumerate((0, 5000))]
    texts = ["Lena prefers window seats when travelling to Oslo", "Bruno adopted a rescue dog in March",
             "the rescue dog hates the airport", "dark roast coffee for Lena", "Oslo in March is cold",
             "서울에서 커피를 마셨다", "nothing relevant here"]
    for s in stores:
        s.open()
        service = MemoryService(store=s)
        for i, text in enumerate(texts):
            service.create("alice" if i % 3 else "bob",
                           CellCreate(content={"text": text}, identity={"owner_id": "alice" if i % 3 else "bob",
                                                                          "session_id": f"s{i // 2}"}))
    try:
        for query in ("rescue dog", "Lena Oslo March", "coffee 서울", "the", "window-seats"):
            for flt in (CellFilter(reader="alice", owner_id="alice"), CellFilter(reader="alice"),
                        CellFilter(reader="bob", owner_id="alice")):
                fts, scan = (
                    [(s.get(c.cell_id).content.text, c.score) for c in s.keyword_candidates(query, flt, 10)]  # type: ignore[union-attr]
                    for s in stores
                )
                assert fts == scan, (query, flt)
        assert stores[1].keyword_candidates("rescue dog", CellFilter(reader="alice", owner_id="alice"), 10)
    finally:
        for s in stores:
            s.close()


def _random_unit_vectors(store: SQLiteStore, model: str, texts: list[str], seed: int = 3) -> None:
    """Cells of owner "ann" with random unit vectors of `model` ("rand<dim>"), seeded."""
    rng = np.random.default_rng(seed)
    dim = int(model.removeprefix("rand"))
    cells = MemoryService(store=store).create_many("ann", [cell(text, owner="ann") for text in texts])
    with store.write() as tx:
        for c in cells:
            v = rng.normal(size=dim).astype(np.float32)
            tx.update(tx.get(c.id), StoredVector(model, v / np.linalg.norm(v)))


def test_graph_backlog_is_scored_exactly_until_it_is_drained():
    """Vectors added beyond GRAPH_SYNC_ROWS at once wait outside the HNSW graph; a search
    meanwhile scores them exactly beside the graph's hits (a new row and a row whose vector
    changed are found by their current vectors), the graph is not saved without them, and
    once drained a chunk at a time the graph holds them."""
    pytest.importorskip("hnswlib")
    from ampkit.vector_index import GRAPH_SYNC_ROWS, VectorIndex

    rng = np.random.default_rng(5)

    def unit(n: int) -> np.ndarray:
        v = rng.normal(size=(n, 16)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    index = VectorIndex(16, ann_threshold=100)
    index.upsert(np.arange(1, 301), unit(300))
    index.build_ann()
    assert index.uses_ann
    few = unit(GRAPH_SYNC_ROWS)  # as many as go straight in
    index.upsert(np.arange(301, 301 + GRAPH_SYNC_ROWS), few)
    assert index.graph_backlog == 0
    new, changed = unit(200), unit(1)
    was = index._rows(index._slot_of[[7]])[0].copy()  # row 7's vector the graph holds
    index.upsert(np.concatenate([np.arange(1000, 1200), [7]]), np.concatenate([new, changed]))
    assert index.graph_backlog == 201 and not index.save_ann("/nonexistent/never-written")
    rows = np.arange(1, 1200)

    def top(query: np.ndarray) -> int:
        return index.search(query, rows, 10)[0][0]

    assert top(new[123]) == 1123 and top(changed[0]) == 7 and top(was) != 7  # (not by its old vector)
    assert index.claim_drain() and not index.claim_drain()  # one drain at a time
    left = [index.drain_graph(50) for _ in range(5)]
    assert left == [151, 101, 51, 1, 0] and index.graph_backlog == 0
    assert index._ann.get_current_count() == 300 + GRAPH_SYNC_ROWS + 200  # row 7 updated in place
    assert top(new[123]) == 1123 and top(changed[0]) == 7 and top(was) != 7
    assert not index.claim_drain()  # nothing left to drain


def test_a_vector_changed_while_the_graph_is_built_joins_it_once_installed():
    """The graph is built from a copy of the vectors: a row whose vector changes meanwhile
    waits in the backlog, so the installed graph never ranks it by the old vector."""
    pytest.importorskip("hnswlib")
    from ampkit.vector_index import VectorIndex

    rng = np.random.default_rng(6)
    vectors = rng.normal(size=(301, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = VectorIndex(16, ann_threshold=100)
    index.upsert(np.arange(1, 301), vectors[:300])
    prepared = index.prepare_ann()  # (built from the 300 as they are now)
    assert prepared is not None
    index.upsert(np.array([7]), vectors[300:])  # row 7 changes before the graph serves
    index.install_ann(prepared)
    rows = np.arange(1, 301)
    assert index.graph_backlog == 1
    assert index.search(vectors[300], rows, 10)[0][0] == 7 and index.search(vectors[6], rows, 10)[0][0] != 7
    assert index.claim_drain() and index.drain_graph(128) == 0
    assert index.search(vectors[300], rows, 10)[0][0] == 7 and index.search(vectors[6], rows, 10)[0][0] != 7


def test_the_index_keeps_only_the_dimensions_its_vectors_use_and_widens_when_one_uses_more():
    """Vectors whose last dimensions are zero in every row (the default model's block for
    Korean, Japanese and Chinese character pairs, on Latin text) are kept without them: the
    same scores (every product left out is 0), a third less memory. A vector that uses more
    widens every row and drops the graph (narrower), which a graph prepared before the widening
    cannot replace; the exact scan answers until a graph of the new width is built."""
    pytest.importorskip("hnswlib")
    from ampkit.vector_index import VectorIndex

    rng = np.random.default_rng(8)

    def unit(n: int, used: int) -> np.ndarray:
        v = np.zeros((n, 16), dtype=np.float32)
        v[:, :used] = rng.normal(size=(n, used))
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    def exact(query: np.ndarray, k: int = 10) -> list[tuple[int, float]]:
        scores = held @ query
        top = np.argsort(-scores, kind="stable")[:k]
        return [(int(i) + 1, float(scores[i])) for i in top]

    index = VectorIndex(16, ann_threshold=100, block_rows=128)
    held = unit(300, 10)
    index.upsert(np.arange(1, 301), held)
    assert index.width == 10 and all(block.shape[1] == 10 for block in index._blocks)
    rows = np.arange(1, 1000)
    query = unit(1, 16)[0]  # (a query may use every dimension: its products past 10 are 0)
    hits = index.search(query, rows[:50], 5)  # few rows: the exact scan
    assert [h[0] for h in hits] == [i for i, _ in sorted(((i + 1, float(held[i] @ query)) for i in range(50)),
                                                         key=lambda x: -x[1])[:5]]
    assert np.allclose([h[1] for h in hits], [float(held[h[0] - 1] @ query) for h in hits], atol=1e-6)
    index.build_ann()
    assert index.uses_ann and index._ann.dim == 10
    assert [h[0] for h in index.search(held[41], rows, 10)][0] == 42  # through the graph

    stale = index.prepare_ann()  # a graph of 10 dimensions, prepared before the widening
    wide = unit(1, 16)
    index.upsert(np.array([301]), wide)
    held = np.vstack([held, wide])
    assert index.width == 16 and all(block.shape[1] == 16 for block in index._blocks)
    assert not index.uses_ann and index.ann_state == "none" and index.wants_ann()
    index.install_ann(stale)
    assert not index.uses_ann  # refused
    for q in (wide[0], held[41], query):  # the exact scan meanwhile: the same as over every dimension
        assert [h[0] for h in index.search(q, rows, 10)] == [h[0] for h in exact(q)]
    index.build_ann()
    assert index.uses_ann and index._ann.dim == 16
    assert index.search(wide[0], rows, 10)[0][0] == 301 and index.search(held[41], rows, 10)[0][0] == 42


def test_the_default_model_keeps_two_thirds_of_its_vectors_for_latin_text(tmp_path):
    """The shipped default's vector for Latin text is the static model's 256 dimensions and a
    128-dimension block for CJK character pairs that is zero: the index keeps the 256."""
    from ampkit.bootstrap import build_service, load_settings

    service = build_service(load_settings(store=f"sqlite:///{tmp_path}/latin.db", embedder="default"))
    service.store.open()
    try:
        service.create_many("ann", [cell(f"Alice likes window seats on trip {i}", owner="ann") for i in range(20)])
        hits = service.search("ann", SearchRequest(query="aisle or window seat", explain=True)).results
        assert hits and all(h.explain.get("dense_rank") for h in hits[:3])
        # The first search may come before the background load (it reads the table then):
        # once loaded, a search reads the index, which holds what it caught up.
        service.store.wait_for_vector_index(60)
        service.search("ann", SearchRequest(query="aisle or window seat"))
        (index,) = service.store.vectors.by_model.values()
        assert (index.dim, index.width) == (384, 256)
    finally:
        service.store.close()


def test_an_import_caught_up_by_a_search_drains_into_the_graph_in_the_background(tmp_path, monkeypatch):
    """The store side: a search that catches up an import's vectors leaves them in the graph's
    backlog (`/health` approximate_backlog) and answers exactly as a full scan would; a
    background thread then drains it, and the answers stay the same. A store closed with a
    backlog keeps the graph saved before; the next open re-adds the rows changed since through
    the backlog too (not inside the lock searches wait for), answering the same meanwhile."""
    pytest.importorskip("hnswlib")
    import threading
    import time

    gate = threading.Event()
    drain = SQLiteVectorIndex.drain
    monkeypatch.setattr(SQLiteVectorIndex, "drain", lambda self, *args: (gate.wait(30), drain(self, *args)))
    path = str(tmp_path / "import.db")
    flt = CellFilter(reader="ann", owner_id="ann")
    query = np.ones(16, dtype=np.float32) / 4.0

    def state(store: SQLiteStore) -> tuple[str, int]:
        health = store.vector_index_state()
        return health["approximate"], health["approximate_backlog"]

    store = SQLiteStore(path, ann_threshold=100)
    store.open()
    try:
        _random_unit_vectors(store, "rand16", [f"first {i}" for i in range(200)])
        store.vector_candidates(query, "rand16", flt, 10)
        store.wait_for_vector_index()  # the graph built and saved
        _random_unit_vectors(store, "rand16", [f"imported {i}" for i in range(300)], seed=4)
        exact = _exact(store, query, "rand16", flt, 10)
        assert [c.cell_id for c in store.vector_candidates(query, "rand16", flt, 10)] == exact
        index = store.vectors.by_model["rand16"]
        assert state(store) == ("ready", 300) and index._ann.get_current_count() == 200
    finally:
        store.close()  # with the backlog: the graph of 200 stays the saved one
    assert json.loads(open(store.vectors.graph_path("rand16") + ".json").read())["vec_seq"] < store.vectors.seq

    again = SQLiteStore(path, ann_threshold=100)
    again.open()
    try:
        deadline = time.monotonic() + 30
        while state(again) != ("ready", 300) and time.monotonic() < deadline:
            time.sleep(0.01)  # (the saved graph loads in the background, then the 300 join its backlog)
        assert state(again) == ("ready", 300) and again.vectors.by_model["rand16"]._ann.get_current_count() == 200
        assert [c.cell_id for c in again.vector_candidates(query, "rand16", flt, 10)] == exact
        gate.set()
        again.wait_for_vector_index()
        assert state(again) == ("ready", 0) and again.vectors.by_model["rand16"]._ann.get_current_count() == 500
        assert [c.cell_id for c in again.vector_candidates(query, "rand16", flt, 10)] == exact
    finally:
        gate.set()
        again.close()


def test_a_large_commit_is_taken_into_the_caches_in_the_background(tmp_path):
    """A commit of many rows (an import's batch) has the windows thread take its vectors into
    the vector index (and the graph's backlog) and convert its entry of the term cache's log,
    with no search asking: the first wide search after an import found 100,000 rows to read
    and convert (1.7 s of 1.8 at a million cells)."""
    pytest.importorskip("hnswlib")
    import time

    store = SQLiteStore(str(tmp_path / "bg.db"), ann_threshold=100)
    store.open()
    flt = CellFilter(reader="ann")  # reader-wide: both legs take the cached arrays
    query = np.ones(16, dtype=np.float32) / 4.0

    def settles(condition) -> bool:
        deadline = time.monotonic() + 30
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.01)
        return condition()

    try:
        _random_unit_vectors(store, "rand16", [f"first note {i}" for i in range(200)])
        store.vector_candidates(query, "rand16", flt, 10)
        store.keyword_candidates("note", flt, 10)  # the word "note" cached
        store.wait_for_vector_index()  # the graph built
        assert store.vector_index_state()["vectors"] == 200
        cache = store.keyword.postings[1]
        _random_unit_vectors(store, "rand16", [f"imported note {i}" for i in range(300)], seed=4)  # two large commits
        assert settles(lambda: store.vector_index_state()["vectors"] == 500)
        assert settles(lambda: all(entry.converted for entry in cache.log if entry is not cache._tail))
        assert cache.log and cache.log[0].first == 1
        store.wait_for_vector_index()  # drained into the graph
        assert store.vectors.by_model["rand16"]._ann.get_current_count() == 500
        assert {c.cell_id for c in store.vector_candidates(query, "rand16", flt, 10)} == set(_exact(store, query, "rand16", flt, 10))
    finally:
        store.close()


def _store_with_a_graph(path: str) -> SQLiteStore:
    """An open store of 200 random "rand16" vectors of owner "ann", past its graph threshold
    (100), whose graph a search has had built."""
    store = SQLiteStore(path, ann_threshold=100)
    store.open()
    _random_unit_vectors(store, "rand16", [f"kept cell {i}" for i in range(200)])
    store.wait_for_vector_index()
    store.vector_candidates(np.ones(16, dtype=np.float32) / 4.0, "rand16", CellFilter(reader="ann", owner_id="ann"), 10)
    store.wait_for_vector_index()
    return store


def _saved_graph(path: str) -> tuple[str, dict]:
    """`_store_with_a_graph` closed: its saved graph's path, and what was saved beside it."""
    store = _store_with_a_graph(path)
    store.close()
    saved = store.vectors.graph_path("rand16")
    with open(saved + ".json") as f:
        return saved, json.load(f)


def test_restart_loads_the_saved_graph_and_answers_while_the_index_loads(tmp_path):
    """Cold start: the HNSW graph is saved next to the database and loaded on the next open
    (not rebuilt); while vectors load, the dense leg ranks the admitted rows from the table
    (exactly) and `explain` says so."""
    pytest.importorskip("hnswlib")
    path = str(tmp_path / "cold.db")
    store = _store_with_a_graph(path)
    flt = CellFilter(reader="ann", owner_id="ann")
    query = np.ones(16, dtype=np.float32) / 4.0
    assert store.wait_for_term_warmup(60)  # a small store: nothing read ahead, ready at once
    assert store.vector_index_state() == {"state": "ready", "vectors": 200, "approximate": "ready", "keyword_warmup": "ready",
                                         "access_snapshot": "none", "approximate_backlog": 0}  # (no reader-wide search yet)
    store.close()
    saved = store.vectors.graph_path("rand16")
    assert os.path.exists(saved) and os.path.exists(saved + ".json")

    again = SQLiteStore(path, ann_threshold=100)
    again.open()
    again.wait_for_vector_index()
    assert again.vector_index_state()["approximate"] == "ready"  # loaded at open, no search needed
    exact = _exact(again, query, "rand16", flt, 10)
    assert [c.cell_id for c in again.vector_candidates(query, "rand16", flt, 10)] == exact
    again.vectors.ready.clear()  # as while loading after a start
    assert again.vector_index_state()["state"] == "loading"
    assert [c.cell_id for c in again.vector_candidates(query, "rand16", flt, 10)] == exact
    service = MemoryService(store=again, retriever=Retriever(embedder=ConceptEmbedder()))
    hits = service.search("ann", SearchRequest(query="kept cell", explain=True)).results
    assert hits and all(h.explain["dense_warming"] == 1.0 for h in hits)
    again.vectors.ready.set()
    again.close()


def test_a_loaded_graph_takes_the_rows_changed_since_it_was_saved_and_is_saved_at_close(tmp_path):
    """A restart after writes the saved graph does not hold (a crash, or another process
    wrote): those rows join the loaded graph, which is not saved again then (hnswlib would
    hold the interpreter lock for seconds at 1M while requests wait) but at close."""
    pytest.importorskip("hnswlib")
    path = str(tmp_path / "crash.db")
    saved, meta = _saved_graph(path)
    covered = meta["vec_seq"]
    graph_written = os.stat(saved).st_mtime_ns

    other = SQLiteStore(path, ann_threshold=None)  # writes beside it: no graph of its own
    other.open()
    _random_unit_vectors(other, "rand16", [f"new cell {i}" for i in range(5)], seed=11)
    new_ids = [c.id for c in other.list(CellFilter(reader="ann", owner_id="ann"), 500) if c.content.text.startswith("new cell")]
    other.close()
    assert len(new_ids) == 5

    again = SQLiteStore(path, ann_threshold=100)
    again.open()
    again.wait_for_vector_index()
    assert again.vector_index_state()["approximate"] == "ready"
    index = again.vectors.by_model["rand16"]
    assert index.uses_ann and index.graph_backlog == 0 and index.ann_dirty  # the five joined the loaded graph
    row = again._query("SELECT rowid, embedding, embed_dim FROM cells WHERE id = ?", (new_ids[0],))[0]
    from ampkit.store.sqlite_vectors import decode_vector
    labels, _ = index._ann.knn_query(decode_vector(row[1], row[2]), k=1)
    assert int(labels[0][0]) == row[0]  # the graph itself finds the new row
    with open(saved + ".json") as f:
        assert json.load(f)["vec_seq"] == covered  # not saved at load
    assert os.stat(saved).st_mtime_ns == graph_written
    again.close()
    with open(saved + ".json") as f:
        assert json.load(f)["vec_seq"] > covered  # saved at close, with the five
    assert os.stat(saved).st_mtime_ns != graph_written


def test_a_graph_saved_with_other_dimensions_is_built_anew_and_saved(tmp_path):
    """A saved graph whose dimensions are not the ones the index keeps (one saved before the
    index dropped unused dimensions: 384 for the default model's 256) is not loaded: a graph
    is built from the vectors and saved at once, with the kept width."""
    pytest.importorskip("hnswlib")
    path = str(tmp_path / "upgrade.db")
    saved, meta = _saved_graph(path)
    with open(saved + ".json", "w") as f:
        json.dump({**meta, "dim": 24}, f)

    again = SQLiteStore(path, ann_threshold=100)
    again.open()
    again.wait_for_vector_index()
    assert again.vector_index_state()["approximate"] == "ready" and again.vectors.by_model["rand16"]._ann.dim == 16
    with open(saved + ".json") as f:
        assert json.load(f)["dim"] == 16  # built and saved before close
    again.close()


def test_speaker_boost_puts_what_the_named_person_said_above_what_was_said_to_them(store):
    """"Melanie: ..." is said by Melanie; "Caroline: ... Melanie" only addresses her. Both
    name her (the entity boost cannot tell them apart); the speaker boost can. 0 = off."""
    service = MemoryService(store=store, retriever=Retriever(config=RetrievalConfig(own_text_weight=0, entity_weight=0)))
    to_her, by_her = service.create_many("alice", [
        cell("Caroline: Melanie, the pottery class sounds fun"),
        cell("Melanie: I just signed up for a pottery class"),
    ])
    req = SearchRequest(query="What class did Melanie sign up for pottery?", explain=True)
    hits = service.search("alice", req).results
    assert hits[0].id == by_her.id and hits[0].explain["speaker"] == 1.0
    assert next(h for h in hits if h.id == to_her.id).explain["speaker"] == 0.0
    off = replace(service, retriever=Retriever(config=RetrievalConfig(own_text_weight=0, entity_weight=0, speaker_weight=0)))
    assert "speaker" not in off.search("alice", req).results[0].explain


def test_date_boost_prefers_the_cell_whose_metadata_carries_the_day_asked_about(store):
    service = MemoryService(store=store, retriever=Retriever(config=RetrievalConfig(own_text_weight=0)))
    may, june = service.create_many("alice", [
        CellCreate(content={"text": "we talked about the garden", "metadata": {"date": "1:56 pm on 8 May, 2023"}},
                   identity={"owner_id": "alice"}),
        CellCreate(content={"text": "we talked about the garden again", "metadata": {"when": "2023-06-16"}},
                   identity={"owner_id": "alice"}),
    ])
    hits = service.search("alice", SearchRequest(query="What did we say about the garden on 16 June, 2023?", explain=True)).results
    assert [h.id for h in hits] == [june.id, may.id]
    assert hits[0].explain["date"] == 1.0 and hits[1].explain["date"] == 0.0
    month = service.search("alice", SearchRequest(query="the garden in May 2023", explain=True)).results
    assert month[0].id == may.id and month[0].explain["date"] == 0.5
    undated = service.search("alice", SearchRequest(query="the garden", explain=True)).results
    assert all("date" not in h.explain for h in undated)  # a query without a date: no stage


def test_date_session_leg_finds_a_turn_of_the_dated_session_the_first_pass_left_out(store):
    """A query naming a day: a loaded candidate of that day's session sends the query again
    within its session, whose best turns join the candidates (`date_session` in explain), so a
    turn that matches little but was said that day is ranked. Weight 0 or no date: no leg."""
    config = RetrievalConfig(rescore=0)  # the first pass loads 40 candidates whatever the limit
    service = MemoryService(store=store, retriever=Retriever(config=config))
    service.create_many("alice", [cell(f"Melanie: the garden was lovely {i}") for i in range(60)])

    def turn(text):
        return CellCreate(content={"text": text, "metadata": {"date": "1:56 pm on 8 May, 2023"}},
                          identity={"owner_id": "alice", "session_id": "may-8"})

    told, *_ = service.create_many("alice", [
        turn("Melanie: tomatoes and basil"), turn("Caroline: ok"), turn("Caroline: sure"), turn("Caroline: right"),
        turn("Melanie: I plant things in the garden"),
    ])
    req = SearchRequest(query="What did Melanie plant in the garden on 8 May, 2023?", limit=60, explain=True)
    hits = {h.id: h for h in service.search("alice", req).results}
    assert told.id in hits and hits[told.id].explain["date_session_rank"] >= 1 and hits[told.id].explain["date"] == 1.0
    off = replace(service, retriever=Retriever(config=replace(config, date_session_weight=0)))
    assert told.id not in {h.id for h in off.search("alice", req).results}  # the first pass alone leaves it out
    undated = service.search("alice", SearchRequest(query="What did Melanie plant in the garden?", limit=60, explain=True))
    assert all("date_session" not in h.explain for h in undated.results)


class FakeRelatedWords:
    def __init__(self, related: dict[str, list[str]]):
        self.related = related

    def expand(self, words):
        return [r for w in words for r in self.related.get(w, []) if r not in words]


def test_related_leg_finds_a_cell_that_shares_no_word_with_the_query(store):
    """"What pets does Nate have?" -- "this is Max, my dog": the related leg's words (here a
    fake vocabulary) find it; `explain` shows the leg; weight 0 (the default) or no vocabulary = no leg."""
    related = FakeRelatedWords({"pets": ["dog", "cat"]})
    service = MemoryService(store=store, retriever=Retriever(related_words=related, config=RetrievalConfig(related_weight=0.6)))
    dog, _ = service.create_many("alice", [cell("Nate: this is Max, my dog"), cell("Nate: I bought new shoes")])
    req = SearchRequest(query="What pets does Nate have?", explain=True)
    hits = service.search("alice", req).results
    assert hits[0].id == dog.id and hits[0].explain["related_rank"] == 1
    off = replace(service, retriever=Retriever(related_words=related, config=RetrievalConfig(related_weight=0)))
    assert all("related" not in h.explain for h in off.search("alice", req).results)
    assert Retriever().related_terms("What pets does Nate have?") == []


def test_dates_are_read_in_the_forms_people_write_them():
    from ampkit.timeexpr import date_match, dates_in, dates_of_metadata

    assert dates_in("1:56 pm on 8 May, 2023") == {(2023, 5, 8)}
    assert dates_in("on October 13, 2023 and 2nd of March 2024") == {(2023, 10, 13), (2024, 3, 2)}
    assert dates_in("in December 2023, then 2024-01") == {(2023, 12, None), (2024, 1, None)}
    assert dates_in("2023-13-01; may 2023?") == {(2023, 5, None)}  # no 13th month
    assert dates_in("in 2023, last week, may I") == set()  # a year alone or a relative date is no date here
    assert dates_of_metadata({"date": "8 May, 2023", "n": 3, "note": "none"}) == {(2023, 5, 8)}
    assert date_match({(2023, 5, 8)}, {(2023, 5, 8)}) == 1.0
    assert date_match({(2023, 5, None)}, {(2023, 5, 8)}) == 0.5
    assert date_match({(2023, 5, 9)}, {(2023, 5, 8)}) == 0.0
    assert date_match({(2023, 5, 8)}, set()) == 0.0


def test_shipped_related_words_table_matches_the_model():
    """The table beside the default model is what the model computes (rebuild it with
    `python -m ampkit.related_words <model dir>` after changing the model)."""
    from ampkit.embeddings import StaticEmbedder

    shipped = StaticEmbedder().related_words
    assert shipped.table is not None
    words = ["pets", "instruments", "books", "camping", "zebra"]
    computed = [tuple(shipped.words[int(i)] for i in shipped.neighbours(np.array([shipped.index[w]]), 10)[0][0]) for w in words]
    assert [tuple(shipped.words[int(i)] for i in shipped.table[0][shipped.index[w]]) for w in words] == computed
    assert {"dogs", "cats"} <= set(shipped.related("pets"))
    assert shipped.related("Nate") == () and len(shipped.expand(["pets", "books", "instruments", "sports"])) <= shipped.max_terms
    # the server's default embedder lends its words when the leg is switched on (whatever
    # routes the embedder puts in front of the static model); it is off by default
    from ampkit.bootstrap import retriever_from_settings
    from ampkit.config import Settings

    on = retriever_from_settings(Settings(embedder="default", retrieval_related_weight=0.6))
    assert "dogs" in on.related_terms("What pets does Nate have?")
    assert retriever_from_settings(Settings(embedder="default")).related_terms("What pets does Nate have?") == []


def test_static_embedder_direct_path_gives_model2vec_encode_vectors_bit_for_bit():
    """StaticEmbedder.embed calls model2vec's batch step directly for small batches; the vectors
    must be exactly `encode`'s (empty, long past max_length, CJK, several at once)."""
    from ampkit.embeddings import StaticEmbedder, _normalise

    embedder = StaticEmbedder()
    texts = ["", "Kim moved to Lisbon in March.", "word " * 3000, "서울에서 강아지를 키워요", "東京で働いています",
             "The user prefers dark roast coffee when travelling to Osaka for work."]
    for batch in ([t] for t in texts):
        assert np.array_equal(embedder.embed(batch), _normalise(embedder.model.encode(batch)))
    assert np.array_equal(embedder.embed(texts), _normalise(embedder.model.encode(texts)))


def test_shipped_model_loads_as_model2vec_loads_it(tmp_path):
    """`load_static_model` (no Hugging Face Hub client at start-up) builds the model
    `StaticModel.from_pretrained` builds from the shipped directory: the same arrays, settings
    and vectors; a directory in another layout goes through `from_pretrained` itself."""
    import shutil

    from model2vec import StaticModel

    from ampkit.embeddings import DEFAULT_MODEL_DIR, load_static_model

    ours, theirs = load_static_model(DEFAULT_MODEL_DIR), StaticModel.from_pretrained(str(DEFAULT_MODEL_DIR))
    for name in ("embedding", "weights", "token_mapping"):
        mine, model2vec = getattr(ours, name), getattr(theirs, name)
        assert (mine is None and model2vec is None) or np.array_equal(mine, model2vec), name
    assert (ours.normalize, ours.max_length, ours.median_token_length, ours.unk_token_id, ours.config) == \
        (theirs.normalize, theirs.max_length, theirs.median_token_length, theirs.unk_token_id, theirs.config)
    assert ours.tokenizer.to_str() == theirs.tokenizer.to_str()
    texts = ["Kim moved to Lisbon in March.", "word " * 3000, "서울에서 강아지를 키워요", ""]
    assert np.array_equal(ours.encode(texts), theirs.encode(texts))
    carded = tmp_path / "carded"
    shutil.copytree(DEFAULT_MODEL_DIR, carded)
    (carded / "README.md").write_text("---\nlanguage: [en]\nbase_model: x/y\n---\n")
    assert load_static_model(carded).language == ["en"]  # from_pretrained's model card reading


def test_term_cache_returns_the_tokenizer_counts_and_stays_bounded(tmp_path, monkeypatch):
    """tokenize() serves repeated texts from a shared cache: the counts must be the
    tokenizer's own, and the cache must drop the least recently used texts past its size."""
    import sqlite3

    from ampkit.store import sqlite_keyword as sqlite_store

    conn = sqlite3.connect(tmp_path / "t.db")
    for stmt in sqlite_store.TOKENIZER:
        conn.execute(stmt)
    texts = ["Running runners ran", "서울에서 강아지", "Running runners ran", "unique words here"]
    cache = sqlite_store._TermCache(max_entries=2)
    monkeypatch.setattr(sqlite_store, "_TERMS", cache)
    first = sqlite_store.tokenize(conn, texts)
    assert first[0] == first[2] == {"ran": 1, "run": 1, "runner": 1}
    monkeypatch.setattr(sqlite_store, "_TERMS", sqlite_store._TermCache(max_entries=0))  # the tokenizer alone
    assert sqlite_store.tokenize(conn, texts) == first
    assert cache.get("Running runners ran") is None  # two newer texts pushed it out
    assert cache.get("unique words here") == {"uniqu": 1, "word": 1, "here": 1}


def test_one_text_is_tokenized_as_it_is_among_others(tmp_path, monkeypatch):
    """A single text (a single-cell create's new turn) is read from the fts5vocab row table,
    several from the instance table: the same terms and counts either way (repeated words,
    stems, CJK bigrams, diacritics, punctuation only, empty)."""
    import sqlite3

    from ampkit.store import sqlite_keyword as sqlite_store

    conn = sqlite3.connect(tmp_path / "t.db")
    for stmt in sqlite_store.TOKENIZER:
        conn.execute(stmt)
    monkeypatch.setattr(sqlite_store, "_TERMS", sqlite_store._TermCache(max_entries=0))
    texts = ["Running runners ran, and ran again", "서울에서 강아지를 키워요 서울", "Café naïve CAFÉ cafe",
             "... !!! ---", "", "The user prefers dark roast coffee; the user travels to Osaka.",
             index_text("東京で働いています 東京")]
    together = sqlite_store.tokenize(conn, texts)
    for text, expected in zip(texts, together):
        assert sqlite_store.tokenize(conn, [text]) == [expected]
    assert together[0] == {"again": 1, "and": 1, "ran": 2, "run": 1, "runner": 1}


@pytest.mark.parametrize("wide", [False, True], ids=["owner", "wide"])
def test_a_purged_rows_vector_never_ranks_the_row_that_takes_its_rowid(tmp_path, wide):
    """SQLite gives a new row the rowid of a purged one (the highest, once deleted), and vec_seq
    was MAX + 1, so it went back too: an index that had loaded the purged row's vector kept it
    under the new row's rowid, and a readable cell was ranked by the text of one its reader
    could never read (found by the differential test, tests/test_noninterference.py)."""
    store = SQLiteStore(str(tmp_path / "reuse.db"), **({"keyword_scan_max": 0} if wide else {}))
    store.open()
    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    service = MemoryService(store=store, clock=lambda: now)
    later = replace(service, clock=lambda: now.replace(year=2028))
    public = {"access_policy": {"public": True}}
    secret, other = np.eye(16, dtype=np.float32)[3], np.eye(16, dtype=np.float32)[5]

    def purge(agent: str, cell_id: str) -> None:
        service.update(agent, cell_id, CellPatch.model_validate({"lifecycle": {"status": "archived"}}))
        service.delete(agent, cell_id)
        assert later.purge("admin", [cell_id]).purged == [cell_id]

    visible = service.create("ann", cell("ann's public note", owner="ann", **public))
    hidden = service.create("zed", cell("zed's private pin", owner="zed"))
    with store.write() as tx:
        tx.update(tx.get(visible.id), StoredVector("m16", other))
        tx.update(tx.get(hidden.id), StoredVector("m16", secret))
    flt = CellFilter(reader="bob", **({} if wide else {"owner_id": "ann"}))
    store.wait_for_vector_index()
    assert [c.cell_id for c in store.vector_candidates(secret, "m16", flt, 5)] == [visible.id]  # both loaded
    purge("zed", hidden.id)
    newcomer = service.create("ann", cell("ann's second note", owner="ann", **public))
    assert store._query("SELECT rowid FROM cells WHERE id = ?", [newcomer.id]) == [(2,)]  # the purged row's
    with store.write() as tx:
        tx.update(tx.get(newcomer.id), StoredVector("m16", other))
    scores = {c.cell_id: round(c.score, 3) for c in store.vector_candidates(secret, "m16", flt, 5)}
    assert scores == {visible.id: 0.0, newcomer.id: 0.0}  # not 1.0: the purged vector
    # A row with no vector yet on a reused rowid is forgotten by the index too.
    purge("ann", newcomer.id)
    pending = service.create("ann", cell("ann's third note", owner="ann", **public))
    assert store._query("SELECT rowid FROM cells WHERE id = ?", [pending.id]) == [(2,)]
    assert [c.cell_id for c in store.vector_candidates(other, "m16", flt, 5)] == [visible.id]
    store.close()


def test_vector_index_search_with_a_kept_allowed_array_follows_changes():
    """The slots of an allowed array searched again are kept (`VectorIndex._slots`) until a
    row is placed or forgotten: a forgotten row never comes back, a new allowed row does,
    exact and approximate alike."""
    import numpy as np

    from ampkit.vector_index import VectorIndex

    rng = np.random.default_rng(4)
    for threshold in (10**9, 100):
        index = VectorIndex(8, ann_threshold=threshold)
        vectors = rng.standard_normal((20_000, 8)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        index.upsert(np.arange(20_000, dtype=np.int64), vectors[:20_000])
        if index.wants_ann():
            index.build_ann()
        allowed = np.arange(0, 30_000, 2, dtype=np.int64)  # even rows, some not yet there
        query = vectors[10]
        first = index.search(query, allowed, 5)
        assert first[0][0] == 10 and index.search(query, allowed, 5) == first
        index.discard(np.array([10], dtype=np.int64))
        assert all(r != 10 for r, _ in index.search(query, allowed, 5))
        index.upsert(np.array([20_002], dtype=np.int64), query.reshape(1, 8))
        assert index.search(query, allowed, 5)[0][0] == 20_002


def test_exact_scores_of_the_allowed_rows_do_not_depend_on_the_other_rows():
    """The exact scan gives each allowed row the same score, bit for bit, whatever other rows
    the index holds and wherever the row sits among them: a reader of more than an eighth of
    the rows is scored over every row (no copy), one of fewer over its rows gathered, and the
    two agree.
    (A BLAS product's bits depend on a row's place: the scores would then carry a trace of
    rows the caller cannot read.)"""
    import numpy as np

    from ampkit.vector_index import VectorIndex, row_dots

    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((3_000, 384)).astype(np.float32)
    query = rng.standard_normal(384).astype(np.float32)
    mine = np.sort(rng.choice(3_000, 300, replace=False)).astype(np.int64)  # the caller's rows
    others = np.setdiff1d(np.arange(3_000), mine)
    indexes = []
    for extra in (0, 1_400, 2_700):  # 0 and 1,400 others: every row's scan; 2,700: the gathered one
        rows = np.sort(np.concatenate([mine, others[:extra]])).astype(np.int64)  # interleaved
        for block_rows in (1 << 16, 64):  # (one block, or rows across 47 of them)
            index = VectorIndex(384, ann_threshold=None, block_rows=block_rows)
            index.upsert(rows, vectors[rows])
            indexes.append(index)
    assert [8 * 300 >= len(index) for index in indexes] == [True, True, True, True, False, False]
    got = [index.search(query, mine, 300) for index in indexes]
    assert all(each == got[0] for each in got) and len(got[0]) == 300
    expected = row_dots(vectors[mine], query)
    assert {row: score for row, score in got[0]} == {int(r): float(x) for r, x in zip(mine, expected)}


def test_vector_blocks_hold_what_one_matrix_would():
    """The index grows by blocks (`block_rows`), never copying what it holds: with blocks of 16
    rows and of 65,536, the same new rows, changed rows and forgotten rows give the same
    answers, bit for bit, and the same as scoring the current vectors directly, through the
    exact scan over spans and gathered rows and through the graph and its backlog."""
    import numpy as np

    from ampkit.vector_index import VectorIndex, row_dots

    rng = np.random.default_rng(11)
    current: dict[int, np.ndarray] = {}
    small, large = VectorIndex(8, ann_threshold=None, block_rows=16), VectorIndex(8, ann_threshold=None)

    def unit(n: int) -> np.ndarray:
        v = rng.standard_normal((n, 8)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    next_row = 0
    for step in range(60):
        kind = rng.integers(3)
        if kind == 0 or not current:  # new rows, a batch spanning blocks
            rows = np.arange(next_row, next_row + int(rng.integers(1, 90)), dtype=np.int64)
            next_row += len(rows)
            if step % 2:  # (slots then lie out of the rows' order, as after a re-embedding)
                rows = rng.permutation(rows)
        elif kind == 1:  # changed rows, and perhaps new ones beside them
            rows = rng.choice(np.array(sorted(current)), size=min(len(current), 20), replace=False).astype(np.int64)
            rows = np.concatenate([rows, [next_row]]).astype(np.int64)
            next_row += 1
        else:
            gone = rng.choice(np.array(sorted(current)), size=min(len(current), 5), replace=False).astype(np.int64)
            for index in (small, large):
                index.discard(gone)
            for row in gone.tolist():
                current.pop(row)
            continue
        vectors = unit(len(rows))
        for index in (small, large):
            index.upsert(rows, vectors)
        current.update(zip(rows.tolist(), vectors))
        query = unit(1)[0]
        held = np.array(sorted(current), dtype=np.int64)
        for allowed in (held, held[:: int(rng.integers(2, 12))], np.arange(next_row + 50, dtype=np.int64)):
            expected = {int(r): float(x) for r, x in zip(held, row_dots(np.stack([current[r] for r in held.tolist()]), query))}
            got = small.search(query, allowed, 5)
            assert got == large.search(query, allowed, 5)
            assert [score for _, score in got] == sorted((expected[r] for r in allowed.tolist() if r in expected), reverse=True)[:5]
    assert len(small._blocks) > 10 and len(large._blocks) == 1

    pytest.importorskip("hnswlib")
    graph = VectorIndex(8, ann_threshold=100, block_rows=16)
    base = unit(400)
    graph.upsert(np.arange(400, dtype=np.int64), base)
    graph.build_ann()
    later = unit(150)  # into the backlog: scored exactly from their blocks until drained
    graph.upsert(np.arange(400, 550, dtype=np.int64), later)
    assert graph.graph_backlog == 150
    everyone = np.arange(550, dtype=np.int64)
    assert graph.search(later[77], everyone, 3)[0][0] == 477 and graph.search(base[9], everyone, 3)[0][0] == 9
    assert graph.claim_drain() and graph.drain_graph(1000) == 0
    assert graph.search(later[77], everyone, 3)[0][0] == 477 and graph.search(base[9], everyone, 3)[0][0] == 9


def test_a_warm_up_of_an_earlier_open_neither_readies_nor_builds(tmp_path):
    """`ampkit serve` opens the store, closes it and opens it again: the first open's vector
    warm-up may still be running. It must not mark the index ready or build the graph over
    what it loaded (the later open's warm-up does both, over every vector)."""
    pytest.importorskip("hnswlib")
    path = str(tmp_path / "warm.db")
    store = SQLiteStore(path, ann_threshold=50)
    store.open()
    _random_unit_vectors(store, "rand8", [f"vector cell {i}" for i in range(80)])
    store.close()
    store.open()
    try:
        store.wait_for_vector_index()
        index = store.vectors.by_model["rand8"]
        assert index.ann_state == "ready" and len(index) == 80
        index._ann, index.ann_state = None, "none"  # as before the current open built it
        store.vectors.ready.clear()
        store.vectors.warm(store._opened - 1)  # the earlier open's warm-up, finishing late
        assert not store.vectors.ready.is_set() and index._ann is None
        store.vectors.warm(store._opened)
        assert store.vectors.ready.is_set() and index.ann_state == "ready"
    finally:
        store.close()


def test_approximate_search_off_keeps_every_dense_ranking_exact(tmp_path):
    """`approximate_search` off (docs/security.md): the store never builds the graph, however
    many vectors it holds, says so in /health, and a wide search ranks exactly. On, the same
    store past its threshold builds one."""
    pytest.importorskip("hnswlib")
    from starlette.testclient import TestClient

    from ampkit.bootstrap import store_from_settings
    from ampkit.config import Settings
    from ampkit.server.app import create_app

    stores = {}
    for approximate in (True, False):
        store = store_from_settings(Settings(store=f"sqlite:///{tmp_path}/{approximate}.db", approximate_search=approximate))
        assert isinstance(store, SQLiteStore)
        if store.vectors.ann_threshold is not None:
            store.vectors.ann_threshold = 50  # past the default's 200,000 in a test's size
        store.open()
        _random_unit_vectors(store, "rand8", [f"vector cell {i}" for i in range(120)])
        stores[approximate] = store
    query = np.ones(8, dtype=np.float32) / np.sqrt(8)
    for approximate, store in stores.items():
        store.wait_for_vector_index()
        store.vector_candidates(query, "rand8", CellFilter(), 10)  # past the threshold: the graph if allowed
        store.wait_for_vector_index()
        assert store.vectors.by_model["rand8"].uses_ann is approximate
        assert store.vector_index_state()["approximate"] == ("ready" if approximate else "off")
    exact = _exact(stores[False], query, "rand8", CellFilter(), 10)
    assert [c.cell_id for c in stores[False].vector_candidates(query, "rand8", CellFilter(), 10)] == exact
    for store in stores.values():
        store.close()
    settings = Settings(store=f"sqlite:///{tmp_path}/False.db", approximate_search=False, embedder="none",
                        lifecycle_interval_seconds=0)
    with TestClient(create_app(settings), base_url="http://testserver/amp/v1") as client:
        assert client.get("/health").json()["vector_index"]["approximate"] == "off"


# ---------------------------------------------------------------- the score: calibrated relevance


class StepClock:
    """The service's clock, set by hand: cells get ages, then the questions are asked "now"."""

    def __init__(self) -> None:
        self.now = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now


def default_service(store, clock=None) -> MemoryService:
    """The service as the server builds it, with the shipped default embedder."""
    from ampkit.bootstrap import retriever_from_settings
    from ampkit.config import Settings

    retriever = retriever_from_settings(Settings(embedder="default"))
    return MemoryService(store=store, retriever=retriever, **({"clock": clock} if clock else {}))


PERSONAL = [
    "Mom's birthday: 14 March.",
    "Dentist is Dr. Marta Sousa at Clinica Sorriso on Avenida de Roma.",
    "Car insurance with Fidelidade renews on 1 April; policy FD-882134.",
    "Allergic to penicillin, always tell doctors.",
    "Pilates at Studio Alma on Tuesdays and Fridays, 7:30.",
    "Tomas drinks a double espresso, never with milk.",
    "Our customer success manager at Acme is Priya Nair.",
    "Grey 2019 Renault Clio, plate 45-XZ-19.",
]


def test_an_irrelevant_hot_cell_never_outranks_a_relevant_cold_one(store):
    """Importance and recent reads break near ties; they do not lift a cell that does not
    answer over one that does (the old blend, 0.7 x relevance scaled to the best hit + 0.3 x
    decay, put a hot second hit first)."""
    clock = StepClock()
    service = default_service(store, clock)
    today = clock.now
    clock.now = today - timedelta(days=700)
    cold = service.create("maya", cell("Mom's birthday: 14 March.", scoring={"importance": 0.1}))
    clock.now = today - timedelta(days=1)
    hot = service.create("maya", cell("Leo's birthday party playlist is in the shared music folder.",
                                      scoring={"importance": 1.0}))
    service.create_many("maya", [cell(t) for t in PERSONAL[1:]])
    for _ in range(10):
        service.get("maya", hot.id)  # read often, lately
    clock.now = today
    hits = service.search("maya", SearchRequest(query="When is my mother's birthday?", explain=True)).results
    by_id = {h.id: h for h in hits}
    assert hits[0].id == cold.id
    assert by_id[hot.id].explain["decay"] > 0.9 > 0.01 > by_id[cold.id].explain["decay"]
    assert by_id[hot.id].score < by_id[cold.id].score


def test_decay_orders_hits_of_equal_relevance_and_moves_none_by_more_than_its_share(store):
    service = default_service(store)
    low, high = service.create_many("maya", [
        cell("Parking for the office is on level 2 of the garage.", scoring={"importance": 0.1}, dedup="off"),
        cell("Parking for the office is on level 2 of the garage.", scoring={"importance": 1.0}, dedup="off"),
    ])
    service.create_many("maya", [cell(t) for t in PERSONAL])
    hits = service.search("maya", SearchRequest(query="Where do I park at the office?", explain=True)).results
    assert [h.id for h in hits[:2]] == [high.id, low.id]
    first, second = hits[0].explain, hits[1].explain
    assert first["relevance"] == pytest.approx(second["relevance"])
    weight = service.retriever.config.decay_weight
    for parts in (first, second):
        assert (1 - weight) * parts["relevance"] <= parts["score"] <= parts["relevance"]


def test_unrelated_questions_score_below_the_default_threshold_and_answered_ones_above(store):
    """The score is an estimate that the cell answers, not a rank scaled to the best hit: a
    question the store cannot answer gets low scores (an adapter's `min_score` leaves it
    empty), while the answer to one it can scores above the threshold."""
    from ampkit.limits import DEFAULT_MIN_SCORE

    service = default_service(store)
    made = dict(zip(PERSONAL, service.create_many("maya", [cell(t) for t in PERSONAL])))
    for question in ("What is the capital of Peru?", "How do I reset my router?",
                     "Which bus goes to the stadium?", "What is the boiling point of ethanol?"):
        hits = service.search("maya", SearchRequest(query=question)).results
        assert hits and max(h.score for h in hits) < DEFAULT_MIN_SCORE, (question, hits[0].content.text, hits[0].score)
    for question, answer in (("Who is my dentist?", PERSONAL[1]), ("When does the car insurance renew?", PERSONAL[2]),
                             ("What antibiotic am I allergic to?", PERSONAL[3])):
        hits = service.search("maya", SearchRequest(query=question)).results
        assert hits[0].id == made[answer].id and hits[0].score >= DEFAULT_MIN_SCORE, (question, hits[0].score)


def test_an_acronym_finds_the_cell_that_spells_it_out(store):
    service = default_service(store)
    made = dict(zip(PERSONAL, service.create_many("maya", [cell(t) for t in PERSONAL])))
    hits = service.search("maya", SearchRequest(query="Who is our CSM at Acme?", explain=True)).results
    assert hits[0].id == made[PERSONAL[6]].id and hits[0].explain["x_acronym"] == 1.0


def test_explain_shows_the_relevance_models_inputs_and_how_the_score_is_made(store):

    from ampkit.ranker import DEFAULT_MODELS, FEATURES
    from ampkit.retrieval import tie_broken

    service = default_service(store)
    service.create_many("maya", [cell(t) for t in PERSONAL])
    hits = service.search("maya", SearchRequest(query="When is my mother's birthday?", explain=True)).results
    model = DEFAULT_MODELS["static"]
    for hit in hits:
        parts = hit.explain
        x = [parts[f"x_{name}"] for name in FEATURES]
        assert parts["logit"] == pytest.approx(model.bias + sum(model.weights.get(n, 0.0) * v for n, v in zip(FEATURES, x)))
        assert parts["relevance"] == pytest.approx(1 / (1 + math.exp(-parts["logit"])))
        assert 0.0 <= parts["first_pass"] <= 1.0 and 0.0 <= parts["relevance"] <= 1.0
        assert hit.score == pytest.approx(tie_broken(parts["relevance"], parts["decay"], service.retriever.config.decay_weight), abs=1e-6)
    assert hits[0].explain["x_dense_gap"] == 0.0 and all(h.explain["x_dense_gap"] <= 0 for h in hits)


def test_a_search_as_of_a_past_time_is_scored_by_the_keyword_model(store):
    """A search of the past ranks by BM25 over the cells as they were (no vectors): its scores
    are the keyword model's probabilities too, not BM25 scaled so the best hit is 1."""
    from ampkit.ranker import DEFAULT_MODELS, candidate_features

    clock = StepClock()
    service = default_service(store, clock)
    today = clock.now
    clock.now = today - timedelta(hours=2)
    service.create_many("maya", [cell(t) for t in PERSONAL])
    clock.now = today
    req = SearchRequest(query="policy renewal date", explain=True, as_of=today - timedelta(hours=1))
    hits = service.search("maya", req).results
    assert hits[0].content.text == PERSONAL[2]
    top = hits[0].explain
    assert top["first_pass"] == 1.0 and 0.0 < top["relevance"] < 1.0
    parts = {"keyword": top["keyword"], "own_text": top["own_text"], "entity": top["entity"], "relevance": 1.0}
    features = candidate_features(req.query, [parts], [hits[0].content.text])
    assert top["relevance"] == pytest.approx(DEFAULT_MODELS["keyword"].probabilities(features)[0])


def test_relevance_model_features_and_weights():
    from ampkit.ranker import FEATURES, RelevanceModel, acronym_match, answer_type_match, candidate_features, leg_floor

    assert acronym_match("Who is our CSM?", "Our customer success manager is Priya.") == 1.0
    assert acronym_match("customer success manager", "CSM: Priya") == 1.0
    assert acronym_match("What is the ROI?", "return on investment was 12%") == 1.0
    assert acronym_match("When is the QBR?", "The QBR is on Monday") == 0.0  # the same word: the keyword leg's
    assert acronym_match("Who is our CSM?", "Customer list for March") == 0.0
    assert answer_type_match("When is Leo's birthday?", "Leo: birthday 2 August") == 1.0
    assert answer_type_match("How much is the rent?", "The landlord is Sr. Almeida") == -1.0
    assert answer_type_match("Who looks after my teeth?", "Dentist is Dr. Marta Sousa") == 1.0
    assert answer_type_match("What is my blood type?", "anything") == 0.0
    assert leg_floor([3.0, 2.0, 1.0], pool=3) == 1.0 and leg_floor([3.0, 2.0], pool=3) == 0.0
    rows = candidate_features("dog walk", [{"keyword": 4.0, "dense": 0.6, "relevance": 1.0},
                                           {"dense": 0.5, "relevance": 0.5}], ["a b", "c d e"], dense_floor=0.2, keyword_floor=1.0)
    at = {name: i for i, name in enumerate(FEATURES)}
    assert rows.shape == (2, len(FEATURES))
    assert rows[0, at["keyword_share"]] == 1.0 and rows[1, at["keyword_share"]] == 0.25  # past a full pool: its floor
    assert rows[1, at["dense_gap"]] == pytest.approx(-0.1) and rows[0, at["dense_gap"]] == 0.0
    model = RelevanceModel({"first_pass": 2.0}, bias=-1.0)
    assert model.probabilities(rows).tolist() == pytest.approx([1 / (1 + math.exp(-1.0)), 0.5])
    with pytest.raises(ValueError, match="unknown ranker features"):
        RelevanceModel({"lenght": 1.0})


def test_ranker_setting_switches_the_stage():
    from ampkit.bootstrap import retriever_from_settings
    from ampkit.config import Settings

    assert retriever_from_settings(Settings(embedder="none")).relevance_model("dense") is not None
    assert retriever_from_settings(Settings(embedder="none", retrieval_ranker=False)).relevance_model("dense") is None
