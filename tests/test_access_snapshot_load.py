"""The access snapshot loaded from the table at once (`AccessSnapshot.load`: grouped in SQL,
its values read in two halves on two connections side by side) holds, row for row, what the
same rows give one at a time (`row_state`, the form every logged change takes)."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

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
        loaded = store.access.load()
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


def readers_mismatches(store: SQLiteStore) -> list[tuple]:
    """Rows whose `readers` column (SQLite migration 13) is not, to the byte, what the body says."""
    return store._query("SELECT rowid, readers, json_extract(body, '$.access_policy.readable_by') FROM cells "
                        "WHERE readers IS NOT json_extract(body, '$.access_policy.readable_by')")


def assert_snapshot_is_the_table(store: SQLiteStore) -> None:
    """The snapshot the store keeps (patched by its commits), one loaded afresh and the rows one
    by one hold the same; the `readers` column is the body's readable_by on every row."""
    store.index_pending_windows()  # (new cells' windows, which the background pass may index meanwhile)
    assert readers_mismatches(store) == []
    one_by_one = AccessSnapshot(0)
    one_by_one.apply({row[0]: row_state(row[1:], {}) for row in store._query(f"SELECT {SNAPSHOT_COLUMNS} FROM {SNAPSHOT_FROM}")})
    kept = decoded(store.access.load())
    store.changes.foreign += 1  # load afresh
    assert kept == decoded(store.access.load()) == decoded(one_by_one)


def test_the_readers_column_follows_every_write_of_the_body(tmp_path):
    """Creates (one and a batch), an update of readable_by, a supersede, a delete, a purge and a
    rollback each leave `readers` equal to the body's readable_by, and the snapshot equal to SQL."""
    from ampkit.models import CellCreate as Create

    store = SQLiteStore(str(tmp_path / "readers.db"), warm_terms_min_cells=None)
    store.open()
    service = MemoryService(store=store, allow_clock_override=True)  # (the purge past its retention)
    try:
        store.access.load()  # kept in step from here by the commits below
        policy = {"readable_by": ["bob", "ev[[]1]", "équipe-*"]}
        a = service.create("alice", Create.model_validate({
            "content": {"text": "alice drinks tea"}, "identity": {"owner_id": "alice", "session_id": "s"},
            "access_policy": policy}))
        batch = service.create_many("alice", [Create.model_validate({
            "content": {"text": f"fact {i} about trains"}, "identity": {"owner_id": "alice", "session_id": "s"},
            "access_policy": {"readable_by": READERS[i % len(READERS)]}}) for i in range(12)])
        assert_snapshot_is_the_table(store)
        service.update("alice", a.id, CellPatch.model_validate({"access_policy": {"readable_by": ["carol"]}}))
        assert_snapshot_is_the_table(store)
        assert store._query("SELECT readers FROM cells WHERE id = ?", (a.id,)) == [('["carol"]',)]
        service.rollback("alice", a.id, to_version=1)  # the first version's readers again
        assert_snapshot_is_the_table(store)
        assert store._query("SELECT readers FROM cells WHERE id = ?", (a.id,)) == [('["bob","ev[[]1]","équipe-*"]',)]
        service.update("alice", a.id, CellPatch.model_validate({"access_policy": {"readable_by": ["carol"]}}))
        newer = service.create("alice", Create.model_validate({
            "content": {"text": "alice drinks green tea now"}, "identity": {"owner_id": "alice"},
            "access_policy": {"readable_by": ["dave"]}, "supersedes": a.id}))
        assert service.get("alice", a.id).lifecycle.superseded_by == newer.id
        assert_snapshot_is_the_table(store)
        service.update("alice", batch[0].id, CellPatch.model_validate({"lifecycle": {"status": "archived"}}))
        service.delete("alice", batch[0].id)
        later = datetime.now(timezone.utc) + timedelta(days=3650)
        service.purge("alice", [batch[0].id], as_of=later)
        assert store._query("SELECT COUNT(*) FROM cells WHERE id = ?", (batch[0].id,)) == [(0,)]
        assert_snapshot_is_the_table(store)
        rows = decoded(store.access.load())
        assert {r[8] for r in rows} >= {("carol",), ("dave",), ("bob", "carol"), ("analyst", "team-1")}
    finally:
        store.close()


