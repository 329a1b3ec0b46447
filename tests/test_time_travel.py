"""As-of reads and rollback (issue 16), on both stores, over HTTP and in process, with an
injected clock: every edit happens at a known time, and each version is read back by it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import httpx
import pytest
from starlette.testclient import TestClient

from ampkit import Client, connect
from ampkit.client._local import LocalTransport
from ampkit.errors import AccessDenied, ValidationFailed
from ampkit.server.app import create_app
from ampkit.service import MemoryService
from ampkit.store import store_from_url
from support import TLS

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def at(self, minutes: int) -> datetime:
        self.now = T0 + timedelta(minutes=minutes)
        return self.now


@pytest.fixture(params=["sqlite", "postgres"])
def service(request, tmp_path):
    url = f"sqlite:///{tmp_path}/tt.db" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    store = store_from_url(url)
    store.open()
    yield MemoryService(store=store, clock=Clock())
    store.close()


@pytest.fixture(params=["http", "in-process"])
def client_for(request, service):
    """agent id -> a Client on `service`: over HTTP (the real app, ASGI transport) or in process."""
    made = []

    def make(agent: str):
        if request.param == "http":
            http = TestClient(create_app(service=service))  # the store is already open: no lifespan
            client = Client("http://testserver/amp/v1", agent_id=agent, http_client=http)
        else:
            client = connect("memory://", agent_id=agent)
            client._transport = LocalTransport("memory://", agent_id=agent, service=service)
            client._transport._opened = True
        made.append(client)
        return client

    yield make
    for client in made:
        if request.param == "http":
            client.close()


def test_five_edits_each_read_back_by_as_of_then_rollback_to_version_2(service, client_for):
    clock, alice = service.clock, client_for("alice")
    clock.at(0)
    cell = alice.remember("version 1", owner_id="alice", session_id="s1", importance=0.4)
    for n in range(2, 7):  # five edits: versions 2..6 at minutes 10, 20, ..., 50
        clock.at(10 * (n - 1))
        alice.update(cell.id, text=f"version {n}", metadata={"n": n})

    for n in range(1, 7):
        at = T0 + timedelta(minutes=10 * (n - 1), seconds=30)  # just after version n was written
        then = alice.get(cell.id, as_of=at)
        assert (then.content.text, then.lifecycle.version) == (f"version {n}", n)
        assert then.content.metadata == ({} if n == 1 else {"n": n})
        assert then.identity.session_id == "s1" and then.scoring.importance == 0.4
        exact = alice.get(cell.id, as_of=T0 + timedelta(minutes=10 * (n - 1)))  # at the very instant
        assert exact.content.text == f"version {n}"
    with pytest.raises(AccessDenied):  # before it existed: the same answer as a missing id
        alice.get(cell.id, as_of=T0 - timedelta(seconds=1))
    # An as-of read counts no access; the live cell is unchanged by all of the above.
    assert service.store.get(cell.id).scoring.access_count == 0

    # The set as it was: list and search see version 3's text at minute 25.
    at = T0 + timedelta(minutes=25)
    listed = list(alice.list(owner_id="alice", as_of=at))
    assert [c.content.text for c in listed] == ["version 3"]
    hits = alice.search("version 3", owner_id="alice", as_of=at)
    assert [h.cell.content.text for h in hits] == ["version 3"]
    assert alice.search("version 6", owner_id="alice", as_of=at)[0].cell.content.text == "version 3"
    assert list(alice.list(owner_id="alice", metadata={"n": 3}, as_of=at))[0].lifecycle.version == 3
    assert list(alice.list(owner_id="alice", metadata={"n": 4}, as_of=at)) == []

    clock.at(60)
    restored = alice.rollback(cell.id, 2)
    assert (restored.content.text, restored.content.metadata, restored.lifecycle.version) == ("version 2", {"n": 2}, 7)
    assert alice.get(cell.id).content.text == "version 2"
    last = alice.history(cell.id)[-1]
    assert (last.action, last.actor, last.changes["to_version"]) == ("rollback", "alice", 2)
    assert last.changes["content.text"] == ["version 6", "version 2"]
    # The rolled-back-over versions are still there to read, and to roll back to.
    assert alice.get(cell.id, as_of=T0 + timedelta(minutes=55)).content.text == "version 6"
    assert alice.rollback(cell.id, 6).content.text == "version 6"
    assert alice.search("version", owner_id="alice")[0].cell.content.text == "version 6"  # re-indexed


def test_rollback_is_under_the_write_rule_and_validated(service, client_for):
    clock, alice, bob = service.clock, client_for("alice"), client_for("bob")
    clock.at(0)
    cell = alice.remember("original", owner_id="alice", readable_by=["bob"])
    clock.at(1)
    alice.update(cell.id, text="changed")
    with pytest.raises(AccessDenied):  # bob may read, not write
        bob.rollback(cell.id, 1)
    with pytest.raises(AccessDenied):  # unknown ids answer the same
        bob.rollback("mem_00000000000000000000000000", 1)
    for bad in (2, 3, 0):
        with pytest.raises(ValidationFailed):
            alice.rollback(cell.id, bad)
    from ampkit.errors import Conflict

    with pytest.raises(Conflict):
        alice.rollback(cell.id, 1, expected_version=1)
    assert alice.rollback(cell.id, 1, expected_version=2).content.text == "original"


def test_as_of_access_is_the_stricter_of_then_and_now(service, client_for):
    clock, alice, bob = service.clock, client_for("alice"), client_for("bob")
    clock.at(0)
    shared = alice.remember("shared then revoked", owner_id="alice", readable_by=["bob"])
    private = alice.remember("private then shared", owner_id="alice")
    clock.at(10)
    alice.update(shared.id, readable_by=[])
    alice.update(private.id, readable_by=["bob"])
    at = T0 + timedelta(minutes=5)
    for cell_id in (shared.id, private.id):  # revoked now / private then: both hidden
        with pytest.raises(AccessDenied):
            bob.get(cell_id, as_of=at)
    assert list(bob.list(owner_id="alice", as_of=at)) == []
    assert bob.search("shared", owner_id="alice", as_of=at) == []
    assert bob.get(private.id, as_of=T0 + timedelta(minutes=10)).content.text == "private then shared"
    assert [c.id for c in bob.list(owner_id="alice", as_of=T0 + timedelta(minutes=11))] == [private.id]


def test_deleted_and_purged_cells_stay_gone_from_the_past(service, client_for):
    clock, alice = service.clock, client_for("alice")
    clock.at(0)
    cell = alice.remember("to be erased", owner_id="alice")
    clock.at(1)
    alice.forget(cell.id)  # archive, then delete
    with pytest.raises(AccessDenied):
        alice.get(cell.id, as_of=T0 + timedelta(seconds=30))
    clock.now = T0 + timedelta(days=40)
    assert service.purge("admin", [cell.id]).purged == [cell.id]
    with pytest.raises(AccessDenied):
        alice.get(cell.id, as_of=T0 + timedelta(seconds=30))
    assert list(alice.list(owner_id="alice", status=["active", "archived"], as_of=T0 + timedelta(seconds=30))) == []


def test_status_and_supersession_as_of(service, client_for):
    clock, alice = service.clock, client_for("alice")
    clock.at(0)
    old = alice.remember("lives in Paris", owner_id="alice")
    clock.at(10)
    new = alice.supersede(old.id, "lives in Rome")
    clock.at(20)
    alice.update(new.id, status="archived")
    at_5, at_15 = T0 + timedelta(minutes=5), T0 + timedelta(minutes=15)
    assert [c.content.text for c in alice.list(owner_id="alice", as_of=at_5)] == ["lives in Paris"]
    assert [c.content.text for c in alice.list(owner_id="alice", as_of=at_15)] == ["lives in Rome"]
    assert alice.get(old.id, as_of=at_5).lifecycle.superseded_by is None
    assert alice.get(old.id, as_of=at_15).lifecycle.superseded_by == new.id
    assert alice.get(new.id, as_of=at_15).lifecycle.status == "active"
    assert list(alice.list(owner_id="alice", as_of=T0 + timedelta(minutes=25))) == []


def test_as_of_over_a_real_server_process(server):
    """The same read through `ampkit serve` (real clock): the times come from the history."""
    with connect(server.base_url, agent_id="tt-alice") as alice:
        cell = alice.remember("first words", owner_id="tt-alice")
        alice.update(cell.id, text="second words")
        alice.update(cell.id, text="third words")
        times = [h.at for h in alice.history(cell.id)]
        assert [alice.get(cell.id, as_of=t).content.text for t in times] == ["first words", "second words", "third words"]
        raw = httpx.get(f"{server.base_url}/memories/{cell.id}", params={"as_of": "not a time"},
                        headers={"X-AMP-Agent-ID": "tt-alice"}, verify=TLS)
        assert raw.status_code == 422 and raw.json()["error"]["code"] == "VALIDATION_ERROR"
        assert alice.rollback(cell.id, 1).content.text == "first words"


# ------------------------------------------------------------------ non-interference
def _world(tmp_path, name: str, seed: int, with_hidden: bool, monkeypatch) -> MemoryService:
    """The same operations on the cells `eve` may read, in the same order at the same times
    and with the same ids; with `with_hidden`, interleaved operations on cells eve cannot read
    now (never shared, shared then revoked, deleted) that use the same words."""
    import random

    import ampkit.service_base as service_module  # where cell ids are made
    from ampkit.models import CellCreate, CellPatch

    rng, rng_hidden = random.Random(seed), random.Random(-seed)  # one stream each: the visible one is shared
    store = store_from_url(f"sqlite:///{tmp_path}/{name}.db")
    store.open()
    service = MemoryService(store=store, clock=Clock())
    ids = {"visible": iter(f"mem_{i:026d}" for i in range(1, 10**6)), "hidden": iter(f"mem_9{i:025d}" for i in range(1, 10**6))}
    words = ["tea", "coffee", "Rome", "Paris", "jazz", "piano"]
    visible, hidden = [], []
    for step in range(24):
        service.clock.at(step)
        kind = "visible"
        monkeypatch.setattr(service_module, "new_cell_id", lambda: next(ids[kind]))
        text = f"{rng.choice(words)} {rng.choice(words)} {step}"
        roll = rng.random()
        if roll < 0.35 or not visible:
            owner, policy = rng.choice([("eve", {}), ("bob", {"readable_by": ["eve"]}), ("bob", {"public": True})])
            cell = service.create(owner, CellCreate.model_validate(
                {"content": {"text": text}, "identity": {"owner_id": owner}, "access_policy": policy}))
            visible.append(cell)
        elif roll < 0.7:
            cell = rng.choice(visible)
            service.update(cell.identity.owner_id, cell.id, CellPatch.model_validate(
                {"content": {"text": text, "metadata": {"step": step}}}))
        elif roll < 0.8:
            cell = rng.choice(visible)
            service.update(cell.identity.owner_id, cell.id, CellPatch.model_validate({"lifecycle": {"status": "archived"}}))
        if with_hidden:  # at the same instant, something eve will not be able to read now
            kind = "hidden"
            monkeypatch.setattr(service_module, "new_cell_id", lambda: next(ids[kind]))
            fate = rng_hidden.choice(["private", "revoked", "deleted"])
            cell = service.create("mallory", CellCreate.model_validate(
                {"content": {"text": text}, "identity": {"owner_id": "mallory"},
                 "access_policy": {"readable_by": [] if fate == "private" else ["eve"]}}))
            hidden.append((cell, fate))
            for old, old_fate in hidden[:-1]:
                if old_fate == "revoked" and rng_hidden.random() < 0.2:
                    service.update("mallory", old.id, CellPatch.model_validate({"content": {"text": f"{text} more"}}))
    service.clock.at(30)
    for cell, fate in hidden:  # now: revoke and delete
        if fate == "revoked":
            service.update("mallory", cell.id, CellPatch.model_validate({"access_policy": {"readable_by": []}}))
        elif fate == "deleted":
            service.update("mallory", cell.id, CellPatch.model_validate({"lifecycle": {"status": "archived"}}))
            service.delete("mallory", cell.id)
    service.hidden_ids = [c.id for c, _ in hidden]  # type: ignore[attr-defined]
    return service


def _answers(service: MemoryService, probe_ids: list[str]) -> list:
    """Everything eve receives from as-of reads, as JSON-ready values (errors included)."""
    from ampkit.errors import APIError
    from ampkit.models import SearchRequest

    out: list = []

    def record(fn):
        try:
            value = fn()
            out.append(value.model_dump(mode="json") if hasattr(value, "model_dump") else value)
        except APIError as exc:
            out.append({"error": exc.code, "message": str(exc), "details": exc.details})

    for minute in (0, 3, 7, 12, 18, 23, 31):
        at = T0 + timedelta(minutes=minute, seconds=30)
        for cell_id in probe_ids:
            record(lambda: service.get("eve", cell_id, as_of=at))
        for owner in (None, "mallory", "bob"):
            for status in (None, ["active", "archived"]):
                record(lambda: [[c.model_dump(mode="json") for c in r] if isinstance(r, list) else r
                                for r in service.list("eve", owner_id=owner, status=status, limit=3, as_of=at)])
        for query in ("tea", "Rome jazz", "coffee 5"):
            record(lambda: service.search("eve", SearchRequest(query=query, limit=5, explain=True, as_of=at,
                                                               include_stale=True)))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_as_of_reads_do_not_depend_on_cells_the_caller_cannot_read(tmp_path, monkeypatch, seed):
    plain = _world(tmp_path, "plain", seed, False, monkeypatch)
    noisy = _world(tmp_path, "noisy", seed, True, monkeypatch)
    probes = [f"mem_{i:026d}" for i in range(1, 12)] + noisy.hidden_ids[:6] + ["mem_00000000000000000000000099"]
    assert _answers(plain, probes) == _answers(noisy, probes)
    plain.store.close()
    noisy.store.close()


async def test_the_async_client_reads_as_of_and_rolls_back(tmp_path):
    """AsyncClient over HTTP (the app through httpx's ASGI transport), injected clock."""
    from ampkit import AsyncClient

    store = store_from_url(f"sqlite:///{tmp_path}/async.db")
    store.open()
    service = MemoryService(store=store, clock=Clock())
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(service=service)))
    async with AsyncClient("http://testserver/amp/v1", agent_id="alice", http_client=http) as alice:
        service.clock.at(0)
        cell = await alice.remember("first", owner_id="alice")
        service.clock.at(5)
        await alice.update(cell.id, text="second")
        at = T0 + timedelta(minutes=1)
        assert (await alice.get(cell.id, as_of=at)).content.text == "first"
        assert [c.content.text async for c in alice.list(owner_id="alice", as_of=at)] == ["first"]
        assert [h.cell.content.text for h in await alice.search("first", owner_id="alice", as_of=at)] == ["first"]
        assert (await alice.rollback(cell.id, 1)).content.text == "first"
    store.close()
