"""Memory as files (issue 11): paths on cells, validation, proposals and approval, edits,
grep, search, sessions as read-only files, history. On a real SQLite file and a real
PostgreSQL (the service), and over HTTP through a real server with API keys."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import httpx
import pytest

import ampkit
from ampkit.auth import create_key
from ampkit.errors import AccessDenied, APIError, Conflict, FileManaged, Forbidden, InvalidTransition, ValidationFailed
from ampkit.files import ApprovalMode, ApproveRequest, FileDelete, FileEdit, FileSearchRequest, FileWrite, RejectRequest
from ampkit.models import AccessPolicy, CellCreate, CellPatch
from ampkit.service import MemoryService
from ampkit.store import store_from_url
from ampkit.store.sqlite import SQLiteStore
from support import TLS, ManualClock

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
GOOD_SKILL = "---\nname: release-notes\ndescription: Write release notes from merged pull requests.\n---\n# Steps\n1. List PRs\n"
BAD_SKILL = "---\nname: Release_Notes\nlicense: 3\nmood: happy\n---\nbody\n"
BAD_TOOLS = '{"mcpServers": {"gh": {"command": "", "args": "x"}, "web": {"url": "ftp://x", "tools": [1]}}, "extra": true}'


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


@pytest.fixture(params=["sqlite", "postgres"])
def service(request, tmp_path):
    url = f"sqlite:///{tmp_path}/files.db" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    store = store_from_url(url)
    store.open()
    yield MemoryService(store=store, clock=Clock())
    store.close()


def write(svc, agent, owner, path, content, **kw):
    return svc.files.write(agent, FileWrite(owner_id=owner, path=path, content=content, **kw))


def test_review_mode_proposes_and_an_approval_lands_the_proposers_version(service):
    files = service.files
    result = write(service, "agent-42", "alice", "/AGENTS.md", "# Rules\n- use bullet points\n", reason="user asked")
    assert result.status == "proposed" and "awaits a person's approval" in result.message
    with pytest.raises(AccessDenied):  # the file does not change until approved
        files.read("alice", "alice", "AGENTS.md")
    proposal = files.proposal("alice", result.proposal_id)
    assert proposal.diff.startswith("--- /dev/null\n+++ b/AGENTS.md") and "+- use bullet points" in proposal.diff
    assert proposal.reason == "user asked" and proposal.proposed_by == "agent-42"

    with pytest.raises(Forbidden, match="cannot decide it"):  # never the proposing agent, whatever its scopes
        files.approve("agent-42", result.proposal_id, may_approve=True)
    with pytest.raises(AccessDenied):  # a stranger without the approve scope does not even see it
        files.approve("mallory", result.proposal_id)
    with pytest.raises(Forbidden, match="only a person may approve"):  # a new file agent-42 put there
        files.approve("alice", result.proposal_id)  # not by the owner's agent
    approved = files.approve("alice", result.proposal_id, ApproveRequest(message="ok"), in_person=True)  # the owner
    assert approved.status == "approved" and approved.decided_by == "alice" and approved.result_version == 1

    read = files.read("agent-42", "alice", "AGENTS.md")
    assert read.content == "# Rules\n- use bullet points\n" and read.version == 1
    cell = service.get("alice", files.list("alice", "alice").results[0].id)
    assert cell.type == "procedural" and cell.identity.path == "AGENTS.md" and cell.identity.created_by == "agent-42"
    with pytest.raises(InvalidTransition):
        files.reject("alice", result.proposal_id)


def test_edit_then_approve_stale_proposals_and_history(service):
    files = service.files
    files.set_approval_mode("ops", ApprovalMode(owner_id="alice", approval_mode="yolo"))
    team = AccessPolicy(readable_by=["agent-*"], writable_by=["agent-*"])
    assert write(service, "alice", "alice", "AGENTS.md", "# Rules\n- be brief\n", access_policy=team).status == "written"
    files.set_approval_mode("ops", ApprovalMode(owner_id="alice", approval_mode="review"))

    first = files.edit("agent-42", FileEdit(owner_id="alice", path="AGENTS.md", old="be brief", new="use bullets"))
    second = files.edit("agent-7", FileEdit(owner_id="alice", path="AGENTS.md", old="be brief", new="be kind"))
    assert first.status == second.status == "proposed"
    done = files.approve("human:ann", first.proposal_id, ApproveRequest(content="# Rules\n- use bullet points\n"),
                         may_approve=True)
    assert done.result_version == 2
    with pytest.raises(Conflict, match="stale"):  # the file moved on since the second was proposed
        files.approve("human:ann", second.proposal_id, may_approve=True)
    assert files.proposal("alice", second.proposal_id).status == "pending"

    history = files.history("alice", "alice", "AGENTS.md").results
    assert [(v.version, v.actor, v.approved_by) for v in history] == [(1, "alice", None), (2, "agent-42", "human:ann")]
    assert "-- be brief\n+- use bullet points" in history[1].diff  # the approver's edited text landed


def test_reject_leaves_the_file_and_tells_the_proposer(service):
    files = service.files
    files.set_approval_mode("ops", ApprovalMode(owner_id="agent-42", approval_mode="yolo"))
    write(service, "agent-42", "agent-42", "AGENTS.md", "# Rules\n- paragraphs\n")
    files.set_approval_mode("ops", ApprovalMode(owner_id="agent-42", approval_mode="review"))
    proposed = files.edit("agent-42", FileEdit(owner_id="agent-42", path="AGENTS.md", old="paragraphs", new="bullets"))
    files.reject("human:ann", proposed.proposal_id, RejectRequest(message="keep paragraphs"), may_approve=True)
    assert files.read("agent-42", "agent-42", "AGENTS.md").content == "# Rules\n- paragraphs\n"
    told = files.read("agent-42", "agent-42", "proposals.md").content
    assert f"{proposed.proposal_id} write `AGENTS.md`: rejected by human:ann (keep paragraphs)" in told


def test_invalid_skill_and_tools_json_are_refused_with_every_error_and_nothing_is_stored(service):
    files = service.files
    for mode in ("review", "yolo"):
        files.set_approval_mode("ops", ApprovalMode(owner_id="alice", approval_mode=mode))
        with pytest.raises(ValidationFailed) as skill:
            write(service, "alice", "alice", "skills/release-notes/SKILL.md", BAD_SKILL)
        locs = [(e["loc"], e["message"]) for e in skill.value.details["errors"]]
        assert {loc for loc, _ in locs} == {"frontmatter.name", "frontmatter.description", "frontmatter.license",
                                            "frontmatter.mood"}
        assert any("must equal the skill's directory name ('release-notes')" in m for _, m in locs)
        with pytest.raises(ValidationFailed) as tools:
            write(service, "alice", "alice", "tools.json", BAD_TOOLS)
        got = {e["loc"] for e in tools.value.details["errors"]}
        assert got == {"/", "/mcpServers/gh/command", "/mcpServers/gh/args", "/mcpServers/web/url",
                       "/mcpServers/web/tools/0"}
        assert files.list("alice", "alice").results == [] and files.proposals("alice", "alice").results == []
    assert write(service, "alice", "alice", "skills/release-notes/SKILL.md", GOOD_SKILL).status == "written"
    ok_tools = '{"mcpServers": {"gh": {"command": "npx", "args": ["gh-mcp"], "tools": ["search_issues"]}}}'
    assert write(service, "alice", "alice", "tools.json", ok_tools).status == "written"
    with pytest.raises(ValidationFailed, match="AGENTS.md is 40000 bytes"):
        write(service, "alice", "alice", "AGENTS.md", "x" * 40000)
    with pytest.raises(ValidationFailed, match="subagents/critic.md"):
        write(service, "alice", "alice", "subagents/critic.md", "---\nname: critic\ndescription: Reviews\n---\n")


def test_edit_is_exact_replacement_and_versions_never_lose_an_update(service):
    files = service.files
    files.set_approval_mode("ops", ApprovalMode(owner_id="alice", approval_mode="yolo"))
    write(service, "alice", "alice", "notes/todo.md", "a\nb\na\n")
    with pytest.raises(ValidationFailed, match="occurs 2 times") as many:
        files.edit("alice", FileEdit(owner_id="alice", path="notes/todo.md", old="a", new="c"))
    assert many.value.details == {"occurrences": 2}
    with pytest.raises(ValidationFailed, match="not found"):
        files.edit("alice", FileEdit(owner_id="alice", path="notes/todo.md", old="zzz", new="c"))
    done = files.edit("alice", FileEdit(owner_id="alice", path="notes/todo.md", old="a", new="c", replace_all=True))
    assert done.occurrences == 2 and files.read("alice", "alice", "notes/todo.md").content == "c\nb\nc\n"
    with pytest.raises(Conflict):
        write(service, "alice", "alice", "notes/todo.md", "lost?", expected_version=1)

    errors: list[Exception] = []

    def bump(n: int) -> None:
        try:
            files.edit("alice", FileEdit(owner_id="alice", path="notes/todo.md", old="b", new=f"b{n}"))
        except APIError as exc:
            errors.append(exc)
    threads = [threading.Thread(target=bump, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Each edit read the text under the row lock: every one applied on top of the previous.
    final = files.read("alice", "alice", "notes/todo.md")
    assert errors == [] and final.version == 2 + 4
    assert sorted(final.content.split("\n")[1][1:]) == ["0", "1", "2", "3"]


def test_paths_are_unique_among_live_cells_and_files_change_only_through_the_files_api(service):
    files = service.files
    files.set_approval_mode("ops", ApprovalMode(owner_id="alice", approval_mode="yolo"))
    write(service, "alice", "alice", "kb/glossary.md", "AMP: agent memory protocol\n")
    cell = service.get("alice", files.list("alice", "alice").results[0].id)
    clash = cell.model_copy(update={"id": "mem_" + "9" * 26})
    with pytest.raises(Exception):  # the unique index, whatever the database calls it
        with service.store.write() as tx:
            tx.insert(clash)
    with pytest.raises(ValidationFailed, match="identity.path is set by the files API"):
        service.create("alice", CellCreate.model_validate(
            {"content": {"text": "x"}, "identity": {"owner_id": "alice", "path": "kb/other.md"}}))
    with pytest.raises(FileManaged, match="memory file"):
        service.update("alice", cell.id, CellPatch.model_validate({"content": {"text": "sneaky"}}))
    with pytest.raises(FileManaged, match="memory file"):
        service.delete("alice", cell.id)
    assert files.delete("alice", FileDelete(owner_id="alice", path="kb/glossary.md")).status == "deleted"
    assert write(service, "alice", "alice", "kb/glossary.md", "new\n").version == 1  # the path is free again


def test_sessions_are_read_only_files_and_grep_and_search_find_lines(service):
    files = service.files
    for text, role in (("I deploy on Fridays", "user"), ("Noted: Friday deploys", "assistant")):
        service.create("alice", CellCreate.model_validate({
            "type": "episodic", "content": {"text": text, "metadata": {"role": role}},
            "identity": {"owner_id": "alice", "session_id": "chat/1"}, "access_policy": {"readable_by": ["carol"]}}))
    service.create("bob", CellCreate.model_validate({  # in the same session, but carol may not read it
        "type": "episodic", "content": {"text": "secret Friday plan"}, "identity": {"owner_id": "alice", "session_id": "chat/1"}}))
    files.set_approval_mode("ops", ApprovalMode(owner_id="alice", approval_mode="yolo"))
    write(service, "alice", "alice", "kb/deploy.md", "# Deploys\nWe deploy on Fridays after noon.\n\n# Rollback\nUse the runbook.\n",
          access_policy=AccessPolicy(readable_by=["carol"]))
    listed = {f.path: f for f in files.list("carol", "alice").results}
    assert listed["sessions/chat%2F1.md"].read_only and listed["sessions/chat%2F1.md"].type == "episodic"
    session = files.read("carol", "alice", "sessions/chat%2F1.md").content
    assert "user: I deploy on Fridays" in session and "secret" not in session
    assert "secret" in files.read("alice", "alice", "sessions/chat%2F1.md").content  # the owner reads all
    with pytest.raises(ValidationFailed, match="read-only"):
        write(service, "alice", "alice", "sessions/chat%2F1.md", "rewrite the past")
    grep = files.grep("carol", "alice", "Friday")
    assert [(m.path, m.line) for m in grep.matches] == [("kb/deploy.md", 2), ("sessions/chat%2F1.md", 1),
                                                       ("sessions/chat%2F1.md", 2)]
    assert [m.path for m in files.grep("alice", "alice", "Friday", glob="kb/**").matches] == ["kb/deploy.md"]
    hits = files.search("alice", FileSearchRequest(owner_id="alice", query="rollback runbook")).results
    assert (hits[0].path, hits[0].start_line, hits[0].end_line) == ("kb/deploy.md", 4, 5)
    page = files.read("alice", "alice", "kb/deploy.md", offset=1, limit=1)
    assert (page.content, page.start_line, page.end_line, page.total_lines, page.next_offset) == \
        ("We deploy on Fridays after noon.\n", 2, 2, 5, 2)


def test_folder_import_is_validated_as_a_whole(service):
    files = service.files
    with pytest.raises(ValidationFailed) as refused:
        files.import_folder("human:ann", "alice", {"AGENTS.md": "# ok\n", "skills/x/SKILL.md": BAD_SKILL,
                                                   "tools.json": "{"})
    assert {e["path"] for e in refused.value.details["errors"]} == {"skills/x/SKILL.md", "tools.json"}
    assert files.folder(None, "alice") == {}
    files.import_folder("human:ann", "alice", {"AGENTS.md": "# ok\n"})
    assert files.history(None, "alice", "AGENTS.md").results[0].actor == "human:ann"


# ---------------------------------------------------------------- over HTTP, with keys
def test_http_routes_keys_and_the_approve_scope(tmp_path, server_factory):
    path = tmp_path / "auth.db"
    store = SQLiteStore(str(path))
    store.open()
    agent = create_key(store, "agent-42", "read,write").token
    human = create_key(store, "human:ann", "read,approve").token
    other = create_key(store, "bob", "read,write").token
    ops = create_key(store, "ops", "read,write,admin").token
    store.close()
    srv = server_factory(f"sqlite:///{path}", args=["--auth"], clock=ManualClock())
    url = srv.base_url

    with ampkit.connect(url, api_key=agent) as a, ampkit.connect(url, api_key=human) as h, \
            ampkit.connect(url, api_key=other) as b, ampkit.connect(url, api_key=ops) as o:
        proposed = a.write_file("/AGENTS.md", "# Rules\n- bullets\n", owner_id="agent-42", reason="asked")
        assert proposed.status == "proposed"
        assert [p.id for p in h.list_proposals(owner_id="agent-42", status="pending")] == [proposed.proposal_id]
        assert b.list_proposals(owner_id="agent-42") == []  # bob may not read the folder, nor approve
        with pytest.raises(AccessDenied):
            b.approve_proposal(proposed.proposal_id)
        with pytest.raises(Forbidden):
            a.approve_proposal(proposed.proposal_id)
        with pytest.raises(Forbidden):  # only an admin sets the mode
            a.set_approval_mode("agent-42", "yolo")
        assert h.approve_proposal(proposed.proposal_id).status == "approved"
        assert a.read_file("AGENTS.md", owner_id="agent-42").content == "# Rules\n- bullets\n"
        assert o.set_approval_mode("agent-42", "yolo").approval_mode == "yolo"
        assert a.edit_file("AGENTS.md", "bullets", "bullet points", owner_id="agent-42").version == 2
        history = a.file_history("AGENTS.md", owner_id="agent-42").results
        assert [(v.actor, v.approved_by) for v in history] == [("agent-42", "human:ann"), ("agent-42", None)]

        with pytest.raises(ValidationFailed) as bad:
            a.write_file("tools.json", BAD_TOOLS, owner_id="agent-42")
        assert len(bad.value.details["errors"]) == 5
        raw = httpx.post(f"{url}/files/write", headers={"Authorization": f"Bearer {agent}"},
                         json={"owner_id": "agent-42", "path": "../etc/passwd", "content": "x"}, verify=TLS)
        assert raw.status_code == 422 and raw.json()["error"]["code"] == "VALIDATION_ERROR"
        missing = httpx.get(f"{url}/files", headers={"Authorization": f"Bearer {agent}"}, verify=TLS)
        assert missing.status_code == 422 and "owner_id" in missing.json()["error"]["message"]
        assert [m.line for m in a.grep_files("bullet", owner_id="agent-42").matches] == [2]


async def test_async_client_in_process(tmp_path):
    url = f"sqlite:///{tmp_path}/a.db"
    async with ampkit.aconnect(url, agent_id="agent-1") as a, ampkit.aconnect(url, agent_id="human:ann") as h:
        proposed = await a.write_file("AGENTS.md", "# hi\n", owner_id="agent-1")
        assert (await h.approve_proposal(proposed.proposal_id, message="fine")).status == "approved"
        assert (await a.read_file("AGENTS.md", owner_id="agent-1")).content == "# hi\n"
        assert [f.path for f in (await a.list_files("agent-1")).results] == ["AGENTS.md", "proposals.md"]