def test_a_file_from_before_the_readers_column_is_filled_by_the_migration(tmp_path):
    """A file at migration 12 (no `readers` column) opened by this version: every row's column
    is taken from its body (NULL where the body has no readable_by), and the loaded snapshot
    holds what the rows say."""
    import sqlite3

    path = str(tmp_path / "old.db")
    store = SQLiteStore(path, warm_terms_min_cells=None)
    store.open()
    service = MemoryService(store=store)
    for i in range(40):
        service.create("alice", CellCreate.model_validate({
            "content": {"text": f"fact {i} about jazz"}, "identity": {"owner_id": "alice", "session_id": "s"},
            "access_policy": {"readable_by": READERS[i % len(READERS)], "public": i % 7 == 0}}))
    store.close()
    conn = sqlite3.connect(path)
    conn.executescript("""
        DROP TRIGGER cells_readers_ai; DROP TRIGGER cells_readers_au;
        ALTER TABLE cells DROP COLUMN readers;
        DELETE FROM schema_migrations WHERE version = 13;
        UPDATE cells SET body = json_remove(body, '$.access_policy.readable_by') WHERE rowid = 3;
    """)
    conn.close()
    store = SQLiteStore(path, warm_terms_min_cells=None)
    assert store.pending_migrations() == [(13, store.MIGRATIONS[-1][1])]
    store.open()
    try:
        assert store._query("SELECT readers FROM cells WHERE rowid = 3") == [(None,)]
        assert store._query("SELECT COUNT(*) FROM cells WHERE readers IS NOT NULL") == [(39,)]
        assert_snapshot_is_the_table(store)
        assert len({r[8] for r in decoded(store.access.load())}) >= 6
    finally:
        store.close()


def test_a_writer_that_does_not_know_the_column_cannot_leave_it_stale(tmp_path):
    """A process of an older version sharing the file writes the body alone: the triggers of
    migration 13 take `readers` from it (an insert without it; an update that narrows
    readable_by), so this process's snapshot, caught up from the change log, admits no reader
    the body no longer names."""
    import sqlite3

    from ampkit.models import Status
    from ampkit.store.base import CellFilter

    path = str(tmp_path / "shared.db")
    store = SQLiteStore(path, warm_terms_min_cells=None)
    store.open()
    service = MemoryService(store=store)
    try:
        cell = service.create("alice", CellCreate.model_validate({
            "content": {"text": "alice's plans"}, "identity": {"owner_id": "alice"},
            "access_policy": {"readable_by": ["bob", "carol"]}}))
        wide = CellFilter(reader="bob", statuses=[s.value for s in Status])
        store.index_pending_windows()
        assert len(store.access.load().admitted(wide)[0]) == 1
        old = sqlite3.connect(path)
        old.execute("UPDATE cells SET body = json_set(body, '$.access_policy.readable_by', json('[\"carol\"]')) "
                    "WHERE id = ?", (cell.id,))
        old.execute("INSERT INTO cells(id, owner_id, type, status, text, body) SELECT 'mem_' || 'X' || substr(id, 6), "
                    "owner_id, type, status, text || ' too', body FROM cells WHERE id = ?", (cell.id,))
        old.commit()
        old.close()
        assert readers_mismatches(store) == []
        assert store._query("SELECT DISTINCT readers FROM cells") == [('["carol"]',)]
        assert len(store.access.load().admitted(wide)[0]) == 0
        assert_snapshot_is_the_table(store)
    finally:
        store.close()


# ---------------------------------------------------------------- a snapshot saved at close


def fill(service: MemoryService, rng: random.Random, n: int, tag: str) -> list:
    """n cells of several owners, readers and types; some archived, some deleted; returns the
    ones left active."""
    cells = []
    for i in range(n):
        creator = rng.choice(AGENTS)
        cell = service.create(creator, CellCreate.model_validate({
            "type": rng.choice(["semantic", "episodic", "procedural"]),
            "content": {"text": f"{tag} fact {i} about {rng.choice(['tea', 'coffee', 'jazz', 'trains'])}"},
            "identity": {"owner_id": creator, "owner_type": "agent", "session_id": rng.choice([None, "s1", "s2"])},
            "access_policy": {"readable_by": rng.choice(READERS), "public": rng.random() < 0.2},
        }))
        if rng.random() < 0.2:
            service.update(creator, cell.id, CellPatch.model_validate({"lifecycle": {"status": "archived"}}))
            if rng.random() < 0.5:
                service.delete(creator, cell.id)
        else:
            cells.append(cell)
    return cells


