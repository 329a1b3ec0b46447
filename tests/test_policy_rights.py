"""Trust where roles meet (issue 42): writing never grants reading, by any route; history
respects grant time. Through a real server on SQLite and PostgreSQL, plus the in-process
client, MCP, the inspector and an admin key.

- A writer-only agent could PATCH `access_policy` (public, or its own name in readable_by)
  and then read the cell, a memory file's text included; a rollback to a version whose
  policy named it did the same; a superseding write could set any policy.
- A reader granted access today read, in `GET /memories/{id}/history`, the text of versions
  that were private before the grant.
"""

from __future__ import annotations

import itertools
import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support import TLS, AppServer

_serial = itertools.count(1)


def fresh(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}-{next(_serial)}"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def store_url(request, tmp_path_factory) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('policy-sqlite')}/memory.db"
    pg = request.getfixturevalue("pg_server")
    return pg.create_database(f"policy_{os.getpid()}_{uuid.uuid4().hex[:8]}", template="ampkit_template")


@pytest.fixture(scope="module")
def server(store_url, tmp_path_factory) -> Iterator[AppServer]:
    proc = AppServer(store_url, args=["--lifecycle-interval", "0"], env={"AMPKIT_EMBEDDER": "none"},
                     log_path=tmp_path_factory.mktemp("policy-log") / "server.log")
    proc.start()
    yield proc
    proc.stop()


def call(server: AppServer, agent: str, method: str, path: str, body: Any = None, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, server.base_url + path, json=body, headers={"X-AMP-Agent-ID": agent}, timeout=30,
                         verify=TLS, **kwargs)


def create(server: AppServer, agent: str, text: str, owner: str, **policy: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"content": {"text": text}, "identity": {"owner_id": owner}, "dedup": "off"}
    if policy:
        body["access_policy"] = policy
    r = call(server, agent, "POST", "/memories", body)
    assert r.status_code == 201, r.text
    return r.json()


def assert_denied_policy_change(r: httpx.Response) -> None:
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "POLICY_CHANGE_DENIED", r.text
    assert set(r.json()) == {"error"} and set(r.json()["error"]) == {"code", "message", "details"}


POLICY_GRABS = [{"public": True}, {"readable_by": ["{writer}"]}, {"readable_by": ["*"]},
                {"writable_by": ["{writer}", "friend-*"]}, {"public": True, "readable_by": []}]


def _grab(template: dict[str, Any], writer: str) -> dict[str, Any]:
    return json.loads(json.dumps(template).replace("{writer}", writer))


# ------------------------------------------------------------------ 1. PATCH
@pytest.mark.parametrize("grab", POLICY_GRABS)
def test_a_writer_cannot_change_the_policy_by_patch(server, grab):
    owner, writer = fresh("ada"), fresh("scribe")
    cell = create(server, owner, "the alarm code is 7731", owner, writable_by=[writer])
    r = call(server, writer, "PATCH", f"/memories/{cell['id']}", {"access_policy": _grab(grab, writer)})
    assert_denied_policy_change(r)
    assert call(server, writer, "GET", f"/memories/{cell['id']}").status_code == 403
    now = call(server, owner, "GET", f"/memories/{cell['id']}").json()
    assert now["access_policy"] == cell["access_policy"] and now["lifecycle"]["version"] == 1
    # A patch that also changes content is refused whole: nothing changes.
    r = call(server, writer, "PATCH", f"/memories/{cell['id']}",
             {"content": {"text": "overwritten"}, "access_policy": _grab(grab, writer)})
    assert_denied_policy_change(r)
    assert call(server, owner, "GET", f"/memories/{cell['id']}").json()["content"]["text"] == "the alarm code is 7731"
    # The writer still writes content, blindly.
    r = call(server, writer, "PATCH", f"/memories/{cell['id']}", {"content": {"text": "the alarm code changed"}})
    assert r.status_code == 204, r.text


