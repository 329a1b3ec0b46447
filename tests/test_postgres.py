"""PostgreSQL-specific behaviour (the shared contract is in test_store_contract.py): the dense
leg on pgvector, migrations and the lifecycle lock across processes, start-up and outage
errors, and `ampkit migrate` / `ampkit copy`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import httpx
import numpy as np
import pytest

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need the postgres extra")

from ampkit.models import CellCreate, CellPatch  # noqa: E402
from ampkit.service import MemoryService  # noqa: E402
from ampkit.store import CellFilter, StoredVector, store_from_url  # noqa: E402
from ampkit.store.postgres import MIGRATIONS, PostgresStore, split_url  # noqa: E402
from pg import EmbeddedPostgres, prune_pristines, scratch_dir  # noqa: E402
from support import TLS, run_cli  # noqa: E402

pytestmark = pytest.mark.postgres

AGENT = {"X-AMP-Agent-ID": "agent_a"}


def ampkit(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`ampkit migrate` / `copy` in this process (their code, output and exit codes); `serve`
    in a real process, whose start-up failure is what is tested."""
    if args[0] != "serve":
        return run_cli(*args)
    return subprocess.run([sys.executable, "-m", "ampkit.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def pg_store(pg_url):
    store = store_from_url(pg_url)
    store.open()
    yield store
    store.close()


def unit(rng: np.random.Generator, dim: int) -> np.ndarray:
    v = rng.standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


def test_initdb_clusters_of_other_builds_unused_for_hours_are_removed(tmp_path):
    """tests/pg.py keeps one initdb cluster per PostgreSQL build (each fresh venv is one);
    the others go once unused for three hours. The one in use stays, however old, and so do the
    recently used ones of other builds (another checkout's tests may be copying from it)."""
    import os
    import time

    day = 24 * 3600
    ours, stale, recent, half_made = (tmp_path / f"ampkit-pg-initdb-{name}" for name in ("1-2-u", "3-4-u", "5-6-u", "x7q2"))
    for path in (ours, stale, recent, half_made):
        (path / "base").mkdir(parents=True)
        (path / "PG_VERSION").write_text("17")
    (tmp_path / "other-file").write_text("not ours")
    for path in (ours, stale, half_made):
        os.utime(path, (time.time() - 2 * day, time.time() - 2 * day))
    assert sorted(prune_pristines(tmp_path, keep=ours)) == sorted([stale, half_made])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([ours.name, recent.name, "other-file"])


def test_url_options_are_ours_and_the_rest_goes_to_libpq():
    conninfo, options = split_url("postgres://u:pw@db.internal:5433/mem?sslmode=require&pool_max=20&pool_timeout=2.5")
    assert conninfo == "postgresql://u:pw@db.internal:5433/mem?sslmode=require"
    assert options == {"pool_max": 20, "pool_timeout": 2.5}
    assert PostgresStore("postgresql://u:pw@h/db").display_url == "postgresql://u:***@h/db"


@pytest.mark.parametrize("exact_max", [0, 5000])
def test_dense_leg_filters_inside_the_hnsw_scan(pg_store, monkeypatch, exact_max):
    """300 vectors, 6 readable by agent_x: a top-6 for agent_x is full, exact and in order,
    although the nearest neighbours overall all belong to someone else; by the graph (a
    reader's set above EXACT_ADMITTED_MAX: 0 here) or by ranking the 6 exactly (5,000)."""
    monkeypatch.setattr("ampkit.store.postgres.EXACT_ADMITTED_MAX", exact_max)
    service = MemoryService(store=pg_store)
    rng = np.random.default_rng(7)
    query = unit(rng, 32)
    mine, vectors = [], {}
    with pg_store.write() as tx:
        for i in range(300):
            owner = "agent_x" if i % 50 == 0 else "agent_y"
            # The others' vectors sit close to the query, agent_x's far away.
            noise = 0.3 if owner == "agent_y" else 3.0
            vec = query + noise * unit(rng, 32)
            vec = (vec / np.linalg.norm(vec)).astype(np.float32)
            cell = service._build(CellCreate.model_validate(
                {"content": {"text": f"fact {i}"}, "identity": {"owner_id": owner}}), owner, service.clock())
            tx.insert(cell, StoredVector("fake-32", vec))
            vectors[cell.id] = vec
            if owner == "agent_x":
                mine.append(cell.id)
    hits = pg_store.vector_candidates(query, "fake-32", CellFilter(reader="agent_x"), 6)
    expected = sorted(mine, key=lambda cid: -float(vectors[cid] @ query))
    assert [h.cell_id for h in hits] == expected
    assert all(abs(h.score - float(vectors[h.cell_id] @ query)) < 1e-4 for h in hits)
    # Even when the index scan gives up early (max_scan_tuples), the top-k is not short.
    with psycopg.connect(split_url(pg_store.conninfo)[0], autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{conn.info.dbname}\" SET hnsw.max_scan_tuples = 1")
    starved = PostgresStore(pg_store.conninfo)
    starved.open()
    try:
        with starved._connection() as conn, conn.transaction():
            starved.set_search_options(conn, 6)
            index_only = conn.execute(*starved.vector_query(query, "fake-32", CellFilter(reader="agent_x"), 6)).fetchall()
        assert len(index_only) < 6  # the index scan alone comes back short here...
        assert [h.cell_id for h in starved.vector_candidates(query, "fake-32", CellFilter(reader="agent_x"), 6)] == expected
    finally:
        starved.close()
    # Another model with another dimension lives beside it, with its own index.
    with pg_store.write() as tx:
        tx.update(pg_store.get(mine[0]), StoredVector("fake-8", unit(rng, 8)))
    assert [h.cell_id for h in pg_store.vector_candidates(unit(rng, 8), "fake-8", CellFilter(), 5)] == [mine[0]]
    # The plan walks the HNSW index (not a sequential scan with a sort).
    sql, params = pg_store.vector_query(query, "fake-32", CellFilter(reader="agent_x"), 6)
    with pg_store._connection() as conn, conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")  # 300 rows: make the planner show its index path
        pg_store.set_search_options(conn, 6)
        plan = "\n".join(r[0] for r in conn.execute(b"EXPLAIN " + sql.as_bytes(conn), params))
    assert "cell_vectors_hnsw_" in plan


def test_a_reader_who_may_read_few_cells_is_ranked_exactly_over_them(pg_store, monkeypatch):
    """A reader-wide dense search whose filter admits few rows (here 9 of 400) ranks exactly
    those (their rows from the wide keyword leg, in the search's snapshot) without walking the
    graph: the same as an exact scan of the table, after creates, a policy change, a delete
    and with an expiry time, and never a row the reader may not read."""
    from ampkit.store import postgres

    service = MemoryService(store=pg_store)
    rng = np.random.default_rng(11)
    query = unit(rng, 16)
    now = service.clock()

    def add(owner: str, readers: list[str], near: bool, expires=None):
        body = {"content": {"text": f"note {rng.integers(1 << 30)}"}, "identity": {"owner_id": owner},
                "access_policy": {"readable_by": readers}}
        if expires is not None:
            body["lifecycle"] = {"expires_at": expires.isoformat()}
        cell = service._build(CellCreate.model_validate(body), owner, now)
        vec = query + (0.2 if near else 2.0) * unit(rng, 16)
        with pg_store.write() as tx:
            tx.insert(cell, StoredVector("fake-16", (vec / np.linalg.norm(vec)).astype(np.float32)))
        return cell

    for i in range(390):  # the nearest vectors are someone else's
        add("agent_y", [], near=True)
    mine = [add("agent_x", [], near=False) for _ in range(5)]
    granted = [add("agent_y", ["agent_*"], near=False) for _ in range(3)]
    soon = add("agent_y", ["agent_x"], near=False, expires=now + timedelta(hours=1))

    def exact(flt: CellFilter) -> list[str]:
        with pg_store._connection() as conn, conn.transaction():
            return [cid for cid, _ in conn.execute(*pg_store.vector_query(query, "fake-16", flt, 20, exact=True))]

    def check(flt: CellFilter, n: int) -> None:
        with pg_store._connection() as conn, conn.transaction():
            admitted = pg_store._wide_admitted(conn, flt)
        assert admitted is not None and admitted.size == n <= postgres.EXACT_ADMITTED_MAX  # ranked exactly, not by the graph
        assert [h.cell_id for h in pg_store.vector_candidates(query, "fake-16", flt, 20)] == exact(flt)

    flt = CellFilter(reader="agent_x")
    check(flt, 9)
    assert set(exact(flt)) == {c.id for c in mine + granted + [soon]}
    check(replace(flt, not_expired_at=now + timedelta(hours=2)), 9)  # (the time is the SQL's)
    assert soon.id not in exact(replace(flt, not_expired_at=now + timedelta(hours=2)))
    newer = add("agent_x", [], near=False)  # a write since: in the next search
    check(flt, 10)
    assert newer.id in exact(flt)
    service.update("agent_y", granted[0].id, CellPatch.model_validate({"access_policy": {"readable_by": []}}))
    check(flt, 9)
    assert granted[0].id not in exact(flt)
    # A reader of more rows than EXACT_ADMITTED_MAX walks the graph as before.
    monkeypatch.setattr(postgres, "EXACT_ADMITTED_MAX", 100)
    with pg_store._connection() as conn, conn.transaction():
        assert pg_store._wide_admitted(conn, CellFilter(reader="agent_y")).size > postgres.EXACT_ADMITTED_MAX
    assert [h.cell_id for h in pg_store.vector_candidates(query, "fake-16", CellFilter(reader="agent_y"), 20)] == \
        exact(CellFilter(reader="agent_y"))


def test_an_exact_dense_ranking_breaks_ties_by_id(pg_store):
    """Cells with the same vector (the same text) tie; an exact ranking's top k among them is
    the k smallest ids, whatever order the rows lie in (here written largest id first), by
    the table scan and by the few-rows path alike."""
    service = MemoryService(store=pg_store)
    rng = np.random.default_rng(5)
    query = unit(rng, 8)
    same = query + 0.5 * unit(rng, 8)
    same = (same / np.linalg.norm(same)).astype(np.float32)
    cells = [service._build(CellCreate.model_validate({"content": {"text": f"twin {i}"}, "identity": {"owner_id": "agent_x"}}),
                            "agent_x", service.clock()) for i in range(8)]
    for cell in sorted(cells, key=lambda c: c.id, reverse=True):
        with pg_store.write() as tx:
            tx.insert(cell, StoredVector("fake-8", same))
    smallest = sorted(c.id for c in cells)[:3]
    with pg_store._connection() as conn, conn.transaction():
        by_table = [cid for cid, _ in conn.execute(*pg_store.vector_query(query, "fake-8", CellFilter(reader="agent_x"), 3, exact=True))]
    assert by_table == smallest
    assert [h.cell_id for h in pg_store.vector_candidates(query, "fake-8", CellFilter(reader="agent_x"), 3)] == smallest


def _canonical_rows_per_vector(store: PostgresStore) -> dict[tuple, int]:
    """For every distinct stored vector (model, dim, key): how many of its rows are canonical."""
    return {(m, d, k): n for m, d, k, n in store._query(
        "SELECT model, dim, vec_key, count(*) FILTER (WHERE canonical) FROM cell_vectors GROUP BY 1, 2, 3")}


def test_identical_vectors_share_one_graph_row_and_every_copy_is_found(pg_store, monkeypatch):
    """Copies of one vector (the same text in many cells) are one element of the HNSW graph
    (copies filled each other's neighbour lists and walks got stuck among them); a walk finds
    every copy the reader may read through it, and keeps finding them when the canonical
    copy is purged or gets another vector. Exactly one canonical row per distinct vector,
    always."""
    from ampkit.store import postgres

    monkeypatch.setattr(postgres, "EXACT_ADMITTED_MAX", 0)  # walk the graph, whatever the filter's size
    walks: list[bool] = []
    vector_query = PostgresStore.vector_query
    monkeypatch.setattr(PostgresStore, "vector_query", lambda self, *a, **kw: (
        walks.append(bool(kw.get("exact")) or kw.get("among") is not None), vector_query(self, *a, **kw))[1])
    service = MemoryService(store=pg_store)
    rng = np.random.default_rng(3)
    query = unit(rng, 16)
    same = query + 0.1 * unit(rng, 16)
    same = (same / np.linalg.norm(same)).astype(np.float32)

    def add(owner: str, vec: np.ndarray, readers=()) -> str:
        cell = service._build(CellCreate.model_validate({"content": {"text": f"note {rng.integers(1 << 30)}"},
                                                         "identity": {"owner_id": owner},
                                                         "access_policy": {"readable_by": list(readers)}}),
                              owner, service.clock())
        with pg_store.write() as tx:
            tx.insert(cell, StoredVector("fake-16", vec))
        return cell.id

    for i in range(150):  # distinct vectors, none near the query
        v = unit(rng, 16) - query
        add(f"other-{i}", (v / np.linalg.norm(v)).astype(np.float32))
    twins = [add(f"owner-{i}", same, readers=["agent_x"] if i % 3 == 0 else []) for i in range(24)]
    readable = [t for i, t in enumerate(twins) if i % 3 == 0]
    counts = _canonical_rows_per_vector(pg_store)
    assert len(counts) == 151 and set(counts.values()) == {1}
    assert pg_store._query("SELECT count(*) FROM cell_vectors WHERE canonical") == [(151,)]

    def found(k: int) -> list[str]:
        walks.clear()
        hits = pg_store.vector_candidates(query, "fake-16", CellFilter(reader="agent_x"), k)
        assert walks == [False], walks  # the graph's walk answered, with k rows: no exact fallback
        return [h.cell_id for h in hits]

    assert found(8) == sorted(readable)  # every copy (8), ties by id
    canonical = pg_store._query("SELECT cell_id FROM cell_vectors WHERE vec_key = "
                                "(SELECT vec_key FROM cell_vectors WHERE cell_id = %s) AND canonical", (twins[0],))[0][0]
    assert canonical == min(twins)  # the first copy written (smallest id) holds the graph's element
    with pg_store.write() as tx:  # the canonical copy purged: another takes over
        tx.purge(canonical)
    assert set(_canonical_rows_per_vector(pg_store).values()) == {1}
    assert found(7) == sorted(t for t in readable if t != canonical)
    # The new canonical copy gets another vector (a text edit): the rest keep theirs, and it
    # is found by its new one.
    moved = pg_store._query("SELECT cell_id FROM cell_vectors WHERE canonical AND vec_key = "
                            "(SELECT vec_key FROM cell_vectors WHERE cell_id = %s)", (twins[1],))[0][0]
    elsewhere = unit(rng, 16)
    with pg_store.write() as tx:
        tx.set_vector(moved, StoredVector("fake-16", elsewhere))
    counts = _canonical_rows_per_vector(pg_store)
    assert len(counts) == 152 and set(counts.values()) == {1}
    rest = sorted(t for t in readable if t not in (canonical, moved))
    assert found(len(rest)) == rest
    hits = pg_store.vector_candidates(elsewhere, "fake-16", CellFilter(reader=pg_store.get(moved).identity.owner_id), 1)
    assert [h.cell_id for h in hits] == [moved]
    # The graph's plan: the HNSW index over canonical rows, then each one's copies.
    sql, params = pg_store.vector_query(query, "fake-16", CellFilter(reader="agent_x"), 8)
    with pg_store._connection() as conn, conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        pg_store.set_search_options(conn, 8)
        plan = "\n".join(r[0] for r in conn.execute(b"EXPLAIN " + sql.as_bytes(conn), params))
    assert "cell_vectors_hnsw_" in plan and "cell_vectors_twins" in plan, plan


def _latin_and_cjk_vectors(pg_store: PostgresStore, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """40 cells whose 384-dimension vectors end in 128 zeros (as the default model's Latin
    text), 3 of them one vector (one text in three cells), and 12 that use every component
    (its CJK text under `static`), for agent_x, agent_y or both; {cell id: vector}."""
    service = MemoryService(store=pg_store)
    vectors = {}
    twin = np.concatenate([unit(rng, 256), np.zeros(128, np.float32)])
    for i in range(52):
        vec = twin if i < 3 else np.concatenate([unit(rng, 256), np.zeros(128, np.float32)]) if i < 40 else unit(rng, 384)
        owner = "agent_x" if i % 2 else "agent_y"
        cell = service._build(CellCreate.model_validate(
            {"content": {"text": f"fact {i}"}, "identity": {"owner_id": owner},
             "access_policy": {"readable_by": ["agent_x"] if i % 3 == 0 else []}}), owner, service.clock())
        with pg_store.write() as tx:
            tx.insert(cell, StoredVector("fake-384", (vec / np.linalg.norm(vec)).astype(np.float32)))
        vectors[cell.id] = vec / np.linalg.norm(vec)
    return vectors


def _check_dense_rankings(pg_store: PostgresStore, vectors: dict[str, np.ndarray], rng: np.random.Generator) -> None:
    """Every path of the dense leg (the walk of both widths' graphs, the exact scan, the few
    rows of a reader-wide filter) ranks the cells a reader may read as the whole vectors'
    cosines do, for a query with its last block zero and for one without."""
    from ampkit.store import postgres

    readable = {cid for cid, cell in ((c, pg_store.get(c)) for c in vectors)
                if cell.identity.owner_id == "agent_x" or "agent_x" in cell.access_policy.readable_by}
    latin_query = np.concatenate([unit(rng, 256), np.zeros(128, np.float32)])
    for query in (latin_query, unit(rng, 384)):
        expected = sorted(readable, key=lambda cid: (-round(float(vectors[cid] @ query), 5), cid))[:12]
        for exact_max in (postgres.EXACT_ADMITTED_MAX, 0):  # the few-rows path, then the walks
            postgres.EXACT_ADMITTED_MAX = exact_max
            hits = pg_store.vector_candidates(query, "fake-384", CellFilter(reader="agent_x"), 12)
            assert [h.cell_id for h in hits] == expected
            assert all(abs(h.score - float(vectors[h.cell_id] @ query)) < 1e-4 for h in hits)
        with pg_store._connection() as conn, conn.transaction():
            by_table = [cid for cid, _ in conn.execute(*pg_store.vector_query(query, "fake-384", CellFilter(reader="agent_x"), 12, exact=True))]
        assert by_table == expected


def test_vectors_are_stored_without_their_last_block_of_zeros_and_ranked_whole(pg_store, monkeypatch):
    """A vector whose last 128 components are zero (the default model's, for Latin text) is
    stored without them; one model's vectors then have two widths, and every dense path ranks
    both by the whole vectors' cosine. Each width has its graph, and a walk goes through both."""
    from ampkit.store import postgres

    monkeypatch.setattr(postgres, "EXACT_ADMITTED_MAX", postgres.EXACT_ADMITTED_MAX)  # (restored after)
    rng = np.random.default_rng(17)
    vectors = _latin_and_cjk_vectors(pg_store, rng)
    assert dict(pg_store._query("SELECT dim, count(*) FROM cell_vectors GROUP BY dim")) == {256: 40, 384: 12}
    assert pg_store._query("SELECT count(*) FROM cell_vectors WHERE canonical") == [(50,)]  # the twins: one row
    _check_dense_rankings(pg_store, vectors, rng)
    sql, params = pg_store.vector_query(unit(rng, 384), "fake-384", CellFilter(reader="agent_x"), 8)
    with pg_store._connection() as conn, conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        pg_store.set_search_options(conn, 8)
        plan = "\n".join(r[0] for r in conn.execute(b"EXPLAIN " + sql.as_bytes(conn), params))
    assert {postgres.vector_index_name("fake-384", w) for w in (256, 384)} <= set(plan.replace('"', " ").split()), plan


def test_migration_17_takes_the_block_of_zeros_off_stored_vectors(pg_store, monkeypatch):
    """A version-16 database (every vector whole, one graph per model) is narrowed: the
    vectors ending in 128 zeros lose them, the rest stay, each width gets its graph, copies of
    one vector keep one canonical row, and every ranking is the same."""
    from psycopg import sql

    from ampkit.store import postgres

    monkeypatch.setattr(postgres, "EXACT_ADMITTED_MAX", postgres.EXACT_ADMITTED_MAX)
    rng = np.random.default_rng(23)
    vectors = _latin_and_cjk_vectors(pg_store, rng)
    pg_store.close()
    with psycopg.connect(pg_store.conninfo, autocommit=True) as conn:  # back to version 16
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(postgres.vector_index_name("fake-384", 256))))
        conn.execute("UPDATE cell_vectors SET embedding = (embedding::real[] || array_fill(0::real, ARRAY[128]))::vector, "
                     "dim = 384 WHERE dim = 256")
        conn.execute("DELETE FROM schema_migrations WHERE version = 17")
        assert dict(conn.execute("SELECT dim, count(*) FROM cell_vectors GROUP BY dim").fetchall()) == {384: 52}
    store = PostgresStore(pg_store.conninfo)
    store.open()
    try:
        assert store.schema_version() == MIGRATIONS[-1][0]
        assert dict(store._query("SELECT dim, count(*) FROM cell_vectors GROUP BY dim")) == {256: 40, 384: 12}
        assert set(_canonical_rows_per_vector(store).values()) == {1} and len(_canonical_rows_per_vector(store)) == 50
        graphs = {name for (name,) in store._query("SELECT indexname FROM pg_indexes WHERE indexname LIKE 'cell_vectors_hnsw_%%'")}
        assert graphs == {postgres.vector_index_name("fake-384", w) for w in (256, 384)}
        _check_dense_rankings(store, vectors, rng)
    finally:
        store.close()


def test_a_server_walks_the_graph_of_a_width_another_server_made(pg_store, monkeypatch):
    """A width's graph is made with its first vector; a server that has not seen it yet looks
    for it again at most every GRAPH_LOOK_SECONDS and then walks it too. Until then its walks
    miss that width's rows (its exact rankings never do)."""
    from ampkit.store import postgres

    monkeypatch.setattr(postgres, "EXACT_ADMITTED_MAX", 0)  # walk, whatever the filter's size
    monkeypatch.setattr(postgres, "GRAPH_LOOK_SECONDS", 3600.0)
    service = MemoryService(store=pg_store)
    rng = np.random.default_rng(29)
    query = np.concatenate([unit(rng, 256), np.zeros(128, np.float32)])

    def add(store: PostgresStore, vec: np.ndarray) -> str:
        cell = service._build(CellCreate.model_validate({"content": {"text": f"n {rng.integers(1 << 30)}"},
                                                         "identity": {"owner_id": "agent_x"}}), "agent_x", service.clock())
        with store.write() as tx:
            tx.insert(cell, StoredVector("fake-384", (vec / np.linalg.norm(vec)).astype(np.float32)))
        return cell.id

    for _ in range(10):
        add(pg_store, np.concatenate([unit(rng, 256) - query[:256], np.zeros(128, np.float32)]))
    flt = CellFilter(reader="agent_x")
    assert len(pg_store.vector_candidates(query, "fake-384", flt, 3)) == 3
    with pg_store._connection() as conn:
        assert pg_store._graph_widths(conn, "fake-384", 384) == [256]
    other = PostgresStore(pg_store.conninfo)  # another server writes the first whole vector
    other.open()
    try:
        nearest = add(other, np.concatenate([query[:256], 0.2 * unit(rng, 128)]))
    finally:
        other.close()
    assert nearest not in [h.cell_id for h in pg_store.vector_candidates(query, "fake-384", flt, 3)]
    monkeypatch.setattr(postgres, "GRAPH_LOOK_SECONDS", 0.0)
    assert pg_store.vector_candidates(query, "fake-384", flt, 3)[0].cell_id == nearest
    with pg_store._connection() as conn:
        assert pg_store._graph_widths(conn, "fake-384", 384) == [256, 384]


def test_writers_of_one_new_vector_at_once_leave_it_exactly_one_canonical_row(pg_store):
    """Four writers (four stores, as four servers) create and purge copies of the same new
    vectors at the same moment: every vector ends with exactly one canonical row, none with
    none (a walk could not reach its copies) or two (its copies would come back twice)."""
    stores = [PostgresStore(pg_store.conninfo) for _ in range(4)]
    for store in stores:
        store.open()
    service = MemoryService(store=pg_store)
    rng = np.random.default_rng(9)
    shared = [unit(rng, 8) for _ in range(30)]
    errors: list[BaseException] = []
    seen: list[int] = []  # canonical rows of the round's vector after each simultaneous step
    step = threading.Barrier(4, timeout=30)

    def canonical_rows(vec: np.ndarray) -> int:
        return pg_store._query("SELECT count(*) FROM cell_vectors WHERE canonical AND vec_key = "
                               "md5(%s::vector::text)::uuid", (vec.tolist(),))[0][0]

    def writer(w: int) -> None:
        try:
            for round_, vec in enumerate(shared):
                ids = []
                for j in range(2):
                    cell = service._build(CellCreate.model_validate(
                        {"content": {"text": f"w{w} r{round_} {j}"}, "identity": {"owner_id": f"w{w}"}}), f"w{w}", service.clock())
                    step.wait()  # the four copies' transactions at the same moment
                    with stores[w].write() as tx:
                        tx.insert(cell, StoredVector("fake-8", vec))
                    ids.append(cell.id)
                    if step.wait() == 0:
                        seen.append(canonical_rows(vec))
                with stores[w].write() as tx:
                    tx.purge(ids[(w + round_) % 2])
                if step.wait() == 0:
                    seen.append(canonical_rows(vec))
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)
            step.abort()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for store in stores:
        store.close()
    assert not errors, errors
    counts = _canonical_rows_per_vector(pg_store)
    assert seen == [1] * (30 * 3)
    assert len(counts) == 30 and set(counts.values()) == {1}
    assert pg_store._query("SELECT count(*) FROM cell_vectors") == [(30 * 4,)]


