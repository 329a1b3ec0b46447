"""The memory inspector (/ui) over HTTP, on SQLite and PostgreSQL: sign-in and sessions, the
pages, the actions (through the same service calls as the API), CSRF, scopes, and that a
second agent sees nothing of the first's private cells on any page.

The app is the real `create_app` (the server's own), driven by httpx through Starlette's
TestClient; the browser test (test_inspector_browser.py) drives a real `ampkit serve`."""

from __future__ import annotations

import re
from typing import Any, Iterator, Optional

import pytest
from fastapi.testclient import TestClient

from ampkit.auth import create_key, revoke_key
from ampkit.bootstrap import build_service, load_settings
from ampkit.inspector.app import PAGE_SIZE, text_diff
from ampkit.models import CellCreate
from ampkit.server.app import create_app
from ampkit.service import MemoryService


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ui.db"
    return request.getfixturevalue("pg_url")


class Inspector:
    """A signed-in (or not) browser-less user of /ui."""

    def __init__(self, client: TestClient, service: MemoryService):
        self.client = client
        self.service = service

    def get(self, path: str, **kw: Any):
        return self.client.get(path, **kw)

    def csrf(self, path: str = "/ui/owners") -> str:
        found = re.search(r'name="csrf" value="([^"]+)"', self.client.get(path).text)
        assert found, f"no CSRF token on {path}"
        return found.group(1)

    def sign_in(self, credential: str, follow: bool = False):
        token = self.csrf("/ui/signin")
        return self.client.post("/ui/signin", data={"csrf": token, "credential": credential, "next": ""},
                                follow_redirects=follow)

    def post(self, path: str, data: Optional[dict[str, str]] = None, csrf: Optional[str] = None):
        form = {"csrf": csrf if csrf is not None else self.csrf(), **(data or {})}
        return self.client.post(path, data=form, follow_redirects=False)


def _app(store_url: str, auth: bool, **settings: Any):
    config = load_settings(env=False, store=store_url, embedder="none", mcp_http=False, allowed_hosts="testserver",
                           auth="required" if auth else "off", **settings)
    service = build_service(config)
    return create_app(config, service), service


@pytest.fixture
def world(store_url) -> Iterator[dict[str, Any]]:
    """A server with auth on, two agents' keys, and cells: alice's private ones, one shared
    with bob, and bob's own."""
    app, service = _app(store_url, auth=True)
    with TestClient(app) as first, TestClient(app) as second:
        store = service.store
        keys = {name: create_key(store, name, "read,write").token for name in ("alice", "bob")}
        keys["reader"] = create_key(store, "alice", "read").token

        def make(agent: str, text: str, owner: str, **extra: Any):
            body = {"content": {"text": text}, "identity": {"owner_id": owner, "session_id": "s1"}, **extra}
            return service.create(agent, CellCreate.model_validate(body))

        cells = {
            "private": make("alice", "alice's vault code is 4812", "alice"),
            "private2": make("alice", "alice prefers green tea in the morning", "alice-notes"),
            "shared": make("alice", "team standup moves to ten o'clock", "alice", access_policy={"readable_by": ["bob"]}),
            "bobs": make("bob", "bob likes oak furniture", "bob"),
        }
        yield {"app": app, "service": service, "keys": keys, "cells": cells,
               "alice": Inspector(first, service), "bob": Inspector(second, service)}