def reopened(path: str) -> SQLiteStore:
    store = SQLiteStore(path, warm_terms_min_cells=None)
    store.open()
    return store


def assert_restart_loads_from(path: str, source: str) -> None:
    """A store opened on `path` takes its snapshot from `source` ("saved" or "table"), and the
    snapshot is the table's, row for row."""
    store = reopened(path)
    try:
        assert store.vector_index_state()["access_snapshot"] == "none"
        store.access.load()
        assert store.vector_index_state()["access_snapshot"] == source  # (/health says so)
        assert_snapshot_is_the_table(store)
    finally:
        store.close()


def test_a_snapshot_saved_at_close_is_brought_forward_by_every_later_write(tmp_path):
    """A clean close saves the snapshot beside the file; the next open reads it back (instead of
    scanning the table) and takes in every write made since by any process (here another
    store on the file, while this one was closed and while it is open): the same rows, row
    for row, as the table."""
    rng = random.Random(11)
    path = str(tmp_path / "saved.db")
    store = reopened(path)
    cells = fill(MemoryService(store=store), rng, 150, "first")
    store.access.load()
    store.close()
    assert (tmp_path / "saved.db.access-snapshot").is_file()

    other = reopened(path)  # another process meanwhile: creates, policy changes, supersedes, deletes
    service = MemoryService(store=other)
    fill(service, rng, 40, "meanwhile")
    for cell in rng.sample(cells[:-1], 10):
        owner = cell.identity.owner_id
        service.update(owner, cell.id, CellPatch.model_validate({"access_policy": {"readable_by": ["carol"], "public": False}}))
    target = cells[-1]
    service.create(target.identity.owner_id, CellCreate.model_validate({
        "content": {"text": "a newer fact"}, "identity": {"owner_id": target.identity.owner_id}, "supersedes": target.id}))
    other.close()

    store = reopened(path)
    other = reopened(path)
    try:
        store.access.load()
        assert store.access.source == "saved"
        assert_snapshot_is_the_table(store)
        fill(MemoryService(store=other), rng, 20, "while open")  # caught up as ever
        assert_snapshot_is_the_table(store)
    finally:
        other.close()
        store.close()


