"""The NDJSON export and import (issue 16): lossless between stores, resumable, idempotent,
validated line by line with nothing half-written."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from ampkit.files import ApprovalMode, ApproveRequest, FileWrite
from ampkit.models import CellCreate, CellPatch
from ampkit.portable import ImportConflict, ImportInvalid, export_lines, import_lines
from ampkit.service import MemoryService
from ampkit.store import store_from_url
from ampkit.store.transfer import everything
from support import TLS, run_cli

T0 = datetime(2026, 1, 5, 8, 0, tzinfo=timezone.utc)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=7)
        return self.now


def ampkit(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args)  # in this process: the command's code, output and exit code


def opened(url: str):
    store = store_from_url(url)
    store.open()
    return store


def fill(store) -> MemoryService:
    """Every kind of thing an export must carry: statuses, edits, metadata, policies,
    supersession, sessions, and the who-and-when of a purged cell."""
    service = MemoryService(store=store, clock=Clock())

    def create(agent, text, **extra):
        return service.create(agent, CellCreate.model_validate({"content": {"text": text}, **extra}))

    a = create("alice", "likes tea", identity={"owner_id": "alice", "session_id": "s1"},
               access_policy={"readable_by": ["bot-*"], "public": False}, scoring={"importance": 0.9})
    service.update("alice", a.id, CellPatch.model_validate({"content": {"text": "likes green tea", "metadata": {"k": [1, "ü"]}}}))
    b = create("bob", "meeting at 10 ☕", identity={"owner_id": "bob", "owner_type": "agent"}, type="episodic",
               provenance={"source_type": "conversation", "source_ref": "chat/7"})
    create("alice", "moved to Rome", identity={"owner_id": "alice"}, supersedes=None)
    old = create("alice", "lives in Paris", identity={"owner_id": "alice"})
    create("alice", "lives in Lyon", identity={"owner_id": "alice"}, supersedes=old.id)
    service.update("bob", b.id, CellPatch.model_validate({"lifecycle": {"status": "archived"}}))
    gone = create("carol", "to be erased", identity={"owner_id": "carol"})
    service.update("carol", gone.id, CellPatch.model_validate({"lifecycle": {"status": "archived"}}))
    service.delete("carol", gone.id)
    service.clock.now += timedelta(days=60)
    assert service.purge("admin", [gone.id]).purged == [gone.id]
    deleted = create("carol", "deleted, not purged", identity={"owner_id": "carol"})
    service.update("carol", deleted.id, CellPatch.model_validate({"lifecycle": {"status": "archived"}}))
    service.delete("carol", deleted.id)
    for i in range(12):  # enough rows to cross export pages in the resume test (PAGE is patched down)
        create("dave", f"note {i}", identity={"owner_id": "dave"})
    # Memory files under human approval: folder modes, decided and pending proposals.
    files = service.files
    files.set_approval_mode("ops", ApprovalMode(owner_id="alice", approval_mode="review"))
    files.set_approval_mode("ops", ApprovalMode(owner_id="dave", approval_mode="yolo"))
    first = files.write("agent-7", FileWrite(owner_id="alice", path="AGENTS.md", content="# Rules\n- be brief\n",
                                             reason="asked twice"))
    files.approve("alice", first.proposal_id, ApproveRequest(message="ok"), in_person=True)  # a new file: a person's
    for n in range(5):  # pending, against version 1; more than a page in the resume test
        files.write("agent-7", FileWrite(owner_id="alice", path="AGENTS.md", content=f"# Rules\n- rule {n}\n"))
    refused = files.write("agent-9", FileWrite(owner_id="alice", path="notes/idea.md", content="an idea\n"))
    files.reject("alice", refused.proposal_id)
    return service


def test_sqlite_to_postgres_to_sqlite_is_identical_line_for_line(tmp_path, pg_url):
    source = opened(f"sqlite:///{tmp_path}/a.db")
    fill(source)
    first = list(export_lines(source))
    kinds = [json.loads(line)["kind"] for line in first]
    assert kinds[0] == "header" and kinds[-1] == "end"
    assert kinds.index("history") > max(i for i, k in enumerate(kinds) if k == "cell")
    assert "supersession" in kinds
    assert kinds.count("folder") == 2 and kinds.count("proposal") == 7
    assert kinds.index("folder") > max(i for i, k in enumerate(kinds) if k == "supersession")
    assert kinds.index("proposal") > max(i for i, k in enumerate(kinds) if k == "folder")
    purged_history = [json.loads(line) for line in first if '"action":"purge"' in line]
    assert len(purged_history) == 1 and purged_history[0]["changes"] == {}

    pg = opened(pg_url)
    report = import_lines(pg, lambda: iter(first))
    assert report.cells_written == kinds.count("cell") and report.history_written == kinds.count("history")
    assert (report.folders_written, report.proposals_written) == (2, 7)
    second = list(export_lines(pg))
    assert second == first

    back = opened(f"sqlite:///{tmp_path}/b.db")
    import_lines(back, lambda: iter(second))
    assert list(export_lines(back)) == first
    # ... and the imported store works: as-of reads and search run on the imported history.
    cell = json.loads(next(line for line in first if "likes green tea" in line))["cell"]
    service = MemoryService(store=back)
    assert service.get_as_of("alice", cell["id"], T0 + timedelta(seconds=7)).content.text == "likes tea"
    for store in (source, pg, back):
        store.close()


def test_import_twice_changes_nothing(tmp_path):
    source = opened(f"sqlite:///{tmp_path}/a.db")
    fill(source)
    lines = list(export_lines(source))
    dest = opened(f"sqlite:///{tmp_path}/b.db")
    import_lines(dest, lambda: iter(lines))
    # Reads in the destination move access counts; a re-import ignores those.
    first = json.loads(lines[1])["cell"]
    MemoryService(store=dest).get(first["identity"]["owner_id"], first["id"])
    again = import_lines(dest, lambda: iter(lines))
    assert (again.cells_written, again.history_written) == (0, 0)
    assert again.cells_unchanged == sum('"kind":"cell"' in line for line in lines)
    assert [line for line in export_lines(dest) if first["id"] not in line] == [
        line for line in lines if first["id"] not in line]


def test_bad_lines_are_reported_by_number_and_nothing_is_written(tmp_path):
    source = opened(f"sqlite:///{tmp_path}/a.db")
    fill(source)
    lines = list(export_lines(source))
    broken = list(lines)
    broken[1] = "{not json\n"
    cell = json.loads(broken[2])
    cell["cell"]["scoring"]["importance"] = 7
    broken[2] = json.dumps(cell) + "\n"
    history_at = next(i for i, line in enumerate(broken) if '"kind":"history"' in line)
    entry = json.loads(broken[history_at])
    entry["n"] = 5
    broken[history_at] = json.dumps(entry) + "\n"
    dest = opened(f"sqlite:///{tmp_path}/b.db")
    with pytest.raises(ImportInvalid) as caught:
        import_lines(dest, lambda: iter(broken[:-1]))  # and no end line
    errors = {e["line"]: e["error"] for e in caught.value.details["errors"]}
    assert "not JSON" in errors[2]
    assert "scoring.importance" in errors[3]
    assert "entry 5 follows entry 0" in errors[history_at + 1]
    assert "no end line" in errors[len(broken) - 1]
    assert list(export_lines(dest))[1:] == ['{"kind":"end"}\n']  # nothing written


def test_a_conflicting_cell_stops_the_whole_import(tmp_path):
    source = opened(f"sqlite:///{tmp_path}/a.db")
    fill(source)
    lines = list(export_lines(source))
    dest = opened(f"sqlite:///{tmp_path}/b.db")
    import_lines(dest, lambda: iter(lines))
    first = json.loads(lines[1])["cell"]
    MemoryService(store=dest).update(first["identity"]["owner_id"], first["id"],
                                     CellPatch.model_validate({"scoring": {"confidence": 0.2}}))
    edited = list(export_lines(dest))
    fresh = opened(f"sqlite:///{tmp_path}/c.db")
    import_lines(fresh, lambda: iter(lines[:2] + lines[-1:]))  # one cell, no history
    with pytest.raises(ImportConflict) as caught:
        import_lines(fresh, lambda: iter(edited))
    assert caught.value.details["errors"][0]["line"] == 2
    assert len(list(export_lines(fresh))) == 3  # header, that one cell, end: nothing else written


def test_approval_state_travels_and_a_different_one_is_a_conflict(tmp_path):
    """Who must approve what is policy: folder modes and proposals are exported, imported
    (once), copied by `ampkit copy`, and an import never overwrites different ones."""
    from ampkit.store.transfer import copy_store

    source = opened(f"sqlite:///{tmp_path}/a.db")
    fill(source)
    lines = list(export_lines(source))
    dest = opened(f"sqlite:///{tmp_path}/b.db")
    import_lines(dest, lambda: iter(lines))
    assert dest.folders() == source.folders() and dest.list_proposals() == source.list_proposals()
    again = import_lines(dest, lambda: iter(lines))
    assert (again.folders_written, again.folders_unchanged, again.proposals_written, again.proposals_unchanged) == (0, 2, 0, 7)
    # The imported folder still asks for approval: a write there is a proposal, not a change.
    assert MemoryService(store=dest).files.write(
        "agent-7", FileWrite(owner_id="alice", path="AGENTS.md", content="# Rules\n- new\n")).status == "proposed"

    changed = opened(f"sqlite:///{tmp_path}/c.db")
    import_lines(changed, lambda: iter(lines[:1] + lines[-1:]))
    MemoryService(store=changed).files.set_approval_mode("ops", ApprovalMode(owner_id="alice", approval_mode="yolo"))
    with pytest.raises(ImportConflict) as caught:
        import_lines(changed, lambda: iter(lines))
    assert "folder of 'alice' is 'yolo'" in caught.value.details["errors"][0]["error"]
    assert changed.list_proposals() == [] and changed.count(everything()) == 0  # nothing written
    pending = next(line for line in lines if '"status":"pending"' in line)
    edited = pending.replace('"status":"pending"', '"status":"rejected"')
    with pytest.raises(ImportConflict, match="conflict"):
        import_lines(dest, lambda: iter([edited if line == pending else line for line in lines]))

    copied = opened(f"sqlite:///{tmp_path}/d.db")
    report = copy_store(source, copied)
    assert report.verified and (report.folders, report.proposals) == (2, 7)
    approval = ('"kind":"folder"', '"kind":"proposal"')  # (a copy leaves purged cells' history out)
    assert [x for x in export_lines(copied) if x.startswith(approval, 1)] == [x for x in lines if x.startswith(approval, 1)]
    for store in (source, dest, changed, copied):
        store.close()


def test_resuming_after_any_line_gives_the_rest(tmp_path, monkeypatch):
    import ampkit.portable as portable

    monkeypatch.setattr(portable, "PAGE", 4)  # several pages per section
    source = opened(f"sqlite:///{tmp_path}/a.db")
    fill(source)
    for owner in (None, "dave", "alice"):
        full = list(export_lines(source, owner))
        for i in range(1, len(full) - 1):
            cursor = json.loads(full[i])["cursor"]
            assert list(export_lines(source, owner, cursor)) == full[i + 1:], (owner, i)


def test_cli_export_resume_and_import(tmp_path):
    src, dst = f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"
    source = opened(src)
    fill(source)
    full = list(export_lines(source))
    source.close()
    out = tmp_path / "memory.ndjson"
    done = ampkit("export", "--store", src, str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_text().splitlines(keepends=True) == full
    # An interrupted download: a complete prefix plus half a line; --resume finishes it.
    out.write_text("".join(full[:7]) + full[7][:20])
    resumed = ampkit("export", "--store", src, "--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert out.read_text().splitlines(keepends=True) == full
    out.write_text(full[0] + full[1][:10])  # cut inside the first cell: starts again
    assert ampkit("export", "--store", src, "--resume", str(out)).returncode == 0
    assert out.read_text().splitlines(keepends=True) == full
    assert ampkit("export", "--store", src, "--resume", str(out)).returncode == 2  # already complete
    first = ampkit("import", str(out), "--store", dst)
    assert first.returncode == 0, first.stderr
    assert "import (ampkit)" in first.stderr  # the progress bar
    second = ampkit("import", str(out), "--store", dst)
    assert second.returncode == 0 and "imported 0 cells and 0 history entries" in second.stdout
    bad = tmp_path / "bad.ndjson"
    bad.write_bytes((full[0] + '{"kind":"cell","cell":{}}\n').encode() + b'{"kind":"\xff"}\n' + full[-1].encode())
    refused = ampkit("import", str(bad), "--store", dst)
    assert refused.returncode == 1 and f"{bad}:2: cell:" in refused.stderr
    assert f"{bad}:3: not UTF-8" in refused.stderr


def test_admin_export_and_import_over_http(server_factory, tmp_path):
    src = f"sqlite:///{tmp_path}/a.db"
    source = opened(src)
    fill(source)
    full = list(export_lines(source))
    source.close()
    server = server_factory(src)
    admin = {"X-AMP-Agent-ID": "admin"}
    with httpx.stream("GET", f"{server.base_url}/admin/export", headers=admin, verify=TLS) as answer:
        assert answer.headers["content-type"].startswith("application/x-ndjson")
        streamed = [line + "\n" for line in answer.iter_lines() if line]
    assert streamed == full
    cursor = json.loads(full[5])["cursor"]
    rest = httpx.get(f"{server.base_url}/admin/export", params={"cursor": cursor}, headers=admin, verify=TLS)
    assert rest.text == "".join(full[6:])
    bad = httpx.get(f"{server.base_url}/admin/export", params={"cursor": "nope"}, headers=admin, verify=TLS)
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "VALIDATION_ERROR"

    other = server_factory(f"sqlite:///{tmp_path}/b.db")
    body = "".join(full).encode()
    wrong_type = httpx.post(f"{other.base_url}/admin/import", content=body, headers=admin, verify=TLS)
    assert wrong_type.status_code == 415
    imported = httpx.post(f"{other.base_url}/admin/import", content=body,
                          headers={**admin, "Content-Type": "application/x-ndjson"}, verify=TLS)
    assert imported.status_code == 200, imported.text
    assert imported.json()["cells_written"] == sum('"kind":"cell"' in line for line in full)
    again = httpx.post(f"{other.base_url}/admin/import", content=body,
                       headers={**admin, "Content-Type": "application/x-ndjson"}, verify=TLS)
    assert again.json()["cells_written"] == 0
    invalid = httpx.post(f"{other.base_url}/admin/import", content=b'{"kind":"end"}\n',
                         headers={**admin, "Content-Type": "application/x-ndjson"}, verify=TLS)
    assert invalid.status_code == 422 and invalid.json()["error"]["details"]["errors"][0]["line"] == 1
    assert httpx.get(f"{other.base_url}/admin/export", headers=admin, verify=TLS).text == "".join(full)


def test_cell_keys_are_kept_and_a_taken_key_is_a_conflict(tmp_path):
    source = opened(f"sqlite:///{tmp_path}/a.db")
    service = MemoryService(store=source, clock=Clock())
    service.create("alice", CellCreate.model_validate({"content": {"text": "home: Rome"},
                                                       "identity": {"owner_id": "alice", "key": "home"}}))
    lines = list(export_lines(source))
    copy = lines[1].replace(json.loads(lines[1])["cell"]["id"], "mem_" + "Z" * 26)  # another cell, same key
    twice = lines[:2] + [copy] + lines[2:]
    dest = opened(f"sqlite:///{tmp_path}/b.db")
    with pytest.raises(ImportInvalid, match="problem") as caught:
        import_lines(dest, lambda: iter([line for line in twice if '"kind":"history"' not in line]))
    assert "two live cells with key 'home'" in caught.value.details["errors"][0]["error"]
    other = MemoryService(store=dest, clock=Clock())
    other.create("alice", CellCreate.model_validate({"content": {"text": "home: Oslo"},
                                                     "identity": {"owner_id": "alice", "key": "home"}}))
    with pytest.raises(ImportConflict) as conflict:
        import_lines(dest, lambda: iter(lines))
    assert "key 'home' of owner 'alice' is held by" in conflict.value.details["errors"][0]["error"]
    fresh = opened(f"sqlite:///{tmp_path}/c.db")
    import_lines(fresh, lambda: iter(lines))
    assert list(export_lines(fresh)) == lines


def test_memory_files_travel_with_their_history_and_a_taken_path_is_a_conflict(tmp_path):
    """Issue 11: a file is a cell, so the NDJSON export carries it, every version and who
    approved it; importing it where the owner already has a live file at that path is refused."""
    from ampkit.files import ApprovalMode, FileEdit, FileWrite

    source = opened(f"sqlite:///{tmp_path}/a.db")
    files = MemoryService(store=source, clock=Clock()).files
    proposed = files.write("agent-42", FileWrite(owner_id="agent-42", path="AGENTS.md", content="# Rules\n- be brief\n"))
    files.approve("human:ann", proposed.proposal_id, may_approve=True)
    files.set_approval_mode("ops", ApprovalMode(owner_id="agent-42", approval_mode="yolo"))
    files.edit("agent-42", FileEdit(owner_id="agent-42", path="AGENTS.md", old="be brief", new="use bullets"))
    lines = list(export_lines(source))

    fresh = opened(f"sqlite:///{tmp_path}/b.db")
    import_lines(fresh, lambda: iter(lines))
    assert list(export_lines(fresh)) == lines
    moved = MemoryService(store=fresh, clock=Clock()).files
    assert moved.read("agent-42", "agent-42", "AGENTS.md").content == "# Rules\n- use bullets\n"
    history = moved.history("agent-42", "agent-42", "AGENTS.md").results
    assert [(v.version, v.actor, v.approved_by) for v in history] == [(1, "agent-42", "human:ann"), (2, "agent-42", None)]

    taken = opened(f"sqlite:///{tmp_path}/c.db")
    other = MemoryService(store=taken, clock=Clock()).files
    other.set_approval_mode("ops", ApprovalMode(owner_id="agent-42", approval_mode="yolo"))
    other.write("agent-42", FileWrite(owner_id="agent-42", path="AGENTS.md", content="# Mine\n"))
    with pytest.raises(ImportConflict) as conflict:
        import_lines(taken, lambda: iter(lines))
    assert "file 'AGENTS.md' of owner 'agent-42' is" in conflict.value.details["errors"][0]["error"]


def test_files_export_then_import_round_trips_a_folder_byte_for_byte(tmp_path):
    """`ampkit files export` writes the folder as real files; `ampkit files import` brings it
    into another store through validation; exporting that gives the same bytes."""
    folder = tmp_path / "agent"
    (folder / "skills" / "release-notes").mkdir(parents=True)
    (folder / "subagents").mkdir()
    originals = {
        "AGENTS.md": "# Rules\r\n- bullets\r\n\nünïcødé ✓\n",
        "skills/release-notes/SKILL.md": "---\nname: release-notes\ndescription: Notes from PRs.\n---\nSteps\n",
        "subagents/critic.md": "---\nname: critic\ndescription: Reviews drafts.\ntools: [read_file]\n---\nBe harsh.\n",
        "tools.json": '{"mcpServers": {"gh": {"command": "npx", "args": ["gh"], "tools": ["search"]}}}',
        "kb/glossary.md": "no trailing newline",
    }
    for path, text in originals.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(text.encode("utf-8"))
    first, second = f"sqlite:///{tmp_path}/one.db", f"sqlite:///{tmp_path}/two.db"
    done = ampkit("files", "import", str(folder), "--owner", "agent-42", "--store", first, "--as", "human:ann")
    assert done.returncode == 0, done.stderr
    assert ampkit("files", "export", str(tmp_path / "out1"), "--owner", "agent-42", "--store", first).returncode == 0
    assert ampkit("files", "import", str(tmp_path / "out1"), "--owner", "agent-42", "--store", second).returncode == 0
    assert ampkit("files", "export", str(tmp_path / "out2"), "--owner", "agent-42", "--store", second).returncode == 0
    for out in ("out1", "out2"):
        got = {p.relative_to(tmp_path / out).as_posix(): p.read_bytes()
               for p in (tmp_path / out).rglob("*") if p.is_file()}
        assert got == {path: text.encode("utf-8") for path, text in originals.items()}
    history = ampkit("files", "history", "AGENTS.md", "--owner", "agent-42", "--store", first)
    assert "version 1" in history.stdout and "create by human:ann" in history.stdout

    (folder / "skills" / "bad").mkdir()
    (folder / "skills" / "bad" / "SKILL.md").write_text("---\nname: Bad\n---\n")
    (folder / "tools.json").write_text('{"mcpServers": {"x": {}}}')
    refused = ampkit("files", "import", str(folder), "--owner", "someone", "--store", first)
    assert refused.returncode == 1
    assert "skills/bad/SKILL.md frontmatter.name" in refused.stderr and "tools.json /mcpServers/x" in refused.stderr
    assert ampkit("files", "ls", "--owner", "someone", "--store", first).stdout == ""