def test_pages_need_a_session_and_a_valid_key(world):
    alice = world["alice"]
    r = alice.get("/ui/cells", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/signin?next=")
    bad = alice.sign_in("ampk_0000000000000000_nope")
    assert bad.status_code == 401 and "invalid API key" in bad.text
    ok = alice.sign_in(world["keys"]["alice"])
    assert ok.status_code == 303
    cookie = ok.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui/" in cookie
    page = alice.get("/ui/owners")
    assert page.status_code == 200 and "as <strong>alice</strong>" in page.text
    assert "Identity not verified" not in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    assert "<script" not in page.text


def test_the_sign_in_form_needs_its_token(world):
    alice = world["alice"]
    r = alice.client.post("/ui/signin", data={"csrf": "forged", "credential": world["keys"]["alice"]},
                          follow_redirects=False)
    assert r.status_code == 403 and "set-cookie" not in {k.lower() for k in r.headers if "ampkit_ui=" in r.headers[k]}
    assert alice.get("/ui/owners", follow_redirects=False).status_code == 303


def test_a_revoked_key_ends_the_session_at_the_next_request(world):
    alice, service = world["alice"], world["service"]
    alice.sign_in(world["keys"]["alice"])
    assert alice.get("/ui/owners").status_code == 200
    key_id = world["keys"]["alice"].split("_")[1]
    revoke_key(service.store, key_id)
    r = alice.get("/ui/owners", follow_redirects=False)
    assert r.status_code == 303 and "/ui/signin" in r.headers["location"]


def test_sign_out_refuses_the_same_cookie_afterwards(world):
    alice = world["alice"]
    alice.sign_in(world["keys"]["alice"])
    cookie = alice.client.cookies.get("ampkit_ui")
    assert alice.post("/ui/signout").status_code == 303
    alice.client.cookies.set("ampkit_ui", cookie, path="/ui/")  # replayed, as a thief would
    assert alice.get("/ui/owners", follow_redirects=False).status_code == 303


def test_a_tampered_cookie_is_no_session(world):
    alice = world["alice"]
    alice.sign_in(world["keys"]["bob"])
    cookie = alice.client.cookies.get("ampkit_ui")
    payload, mac = cookie.rsplit(".", 1)
    import base64
    import json
    data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    data["a"] = "alice"
    forged = base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=") + "." + mac
    alice.client.cookies.clear()
    alice.client.cookies.set("ampkit_ui", forged, path="/ui/")
    assert alice.get("/ui/owners", follow_redirects=False).status_code == 303


def test_every_page_shows_what_the_caller_may_read_and_nothing_else(world):
    alice, bob, cells = world["alice"], world["bob"], world["cells"]
    alice.sign_in(world["keys"]["alice"])
    bob.sign_in(world["keys"]["bob"])
    secret_texts = [cells["private"].content.text, cells["private2"].content.text]
    pages = ["/ui/owners", "/ui/cells", "/ui/cells?owner=alice", "/ui/cells?owner=alice-notes",
             "/ui/search?q=vault+code", "/ui/search?q=green+tea", "/ui/search?q=alice",
             "/ui/cells?status=active&status=archived&superseded=1"]
    for path in pages:
        mine = alice.get(path)
        theirs = bob.get(path)
        assert mine.status_code == theirs.status_code == 200, path
        for text in secret_texts:
            assert _escaped(text) not in theirs.text, (path, text)
        if "alice-notes" not in path:
            assert "alice-notes" not in theirs.text, path  # not even the owner's name
    assert _escaped(cells["private"].content.text) in alice.get("/ui/search?q=vault+code").text
    assert _escaped(cells["shared"].content.text) in bob.get("/ui/cells?owner=alice").text
    # A private cell's page and a missing id's page answer the same to bob.
    denied = bob.get(f"/ui/cells/{cells['private'].id}")
    missing = bob.get("/ui/cells/mem_00000000000000000000000000")
    assert denied.status_code == missing.status_code == 403
    assert _strip_ids(denied.text) == _strip_ids(missing.text)
    for suffix in ("/edit", "/forget", "/supersede"):
        assert bob.get(f"/ui/cells/{cells['private'].id}{suffix}").status_code == 403
    r = bob.post(f"/ui/cells/{cells['private'].id}/archive", {"version": "1"})
    assert r.status_code == 403
    assert world["service"].store.get(cells["private"].id).lifecycle.status == "active"


def _escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("'", "&#39;").replace('"', "&#34;").replace("<", "&lt;")


def _strip_ids(html: str) -> str:
    return re.sub(r"mem_[0-9A-Z]{26}", "ID", html)


def test_cell_page_content_policy_lifecycle_history_and_no_access_counted(world):
    alice, service, cell = world["alice"], world["service"], world["cells"]["shared"]
    alice.sign_in(world["keys"]["alice"])
    page = alice.get(f"/ui/cells/{cell.id}").text
    for part in ("Content", "Policy", "Lifecycle", "History", "Supersession", "stale below 0.3", "<svg", "bob"):
        assert part in page, part
    assert service.store.get(cell.id).scoring.access_count == 0  # a person looking is not a use


def test_edit_archive_supersede_and_forget_go_through_the_service(world):
    alice, service, cell = world["alice"], world["service"], world["cells"]["private"]
    alice.sign_in(world["keys"]["alice"])
    form = {"text": "alice's vault code is 9921", "metadata": '{"kind": "secret"}', "importance": "0.9",
            "confidence": "1", "readable_by": "", "writable_by": "", "version": "1"}
    r = alice.post(f"/ui/cells/{cell.id}/edit", form)
    assert r.status_code == 303 and r.headers["location"].endswith("?done=updated")
    stored = service.store.get(cell.id)
    assert stored.content.text.endswith("9921") and stored.content.metadata == {"kind": "secret"}
    assert stored.lifecycle.version == 2
    page = alice.get(f"/ui/cells/{cell.id}").text
    assert "<del>4812</del>" in page and "<ins>9921</ins>" in page  # the history's word diff
    # A stale version is refused (If-Match, as the API does), and nothing is lost: the form again.
    stale = alice.post(f"/ui/cells/{cell.id}/edit", {**form, "text": "lost update?", "version": "1"})
    assert stale.status_code == 409 and "lost update?" in stale.text
    # Bad input: 422 with the typed text kept.
    bad = alice.post(f"/ui/cells/{cell.id}/edit", {**form, "metadata": "[1, 2", "version": "2"})
    assert bad.status_code == 422 and 'id="e-metadata-err"><li>not JSON: ' in bad.text and "9921" in bad.text
    bad = alice.post(f"/ui/cells/{cell.id}/edit", {**form, "importance": "7", "version": "2"})
    assert bad.status_code == 422
    # Supersede: a new cell replacing this one.
    r = alice.post(f"/ui/cells/{cell.id}/supersede", {**form, "text": "alice's vault code is 1234", "version": "2"})
    assert r.status_code == 303
    new_id = r.headers["location"].split("/ui/cells/")[1].split("?")[0]
    assert service.store.get(cell.id).lifecycle.superseded_by == new_id
    new_page = alice.get(f"/ui/cells/{new_id}").text
    assert "Replaces (newest first)" in new_page and cell.id in new_page
    # Archive, then forget (deleted; DELETE needs archived, the page archives first).
    other = world["cells"]["private2"]
    r = alice.post(f"/ui/cells/{other.id}/archive", {"version": "1"})
    assert r.status_code == 303 and service.store.get(other.id).lifecycle.status == "archived"
    r = alice.post(f"/ui/cells/{new_id}/forget", {"version": "1"})
    assert r.status_code == 303 and service.store.get(new_id).lifecycle.status == "deleted"
    actions = [e.action for e in service.store.history(new_id)]
    assert actions == ["create", "status", "delete"]
    assert alice.get(f"/ui/cells/{new_id}").status_code == 403


def test_a_post_without_the_csrf_token_changes_nothing(world):
    alice, service, cell = world["alice"], world["service"], world["cells"]["private"]
    alice.sign_in(world["keys"]["alice"])
    for token in ("", "forged"):
        r = alice.post(f"/ui/cells/{cell.id}/archive", {"version": "1"}, csrf=token)
        assert r.status_code == 403 and "came from another site" in r.text
    assert service.store.get(cell.id).lifecycle.status == "active"


def test_a_read_only_key_sees_no_actions_and_cannot_act(world):
    alice, service, cell = world["alice"], world["service"], world["cells"]["private"]
    alice.sign_in(world["keys"]["reader"])
    page = alice.get(f"/ui/cells/{cell.id}").text
    assert "/archive" not in page and "/edit" not in page
    r = alice.post(f"/ui/cells/{cell.id}/archive", {"version": "1"})
    assert r.status_code == 403 and "lacks the &#39;write&#39; scope" in r.text
    assert service.store.get(cell.id).lifecycle.status == "active"


def test_cells_and_owners_page_with_cursors(store_url):
    app, service = _app(store_url, auth=False)
    with TestClient(app) as client:
        ui = Inspector(client, service)
        n = PAGE_SIZE + 5
        service.create_many("ada", [CellCreate.model_validate(
            {"content": {"text": f"fact number {i}"}, "identity": {"owner_id": f"owner-{i:03d}"}, "dedup": "off"})
            for i in range(n)])
        page = ui.sign_in("ada", follow=True)
        assert "Identity not verified" in page.text  # auth off: said plainly
        seen_owners = _walk(ui, "/ui/owners", r"/ui/cells\?owner=(owner-\d+)")
        assert seen_owners == [f"owner-{i:03d}" for i in range(n)]
        seen_cells = _walk(ui, "/ui/cells", r'<a href="/ui/cells/(mem_[0-9A-Z]{26})">')
        assert len(seen_cells) == n and len(set(seen_cells)) == n
        # Filters: owner, type, status, session, metadata go to the same list call as GET /memories.
        assert "1 cell match" in ui.get("/ui/cells?owner=owner-003").text
        assert "0 cells match" in ui.get("/ui/cells?type=episodic").text
        bad = ui.get("/ui/cells?type=nonsense")
        assert bad.status_code == 422 and "unknown value" in bad.text
        assert ui.get("/ui/cells?cursor=%%%").status_code == 422
        assert ui.get("/ui/owners?cursor=%%%").status_code == 422


def _walk(ui: Inspector, first: str, pattern: str) -> list[str]:
    found: list[str] = []
    path: Optional[str] = first
    while path:
        html = ui.get(path).text
        found += re.findall(pattern, html)
        nxt = re.search(r'<a rel="next" href="([^"]+)"', html)
        path = nxt.group(1).replace("&amp;", "&") if nxt else None
    return found


def test_search_shows_the_score_breakdown_chart(store_url):
    app, service = _app(store_url, auth=False)
    with TestClient(app) as client:
        ui = Inspector(client, service)
        service.create("ada", CellCreate.model_validate({"content": {"text": "the river is green"},
                                                         "identity": {"owner_id": "ada"}}))
        ui.sign_in("ada")
        page = ui.get("/ui/search?q=river").text
        assert 'class="chart explain"' in page and "relevance" in page and "decay" in page
        assert ui.get("/ui/search?q=" + "x" * 5000).status_code == 422


def test_consolidation_decision_and_episodes_on_the_cell_page(store_url):
    app, service = _app(store_url, auth=False)
    with TestClient(app) as client:
        ui = Inspector(client, service)
        episode = service.create("ada", CellCreate.model_validate(
            {"type": "episodic", "content": {"text": "user: I moved to Lyon"}, "identity": {"owner_id": "ada"}}))
        fact = service.create("ada", CellCreate.model_validate({
            "content": {"text": "ada lives in Lyon",
                        "metadata": {"consolidation": {"action": "ADD", "reason": "nothing similar is stored"}}},
            "identity": {"owner_id": "ada"},
            "provenance": {"supporting_episode_ids": [episode.id], "extraction_model": "fake"}}))
        ui.sign_in("ada")
        page = ui.get(f"/ui/cells/{fact.id}").text
        assert "Decision <strong>ADD</strong>: nothing similar is stored" in page
        assert "I moved to Lyon" in page


def test_unknown_pages_and_methods_answer_the_error_page(store_url):
    app, _ = _app(store_url, auth=False)
    with TestClient(app) as client:
        for method, path, status in (("GET", "/ui/nope", 404), ("GET", "/ui/signout", 405)):
            r = client.request(method, path)
            assert r.status_code == status and r.headers["content-type"].startswith("text/html")
            assert r.headers["content-security-policy"].startswith("default-src 'none'")


def test_the_inspector_can_be_switched_off(store_url):
    app, _ = _app(store_url, auth=False, ui=False)
    with TestClient(app) as client:
        assert client.get("/ui/signin").status_code == 404


def test_text_diff_marks_words():
    assert text_diff("a b c", "a x c") == [("same", "a "), ("del", "b"), ("ins", "x"), ("same", " c")]
    # Words, not characters or space-separated chunks: "tea," is "tea" and a comma.
    assert text_diff("green tea", "green tea, no sugar") == [("same", "green tea"), ("ins", ", no sugar")]
    old, new = "Ada prefers tea (green).", "Ada prefers coffee (black), mornings."
    ops = text_diff(old, new)
    assert "".join(t for op, t in ops if op != "ins") == old and "".join(t for op, t in ops if op != "del") == new
    assert ("del", "tea") in ops and ("ins", "coffee") in ops


def test_every_form_problem_is_shown_in_words_next_to_its_field(world):
    alice, service, cell = world["alice"], world["service"], world["cells"]["private"]
    alice.sign_in(world["keys"]["alice"])
    form = {"text": "  ", "metadata": '["a"]', "importance": "lots", "confidence": "7",
            "readable_by": "bob\n", "writable_by": "", "version": "1"}
    bad = alice.post(f"/ui/cells/{cell.id}/edit", form)
    assert bad.status_code == 422
    page = bad.text
    assert "4 problems in the form; nothing was saved" in page
    for field in ("text", "metadata", "importance", "confidence"):
        assert f'id="e-{field}-err"' in page and f'aria-describedby="e-{field}-err"' in page, field
    assert "text must contain a non-whitespace character" in page
    assert "must be a JSON object, like" in page and "not a list" in page
    assert "&#39;lots&#39; is not a number" in page
    assert "less than or equal to 1" in page
    assert "{&#34;param&#34;" not in page and '{"param"' not in page  # no raw JSON
    assert service.store.get(cell.id).lifecycle.version == 1  # nothing saved
    filtered = alice.get("/ui/cells?metadata=nope")
    assert filtered.status_code == 422 and 'id="f-metadata-err"' in filtered.text and "not JSON" in filtered.text


def test_decay_sentence_agrees_with_the_numbers():
    from datetime import datetime, timedelta, timezone

    from ampkit.inspector.charts import decay_sentence
    from ampkit.models import MemoryCell

    now = datetime(2026, 12, 1, tzinfo=timezone.utc)

    def cell(importance: float, confidence: float, rate: float, days: float) -> MemoryCell:
        return MemoryCell.model_validate({
            "id": "mem_" + "1" * 26, "type": "semantic", "content": {"text": "x"},
            "identity": {"owner_id": "a"}, "scoring": {"importance": importance, "confidence": confidence,
                                                       "decay_rate": rate},
            "lifecycle": {"created_at": (now - timedelta(days=days)).isoformat()}})

    at = decay_sentence(cell(0.6, 0.5, 0.01, 0), now, 0.3)  # starts exactly at the threshold
    assert "now 0.300, at the stale threshold 0.3" in at and "exactly the threshold" in at and "starts below" not in at
    just_below = decay_sentence(cell(0.6, 0.5, 0.01, 0.1), now, 0.3)
    assert "now 0.2997, below the stale threshold 0.3" in just_below  # not "0.300 ... below"
    low = decay_sentence(cell(0.5, 0.5, 0.01, 0), now, 0.3)
    assert "below the stale threshold" in low and "only 0.250" in low
    assert "in 69 days" in decay_sentence(cell(1.0, 1.0, 0.0175, 0), now, 0.3)
    assert "never goes stale" in decay_sentence(cell(1.0, 1.0, 0.0, 0), now, 0.3)


# ---------------------------------------------------------------- memory files and approvals
def test_file_tree_versions_and_the_approval_queue(world):
    from ampkit.files import FileEdit, FileWrite

    alice, bob, service = world["alice"], world["bob"], world["service"]
    files = service.files
    proposed = files.write("helper", FileWrite(owner_id="alice", path="AGENTS.md", content="# Prefs\n- green tea\n",
                                               reason="what alice said on Monday"))
    assert proposed.status == "proposed"
    alice.sign_in(world["keys"]["alice"])
    bob.sign_in(world["keys"]["bob"])
    queue = alice.get("/ui/proposals").text
    assert "alice: AGENTS.md" in queue and "what alice said on Monday" in queue
    page = alice.get(f"/ui/proposals/{proposed.proposal_id}").text
    assert "<ins>+- green tea</ins>" in page
    assert "# Prefs\n- green tea\n</textarea>" in page  # the text to approve, ready to edit
    r = alice.post(f"/ui/proposals/{proposed.proposal_id}/approve",
                   {"content": "# Prefs\r\n- green tea\r\n", "message": ""})  # a form's CRLF, unchanged text
    assert r.status_code == 303 and r.headers["location"].endswith("?done=approved")
    assert files.read("alice", "alice", "AGENTS.md").content == "# Prefs\n- green tea\n"
    assert files.history("alice", "alice", "AGENTS.md").results[-1].approved_by == "alice"

    # Edit then approve: the approver's text is written.
    edit = files.edit("helper", FileEdit(owner_id="alice", path="AGENTS.md", old="green tea", new="coffee"))
    r = alice.post(f"/ui/proposals/{edit.proposal_id}/approve", {"content": "# Prefs\n- oolong tea\n",
                                                                  "message": "she prefers oolong"})
    assert r.status_code == 303
    assert files.read("alice", "alice", "AGENTS.md").content == "# Prefs\n- oolong tea\n"
    # Reject, with a note.
    third = files.edit("helper", FileEdit(owner_id="alice", path="AGENTS.md", old="oolong", new="no"))
    r = alice.post(f"/ui/proposals/{third.proposal_id}/reject", {"message": "not what she said"})
    assert r.status_code == 303
    assert files.proposal("alice", third.proposal_id).status == "rejected"
    # A decided proposal cannot be decided again (409 page, nothing written).
    again = alice.post(f"/ui/proposals/{third.proposal_id}/approve", {"content": "x\n"})
    assert again.status_code == 409
    assert alice.post(f"/ui/proposals/{third.proposal_id}/maybe", {}).status_code == 404

    tree = alice.get("/ui/files?owner=alice").text
    assert "AGENTS.md" in tree and "review" in tree
    view = alice.get("/ui/files/view?owner=alice&path=AGENTS.md").text
    assert "oolong tea" in view and "approved by alice" in view and "<ins>+- oolong tea</ins>" in view

    # Bob may read none of it: no file, no proposal, no decision.
    assert "AGENTS.md" not in bob.get("/ui/files?owner=alice").text
    assert bob.get("/ui/files/view?owner=alice&path=AGENTS.md").status_code == 403
    assert "AGENTS.md" not in bob.get("/ui/proposals?status=").text
    fourth = files.edit("helper", FileEdit(owner_id="alice", path="AGENTS.md", old="oolong", new="mint"))
    assert bob.get(f"/ui/proposals/{fourth.proposal_id}").status_code == 403
    assert bob.post(f"/ui/proposals/{fourth.proposal_id}/approve", {"content": "x\n"}).status_code == 403
    assert files.proposal("alice", fourth.proposal_id).status == "pending"


def test_the_proposing_agent_cannot_approve_its_own_change(store_url):
    from ampkit.files import FileWrite

    app, service = _app(store_url, auth=False)
    with TestClient(app) as client:
        ui = Inspector(client, service)
        proposed = service.files.write("helper", FileWrite(owner_id="ada", path="notes/a.md", content="hi\n"))
        ui.sign_in("helper")
        page = ui.get(f"/ui/proposals/{proposed.proposal_id}")
        assert page.status_code == 200
        r = ui.post(f"/ui/proposals/{proposed.proposal_id}/approve", {"content": "hi\n"})
        assert r.status_code == 403 and "cannot decide" in r.text
        assert service.files.proposal("ada", proposed.proposal_id).status == "pending"


def test_memory_files_are_shown_as_files_and_edits_named_edits(world):
    from ampkit.files import ApprovalMode, FileEdit, FileWrite

    alice, service = world["alice"], world["service"]
    files = service.files
    files.set_approval_mode("alice", ApprovalMode(owner_id="alice", approval_mode="yolo"))
    files.write("alice", FileWrite(owner_id="alice", path="skills/tea/SKILL.md",
                                    content="---\nname: tea\ndescription: brew green tea for alice\n---\nSteep 2 min.\n",
                                    access_policy={"readable_by": ["helper"], "writable_by": ["helper"]}))
    files.set_approval_mode("alice", ApprovalMode(owner_id="alice", approval_mode="review"))
    edit = files.edit("helper", FileEdit(owner_id="alice", path="skills/tea/SKILL.md", old="2 min", new="3 min"))
    alice.sign_in(world["keys"]["alice"])
    listed = alice.get("/ui/cells?owner=alice").text
    link = '<a href="/ui/files/view?owner=alice&amp;path=skills%2Ftea%2FSKILL.md"><code>skills/tea/SKILL.md</code></a>'
    assert link in listed and "---\nname: tea" not in listed and "name: tea" not in listed
    found = alice.get("/ui/search?q=brew+green+tea&owner=alice").text
    assert link in found and "description: brew" not in found
    queue = alice.get("/ui/proposals").text
    assert f'<a href="/ui/proposals/{edit.proposal_id}">alice: skills/tea/SKILL.md</a></td>\n    <td>edit' in queue
    assert "<h1>Edit <code>skills/tea/SKILL.md</code></h1>" in alice.get(f"/ui/proposals/{edit.proposal_id}").text


def test_an_admin_key_gets_the_operator_view_and_others_do_not(world):
    alice, bob, service = world["alice"], world["bob"], world["service"]
    admin = create_key(service.store, "ops", "read,admin").token
    alice.sign_in(admin)
    owners = alice.get("/ui/owners").text
    assert "Acting as an administrator" in owners
    for owner in ("alice", "alice-notes", "bob"):
        assert f">{owner}</a></th>" in owners, owner
    cells = alice.get("/ui/cells").text
    assert "4 cells match." in cells and "vault code" in cells and "oak furniture" in cells
    private = world["cells"]["private"]
    page = alice.get(f"/ui/cells/{private.id}")
    assert page.status_code == 200 and "vault code is 4812" in page.text and "Acting as an administrator" in page.text
    assert f"/cells/{private.id}/edit" not in page.text  # read-only: ops may not write alice's cells
    assert service.store.get(private.id).scoring.access_count == 0
    assert alice.post(f"/ui/cells/{private.id}/archive", {"version": "1"}).status_code == 403
    # bob (no admin scope) still sees only what he may read
    bob.sign_in(world["keys"]["bob"])
    assert "Acting as an administrator" not in bob.get("/ui/owners").text
    assert bob.get(f"/ui/cells/{private.id}").status_code == 403
    assert "vault code" not in bob.get("/ui/cells?status=active&status=archived").text


def test_an_archived_cell_is_restored_through_the_service(world):
    alice, service, cell = world["alice"], world["service"], world["cells"]["private2"]
    alice.sign_in(world["keys"]["alice"])
    assert alice.post(f"/ui/cells/{cell.id}/archive", {"version": "1"}).status_code == 303
    page = alice.get(f"/ui/cells/{cell.id}").text
    assert f'action="/ui/cells/{cell.id}/restore"' in page and "/archive" not in page
    stale = alice.post(f"/ui/cells/{cell.id}/restore", {"version": "1"})
    assert stale.status_code == 409 and service.store.get(cell.id).lifecycle.status == "archived"
    r = alice.post(f"/ui/cells/{cell.id}/restore", {"version": "2"})
    assert r.status_code == 303 and r.headers["location"].endswith("?done=restored")
    assert service.store.get(cell.id).lifecycle.status == "active"
    assert [(e.action, e.actor) for e in service.store.history(cell.id)][-1] == ("status", "alice")
    bob = world["bob"]
    bob.sign_in(world["keys"]["bob"])
    service.update("alice", cell.id, __import__("ampkit.models", fromlist=["CellPatch"]).CellPatch.model_validate(
        {"lifecycle": {"status": "archived"}}))
    assert bob.post(f"/ui/cells/{cell.id}/restore", {"version": "3"}).status_code == 403  # not bob's to write
    assert service.store.get(cell.id).lifecycle.status == "archived"