def test_a_writer_only_agent_is_refused_on_sight_of_the_policy(server):
    """Even the current policy, sent back unchanged, is refused to an agent that may not read
    the cell: the answer must not tell whether its guess equalled a policy it cannot see."""
    owner, writer = fresh("ada"), fresh("scribe")
    cell = create(server, owner, "diary", owner, writable_by=[writer])
    answers = set()
    for guess in (cell["access_policy"], {"readable_by": [], "writable_by": ["nobody"], "public": False}):
        r = call(server, writer, "PATCH", f"/memories/{cell['id']}", {"access_policy": guess})
        answers.add((r.status_code, r.content))
    assert len(answers) == 1, answers
    assert_denied_policy_change(r)


def test_a_reader_writer_may_send_the_policy_back_unchanged_but_not_change_it(server):
    owner, helper = fresh("ada"), fresh("helper")
    cell = create(server, owner, "team note", owner, readable_by=[helper], writable_by=[helper])
    r = call(server, helper, "PATCH", f"/memories/{cell['id']}",
             {"content": {"text": "team note, edited"}, "access_policy": cell["access_policy"]})
    assert r.status_code == 200, r.text
    r = call(server, helper, "PATCH", f"/memories/{cell['id']}", {"access_policy": {"writable_by": [helper, "x-*"]}})
    assert_denied_policy_change(r)


def test_owner_and_creator_change_the_policy(server):
    owner, creator, reader = fresh("ada"), fresh("assistant"), fresh("bob")
    cell = create(server, creator, "shared later", owner)
    for agent in (owner, creator):
        r = call(server, agent, "PATCH", f"/memories/{cell['id']}", {"access_policy": {"readable_by": [reader]}})
        assert r.status_code == 200, r.text
    assert call(server, reader, "GET", f"/memories/{cell['id']}").status_code == 200


def test_a_writer_cannot_read_a_memory_file_by_changing_its_policy(server):
    owner, writer = fresh("ada"), fresh("scribe")
    assert call(server, owner, "PUT", "/files/mode", {"owner_id": owner, "approval_mode": "yolo"}).status_code == 200
    r = call(server, owner, "POST", "/files/write", {"owner_id": owner, "path": "notes/private.md",
                                                     "content": "the safe code is 3141\n",
                                                     "access_policy": {"writable_by": [writer]}})
    assert r.status_code == 200 and r.json()["status"] == "written", r.text
    listed = call(server, owner, "GET", "/memories", params={"owner_id": owner}).json()["results"]
    (file_cell,) = [c for c in listed if c["identity"]["path"] == "notes/private.md"]
    for grab in POLICY_GRABS:
        # A file changes only through the files API (409 USE_FILES_API), which applies the same rule.
        r = call(server, writer, "PATCH", f"/memories/{file_cell['id']}", {"access_policy": _grab(grab, writer)})
        assert r.status_code == 409 and r.json()["error"]["code"] == "USE_FILES_API", r.text
        r = call(server, writer, "POST", "/files/write", {"owner_id": owner, "path": "notes/private.md",
                                                          "content": "the safe code is 3141\n",
                                                          "access_policy": _grab(grab, writer)})
        assert r.status_code == 403 and r.json()["error"]["code"] == "POLICY_CHANGE_DENIED", r.text
    r = call(server, writer, "GET", "/files/read", params={"owner_id": owner, "path": "notes/private.md"})
    assert r.status_code == 403, r.text
    assert "3141" not in r.text


