"""One client test suite over every way of reaching a store.

Each behaviour test runs four times: the sync and the async client over real HTTP against the
server app (in this process: the transport is what varies here, not the process), and the sync and the async client in process over a real SQLite
file. The async client is driven through `Driven`, which runs its coroutines on an event
loop, so one test body serves both shells. `test_http_and_in_process_agree` then runs one
scenario on fresh stores and asserts that HTTP and in-process give identical results and
identical errors (class, code, status, message and details); ids and timestamps aside.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

import ampkit
from ampkit import (
    AccessDenied,
    Conflict,
    InvalidTransition,
    MissingAgentId,
    PayloadTooLarge,
    RateLimited,
    TransportError,
    Unavailable,
    ValidationFailed,
)
from ampkit.client import ConfigError, resolve
from support import ROOT, AppServer, free_port, run_cli, run_example

BACKENDS = ["http-sync", "http-async", "local-sync", "local-async"]
MISSING_ID = "mem_" + "0" * 26


class Driven:
    """An AsyncClient behind a synchronous face: each coroutine runs on this object's loop."""

    def __init__(self, client: ampkit.AsyncClient):
        self._loop = asyncio.new_event_loop()
        self._client = client
        self._loop.run_until_complete(client.__aenter__())

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if name == "list":
            async def collect(**kwargs):
                return [cell async for cell in attr(**kwargs)]

            return lambda **kwargs: iter(self._loop.run_until_complete(collect(**kwargs)))
        if inspect.iscoroutinefunction(attr):
            return lambda *args, **kwargs: self._loop.run_until_complete(attr(*args, **kwargs))
        return attr

    def close(self) -> None:
        self._loop.run_until_complete(self._client.aclose())
        self._loop.close()


def open_client(backend: str, target: str, agent_id: str | None, **options):
    """`target` is the server's base URL for http-*, a store URL for local-*."""
    if backend.endswith("async"):
        return Driven(ampkit.aconnect(target, agent_id=agent_id, **options))
    client = ampkit.connect(target, agent_id=agent_id, **options)
    client.__enter__()
    return client


@pytest.fixture(scope="module", autouse=True)
def clock_override():
    """Lifecycle and purge tests here move the clock (`as_of`): this module's servers and
    in-process clients are test servers that allow it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AMPKIT_ALLOW_CLOCK_OVERRIDE", "true")
        yield


@pytest.fixture(scope="module")
def client_server(tmp_path_factory):
    """This module's own server, so that lifecycle runs here never touch other tests' cells."""
    tmp = tmp_path_factory.mktemp("client-server")
    with AppServer(f"sqlite:///{tmp}/memory.db", args=["--allow-clock-override"], log_path=tmp / "server.log") as proc:
        yield proc


@pytest.fixture(scope="module")
def local_store_url(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('client-local')}/memory.db"


@pytest.fixture(params=BACKENDS)
def connect_as(request, client_server, local_store_url):
    """connect_as(agent_id) -> a client of this test's backend, closed at teardown."""
    target = client_server.base_url if request.param.startswith("http") else local_store_url
    opened = []

    def connect(agent_id: str | None):
        client = open_client(request.param, target, agent_id)
        opened.append(client)
        return client

    connect.backend = request.param
    yield connect
    for client in opened:
        client.close()


@pytest.fixture
def mem(connect_as):
    return connect_as("agent-" + uuid.uuid4().hex[:8])


@pytest.fixture
def owner():
    return "owner-" + uuid.uuid4().hex[:8]


# ---------------------------------------------------------------- behaviour, per backend
def test_restore_brings_an_archived_cell_back(mem, owner):
    cell = mem.remember("the spare key is under the mat", owner_id=owner, key="spare-key")
    archived = mem.update(cell.id, status="archived")
    with pytest.raises(InvalidTransition):
        mem.update(cell.id, status="active")  # PATCH may not leave archived (spec section 7.2)
    with pytest.raises(Conflict):
        mem.restore(cell.id, expected_version=archived.lifecycle.version - 1)
    restored = mem.restore(cell.id, expected_version=archived.lifecycle.version)
    assert restored.lifecycle.status == "active" and restored.lifecycle.version == archived.lifecycle.version + 1
    assert mem.history(cell.id)[-1].changes == {"lifecycle.status": ["archived", "active"], "reason": "restored"}
    with pytest.raises(InvalidTransition):
        mem.restore(cell.id)  # only an archived cell
    mem.update(cell.id, status="archived")
    mem.remember("the spare key is with the neighbour", owner_id=owner, key="spare-key")
    with pytest.raises(Conflict):  # a live cell holds its key now, as a create would be refused
        mem.restore(cell.id)
    with pytest.raises(AccessDenied):
        mem.restore(MISSING_ID)


