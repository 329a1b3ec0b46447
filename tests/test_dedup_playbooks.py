"""Dedup on write (no model), playbook outcomes and their ranking, background consolidation."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

import ampkit
from ampkit import AccessDenied, ValidationFailed
from ampkit.bootstrap import build_service, load_settings
from ampkit.models import CellCreate
from ampkit.consolidation import BackgroundConsolidation, Consolidator
from ampkit.playbooks import wilson_lower_bound
from ampkit.store import store_from_url
from fake_llm import FakeModel, extraction
from support import TLS

H = {"X-AMP-Agent-ID": "writer"}


def post(server, body, agent="writer"):
    return httpx.post(f"{server.base_url}/memories", json=body, headers={"X-AMP-Agent-ID": agent}, verify=TLS)


def cell(text, owner="dd-owner", **extra):
    return {"content": {"text": text}, "identity": {"owner_id": owner}, **extra}


# ---------------------------------------------------------------- dedup on write


def test_exact_duplicate_returns_the_existing_cell_and_counts_a_use(server):
    first = post(server, cell("Prefers the window seat"))
    again = post(server, cell("  prefers the WINDOW seat.  "))
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.headers["X-AMP-Dedup"] == "exact" and again.json()["id"] == first.json()["id"]
    assert again.json()["scoring"]["access_count"] == first.json()["scoring"]["access_count"] + 1
    history = httpx.get(f"{server.base_url}/memories/{first.json()['id']}/history", headers=H, verify=TLS).json()["results"]
    assert [h["action"] for h in history] == ["create"]  # a use, like a read: no history entry
    # not a duplicate: another owner, another type, an episode, or dedup off
    assert post(server, cell("Prefers the window seat", owner="dd-other")).status_code == 201
    assert post(server, cell("Prefers the window seat", type="procedural")).status_code == 201
    assert post(server, cell("Prefers the window seat", type="episodic")).status_code == 201
    assert post(server, cell("Prefers the window seat", type="episodic")).status_code == 201
    assert post(server, cell("Prefers the window seat", dedup="off")).status_code == 201


def test_near_duplicates_by_policy(server):
    first = post(server, cell("User likes dark mode in the editor", owner="dd-near")).json()
    near = "The user likes the dark mode in their editor"
    assert post(server, cell(near, owner="dd-near", dedup="skip")).json()["id"] == first["id"]
    merged = post(server, cell(near, owner="dd-near", dedup="merge", scoring={"importance": 0.9},
                               content={"text": near, "metadata": {"source": "chat"}}))
    assert merged.headers["X-AMP-Dedup"] == "merged"
    body = merged.json()
    assert body["id"] == first["id"] and body["scoring"]["importance"] == 0.9
    assert body["content"] == {"text": first["content"]["text"], "metadata": {"source": "chat"}}
    history = httpx.get(f"{server.base_url}/memories/{first['id']}/history", headers=H, verify=TLS).json()["results"]
    assert history[-1]["changes"]["merged_text"] == near  # nothing said is lost
    # the default (exact) stores a near-duplicate; an unrelated text is never a duplicate
    assert post(server, cell(near, owner="dd-near")).status_code == 201
    assert post(server, cell("Allergic to peanuts", owner="dd-near", dedup="skip")).status_code == 201


def test_dedup_never_reveals_a_cell_the_writer_cannot_read(server):
    """A duplicate the writer cannot read is not a duplicate: the answer is what it would be
    if that cell did not exist (201, a new id, no header), for every policy."""
    hidden = post(server, cell("Lives at 12 Hidden Lane", owner="dd-ni"), agent="alice").json()
    for policy in ("exact", "skip", "merge"):
        answer = post(server, cell("Lives at 12 Hidden Lane", owner="dd-ni", dedup=policy), agent=f"bob-{policy}")
        assert answer.status_code == 201 and "X-AMP-Dedup" not in answer.headers
        assert answer.json()["id"] != hidden["id"] and answer.json()["scoring"]["access_count"] == 0
    after = httpx.get(f"{server.base_url}/memories/{hidden['id']}/history", headers={"X-AMP-Agent-ID": "alice"}, verify=TLS)
    assert [h["action"] for h in after.json()["results"]] == ["create"]  # untouched


def test_migration_9_digests_existing_texts_so_dedup_finds_them(tmp_path):
    """An exact duplicate is found by the normalised-text digest (SQLite migration 9); a
    store written before the digest existed gets it filled in, so a restated memory written
    before the upgrade is still recognised, in any case and spacing."""
    import sqlite3

    url = f"sqlite:///{tmp_path}/old.db"
    service = build_service(load_settings(store=url, embedder="none"))
    service.store.open()
    first = service.create("dd-old", CellCreate.model_validate(cell("Prefers  window seats.", owner="dd-old")))
    service.store.close()
    conn = sqlite3.connect(tmp_path / "old.db")  # back to a version-8 file: no digest column
    conn.executescript("DROP INDEX cells_text_key; ALTER TABLE cells DROP COLUMN text_key; "
                       "DELETE FROM schema_migrations WHERE version = 9;")
    conn.close()
    service = build_service(load_settings(store=url, embedder="none"))
    service.store.open()
    try:
        again, kind = service.create_many_detailed(
            "dd-old", [CellCreate.model_validate(cell("prefers window SEATS", owner="dd-old"))])[0]
        assert (again.id, kind) == (first.id, "exact")
    finally:
        service.store.close()


def test_identical_writes_racing_over_http_store_one_cell(server):
    """The same race through the server, whose creates wait for their group on the event loop
    (ampkit.store.grouped_writes, run_async): eight clients send one memory at once, ten rounds; one
    201, seven 200 with X-AMP-Dedup: exact, all naming one cell, and one cell stored."""
    import threading

    owner = f"dd-http-race-{id(server)}"
    clients = [httpx.Client(base_url=server.base_url, headers={"X-AMP-Agent-ID": f"agent-{i}"},
                            verify=TLS, timeout=30) for i in range(8)]
    try:
        for round_ in range(10):
            barrier = threading.Barrier(8)
            answers: list[tuple[int, str, str]] = []
            body = cell(f"Allergic to penicillin, told over HTTP {round_}", owner=owner, access_policy={"public": True})

            def write(client: httpx.Client) -> None:
                barrier.wait()
                r = client.post("/memories", json=body)
                answers.append((r.status_code, r.headers.get("X-AMP-Dedup", ""), r.json()["id"]))

            threads = [threading.Thread(target=write, args=(c,)) for c in clients]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted((status, dedup) for status, dedup, _ in answers) == [(200, "exact")] * 7 + [(201, "")], answers
            assert len({cid for _, _, cid in answers}) == 1
        stored = clients[0].get("/memories", params={"owner_id": owner, "limit": 100}).json()
        assert stored["total"] == 10 and len(stored["results"]) == 10
    finally:
        for c in clients:
            c.close()


def test_identical_writes_racing_each_other_store_one_cell(tmp_path):
    """Eight threads restate one memory at once (a retried request, two agents hearing the same
    thing), in 30 rounds: one cell per round, the others are counted uses of it. Fails without
    the service's dedup lock (the threads' checks run before any of them commits)."""
    import threading

    service = build_service(load_settings(store=f"sqlite:///{tmp_path}/race.db", embedder="none"))
    service.store.open()
    try:
        for round_ in range(30):
            barrier = threading.Barrier(8)
            results: list[tuple[str, object]] = []
            text = f"Allergic to penicillin, note {round_}"

            def write(i: int) -> None:
                barrier.wait()
                req = CellCreate.model_validate(cell(text, owner="dd-race", access_policy={"public": True}))
                cell_, kind = service.create_many_detailed(f"agent-{i}", [req])[0]
                results.append((cell_.id, kind))

            threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len({cid for cid, _ in results}) == 1, (round_, results)
            assert sorted(str(kind) for _, kind in results) == ["None"] + ["exact"] * 7
            assert service.get("dd-race", results[0][0]).scoring.access_count >= 8
    finally:
        service.store.close()


def test_batch_dedups_within_itself_and_against_the_store(server):
    existing = post(server, cell("Drinks oat milk", owner="dd-batch")).json()
    answer = httpx.post(f"{server.base_url}/memories/batch", headers=H, json={"cells": [
        cell("Drinks oat milk", owner="dd-batch"), cell("Runs on Sundays", owner="dd-batch"),
        cell("runs on sundays", owner="dd-batch")]}, verify=TLS)
    body = answer.json()
    assert answer.status_code == 201 and body["deduplicated"] == [0, 2]
    assert body["results"][0]["id"] == existing["id"] and body["results"][2]["id"] == body["results"][1]["id"]


# ---------------------------------------------------------------- playbooks


def test_outcomes_count_under_the_write_rule(tmp_path):
    url = f"sqlite:///{tmp_path}/m.db"
    with ampkit.connect(url, agent_id="agent") as memory:
        playbook = memory.remember("Restart the worker, then clear the queue", owner_id="o", type="procedural",
                                   writable_by=["helper"])
        assert (playbook.scoring.success_count, playbook.scoring.failure_count) == (0, 0)
        memory.record_outcome(playbook.id, True)
        after = memory.record_outcome(playbook.id, False, note="queue refilled")
        assert (after.scoring.success_count, after.scoring.failure_count) == (1, 1)
        history = memory.history(playbook.id)
        assert [h.action for h in history] == ["create", "outcome", "outcome"] and history[-1].changes["note"] == "queue refilled"
        fact = memory.remember("Likes jazz", owner_id="o")
        with pytest.raises(ValidationFailed):
            memory.record_outcome(fact.id, True)
        assert fact.scoring.success_count is None
    with ampkit.connect(url, agent_id="helper") as helper:  # may write, may not read: no cell in the answer
        assert helper.record_outcome(playbook.id, True) is None
    with ampkit.connect(url, agent_id="stranger") as stranger:
        with pytest.raises(AccessDenied) as forbidden:
            stranger.record_outcome(playbook.id, True)
        with pytest.raises(AccessDenied) as missing:
            stranger.record_outcome("mem_00000000000000000000000000", True)
        assert forbidden.value.envelope() == missing.value.envelope()


def test_wilson_lower_bound():
    assert wilson_lower_bound(0, 0) == 0.0
    assert wilson_lower_bound(1, 0) == pytest.approx(0.2065, abs=1e-4)
    assert wilson_lower_bound(9, 1) == pytest.approx(0.5958, abs=1e-4)
    assert wilson_lower_bound(1, 0) < wilson_lower_bound(9, 1) < wilson_lower_bound(95, 5)


def test_search_can_rank_playbooks_by_their_outcomes(tmp_path):
    with ampkit.connect(f"sqlite:///{tmp_path}/m.db", agent_id="agent") as memory:
        risky = memory.remember("Deploy fix: restart every pod at once", owner_id="o", type="procedural")
        proven = memory.remember("Deploy fix: restart the pods one at a time", owner_id="o", type="procedural")
        for _ in range(3):
            memory.record_outcome(risky.id, False)
        for _ in range(9):
            memory.record_outcome(proven.id, True)
        memory.record_outcome(proven.id, False)
        plain = memory.search("deploy fix restart every pod", owner_id="o", explain=True)
        assert plain[0].cell.id == risky.id  # by text alone
        ranked = memory.search("deploy fix restart every pod", owner_id="o", rank_playbooks=True, explain=True)
        assert [r.cell.id for r in ranked] == [proven.id, risky.id]
        assert ranked[0].explain["wilson"] == pytest.approx(wilson_lower_bound(9, 1))


# ---------------------------------------------------------------- background consolidation


def test_background_consolidates_quiet_sessions_once(tmp_path):
    fake = FakeModel().start()
    try:
        fake.on("extract", "I am vegetarian", reply=extraction(("The user is vegetarian.", "fact", ["I am vegetarian"])))
        settings = load_settings(env=False, store=f"sqlite:///{tmp_path}/m.db", llm_url=fake.url, llm_model="fake-1")
        service = build_service(settings)
        service.store.open()
        try:
            service.create("bot", CellCreate.model_validate({
                "type": "episodic", "content": {"text": "I am vegetarian"},
                "identity": {"owner_id": "u9", "session_id": "lunch"}}))
            job = BackgroundConsolidation(Consolidator(service, service.model, service.consolidation))
            now = service.clock()
            assert job.run_once(now) == []  # not quiet yet
            quiet = now + timedelta(seconds=service.consolidation.quiet_seconds + 1)
            [result] = job.run_once(quiet)
            assert [d.action for d in result.decisions] == ["ADD"] and len(result.written) == 1
            assert job.run_once(quiet) == [] and len(fake.prompts("extract")) == 1  # done: not asked again
            fact = service.store.get(result.written[0])
            assert fact.identity.owner_id == "u9" and fact.provenance.source_ref == "ampkit:consolidation"
        finally:
            service.store.close()
    finally:
        fake.stop()


@pytest.mark.postgres
def test_consolidation_job_is_claimed_once_per_interval(pg_url):
    one, two = store_from_url(pg_url), store_from_url(pg_url)
    one.open()
    two.open()
    try:
        assert one.claim_scheduled_job("consolidation", 600) is True
        assert two.claim_scheduled_job("consolidation", 600) is False
        assert two.claim_scheduled_lifecycle(600) is True  # its own row: jobs do not block each other
    finally:
        one.close()
        two.close()
