"""MCP: every MCP client reads and writes the same memory as the HTTP API, as the same
identities, under the same rule. Through the SDK's own client: in process, over stdio
against a real `ampkit mcp` process, and over streamable HTTP against a real server (the app
served over HTTP in the test process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, AsyncIterator, Optional

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError
from mcp.shared.memory import create_connected_server_and_client_session

import ampkit
from adapter_support import unique
from ampkit.auth import create_key
from ampkit.bootstrap import build_service
from test_time_travel import T0, _world
from ampkit.config import Settings
from ampkit.mcp_server import READ_TOOLS, TOOL_NAMES, ServiceGateway, build_mcp_server, fixed_caller
from ampkit.files import ApprovalMode
from ampkit.models import HistoryResponse, ListResponse, MemoryCell, SearchResponse
from ampkit.server.app import create_app
from ampkit.server.identity import Caller
from ampkit.store import store_from_url
from support import TLS

NO_SUCH_ID = "mem_01J9Z3K8Q4V7X2N5B6C8D0E1F2"
DENIED = '{"error":{"code":"ACCESS_DENIED","message":"memory not found or access denied","details":{}}}'


# ---------------------------------------------------------------- helpers


class Tools:
    """A connected MCP client session with shorthands for calling tools."""

    def __init__(self, session: ClientSession):
        self.session = session

    async def ok(self, name: str, **args: Any) -> dict[str, Any]:
        result = await self.session.call_tool(name, args)
        assert not result.isError, result.content[0].text
        assert json.loads(result.content[0].text) == result.structuredContent
        return result.structuredContent

    async def remembered(self, name: str = "remember", **args: Any) -> dict[str, Any]:
        """The cell `remember` (or `amp_remember`) stored, for a key that may read."""
        out = await self.ok(name, **args)
        assert out["stored"] is True and out["cell"] is not None, out
        return out["cell"]

    async def error(self, name: str, **args: Any) -> str:
        """The error text (the server's envelope), after checking it is a tool error."""
        result = await self.session.call_tool(name, args)
        assert result.isError, result
        text = result.content[0].text
        assert json.loads(text) == result.structuredContent
        return text

    async def code(self, name: str, **args: Any) -> str:
        return json.loads(await self.error(name, **args))["error"]["code"]


@pytest.fixture(autouse=True)
def _compiled_output_schemas(monkeypatch):
    """The SDK client checks every tool result against the tool's output schema, through
    `jsonschema.validate`, which first checks the schema itself against the 2020-12 metaschema
    (~50 ms for a cell-bearing schema) on every call. Here the same check (schema checked,
    then the result validated, same registry) with each schema checked and compiled once."""
    from jsonschema import validators
    from referencing import Registry

    compiled: dict[str, Any] = {}

    async def validate_tool_result(self: ClientSession, name: str, result: Any) -> None:
        if name not in self._tool_output_schemas:
            await self.list_tools()
        schema = self._tool_output_schemas.get(name)
        if schema is None:
            return
        if result.structuredContent is None:
            raise RuntimeError(f"Tool {name} has an output schema but did not return structured content")
        key = json.dumps(schema, sort_keys=True)
        if key not in compiled:
            cls = validators.validator_for(schema)
            cls.check_schema(schema)
            compiled[key] = cls(schema, registry=Registry())
        compiled[key].validate(result.structuredContent)

    monkeypatch.setattr(ClientSession, "_validate_tool_result", validate_tool_result)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = build_service(Settings(store=f"sqlite:///{tmp_path_factory.mktemp('mcp')}/mcp.db", embedder="none"))
    svc.store.open()
    yield svc
    svc.store.close()


@asynccontextmanager
async def in_process(service, agent: str, scopes: tuple[str, ...] = ("read", "write", "admin")) -> AsyncIterator[Tools]:
    server = build_mcp_server(ServiceGateway(service, fixed_caller(Caller(agent, frozenset(scopes)))))
    async with create_connected_server_and_client_session(server) as session:
        yield Tools(session)


@asynccontextmanager
async def over_http(url: str, headers: dict[str, str]) -> AsyncIterator[Tools]:
    async with httpx.AsyncClient(headers=headers, timeout=30, verify=TLS) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield Tools(session)


@asynccontextmanager
async def over_stdio(*args: str, env: Optional[dict[str, str]] = None) -> AsyncIterator[Tools]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "ampkit.cli", "mcp", *args],
                                   env={**os.environ, "AMPKIT_EMBEDDER": "none", **(env or {})})
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield Tools(session)


def mcp_url(server) -> str:
    return server.base_url.removesuffix("/amp/v1") + "/mcp"


# ---------------------------------------------------------------- in process