def test_approximate_search_off_ranks_exactly_without_the_graph(pg_url):
    """`approximate_search` off (the setting, or `approximate=off` in the URL): the dense leg
    orders by an expression no index has, so it never walks the HNSW graph (which holds the
    vectors of cells the caller cannot read), and /health says so."""
    from ampkit.bootstrap import store_from_settings
    from ampkit.config import Settings

    assert split_url(pg_url + ("&" if "?" in pg_url else "?") + "approximate=off")[1]["approximate"] is False
    store = store_from_settings(Settings(store=pg_url, approximate_search=False))
    assert isinstance(store, PostgresStore) and store.approximate is False
    store.open()
    try:
        service = MemoryService(store=store)
        rng = np.random.default_rng(11)
        query, vectors = unit(rng, 16), {}
        with store.write() as tx:
            for i in range(200):
                owner = "agent_x" if i % 4 == 0 else "agent_y"
                vec = query + (0.4 if owner == "agent_y" else 1.5) * unit(rng, 16)
                vec = (vec / np.linalg.norm(vec)).astype(np.float32)
                cell = service._build(CellCreate.model_validate(
                    {"content": {"text": f"fact {i}"}, "identity": {"owner_id": owner}}), owner, service.clock())
                tx.insert(cell, StoredVector("fake-16", vec))
                vectors[cell.id] = (owner, vec)
        for reader in ("agent_x", "agent_y"):
            readable = [cid for cid, (owner, _) in vectors.items() if owner == reader]
            expected = sorted(readable, key=lambda cid: -float(vectors[cid][1] @ query))[:10]
            hits = store.vector_candidates(query, "fake-16", CellFilter(reader=reader), 10)
            assert [h.cell_id for h in hits] == expected
        assert store.vector_index_state()["approximate"] == "off"
    finally:
        store.close()


