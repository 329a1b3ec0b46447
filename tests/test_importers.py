"""Importers from peers (issue 16), on samples in each peer's own format (tests/samples/):
each is imported through the CLI, mapped as docs/time-travel.md#importers says, converted
back to the peer's shape from what ampkit stored (the round trip), and re-imported without
change."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from ampkit.importers import ImporterError, detect_format, from_langgraph, to_export_lines
from ampkit.models import MemoryCell
from ampkit.portable import export_lines, import_lines
from ampkit.service import MemoryService
from ampkit.store import store_from_url
from support import run_cli

SAMPLES = Path(__file__).parent / "samples"


def ampkit(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args)  # in this process: the command's code, output and exit code


def imported(tmp_path, name: str, fmt: str, **options) -> tuple[list[MemoryCell], object]:
    store = store_from_url(f"sqlite:///{tmp_path}/{fmt}.db")
    store.open()
    lines = to_export_lines(fmt, str(SAMPLES / name), **options)
    report = import_lines(store, lambda: iter(lines))
    assert report.cells_written > 0
    again = import_lines(store, lambda: iter(to_export_lines(fmt, str(SAMPLES / name), **options)))
    assert (again.cells_written, again.history_written) == (0, 0)  # idempotent: same ids, same content
    cells = [MemoryCell.model_validate(json.loads(line)["cell"]) for line in export_lines(store) if '"kind":"cell"' in line]
    return cells, store


def same_instant(a, b) -> bool:
    return datetime.fromisoformat(str(a)) == datetime.fromisoformat(str(b))


def test_mem0_get_all_and_history(tmp_path):
    sample = json.loads((SAMPLES / "mem0_get_all_and_history.json").read_text())
    cells, store = imported(tmp_path, "mem0_get_all_and_history.json", "mem0")
    by_ref = {c.provenance.source_ref: c for c in cells}
    assert len(cells) == 3  # the DELETEd memory (history only) is not brought back
    # Round trip: each get_all result rebuilt from the cell.
    for item in sample["results"]:
        cell = by_ref[f"mem0:{item['id']}"]
        extra = dict(cell.content.metadata)
        mem0 = extra.pop("mem0")
        back = {
            "id": mem0["id"], "memory": cell.content.text, "hash": mem0["hash"],
            "created_at": cell.lifecycle.created_at, "updated_at": cell.lifecycle.last_updated_at,
            "user_id": cell.identity.owner_id if cell.identity.owner_type == "user" else None,
            "agent_id": cell.identity.created_by if cell.identity.owner_type == "agent" else None,
            "run_id": mem0.get("run_id"), "actor_id": mem0.get("actor_id"), "role": mem0.get("role"),
            "metadata": extra or None,
        }
        for key in ("id", "memory", "hash", "user_id", "agent_id", "run_id", "actor_id", "role"):
            assert back[key] == item.get(key), key
        assert back["metadata"] == item.get("metadata")
        assert same_instant(back["created_at"], item["created_at"])
        assert same_instant(back["updated_at"], item["updated_at"] or item["created_at"])
    vegetarian = by_ref["mem0:3c90c3cc-0d44-4b50-8888-8dd25736052a"]
    assert vegetarian.type == "semantic" and vegetarian.lifecycle.version == 2
    assert vegetarian.provenance.extraction_method == "llm_extraction"
    assert by_ref["mem0:f47ac10b-58cc-4372-a567-0e02b2c3d479"].type == "procedural"
    assert by_ref["mem0:a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d"].identity.session_id == "onboarding-1"
    # mem0's UPDATE row became history: the cell as it was before the update is readable.
    service = MemoryService(store=store)
    history = service.history("alex", vegetarian.id)
    assert [h.action for h in history] == ["create", "update"]
    before = service.get_as_of("alex", vegetarian.id, history[1].at.replace(microsecond=0))
    assert before.content.text == "Is vegetarian"
    store.close()


def test_letta_agent_file(tmp_path):
    sample = json.loads((SAMPLES / "letta_support_bot.af").read_text())
    cells, store = imported(tmp_path, "letta_support_bot.af", "letta")
    by_label = {c.content.metadata["letta"].get("label"): c for c in cells}
    blocks = {b["label"]: b for b in sample["blocks"]}
    # Round trip: every block rebuilt from its cell.
    for label, block in blocks.items():
        cell = by_label[label]
        meta = cell.content.metadata["letta"]
        back = {"label": meta["label"], "value": cell.content.text, "limit": meta["limit"],
                "description": meta["description"], "read_only": meta["read_only"], "metadata": meta.get("metadata", {})}
        assert back == {k: block[k] for k in back}
        assert same_instant(cell.lifecycle.created_at, sample["created_at"])
    assert by_label["persona"].type == "procedural" and by_label["human"].type == "semantic"
    assert by_label["persona"].identity.owner_id == "support-bot"
    assert by_label["persona"].identity.owner_type == "agent"
    # A block shared with another agent: that agent may read and write it; read-only blocks
    # get no other writers.
    assert by_label["human"].access_policy.readable_by == ["sleeptime-helper"]
    assert by_label["human"].access_policy.writable_by == ["sleeptime-helper"]
    assert by_label["policies"].access_policy.writable_by == []
    passage = by_label[None]
    assert passage.content.text == sample["agents"][0]["passages"][0]["text"]
    assert passage.content.metadata["letta"]["archival"] is True
    assert same_instant(passage.lifecycle.created_at, "2026-08-31T12:00:00+00:00")
    store.close()


def test_letta_06_agent_file_maps_core_memory_like_blocks(tmp_path):
    sample = json.loads((SAMPLES / "letta_06_agent.af").read_text())
    assert detect_format(str(SAMPLES / "letta_06_agent.af")) == "letta"
    cells, store = imported(tmp_path, "letta_06_agent.af", "letta")
    by_label = {c.content.metadata["letta"]["label"]: c for c in cells}
    assert sorted(by_label) == ["human", "persona"]  # the empty block holds no memory
    for block in sample["core_memory"][:2]:
        cell = by_label[block["label"]]
        meta = cell.content.metadata["letta"]
        assert cell.content.text == block["value"] and meta["limit"] == block["limit"]
        assert meta["description"] == block["description"] and meta.get("metadata", {}) == block["metadata_"]
        assert cell.identity.owner_id == "sam-support" and cell.identity.owner_type == "agent"
        assert cell.provenance.source_ref == f"letta:sam-support/{block['label']}"
        assert same_instant(cell.lifecycle.created_at, sample["updated_at"] + "+00:00")
    assert by_label["persona"].type == "procedural" and by_label["human"].type == "semantic"
    store.close()
    done = ampkit("import", str(SAMPLES / "letta_06_agent.af"), "--store", f"sqlite:///{tmp_path}/m.db")
    assert done.returncode == 0 and "imported 2 cells" in done.stdout, done.stderr


def test_an_unknown_letta_shape_names_the_supported_versions(tmp_path):
    odd = tmp_path / "odd.af"
    odd.write_text(json.dumps({"agent": {"name": "x", "memory": {"blocks": []}}}))
    with pytest.raises(ImporterError, match=r"0\.6\.x.*core_memory.*later versions.*agents.*blocks"):
        to_export_lines("letta", str(odd))
    refused = ampkit("import", str(odd), "--store", f"sqlite:///{tmp_path}/m.db")
    assert refused.returncode == 1 and "supported: the agent files of Letta 0.6.x" in refused.stderr


def test_langgraph_store_items_from_the_real_library(tmp_path):
    from langgraph.store.memory import InMemoryStore

    sample = json.loads((SAMPLES / "langgraph_store_items.json").read_text())
    cells, store = imported(tmp_path, "langgraph_store_items.json", "langgraph")
    by_key = {c.content.metadata["langgraph"]["key"]: c for c in cells}
    # Round trip: put every cell back into a real LangGraph store and read the items out.
    live = InMemoryStore()
    for cell in cells:
        lg = cell.content.metadata["langgraph"]
        live.put(tuple(lg["namespace"]), lg["key"], lg["value"])
    for item in sample:
        again = live.get(tuple(item["namespace"]), item["key"])
        assert again.value == item["value"]
        cell = by_key[item["key"]]
        assert same_instant(cell.lifecycle.created_at, item["created_at"])
        assert same_instant(cell.lifecycle.last_updated_at, item["updated_at"])
        assert cell.provenance.source_ref == "langgraph:" + "/".join(item["namespace"] + [item["key"]])
    assert by_key["0b9f5e0c-1d2e-4f3a-9b8c-7d6e5f4a3b2c"].content.text == "Prefers window seats on long flights"
    assert by_key["0b9f5e0c-1d2e-4f3a-9b8c-7d6e5f4a3b2c"].identity.owner_id == "user-42"
    assert by_key["6f1e2d3c-4b5a-4968-8776-5a4b3c2d1e0f"].type == "episodic"
    assert by_key["9a8b7c6d-5e4f-4a3b-2c1d-0e9f8a7b6c5d"].type == "procedural"
    assert by_key["/AGENTS.md"].content.text.startswith("# Preferences")
    assert by_key["/AGENTS.md"].identity.owner_id == "user-7"
    store.close()
    # Items straight from a store's search (SearchItem.dict(), with a score) map the same way.
    fresh = InMemoryStore()
    fresh.put(("memories", "u1"), "k1", {"content": "likes jazz"})
    lines = from_langgraph([i.dict() for i in fresh.search(("memories",))])
    assert json.loads(lines[1])["cell"]["content"]["text"] == "likes jazz"


def test_amp_cell_json(tmp_path):
    sample = json.loads((SAMPLES / "amp_cells.json").read_text())
    cells, store = imported(tmp_path, "amp_cells.json", "amp")
    by_id = {c.id: c for c in cells}
    for raw in sample["cells"]:
        back = by_id[raw["id"]].model_dump(mode="json", exclude={"lifecycle": {"version", "supersedes", "superseded_by"}})
        for section in ("content", "identity", "access_policy", "provenance"):  # AMP's fields; ampkit adds extensions
            assert {k: back[section][k] for k in raw[section]} == raw[section], section
        assert (back["type"], back["amp_version"]) == (raw["type"], raw["amp_version"])
        assert {k: back["scoring"][k] for k in raw["scoring"]} == raw["scoring"]  # ampkit adds extensions
        assert back["lifecycle"]["status"] == raw["lifecycle"]["status"]
        assert same_instant(back["lifecycle"]["created_at"], raw["lifecycle"]["created_at"])
    store.close()


@pytest.mark.parametrize("name, fmt", [
    ("mem0_get_all_and_history.json", "mem0"), ("letta_support_bot.af", "letta"),
    ("langgraph_store_items.json", "langgraph"), ("amp_cells.json", "amp"),
])
def test_one_command_each(tmp_path, name, fmt):
    assert detect_format(str(SAMPLES / name)) == fmt
    done = ampkit("import", str(SAMPLES / name), "--store", f"sqlite:///{tmp_path}/m.db")
    assert done.returncode == 0, done.stderr
    assert f"import ({fmt})" in done.stderr and "imported" in done.stdout


def test_unmappable_records_are_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"results": [{"id": "x1", "memory": "no owner", "created_at": "2026-01-01T00:00:00Z"}]}))
    with pytest.raises(ImporterError, match=r"results\[0\].*--owner"):
        to_export_lines("mem0", str(bad))
    lines = to_export_lines("mem0", str(bad), owner_id="someone")
    assert json.loads(lines[1])["cell"]["identity"]["owner_id"] == "someone"
    refused = ampkit("import", str(bad), "--store", f"sqlite:///{tmp_path}/m.db", "--from", "mem0")
    assert refused.returncode == 1 and "results[0]" in refused.stderr