async def test_tools_have_descriptions_output_schemas_and_hints(service):
    async with in_process(service, "alice") as mcp:
        tools = {t.name: t for t in (await mcp.session.list_tools()).tools}
        assert set(tools) == set(TOOL_NAMES)
        for name, tool in tools.items():
            assert tool.description and tool.outputSchema, name
            assert tool.annotations.readOnlyHint is (name in READ_TOOLS), name
        assert tools["forget"].annotations.destructiveHint
        assert tools["remember"].inputSchema["required"] == ["text"]
        assert "description" in tools["remember"].inputSchema["properties"]["text"]
        # AMP's amp-mcp argument names, so its users can switch.
        assert tools["amp_remember"].inputSchema["required"] == ["content", "owner_id"]
        assert set(tools["amp_recall"].inputSchema["properties"]) == {"query", "owner_id", "limit", "include_stale"}
        assert set(tools["amp_forget"].inputSchema["properties"]) == {"memory_id", "owner_id"}
        assert set(tools["amp_list_memories"].inputSchema["properties"]) == {"owner_id", "type", "limit"}


async def test_one_memory_through_every_tool_matches_what_the_service_answers(service):
    alice = unique("alice")
    async with in_process(service, alice) as mcp:
        cell = MemoryCell.model_validate(await mcp.remembered("remember", text="the user drinks green tea", importance=0.8,
                                                      metadata={"topic": "drinks"}))
        assert cell.identity.owner_id == alice and cell.identity.owner_type == "agent"
        assert cell.identity.created_by == alice and cell.scoring.importance == 0.8

        got = MemoryCell.model_validate(await mcp.ok("get_memory", id=cell.id))
        assert got.scoring.access_count == 1

        found = SearchResponse.model_validate(await mcp.ok("recall", query="green tea", owner_id=alice))
        assert [h.id for h in found.results] == [cell.id] and found.total == 1

        updated = await mcp.ok("update_memory", id=cell.id, importance=0.3, expected_version=got.lifecycle.version)
        assert updated["updated"] and updated["cell"]["scoring"]["importance"] == 0.3
        then = await mcp.ok("get_memory", id=cell.id, as_of=cell.lifecycle.created_at.isoformat())
        assert then["scoring"]["importance"] == 0.8

        new = MemoryCell.model_validate(await mcp.ok("supersede", id=cell.id, text="the user drinks black coffee"))
        assert new.lifecycle.supersedes == cell.id and new.identity.owner_id == alice

        page = ListResponse.model_validate(await mcp.ok("list_memories", owner_id=alice, limit=1, include_superseded=True))
        assert page.total == 2 and len(page.results) == 1 and page.next_cursor
        rest = ListResponse.model_validate(await mcp.ok("list_memories", owner_id=alice, limit=1,
                                                        include_superseded=True, cursor=page.next_cursor))
        assert {page.results[0].id, rest.results[0].id} == {cell.id, new.id} and rest.next_cursor is None

        # The same answers the service gives the REST routes.
        results, total, _ = service.list(alice, owner_id=alice)
        assert await mcp.ok("list_memories", owner_id=alice) == ListResponse(results=results, total=total).model_dump(mode="json")

        history = HistoryResponse.model_validate(await mcp.ok("memory_history", id=cell.id))
        assert [e.action for e in history.results] == ["create", "update", "supersede"]

        assert await mcp.ok("forget", id=new.id) == {"id": new.id, "status": "deleted"}
        assert await mcp.error("get_memory", id=new.id) == DENIED


async def test_a_forbidden_id_gives_the_same_error_as_a_missing_or_deleted_one(service):
    alice, bob = unique("alice"), unique("bob")
    async with in_process(service, alice) as a, in_process(service, bob) as b:
        private = (await a.remembered("remember", text="alice's private note"))["id"]
        gone = (await b.remembered("remember", text="bob's deleted note"))["id"]
        await b.ok("forget", id=gone)
        for cell_id in (private, gone, NO_SUCH_ID, "not-an-id"):
            assert await b.error("get_memory", id=cell_id) == DENIED
            assert await b.error("memory_history", id=cell_id) == DENIED
            assert await b.error("update_memory", id=cell_id, importance=0.1) == DENIED
            assert await b.error("forget", id=cell_id) == DENIED
            assert await b.error("supersede", id=cell_id, text="mine now") == DENIED
            with pytest.raises(McpError) as denied:
                await b.session.read_resource(f"amp://memories/{cell_id}")
            assert denied.value.error.code == -32002 and denied.value.error.data == json.loads(DENIED)
        # Nothing of alice's shows up in bob's listing or search, totals included.
        assert (await b.ok("recall", query="private note"))["total"] == 0
        assert (await b.ok("list_memories", owner_id=alice))["total"] == 0
        # ... and the session is still alive.
        assert (await a.ok("get_memory", id=private))["content"]["text"] == "alice's private note"


