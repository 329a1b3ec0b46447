"""Non-interference, as a differential property (issue 10).

For a random world (agents, owners, sessions, cells with random access policies) and a random
caller, every read path's answer must be byte-identical whether or not cells the caller cannot
read exist, are created, changed, deleted or purged around it. Two stores are built in lockstep
with the same ids and the same (injected) clock: `plain` holds the world, `noisy` holds the world
plus noise written by an agent the caller can never read (in the same owners and sessions, with
the same words). Each read path renders the caller's answer as canonical JSON bytes (results,
scores, totals, errors); the two must be equal. Runs on SQLite and PostgreSQL.

Adding a surface (files, MCP, as-of reads, consolidation...): append a `ReadPath` to
`READ_PATHS`. Its `render(service, caller, world)` returns the bytes of every answer the
caller can get from that surface for this world (use `answer()` to turn a result or an
APIError into bytes, and `world.owners` / `world.visible_ids` / `world.noise_ids` to choose
what to ask). Nothing else changes: the property then covers it on both stores. A path that
searches (reaches the store's `keyword_candidates`) says `keyword=True`: the `sqlite` run, which
differs from `sqlite-wide` in the keyword leg's scan and the retriever's legs, renders just
those paths (the test fails when an unmarked path reaches the keyword leg).
"""

from __future__ import annotations

import json
import re
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ampkit.service_base as service_module  # where cell ids are made
from ampkit.bootstrap import connect_embedding
from ampkit.errors import APIError
from ampkit.models import CellCreate, CellPatch, SearchRequest
from ampkit.retrieval import RetrievalConfig, Retriever
from ampkit.service import MemoryService
from ampkit.store import store_from_url
from ampkit.store.base import CellFilter
from support import examples

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)
AGENTS = ["alice", "bob", "carol", "team-1"]
NOISE_AGENT = "mallory"  # never the caller, never named by a visible cell's policy
OWNERS = ["alice", "bob", "ada"]
SESSIONS = [None, "chat-1", "chat-2"]
SESSION_DATES = {"chat-1": "8 May, 2023", "chat-2": "9 May, 2023"}
WORDS = ["vault", "code", "tea", "river", "4812", "green", "blue", "oak", "강아지를"]
PATTERNS = ["alice", "bob", "carol", "team-*", "*", "b?b", "[ab]*"]


# ---------------------------------------------------------------- the world
@dataclass
class CellSpec:
    creator: str
    owner: str
    session: Optional[str]
    words: list[str]
    readable_by: list[str]
    public: bool
    archived: bool
    episodic: bool = False
    writable_by: list[str] = field(default_factory=list)
    granted_later: bool = False  # created private with another text, its policy given by a later PATCH


@dataclass
class NoiseSpec:
    owner: str
    session: Optional[str]
    words: list[str]
    then: str  # "keep" | "patch" | "delete" | "purge"
    episodic: bool = False


words = st.lists(st.sampled_from(WORDS), min_size=1, max_size=4)
cell_specs = st.builds(
    CellSpec, creator=st.sampled_from(AGENTS), owner=st.sampled_from(OWNERS), session=st.sampled_from(SESSIONS),
    words=words, readable_by=st.lists(st.sampled_from(PATTERNS), max_size=2), public=st.booleans(),
    archived=st.booleans(), episodic=st.booleans(), writable_by=st.lists(st.sampled_from(PATTERNS), max_size=1),
    granted_later=st.booleans(),
)
noise_specs = st.builds(
    NoiseSpec, owner=st.sampled_from(OWNERS), session=st.sampled_from(SESSIONS), words=words,
    then=st.sampled_from(["keep", "patch", "delete", "purge"]), episodic=st.booleans(),
)


@dataclass
class World:
    caller: str
    owners: list[Optional[str]] = field(default_factory=lambda: [None, *OWNERS])
    visible_ids: list[str] = field(default_factory=list)  # every world cell (readable or not)
    noise_ids: list[str] = field(default_factory=list)
    noise_texts: list[str] = field(default_factory=list)  # what the noise says (known in both stores)
    query_words: list[str] = field(default_factory=lambda: list(WORDS))
    file_paths: list[str] = field(default_factory=list)  # memory files (issue 11), world and noise
    proposal_ids: list[str] = field(default_factory=list)


class FixedIds:
    """Deterministic cell ids, so that both stores give a world cell the same id. World cells
    and noise cells draw from two interleaved sequences (noise ids sort between world ids)."""

    def __init__(self) -> None:
        self.next: Optional[str] = None

    def __call__(self) -> str:
        assert self.next is not None
        value, self.next = self.next, None
        return value


def cell_id(n: int, noise: bool) -> str:
    return "mem_" + f"{2 * n + (1 if noise else 0):026d}"


# ---------------------------------------------------------------- rendering answers
def answer(fn: Callable[[], Any]) -> bytes:
    """A read's answer as canonical bytes: the body a route would send, or the error envelope."""
    try:
        result = fn()
    except APIError as exc:
        return json.dumps({"status": exc.status, **exc.envelope()}, sort_keys=True).encode()
    return json.dumps(_jsonable(result), sort_keys=True).encode()


