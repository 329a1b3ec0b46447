"""A serving process takes its startup objects out of the cyclic collector's walks
(`ampkit.server.freeze_startup_objects`, called by `run` and by each `--workers` worker's
`worker_app`): a full collection then walks only what was made since, and cyclic garbage
made later is still collected."""

from __future__ import annotations

import gc
import weakref

import pytest

from ampkit.server import freeze_startup_objects, worker_app


class Node:
    def __init__(self) -> None:
        self.other: object = self


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # give this test process's objects back to the collector


def test_startup_objects_leave_the_collectors_walks_and_later_garbage_is_still_collected(unfrozen):
    before = Node()
    tracked_before = len(gc.get_objects())
    freeze_startup_objects()
    assert gc.get_freeze_count() >= tracked_before * 0.9
    assert not any(o is before for o in gc.get_objects())  # out of every generation's walk
    later = Node()  # a cycle made after the start: garbage once dropped
    gone = weakref.ref(later)
    del later
    gc.collect()
    assert gone() is None


def test_each_workers_app_freezes_its_startup_objects(unfrozen, monkeypatch):
    monkeypatch.setenv("AMPKIT_STORE", "memory://")
    gc.unfreeze()
    app = worker_app()
    assert app.title == "ampkit"
    assert gc.get_freeze_count() > 10_000  # the imported modules and the app at least