# ------------------------------------------------------------------ 1. rollback
def test_a_writers_rollback_restores_content_and_keeps_the_policy(server):
    owner, writer = fresh("ada"), fresh("scribe")
    cell = create(server, owner, "v1 text", owner, readable_by=[writer], writable_by=[writer])
    r = call(server, owner, "PATCH", f"/memories/{cell['id']}",
             {"content": {"text": "v2 private text"}, "access_policy": {"readable_by": []}})
    assert r.status_code == 200, r.text
    assert call(server, writer, "GET", f"/memories/{cell['id']}").status_code == 403
    r = call(server, writer, "POST", f"/memories/{cell['id']}/rollback", {"to_version": 1})
    assert r.status_code == 204, r.text  # applied; the writer still may not read
    assert call(server, writer, "GET", f"/memories/{cell['id']}").status_code == 403
    now = call(server, owner, "GET", f"/memories/{cell['id']}").json()
    assert now["content"]["text"] == "v1 text" and now["lifecycle"]["version"] == 3
    assert now["access_policy"]["readable_by"] == []
    # The owner's rollback restores the policy as well.
    r = call(server, owner, "POST", f"/memories/{cell['id']}/rollback", {"to_version": 1})
    assert r.status_code == 200 and r.json()["access_policy"]["readable_by"] == [writer], r.text


# ------------------------------------------------------------------ 1. supersede
def test_a_writers_replacement_keeps_the_replaced_cells_policy(server):
    owner, writer, reader = fresh("ada"), fresh("scribe"), fresh("bob")
    old = create(server, owner, "the meeting is at 10", owner, readable_by=[reader], writable_by=[writer])
    base = {"content": {"text": "the meeting is at 11"}, "identity": {"owner_id": owner}, "supersedes": old["id"]}
    for grab in POLICY_GRABS:
        r = call(server, writer, "POST", "/memories", {**base, "access_policy": _grab(grab, writer)})
        assert_denied_policy_change(r)
        r = call(server, writer, "POST", "/memories/batch", {"cells": [{**base, "access_policy": _grab(grab, writer)}]})
        assert_denied_policy_change(r)
    assert call(server, owner, "GET", f"/memories/{old['id']}").json()["lifecycle"]["superseded_by"] is None
    r = call(server, writer, "POST", "/memories", base)  # no policy named: it takes the old one's
    assert r.status_code == 201, r.text
    new = r.json()
    assert new["access_policy"] == old["access_policy"]
    assert call(server, reader, "GET", f"/memories/{new['id']}").status_code == 200  # the old readers keep the fact


def test_a_reader_writer_supersedes_with_the_same_policy_only(server):
    owner, helper = fresh("ada"), fresh("helper")
    old = create(server, owner, "the office is on floor 3", owner, readable_by=[helper], writable_by=[helper])
    base = {"content": {"text": "the office is on floor 4"}, "identity": {"owner_id": owner}, "supersedes": old["id"]}
    assert_denied_policy_change(call(server, helper, "POST", "/memories", {**base, "access_policy": {"public": True}}))
    r = call(server, helper, "POST", "/memories", {**base, "access_policy": old["access_policy"]})
    assert r.status_code == 201, r.text


def test_the_owner_supersedes_with_any_policy(server):
    owner = fresh("ada")
    old = create(server, owner, "draft", owner)
    r = call(server, owner, "POST", "/memories", {"content": {"text": "published"}, "identity": {"owner_id": owner},
                                                  "supersedes": old["id"], "access_policy": {"public": True}})
    assert r.status_code == 201 and r.json()["access_policy"]["public"] is True, r.text