def test_write_file_takes_the_access_policy_by_its_wire_name(connect_as, owner):
    writer, reader = connect_as(owner), connect_as("reader-" + owner)
    proposed = writer.write_file("notes/shared.md", "# shared\n", owner_id=owner,
                                 access_policy={"readable_by": ["reader-*"]})
    connect_as("human:ann").approve_proposal(proposed.proposal_id)
    assert reader.read_file("notes/shared.md", owner_id=owner).content == "# shared\n"
    with pytest.raises(TypeError, match="not both"):
        writer.write_file("notes/other.md", "x\n", owner_id=owner, access_policy={"public": True}, public=True)
    with pytest.raises(ValidationFailed):  # the server checks the policy, in the error envelope
        writer.write_file("notes/other.md", "x\n", owner_id=owner, access_policy={"readable": ["x"]})




def test_remember_maps_flat_fields_into_the_cell(mem, owner):
    expires = datetime(2031, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    cell = mem.remember(
        "Ada prefers green tea", owner_id=owner, type="procedural", metadata={"topic": "drinks"},
        session_id="s1", owner_type="agent", importance=0.9, confidence=0.8, decay_rate=0.5,
        readable_by=["reader-*"], writable_by=["writer-1"], public=False, source_type="conversation",
        source_ref="chat#42", extraction_method="rule_based", expires_at=expires,
    )
    assert cell.id.startswith("mem_") and cell.type == "procedural"
    assert (cell.content.text, cell.content.metadata) == ("Ada prefers green tea", {"topic": "drinks"})
    assert (cell.identity.owner_id, cell.identity.owner_type, cell.identity.session_id) == (owner, "agent", "s1")
    assert cell.identity.created_by == mem.agent_id
    assert (cell.scoring.importance, cell.scoring.confidence, cell.scoring.decay_rate) == (0.9, 0.8, 0.5)
    assert cell.access_policy.readable_by == ["reader-*"] and cell.access_policy.writable_by == ["writer-1"]
    assert (cell.provenance.source_type, cell.provenance.source_ref, cell.provenance.extraction_method) == (
        "conversation", "chat#42", "rule_based")
    assert cell.lifecycle.expires_at == expires and cell.lifecycle.status == "active"

    fetched = mem.get(cell.id)
    assert fetched.content == cell.content and fetched.scoring.access_count == 1
    with pytest.raises(TypeError, match="unknown cell field"):
        mem.remember("x", owner_id=owner, colour="blue")


def test_remember_many_keeps_order(mem, owner):
    cells = mem.remember_many([
        {"text": "first", "owner_id": owner},
        {"text": "second", "owner_id": owner, "type": "episodic", "importance": 0.2},
    ])
    assert [c.content.text for c in cells] == ["first", "second"]
    assert cells[1].type == "episodic" and cells[1].scoring.importance == 0.2
    assert [mem.get(c.id).content.text for c in cells] == ["first", "second"]


def test_update_merges_changes_and_checks_the_version(mem, owner):
    cell = mem.remember("draft", owner_id=owner, metadata={"a": 1})
    updated = mem.update(cell.id, text="final", importance=0.7, readable_by=["x"])
    assert (updated.content.text, updated.content.metadata) == ("final", {"a": 1})
    assert updated.scoring.importance == 0.7 and updated.access_policy.readable_by == ["x"]
    assert updated.lifecycle.version == cell.lifecycle.version + 1

    again = mem.update(cell.id, expected_version=updated.lifecycle.version, metadata={"b": 2})
    assert again.content.metadata == {"b": 2} and again.lifecycle.version == updated.lifecycle.version + 1
    with pytest.raises(Conflict) as info:
        mem.update(cell.id, expected_version=1, text="stale write")
    assert info.value.details == {"current_version": again.lifecycle.version}
    assert mem.get(cell.id).content.text == "final"


def test_search_returns_cells_with_scores(mem, owner):
    mem.remember("The deploy runbook lives in the wiki", owner_id=owner, type="procedural")
    mem.remember("Ada prefers green tea over coffee", owner_id=owner)
    mem.remember("Bob prefers coffee", owner_id="someone-else-" + owner)

    results = mem.search("green tea", owner_id=owner)
    assert results[0].cell.content.text == "Ada prefers green tea over coffee"  # best first; others may follow by meaning
    assert results[0].score > 0 and results[0].explain is None
    assert all(r.cell.identity.owner_id == owner for r in mem.search("coffee", owner_id=owner))

    explained = mem.search("runbook", owner_id=owner, types=["procedural"], explain=True, limit=1)
    assert len(explained) == 1 and explained[0].explain
    assert all(r.cell.type == "semantic" for r in mem.search("runbook", owner_id=owner, types=["semantic"]))


def test_list_pages_over_the_cursor(mem, owner):
    texts = [f"note {i}" for i in range(7)]
    for text in texts:
        mem.remember(text, owner_id=owner)
    paged = list(mem.list(owner_id=owner, page_size=3))
    assert sorted(c.content.text for c in paged) == texts
    assert len({c.id for c in paged}) == 7
    assert len(list(mem.list(owner_id=owner, page_size=2, limit=4))) == 4
    assert list(mem.list(owner_id=owner, types=["episodic"])) == []


def test_history_records_each_change(mem, owner):
    cell = mem.remember("v1", owner_id=owner)
    mem.update(cell.id, text="v2")
    mem.update(cell.id, status="archived")
    entries = mem.history(cell.id)
    assert [e.action for e in entries] == ["create", "update", "status"]
    assert entries[1].changes["content.text"] == ["v1", "v2"]
    assert all(e.actor == mem.agent_id and e.cell_id == cell.id for e in entries)


def test_supersede_copies_owner_type_and_policy(mem, owner):
    old = mem.remember("Ada prefers green tea", owner_id=owner, type="episodic", readable_by=["team-*"], public=True)
    new = mem.supersede(old.id, "Ada prefers black coffee", importance=0.8)
    assert (new.identity.owner_id, new.type, new.lifecycle.supersedes) == (owner, "episodic", old.id)
    assert new.access_policy.readable_by == ["team-*"] and new.access_policy.public is True
    assert new.scoring.importance == 0.8
    assert mem.get(old.id).lifecycle.superseded_by == new.id
    assert [c.id for c in mem.list(owner_id=owner)] == [new.id]  # superseded cells are hidden by default
    with pytest.raises(InvalidTransition):
        mem.supersede(old.id, "a second replacement")


@pytest.mark.parametrize("state", ["active", "archived", "stale"])
def test_forget_works_from_any_live_status(mem, owner, state):
    cell = mem.remember("forget me", owner_id=owner, importance=0.01, confidence=0.01)
    if state == "archived":
        mem.update(cell.id, status="archived")
    elif state == "stale":
        mem.run_lifecycle()  # importance x confidence is below the stale threshold at once
        assert mem.get(cell.id).lifecycle.status in ("stale", "active")  # a read may revive it
    mem.forget(cell.id)
    with pytest.raises(AccessDenied):
        mem.get(cell.id)
    with pytest.raises(AccessDenied):  # forgetting twice: the cell is gone
        mem.forget(cell.id)
    assert cell.id not in {c.id for c in mem.export(owner_id=owner)}


def test_run_lifecycle_archives_expired_cells(mem, owner):
    past = datetime.now(timezone.utc) - timedelta(seconds=1)
    expired = mem.remember("old offer", owner_id=owner, expires_at=past)
    kept = mem.remember("standing fact", owner_id=owner)
    report = mem.run_lifecycle()
    assert report.expired >= 1 and report.to_archived >= 1
    assert mem.get(expired.id).lifecycle.status == "archived"
    assert mem.get(kept.id).lifecycle.status == "active"
    future = mem.run_lifecycle(as_of=datetime.now(timezone.utc) + timedelta(days=3650))
    assert future.to_stale >= 1 and future.ran_at.year >= 2035


def test_export_health_and_spec(mem, owner):
    a = mem.remember("one", owner_id=owner)
    mem.update(a.id, status="archived")
    mem.remember("two", owner_id=owner)
    assert sorted(c.content.text for c in mem.export(owner_id=owner)) == ["one", "two"]
    assert mem.health().status == "ok"
    assert "supersession" in mem.spec()["capabilities"]["extensions"]


def test_purge_refuses_cells_inside_retention(mem, owner):
    cell = mem.remember("gone soon", owner_id=owner)
    mem.forget(cell.id)
    report = mem.purge([cell.id, MISSING_ID])
    assert report.purged == []
    assert {r.id for r in report.refused} == {cell.id, MISSING_ID}
    later = mem.purge([cell.id], as_of=datetime.now(timezone.utc) + timedelta(days=365))
    assert later.purged == [cell.id]


def test_access_rules_hold_for_other_agents(connect_as, owner):
    mine = connect_as("alice-" + owner)
    theirs = connect_as("bob-" + owner)
    private = mine.remember("alice's secret", owner_id=owner)
    shared = mine.remember("team note", owner_id=owner, readable_by=["bob-*"], writable_by=["bob-*"])
    with pytest.raises(AccessDenied) as forbidden:
        theirs.get(private.id)
    with pytest.raises(AccessDenied) as missing:
        theirs.get(MISSING_ID)
    assert forbidden.value.envelope() == missing.value.envelope()  # no oracle
    assert theirs.get(shared.id).content.text == "team note"
    assert [r.cell.id for r in theirs.search("note", owner_id=owner)] == [shared.id]
    theirs.forget(shared.id)  # writable_by lets bob archive and delete it
    with pytest.raises(AccessDenied):
        mine.get(shared.id)


def test_writer_only_agent_can_change_but_not_see_a_cell(connect_as, owner):
    mine = connect_as("alice-" + owner)
    writer = connect_as("scribe-" + owner)
    cell = mine.remember("append-only log", owner_id=owner, writable_by=["scribe-*"])
    assert writer.update(cell.id, importance=0.9) is None  # 204: the write happened, the cell stays unseen
    with pytest.raises(AccessDenied):
        writer.get(cell.id)
    assert mine.get(cell.id).scoring.importance == 0.9
    writer.forget(cell.id)
    with pytest.raises(AccessDenied):
        mine.get(cell.id)


# ---------------------------------------------------------------- errors, per backend

ERROR_CASES = {
    "missing agent": (MissingAgentId, 401, lambda c, cell: c["anonymous"].get(cell.id)),
    "missing cell": (AccessDenied, 403, lambda c, cell: c["mem"].get(MISSING_ID)),
    "forbidden cell": (AccessDenied, 403, lambda c, cell: c["other"].update(cell.id, text="mine now")),
    "invalid transition": (InvalidTransition, 409, lambda c, cell: c["mem"].update(cell.id, status="deleted")),
    "version conflict": (Conflict, 409, lambda c, cell: c["mem"].update(cell.id, expected_version=99, text="x")),
    "blank text": (ValidationFailed, 422, lambda c, cell: c["mem"].remember("   ", owner_id="o")),
    "importance out of range": (ValidationFailed, 422, lambda c, cell: c["mem"].remember("x", owner_id="o", importance=2)),
    "unknown type": (ValidationFailed, 422, lambda c, cell: c["mem"].remember("x", owner_id="o", type="dream")),
    "search limit": (ValidationFailed, 422, lambda c, cell: c["mem"].search("x", limit=1000)),
    "unknown search filter": (ValidationFailed, 422, lambda c, cell: c["mem"].search("x", colour="red")),
    "list type": (ValidationFailed, 422, lambda c, cell: list(c["mem"].list(types=["dream"]))),
    "oversized cell": (PayloadTooLarge, 413, lambda c, cell: c["mem"].remember("x" * 70_000, owner_id="o")),
}


def _error_clients(connect_as, owner):
    clients = {"mem": connect_as("agent-" + owner), "other": connect_as("intruder-" + owner),
               "anonymous": connect_as(None)}
    cell = clients["mem"].remember("guarded", owner_id=owner)
    return clients, cell


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_raise_the_class_of_their_code(connect_as, owner, case):
    expected, status, action = ERROR_CASES[case]
    clients, cell = _error_clients(connect_as, owner)
    with pytest.raises(expected) as info:
        action(clients, cell)
    assert info.value.code == expected.code and info.value.status == status
    assert info.value.message
    assert clients["mem"].get(cell.id).content.text == "guarded"  # nothing changed


# ---------------------------------------------------------------- HTTP and in process agree

_ID = re.compile(r"mem_[0-9A-Z]{26}")
_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?$")


def _normalised(value, ids: dict[str, str]):
    """JSON form with ids numbered by first appearance and timestamps blanked."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    if isinstance(value, dict):
        return {k: _normalised(v, ids) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalised(v, ids) for v in value]
    if isinstance(value, str):
        if _TIME.match(value):
            return "<time>"
        return _ID.sub(lambda m: ids.setdefault(m.group(0), f"<id{len(ids)}>"), value)
    if isinstance(value, float):
        return round(value, 4)
    return value


def scenario(connect) -> list:
    """Every client operation, successes and failures, recorded as plain data."""
    mem, other, anonymous = connect("planner"), connect("intruder"), connect(None)
    out: list = []

    def record(label, action):
        try:
            out.append((label, action()))
        except ampkit.APIError as exc:
            out.append((label, type(exc).__name__, exc.status, exc.code, exc.message, exc.details))

    tea = mem.remember("Ada prefers green tea", owner_id="ada", importance=0.9, metadata={"k": "v"})
    cat = mem.remember("Ada's cat is called Tom", owner_id="ada", type="episodic", readable_by=["intr*"])
    out += [("remember", tea), ("remember", cat)]
    record("remember_many", lambda: mem.remember_many([{"text": f"fact {i}", "owner_id": "ada"} for i in range(4)]))
    record("get", lambda: mem.get(tea.id))
    record("update", lambda: mem.update(tea.id, text="Ada loves green tea", importance=0.8))
    record("search", lambda: mem.search("tea cat", owner_id="ada", explain=True))
    record("list", lambda: list(mem.list(owner_id="ada", page_size=2)))
    record("supersede", lambda: mem.supersede(tea.id, "Ada switched to coffee"))
    record("history", lambda: mem.history(tea.id))
    record("other reads shared", lambda: other.get(cat.id))
    record("forget", lambda: mem.forget(cat.id))
    record("lifecycle", lambda: mem.run_lifecycle(as_of=datetime(2030, 1, 1, tzinfo=timezone.utc)))
    record("export", lambda: mem.export(owner_id="ada"))
    record("purge", lambda: mem.purge([cat.id]))
    for label, (_, _, action) in ERROR_CASES.items():
        record(label, lambda: action({"mem": mem, "other": other, "anonymous": anonymous}, tea))
    return out


def test_http_and_in_process_agree(server_factory, tmp_path):
    server = server_factory(args=["--allow-clock-override"])
    local_url = f"sqlite:///{tmp_path}/agree.db"
    results = {}
    for backend in BACKENDS:  # sync first, then async, on the same two stores
        target = server.base_url if backend.startswith("http") else local_url
        opened = []

        def connect(agent_id, backend=backend, target=target):
            opened.append(open_client(backend, target, agent_id))
            return opened[-1]

        try:
            results[backend] = _normalised(scenario(connect), {})
        finally:
            for client in opened:
                client.close()
    assert results["http-sync"] == results["local-sync"]
    assert results["http-async"] == results["local-async"]
    errors = [entry for entry in results["http-sync"] if len(entry) > 2]
    assert {e[0] for e in errors} >= set(ERROR_CASES)  # every error case really failed


# ---------------------------------------------------------------- the same script, two backends


def test_quickstart_prints_the_same_over_http_and_sqlite(server_factory, tmp_path):
    server = server_factory()
    script = ROOT / "examples" / "quickstart.py"
    outputs = []
    for url in (server.base_url, f"sqlite:///{tmp_path}/quickstart.db"):
        proc = run_example(script, env={"AMPKIT_URL": url}, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1]
    assert "superseded: True" in outputs[0] and "forgotten: ACCESS_DENIED" in outputs[0]


def test_quickstart_without_a_url_runs_on_a_fresh_file_and_says_so(tmp_path, monkeypatch):
    for var in ("AMPKIT_URL", "AMPKIT_CONFIG", "AMPKIT_AGENT_ID", "AMPKIT_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    proc = run_example(ROOT / "examples" / "quickstart.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "superseded: True" in proc.stdout and "forgotten: ACCESS_DENIED" in proc.stdout
    assert proc.stderr.startswith("AMPKIT_URL is not set: using sqlite:///") and proc.stderr.count("\n") == 1


# ---------------------------------------------------------------- URL resolution


def test_url_comes_from_argument_then_env_then_config_file(tmp_path, monkeypatch):
    config = tmp_path / "config" / "ampkit" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('url = "sqlite:///from-file.db"\nagent_id = "file-agent"\napi_key = "file-key"\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for var in ("AMPKIT_URL", "AMPKIT_AGENT_ID", "AMPKIT_API_KEY", "AMPKIT_CONFIG"):
        monkeypatch.delenv(var, raising=False)

    assert resolve() == resolve(None) and resolve().url == "sqlite:///from-file.db"
    assert (resolve().agent_id, resolve().api_key) == ("file-agent", "file-key")
    monkeypatch.setenv("AMPKIT_URL", "http://127.0.0.1:1/amp/v1")
    monkeypatch.setenv("AMPKIT_AGENT_ID", "env-agent")
    assert (resolve().url, resolve().agent_id, resolve().api_key) == ("http://127.0.0.1:1/amp/v1", "env-agent", "file-key")
    assert resolve("memory://", agent_id="arg-agent").agent_id == "arg-agent"
    assert resolve("memory://").url == "memory://"

    monkeypatch.setenv("AMPKIT_CONFIG", str(tmp_path / "other.toml"))
    monkeypatch.delenv("AMPKIT_URL")
    with pytest.raises(ConfigError, match="AMPKIT_URL"):
        ampkit.connect()
    with pytest.raises(ConfigError, match="scheme"):
        ampkit.connect("ftp://example.org")


def test_memory_url_is_an_ephemeral_store():
    with ampkit.connect("memory://", agent_id="a") as first:
        cell = first.remember("only here", owner_id="o")
        assert first.get(cell.id).content.text == "only here"
    with ampkit.connect("memory://", agent_id="a") as second:
        with pytest.raises(AccessDenied):
            second.get(cell.id)


async def test_async_client_can_be_awaited_open(tmp_path):
    client = await ampkit.aconnect(f"sqlite:///{tmp_path}/a.db", agent_id="a")
    try:
        cell = await client.remember("hello", owner_id="o")
        await client.forget(cell.id)
        assert [c async for c in client.list(owner_id="o")] == []
    finally:
        await client.aclose()


def test_sqlite_url_opens_the_file_the_server_uses(client_server, tmp_path):
    """A server and an in-process client on one SQLite file see the same cells."""
    db = Path(client_server.store_url[len("sqlite:///"):])
    with ampkit.connect(client_server.base_url, agent_id="a") as remote:
        cell = remote.remember("written over HTTP", owner_id="shared-file")
    with ampkit.connect(f"sqlite:///{db}", agent_id="a") as local:
        assert local.get(cell.id).content.text == "written over HTTP"


# ---------------------------------------------------------------- HTTP transport: retries, timeouts, headers
# These drive the real HTTP client through httpx's MockTransport to count attempts; the
# server answers are scripted because a real server cannot be made to answer 503 on cue.


def _scripted(answers: list, seen: list):
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return httpx.Client(transport=httpx.MockTransport(handler))


def _cell_json(owner="o"):
    with ampkit.connect("memory://", agent_id="a") as local:
        return local.remember("x", owner_id=owner).model_dump(mode="json")


UNAVAILABLE = httpx.Response(503, json={"error": {"code": "UNAVAILABLE", "message": "store down", "details": {}}})


def test_idempotent_calls_retry_on_503_and_connection_errors():
    cell = _cell_json()
    seen: list = []
    client = ampkit.Client("http://127.0.0.1:9/amp/v1", agent_id="a", retries=2,
                           http_client=_scripted([UNAVAILABLE, httpx.ConnectError("refused"),
                                                  httpx.Response(200, json=cell)], seen))
    assert client.get(cell["id"]).id == cell["id"]
    assert len(seen) == 3 and str(seen[0].url) == f"http://127.0.0.1:9/amp/v1/memories/{cell['id']}"
    assert seen[0].headers["X-AMP-Agent-ID"] == "a" and "Authorization" not in seen[0].headers


def test_creates_and_unconditional_patches_are_not_resent():
    for call in (lambda c: c.remember("x", owner_id="o"), lambda c: c.update(MISSING_ID, text="y")):
        seen: list = []
        client = ampkit.Client("http://127.0.0.1:9/amp/v1", agent_id="a", retries=3,
                               http_client=_scripted([UNAVAILABLE], seen))
        with pytest.raises(Unavailable):
            call(client)
        assert len(seen) == 1


def test_conditional_patch_and_delete_are_resent():
    cell = _cell_json()
    seen: list = []
    client = ampkit.Client("http://127.0.0.1:9/amp/v1", agent_id="a", api_key="k-123", retries=1,
                           http_client=_scripted([UNAVAILABLE, httpx.Response(200, json=cell)], seen))
    client.update(cell["id"], expected_version=1, text="x")
    assert len(seen) == 2 and seen[1].headers["If-Match"] == "1"
    assert seen[0].headers["Authorization"] == "Bearer k-123"


def test_rate_limited_waits_for_retry_after_then_gives_up():
    limited = httpx.Response(429, headers={"Retry-After": "0"},
                             json={"error": {"code": "RATE_LIMITED", "message": "slow down", "details": {}}})
    seen: list = []
    client = ampkit.Client("http://127.0.0.1:9/amp/v1", agent_id="a", retries=2, http_client=_scripted([limited], seen))
    with pytest.raises(RateLimited) as info:
        client.remember("x", owner_id="o")  # refused before it ran, so even a create is resent
    assert len(seen) == 3 and info.value.details["retry_after"] == "0"


def test_resends_wait_by_backoff_or_retry_after_and_stop_after_the_retries():
    """The waits before resends: 0.1 s doubling (at most 2 s) plus up to 0.1 s of jitter, the
    server's Retry-After for a 429, none once the retries are spent or the call is not safe."""
    from ampkit.client._calls import call as make_call
    from ampkit.client._http import _RetryPolicy

    policy = _RetryPolicy(retries=6)
    get = make_call("get_memory", lambda body: body, path_params={"memory_id": MISSING_ID})
    down = Unavailable("store down")
    for attempt, low in ((1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.6), (6, 2.0)):
        assert low <= policy.delay(get, down, attempt) <= low + 0.1, attempt
    assert policy.delay(get, down, 7) is None
    assert policy.delay(make_call("create_memory", lambda body: body), down, 1) is None  # a create is not resent
    limited = RateLimited("slow down", {"retry_after": "3"})
    assert policy.delay(get, limited, 1) == 3.0


def test_connection_failure_raises_transport_error_not_httpx():
    url = f"http://127.0.0.1:{free_port()}/amp/v1"  # nothing listens there
    with ampkit.connect(url, agent_id="a", retries=1, timeout=2.0) as client:
        with pytest.raises(TransportError) as info:
            client.health()
    assert not isinstance(info.value, httpx.HTTPError)
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert f"GET {url}/health" in str(info.value)  # which server could not be reached


def test_base_url_without_prefix_means_amp_v1(client_server):
    root = client_server.base_url[: -len("/amp/v1")]
    with ampkit.connect(root, agent_id="a") as client:
        assert client.health().status == "ok"


def test_non_envelope_error_still_maps_to_an_api_error():
    seen: list = []
    client = ampkit.Client("http://127.0.0.1:9/amp/v1", agent_id="a", retries=0,
                           http_client=_scripted([httpx.Response(502, text="bad gateway")], seen))
    with pytest.raises(ampkit.APIError) as info:
        client.health()
    assert info.value.status == 502 and info.value.details == {"body": {"text": "bad gateway"}}


# ---------------------------------------------------------------- API keys and PostgreSQL


def test_api_key_is_sent_as_bearer_to_an_auth_server(server_factory, tmp_path):
    store = f"sqlite:///{tmp_path}/auth.db"
    created = run_cli("keys", "create", "--agent", "keyed-agent", "--store", store)
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    server = server_factory(store, args=["--auth"], env={"AMPKIT_ALLOW_CLOCK_OVERRIDE": "false"})  # refused together
    with ampkit.connect(server.base_url, agent_id="keyed-agent", api_key=key) as keyed:
        cell = keyed.remember("behind a key", owner_id="o")
        assert cell.identity.created_by == "keyed-agent"
    with ampkit.connect(server.base_url, agent_id="keyed-agent") as keyless:
        with pytest.raises(ampkit.Unauthorized):
            keyless.get(cell.id)
    with ampkit.connect(server.base_url, agent_id="someone-else", api_key=key) as impostor:
        with pytest.raises(ampkit.Forbidden):
            impostor.get(cell.id)


@pytest.mark.postgres
def test_postgresql_url_runs_in_process(pg_url):
    with ampkit.connect(pg_url, agent_id="pg-agent") as mem:
        assert mem.in_process
        cell = mem.remember("Ada prefers green tea", owner_id="ada")
        assert mem.get(cell.id).scoring.access_count == 1
        assert [r.cell.id for r in mem.search("green tea", owner_id="ada")] == [cell.id]
        mem.forget(cell.id)
        with pytest.raises(AccessDenied):
            mem.get(cell.id)


def test_in_process_async_creates_wait_for_their_group_without_a_thread_each(tmp_path):
    """On SQLite the in-process AsyncClient's creates wait for their group commit on the loop,
    as the server's do: sixteen at once from one loop are written in fewer transactions, by
    the group commit's own thread; the one whose key is taken gets CONFLICT, the others
    their cells; a batch goes the same way; reads still answer."""
    import threading

    from ampkit import Conflict

    async def scenario():
        async with ampkit.AsyncClient(f"sqlite:///{tmp_path}/grouped.db", agent_id="grouper") as client:
            await client.remember("the taken name", owner_id="grouper", key="taken")
            service = client._transport._sync.service
            assert service.commits_in_groups
            ran: list[tuple[int, str]] = []
            run_group = service.writes.group_commit._run_group
            service.writes.group_commit._run_group = lambda group: (ran.append((len(group), threading.current_thread().name)),
                                                         run_group(group))
            writes = [client.remember(f"fact {i}", owner_id="grouper", session_id=f"s{i % 3}") for i in range(15)]
            writes.append(client.remember("wants the name", owner_id="grouper", key="taken"))
            results = await asyncio.gather(*writes, return_exceptions=True)
            batch = await client.remember_many([{"text": f"batch {i}", "owner_id": "grouper"} for i in range(3)])
            listed = [c async for c in client.list(owner_id="grouper")]
            return results, ran, batch, listed

    results, ran, batch, listed = asyncio.run(scenario())
    assert isinstance(results[15], Conflict)
    assert [r.content.text for r in results[:15]] == [f"fact {i}" for i in range(15)]
    assert sum(n for n, _ in ran) == 17 and len(ran) < 17  # 16 creates and one batch, grouped
    assert {name for _, name in ran} == {"ampkit-group-commit_0"}
    assert [c.content.text for c in batch] == ["batch 0", "batch 1", "batch 2"]
    assert {c.content.text for c in listed} == {"the taken name", *(f"fact {i}" for i in range(15)), "batch 0", "batch 1", "batch 2"}


def test_ndjson_export_and_import_in_process(tmp_path):
    source, target = f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"
    with ampkit.connect(source, agent_id="ann") as mem:
        mem.remember_many([{"text": f"note {i}", "owner_id": "ann"} for i in range(5)])
        lines = list(mem.export_ndjson())
        assert sum('"kind":"cell"' in line for line in lines) == 5 and lines[-1] == '{"kind":"end"}\n'
        assert list(mem.export_ndjson(cursor=lines[2].split('"cursor":"')[1].split('"')[0])) == lines[3:]
    with ampkit.connect(target, agent_id="ops") as other:
        assert other.import_ndjson(lines).cells_written == 5
        assert other.import_ndjson(line.rstrip("\n") for line in lines).cells_written == 0  # idempotent
        assert list(other.export_ndjson()) == lines