def test_search_through_the_service_uses_both_legs(pg_store):
    class Letters:
        """A fake embedder: letter counts, so 'tea' is near 'teas' and far from 'rock'."""
        name, dim = "letters", 26

        def embed(self, texts):
            out = np.zeros((len(texts), 26), dtype=np.float32)
            for i, t in enumerate(texts):
                for ch in t.lower():
                    if "a" <= ch <= "z":
                        out[i, ord(ch) - 97] += 1
            return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    from ampkit.models import SearchRequest
    from ampkit.retrieval import Retriever

    service = MemoryService(store=pg_store, retriever=Retriever(embedder=Letters()))
    tea = service.create("agent_a", CellCreate.model_validate({"content": {"text": "green tea"}, "identity": {"owner_id": "u"}}))
    service.create("agent_a", CellCreate.model_validate({"content": {"text": "rock music"}, "identity": {"owner_id": "u"}}))
    result = service.search("agent_a", SearchRequest(query="tea", explain=True))
    assert result.results[0].id == tea.id
    assert {"keyword", "dense"} <= set(result.results[0].explain)


def test_reindex_fills_the_dense_leg_once(pg_store):
    """`ampkit reindex` on PostgreSQL: cells written without an embedder get vectors; a second
    pass finds nothing left to do (vector_models reports the model per cell)."""
    from ampkit.embeddings import reindex
    from ampkit.retrieval import Retriever

    class Hashed:
        name, dim = "hashed-16", 16

        def embed(self, texts):
            rng = [np.random.default_rng(abs(hash(t)) % 2**32) for t in texts]
            return np.stack([unit(r, 16) for r in rng])

    service = MemoryService(store=pg_store)
    ids = [service.create("agent_a", CellCreate.model_validate(
        {"content": {"text": f"note {i}"}, "identity": {"owner_id": "u"}})).id for i in range(5)]
    retriever = Retriever(embedder=Hashed())
    assert reindex(pg_store, retriever) == 5
    assert pg_store.vector_models(ids) == {cid: "hashed-16" for cid in ids}
    assert reindex(pg_store, retriever) == 0
    query = Hashed().embed(["note 3"])[0]
    assert pg_store.vector_candidates(query, "hashed-16", CellFilter(), 1)[0].cell_id == ids[3]