# ------------------------------------------------------------------ 4. history and grant time
def test_history_hides_what_a_late_reader_could_not_read_then(server):
    owner, reader = fresh("ada"), fresh("bob")
    cell = create(server, owner, "private draft 1931", owner)
    cid = cell["id"]
    assert call(server, owner, "PATCH", f"/memories/{cid}", {"content": {"text": "private draft 2804"}}).status_code == 200
    assert call(server, owner, "PATCH", f"/memories/{cid}", {"access_policy": {"readable_by": [reader]}}).status_code == 200
    assert call(server, owner, "PATCH", f"/memories/{cid}", {"content": {"text": "shared text 5512"}}).status_code == 200
    r = call(server, reader, "GET", f"/memories/{cid}/history")
    assert r.status_code == 200, r.text
    entries = r.json()["results"]
    assert [e["action"] for e in entries] == ["create", "update", "update", "update"]
    assert [e["seq"] for e in entries] == [1, 2, 3, 4]
    assert "1931" not in r.text  # never readable by bob
    assert [e["changes"] for e in entries[:3]] == [{}, {}, {}]
    # After the grant: bob could read "private draft 2804" then, so the last change shows it.
    assert entries[3]["changes"]["content.text"] == ["private draft 2804", "shared text 5512"]
    # The owner sees everything.
    owned = call(server, owner, "GET", f"/memories/{cid}/history").json()["results"]
    assert owned[1]["changes"]["content.text"] == ["private draft 1931", "private draft 2804"]
    # As-of reads agree: the version before the grant is not bob's to read.
    assert call(server, reader, "GET", f"/memories/{cid}", params={"as_of": entries[1]["at"]}).status_code == 403


def test_history_after_a_revocation_and_a_new_grant(server):
    owner, reader = fresh("ada"), fresh("bob")
    cell = create(server, owner, "open text 1", owner, readable_by=[reader])
    cid = cell["id"]
    for body in ({"access_policy": {"readable_by": []}}, {"content": {"text": "closed text 2"}},
                 {"access_policy": {"readable_by": [reader]}}):
        assert call(server, owner, "PATCH", f"/memories/{cid}", body).status_code == 200
    r = call(server, reader, "GET", f"/memories/{cid}/history")
    entries = r.json()["results"]
    assert entries[0]["changes"]["type"] == "semantic"  # readable when created
    assert entries[1]["changes"] == {}  # the revocation: the version after it was not bob's
    assert entries[2]["changes"] == {}  # written while revoked
    assert entries[3]["changes"] == {}  # the new grant: the version before it was not bob's


# ------------------------------------------------------------------ 1. the other routes
def test_an_admin_key_changes_any_policy_and_auth_off_is_no_admin(store_url):
    """With auth required, a key holding `admin` may change the policy of a cell it may write
    (and does not own); a read,write key of a writer may not. With auth off every caller
    holds every scope, which is not an admin key (the server above refuses the writer)."""
    from ampkit.auth import create_key
    from ampkit.config import Settings
    from ampkit.server.app import create_app
    from starlette.testclient import TestClient

    settings = Settings(store=store_url, auth="required", embedder="none", lifecycle_interval_seconds=0)
    app = create_app(settings)
    owner, writer, ops = fresh("ada"), fresh("scribe"), fresh("ops")
    with TestClient(app, base_url="http://testserver/amp/v1") as http:
        store = app.state.service.store
        keys = {agent: {"Authorization": f"Bearer {create_key(store, agent, scopes).token}"}
                for agent, scopes in ((owner, "read,write"), (writer, "read,write"), (ops, "read,write,admin"))}
        cell = http.post("/memories", json={"content": {"text": "ops may open this"}, "identity": {"owner_id": owner},
                                            "access_policy": {"writable_by": [writer, ops]}}, headers=keys[owner]).json()
        assert_denied_policy_change(http.patch(f"/memories/{cell['id']}", json={"access_policy": {"public": True}},
                                               headers=keys[writer]))
        r = http.patch(f"/memories/{cell['id']}", json={"access_policy": {"readable_by": [writer]}}, headers=keys[ops])
        assert r.status_code == 204, r.text  # applied; ops may write the cell, not read it
        assert http.get(f"/memories/{cell['id']}", headers=keys[writer]).status_code == 200


