"""Group commit (ampkit.groupcommit): concurrent creates share one transaction, each answered
after it; an error stays with its request; identical racing writes never share a group."""

from __future__ import annotations

import threading
import time

import pytest

from ampkit.errors import Conflict
from ampkit.groupcommit import GroupCommit, Submission
from ampkit.models import CellCreate
from ampkit.service import MemoryService
from ampkit.store.sqlite import SQLiteStore


def _wait_until(predicate, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        threading.Event().wait(0.001)


def test_requests_queued_behind_a_running_group_form_the_next_group():
    release = threading.Event()
    groups: list[list[str]] = []

    def run(group):
        groups.append([s.payload for s in group])
        if len(groups) == 1:
            release.wait(10)
        for s in group:
            if s.payload == "bad":
                s.error = ValueError("bad request")
            else:
                s.result = s.payload.upper()

    gc: GroupCommit[str] = GroupCommit(run, max_size=100)
    results: dict[str, object] = {}

    def submit(name: str, stripes: frozenset[int] = frozenset()) -> None:
        try:
            results[name] = gc.submit(Submission(name, 1, stripes))
        except ValueError as exc:
            results[name] = exc

    first = threading.Thread(target=submit, args=("first",))
    first.start()
    _wait_until(lambda: len(groups) == 1)  # the first request leads and runs alone
    others = [threading.Thread(target=submit, args=(n, frozenset({i}) if n != "same" else frozenset({1})))
              for i, n in enumerate(["a", "b", "bad", "same"])]
    for t in others:
        t.start()
    _wait_until(lambda: len(gc._queue) == 4)
    release.set()
    for t in [first, *others]:
        t.join(10)
    assert groups[0] == ["first"]
    assert groups[1] == ["a", "b", "bad"]  # queued meanwhile: one group ...
    assert groups[2] == ["same"]  # ... except the one whose dedup stripe is taken
    assert results["a"] == "A" and results["same"] == "SAME"
    assert isinstance(results["bad"], ValueError)


def test_a_failing_group_fails_each_of_its_requests():
    def run(group):
        raise OSError("disk full")

    gc: GroupCommit[str] = GroupCommit(run, max_size=10)
    with pytest.raises(OSError):
        gc.submit(Submission("x", 1, frozenset()))
    # the committer is free again afterwards
    gc2: GroupCommit[str] = GroupCommit(lambda g: [setattr(s, "result", 1) for s in g], max_size=10)
    assert gc2.submit(Submission("y", 1, frozenset())) == 1


def test_concurrent_creates_commit_together_and_keep_their_own_errors(tmp_path):
    """Sixteen threads create at once through one service on SQLite: the one whose key is
    taken gets CONFLICT and stores nothing of its batch, every other request is stored whole."""
    store = SQLiteStore(str(tmp_path / "group.db"))
    store.open()
    try:
        service = MemoryService(store=store)
        assert service._creates is not None  # SQLite: one writer, so creates are grouped
        service.create("g", CellCreate(content={"text": "the taken name"}, identity={"owner_id": "g", "key": "taken"}))
        barrier = threading.Barrier(16)
        outcome: dict[int, object] = {}

        def create(i: int) -> None:
            reqs = [CellCreate(content={"text": f"fact {i}.{k}"}, identity={"owner_id": "g", "session_id": f"s{i % 3}"})
                    for k in range(1 + i % 4)]
            if i == 5:
                reqs.append(CellCreate(content={"text": "wants the name"}, identity={"owner_id": "g", "key": "taken"}))
            barrier.wait()
            try:
                outcome[i] = [c.id for c in service.create_many("g", reqs)]
            except Conflict as exc:
                outcome[i] = exc

        threads = [threading.Thread(target=create, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert isinstance(outcome[5], Conflict)
        stored = {c.content.text for c in service.export("g", owner_id="g")}
        assert not any(t.startswith("fact 5.") for t in stored)
        for i in range(16):
            if i != 5:
                assert len(outcome[i]) == 1 + i % 4  # type: ignore[arg-type]
                assert {f"fact {i}.{k}" for k in range(1 + i % 4)} <= stored
    finally:
        store.close()