async def test_shared_cells_follow_the_access_policy(service):
    alice, reader, writer = unique("alice"), unique("team-reader"), unique("writer")
    async with in_process(service, alice) as a, in_process(service, reader) as r, in_process(service, writer) as w:
        cell = await a.remembered("remember", text="the deploy window is Tuesday", readable_by=["team-*"], writable_by=[writer])
        assert (await r.ok("get_memory", id=cell["id"]))["id"] == cell["id"]
        assert await r.error("update_memory", id=cell["id"], importance=0.9) == DENIED
        # A writer who may not read learns nothing from the answer.
        assert await w.ok("update_memory", id=cell["id"], importance=0.9) == {"updated": True, "cell": None}
        assert await w.error("get_memory", id=cell["id"]) == DENIED


async def test_key_scopes_apply_to_tools(service):
    owner = unique("alice")
    async with in_process(service, owner, ("read",)) as reader, in_process(service, owner, ("write",)) as writer:
        assert await reader.code("remember", text="x") == "FORBIDDEN"
        assert await reader.code("forget", id=NO_SUCH_ID) == "FORBIDDEN"
        assert (await reader.ok("recall", query="x"))["total"] == 0
        # A key without `read` gets no cell back from a write, as REST answers 204: not the new
        # one, not the existing one a duplicate repeats, not the one it updates (its agent
        # wrote it, so the access policy alone would let it read it; the key does not).
        assert await writer.ok("remember", text="written blind") == {"stored": True, "cell": None}
        assert await writer.ok("remember", text="written blind") == {"stored": True, "cell": None}
        [cell] = (await reader.ok("list_memories", owner_id=owner))["results"]
        assert cell["content"]["text"] == "written blind"
        assert await writer.ok("update_memory", id=cell["id"], importance=0.9) == {"updated": True, "cell": None}
        assert await writer.code("get_memory", id=cell["id"]) == "FORBIDDEN"
        assert await writer.code("recall", query="blind") == "FORBIDDEN"


async def test_bad_arguments_are_tool_errors_and_the_session_survives(service):
    async with in_process(service, unique("alice")) as mcp:
        assert await mcp.code("remember", text="   ") == "VALIDATION_ERROR"
        assert await mcp.code("remember", text="x", importance=2) == "VALIDATION_ERROR"
        assert await mcp.code("remember", text="x", type="dream") == "VALIDATION_ERROR"
        assert await mcp.code("remember") == "VALIDATION_ERROR"
        assert await mcp.code("recall", query="x", limit=1000) == "VALIDATION_ERROR"
        assert await mcp.code("list_memories", cursor="!!") == "VALIDATION_ERROR"
        assert await mcp.code("remember", text="x" * 70000) == "PAYLOAD_TOO_LARGE"
        assert await mcp.code("no_such_tool") == "NOT_FOUND"
        cell = await mcp.remembered("remember", text="still here")
        assert await mcp.code("update_memory", id=cell["id"], importance=0.2, expected_version=99) == "CONFLICT"
        assert (await mcp.ok("get_memory", id=cell["id"]))["content"]["text"] == "still here"


async def test_file_tools_list_read_grep_and_writes_respect_approval(service):
    """Issue 13: the memory folder over MCP. A write becomes a proposal in review mode, is
    refused with every problem when invalid, and lands in yolo mode."""
    agent, person = unique("agent"), unique("human")
    async with in_process(service, agent, ("read", "write")) as mcp, in_process(service, person) as admin:
        proposed = await mcp.ok("write_file", path="AGENTS.md", content="# Rules\n- be brief\n", reason="asked")
        assert proposed["status"] == "proposed" and "awaits a person's approval" in proposed["message"]
        assert await mcp.code("read_file", path="AGENTS.md") == "ACCESS_DENIED"  # unchanged until approved
        service.files.approve(person, proposed["proposal_id"], may_approve=True)
        read = await mcp.ok("read_file", path="/AGENTS.md")
        assert (read["content"], read["start_line"], read["total_lines"]) == ("# Rules\n- be brief\n", 1, 2)
        edited = await mcp.ok("edit_file", path="AGENTS.md", old="be brief", new="use bullets")
        assert edited["status"] == "proposed"
        assert await mcp.code("edit_file", path="AGENTS.md", old="nowhere", new="x") == "VALIDATION_ERROR"
        bad = json.loads(await mcp.error("write_file", path="skills/x/SKILL.md", content="---\nname: y\n---\nz\n"))
        assert {e["loc"] for e in bad["error"]["details"]["errors"]} == {"frontmatter.name", "frontmatter.description"}
        assert await admin.ok("ls_files", owner_id=agent) == {"owner_id": agent, "results": []}  # may not read it
        await admin.ok("write_file", path="notes.md", content="x\n", owner_id=agent)  # a proposal for a person too
        service.files.set_approval_mode("ops", ApprovalMode(owner_id=agent, approval_mode="yolo"))
        written = await mcp.ok("write_file", path="kb/glossary.md", content="AMP: agent memory protocol\n")
        assert written["status"] == "written" and written["version"] == 1
        listed = [f["path"] for f in (await mcp.ok("ls_files"))["results"]]
        assert listed == ["AGENTS.md", "kb/glossary.md", "proposals.md"]
        grep = await mcp.ok("grep_files", pattern="AMP")
        assert [(m["path"], m["line"]) for m in grep["matches"]] == [("kb/glossary.md", 1)]
        assert [f["path"] for f in (await mcp.ok("ls_files", glob="kb/**"))["results"]] == ["kb/glossary.md"]