def test_servers_starting_together_apply_each_migration_once(pg_url):
    stores = [PostgresStore(pg_url) for _ in range(4)]
    errors: list[BaseException] = []

    def open_store(store):
        try:
            store.open()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=open_store, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors
        versions = [r[0] for r in stores[0]._query("SELECT version FROM schema_migrations ORDER BY version")]
        assert versions == [m[0] for m in MIGRATIONS]
        assert stores[1].migrate() == []
    finally:
        for s in stores:
            s.close()


def test_migration_11_digests_existing_texts_so_dedup_finds_them(pg_url, monkeypatch):
    """As SQLite's migration 9 (test_dedup_playbooks): a database written before the
    normalised-text digest existed gets it filled in (in batches, here of 2 rows: the last one
    short), so a restated memory written before the upgrade is still recognised, in any case
    and spacing, and the lookup is the index's."""
    from functools import partial

    from ampkit.bootstrap import build_service, load_settings
    from ampkit.store._pg_schema import MIGRATION_STEPS, digest_texts
    from ampkit.textindex import text_key

    service = build_service(load_settings(store=pg_url, embedder="none"))
    service.store.open()
    first = service.create("dd-old", CellCreate.model_validate(
        {"content": {"text": "Prefers  window seats."}, "identity": {"owner_id": "dd-old"}}))
    for i in range(4):
        service.create("dd-old", CellCreate.model_validate({"content": {"text": f"note {i}"}, "identity": {"owner_id": "dd-old"}}))
    service.store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # back to a version-10 database: no digest column
        conn.execute("ALTER TABLE cells DROP COLUMN text_key")  # (its index goes with it)
        conn.execute("DELETE FROM schema_migrations WHERE version = 11")
    monkeypatch.setitem(MIGRATION_STEPS, 11, partial(digest_texts, batch_size=2))
    service = build_service(load_settings(store=pg_url, embedder="none"))
    service.store.open()
    try:
        assert service.store.schema_version() == MIGRATIONS[-1][0]
        rows = service.store._query("SELECT text, text_key FROM cells")
        assert len(rows) == 5 and all(key == text_key(text) for text, key in rows)
        again, kind = service.create_many_detailed(
            "dd-old", [CellCreate.model_validate({"content": {"text": "prefers window SEATS"}, "identity": {"owner_id": "dd-old"}})])[0]
        assert (again.id, kind) == (first.id, "exact")
        with service.store._connection() as conn, conn.transaction():
            conn.execute("SET LOCAL enable_seqscan = off")  # (5 rows: the planner would scan them)
            plan = "\n".join(r[0] for r in conn.execute(
                "EXPLAIN SELECT id FROM cells WHERE owner_id = 'dd-old' AND text_key = %s", (text_key("note 1"),)))
        assert "cells_text_key" in plan
    finally:
        service.store.close()


