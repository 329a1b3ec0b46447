"""Issue 43: abstention (`min_score`), `total` as the number of hits that match, and memory
files left out of search unless `include_files`. Through the real server over HTTP (raw
requests and the sync and async clients) and through the in-process client on a SQLite file."""

from __future__ import annotations

import httpx
import pytest

import ampkit
from adapter_support import unique
from support import TLS


def _http(server, agent: str) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, headers={"X-AMP-Agent-ID": agent}, timeout=30, verify=TLS)


def _search(http: httpx.Client, **body) -> dict:
    response = http.post("/memories/search", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_min_score_drops_the_hits_below_it_and_total_counts_the_hits_that_clear_it(server):
    alice = unique("alice")
    with _http(server, alice) as http:
        for text in ("the tram to Leith leaves at nine", "the tram depot is in Leith", "tram fares went up in Leith",
                     "my sister collects stamps"):
            assert http.post("/memories", json={"content": {"text": text}, "identity": {"owner_id": alice}}).status_code == 201
        everything = _search(http, query="tram Leith", owner_id=alice)
        scores = [hit["score"] for hit in everything["results"]]
        assert everything["total"] == len(scores) >= 3
        threshold = scores[2]  # the third best: it clears, the ones below it do not
        kept = _search(http, query="tram Leith", owner_id=alice, min_score=threshold)
        assert [h["id"] for h in kept["results"]] == [h["id"] for h in everything["results"] if h["score"] >= threshold]
        assert kept["total"] == len(kept["results"]) >= 3 and min(h["score"] for h in kept["results"]) >= threshold
        # total counts the hits that clear it, not the page
        page = _search(http, query="tram Leith", owner_id=alice, min_score=threshold, limit=1)
        assert len(page["results"]) == 1 and page["total"] == kept["total"]
        # nothing relevant enough: no results and a total of 0 (abstention)
        assert _search(http, query="tram Leith", owner_id=alice, min_score=1.0) == {"results": [], "total": 0, "query": "tram Leith"}


@pytest.mark.parametrize("bad", [1.5, -0.1, "0.5", None, True])
def test_a_bad_min_score_is_a_422_in_the_envelope_and_the_server_keeps_serving(server, bad):
    alice = unique("alice")
    with _http(server, alice) as http:
        response = http.post("/memories/search", json={"query": "anything", "min_score": bad})
        assert response.status_code == 422 and response.json()["error"]["code"] == "VALIDATION_ERROR"
        assert _search(http, query="anything", owner_id=alice)["total"] == 0


def test_total_and_what_clears_min_score_do_not_depend_on_unreadable_cells(server):
    alice, bob = unique("alice"), unique("bob")
    with _http(server, alice) as a, _http(server, bob) as b:
        for text in ("the heron nests by the canal", "a heron fished at the canal lock"):
            a.post("/memories", json={"content": {"text": text}, "identity": {"owner_id": alice}})
        body = {"query": "heron canal", "min_score": 0.05}
        before = _search(a, **body)
        assert before["total"] > 0
        for n in range(5):  # bob's private cells with the same words, better matches
            b.post("/memories", json={"content": {"text": f"heron canal heron canal {n}"}, "identity": {"owner_id": bob}})
        assert _search(a, **body) == before
        assert _search(b, **body)["total"] > 0


def test_memory_files_are_left_out_of_search_unless_include_files(server):
    alice = unique("alice")
    with _http(server, alice) as http:
        assert http.put("/files/mode", json={"owner_id": alice, "approval_mode": "yolo"}).status_code == 200
        written = http.post("/files/write", json={"owner_id": alice, "path": "skills/otters/SKILL.md", "content":
                            "---\nname: otters\ndescription: how to count otters on the river\n---\nCount otters at dawn.\n"})
        assert written.json()["status"] == "written", written.text
        note = http.post("/memories", json={"content": {"text": "we saw two otters on the river"},
                                            "identity": {"owner_id": alice}}).json()
        plain = _search(http, query="otters river", owner_id=alice)
        assert [h["id"] for h in plain["results"]] == [note["id"]] and plain["total"] == 1
        both = _search(http, query="otters river", owner_id=alice, include_files=True)
        assert {h["identity"]["path"] for h in both["results"]} == {None, "skills/otters/SKILL.md"}
        assert both["total"] == 2
        # the files API still finds it
        found = http.post("/files/search", json={"owner_id": alice, "query": "otters"}).json()
        assert [h["path"] for h in found["results"]] == ["skills/otters/SKILL.md"]


def _seed(client: ampkit.Client, owner: str) -> None:
    client.set_approval_mode(owner, "yolo")  # auth off: every caller holds the admin scope
    client.remember("the boiler is serviced every October", owner_id=owner)
    client.remember("the boiler pressure should read 1.5 bar", owner_id=owner)
    assert client.write_file("boiler.md", "# Boiler\nThe boiler manual.\n", owner_id=owner).status == "written"


def _check(hits_all, hits_strict, hits_files) -> None:
    assert len(hits_all) == 2 and not any(h.cell.identity.path for h in hits_all)
    assert hits_strict == []
    assert [h.cell.identity.path for h in hits_files].count("boiler.md") == 1


@pytest.mark.parametrize("where", ["http", "in_process"])
def test_the_sync_client_sends_min_score_and_include_files(server, tmp_path, where):
    owner = unique("alice")
    client = ampkit.connect(server.base_url if where == "http" else f"sqlite:///{tmp_path}/memory.db", agent_id=owner)
    try:
        _seed(client, owner)
        _check(client.search("boiler", owner_id=owner), client.search("boiler", owner_id=owner, min_score=1.0),
               client.search("boiler", owner_id=owner, include_files=True))
    finally:
        client.close()


@pytest.mark.parametrize("where", ["http", "in_process"])
async def test_the_async_client_sends_min_score_and_include_files(server, tmp_path, where):
    owner = unique("alice")
    url = server.base_url if where == "http" else f"sqlite:///{tmp_path}/memory.db"
    seeding = ampkit.connect(url, agent_id=owner)
    _seed(seeding, owner)
    seeding.close()
    async with ampkit.aconnect(url, agent_id=owner) as client:
        _check(await client.search("boiler", owner_id=owner), await client.search("boiler", owner_id=owner, min_score=1.0),
               await client.search("boiler", owner_id=owner, include_files=True))