async def test_amp_mcp_names_work_as_aliases(service):
    user = unique("user")
    async with in_process(service, unique("agent")) as mcp:
        cell = await mcp.remembered("amp_remember", content="prefers metric units", owner_id=user, type="semantic", importance=0.7)
        assert cell["identity"]["owner_id"] == user and cell["identity"]["owner_type"] == "user"
        found = await mcp.ok("amp_recall", query="metric units", owner_id=user, limit=5)
        assert [h["id"] for h in found["results"]] == [cell["id"]]
        listed = await mcp.ok("amp_list_memories", owner_id=user, type="semantic")
        assert [c["id"] for c in listed["results"]] == [cell["id"]]
        assert await mcp.ok("amp_forget", memory_id=cell["id"], owner_id=user) == {"id": cell["id"], "status": "deleted"}
        assert (await mcp.ok("amp_list_memories", owner_id=user))["total"] == 0


async def test_cells_are_resources_and_remember_is_a_prompt(service):
    async with in_process(service, unique("alice")) as mcp:
        cell = await mcp.remembered("remember", text="the office is in Lyon")
        templates = {t.uriTemplate for t in (await mcp.session.list_resource_templates()).resourceTemplates}
        assert templates == {"amp://memories/{id}", "amp://memories/{id}/history"}
        (content,) = (await mcp.session.read_resource(f"amp://memories/{cell['id']}")).contents
        assert content.mimeType == "application/json"
        assert MemoryCell.model_validate_json(content.text).content.text == "the office is in Lyon"
        (history,) = (await mcp.session.read_resource(f"amp://memories/{cell['id']}/history")).contents
        assert [e.action for e in HistoryResponse.model_validate_json(history.text).results] == ["create"]

        (prompt,) = (await mcp.session.list_prompts()).prompts
        assert prompt.name == "remember" and {a.name for a in prompt.arguments} == {"focus", "owner_id"}
        message = (await mcp.session.get_prompt("remember", {"focus": "travel plans"})).messages[0]
        assert message.role == "user"
        assert "travel plans" in message.content.text and "`remember`" in message.content.text
        assert "`supersede`" in message.content.text


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    from support import AppServer

    tmp = tmp_path_factory.mktemp("mcp-auth")
    url = f"sqlite:///{tmp}/auth.db"
    store = store_from_url(url)
    store.open()
    keys = {name: create_key(store, agent, scopes).token
            for name, agent, scopes in (("alice", "alice", "read,write"), ("bob", "bob", "read,write"),
                                        ("alice-reader", "alice", "read"))}
    store.close()
    with AppServer(url, args=["--auth"], log_path=tmp / "server.log") as srv:
        yield srv, keys


async def test_playbook_outcomes_and_consolidation_are_tools(service, tmp_path):
    from fake_llm import FakeModel, extraction

    owner = unique("alice")
    async with in_process(service, owner) as mcp:
        playbook = await mcp.remembered("remember", text="To deploy: run the tests, then tag the release.", type="procedural")
        assert (await mcp.ok("record_outcome", id=playbook["id"], success=True))["cell"]["scoring"]["success_count"] == 1
        failed = await mcp.ok("record_outcome", id=playbook["id"], success=False, note="tagging failed")
        assert failed["cell"]["scoring"]["failure_count"] == 1
        assert (await mcp.ok("memory_history", id=playbook["id"]))["results"][-1]["changes"]["note"] == "tagging failed"
        fact = await mcp.remembered("remember", text="a plain fact")
        assert await mcp.code("record_outcome", id=fact["id"], success=True) == "VALIDATION_ERROR"
        assert await mcp.error("record_outcome", id=NO_SUCH_ID, success=True) == DENIED
        assert await mcp.code("consolidate") == "NOT_CONFIGURED"  # this service has no model
    async with in_process(service, owner, ("write",)) as writer:  # consolidation reads too
        assert await writer.code("consolidate") == "FORBIDDEN"

    fake = FakeModel().start()
    try:
        fake.on("extract", "I moved to Porto", reply=extraction(("The user lives in Porto.", "fact", ["I moved to Porto"])))
        learning = build_service(Settings(store=f"sqlite:///{tmp_path}/learn.db", embedder="none",
                                          llm_url=fake.url, llm_model="fake-1"))
        learning.store.open()
        async with in_process(learning, "assistant") as mcp:
            await mcp.remembered("remember", text="I moved to Porto last week.", type="episodic", owner_id="u1", session_id="s1")
            run = await mcp.ok("consolidate", owner_id="u1", session_id="s1")
            assert run["episodes"] == 1 and len(run["written"]) == 1
            assert [d["action"] for d in run["decisions"]] == ["ADD"]
            found = await mcp.ok("recall", query="Porto", owner_id="u1", types=["semantic"])
            assert [h["id"] for h in found["results"]] == run["written"]
        learning.store.close()
    finally:
        fake.stop()