def test_migration_12_logs_the_changed_keyword_rows_so_wide_arrays_are_patched(pg_url):
    """A version-11 database gains the per-row change log: afterwards every write that changes
    a keyword window or a filtered column says which rows (`search_change_rows`), and a
    server's wide keyword arrays are patched with them, not read afresh."""
    from ampkit.store.base import CellFilter

    store = PostgresStore(pg_url)
    store.open()
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # back to version 11
        conn.execute("DROP TABLE search_change_rows")
        conn.execute("DROP TRIGGER cell_search_row_changed ON cell_search")
        conn.execute("DROP TRIGGER cell_search_truncated ON cell_search")
        conn.execute("DROP TRIGGER cells_filter_row_changed ON cells")
        conn.execute("DROP FUNCTION ampkit_search_row_changed()")
        conn.execute("DELETE FROM schema_migrations WHERE version = 12")
    store = PostgresStore(pg_url)
    store.open()
    try:
        assert store.schema_version() == MIGRATIONS[-1][0]
        service = MemoryService(store=store)
        flt = CellFilter(reader="team-a")
        first = service.create("u1", CellCreate.model_validate(
            {"content": {"text": "likes green tea"}, "identity": {"owner_id": "u1", "session_id": "s"},
             "access_policy": {"readable_by": ["team-a"]}}))
        store.keyword_candidates("green tea", flt, 10)
        assert store.wide_keywords.wait_until_warm()
        generations = store.wide_keywords.generations
        second = service.create("u1", CellCreate.model_validate(
            {"content": {"text": "green tea, no sugar"}, "identity": {"owner_id": "u1", "session_id": "s"},
             "access_policy": {"readable_by": ["team-a"]}}))
        logged = {r[0] for r in store._query("SELECT seq FROM search_change_rows")}
        seqs = dict(store._query("SELECT id, seq FROM cells"))
        assert {seqs[first.id], seqs[second.id]} <= logged  # the new row, and its neighbour's window
        found = [c.cell_id for c in store.keyword_candidates("green tea", flt, 10)]
        assert set(found) == {first.id, second.id}
        assert (store.wide_keywords.generations, store.wide_keywords.patches) == (generations, 1)
    finally:
        store.close()


def test_a_wide_filters_admitted_rows_are_read_from_the_narrow_indexes_alone(pg_url):
    """Migration 13: every column a reader-wide filter reads (the read rule, status, type,
    supersession, expiry) and the window length are in two indexes, so a new reader's rows
    come from index-only scans, not from the tables' wide rows (the cell's JSON, the tsvector)."""
    from psycopg import sql

    from ampkit.store._pg_keyword import _ADMITTED
    from ampkit.store.base import CellFilter
    from ampkit.store.sql import POSTGRES, compile_filter

    store = PostgresStore(pg_url)
    store.open()
    try:
        service = MemoryService(store=store)
        for i in range(30):
            service.create(f"u{i % 3}", CellCreate.model_validate(
                {"content": {"text": f"note {i}"}, "identity": {"owner_id": f"u{i % 3}", "session_id": "s"},
                 "access_policy": {"readable_by": ["team-*"]}}))
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE cells, cell_search")  # (index-only scans need the visibility map)
            conn.execute("SET enable_seqscan = off")  # (30 rows: the planner would scan the tables)
            conn.execute("SET enable_bitmapscan = off")
            for flt in (CellFilter(reader="team-a"), CellFilter(reader="team-a", types=["episodic"]), CellFilter()):
                where, params = compile_filter(flt, POSTGRES)
                plan = "\n".join(r[0] for r in conn.execute(
                    sql.SQL("EXPLAIN ") + sql.SQL(_ADMITTED).format(where=sql.SQL(where)), params))
                assert "Index Only Scan using cells_read_rule" in plan, plan
                assert "Index Only Scan using cell_search_seq_len" in plan, plan
    finally:
        store.close()