def test_the_in_process_client_follows_the_rule(tmp_path):
    import ampkit
    from ampkit.errors import PolicyChangeDenied

    url = f"sqlite:///{tmp_path}/local.db"
    with ampkit.connect(url, agent_id="ada") as ada, ampkit.connect(url, agent_id="scribe") as scribe:
        cell = ada.remember("the alarm code is 7731", owner_id="ada", writable_by=["scribe"])
        with pytest.raises(PolicyChangeDenied):
            scribe.update(cell.id, public=True)
        with pytest.raises(PolicyChangeDenied):
            scribe.update(cell.id, readable_by=["scribe"])
        assert ada.get(cell.id).access_policy == cell.access_policy


def test_mcp_update_tool_follows_the_rule(tmp_path):
    import anyio
    from ampkit.bootstrap import build_service, settings_for_store
    from ampkit.mcp_server import ServiceGateway, build_mcp_server, fixed_caller
    from ampkit.server.identity import Caller

    service = build_service(settings_for_store(f"sqlite:///{tmp_path}/mcp.db"))
    service.store.open()
    try:
        cell = service.create("ada", _create_body("the alarm code is 7731", "ada", writable_by=["scribe"]))
        server = build_mcp_server(ServiceGateway(service, fixed_caller(Caller("scribe"))))

        async def grab() -> Any:
            return await server.call_tool("update_memory", {"id": cell.id, "readable_by": ["scribe"]})

        result = anyio.run(grab)
        assert result.isError and "POLICY_CHANGE_DENIED" in result.content[0].text, result
        assert service.store.get(cell.id).access_policy == cell.access_policy
    finally:
        service.store.close()


def test_inspector_edit_by_a_writer_cannot_change_the_policy(tmp_path):
    import re

    from ampkit.bootstrap import build_service, settings_for_store
    from ampkit.inspector import create_inspector_app
    from starlette.applications import Starlette
    from starlette.routing import Mount
    from starlette.testclient import TestClient

    service = build_service(settings_for_store(f"sqlite:///{tmp_path}/ui.db"))
    service.store.open()
    try:
        cell = service.create("ada", _create_body("team note", "ada", readable_by=["helper"], writable_by=["helper"]))
        app = create_inspector_app(service, auth_required=False)
        with TestClient(Starlette(routes=[Mount("/ui", app)])) as client:
            token = re.search(r'name="csrf" value="([^"]+)"', client.get("/ui/signin").text)
            assert token is not None
            r = client.post("/ui/signin", data={"csrf": token.group(1), "credential": "helper"}, follow_redirects=False)
            assert r.status_code == 303, r.text
            page = client.get(f"/ui/cells/{cell.id}/edit").text
            csrf = re.search(r'name="csrf" value="([^"]+)"', page)
            assert csrf is not None
            form = {"csrf": csrf.group(1), "text": "team note", "metadata": "{}", "importance": "0.5",
                    "confidence": "1", "readable_by": "helper\nhelper-friend", "writable_by": "helper",
                    "version": "1"}
            r = client.post(f"/ui/cells/{cell.id}/edit", data=form, follow_redirects=False)
            assert r.status_code == 403, r.text
        assert service.store.get(cell.id).access_policy.readable_by == ["helper"]
    finally:
        service.store.close()


def _create_body(text: str, owner: str, **policy: Any) -> Any:
    from ampkit.models import CellCreate

    return CellCreate.model_validate({"content": {"text": text}, "identity": {"owner_id": owner},
                                      "access_policy": policy, "dedup": "off"})


