"""The access snapshot loaded from the table at once (`AccessSnapshot.load`: grouped in SQL,
its values read in two halves on two connections side by side) holds, row for row, what the
same rows give one at a time (`row_state`, the form every logged change takes)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import numpy as np

from ampkit.models import CellCreate, CellPatch
from ampkit.service import MemoryService
from ampkit.store._access_snapshot import SNAPSHOT_COLUMNS, SNAPSHOT_FROM, AccessSnapshot, row_state
from ampkit.store.sqlite import SQLiteStore

AGENTS = ["alice", "bob", "bot-1", "bot-2", "carol", "x*y"]
READERS = [[], ["bob"], ["bot-*"], ["bob", "carol"], ["carol", "bob"], ["*"], ["ev[[]1]", "a?"], ["team-1", "analyst"]]


def decoded(snapshot: AccessSnapshot) -> list[tuple]:
    """Every present row's values, with the interned codes turned back into what they stand for."""
    names = {code: value for value, code in snapshot._codes.items()}
    out = []
    for rowid in np.flatnonzero(snapshot.present[: snapshot.size]).tolist():
        def name(column: np.ndarray) -> object:
            return names.get(int(column[rowid]))
        expires = float(snapshot.expires[rowid])
        out.append((rowid, name(snapshot.owner), name(snapshot.creator), name(snapshot.type), name(snapshot.status),
                    bool(snapshot.public[rowid]), bool(snapshot.superseded[rowid]), None if np.isnan(expires) else expires,
                    snapshot.reader_sets[int(snapshot.reader_set[rowid])], int(snapshot.length[rowid])))
    return out


def test_a_loaded_snapshot_holds_what_its_rows_give_one_by_one(tmp_path):
    rng = random.Random(7)
    path = str(tmp_path / "snap.db")
    store = SQLiteStore(path)
    store.open()
    service = MemoryService(store=store)
    cells = []
    soon = datetime.now(timezone.utc) + timedelta(days=1)
    for i in range(240):
        creator = rng.choice(AGENTS)
        body = {
            "type": rng.choice(["semantic", "episodic", "procedural"]),
            "content": {"text": f"fact {i} about {rng.choice(['tea', 'coffee', 'jazz', 'trains'])}"},
            "identity": {"owner_id": rng.choice(AGENTS) if rng.random() < 0.3 else creator, "owner_type": "agent",
                         "session_id": rng.choice([None, "s1", "s2"])},
            "access_policy": {"readable_by": rng.choice(READERS), "public": rng.random() < 0.2},
        }
        if rng.random() < 0.2:
            body["lifecycle"] = {"expires_at": (soon + timedelta(hours=i)).isoformat()}
        if cells and rng.random() < 0.1:
            body["supersedes"] = rng.choice(cells).id
            body["identity"]["owner_id"] = creator = next(c for c in cells if c.id == body["supersedes"]).identity.owner_id
        try:
            cell = service.create(creator, CellCreate.model_validate(body))
        except Exception:  # noqa: BLE001  (a supersede another agent may not make: left out)
            continue
        cells.append(cell)
        if rng.random() < 0.25:
            service.update(cell.identity.owner_id, cell.id, CellPatch.model_validate({"lifecycle": {"status": "archived"}}))
            if rng.random() < 0.4:
                service.delete(cell.identity.owner_id, cell.id)
    store.close()

    store = SQLiteStore(path, warm_terms_min_cells=None)
    store.open()
    try:
        loaded = store._access_snapshot()
        one_by_one = AccessSnapshot(0)
        patterns: dict = {}
        one_by_one.apply({row[0]: row_state(row[1:], patterns)
                          for row in store._query(f"SELECT {SNAPSHOT_COLUMNS} FROM {SNAPSHOT_FROM}")})
        rows = decoded(loaded)
        assert rows == decoded(one_by_one)
        assert len(rows) > 200 and len({r[8] for r in rows}) > 5 and any(r[6] for r in rows) and any(r[7] for r in rows)
        assert {r[4] for r in rows} >= {"active", "archived", "deleted"} and any(r[5] for r in rows)
    finally:
        store.close()