def test_migration_14_splits_readers_into_literals_and_globs(pg_url):
    """A version-13 database gains `reader_literals` and `reader_globs`, derived by the database
    from `reader_patterns`: the read rule then compares a reader named by a literal by equality
    and grants what `can_read` does, and what the rule of version 13 (`~ ANY(reader_patterns)`,
    a server of the previous version still serving) grants; the read-rule index holds the new
    columns (index-only scans still) and only live rows; whoever writes `reader_patterns` (here
    plain SQL, as a server of the previous version writes it) keeps both right, and the wide
    keyword arrays follow (the filter triggers watch `reader_patterns`)."""
    import re

    from psycopg import sql

    from ampkit.access import can_read
    from ampkit.store._pg_keyword import _ADMITTED
    from ampkit.store.sql import POSTGRES, compile_filter
    from ampkit.store.sql.dialects import READER_LITERAL

    grants = [["a.b", "team-*"], ["x[*]y", "ev[1]"], [], ["alice"], ["bot-?", "[aa]"], ["a+b", "alice", "a.b"]]
    store = PostgresStore(pg_url)
    store.open()
    service = MemoryService(store=store)
    # (Cell 3 has no session, so no keyword window whose rewrite would log its policy change.)
    cells = [service.create("u1", CellCreate.model_validate(
        {"content": {"text": f"note {i}"}, "identity": {"owner_id": "u1", "session_id": None if i == 3 else "s"},
         "access_policy": {"readable_by": grant}})) for i, grant in enumerate(grants)]
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # back to version 13
        conn.execute("ALTER TABLE cells DROP COLUMN reader_literals, DROP COLUMN reader_globs")  # (and the index)
        conn.execute("DROP FUNCTION ampkit_reader_literals(TEXT[]), ampkit_reader_globs(TEXT[])")
        conn.execute("CREATE INDEX cells_read_rule ON cells (status, seq) "
                     "INCLUDE (owner_id, created_by, public, reader_patterns, superseded_by, expires_at, type)")
        conn.execute("DELETE FROM schema_migrations WHERE version = 14")
    store = PostgresStore(pg_url)
    store.open()
    try:
        assert store.schema_version() == MIGRATIONS[-1][0]
        assert store._query("SELECT version FROM schema_migrations WHERE version = 14") == [(14,)]
        rows = {cid: (patterns, literals, globs) for cid, patterns, literals, globs in
                store._query("SELECT id, reader_patterns, reader_literals, reader_globs FROM cells")}
        for cell in cells:
            patterns, literals, globs = rows[cell.id]
            assert patterns == sorted({POSTGRES.reader_pattern(p) for p in cell.access_policy.readable_by})
            assert literals == [p for p in patterns if re.fullmatch(READER_LITERAL, p)]
            assert globs == [p for p in patterns if p not in literals]
        assert rows[cells[5].id][1:] == (sorted(POSTGRES.reader_literal(a) for a in ("a+b", "alice", "a.b")), [])
        assert rows[cells[1].id][1:] == ([POSTGRES.reader_literal("x*y")], [POSTGRES.reader_pattern("ev[1]")])  # (a set: "ev1")
        assert rows[cells[4].id][1:] == ([], sorted(POSTGRES.reader_pattern(p) for p in ("bot-?", "[aa]")))
        version_13 = sql.SQL("SELECT id FROM cells c WHERE status = 'active' AND (c.owner_id = %s OR c.created_by = %s "
                             "OR c.public OR %s ~ ANY(c.reader_patterns))")
        for agent in ("a.b", "axb", "a+b", "aab", "x*y", "xzy", "ev[1]", "ev1", "alice", "bot-1", "a", "team-x", "u2"):
            flt = CellFilter(reader=agent, statuses=["active"])
            readable = {c.id for c in cells if can_read(c, agent)}
            assert {c.id for c in store.list(flt, 10)} == readable, agent
            assert {r[0] for r in store._query(version_13, (agent,) * 3)} == readable, agent
        index = store._query("SELECT indexdef FROM pg_indexes WHERE indexname = 'cells_read_rule'")[0][0]
        assert "reader_literals" in index and "reader_globs" in index
        # The table was rewritten, so its build saw no replaced row version: one entry a cell.
        assert store._query("SELECT reltuples FROM pg_class WHERE relname = 'cells_read_rule'") == [(len(cells),)]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE cells, cell_search")
            conn.execute("SET enable_seqscan = off")
            conn.execute("SET enable_bitmapscan = off")
            where, params = compile_filter(CellFilter(reader="alice"), POSTGRES)
            plan = "\n".join(r[0] for r in conn.execute(
                sql.SQL("EXPLAIN ") + sql.SQL(_ADMITTED).format(where=sql.SQL(where)), params))
            assert "Index Only Scan using cells_read_rule" in plan, plan
        flt = CellFilter(reader="alice")
        assert {c.cell_id for c in store.keyword_candidates("note", flt, 10)} == {cells[3].id, cells[5].id}
        assert store.wide_keywords.wait_until_warm()
        assert {c.cell_id for c in store.keyword_candidates("note", flt, 10)} == {cells[3].id, cells[5].id}
        with psycopg.connect(pg_url, autocommit=True) as conn:  # alice -> bob, as version 13's store writes it
            body = cells[3].model_copy(update={"access_policy": cells[3].access_policy.model_copy(
                update={"readable_by": ["bob"]})})
            from ampkit.store.postgres import cell_to_row

            row = cell_to_row(body)
            conn.execute("UPDATE cells SET body = %s, reader_patterns = %s WHERE id = %s",
                         (row["body"], row["reader_patterns"], cells[3].id))
        assert store._query("SELECT reader_literals FROM cells WHERE id = %s", (cells[3].id,)) == [
            ([POSTGRES.reader_literal("bob")],)]
        assert {c.cell_id for c in store.keyword_candidates("note", flt, 10)} == {cells[5].id}
        assert {c.cell_id for c in store.keyword_candidates("note", CellFilter(reader="bob"), 10)} == {cells[3].id}
        assert store.wide_keywords.served >= 2
    finally:
        store.close()


def _write_cells(service: MemoryService, count: int, text: str, vector, readable_every: int) -> list:
    """`count` cells of owners owner-0, owner-1, ... ("<text> <i>", an 8-d vector `vector(i)`),
    every `readable_every`-th also readable by agent_x; written in one transaction."""
    cells = []
    with service.store.write() as tx:
        for i in range(count):
            owner = f"owner-{i}"
            cell = service._build(CellCreate.model_validate(
                {"content": {"text": f"{text} {i}"}, "identity": {"owner_id": owner},
                 "access_policy": {"readable_by": ["agent_x"] if i % readable_every == 0 else []}}), owner, service.clock())
            tx.insert(cell, StoredVector("fake-8", vector(i)))
            cells.append(cell)
    return cells


def test_migration_15_gives_each_distinct_vector_one_canonical_row_and_the_graph_only_those(pg_url, monkeypatch):
    """A version-14 store whose vectors repeat (the same text in many cells): the migration
    derives each row's vector key, makes one row per distinct vector canonical and builds each
    model's HNSW index over those alone; a walk then finds every readable copy."""
    from ampkit.store import postgres

    store = PostgresStore(pg_url)
    store.open()
    service = MemoryService(store=store)
    rng = np.random.default_rng(21)
    query = unit(rng, 8)
    vectors = [query] + [unit(rng, 8) for _ in range(9)]
    cells = _write_cells(service, 60, "copy", lambda i: vectors[i % 10], readable_every=4)
    name = store._query("SELECT indexname FROM pg_indexes WHERE indexname LIKE %s", ("cell_vectors_hnsw_%",))[0][0]
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # back to version 14
        conn.execute("DROP TRIGGER cell_vectors_inserted ON cell_vectors")
        conn.execute("DROP FUNCTION ampkit_vector_inserted(), ampkit_vector_key_lock(TEXT, INTEGER, UUID)")
        conn.execute("ALTER TABLE cell_vectors DROP COLUMN vec_key, DROP COLUMN canonical")  # (and their indexes)
        conn.execute(f'CREATE INDEX "{name}" ON cell_vectors USING hnsw ((embedding::vector(8)) vector_cosine_ops) '
                     "WHERE model = 'fake-8' AND dim = 8")
        conn.execute("DELETE FROM schema_migrations WHERE version = 15")
    store = PostgresStore(pg_url)
    store.open()
    try:
        assert store.schema_version() == MIGRATIONS[-1][0] and 15 in store._applied_versions()
        counts = _canonical_rows_per_vector(store)
        assert len(counts) == 10 and set(counts.values()) == {1}
        # the canonical row of each vector is its smallest cell id
        firsts = {min(c.id for j, c in enumerate(cells) if j % 10 == i) for i in range(10)}
        assert {r[0] for r in store._query("SELECT cell_id FROM cell_vectors WHERE canonical")} == firsts
        indexdef = store._query("SELECT indexdef FROM pg_indexes WHERE indexname = %s", (name,))[0][0]
        assert "canonical" in indexdef, indexdef
        assert store._query("SELECT indexname FROM pg_indexes WHERE indexname IN ('cell_vectors_twins', 'cell_vectors_canonical') "
                            "ORDER BY 1") == [("cell_vectors_canonical",), ("cell_vectors_twins",)]
        monkeypatch.setattr(postgres, "EXACT_ADMITTED_MAX", 0)  # walk the graph
        readable = sorted(c.id for j, c in enumerate(cells) if j % 4 == 0 and j % 10 == 0)
        with store._connection() as conn, conn.transaction():
            store.set_search_options(conn, len(readable))
            walked = conn.execute(*store.vector_query(query, "fake-8", CellFilter(reader="agent_x"), len(readable))).fetchall()
        assert sorted(cid for cid, _ in walked) == readable
        # A server of version 14, still serving, inserts vector rows as it always did: a new
        # vector's row takes the canonical part (it is in the graph), a known one's does not.
        fresh = [service._build(CellCreate.model_validate({"content": {"text": f"late {i}"},
                                                           "identity": {"owner_id": "agent_x"}}), "agent_x", service.clock())
                 for i in range(2)]
        service = MemoryService(store=store)
        with store.write() as tx:
            for cell in fresh:
                tx.insert(cell)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for cell, vec in zip(fresh, (unit(rng, 8), query)):
                conn.execute("INSERT INTO cell_vectors (cell_id, model, dim, embedding) VALUES (%s, 'fake-8', 8, %s::vector)",
                             (cell.id, vec.tolist()))
        assert store._query("SELECT cell_id, canonical FROM cell_vectors WHERE cell_id = ANY(%s) ORDER BY cell_id",
                            ([c.id for c in fresh],)) == sorted([(fresh[0].id, True), (fresh[1].id, False)])
        assert set(_canonical_rows_per_vector(store).values()) == {1}
    finally:
        store.close()



