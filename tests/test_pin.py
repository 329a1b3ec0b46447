"""Pinning (PUT/DELETE /memories/{id}/pin): a pinned cell is in its owner's searches, first,
within `limit`, for callers that may read it; on SQLite and PostgreSQL, through a real server
with the sync and async clients and the MCP tools, and in process."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import ampkit
from ampkit.errors import AccessDenied
from support import TLS, AppServer

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def store_url(request, tmp_path):
    return f"sqlite:///{tmp_path}/pin.db" if request.param == "sqlite" else request.getfixturevalue("pg_url")


@pytest.fixture
def server(store_url):
    with AppServer(store_url) as srv:
        yield srv


def _ids(hits) -> list[str]:
    return [hit.cell.id for hit in hits]


def test_a_pinned_cell_is_first_in_its_owners_searches_for_readers_only(server):
    with ampkit.connect(server.base_url, agent_id="ada") as ada, \
            ampkit.connect(server.base_url, agent_id="bob") as bob, \
            ampkit.connect(server.base_url, agent_id="eve") as eve:
        rule = ada.remember("Always answer in French", owner_id="ada", readable_by=["bob"])
        tea = [ada.remember(f"Ada drinks green tea number {i}", owner_id="ada", readable_by=["bob", "eve"])
               for i in range(3)]
        assert rule.id not in _ids(ada.search("green tea", owner_id="ada", limit=2))
        pinned = ada.pin(rule.id)
        assert pinned is not None and pinned.lifecycle.pinned and pinned.lifecycle.version == 2
        assert ada.pin(rule.id).lifecycle.version == 2  # pinning a pinned cell changes nothing

        hits = ada.search("green tea", owner_id="ada", limit=2, explain=True)
        assert _ids(hits)[0] == rule.id and len(hits) == 2 and _ids(hits)[1] in {c.id for c in tea}
        assert hits[0].score == 0.0 and hits[0].explain == {"pinned": 1.0}
        assert _ids(ada.search("green tea", limit=2))[0] == rule.id  # no owner: the caller's own pins
        assert _ids(bob.search("green tea", owner_id="ada", limit=2))[0] == rule.id
        # eve may not read the pinned cell: her answer is the one she got before the pin.
        assert rule.id not in _ids(eve.search("green tea", owner_id="ada", limit=4))
        assert len(eve.search("green tea", owner_id="ada", limit=4)) == 3
        # a pinned cell that matches keeps its score
        assert ada.search("French", owner_id="ada", limit=1)[0].score > 0
        # filters still apply: a pinned semantic cell is not in a search of episodes
        assert rule.id not in _ids(ada.search("green tea", owner_id="ada", types=["episodic"]))

        history = ada.history(rule.id)
        assert [e.action for e in history][-1] == "pin"
        assert ada.unpin(rule.id).lifecycle.pinned is False
        assert rule.id not in _ids(ada.search("green tea", owner_id="ada", limit=2))


def test_pin_follows_the_write_rule_and_keeps_unreadable_cells_out_of_answers(server):
    with ampkit.connect(server.base_url, agent_id="ada") as ada, \
            ampkit.connect(server.base_url, agent_id="wanda") as wanda, \
            ampkit.connect(server.base_url, agent_id="eve") as eve:
        cell = ada.remember("the vault code is 4812", owner_id="ada", writable_by=["wanda"])
        with pytest.raises(AccessDenied):
            eve.pin(cell.id)
        with pytest.raises(AccessDenied):
            eve.pin("mem_01J9Z3K8Q4V7X2N5B6C8D0E1F2")  # missing: the same answer
        assert wanda.pin(cell.id) is None  # may write, may not read: 204, no cell
        assert ada.get(cell.id).lifecycle.pinned
        # a PATCH may send it back unchanged (AMP clients send whole cells), never change it
        with httpx.Client(base_url=server.base_url, headers={"X-AMP-Agent-ID": "ada"}, verify=TLS) as http:
            same = http.patch(f"/memories/{cell.id}", json={"lifecycle": {"pinned": True}})
            changed = http.patch(f"/memories/{cell.id}", json={"lifecycle": {"pinned": False}})
        assert same.status_code == 200, same.text
        assert changed.status_code == 422 and "lifecycle.pinned" in changed.json()["error"]["message"]
        assert ada.unpin(cell.id).lifecycle.pinned is False


def test_the_async_client_and_the_mcp_tools_pin_over_http(server):
    from mcp.shared.memory import create_connected_server_and_client_session

    from ampkit.client._http import AsyncHTTPTransport
    from ampkit.mcp_server import ClientGateway, build_mcp_server

    async def scenario():
        async with ampkit.AsyncClient(server.base_url, agent_id="ada") as ada:
            rule = await ada.remember("Never book flights before 9", owner_id="ada")
            await ada.remember("Ada likes window seats", owner_id="ada")
            assert (await ada.pin(rule.id)).lifecycle.pinned
            assert _ids(await ada.search("window seats", owner_id="ada", limit=1)) == [rule.id]
            assert (await ada.unpin(rule.id)).lifecycle.pinned is False
            transport = AsyncHTTPTransport(server.base_url, agent_id="ada")
            mcp = build_mcp_server(ClientGateway(transport, "ada"))
            async with create_connected_server_and_client_session(mcp) as session:
                pinned = await session.call_tool("pin", {"id": rule.id})
                assert not pinned.isError and pinned.structuredContent["cell"]["lifecycle"]["pinned"] is True
                recalled = await session.call_tool("recall", {"query": "window seats", "limit": 1})
                assert [r["id"] for r in recalled.structuredContent["results"]] == [rule.id]
                unpinned = await session.call_tool("unpin", {"id": rule.id})
                assert unpinned.structuredContent["cell"]["lifecycle"]["pinned"] is False
            await transport.close()

    asyncio.run(scenario())


def test_in_process_pin_and_as_of_search(store_url):
    from datetime import datetime, timezone

    with ampkit.connect(store_url, agent_id="ada") as ada:
        rule = ada.remember("Use metric units", owner_id="ada")
        ada.remember("Ada runs ten kilometres", owner_id="ada")
        ada.pin(rule.id)
        now = datetime.now(timezone.utc)
        assert _ids(ada.search("kilometres", owner_id="ada", limit=1)) == [rule.id]
        assert _ids(ada.search("kilometres", owner_id="ada", limit=1, as_of=now)) == [rule.id]
        ada.unpin(rule.id)
        assert _ids(ada.search("kilometres", owner_id="ada", limit=1)) != [rule.id]


def test_a_memory_file_is_not_pinned(tmp_path):
    from ampkit.errors import FileManaged

    with ampkit.connect(f"sqlite:///{tmp_path}/files.db", agent_id="ada") as ada:
        ada.set_approval_mode("ada", "yolo")
        ada.write_file("AGENTS.md", "Answer briefly.\n", owner_id="ada")
        file_id = next(f.id for f in ada.list_files("ada").results if f.path == "AGENTS.md")
        assert file_id is not None
        with pytest.raises(FileManaged):
            ada.pin(file_id)
        assert ada.get(file_id).lifecycle.pinned is False