# ---------------------------------------------------------------- non-interference


async def _mcp_answers(service, probe_ids: list[str]) -> list:
    """Everything `eve` receives from the MCP read tools and resources, as text (errors too)."""
    out: list = []
    async with in_process(service, "eve") as mcp:
        async def tool(name: str, **args: Any) -> None:
            result = await mcp.session.call_tool(name, args)
            out.append((name, result.isError, result.content[0].text))

        for cell_id in probe_ids:
            await tool("get_memory", id=cell_id)
            await tool("memory_history", id=cell_id)
            for uri in (f"amp://memories/{cell_id}", f"amp://memories/{cell_id}/history"):
                try:
                    out.append(("resource", (await mcp.session.read_resource(uri)).contents[0].text))
                except McpError as exc:
                    out.append(("resource", exc.error.code, exc.error.message, exc.error.data))
        for owner in (None, "mallory", "bob", "eve"):
            for status in (None, ["active", "archived"]):
                await tool("list_memories", **_args(owner_id=owner, status=status, limit=3))
            for query in ("tea", "Rome jazz", "coffee 5"):
                await tool("recall", **_args(query=query, owner_id=owner, limit=5, include_stale=True))
        for owner in ("mallory", "bob"):
            await tool("amp_recall", query="tea coffee", owner_id=owner)
            await tool("amp_list_memories", owner_id=owner)
        for minute in (3, 12, 23):  # reads of the past
            at = (T0 + timedelta(minutes=minute, seconds=30)).isoformat()
            for cell_id in probe_ids[::3]:
                await tool("get_memory", id=cell_id, as_of=at)
            await tool("list_memories", as_of=at, limit=5)
            await tool("recall", query="tea Rome", as_of=at, include_stale=True)
    return out