def test_migration_16_lets_a_walk_check_the_read_rule_without_reading_cells(pg_url, monkeypatch):
    """A version-15 store gains an index of the read rule's columns by cell id: every column a
    reader-wide filter reads is in it, so a walk can check each cell it reaches in the index
    alone (an index-only scan: at 1M cells PostgreSQL chose it, bench/scale.py; on a test's
    few pages its planner reads the table instead), and walks answer as before."""
    import re

    from ampkit.store import postgres
    from ampkit.store.sql import POSTGRES, compile_filter

    monkeypatch.setattr(postgres, "EXACT_ADMITTED_MAX", 0)  # walk the graph, whatever the filter's size
    store = PostgresStore(pg_url)
    store.open()
    service = MemoryService(store=store)
    rng = np.random.default_rng(16)
    query = unit(rng, 8)
    _write_cells(service, 120, "note", lambda i: unit(rng, 8), readable_every=3)
    wide = [CellFilter(reader="agent_x"), CellFilter(reader="agent_x", types=["semantic"], not_expired_at=service.clock())]
    before = [store.vector_candidates(query, "fake-8", flt, 10) for flt in wide]
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # back to version 15
        conn.execute("DROP INDEX cells_id_read_rule")
        conn.execute("DELETE FROM schema_migrations WHERE version = 16")
    store = PostgresStore(pg_url)
    store.open()
    try:
        assert 16 in store._applied_versions()
        indexdef = store._query("SELECT indexdef FROM pg_indexes WHERE indexname = 'cells_id_read_rule'")[0][0]
        key, included = re.fullmatch(r".*USING btree \((\w+)\) INCLUDE \((.*)\)", indexdef).groups()
        assert key == "id"
        for flt in wide:
            where, _ = compile_filter(flt, POSTGRES, "c")
            read = set(re.findall(r"\bc\.(\w+)", where))
            assert read and read <= {c.strip() for c in included.split(",")}, (read, indexdef)
        assert [store.vector_candidates(query, "fake-8", flt, 10) for flt in wide] == before
    finally:
        store.close()


def test_every_write_path_stores_the_readers_split(pg_server, pg_url):
    """Create, batch create, a policy change, a supersession and an import each store a cell's
    `readable_by` compiled, split by the database into literals and globs (migration 14), and
    the read rule then grants what `can_read` does."""
    import re

    from ampkit.access import can_read
    from ampkit.portable import export_lines, import_lines
    from ampkit.store.sql import POSTGRES
    from ampkit.store.sql.dialects import READER_LITERAL

    def body(text: str, readers: list[str], **more) -> CellCreate:
        return CellCreate.model_validate({"content": {"text": text}, "identity": {"owner_id": "u1"},
                                          "access_policy": {"readable_by": readers}, **more})

    def check(store: PostgresStore) -> None:
        rows = store._query("SELECT id, reader_patterns, reader_literals, reader_globs FROM cells")
        cells = {c.id: c for c in store.iter_cells()}
        assert len(rows) == len(cells) == 6 and any(literals for _, _, literals, _ in rows)
        for cid, patterns, literals, globs in rows:
            assert patterns == sorted({POSTGRES.reader_pattern(p) for p in cells[cid].access_policy.readable_by}), cid
            assert literals == [p for p in patterns if re.fullmatch(READER_LITERAL, p)], cid
            assert globs == [p for p in patterns if p not in literals], cid
        for agent in ("a.b", "axb", "x*y", "xzy", "bot-1", "carol", "dave", "team-q"):
            flt = CellFilter(reader=agent, statuses=["active", "archived"], include_superseded=True)
            assert {c.id for c in store.list(flt, 10)} == {c.id for c in cells.values() if can_read(c, agent)}, agent

    store = PostgresStore(pg_url)
    store.open()
    copy = PostgresStore(pg_server.create_database(f"{pg_url.rsplit('/', 1)[1].split('?')[0]}_import",
                                                   template="ampkit_template"))
    copy.open()
    try:
        service = MemoryService(store=store)
        one = service.create("u1", body("one", ["a.b", "bot-?"]))
        service.create_many("u1", [body("two", ["x[*]y"]), body("three", []), body("four", ["carol", "team-*"])])
        service.update("u1", one.id, CellPatch.model_validate({"access_policy": {"readable_by": ["dave", "a.b"]}}))
        service.create("u1", body("five", ["carol"], supersedes=one.id))
        service.create("u1", body("six", ["[!a]*"]))
        check(store)
        lines = list(export_lines(store))
        assert import_lines(copy, lambda: iter(lines)).cells_written == 6
        check(copy)
    finally:
        store.close()
        copy.close()


def test_lifecycle_lock_is_held_across_stores(pg_url):
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    a.open()
    b.open()
    try:
        with a.try_lifecycle_lock() as got_a:
            assert got_a
            with b.try_lifecycle_lock() as got_b:
                assert not got_b  # another "server" is running it
        with b.try_lifecycle_lock() as got_b:
            assert got_b  # released when a's run ended
    finally:
        a.close()
        b.close()


def test_concurrent_patches_of_one_cell_lose_nothing(pg_store):
    """Read-modify-write under the row lock: each thread appends to a list, none is lost."""
    service = MemoryService(store=pg_store)
    cell = service.create("agent_a", CellCreate.model_validate(
        {"content": {"text": "shared", "metadata": {}}, "identity": {"owner_id": "agent_a"}}))
    errors: list[BaseException] = []

    def bump(n):
        try:
            for i in range(10):
                service.update("agent_a", cell.id, CellPatch.model_validate({"scoring": {"importance": (n * 10 + i) / 100}}))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=bump, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    updates = [h for h in pg_store.history(cell.id) if h.action == "update"]
    # Every update saw the previous one: versions rise by exactly one per committed update.
    assert pg_store.get(cell.id).lifecycle.version == 1 + len(updates)
    assert len(updates) >= 37  # 40 writes; one may repeat an importance already set (no change, no entry)


def test_unreachable_database_at_startup_is_a_clear_message(tmp_path):
    result = ampkit("serve", "--port", "1", "--store", f"postgresql://postgres@/nope?host={tmp_path}", timeout=60)
    assert result.returncode == 3
    assert "PostgreSQL is unreachable" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_right_to_create_pgvector_is_explained(pg_server):
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute("CREATE ROLE ampkit_plain LOGIN")
        conn.execute("CREATE DATABASE ampkit_plain OWNER ampkit_plain")  # from template1: no pgvector
    url = pg_server.url("ampkit_plain").replace("postgres@", "ampkit_plain@")
    with pytest.raises(Exception) as raised:
        PostgresStore(url).open()
    assert "CREATE EXTENSION vector" in str(raised.value) and "permission denied" in str(raised.value)


def test_a_connection_the_server_ended_is_replaced_and_a_healthy_one_costs_no_round_trip(pg_url):
    """The pool's check (`check_idle_connection`): a pooled connection whose backend was
    terminated while idle is replaced before a request gets it; a healthy one is handed out
    without asking the server anything (its last statement is still the one it ran)."""
    sep = "&" if "?" in pg_url else "?"
    store = PostgresStore(pg_url + sep + "pool_min=1&pool_max=1")
    store.open()
    try:
        with psycopg.connect(split_url(pg_url)[0], autocommit=True) as admin:
            def last_statement(pid: int) -> str:
                return admin.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]

            with store._connection() as conn:
                pid = conn.execute("SELECT pg_backend_pid() /* marker-42 */").fetchone()[0]
            with store._connection() as conn:  # checked out again: the pool ran its check
                assert conn.info.backend_pid == pid
                assert "marker-42" in last_statement(pid)  # no round trip for a healthy connection
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            deadline = time.monotonic() + 10
            while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert store._query("SELECT pg_backend_pid()")[0][0] != pid  # replaced, not an error
    finally:
        store.close()


