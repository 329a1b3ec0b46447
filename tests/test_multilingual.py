"""Korean (and Japanese) memories are findable by keyword and by meaning, through a real
server with the default embedder. Korean attaches particles and endings to words, so the
stored "서울에서" must match a query for "서울"; a differently inflected sentence must come back
through the dense leg."""

from __future__ import annotations

import httpx
import pytest

from ampkit.textindex import fts_match, index_text

KOREAN = [
    "저는 작년에 서울에서 살았어요",        # I lived in Seoul last year
    "내일 부산으로 출장을 가요",            # tomorrow I go to Busan on business
    "우리 고양이 이름은 나비예요",          # our cat's name is Nabi
]


@pytest.fixture(scope="module")
def korean_server(tmp_path_factory):
    from support import AppServer

    tmp = tmp_path_factory.mktemp("multilingual")
    proc = AppServer(f"sqlite:///{tmp}/ko.db", env={"AMPKIT_EMBEDDER": "default"}, log_path=tmp / "server.log")
    proc.start()
    with httpx.Client(base_url=proc.base_url, headers={"X-AMP-Agent-ID": "minji"}, timeout=30) as http:
        cells = [{"content": {"text": t}, "identity": {"owner_id": "minji"}} for t in KOREAN]
        cells.append({"content": {"text": "東京で寿司を食べました"}, "identity": {"owner_id": "minji"}})
        cells.append({"content": {"text": "I lived in Seoul last year"}, "identity": {"owner_id": "minji"}})
        assert http.post("/memories/batch", json={"cells": cells}).status_code == 201
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
    assert hits[0]["explain"]["dense_rank"] == 1


def test_korean_query_does_not_match_unrelated_korean(korean_server):
    hits = search(korean_server, "부산 출장")
    assert hits[0]["content"]["text"] == KOREAN[1]
    assert all(h["content"]["text"] != KOREAN[2] or "keyword" not in h["explain"] for h in hits)


def test_japanese_without_spaces_is_found_by_keyword(korean_server):
    hits = search(korean_server, "寿司")
    assert hits[0]["content"]["text"] == "東京で寿司を食べました"
    assert "keyword" in hits[0]["explain"]


def test_cjk_bigrams_extend_index_and_query_text_only_for_cjk():
    assert index_text("plain English stays as it is") == "plain English stays as it is"
    assert "서울 울에 에서" in index_text("서울에서")
    assert fts_match("서울에서 살아요") == '"서울" OR "울에" OR "에서" OR "살아" OR "아요"'
    assert fts_match('what did "Alice" say') == '"alice" OR "say"'  # stop words dropped, quotes neutral
