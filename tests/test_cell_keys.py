"""Cell keys (`identity.key`): one live cell per (owner, key), enforced by the store's unique
index and a transaction-scoped lookup; concurrent creates of one new key give one cell.
Over HTTP against the session's real server, and on PostgreSQL through the service."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta, timezone

import pytest

import ampkit


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_a_second_live_cell_with_the_same_owner_and_key_is_a_conflict(server):
    user, key = unique("user"), unique("key")
    a = ampkit.connect(server.base_url, agent_id=unique("agent-a"))
    b = ampkit.connect(server.base_url, agent_id=unique("agent-b"))
    first = a.remember("first value", owner_id=user, key=key)
    assert first.identity.key == key

    for writer in (a, b):  # the holder's creator and an agent that cannot even read it
        with pytest.raises(ampkit.Conflict) as refused:
            writer.remember("second value", owner_id=user, key=key)
        assert refused.value.details == {"key": key}  # no id, no text of the holder
    assert a.remember("another owner's", owner_id=unique("user"), key=key).identity.key == key

    # Superseding the holder hands the key over in one step.
    second = a.remember("second value", owner_id=user, key=key, supersedes=first.id)
    assert [c.id for c in a.list(owner_id=user)] == [second.id]
    # Archiving releases the key; deleting an archived cell too.
    a.update(second.id, status="archived")
    third = a.remember("third value", owner_id=user, key=key)
    assert [c.content.text for c in a.list(owner_id=user)] == ["third value"]
    assert third.identity.key == key


def test_an_expired_holder_frees_its_key(server):
    user, key = unique("user"), unique("key")
    agent = ampkit.connect(server.base_url, agent_id=unique("agent"))
    past = datetime.now(timezone.utc) - timedelta(seconds=1)
    old = agent.remember("expired value", owner_id=user, key=key, expires_at=past)
    new = agent.remember("fresh value", owner_id=user, key=key)
    assert new.identity.key == key
    assert [h.action for h in agent.history(old.id)][-1] == "status"
    assert agent.get(old.id).lifecycle.status == "archived"


def test_concurrent_creates_of_one_new_key_leave_one_cell(server):
    user, key = unique("user"), unique("key")
    results: list[str] = []

    def create(n: int) -> None:
        client = ampkit.connect(server.base_url, agent_id=f"agent-{n}")
        try:
            client.remember(f"value {n}", owner_id=user, key=key, readable_by=["*"])
            results.append("created")
        except ampkit.Conflict:
            results.append("conflict")
        finally:
            client.close()

    threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["conflict"] * 7 + ["created"]
    assert len(list(ampkit.connect(server.base_url, agent_id=user).list(owner_id=user))) == 1


@pytest.mark.postgres
def test_postgres_serialises_concurrent_creates_of_one_key(pg_url):
    from ampkit.models import CellCreate
    from ampkit.service import MemoryService
    from ampkit.store import store_from_url

    store = store_from_url(pg_url)
    store.open()
    try:
        service = MemoryService(store=store)
        outcomes: list[str] = []
        barrier = threading.Barrier(6)

        def create(n: int) -> None:
            req = CellCreate.model_validate({"content": {"text": f"v{n}"}, "identity": {"owner_id": "ada", "key": "k"}})
            barrier.wait()
            try:
                service.create(f"agent-{n}", req)
                outcomes.append("created")
            except ampkit.Conflict:
                outcomes.append("conflict")

        threads = [threading.Thread(target=create, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) == ["conflict"] * 5 + ["created"]
        cells, total, _ = service.list("ada", owner_id="ada")
        assert total == 1 and cells[0].identity.key == "k"
    finally:
        store.close()