def _jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def _paged(fetch: Callable[[Optional[str]], Any]) -> Iterator[bytes]:
    """Every page `fetch(cursor)` answers, following the next cursor (at most 50 pages). A list
    answers (cells, total, next_cursor); other pages carry `next_cursor`."""
    cursor = None
    for _ in range(50):
        page = answer(lambda: fetch(cursor))
        yield page
        body = json.loads(page)
        cursor = body[2] if isinstance(body, list) else body.get("next_cursor")
        if not cursor:
            return


def _pages(service: MemoryService, caller: str, owner: Optional[str], size: int,
           as_of: Optional[datetime] = None) -> Iterator[bytes]:
    return _paged(lambda cursor: service.list(caller, owner_id=owner, status=["active", "archived"], limit=size,
                                              cursor=cursor, include_superseded=True, as_of=as_of))


@dataclass(frozen=True)
class ReadPath:
    name: str
    render: Callable[[MemoryService, str, World], Iterator[bytes]]
    keyword: bool = False  # reaches the store's keyword leg (searches): see `store_urls`


def _get(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    # Noise ids are asked too: in `plain` they do not exist, in `noisy` they are unreadable;
    # both must answer the same bytes.
    for cid in world.visible_ids + world.noise_ids:
        yield answer(lambda: service.get(caller, cid))


def _history(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    for cid in world.visible_ids + world.noise_ids:
        yield answer(lambda: service.history(caller, cid))


def _list(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    for owner in world.owners:
        for size in (2, 100):
            yield from _pages(service, caller, owner, size)


def _search(explain: bool) -> Callable[[MemoryService, str, World], Iterator[bytes]]:
    def render(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
        for owner in world.owners:
            for word in world.query_words:
                req = SearchRequest(query=word, owner_id=owner, explain=explain, limit=20,
                                    status=["active", "archived"])
                yield answer(lambda: service.search(caller, req))
    return render


def _search_abstaining(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    """A threshold and memory files: which hits clear `min_score`, and the total that counts
    them, must come from readable cells only (relevance is normalised to the best of those)."""
    for owner in world.owners:
        for word in world.query_words:
            for min_score in (0.5, 0.8):
                req = SearchRequest(query=word, owner_id=owner, explain=True, limit=3, status=["active", "archived"],
                                    min_score=min_score, include_files=True)
                yield answer(lambda: service.search(caller, req))


def _search_dated(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    """Queries naming a session's day or month: the date-session leg searches again within
    the sessions of the loaded candidates of that date, which must be the caller's to read,
    as must the cells that search finds and its statistics."""
    for owner in world.owners:
        for word in world.query_words:
            for when in ("on 8 May, 2023", "in May 2023"):
                req = SearchRequest(query=f"{word} {when}", owner_id=owner, explain=True, limit=5,
                                    status=["active", "archived"])
                yield answer(lambda: service.search(caller, req))


def _search_feedback(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    """Search with pseudo-relevance feedback on: the second query is built from first hits,
    so an unreadable neighbour of a hit must lend it no words."""
    feedback = replace(service, retriever=Retriever(config=RetrievalConfig(prf_docs=3, prf_terms=4)))
    yield from _search(explain=True)(feedback, caller, world)


class _RelatedWords:
    """A fake vocabulary for the related-words leg: each word's related words are its
    neighbours in WORDS, so the second keyword query finds other cells than the first."""

    def expand(self, words: list[str]) -> list[str]:
        return [WORDS[(WORDS.index(w) + 1) % len(WORDS)] for w in words if w in WORDS]


def _search_related(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    """Search with the related-words leg, both keyword queries in one store call (the SQLite
    scan reads the windows once for both): its statistics too come from readable cells only."""
    related = replace(service, retriever=Retriever(related_words=_RelatedWords(), config=RetrievalConfig(related_weight=0.6)))
    yield from _search(explain=True)(related, caller, world)


def _export(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    for owner in world.owners:
        yield answer(lambda: service.export(caller, owner_id=owner))


READ_PATHS: list[ReadPath] = [
    ReadPath("get", _get),
    ReadPath("history", _history),
    ReadPath("list", _list),
    ReadPath("search", _search(explain=False), keyword=True),
    ReadPath("search_explain", _search(explain=True), keyword=True),
    ReadPath("search_dated", _search_dated, keyword=True),
    ReadPath("search_abstaining", _search_abstaining, keyword=True),
    ReadPath("search_feedback", _search_feedback, keyword=True),
    ReadPath("search_related", _search_related, keyword=True),
    ReadPath("export", _export),
]


# As-of reads (issue 16): the cell or set as it was at T, before the world (nothing), at its
# instant (everything) and after it. As-of search ranks from the as-of texts of readable
# cells only, so it is not waiting for the store fix.
AS_OF_TIMES = (NOW - timedelta(seconds=1), NOW, NOW + timedelta(days=1))


def _as_of_get(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    for at in AS_OF_TIMES:
        for cid in world.visible_ids + world.noise_ids:
            yield answer(lambda: service.get(caller, cid, as_of=at))


def _as_of_list(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    for at in AS_OF_TIMES:
        for owner in world.owners:
            yield from _pages(service, caller, owner, 2, as_of=at)


def _as_of_search(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    for at in AS_OF_TIMES:
        for owner in world.owners:
            for word in world.query_words:
                req = SearchRequest(query=word, owner_id=owner, explain=True, limit=20,
                                    status=["active", "archived"], as_of=at)
                yield answer(lambda: service.search(caller, req))


READ_PATHS += [
    ReadPath("as_of_get", _as_of_get),
    ReadPath("as_of_list", _as_of_list),
    ReadPath("as_of_search", _as_of_search),
]

# Pins (PUT/DELETE /memories/{id}/pin): a pinned cell is in its owner's searches, first, for
# callers that may read it. The noise agent pins every noise cell; the caller pins every id
# (unreadable and missing ids answer alike) and searches, with few places and many, for each
# owner and for itself (no owner: its own pinned cells), then unpins.
def _pin_search(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    for cid in world.noise_ids:
        try:
            service.set_pinned(NOISE_AGENT, cid, True)
        except APIError:
            pass  # deleted or purged noise
    for cid in world.visible_ids + world.noise_ids:
        yield answer(lambda: service.set_pinned(caller, cid, True))
    for owner in world.owners:
        for word in world.query_words[:3]:
            for limit in (1, 3, 20):
                req = SearchRequest(query=word, owner_id=owner, explain=True, limit=limit,
                                    status=["active", "archived"])
                yield answer(lambda: service.search(caller, req))
    for cid in world.visible_ids + world.noise_ids:
        yield answer(lambda: service.set_pinned(caller, cid, False))


READ_PATHS += [ReadPath("pin_search", _pin_search, keyword=True)]

# MCP (issue 13): the read tools and the cell resources, called on one MCP server (built once:
# its gateway is pointed at each world's service and caller). The in-process, stdio and HTTP
# transports are tested in test_mcp.py; here it is what the tools answer.
_MCP: dict[str, Any] = {}


def _mcp_server() -> tuple[Any, Any]:
    from ampkit.mcp_server import ServiceGateway, build_mcp_server

    if not _MCP:
        gateway = ServiceGateway(None, lambda ctx: None)  # type: ignore[arg-type]
        _MCP.update(gateway=gateway, server=build_mcp_server(gateway))
    return _MCP["server"], _MCP["gateway"]


def _mcp_render(calls: Callable[[Any], Any]) -> Callable[[MemoryService, str, World], Iterator[bytes]]:
    """A read path from `calls(ask)`: an async function asking the tools through `ask`."""
    def render(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
        import anyio

        from ampkit.mcp_server import fixed_caller
        from ampkit.server.identity import Caller

        server, gateway = _mcp_server()
        gateway.service, gateway.caller_for = service, fixed_caller(Caller(caller))
        out: list[bytes] = []

        async def ask(name: str, **args: Any) -> dict[str, Any]:
            if name == "resource":
                from mcp.shared.exceptions import McpError

                try:
                    body: Any = [c.content for c in await server.read_resource(args["uri"])]
                except McpError as exc:
                    body = {"code": exc.error.code, "message": exc.error.message, "data": exc.error.data}
                out.append(json.dumps(body, sort_keys=True).encode())
                return {}
            result = await server.call_tool(name, {k: v for k, v in args.items() if v is not None})
            out.append(json.dumps({"isError": result.isError, "text": result.content[0].text}).encode())
            return result.structuredContent or {}

        anyio.run(calls, ask, world)
        return iter(out)
    return render


async def _mcp_ids(ask: Any, world: World) -> None:
    for cid in world.visible_ids + world.noise_ids:
        await ask("get_memory", id=cid)
        await ask("memory_history", id=cid)
        await ask("resource", uri=f"amp://memories/{cid}")
        await ask("resource", uri=f"amp://memories/{cid}/history")
        for at in AS_OF_TIMES:
            await ask("get_memory", id=cid, as_of=at.isoformat())


async def _mcp_lists(ask: Any, world: World) -> None:
    for owner in world.owners:
        for as_of in (None, *AS_OF_TIMES):
            cursor = None
            for _ in range(50):
                page = await ask("list_memories", owner_id=owner, status=["active", "archived"], limit=2,
                                 include_superseded=True, cursor=cursor, as_of=as_of and as_of.isoformat())
                cursor = page.get("next_cursor")
                if not cursor:
                    break
        if owner is not None:
            await ask("amp_list_memories", owner_id=owner)


async def _mcp_recall(ask: Any, world: World) -> None:
    for owner in world.owners:
        for word in world.query_words:
            await ask("recall", query=word, owner_id=owner, limit=20, include_stale=True)
            if owner is not None:
                await ask("amp_recall", query=word, owner_id=owner, limit=20)
            await ask("recall", query=word, owner_id=owner, limit=20, as_of=AS_OF_TIMES[-1].isoformat())
            await ask("recall", query=word, owner_id=owner, limit=3, min_score=0.8, include_files=True)


async def _mcp_files(ask: Any, world: World) -> None:
    for owner in OWNERS:
        await ask("ls_files", owner_id=owner)
        for path in world.file_paths + ["proposals.md", "sessions/chat-1.md"]:
            await ask("read_file", owner_id=owner, path=path)
        for word in world.query_words:
            await ask("grep_files", owner_id=owner, pattern=word)


READ_PATHS += [
    ReadPath("mcp_files", _mcp_render(_mcp_files)),
    ReadPath("mcp_get_history_resources", _mcp_render(_mcp_ids)),
    ReadPath("mcp_list", _mcp_render(_mcp_lists)),
    ReadPath("mcp_recall", _mcp_render(_mcp_recall), keyword=True),
]

# Learning (issue 12). Dedup on write answers "you already have this" only from cells the
# writer can read: the caller restates every noise text and every word, under each policy,
# and what comes back (a new cell or an existing one, merged or not) must not differ. These
# writes change the world the same way in both stores, so the paths after them still compare.
def _dedup_creates(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    ids = service_module.new_cell_id
    n = 10_000
    for owner in OWNERS:
        for text in world.noise_texts + WORDS[:3]:
            for policy in ("exact", "skip", "merge"):
                n += 1
                ids.next = cell_id(n, noise=False)  # type: ignore[attr-defined]
                req = CellCreate.model_validate({"content": {"text": text}, "identity": {"owner_id": owner},
                                                 "dedup": policy})
                yield answer(lambda: service.create_many_detailed(caller, [req]))


# Consolidation reads episodes and compares candidates with stored memories; both must come
# only from cells the caller can read. A scripted model (fake; the model is not what is
# tested) answers from the prompt it gets, and the prompts themselves are part of the answer:
# an unreadable text reaching a prompt fails the property even if the decision is the same.
def _scripted_model(prompts: list[str]) -> Any:
    import hashlib
    import re

    import httpx

    from ampkit.consolidation import EXTRACT_SYSTEM
    from ampkit.llm import ChatModel, ModelConfig

    def reply(request: httpx.Request) -> httpx.Response:
        messages = json.loads(request.content)["messages"]
        system, user = messages[0]["content"], messages[-1]["content"]
        prompts.append(user)
        digest = hashlib.sha1(user.encode()).hexdigest()[:8]
        if system == EXTRACT_SYSTEM:
            refs = re.findall(r'"id": "(e\d+)"', user)
            body: dict[str, Any] = {"candidates": [
                {"text": f"The user said {ref} ({digest})", "type": "fact", "supporting_episode_ids": [ref],
                 "confidence": 0.9} for ref in refs]}
        elif '"id": "m1"' in user:
            body = {"decision": "UPDATE", "target": "m1", "text": f"merged {digest}", "reason": digest}
        else:
            body = {"decision": "ADD", "reason": digest}
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": json.dumps(body)}}]})

    http = httpx.Client(transport=httpx.MockTransport(reply))
    return ChatModel(ModelConfig(base_url="http://model.invalid/v1", model="scripted"), http_client=http)


def _consolidation(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    from ampkit.models import ConsolidateRequest

    prompts: list[str] = []
    learning = replace(service, model=_scripted_model(prompts))
    windows: list[dict[str, Any]] = [{"session_id": s} for s in SESSIONS if s] + [{"since": NOW.isoformat()}]
    for owner in OWNERS:
        for window in windows:
            req = ConsolidateRequest.model_validate({"owner_id": owner, "dry_run": True, **window})
            yield answer(lambda: learning.consolidate(caller, req))
        # by id: the world's and the noise's episode ids (missing, unreadable: one answer)
        for cid in world.visible_ids + world.noise_ids:
            req = ConsolidateRequest.model_validate({"owner_id": owner, "dry_run": True, "episode_ids": [cid]})
            yield answer(lambda: learning.consolidate(caller, req))
    yield json.dumps(prompts).encode()


# Metadata values (GET /memories/values, the LangGraph adapter's namespace listing): which
# values exist and how many cells hold each, over readable cells only.
def _metadata_values(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    for owner in world.owners:
        for size in (1, 100):
            yield from _paged(lambda cursor: service.metadata_values(caller, "topic", owner_id=owner, limit=size,
                                                                     cursor=cursor, status=["active", "archived"]))


READ_PATHS += [
    ReadPath("metadata_values", _metadata_values),
    ReadPath("dedup_create", _dedup_creates, keyword=True),
    ReadPath("consolidate", _consolidation, keyword=True),
]


# The inspector (issue 14): its pages, rendered for the caller by the /ui app over the same
# service, signed in with a read,write key of the caller's (auth on: an approve key or auth
# off would make the caller an approver, who sees every proposal by design). The key id and
# the CSRF token are the same in both stores or blanked: neither says anything about cells.
@contextmanager
def _inspector_client(service: MemoryService, caller: str) -> Iterator[Any]:
    """A signed-in client of the /ui app. Used as a context manager: one event loop thread
    (TestClient's portal) for all of a path's pages, not one started per request."""
    from starlette.applications import Starlette
    from starlette.routing import Mount
    from starlette.testclient import TestClient

    from ampkit.auth import hash_secret
    from ampkit.inspector import create_inspector_app
    from ampkit.store.base import ApiKeyRecord

    key_id, secret = f"{AGENTS.index(caller):016x}", "s" * 43
    if service.store.keys.get(key_id) is None:
        service.store.keys.put(ApiKeyRecord(key_id, caller, ("read", "write"), hash_secret(secret), NOW))
    app = create_inspector_app(service, auth_required=True)
    with TestClient(Starlette(routes=[Mount("/ui", app)])) as client:
        token = re.search(r'name="csrf" value="([^"]+)"', client.get("/ui/signin").text)
        assert token is not None
        assert client.post("/ui/signin", data={"csrf": token.group(1), "credential": f"ampk_{key_id}_{secret}"},
                           follow_redirects=False).status_code == 303
        yield client


def _page(client: Any, path: str) -> tuple[bytes, Optional[str]]:
    response = client.get(path, follow_redirects=False)
    html = re.sub(r'name="csrf" value="[^"]*"', 'name="csrf" value=""', response.text)
    found = re.search(r'<a rel="next" href="([^"]+)"', html)
    return f"{response.status_code}\n{html}".encode(), found.group(1).replace("&amp;", "&") if found else None


def _walk_pages(client: Any, path: str) -> Iterator[bytes]:
    next_path: Optional[str] = path
    for _ in range(50):
        if next_path is None:
            return
        page, next_path = _page(client, next_path)
        yield page


def _inspector_pages(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    with _inspector_client(service, caller) as client:
        yield from _walk_pages(client, "/ui/owners")
        for owner in world.owners:
            query = "" if owner is None else f"owner={owner}&"
            yield from _walk_pages(client, f"/ui/cells?{query}")
            yield from _walk_pages(client, f"/ui/cells?{query}status=active&status=archived&superseded=1")
        for cid in world.visible_ids + world.noise_ids:
            for suffix in ("", "/edit", "/forget", "/supersede"):
                yield _page(client, f"/ui/cells/{cid}{suffix}")[0]


def _inspector_search(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    with _inspector_client(service, caller) as client:
        for owner in world.owners:
            for word in world.query_words:
                yield _page(client, f"/ui/search?q={word}&stale=1" + ("" if owner is None else f"&owner={owner}"))[0]


def _inspector_files(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    from urllib.parse import urlencode

    from ampkit.files import PROPOSALS_FILE

    with _inspector_client(service, caller) as client:
        for owner in world.owners:
            folder = {} if owner is None else {"owner": owner}
            yield _page(client, "/ui/files?" + urlencode(folder))[0]
            for path in world.file_paths + [PROPOSALS_FILE, "sessions/chat-1.md"]:
                yield _page(client, "/ui/files/view?" + urlencode({**folder, "path": path}))[0]
            for status in ("pending", ""):
                yield _page(client, "/ui/proposals?" + urlencode({**folder, "status": status}))[0]
        for pid in world.proposal_ids:
            yield _page(client, f"/ui/proposals/{pid}")[0]


READ_PATHS += [
    ReadPath("inspector_pages", _inspector_pages),
    ReadPath("inspector_search", _inspector_search, keyword=True),
    ReadPath("inspector_files", _inspector_files),
]


def test_every_mcp_read_tool_is_a_read_path():
    import inspect

    from ampkit.mcp_server import READ_TOOLS

    asked = "".join(inspect.getsource(fn) for fn in (_mcp_ids, _mcp_lists, _mcp_recall, _mcp_files))
    assert all(f'"{tool}"' in asked for tool in READ_TOOLS)




# ---------------------------------------------------------------- building the two stores
def build(service: MemoryService, ids: FixedIds, caller: str, specs: list[CellSpec],
          noise: list[NoiseSpec], world: World, with_noise: bool,
          between_steps: Callable[[], Any] = lambda: None) -> None:
    """The world's cells, and in the noisy world the noise, interleaved; `between_steps` runs
    after each step (in both worlds alike)."""
    def create(agent: str, body: dict[str, Any], cid: str) -> None:
        ids.next = cid
        service.create(agent, CellCreate.model_validate(body))

    def body(owner: str, session: Optional[str], text: str, readable_by: list[str], public: bool,
             episodic: bool, writable_by: Optional[list[str]] = None) -> dict[str, Any]:
        # a session's turns carry its day, as conversation turns do (the date-session leg)
        dated = {"date": SESSION_DATES[session]} if session in SESSION_DATES else {}
        return {"content": {"text": text, "metadata": {"topic": text.split()[0], **dated}},
                "identity": {"owner_id": owner, "session_id": session},
                "access_policy": {"readable_by": readable_by, "public": public, "writable_by": writable_by or []},
                "type": "episodic" if episodic else "semantic",
                # every spec is its own cell (two equal specs would dedup into one id), and a noise
                # write restating a cell mallory *can* read (a public one) would count as a use of
                # it: a visible effect that is not noise.
                "dedup": "off"}

    archive = CellPatch.model_validate({"lifecycle": {"status": "archived"}})
    steps = max(len(specs), len(noise))
    for n in range(steps):
        if n < len(specs):
            spec = specs[n]
            cid = cell_id(n, noise=False)
            text = " ".join(spec.words)
            if spec.granted_later:  # history then holds a version the readers could not read
                create(spec.creator, body(spec.owner, spec.session, "draft " + text, [], False, spec.episodic,
                                          spec.writable_by), cid)
                service.update(spec.creator, cid, CellPatch.model_validate(
                    {"content": {"text": text}, "access_policy": {"readable_by": spec.readable_by, "public": spec.public}}))
            else:
                create(spec.creator, body(spec.owner, spec.session, text, spec.readable_by, spec.public, spec.episodic,
                                          spec.writable_by), cid)
            if spec.archived:
                service.update(spec.creator, cid, archive)
            world.visible_ids.append(cid)
        if n < len(noise) and with_noise:
            spec_n = noise[n]
            if spec_n.owner == caller:
                continue  # a cell the caller owns is readable: not noise
            cid = cell_id(n, noise=True)
            create(NOISE_AGENT, body(spec_n.owner, spec_n.session, " ".join(spec_n.words), [], False, spec_n.episodic), cid)
            if spec_n.then == "patch":
                service.update(NOISE_AGENT, cid, CellPatch.model_validate({"content": {"text": "4812 vault " * 3}}))
            elif spec_n.then in ("delete", "purge"):
                service.update(NOISE_AGENT, cid, archive)
                service.delete(NOISE_AGENT, cid)
                if spec_n.then == "purge":
                    later = replace(service, clock=lambda: NOW + timedelta(days=400))
                    assert later.purge("admin", [cid]).purged == [cid]
        between_steps()
    world.noise_texts = [" ".join(n.words) for n in noise]
    if with_noise:
        world.noise_ids = [cell_id(n, noise=True) for n in range(len(noise))]
    build_files(service, ids, caller, specs, noise, world, with_noise)


def build_files(service: MemoryService, ids: FixedIds, caller: str, specs: list[CellSpec],
                noise: list[NoiseSpec], world: World, with_noise: bool) -> None:
    """Memory files (issue 11): each world cell's creator writes a file into its owner's folder
    with the cell's access policy, then proposes a change to it; the noise agent writes files
    and proposes new ones in the same folders. Ids are fixed, as for cells."""
    from ampkit.files import ApprovalMode, FileService, FileWrite
    from ampkit.models import AccessPolicy

    proposal_ids = iter(range(10**6))
    next_proposal: list[str] = []
    files = FileService(service.store, service.clock, service.limits, service.retriever, ids,
                        lambda: next_proposal.pop())

    def write(agent: str, owner: str, path: str, text: str, cid: str, policy: Optional[AccessPolicy] = None,
              proposal: Optional[str] = None, planted: Optional[str] = None) -> None:
        """`planted`: the proposal id a new file in another owner's folder gets even in yolo
        mode (issue 42); a person ("ops", approve scope) approves it, so the file lands."""
        ids.next = cid
        if proposal is not None or planted is not None:
            next_proposal.append(proposal or planted)  # type: ignore[arg-type]
        result = files.write(agent, FileWrite(owner_id=owner, path=path, content=text, access_policy=policy))
        if planted is not None and result.status == "proposed":
            files.approve("ops", planted, may_approve=True)
        elif planted is not None:
            next_proposal.pop()
        ids.next = None

    def mode(owner: str, name: str) -> None:
        files.set_approval_mode("ops", ApprovalMode(owner_id=owner, approval_mode=name))  # type: ignore[arg-type]

    for owner in OWNERS:
        mode(owner, "yolo")
    for n, spec in enumerate(specs):
        path = f"notes/{n}.md"
        policy = AccessPolicy(readable_by=spec.readable_by, public=spec.public)
        write(spec.creator, spec.owner, path, " ".join(spec.words) + "\n", cell_id(100 + n, noise=False), policy,
              planted=f"prop_{3 * 10**6 + n:026d}")
        world.file_paths.append(path)
        world.proposal_ids.append(f"prop_{3 * 10**6 + n:026d}")
    if with_noise:
        for n, spec_n in enumerate(noise):
            if spec_n.owner == caller:
                continue
            write(NOISE_AGENT, spec_n.owner, f"noise/{n}.md", " ".join(spec_n.words) + "\n", cell_id(100 + n, noise=True),
                  planted=f"prop_{4 * 10**6 + n:026d}")
    world.file_paths += [f"noise/{n}.md" for n in range(len(noise))]
    world.proposal_ids += [f"prop_{4 * 10**6 + n:026d}" for n in range(len(noise))]
    for owner in OWNERS:
        mode(owner, "review")
    for n, spec in enumerate(specs):
        pid = f"prop_{2 * next(proposal_ids):026d}"
        write(spec.creator, spec.owner, f"notes/{n}.md", "vault tea\n", cell_id(200 + n, noise=False), proposal=pid)
        world.proposal_ids.append(pid)
    for n, spec_n in enumerate(noise):
        pid = f"prop_{2 * n + 1 + 10**6:026d}"
        if with_noise and spec_n.owner != caller:
            write(NOISE_AGENT, spec_n.owner, f"noise-new/{n}.md", "vault tea code\n", cell_id(200 + n, noise=True),
                  proposal=pid)
        world.proposal_ids.append(pid)


def _files_list_read_history(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    from ampkit.files import PROPOSALS_FILE, SESSIONS_DIR

    for owner in OWNERS:
        listed = service.files.list(caller, owner)
        yield answer(lambda: listed)
        yield answer(lambda: service.files.list(caller, owner, glob="notes/**"))
        virtual = [f.path for f in listed.results if f.path.startswith(SESSIONS_DIR)]
        for path in world.file_paths + virtual + [PROPOSALS_FILE, SESSIONS_DIR + "chat-1.md"]:
            yield answer(lambda: service.files.read(caller, owner, path))
            yield answer(lambda: service.files.read(caller, owner, path, offset=1, limit=1))
            yield answer(lambda: service.files.history(caller, owner, path))


def _files_grep_search(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    from ampkit.files import FileSearchRequest

    for owner in OWNERS:
        for word in world.query_words:
            yield answer(lambda: service.files.grep(caller, owner, word))
            yield answer(lambda: service.files.grep(caller, owner, word, glob="notes/**", max_count=1))
            yield answer(lambda: service.files.search(caller, FileSearchRequest(owner_id=owner, query=word)))


def _proposals(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    for owner in [None, *OWNERS]:
        yield answer(lambda: service.files.proposals(caller, owner))
        yield answer(lambda: service.files.proposals(caller, owner, status="pending", proposed_by=caller))
    for pid in world.proposal_ids:
        yield answer(lambda: service.files.proposal(caller, pid))


READ_PATHS += [
    ReadPath("files_list_read_history", _files_list_read_history),
    ReadPath("files_grep_search", _files_grep_search),
    ReadPath("proposals", _proposals),
]


# Writing never grants reading (issue 42): the caller tries to change the access policy of
# every cell by PATCH, rollback and a superseding create, and writes content; what it is told,
# and what it reads afterwards, must not depend on cells it cannot read. Last of the paths:
# these writes change the world alike in both stores.
def _policy_writes(service: MemoryService, caller: str, world: World) -> Iterator[bytes]:
    ids = service_module.new_cell_id
    n = 20_000
    patches = [{"access_policy": {"readable_by": [caller]}}, {"access_policy": {"public": True}},
               {"content": {"text": "vault rewritten"}}]
    for cid in world.visible_ids + world.noise_ids:
        for patch in patches:
            yield answer(lambda: service.update(caller, cid, CellPatch.model_validate(patch)))
        yield answer(lambda: service.rollback(caller, cid, 1))
        for policy in (None, {"public": True}):
            n += 1
            body: dict[str, Any] = {"content": {"text": "tea replaced"}, "identity": {"owner_id": "ada"},
                                    "supersedes": cid}
            if policy is not None:
                body["access_policy"] = policy
            ids.next = cell_id(n, noise=False)  # type: ignore[attr-defined]
            yield answer(lambda: service.create(caller, CellCreate.model_validate(body)))
            ids.next = None  # type: ignore[attr-defined]
        yield answer(lambda: service.get(caller, cid))
        yield answer(lambda: service.history(caller, cid))


READ_PATHS += [ReadPath("policy_writes", _policy_writes)]


class HashedWords:
    """A fake embedder: words hashed into 16 dimensions (`seed` makes another model)."""

    dim = 16

    def __init__(self, name: str, seed: int = 0):
        self.name, self.seed = name, seed

    def embed(self, texts):
        import zlib

        import numpy as np

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.split():
                out[row, zlib.crc32(word.encode(), self.seed) % self.dim] += 1.0
            out[row, self.seed % self.dim] += 0.5  # no zero vector
        return out / np.linalg.norm(out, axis=1, keepdims=True)


class ScriptRouted(HashedWords):
    """Routes like the default embedder: CJK text to `cjk_embedder` (a second fake model), so
    the multilingual leg and its gate (a readable cell with such a vector) are exercised."""

    cjk_model = "fake-cjk-16"

    def __init__(self):
        super().__init__("fake-latin-16")
        self.cjk_embedder = HashedWords(self.cjk_model, seed=7)


@pytest.fixture(params=[pytest.param(backend, marks=pytest.mark.slow)
                        for backend in ("sqlite", "sqlite-wide", "postgres", "postgres-wide")])
def store_urls(request) -> Callable[[], tuple[str, str]]:
    """A factory of two fresh, empty stores of this backend ("sqlite-wide": the keyword leg
    takes its path for filters admitting many cells, cached admitted rows and term rows, on
    every search, and the retriever has a script-routed fake embedder, so the dense and the
    multilingual legs run too; `store_options` and `retriever` say how to build these). The
    read paths that never search take the same code on "sqlite" as on "sqlite-wide", so
    "sqlite" renders only the `keyword` ones). "postgres-wide": every search without an owner
    is ranked from the wide keyword leg's arrays (loaded by the search itself, not in the
    background; a search after each step of the build loads them early, so each later write,
    noise included, is patched into them), and only the `keyword` paths are rendered. On
    "postgres" too a search without an owner is answered from those arrays, with what they
    lack for it (its filter's rows, its query's lexemes) read by the search itself, whether
    or not the background warm-up has run yet."""
    if request.param.startswith("sqlite"):
        tmp = Path(tempfile.mkdtemp(prefix="ampkit-ni-"))
        counter = iter(range(10**6))

        def fresh_files() -> tuple[str, str]:
            return tuple(f"sqlite:///{tmp}/{next(counter)}.db" for _ in range(2))  # type: ignore[return-value]
        fresh_files.store_options = {"keyword_scan_max": 0} if request.param == "sqlite-wide" else {}  # type: ignore[attr-defined]
        fresh_files.retriever = (  # type: ignore[attr-defined]
            (lambda: Retriever(embedder=ScriptRouted())) if request.param == "sqlite-wide" else Retriever)
        fresh_files.keyword_only = request.param == "sqlite"  # type: ignore[attr-defined]
        return fresh_files
    pg_server = request.getfixturevalue("pg_server")
    counter = iter(range(10**6))

    def fresh() -> tuple[str, str]:
        return tuple(pg_server.create_database(f"ni_{id(request)}_{next(counter)}", template="ampkit_template")
                     for _ in range(2))  # type: ignore[return-value]
    if request.param == "postgres-wide":
        fresh.store_options = {"keyword_warm_inline": True}  # type: ignore[attr-defined]
        fresh.search_while_building = True  # type: ignore[attr-defined]
        fresh.keyword_only = True  # type: ignore[attr-defined]
    return fresh


@settings(max_examples=examples(12), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(caller=st.sampled_from(AGENTS), specs=st.lists(cell_specs, min_size=1, max_size=5),
       noise=st.lists(noise_specs, min_size=1, max_size=4))
def test_no_read_path_depends_on_cells_the_caller_cannot_read(store_urls, monkeypatch_ids, caller, specs, noise):
    plain_url, noisy_url = store_urls()
    paths = [p for p in READ_PATHS if p.keyword or not getattr(store_urls, "keyword_only", False)]
    worlds, outputs = {}, {}
    searched: set[str] = set()  # the paths that reached the keyword leg
    for label, url, with_noise in (("plain", plain_url, False), ("noisy", noisy_url, True)):
        store = store_from_url(url, **getattr(store_urls, "store_options", {}))
        store.open()
        try:
            retriever = getattr(store_urls, "retriever", Retriever)()
            connect_embedding(store, retriever)  # as a server does: SQLite embeds new rows with their windows
            service = MemoryService(store=store, clock=lambda: NOW, retriever=retriever)
            world = World(caller=caller)
            between_steps = ((lambda: store.keyword_candidates("vault 4812", CellFilter(reader=caller), 5))
                             if getattr(store_urls, "search_while_building", False) else lambda: None)
            build(service, monkeypatch_ids, caller, specs, noise, world, with_noise, between_steps)
            worlds[label] = world
            if not with_noise:  # ask the plain store about the noise ids too
                world.noise_ids = [cell_id(n, noise=True) for n in range(len(noise))]
            outputs[label] = {}
            keyword_leg = store.keyword_candidates
            for path in paths:
                def keyword_candidates(*args: Any, _name: str = path.name, **kwargs: Any) -> Any:
                    searched.add(_name)
                    return keyword_leg(*args, **kwargs)
                store.keyword_candidates = keyword_candidates  # type: ignore[method-assign]
                outputs[label][path.name] = list(path.render(service, caller, world))
        finally:
            store.close()
    unmarked = sorted(searched - {p.name for p in READ_PATHS if p.keyword})
    assert not unmarked, f"read paths that search without keyword=True (the sqlite run skips them): {unmarked}"
    failures = []
    for path in paths:
        if outputs["plain"][path.name] != outputs["noisy"][path.name]:
            failures.append(path.name)
    first = failures[0] if failures else None
    assert not failures, (
        f"read paths whose answer depends on cells {caller} cannot read: {failures}; first, {first}:\n"
        f"plain: {_first_difference(outputs, first)}")


def _first_difference(outputs: dict[str, dict[str, list[bytes]]], name: str) -> str:
    for plain, noisy in zip(outputs["plain"][name], outputs["noisy"][name]):
        if plain != noisy:
            at = next(i for i, (a, b) in enumerate(zip(plain + b" ", noisy + b"  ")) if a != b)
            return f"...{plain[max(0, at - 300):at + 300]!r}\nnoisy: ...{noisy[max(0, at - 300):at + 300]!r}"
    return f"{len(outputs['plain'][name])} answers vs {len(outputs['noisy'][name])}"


@pytest.fixture
def monkeypatch_ids(monkeypatch) -> FixedIds:
    ids = FixedIds()
    monkeypatch.setattr(service_module, "new_cell_id", ids)
    return ids