def _args(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


@pytest.mark.parametrize("seed", [1, 2])
async def test_mcp_read_tools_do_not_depend_on_cells_the_caller_cannot_read(tmp_path, monkeypatch, seed):
    # The worlds of the as-of differential test: the same operations on the cells eve may
    # read; the noisy one also has cells she cannot read now (private, revoked, deleted).
    plain = _world(tmp_path, "plain", seed, False, monkeypatch)
    noisy = _world(tmp_path, "noisy", seed, True, monkeypatch)
    probes = [f"mem_{i:026d}" for i in range(1, 12)] + noisy.hidden_ids[:6] + ["mem_00000000000000000000000099"]
    answers = await _mcp_answers(plain, probes)
    assert answers == await _mcp_answers(noisy, probes)
    # ... and the comparison is not vacuous: most reads, of the present and the past, answer.
    outcomes = [a[1] for a in answers if a[0] != "resource"]
    assert outcomes.count(False) > outcomes.count(True)
    plain.store.close()
    noisy.store.close()


# ---------------------------------------------------------------- stdio: a real `ampkit mcp` process


async def test_stdio_on_a_store_file_writes_what_every_client_reads(tmp_path):
    url = f"sqlite:///{tmp_path}/stdio.db"
    async with over_stdio("--store", url, "--agent-id", "alice") as mcp:
        cell = await mcp.remembered("remember", text="the user is vegetarian", readable_by=["planner"])
        assert await mcp.error("get_memory", id=NO_SUCH_ID) == DENIED
        assert [h["id"] for h in (await mcp.ok("recall", query="vegetarian"))["results"]] == [cell["id"]]
    with ampkit.connect(url, agent_id="planner") as planner, ampkit.connect(url, agent_id="stranger") as stranger:
        assert planner.get(cell["id"]).identity.created_by == "alice"
        assert stranger.search("vegetarian") == []


async def test_stdio_through_a_server_acts_as_the_api_key(auth_server):
    srv, keys = auth_server
    async with over_stdio("--url", srv.base_url, env={"AMPKIT_API_KEY": keys["alice"]}) as mcp:
        cell = await mcp.remembered("remember", text="ship on Fridays", owner_id="team")
        assert cell["identity"]["created_by"] == "alice"
        assert await mcp.error("get_memory", id=NO_SUCH_ID) == DENIED
    # A key used on the store file in process: the same identity and scopes.
    async with over_stdio("--store", srv.store_url, env={"AMPKIT_API_KEY": keys["alice-reader"]}) as mcp:
        assert (await mcp.ok("get_memory", id=cell["id"]))["identity"]["created_by"] == "alice"
        assert await mcp.code("remember", text="x", owner_id="team") == "FORBIDDEN"


# ---------------------------------------------------------------- streamable HTTP: a real server with --auth


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_http_two_keys_see_two_memories(auth_server):
    srv, keys = auth_server
    url = mcp_url(srv)
    async with over_http(url, bearer(keys["alice"])) as alice, over_http(url, bearer(keys["bob"])) as bob:
        mine, theirs = unique("heron"), unique("osprey")
        a = await alice.remembered("remember", text="alice's project is called Heron", owner_id=mine)
        b = await bob.remembered("remember", text="bob's project is called Osprey", owner_id=theirs)
        assert a["identity"]["created_by"] == "alice" and b["identity"]["created_by"] == "bob"
        for who, own, other, cell, hidden in ((alice, mine, theirs, a, b), (bob, theirs, mine, b, a)):
            assert [c["id"] for c in (await who.ok("list_memories", owner_id=own))["results"]] == [cell["id"]]
            assert (await who.ok("list_memories", owner_id=other))["total"] == 0
            found = [h["id"] for h in (await who.ok("recall", query="project called Heron Osprey"))["results"]]
            assert found[0] == cell["id"] and hidden["id"] not in found
        # Bob asking for alice's cell: the very error a missing id gives.
        assert await bob.error("get_memory", id=a["id"]) == await bob.error("get_memory", id=NO_SUCH_ID) == DENIED
        assert await bob.error("forget", id=a["id"]) == DENIED
    # The REST API and MCP are one memory: alice's REST client sees the MCP cell.
    with ampkit.connect(srv.base_url, api_key=keys["alice"]) as rest:
        assert rest.get(a["id"]).content.text == "alice's project is called Heron"
    async with over_http(url, bearer(keys["alice-reader"])) as reader:
        assert await reader.code("remember", text="x") == "FORBIDDEN"
        assert (await reader.ok("get_memory", id=a["id"]))["id"] == a["id"]


async def test_http_identity_is_checked_before_mcp_like_rest(auth_server):
    srv, keys = auth_server
    url = mcp_url(srv)
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    accept = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(timeout=30, verify=TLS) as http:
        for headers in ({}, bearer("ampk_0000000000000000_" + "x" * 43), {"X-AMP-Agent-ID": "alice"}):
            answer = await http.post(url, json=message, headers={**accept, **headers})
            assert answer.status_code == 401 and answer.json()["error"]["code"] == "UNAUTHORIZED"
            assert answer.headers["WWW-Authenticate"].startswith("Bearer")
        mismatch = await http.post(url, json=message, headers={**accept, **bearer(keys["alice"]), "X-AMP-Agent-ID": "bob"})
        assert mismatch.status_code == 403 and mismatch.json()["error"]["code"] == "FORBIDDEN"
        spec = (await http.get(f"{srv.base_url}/spec")).json()["capabilities"]
        assert spec["mcp_compatible"] and spec["mcp"]["path"] == "/mcp"


async def test_http_with_auth_off_takes_the_agent_header(server):
    url = mcp_url(server)
    agent = unique("agent")
    async with over_http(url, {"X-AMP-Agent-ID": agent}) as mcp:
        cell = await mcp.remembered("remember", text="header identity works")
        assert cell["identity"]["created_by"] == agent
    async with httpx.AsyncClient(timeout=30, verify=TLS) as http:
        answer = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                 headers={"Accept": "application/json, text/event-stream"})
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "MISSING_AGENT_ID"