def test_a_saved_snapshot_that_cannot_be_trusted_is_not_used(tmp_path, monkeypatch):
    """Loaded from the table instead, whatever the file: a database put back from a backup and
    written since (so the log reaches past the saved entry, with other rows in it), more logged
    rows than SNAPSHOT_RESUME_MAX, a damaged file, another schema."""
    import shutil

    from ampkit.store import sqlite_access as sqlite_store

    rng = random.Random(12)
    path = str(tmp_path / "kept.db")
    store = reopened(path)
    fill(MemoryService(store=store), rng, 60, "first")
    store.close()
    shutil.copy(path, tmp_path / "backup.db")  # (closed: checkpointed, no -wal to copy)
    store = reopened(path)
    fill(MemoryService(store=store), rng, 30, "after the backup")
    store.access.load()
    store.close()
    saved = (tmp_path / "kept.db.access-snapshot").read_bytes()

    def restart_uses_the_table() -> None:
        assert_restart_loads_from(path, "table")
        (tmp_path / "kept.db.access-snapshot").write_bytes(saved)

    shutil.copy(tmp_path / "backup.db", path)  # the backup back, the newer snapshot beside it ...
    other = reopened(path)
    fill(MemoryService(store=other), rng, 60, "another history")  # ... and its log past the saved entry
    other.close()
    restart_uses_the_table()

    shutil.copy(tmp_path / "backup.db", path)
    store = reopened(path)
    fill(MemoryService(store=store), rng, 30, "after the backup")
    store.access.load()
    store.close()
    saved = (tmp_path / "kept.db.access-snapshot").read_bytes()
    other = reopened(path)
    fill(MemoryService(store=other), rng, 10, "a few")
    other.close()
    monkeypatch.setattr(sqlite_store, "SNAPSHOT_RESUME_MAX", 5)
    restart_uses_the_table()
    monkeypatch.undo()

    (tmp_path / "kept.db.access-snapshot").write_bytes(saved[: len(saved) // 2])
    restart_uses_the_table()

    snapshot, meta = AccessSnapshot.saved(str(tmp_path / "kept.db.access-snapshot"), 0)
    snapshot.save(str(tmp_path / "kept.db.access-snapshot"), {**meta, "schema": meta["schema"] - 1})
    saved = (tmp_path / "kept.db.access-snapshot").read_bytes()
    restart_uses_the_table()
    # and the same file with its own schema is used (the cases above failed for their reason)
    snapshot.save(str(tmp_path / "kept.db.access-snapshot"), meta)
    assert_restart_loads_from(path, "saved")

    # a row gone without a log entry (its trigger dropped by hand): the rows do not add up
    import sqlite3

    raw = sqlite3.connect(path)
    raw.execute("DROP TRIGGER change_log_cells_ad")
    raw.execute("DELETE FROM cells WHERE rowid = (SELECT rowid FROM cells ORDER BY rowid LIMIT 1 OFFSET 5)")
    raw.commit()
    raw.close()
    restart_uses_the_table()


def test_a_store_that_never_closes_saves_its_snapshot_while_commits_arrive(tmp_path):
    """The checkpoint thread saves the snapshot too (every SNAPSHOT_SAVE_INTERVAL_S while
    commits arrive; 0 here), so a restart after a crash (the first store is never closed: a
    second one opens the file, as a restarted process would) reads back a recent one and takes
    in what was written after it."""
    rng = random.Random(13)
    path = str(tmp_path / "crash.db")
    first = SQLiteStore(path, warm_terms_min_cells=None, snapshot_save_interval_s=0)
    first.open()
    try:
        service = MemoryService(store=first)
        fill(service, rng, 80, "before")
        first.access.load()
        fill(service, rng, 20, "saved")  # commits: the checkpoint thread saves the snapshot they patched
        first.index_pending_windows()  # (their windows' rows logged too, before the last save)
        assert first.wait_for_checkpoint(30)
        saved = AccessSnapshot.saved(str(tmp_path / "crash.db.access-snapshot"), 0)[1]
        assert saved["log_seq"] == first.changes.log_seq
        first.access.save_interval_s = None  # no more saves: the next rows come after the file
        fill(service, rng, 15, "after the save")
        assert_restart_loads_from(path, "saved")
    finally:
        first.close()


def test_a_backup_put_back_and_written_the_same_way_again_does_not_take_the_old_snapshot(tmp_path):
    """The snapshot's mark names log entries (sequence number, row id), not values: a file put
    back from a backup and then given the same creates in the same order (a re-run import),
    with other readers, logs the very same entries. So every open checks a saved snapshot
    against the log before it writes anything and deletes one that does not hold; the re-run
    import's own open does, and the next start loads from the table."""
    import shutil

    path = str(tmp_path / "rerun.db")

    def store_of() -> SQLiteStore:  # (windows rewritten in each write: the log's order fixed)
        store = SQLiteStore(path, warm_terms_min_cells=None, defer_windows=False)
        store.open()
        return store

    def run_import(readers: list[str]) -> SQLiteStore:
        store = store_of()
        service = MemoryService(store=store)
        for i in range(40):
            service.create("alice", CellCreate.model_validate({
                "content": {"text": f"imported fact {i}"}, "identity": {"owner_id": "alice", "session_id": f"s{i // 10}"},
                "access_policy": {"readable_by": readers}}))
        return store

    store = store_of()
    fill(MemoryService(store=store), random.Random(14), 30, "first")
    store.close()
    shutil.copy(path, tmp_path / "backup.db")
    store = run_import(["bob"])  # the first import: bob may read
    store.access.load()
    store.close()  # ... saved
    shutil.copy(tmp_path / "backup.db", path)  # put back; the import run again, for carol
    run_import(["carol"]).close()
    assert not (tmp_path / "rerun.db.access-snapshot").exists()
    store = store_of()
    try:
        store.access.load()
        assert store.vector_index_state()["access_snapshot"] == "table"
        assert_snapshot_is_the_table(store)
    finally:
        store.close()


@pytest.mark.parametrize("log_rows", [20_000, 4])
def test_an_admitted_set_asked_again_after_writes_is_the_rule_over_every_row(tmp_path, monkeypatch, log_rows):
    """A reader-wide filter's admitted rows, asked again after commits (this store's and another
    process's: creates, policy changes, archives, deletes, supersedes, cells that expire), are
    patched from the filter's last answer with the changed rows re-decided: the same rows and
    window lengths as SQL's filter over the table, every time, for readers by name, by glob,
    public, with and without expiry times, types, statuses and superseded cells. With a log
    of 4 changed rows, most changes since a filter's last answer are no longer logged: those
    answers are decided afresh."""
    from ampkit.store import _access_snapshot
    from ampkit.store.base import CellFilter

    monkeypatch.setattr(_access_snapshot, "PATCH_ROWS", log_rows)

    rng = random.Random(23)
    path = str(tmp_path / "patched.db")
    store, other = reopened(path), reopened(path)
    service, elsewhere = MemoryService(store=store), MemoryService(store=other)
    cells = fill(service, rng, 120, "first")
    base = datetime.now(timezone.utc)
    filters = [CellFilter(reader=reader, statuses=statuses, types=types, include_superseded=superseded)
               for reader in ["bob", "carol", "bot-2", "team-1", "nobody"]
               for statuses, types, superseded in ((("active",), None, False), (("active", "archived"), ["semantic"], True))]
    patched = []
    real = _access_snapshot.AccessSnapshot._patched

    def counted(self, *args):
        found = real(self, *args)
        patched.append(found is not None)
        return found

    monkeypatch.setattr(_access_snapshot.AccessSnapshot, "_patched", counted)
    try:
        for step in range(30):
            by, writer = (service, store) if step % 3 else (elsewhere, other)
            for i in range(rng.randrange(1, 4)):
                creator = rng.choice(AGENTS)
                body = {"content": {"text": f"step {step} note {i} about trains"}, "type": rng.choice(["semantic", "episodic"]),
                        "identity": {"owner_id": creator},
                        "access_policy": {"readable_by": rng.choice(READERS), "public": rng.random() < 0.1}}
                if rng.random() < 0.3:  # expires within the times the searches below are made at
                    body["lifecycle"] = {"expires_at": (base + timedelta(minutes=rng.randrange(1, 40))).isoformat()}
                cells.append(by.create(creator, CellCreate.model_validate(body)))
            cell = cells.pop(rng.randrange(len(cells)))  # (an active cell: each is changed once)
            owner = cell.identity.owner_id
            change = rng.randrange(4)
            if change == 0:
                cells.append(by.update(owner, cell.id, CellPatch.model_validate(
                    {"access_policy": {"readable_by": rng.choice(READERS)}})))
            elif change == 1:
                by.update(owner, cell.id, CellPatch.model_validate({"lifecycle": {"status": "archived"}}))
            elif change == 2:
                by.update(owner, cell.id, CellPatch.model_validate({"lifecycle": {"status": "archived"}}))
                by.delete(owner, cell.id)
            else:
                cells.append(by.create(owner, CellCreate.model_validate({
                    "content": {"text": f"newer than {cell.id}"}, "identity": {"owner_id": owner}, "supersedes": cell.id})))
            # the same time for a few steps, then later (past some expiries, or not)
            at = base + timedelta(minutes=step // 3 * 4)
            for flt in filters:
                for when in (None, at):
                    asked = replace(flt, not_expired_at=when)
                    admitted = store.access.entry(asked)[3]
                    expected = store.access.load_admitted(asked)
                    assert np.array_equal(admitted.rowids, expected.rowids), (step, asked)
                    assert np.array_equal(admitted.lengths, expected.lengths) and admitted.total == expected.total
    finally:
        other.close()
        store.close()
    if log_rows > 4:
        assert sum(patched) > 300 and not all(patched)  # patched mostly; decided afresh past an expiry
    else:
        assert sum(patched) > 20 and patched.count(False) > 300
