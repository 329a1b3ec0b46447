"""Lifecycle rules through the service with a controlled clock, and the decay formula."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest

from ampkit.errors import AccessDenied, InvalidTransition
from ampkit.lifecycle import LifecyclePolicy, decay_score
from ampkit.models import CellCreate, CellPatch
from ampkit.service import MemoryService
from ampkit.store import store_from_url

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self):
        return self.now

    def advance(self, days: float):
        self.now += timedelta(days=days)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def service(tmp_path, clock):
    store = store_from_url(f"sqlite:///{tmp_path}/life.db")
    store.open()
    yield MemoryService(store=store, clock=clock)
    store.close()


def create(service, **scoring):
    body = {"content": {"text": "remember the milk"}, "identity": {"owner_id": "u"}, "scoring": scoring}
    return service.create("a", CellCreate.model_validate(body))


def status(service, cell_id):
    return service.store.get(cell_id).lifecycle.status


def test_decay_formula(service, clock):
    cell = create(service, importance=0.8, confidence=0.5, decay_rate=0.1)
    assert decay_score(cell, T0) == pytest.approx(0.4)
    assert decay_score(cell, T0 + timedelta(days=10)) == pytest.approx(0.4 * math.exp(-1.0))


def test_default_cell_goes_stale_after_about_51_days(service, clock):
    cell = create(service)
    clock.advance(51.0)
    assert service.run_lifecycle().to_stale == 0
    clock.advance(0.2)  # 0.5 * e^(-0.01 d) < 0.3  <=>  d > 51.08
    assert service.run_lifecycle().to_stale == 1
    assert status(service, cell.id) == "stale"


def test_stale_archives_after_30_days_without_update(service, clock):
    cell = create(service, importance=0.2)  # 0.2 < 0.3: stale on the first run
    service.run_lifecycle()
    assert status(service, cell.id) == "stale"
    clock.advance(29.9)
    service.run_lifecycle()
    assert status(service, cell.id) == "stale"
    clock.advance(0.2)
    assert service.run_lifecycle().to_archived == 1
    assert status(service, cell.id) == "archived"


def test_read_revives_a_stale_cell(service, clock):
    cell = create(service)
    clock.advance(60)
    service.run_lifecycle()
    assert status(service, cell.id) == "stale"
    got = service.get("a", cell.id)  # the access restarts the decay clock
    assert got.lifecycle.status == "active"
    assert [h.action for h in service.store.history(cell.id)][-1] == "status"


def test_expired_cell_hidden_then_archived(service, clock):
    cell = service.create("a", CellCreate.model_validate({
        "content": {"text": "temporary code 1234"}, "identity": {"owner_id": "u"},
        "lifecycle": {"expires_at": (T0 + timedelta(days=1)).isoformat()},
    }))
    clock.advance(2)
    assert service.list("a", owner_id="u")[0] == []
    result = service.run_lifecycle()
    assert (result.to_archived, result.expired) == (1, 1)
    assert status(service, cell.id) == "archived"


def test_transitions_and_purge_retention(service, clock):
    cell = create(service)
    with pytest.raises(InvalidTransition):
        service.delete("a", cell.id)
    for bad in ("deleted", "stale"):
        with pytest.raises(InvalidTransition):
            service.update("a", cell.id, CellPatch.model_validate({"lifecycle": {"status": bad}}))
    service.update("a", cell.id, CellPatch.model_validate({"lifecycle": {"status": "archived"}}))
    with pytest.raises(InvalidTransition):
        service.update("a", cell.id, CellPatch.model_validate({"lifecycle": {"status": "active"}}))
    service.delete("a", cell.id)
    with pytest.raises(AccessDenied):  # deleted is terminal and invisible
        service.get("a", cell.id)
    clock.advance(29)
    assert service.purge("admin", [cell.id]).purged == []
    clock.advance(1.01)
    assert service.purge("admin").purged == [cell.id]


def test_policy_is_configuration(tmp_path, clock):
    store = store_from_url(f"sqlite:///{tmp_path}/p.db")
    store.open()
    try:
        service = MemoryService(store=store, clock=clock, policy=LifecyclePolicy(stale_threshold=0.6))
        cell = create(service)  # 0.5 < 0.6
        service.run_lifecycle()
        assert status(service, cell.id) == "stale"
    finally:
        store.close()