@pytest.mark.slow
def test_database_lost_while_serving_answers_503_then_recovers(server_factory):
    root = Path(tempfile.mkdtemp(prefix="ampkit-pg-outage-", dir=scratch_dir()))
    pg = EmbeddedPostgres(root / "data", root / "sock").start()
    try:
        url = pg.url() + "&pool_timeout=0.3"  # each request below waits this long for a connection
        server = server_factory(url, args=["--lifecycle-interval", "0"])
        created = httpx.post(f"{server.base_url}/memories", headers=AGENT,
                             json={"content": {"text": "survives the outage"}, "identity": {"owner_id": "agent_a"}}, verify=TLS)
        assert created.status_code == 201
        cell_id = created.json()["id"]

        pg.stop()
        for request in (lambda: httpx.get(f"{server.base_url}/health", timeout=30, verify=TLS),
                        lambda: httpx.get(f"{server.base_url}/memories/{cell_id}", headers=AGENT, timeout=30, verify=TLS),
                        lambda: httpx.post(f"{server.base_url}/memories", headers=AGENT, timeout=30,
                                           json={"content": {"text": "x"}, "identity": {"owner_id": "agent_a"}}, verify=TLS)):
            answer = request()
            assert answer.status_code == 503
            assert answer.json()["error"]["code"] == "UNAVAILABLE"

        pg.start()
        deadline = time.monotonic() + 20
        while True:
            answer = httpx.get(f"{server.base_url}/memories/{cell_id}", headers=AGENT, timeout=30, verify=TLS)
            if answer.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert answer.status_code == 200
        assert answer.json()["content"]["text"] == "survives the outage"
        health = httpx.get(f"{server.base_url}/health", timeout=30, verify=TLS).json()
        assert health["status"] == "ok" and health["amp_version"] == "0.1.0"
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_migrate_dry_run_changes_nothing_then_applies(pg_url, tmp_path):
    dry = ampkit("migrate", "--store", pg_url, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert [line.split(":")[0] for line in dry.stdout.splitlines()] == [f"would apply migration {v}" for v, _, _ in MIGRATIONS]
    with psycopg.connect(split_url(pg_url)[0]) as conn:
        assert conn.execute("SELECT to_regclass('cells')").fetchone()[0] is None
    applied = ampkit("migrate", "--store", pg_url)
    assert applied.returncode == 0 and f"applied {len(MIGRATIONS)} migration(s)" in applied.stdout
    again = ampkit("migrate", "--store", pg_url, "--dry-run")
    assert "schema is up to date" in again.stdout
    # SQLite too, and a dry run does not even create the file.
    db = tmp_path / "fresh.db"
    assert "would apply migration 1" in ampkit("migrate", "--store", f"sqlite:///{db}", "--dry-run").stdout
    assert not db.exists()


def test_copy_sqlite_to_postgres_and_back_keeps_everything(pg_url, tmp_path):
    from datetime import timedelta

    from ampkit.models import utcnow
    from ampkit.store.base import ApiKeyRecord

    source_url, back_url = f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"
    source = store_from_url(source_url)
    source.open()
    service = MemoryService(store=source)
    old = service.create("agent_a", CellCreate.model_validate(
        {"content": {"text": "lives in Bristol", "metadata": {"k": [1, {"z": None}], "a": True}},
         "identity": {"owner_id": "u1", "session_id": "s1"}, "access_policy": {"readable_by": ["agent_[!x]*"]}}))
    service.create("agent_a", CellCreate.model_validate(
        {"content": {"text": "moved to Edinburgh"}, "identity": {"owner_id": "u1"}, "supersedes": old.id}))
    gone = service.create("agent_a", CellCreate.model_validate({"content": {"text": "to forget"}, "identity": {"owner_id": "u2"}}))
    service.update("agent_a", gone.id, CellPatch.model_validate({"lifecycle": {"status": "archived"}}))
    service.delete("agent_a", gone.id)
    for i in range(7):
        service.create("agent_b", CellCreate.model_validate({"content": {"text": f"fact {i}"}, "identity": {"owner_id": "u3"}}))
    source.keys.put(ApiKeyRecord("k1", "agent_a", ("read", "write"), "ab" * 32, utcnow(), utcnow() + timedelta(days=1)))
    cells = {c.id: c for c in source.iter_cells()}
    histories = {cid: source.history(cid) for cid in cells}
    keys = source.keys.list()
    source.close()

    there = ampkit("copy", "--from", source_url, "--to", pg_url, "--batch-size", "4")
    assert there.returncode == 0, there.stderr
    assert f"copied {len(cells)} cells" in there.stdout and "verified" in there.stdout
    assert "100%" in there.stderr  # the progress bar ran to the end
    refused = ampkit("copy", "--from", source_url, "--to", pg_url)
    assert refused.returncode == 2 and "empty" in refused.stderr
    back = ampkit("copy", "--from", pg_url, "--to", back_url)
    assert back.returncode == 0, back.stderr

    for url in (pg_url, back_url):
        copy = store_from_url(url)
        copy.open()
        try:
            assert {c.id: c for c in copy.iter_cells()} == cells
            for cid, entries in histories.items():
                got = copy.history(cid)
                assert [(h.at, h.actor, h.action, h.changes) for h in got] == [
                    (h.at, h.actor, h.action, h.changes) for h in entries]
            assert copy.keys.list() == keys
            assert [c.cell_id for c in copy.keyword_candidates("Edinburgh", CellFilter(), 5)] != []
        finally:
            copy.close()


def test_keyword_leg_sees_session_neighbours_and_forgets_purged_text(pg_store):
    """Like SQLite's index: a turn is found by its neighbours' words in the same session
    (the answer follows the question), and a purged turn's words leave every window."""
    from datetime import timedelta

    from ampkit.models import utcnow

    service = MemoryService(store=pg_store)

    def turn(text, session="s1"):
        return service.create("agent_a", CellCreate.model_validate(
            {"content": {"text": text}, "identity": {"owner_id": "u", "session_id": session}}))

    question = turn("Where did you grow up?")
    answer = turn("Mostly in Lisbon, near the river.")
    other = turn("The marmalade recipe needs Seville oranges.", session="s2")
    found = [c.cell_id for c in pg_store.keyword_candidates("grow up", CellFilter(), 10)]
    assert set(found) == {question.id, answer.id} and found[0] == question.id  # own words rank first
    assert other.id not in [c.cell_id for c in pg_store.keyword_candidates("Lisbon", CellFilter(), 10)]
    service.update("agent_a", question.id, CellPatch.model_validate({"lifecycle": {"status": "archived"}}))
    service.delete("agent_a", question.id)
    later = utcnow() + timedelta(days=31)
    assert replace(service, clock=lambda: later).purge("admin", [question.id]).purged == [question.id]
    assert pg_store.keyword_candidates("grow up", CellFilter(statuses=("active", "deleted")), 10) == []


def test_scheduled_lifecycle_is_claimed_once_per_interval(pg_url):
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    a.open()
    b.open()
    try:
        assert a.claim_scheduled_lifecycle(3600)  # the first server whose timer fires runs it
        assert not b.claim_scheduled_lifecycle(3600)  # the other skips this interval
        assert not a.claim_scheduled_lifecycle(3600)
        time.sleep(0.25)
        assert b.claim_scheduled_lifecycle(0.2)  # next interval: whoever comes first
    finally:
        a.close()
        b.close()