def test_import_never_changes_the_policy_of_a_stored_cell(server):
    """`/admin/import` (and `ampkit import`, the same function) writes new cells only: a file
    that gives a stored cell another policy is a conflict, and nothing is written."""
    owner, writer = fresh("ada"), fresh("scribe")
    cell = create(server, owner, "private plans", owner, writable_by=[writer])
    r = call(server, owner, "GET", "/admin/export", params={"owner_id": owner})
    assert r.status_code == 200, r.text
    lines = [json.loads(line) for line in r.text.splitlines()]
    for line in lines:
        if line.get("kind") == "cell" and line["cell"]["id"] == cell["id"]:
            line["cell"]["access_policy"]["readable_by"] = [writer]
    body = "".join(json.dumps(line) + "\n" for line in lines)
    r = httpx.post(server.base_url + "/admin/import", content=body.encode(), timeout=30, verify=TLS,
                   headers={"X-AMP-Agent-ID": writer, "Content-Type": "application/x-ndjson"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "CONFLICT", r.text
    assert call(server, writer, "GET", f"/memories/{cell['id']}").status_code == 403


def test_file_history_hides_what_a_late_reader_could_not_read_then(server):
    owner, reader = fresh("ada"), fresh("bob")
    assert call(server, owner, "PUT", "/files/mode", {"owner_id": owner, "approval_mode": "yolo"}).status_code == 200

    def write(text: str, **extra: Any) -> None:
        r = call(server, owner, "POST", "/files/write",
                 {"owner_id": owner, "path": "notes/plan.md", "content": text, **extra})
        assert r.status_code == 200 and r.json()["status"] == "written", r.text

    write("private plan 1931\n")
    write("private plan 2804\n")
    # The grant goes through the files API (a file changes only there): version 3, text unchanged.
    write("private plan 2804\n", access_policy={"readable_by": [reader]})
    write("shared plan 5512\n")
    r = call(server, reader, "GET", "/files/history", params={"owner_id": owner, "path": "notes/plan.md"})
    assert r.status_code == 200, r.text
    versions = r.json()["results"]
    assert [v["version"] for v in versions] == [1, 2, 4]
    assert "1931" not in r.text and [v["diff"] for v in versions[:2]] == ["", ""]
    assert "-private plan 2804" in versions[2]["diff"] and "+shared plan 5512" in versions[2]["diff"]
    owned = call(server, owner, "GET", "/files/history", params={"owner_id": owner, "path": "notes/plan.md"})
    assert "1931" in owned.text


def test_mcp_and_inspector_history_hide_what_a_late_reader_could_not_read_then(tmp_path):
    import re

    import anyio
    from ampkit.bootstrap import build_service, settings_for_store
    from ampkit.inspector import create_inspector_app
    from ampkit.mcp_server import ServiceGateway, build_mcp_server, fixed_caller
    from ampkit.models import CellPatch
    from ampkit.server.identity import Caller
    from starlette.applications import Starlette
    from starlette.routing import Mount
    from starlette.testclient import TestClient

    service = build_service(settings_for_store(f"sqlite:///{tmp_path}/late.db"))
    service.store.open()
    try:
        cell = service.create("ada", _create_body("private draft 1931", "ada"))
        for body in ({"content": {"text": "private draft 2804"}}, {"access_policy": {"readable_by": ["bob"]}}):
            service.update("ada", cell.id, CellPatch.model_validate(body))
        server = build_mcp_server(ServiceGateway(service, fixed_caller(Caller("bob"))))

        async def ask() -> list[str]:
            tool = await server.call_tool("memory_history", {"id": cell.id})
            resource = await server.read_resource(f"amp://memories/{cell.id}/history")
            return [tool.content[0].text, *(str(getattr(c, "content", c)) for c in resource)]

        answers = anyio.run(ask)
        assert all("2804" not in a and "1931" not in a for a in answers), answers
        assert any('"update"' in a for a in answers)  # the entries are there, without their changes
        app = create_inspector_app(service, auth_required=False)
        with TestClient(Starlette(routes=[Mount("/ui", app)])) as client:
            token = re.search(r'name="csrf" value="([^"]+)"', client.get("/ui/signin").text)
            assert token is not None
            client.post("/ui/signin", data={"csrf": token.group(1), "credential": "bob"}, follow_redirects=False)
            page = client.get(f"/ui/cells/{cell.id}")
            assert page.status_code == 200 and "private draft 2804" in page.text  # the current text
            assert "1931" not in page.text
    finally:
        service.store.close()