async def test_server_info_names_ampkit_and_its_version(server):
    """What an MCP client shows as the server: ampkit's name and version, not the SDK's."""
    async with httpx.AsyncClient(headers={"X-AMP-Agent-ID": unique("agent")}, timeout=30, verify=TLS) as http:
        async with streamable_http_client(mcp_url(server), http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                info = (await session.initialize()).serverInfo
    assert (info.name, info.version) == ("ampkit", ampkit.__version__)
    assert ampkit.__version__ != "0+unknown"


async def test_recall_abstains_below_min_score_and_leaves_files_out_unless_asked(server):
    """Issue 43 over MCP on a real server: `min_score` drops the hits below it (total 0 when
    nothing clears it) and memory files join `recall` only with `include_files`."""
    agent = unique("agent")
    async with over_http(mcp_url(server), {"X-AMP-Agent-ID": agent}) as mcp:
        note = await mcp.remembered("remember", text="the kettle needs descaling")
        async with httpx.AsyncClient(timeout=30, verify=TLS) as http:  # the folder to yolo, as its owner
            await http.put(f"{server.base_url}/files/mode", json={"owner_id": agent, "approval_mode": "yolo"},
                           headers={"X-AMP-Agent-ID": agent})
        assert (await mcp.ok("write_file", path="kb/kettles.md", content="# Kettles\nDescale the kettle monthly.\n"))["status"] == "written"
        plain = await mcp.ok("recall", query="descale kettle")
        assert [h["id"] for h in plain["results"]] == [note["id"]] and plain["total"] == 1
        files = await mcp.ok("recall", query="descale kettle", include_files=True)
        assert sorted(h["identity"]["path"] or "" for h in files["results"]) == ["", "kb/kettles.md"] and files["total"] == 2
        assert await mcp.ok("recall", query="descale kettle", min_score=1.0) == {"results": [], "total": 0, "query": "descale kettle"}
        assert await mcp.code("recall", query="descale kettle", min_score=2) == "VALIDATION_ERROR"


async def test_mcp_over_http_can_be_switched_off(tmp_path):
    for enabled, status in ((False, 404), (True, 401)):
        app = create_app(Settings(store=f"sqlite:///{tmp_path}/off.db", embedder="none", mcp_http=enabled))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
                answer = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
                assert answer.status_code == status
                if enabled:  # stateless: nothing to GET (no stream) or DELETE (no session)
                    for method in ("GET", "DELETE"):
                        refused = await http.request(method, "/mcp", headers={"X-AMP-Agent-ID": "a"})
                        assert refused.status_code == 405 and refused.headers["Allow"] == "POST"
                        assert refused.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
                assert (await http.get("/amp/v1/spec")).json()["capabilities"]["mcp_compatible"] is enabled


def test_mcp_over_http_loads_on_its_first_request_and_serves_every_lifespan(tmp_path):
    """The server starts without the `mcp` package (~0.5-1 s of imports at every start, see
    bench/startup.py); /mcp's first POST loads it, and an app served again (a second lifespan)
    starts a new session manager. In a fresh interpreter, so no other test has imported it."""
    script = f"""
import asyncio, sys, httpx
from ampkit.config import Settings
from ampkit.server.app import create_app

async def main():
    app = create_app(Settings(store="sqlite:///{tmp_path}/lazy.db", embedder="none"))
    for round in (1, 2):
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
                assert (await http.get("/amp/v1/health")).status_code == 200
                assert (await http.get("/mcp", headers={{"X-AMP-Agent-ID": "a"}})).status_code == 405
                assert (await http.post("/mcp", json={{}})).status_code == 401  # identity first
                print(round, "before", "mcp" in sys.modules)
                answer = await http.post("/mcp", json={{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}},
                                         headers={{"X-AMP-Agent-ID": "a", "Accept": "application/json, text/event-stream"}})
                tools = [t["name"] for t in answer.json()["result"]["tools"]]
                print(round, "after", "mcp" in sys.modules, answer.status_code, "recall" in tools)

asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:4] == ["1 before False", "1 after True 200 True", "2 before True", "2 after True 200 True"]


# ---------------------------------------------------------------- one memory with the framework adapters


async def test_a_cell_written_through_mcp_reaches_langchain_and_autogen_and_back(server):
    from ampkit.adapters import Sharing
    from ampkit.adapters import autogen as ag
    from ampkit.adapters import langchain as lc

    user = unique("user")
    mcp_agent, lc_agent, ag_agent = unique("team-mcp"), unique("team-langchain"), unique("team-autogen")
    async with over_http(mcp_url(server), {"X-AMP-Agent-ID": mcp_agent}) as mcp:
        cell = await mcp.remembered("remember", text="the user is allergic to peanuts", owner_id=user, readable_by=["team-*"])

        # LangChain's recall tool and AutoGen's memory find what the MCP client stored.
        with ampkit.connect(server.base_url, agent_id=lc_agent) as lc_client:
            remember_tool, recall_tool = lc.memory_tools(lc_client, owner_id=user, sharing=Sharing(readable_by=["team-*"]))
            assert "the user is allergic to peanuts" in await recall_tool.ainvoke({"query": "peanut allergy"})
            # ... and the reverse: what LangChain remembers, the MCP client recalls.
            await remember_tool.ainvoke({"fact": "the user's favourite cuisine is Thai"})
        ag_memory = ag.AmpkitAutoGenMemory(ampkit.aconnect(server.base_url, agent_id=ag_agent), owner_id=user,
                                    sharing=Sharing(readable_by=["team-*"]))
        try:
            found = await ag_memory.query("peanut allergy")
            assert [r.metadata["id"] for r in found.results][0] == cell["id"]
            from autogen_core.memory import MemoryContent, MemoryMimeType

            await ag_memory.add(MemoryContent(content="the user runs every morning", mime_type=MemoryMimeType.TEXT))
        finally:
            await ag_memory.close()

        recalled = await mcp.ok("recall", query="Thai cuisine running morning", owner_id=user)
        by_text = {h["content"]["text"]: h["identity"]["created_by"] for h in recalled["results"]}
        assert by_text["the user's favourite cuisine is Thai"] == lc_agent
        assert by_text["the user runs every morning"] == ag_agent
    # An agent outside the team sees none of it through MCP either.
    async with over_http(mcp_url(server), {"X-AMP-Agent-ID": unique("outsider")}) as outsider:
        assert (await outsider.ok("recall", query="peanuts Thai morning", owner_id=user))["total"] == 0


# ---------------------------------------------------------------- issue 42, item 8: non-finite numbers
# Python's JSON decoder (the SDK's, over both transports) accepts NaN, Infinity and 1e999, and
# the SDK re-encoded requests before a tool ran, so they arrived as null (metadata) or not at
# all (a default importance). MCP clients built on the SDK turn them into null themselves, so
# these send raw JSON-RPC.
NON_FINITE_ARGUMENTS = [
    ("remember", '{"text": "nan metadata", "metadata": {"k": NaN}}'),
    ("remember", '{"text": "inf in a list", "metadata": {"k": [1, Infinity]}}'),
    ("remember", '{"text": "overflow", "metadata": {"k": 1e999}}'),
    ("remember", '{"text": "nan importance", "importance": NaN}'),
    ("remember", '{"text": "inf importance", "importance": -Infinity}'),
    ("update_memory", '{"id": "%s", "metadata": {"k": NaN}}'),
    ("update_memory", '{"id": "%s", "confidence": Infinity}'),
]


def _tool_call(name: str, arguments: str) -> str:
    return '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "%s", "arguments": %s}}' % (
        name, arguments)


def _assert_refused_as_422(answer: dict) -> None:
    assert answer["id"] == 7 and answer["result"]["isError"] is True, answer
    envelope = json.loads(answer["result"]["content"][0]["text"])
    assert envelope["error"]["code"] == "VALIDATION_ERROR" and "finite" in envelope["error"]["message"], envelope
    assert answer["result"]["structuredContent"] == envelope


def test_non_finite_numbers_are_a_tool_error_over_http_and_nothing_changes(server):
    url, agent = mcp_url(server), f"nan-{uuid.uuid4().hex[:8]}"
    headers = {"X-AMP-Agent-ID": agent, "Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    with httpx.Client(verify=TLS, timeout=30) as http:
        kept = http.post(f"{server.base_url}/memories", headers={"X-AMP-Agent-ID": agent},
                         json={"content": {"text": "kept as it is", "metadata": {"k": 1}}, "identity": {"owner_id": agent}})
        assert kept.status_code == 201
        cell = kept.json()
        for name, arguments in NON_FINITE_ARGUMENTS:
            answer = http.post(url, headers=headers, content=_tool_call(name, arguments.replace("%s", cell["id"])))
            assert answer.status_code == 200, answer.text
            _assert_refused_as_422(answer.json())
        listed = http.get(f"{server.base_url}/memories", params={"owner_id": agent}, headers={"X-AMP-Agent-ID": agent}).json()
        assert [c["id"] for c in listed["results"]] == [cell["id"]]
        assert listed["results"][0]["content"]["metadata"] == {"k": 1} and listed["results"][0]["lifecycle"]["version"] == 1
        # the same arguments, finite, are stored
        fine = http.post(url, headers=headers, content=_tool_call("remember", '{"text": "fine", "metadata": {"k": 1.5}}'))
        assert fine.json()["result"]["isError"] is False


@pytest.mark.slow
def test_non_finite_numbers_are_a_tool_error_over_stdio(tmp_path):
    """`ampkit mcp` (stdio) answers the same, then serves the next request."""
    store = f"sqlite:///{tmp_path}/stdio.db"
    lines = [
        '{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", '
        '"capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}',
        '{"jsonrpc": "2.0", "method": "notifications/initialized"}',
        _tool_call("remember", NON_FINITE_ARGUMENTS[0][1]),
        _tool_call("remember", NON_FINITE_ARGUMENTS[3][1]),
        '{"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "remember", "arguments": {"text": "fine"}}}',
    ]
    proc = subprocess.Popen([sys.executable, "-m", "ampkit.cli", "mcp", "--store", store, "--agent-id", "alice"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "AMPKIT_EMBEDDER": "none"})
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("\n".join(lines) + "\n")
        proc.stdin.flush()
        answers: dict[int, dict] = {}
        while 8 not in answers:  # (stdin stays open until the last answer: EOF ends the server)
            line = proc.stdout.readline()
            assert line, f"the server ended before answering: {answers}"
            answer = json.loads(line)
            answers[answer.get("id")] = answer
    finally:
        proc.kill()
        proc.wait()
    _assert_refused_as_422(answers[7])
    assert answers[8]["result"]["isError"] is False
    assert answers[8]["result"]["structuredContent"]["cell"]["content"]["text"] == "fine"
