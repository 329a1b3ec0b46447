"""The SQLite keyword leg computes exactly the straightforward BM25.

`SQLiteStore.keyword_candidates` has three ways to its answer (a scan of the admitted
windows' term counts, the FTS OR query, and the vectorised intersection of cached term rows
with the cached admitted rows for a wide filter). Each must give the same matches, the same
ranks and the same scores, bit for bit, as the plain loop below: admitted rows from the
filter, matches from each query word (a word the tokenizer splits is an FTS phrase), document
frequencies over the matches, FTS5's BM25 formula term by term.
"""

from __future__ import annotations

import json
import math
import random
import sqlite3
from dataclasses import replace
from typing import Any, Callable

import numpy as np
import pytest

from ampkit.models import CellCreate, CellPatch
from ampkit.service import MemoryService
from ampkit.store.base import CellFilter
from ampkit.store.sqlite import SQLiteStore
from ampkit.store.sqlite_access import filter_sql
from ampkit.store.sqlite_keyword import TOKENIZER, tokenize
from ampkit.textindex import query_terms

K1, B = 1.2, 0.75
WORDS = ("lena oslo window seats coffee dark roast rescue dog march airport bruno cold tea "
         "travel meeting budget garden piano dentist").split()
EXTRA = ["window-seats", "dark-roast", "서울에서 커피를 마셨다", "Oslo's", "the", "and"]


def reference(path: str, query: str, flt: CellFilter, k: int) -> list[tuple[str, float]]:
    """The straightforward computation, in plain Python over every admitted window (every
    window: those of new cells the store has not indexed yet are indexed first)."""
    conn = sqlite3.connect(path)
    if conn.execute("SELECT EXISTS (SELECT 1 FROM pending_windows)").fetchone()[0]:
        indexer = SQLiteStore(path)
        indexer.open()
        indexer.close()  # a clean close indexes what is pending
    for statement in TOKENIZER:
        conn.execute(statement)
    words = query_terms(query)
    per_word = tokenize(conn, words)
    terms = sorted({t for tf in per_word for t in tf if '"' not in t and "\\" not in t})
    where, params = filter_sql(flt)
    admitted = [(rowid, cid, length, json.loads(tf)) for rowid, cid, length, tf in conn.execute(
        f"SELECT c.rowid, c.id, x.len, x.terms FROM cells c JOIN cell_context x ON x.rowid = c.rowid WHERE {where}",
        params)]
    phrase_rows = {}
    for word, tf in zip(words, per_word):
        if len(tf) > 1:
            quoted = '"' + word.replace('"', '""') + '"'
            phrase_rows[word] = {r for (r,) in conn.execute(
                "SELECT rowid FROM cells_fts WHERE cells_fts MATCH ?", (f"text : {quoted}",))}
    conn.close()
    n = len(admitted)
    if not n or not terms:
        return []
    avgdl = sum(length for _, _, length, _ in admitted) / n

    def matches(rowid: int, counts: dict) -> bool:
        return any((len(tf) == 1 and next(iter(tf)) in counts) or (len(tf) > 1 and rowid in phrase_rows[word])
                   for word, tf in zip(words, per_word))

    matched = [(cid, length, counts) for rowid, cid, length, counts in admitted if matches(rowid, counts)]
    weights = []
    for term in terms:
        df = sum(1 for _, _, counts in matched if counts.get(term))
        value = math.log((n - df + 0.5) / (df + 0.5)) if df else 0.0
        weights.append(value if value > 0 or not df else 1e-6)
    scored = []
    for cid, length, counts in matched:
        norm = K1 * (1 - B + B * length / avgdl)
        score = 0.0
        for weight, term in zip(weights, terms):
            tf = counts.get(term, 0)
            if tf:
                score += weight * tf * (K1 + 1) / (tf + norm)
        if score > 0:
            scored.append((-score, cid))
    scored.sort()
    return [(cid, -neg) for neg, cid in scored[:k]]


def _archive_delete_or_rewrite(service: MemoryService, rng: random.Random, cells: list[Any]) -> None:
    """Each cell archived (then perhaps deleted) or its text rewritten: deleted and archived
    cells leave windows and statistics, rewritten ones change them."""
    for c in cells:
        if rng.random() < 0.5:
            service.update(c.identity.owner_id, c.id, CellPatch(lifecycle={"status": "archived"}))
            if rng.random() < 0.5:
                service.delete(c.identity.owner_id, c.id)
        else:
            service.update(c.identity.owner_id, c.id, CellPatch(content={"text": c.content.text + " piano"}))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """One store file with cells of several owners, policies, statuses and sessions."""
    rng = random.Random(11)
    path = str(tmp_path_factory.mktemp("bm25") / "kw.db")
    store = SQLiteStore(path)
    store.open()
    service = MemoryService(store=store)
    owners = ["ada", "bob", "cy", "dee"]
    created = []
    for i in range(240):
        owner = rng.choice(owners)
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9)))
        if rng.random() < 0.2:
            text += " " + rng.choice(EXTRA)
        policy = rng.choice([{}, {"readable_by": ["team-*"]}, {"readable_by": ["eve"]}, {"public": True}])
        session = None if rng.random() < 0.15 else f"{owner}-s{rng.randint(0, 6)}"
        created.append(service.create(owner, CellCreate(content={"text": text}, identity={"owner_id": owner, "session_id": session},
                                                        access_policy=policy)))
    _archive_delete_or_rewrite(service, rng, rng.sample(created, 25))
    store.close()
    return path


FILTERS = [
    CellFilter(reader="team-lead"), CellFilter(reader="eve"), CellFilter(reader="ada"),
    CellFilter(reader="ada", owner_id="ada"), CellFilter(reader="team-x", owner_id="bob"),
    CellFilter(), CellFilter(reader="nobody"), CellFilter(reader="team-lead", types=["fact"]),
    CellFilter(reader="ada", statuses=("active", "archived")),
]
QUERIES = ["lena oslo", "coffee window-seats", "dark-roast march the", "서울 커피", "the", "piano dog tea budget garden",
           "Oslo's dentist", "zzz unknown", "lena lena LENA", " ".join(WORDS)]


@pytest.fixture(scope="module")
def expected(corpus):
    return {(query, i): reference(corpus, query, flt, 1000) for query in QUERIES for i, flt in enumerate(FILTERS)}


@pytest.mark.parametrize("scan_max", [0, 40, 5000])
def test_keyword_candidates_equal_the_straightforward_bm25(corpus, expected, scan_max):
    """scan_max 0: every filter takes the wide path; 40: owners' searches scan; 5000: owners'
    searches scan (or run the FTS query for a phrase), reader-wide ones take the wide path."""
    store = SQLiteStore(corpus, keyword_scan_max=scan_max)
    store.open()
    try:
        for _ in range(2):  # the second round answers from the caches
            for query in QUERIES:
                for i, flt in enumerate(FILTERS):
                    for k in (1, 5, 80):
                        got = [(c.cell_id, c.score) for c in store.keyword_candidates(query, flt, k)]
                        assert got == expected[query, i][:k], (query, flt, k)
        assert any(expected[q, 0] for q in QUERIES) and any(len(expected[q, 0]) > 80 for q in QUERIES)
    finally:
        store.close()


def test_a_reader_wide_search_takes_its_rows_from_the_snapshot_however_few(corpus, expected):
    """A filter with no owner, session or metadata condition takes its rows from the access
    snapshot even when it admits few: in SQL no index serves its access condition, which is
    then evaluated on every cell of the store (150 ms a search at 20,000 cells for a team
    admitting 1,000). An owner's filter stays in SQL, where its index serves it."""
    store = SQLiteStore(corpus)
    store.open()
    conn = store._reader()
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        wide, owner = FILTERS[0], FILTERS[3]
        got = [(c.cell_id, c.score) for c in store.keyword_candidates(QUERIES[0], wide, 80)]
        assert got and got == expected[QUERIES[0], 0][:80]
        assert len(got) < store.access.keyword_scan_max  # few admitted: the SQL scan's size before
        assert not [s for s in statements if "JOIN cell_context" in s], statements
        store.keyword_candidates(QUERIES[0], owner, 80)
        assert [s for s in statements if "JOIN cell_context" in s]  # the owner's scan, in SQL
    finally:
        conn.set_trace_callback(None)
        store.close()


def test_a_wide_filter_asks_the_vector_index_whether_it_admits_a_models_vector(corpus, tmp_path):
    """Whether the multilingual leg runs (`has_vectors`) is decided for a reader-wide filter
    on its admitted rows in the vector index: in SQL, every admitted row was read whenever
    none had a vector of the model (0.6 s a search at a million cells, for every English
    search of a reader who may read no CJK cell in a store that has one). Yes exactly when
    a row the reader may read has one; an owner's filter asks SQL, where its index serves it."""
    import shutil

    import numpy as np

    from ampkit.store.base import StoredVector

    path = str(tmp_path / "kw.db")
    shutil.copy(corpus, path)
    store = SQLiteStore(path)
    store.open()
    try:
        store.wait_for_vector_index()
        cell_id, owner = store._query(
            "SELECT id, owner_id FROM cells WHERE json_extract(body, '$.access_policy.readable_by') = '[\"eve\"]' "
            "AND status = 'active' AND superseded_by IS NULL AND public = 0 AND owner_id != 'eve' LIMIT 1")[0]
        model = "test-multilingual"
        assert not store.has_vectors(model, CellFilter(reader="eve"))  # no such vector yet
        with store.write() as tx:
            tx.set_vector(cell_id, StoredVector(model, np.full(4, 0.5, dtype=np.float32)))
        conn = store._reader()
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        try:
            assert store.has_vectors(model, CellFilter(reader="eve"))  # eve may read it
            assert not store.has_vectors(model, CellFilter(reader="team-lead"))  # not team-lead
            assert not store.has_vectors(model, CellFilter(reader="eve", types=["fact"]))
            assert not [s for s in statements if "embed_model = " in s], statements
            assert store.has_vectors(model, CellFilter(reader=owner, owner_id=owner))
            assert not store.has_vectors(model, CellFilter(reader="eve", owner_id="eve"))
            assert [s for s in statements if "embed_model = " in s]  # the owners' filters, in SQL
        finally:
            conn.set_trace_callback(None)
    finally:
        store.close()


def test_admitted_sets_term_arrays_stay_within_one_budget_per_store(corpus, expected, monkeypatch):
    """A server asked about ever new words by many readers keeps every admitted set's per-term
    arrays within one budget per kind for the store (least recently used out, whichever set
    they are of), and an evicted term answers as before."""
    from ampkit.store.indexes import CacheBudgets

    # a few terms of this corpus, for every set together
    budgets = CacheBudgets(term_scores_bytes=600, term_positions_bytes=600, term_matches_bytes=600)
    store = SQLiteStore(corpus, keyword_scan_max=0, budgets=budgets)
    store.open()
    try:
        kinds = store.access.set_arrays
        held = [kinds.postings, kinds.contributions, kinds.matches]
        holders = set()  # the admitted sets whose entries the one budget held at some point
        for _ in range(2):
            for query in QUERIES:
                for i, flt in enumerate(FILTERS):
                    got = [(c.cell_id, c.score) for c in store.keyword_candidates(query, flt, 80)]
                    assert got == expected[query, i][:80], (query, flt)
                    holders |= {key[0] for a in held for key in a.keys()}
        assert max(len(a) for a in held) >= 2
        assert all(a.held_bytes <= 600 or len(a) == 1 for a in held)
        assert all(a.held_bytes == sum(x.nbytes for v in a._held.values() for x in (v if isinstance(v, tuple) else (v,)))
                   for a in held)
        assert len(holders) >= 4
    finally:
        store.close()


@pytest.mark.parametrize("scan_max", [0, 5000])
def test_several_queries_in_one_call_score_as_each_alone(corpus, expected, scan_max):
    """`keyword_candidates_many` (the retriever's keyword and related-words queries) reads an
    owner's windows once for all its queries; each answer equals that query's own, bit for bit."""
    store = SQLiteStore(corpus, keyword_scan_max=scan_max)
    store.open()
    try:
        for i, flt in enumerate(FILTERS):
            for batch in (QUERIES, QUERIES[::-1][:3], ["lena oslo", "the"], []):
                got = store.keyword_candidates_many(batch, flt, 80)
                assert [[(c.cell_id, c.score) for c in found] for found in got] == [expected[q, i][:80] for q in batch], flt
    finally:
        store.close()


def test_caches_follow_writes_from_another_connection(corpus, tmp_path):
    """The admitted rows and term rows are kept per database version: a write by another
    store on the same file (another process, say) is seen by the next search."""
    import shutil
    path = str(tmp_path / "copy.db")
    shutil.copy(corpus, path)
    searcher, writer = SQLiteStore(path, keyword_scan_max=0), SQLiteStore(path)
    searcher.open()
    writer.open()
    try:
        flt = CellFilter(reader="team-lead")
        before = searcher.keyword_candidates("quokka piano", flt, 80)
        MemoryService(store=writer).create("ada", CellCreate(content={"text": "a quokka plays piano"},
                                                             identity={"owner_id": "ada"},
                                                             access_policy={"readable_by": ["team-*"]}))
        after = [(c.cell_id, c.score) for c in searcher.keyword_candidates("quokka piano", flt, 80)]
        assert after != [(c.cell_id, c.score) for c in before] and after == reference(path, "quokka piano", flt, 80)
        assert len(after) == len(reference(path, "quokka piano", flt, 1000))
    finally:
        searcher.close()
        writer.close()


def test_an_idle_store_takes_in_another_connections_import_in_the_background(corpus, tmp_path, monkeypatch):
    """An import through another store on the file (another process: a replica, a sibling
    worker, an in-process client) is taken into an idle searcher's caches by its windows
    thread's look (FOREIGN_LOOK_SECONDS, here shortened), not by its next search: the change
    log read up to the writer's last entry by a look, with no search asking; the search after
    it then loads nothing afresh and equals the statement."""
    import shutil
    import time

    from ampkit.store import sqlite as sqlite_module

    monkeypatch.setattr(sqlite_module, "FOREIGN_LOOK_SECONDS", 0.05)
    path = str(tmp_path / "copy.db")
    shutil.copy(corpus, path)
    searcher, writer = SQLiteStore(path, keyword_scan_max=0), SQLiteStore(path)
    searcher.open()
    looks: list[tuple[int, int]] = []  # (the log position before a look, after it)
    look = searcher._take_in_foreign

    def counted_look() -> None:
        before = searcher.changes.log_seq
        look()
        looks.append((before, searcher.changes.log_seq))

    monkeypatch.setattr(searcher, "_take_in_foreign", counted_look)
    writer.open()
    try:
        flt = CellFilter(reader="team-lead")
        searcher.keyword_candidates("quokka piano", flt, 80)  # its caches load
        deadline = time.monotonic() + 20
        while not looks and time.monotonic() < deadline:  # past its first pass: idle, looking
            time.sleep(0.01)
        foreign = searcher.changes.foreign
        MemoryService(store=writer).create_many("ada", [
            CellCreate(content={"text": f"a quokka plays piano, lesson {i}"}, identity={"owner_id": "ada", "session_id": "import"},
                       access_policy={"readable_by": ["team-*"]}) for i in range(200)])
        writer.index_pending_windows()
        top = writer._writer.execute("SELECT MAX(seq) FROM change_log").fetchone()[0]
        deadline = time.monotonic() + 20  # (a look may take in the writes in two steps, and the writer's own windows pass log more)
        while not any(before < top <= after for before, after in looks) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert any(before < top <= after for before, after in looks)  # taken in by a look, no search asking
        assert searcher.changes.foreign == foreign  # patched, not loaded afresh
        got = [(c.cell_id, c.score) for c in searcher.keyword_candidates("quokka piano", flt, 80)]
        assert got == reference(path, "quokka piano", flt, 80)
        assert sum("lesson" in (searcher.get(cid).content.text or "") for cid, _ in got) >= 10
        assert searcher.changes.foreign == foreign
    finally:
        searcher.close()
        writer.close()


def test_a_replaced_admitted_sets_arrays_leave_the_shared_budget(corpus, tmp_path):
    """The per-term arrays of an admitted set that is gone (a write replaced it) are dropped
    from the store's one budget at its next use, not kept until newer arrays push them out:
    a server that writes between wide searches holds only what can still be asked for."""
    import shutil
    path = str(tmp_path / "copy.db")
    shutil.copy(corpus, path)
    store = SQLiteStore(path, keyword_scan_max=0)
    store.open()
    try:
        flt = CellFilter(reader="team-lead")
        scores = store.access.set_arrays.contributions
        store.keyword_candidates("quokka piano", flt, 80)
        first = {serial for serial, _ in scores.keys()}
        assert len(first) == 1 and len(scores) >= 2
        MemoryService(store=store).create("ada", CellCreate(content={"text": "a quokka plays piano"},
                                                            identity={"owner_id": "ada"},
                                                            access_policy={"readable_by": ["team-*"]}))
        after = [(c.cell_id, c.score) for c in store.keyword_candidates("quokka piano", flt, 80)]
        assert after == reference(path, "quokka piano", flt, 80)
        now = {serial for serial, _ in scores.keys()}
        assert now and not now & first  # the replaced set's entries are gone, the new set's held
        assert scores.held_bytes == sum(x.nbytes for v in scores._held.values() for x in v)
    finally:
        store.close()


# The PostgreSQL BM25 as one statement, its statistics computed inside (before the scope was
# kept between queries): the reference the store's answer must equal, bit for bit.
PG_ONE_QUERY = """
WITH weights AS (SELECT * FROM unnest(%s::text[]) AS w(lexeme)),
matches AS MATERIALIZED (
    SELECT s.cell_id, ts_filter(setweight(s.tsv, 'A', (SELECT array_agg(lexeme) FROM weights)), '{{a}}') AS hits, s.len
    FROM cell_search s JOIN cells c ON c.id = s.cell_id
    WHERE s.tsv @@ (SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery FROM weights) AND {where}),
terms AS (SELECT m.cell_id, m.len, u.lexeme, cardinality(u.positions) AS tf FROM matches m CROSS JOIN LATERAL unnest(m.hits) AS u),
scope AS (SELECT COUNT(*)::float8 AS n, GREATEST(COALESCE(AVG(s.len), 1), 1)::float8 AS avgdl
          FROM cell_search s JOIN cells c ON c.id = s.cell_id WHERE {where}),
idf AS (SELECT t.lexeme, ln(1 + (GREATEST(scope.n, COUNT(*)) - COUNT(*) + 0.5) / (COUNT(*) + 0.5)) AS idf
        FROM terms t CROSS JOIN scope GROUP BY t.lexeme, scope.n)
SELECT t.cell_id,
       SUM(i.idf * t.tf * 2.2 / (t.tf + 1.2 * (0.25 + 0.75 * t.len / scope.avgdl)) ORDER BY t.lexeme) AS score
FROM terms t JOIN idf i ON i.lexeme = t.lexeme CROSS JOIN scope
GROUP BY t.cell_id ORDER BY score DESC, t.cell_id LIMIT %s
"""


def pg_reference(store, query: str, flt: CellFilter, k: int) -> list[tuple[str, float]]:
    from psycopg import sql

    from ampkit.store.postgres import _LEXEMES, TEXT_CONFIG, filter_sql
    where, params = filter_sql(flt)
    with store._connection() as conn:
        lexemes = sorted(r[0] for r in conn.execute(_LEXEMES, (TEXT_CONFIG, " ".join(query_terms(query)))))
        if not lexemes:
            return []
        return [(cid, float(score)) for cid, score in conn.execute(
            sql.SQL(PG_ONE_QUERY).format(where=where), [lexemes, *params, *params, k])]


def test_postgres_keyword_scope_kept_between_queries_changes_nothing(pg_url):
    """The scope (N, mean length) is kept per filter while the cluster's snapshot stays the
    same; answers equal the one-statement query before and after writes and expiries."""
    from datetime import datetime, timedelta, timezone

    from ampkit.store import store_from_url
    store = store_from_url(pg_url)
    store.open()
    try:
        rng = random.Random(5)
        service = MemoryService(store=store)
        now = datetime(2026, 1, 1, tzinfo=timezone.utc)
        for i in range(80):
            owner = rng.choice(["ada", "bob", "cy"])
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))
            policy = rng.choice([{}, {"readable_by": ["team-*"]}, {"public": True}])
            expiry = {"expires_at": (now + timedelta(days=rng.randint(1, 3))).isoformat()} if i % 7 == 0 else {}
            service.create(owner, CellCreate(content={"text": text}, identity={"owner_id": owner, "session_id": f"s{i % 5}"},
                                             access_policy=policy, lifecycle=expiry))
        filters = [CellFilter(reader="team-lead"), CellFilter(reader="ada"), CellFilter(reader="bob", owner_id="bob")]
        for round_ in range(3):
            for day in (0, 2, 5):  # a cell expires between two searches: the scope is recounted
                for flt in filters:
                    flt = replace(flt, not_expired_at=now + timedelta(days=day))
                    for query in ("lena oslo", "coffee dark roast march", "piano"):
                        got = [(c.cell_id, c.score) for c in store.keyword_candidates(query, flt, 20)]
                        assert got == pg_reference(store, query, flt, 20), (round_, day, flt, query)
            service.create("ada", CellCreate(content={"text": f"lena oslo piano {round_}"}, identity={"owner_id": "ada"},
                                             access_policy={"readable_by": ["team-*"]}))
    finally:
        store.close()


def _pg_world(service: MemoryService, rng: random.Random, n: int = 240) -> list[Any]:
    """Cells of several owners, policies, types, statuses, sessions, metadata and expiries,
    some archived, deleted or rewritten (as the SQLite `corpus`)."""
    from datetime import datetime, timedelta, timezone

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    created = []
    for i in range(n):
        owner = rng.choice(["ada", "bob", "cy", "dee"])
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9)))
        if rng.random() < 0.2:
            text += " " + rng.choice(EXTRA)
        policy = rng.choice([{}, {"readable_by": ["team-*"]}, {"readable_by": ["eve"]}, {"public": True}])
        session = None if rng.random() < 0.15 else f"{owner}-s{rng.randint(0, 6)}"
        expiry = {"expires_at": (now + timedelta(days=rng.randint(1, 3))).isoformat()} if i % 9 == 0 else {}
        created.append(service.create(owner, CellCreate(
            content={"text": text, "metadata": {"topic": rng.choice(["x", "y"])}}, type=rng.choice(["semantic", "episodic"]),
            identity={"owner_id": owner, "session_id": session}, access_policy=policy, lifecycle=expiry)))
    _archive_delete_or_rewrite(service, rng, rng.sample(created, n // 10))
    return created


def _write_pg_world(pg_url: str, seed: int) -> None:
    """`_pg_world` written through a store that is then closed (what a restarted server finds)."""
    from ampkit.store import store_from_url
    writer = store_from_url(pg_url)
    writer.open()
    try:
        _pg_world(MemoryService(store=writer), random.Random(seed))
    finally:
        writer.close()


WIDE_FILTERS = [
    CellFilter(reader="team-lead"), CellFilter(reader="eve"), CellFilter(reader="ada"), CellFilter(),
    CellFilter(reader="nobody"), CellFilter(reader="team-lead", types=["episodic"]),
    CellFilter(reader="ada", statuses=("active", "archived")), CellFilter(reader="team-x", metadata={"topic": "x"}),
]


def test_postgres_wide_keyword_leg_equals_the_one_statement(pg_url):
    """A reader across owners is ranked from arrays kept between searches (`_pg_keyword`):
    the same matches, order and scores, bit for bit, as the one statement, for every wide
    filter, at times on either side of cells' expiries, cold and warm; one generation of
    arrays serves them all while nothing changes."""
    from datetime import datetime, timedelta, timezone

    from ampkit.store import store_from_url
    store = store_from_url(pg_url)
    store.open()
    try:
        _pg_world(MemoryService(store=store), random.Random(11))
        now = datetime(2026, 1, 1, tzinfo=timezone.utc)
        long_answers = 0
        for round_ in range(2):  # the first is answered by the statement while the arrays load; the second from them
            if round_:
                assert store.wide_keywords.wait_until_warm()
                assert store.vector_index_state() == {"keyword_warmup": "ready"}  # /health
                served = store.wide_keywords.served
            for query in QUERIES:
                for flt in WIDE_FILTERS:
                    for at in (None, now, now + timedelta(days=2), now + timedelta(days=2, microseconds=1), now + timedelta(days=9)):
                        timed = replace(flt, not_expired_at=at)
                        expected = pg_reference(store, query, timed, 1000)
                        long_answers += len(expected) > 80
                        for k in (1, 5, 80):
                            got = [(c.cell_id, c.score) for c in store.keyword_candidates(query, timed, k)]
                            assert got == expected[:k], (query, timed, k)
        assert long_answers and store.wide_keywords.generations == 1
        assert store.wide_keywords.served - served == len(QUERIES) * len(WIDE_FILTERS) * 5 * 3
    finally:
        store.close()


def test_postgres_term_scores_of_every_view_share_one_budget(pg_url):
    """Every view's term scores are kept in one least-recently-used budget per server
    (`SharedArrays`): under a budget a dozen entries fit in, searches over eight wide filters and
    their expiry intervals still equal the statement, what is held stays within the budget, and
    entries of several views are held side by side."""
    from datetime import datetime, timedelta, timezone

    from ampkit.store import store_from_url
    from ampkit.store._bm25 import SharedArrays
    store = store_from_url(pg_url)
    store.open()
    try:
        _pg_world(MemoryService(store=store), random.Random(13))
        index = store.wide_keywords
        index.term_scores = budget = SharedArrays(12_000)  # before any view exists: each takes this one
        now = datetime(2026, 1, 1, tzinfo=timezone.utc)
        for _ in range(2):
            for query in QUERIES:
                for flt in WIDE_FILTERS:
                    for at in (None, now + timedelta(days=2, microseconds=1)):
                        timed = replace(flt, not_expired_at=at)
                        got = [(c.cell_id, c.score) for c in store.keyword_candidates(query, timed, 20)]
                        assert got == pg_reference(store, query, timed, 20), (query, timed)
                        assert budget.held_bytes <= 12_000
        views = {key[0] for key in budget.keys()}
        assert len(budget) >= 4 and len(views) >= 2
    finally:
        store.close()


def test_postgres_warm_ups_one_pass_over_every_window_reads_what_the_index_does(pg_url):
    """The warm-up reads its frequent lexemes by scanning every window (`_FREQUENT_POSTINGS`),
    a search its missing ones through the index (`_BULK_POSTINGS`): the same rows and term
    frequencies for every lexeme of the store and one in no window, including a window whose
    lexeme carries no positions (the index's statement leaves such an entry out)."""
    import psycopg

    from ampkit.store._pg_keyword import WideKeywordIndex
    _write_pg_world(pg_url, 12)
    with psycopg.connect(pg_url) as conn:  # one transaction, rolled back: the store is left as written
        conn.execute("UPDATE cell_search SET tsv = tsv || 'unpositioned'::tsvector "
                     "WHERE seq = (SELECT min(seq) FROM cell_search)")
        lexemes = [lexeme for (lexeme,) in conn.execute(
            "SELECT DISTINCT u.lexeme FROM cell_search s CROSS JOIN LATERAL unnest(s.tsv) u ORDER BY 1")]
        assert len(lexemes) > 20 and "unpositioned" in lexemes
        lexemes.append("inknowindow")
        by_index = WideKeywordIndex._bulk_postings(conn, lexemes)
        by_scan = WideKeywordIndex._bulk_postings(conn, lexemes, frequent=True)
        conn.rollback()
    assert by_index.keys() == by_scan.keys() == set(lexemes)
    assert by_scan["unpositioned"][0].size == by_scan["inknowindow"][0].size == 0
    for lexeme in lexemes:
        (rows_a, tf_a), (rows_b, tf_b) = by_index[lexeme], by_scan[lexeme]
        assert rows_a.tolist() == rows_b.tolist() and tf_a.tolist() == tf_b.tolist(), lexeme
        assert (rows_a.dtype, tf_a.dtype) == (rows_b.dtype, tf_b.dtype)


def test_postgres_wide_keyword_search_before_the_warm_up_reads_what_it_needs(pg_url, monkeypatch):
    """A restarted server's wide searches do not wait for the background warm-up (20-25 s at
    1M cells) or run the statement meanwhile: each reads its filter's admitted rows and its
    query's lexemes itself, in its own snapshot, and is answered from the arrays, bit for bit
    the statement's, for every wide filter, query, expiry interval and k; the warm-up never
    runs here. The warm-up started later skips the filters the searches loaded."""
    from datetime import datetime, timedelta, timezone

    from ampkit.store import store_from_url
    from ampkit.store._pg_keyword import WideKeywordIndex

    _write_pg_world(pg_url, 13)
    writer = store_from_url(pg_url)  # another server, below
    asked = []
    monkeypatch.setattr(WideKeywordIndex, "_request_warmup", lambda self: asked.append(1))
    store = store_from_url(pg_url)  # a restarted server
    store.open()
    try:
        now = datetime(2026, 1, 1, tzinfo=timezone.utc)
        for query in QUERIES:
            for flt in WIDE_FILTERS:
                for at in (None, now + timedelta(days=2), now + timedelta(days=9)):
                    timed = replace(flt, not_expired_at=at)
                    expected = pg_reference(store, query, timed, 1000)
                    for k in (1, 80):
                        served = store.wide_keywords.served
                        got = [(c.cell_id, c.score) for c in store.keyword_candidates(query, timed, k)]
                        assert got == expected[:k], (query, timed, k)
                        assert store.wide_keywords.served == served + 1
        index = store.wide_keywords
        assert asked and not index._generation.warm and (index.generations, index.patches) == (1, 0)
        writer.open()  # another server writes: the arrays loaded so far are patched, not dropped
        try:
            MemoryService(store=writer).create("ada", CellCreate(
                content={"text": "lena oslo piano quokka"}, identity={"owner_id": "ada"}, access_policy={"readable_by": ["team-*"]}))
        finally:
            writer.close()
        for flt in WIDE_FILTERS:
            got = [(c.cell_id, c.score) for c in store.keyword_candidates("lena oslo piano", flt, 80)]
            assert got == pg_reference(store, "lena oslo piano", flt, 80)
        assert (index.generations, index.patches) == (1, 1) and not index._generation.warm
        loaded = []
        monkeypatch.setattr(WideKeywordIndex, "_load_admitted",
                            staticmethod(lambda conn, where, params: loaded.append(where)))
        assert index._warm(index._generation) and index._generation.warm
        assert loaded == []  # every filter asked was loaded by its search
        for flt in WIDE_FILTERS:
            got = [(c.cell_id, c.score) for c in store.keyword_candidates("lena oslo quokka", flt, 80)]
            assert got == pg_reference(store, "lena oslo quokka", flt, 80)
    finally:
        store.close()


def test_postgres_wide_keyword_arrays_follow_every_servers_writes(pg_url):
    """Two servers on one database: the searcher's arrays are patched with the rows the other
    changed (a window, a policy, a status, or an operator's change of a filtered column by
    hand), and stay as they are when a read only counts an access (the database says which:
    `search_changes`, `search_change_rows`); each first search after a change is answered
    from the patched arrays, equal to the statement."""
    import psycopg

    from ampkit.store import store_from_url
    searcher, writer = store_from_url(pg_url), store_from_url(pg_url)
    searcher.open()
    writer.open()
    try:
        service = MemoryService(store=writer)
        created = _pg_world(service, random.Random(3), 120)
        flt = CellFilter(reader="team-lead")

        def search() -> list[tuple[str, float]]:
            expected = pg_reference(searcher, "quokka piano lena", flt, 80)
            served = searcher.wide_keywords.served
            assert [(c.cell_id, c.score) for c in searcher.keyword_candidates("quokka piano lena", flt, 80)] == expected
            assert searcher.wide_keywords.served == served + 1
            return expected

        searcher.keyword_candidates("quokka piano lena", flt, 80)  # the statement; the arrays load
        assert searcher.wide_keywords.wait_until_warm()
        before, generations, patches = search(), searcher.wide_keywords.generations, searcher.wide_keywords.patches
        shared = next(c for c in created if c.access_policy.readable_by == ["team-*"] and writer.get(c.id).lifecycle.status == "active")
        service.get("ada", shared.id) if shared.identity.owner_id == "ada" else service.get(shared.identity.owner_id, shared.id)
        assert search() == before and searcher.wide_keywords.patches == patches  # an access count: nothing to patch
        other = CellFilter(reader="team-y")  # first asked once the arrays are loaded: read by that search itself
        expected = pg_reference(searcher, "quokka piano lena", other, 80)
        served = searcher.wide_keywords.served
        assert [(c.cell_id, c.score) for c in searcher.keyword_candidates("quokka piano lena", other, 80)] == expected
        assert searcher.wide_keywords.served == served + 1
        new = service.create("ada", CellCreate(content={"text": "a quokka plays piano"}, identity={"owner_id": "ada"},
                                               access_policy={"readable_by": ["team-*"]}))
        assert searcher.vector_index_state() == {"keyword_warmup": "ready"}  # it does not know yet
        after = search()
        assert after != before and new.id in [cid for cid, _ in after]
        service.update("ada", new.id, CellPatch(access_policy={"readable_by": []}))
        assert new.id not in [cid for cid, _ in search()]
        with psycopg.connect(split_conninfo(pg_url), autocommit=True) as conn:  # an operator, by hand
            conn.execute("UPDATE cells SET public = TRUE WHERE id = %s", (new.id,))
        assert new.id in [cid for cid, _ in search()]
        assert (searcher.wide_keywords.generations, searcher.wide_keywords.patches) == (generations, patches + 3)
        with psycopg.connect(split_conninfo(pg_url), autocommit=True) as conn:  # every row: read afresh
            conn.execute("TRUNCATE cells CASCADE")
        assert searcher.keyword_candidates("quokka piano lena", flt, 80) == []
        assert searcher.wide_keywords.generations == generations + 1
    finally:
        searcher.close()
        writer.close()


@pytest.mark.parametrize("through", ["the same server", "another server"])
def test_postgres_wide_keyword_arrays_catch_up_with_an_import_in_the_background(pg_url, monkeypatch, through):
    """An import is patched into a server's wide keyword arrays in the background as its
    batches commit (here each batch: CATCH_UP_ROWS lowered), even when it changes more rows
    in all than PATCH_ROWS (past which a search would read the arrays afresh: ~20 s of slow
    wide searches after a 100,000-cell import at 1M): through the same server by its own
    commits' count (the look switched off), through another (stateless replicas) by the
    searcher's look at the database every CATCH_UP_LOOK_SECONDS (here shortened), which
    costs no patch while nothing changes. The search after the import neither patches nor
    starts afresh, and equals the statement."""
    import time

    from ampkit.store import _pg_keyword, store_from_url

    own = through == "the same server"
    monkeypatch.setattr(_pg_keyword, "CATCH_UP_ROWS", 20)
    monkeypatch.setattr(_pg_keyword, "CATCH_UP_LOOK_SECONDS", 3600.0 if own else 0.05)
    monkeypatch.setattr(_pg_keyword, "PATCH_ROWS", 60)
    searcher = store_from_url(pg_url)
    writer = searcher if own else store_from_url(pg_url)
    searcher.open()
    if not own:
        writer.open()
    try:
        service = MemoryService(store=writer)
        _pg_world(service, random.Random(5), 60)
        flt = CellFilter(reader="team-lead")
        searcher.keyword_candidates("quokka piano lena", flt, 80)  # the arrays load
        assert searcher.wide_keywords.wait_until_warm()
        generations = searcher.wide_keywords.generations
        if not own:
            deadline = time.monotonic() + 20
            while searcher.wide_keywords.looks < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert searcher.wide_keywords.patches == 0  # looking costs no patch while nothing changes
        for batch in range(4):  # 4 x 25 cells: more changed rows than PATCH_ROWS in all
            patches = searcher.wide_keywords.patches
            service.create_many("ada", [CellCreate(content={"text": f"quokka lena piano lesson {batch} {i}"},
                                                   identity={"owner_id": "ada", "session_id": f"import-{batch}"},
                                                   access_policy={"readable_by": ["team-*"]}) for i in range(25)])
            deadline = time.monotonic() + 20
            while searcher.wide_keywords.patches == patches and time.monotonic() < deadline:
                time.sleep(0.01)
            assert searcher.wide_keywords.patches > patches  # patched in the background, no search asking
        patches = searcher.wide_keywords.patches
        expected = pg_reference(searcher, "quokka piano lena", flt, 80)
        assert [(c.cell_id, c.score) for c in searcher.keyword_candidates("quokka piano lena", flt, 80)] == expected
        assert any((writer.get(cid).identity.session_id or "").startswith("import-") for cid, _ in expected)
        assert (searcher.wide_keywords.generations, searcher.wide_keywords.patches) == (generations, patches)
    finally:
        searcher.close()
        if not own:
            writer.close()


def test_patches_take_an_imports_new_rows_into_the_room_after_the_arrays():
    """A patch whose changed rows all come after a lexeme's last row (an import's new
    windows) appends them in room kept after the arrays rather than copying every touched
    lexeme's rows (~170 MB at 1M); the older generation's arrays, views of the same buffer,
    stay as they were; the cache counts the whole buffer; any other change copies. A filter's
    admitted rows likewise (2.5M rows for a reader of everything, copied by every wide search
    during an import)."""
    from ampkit.store._pg_keyword import _Admitted, _held_arrays, _patched_admitted, _patched_postings

    def rows(*values: int) -> np.ndarray:
        return np.array(values, dtype=np.int64)

    loaded = (np.array([1, 5, 9], dtype=np.int32), np.array([1, 2, 1], dtype=np.uint8))
    first = _patched_postings(loaded, rows(10, 11, 12), (rows(10, 12), rows(3, 1)))
    assert (first[0].tolist(), first[1].tolist()) == ([1, 5, 9, 10, 12], [1, 2, 1, 3, 1])
    assert (first[0].dtype, first[1].dtype) == (np.int32, np.uint8)
    second = _patched_postings(first, rows(13, 14), (rows(14), rows(2)))
    assert (second[0].tolist(), second[1].tolist()) == ([1, 5, 9, 10, 12, 14], [1, 2, 1, 3, 1, 2])
    assert np.shares_memory(second[0], first[0]) and np.shares_memory(second[1], first[1])  # no copy
    assert (first[0].tolist(), first[1].tolist()) == ([1, 5, 9, 10, 12], [1, 2, 1, 3, 1])  # the older generation's
    assert sum(a.nbytes for a in _held_arrays(second)) > second[0].nbytes + second[1].nbytes
    untouched = _patched_postings(second, rows(15), None)  # no new row holds the lexeme: the same arrays
    assert untouched[0] is second[0] and untouched[1] is second[1]
    rewritten = _patched_postings(second, rows(5, 15), (rows(5, 15), rows(4, 1)))  # an old row too: replaced
    assert (rewritten[0].tolist(), rewritten[1].tolist()) == ([1, 5, 9, 10, 12, 14, 15], [1, 4, 1, 3, 1, 2, 1])
    assert not np.shares_memory(rewritten[0], second[0])
    wide = _patched_postings(second, rows(2**31 + 1), (rows(2**31 + 1), rows(300)))  # past int32 / uint8: widened
    assert (wide[0][-1], wide[1][-1]) == (2**31 + 1, 300) and second[0].tolist() == [1, 5, 9, 10, 12, 14]

    def admitted(seqs: list[int], lengths: list[int], expiring: list[int], expiry: list[int]) -> _Admitted:
        return _Admitted.of(np.array(seqs, dtype=np.int32), np.array(lengths, dtype=np.int32),
                            np.array(expiring, dtype=np.int32), rows(*expiry), ["reader"])

    held = admitted([1, 5, 9], [7, 8, 9], [5], [500])
    grown = _patched_admitted(held, rows(10, 11, 12), admitted([10, 12], [3, 4], [12], [100]))
    again = _patched_admitted(grown, rows(13), admitted([13], [6], [], []))
    assert (again.seqs.tolist(), again.lengths.tolist()) == ([1, 5, 9, 10, 12, 13], [7, 8, 9, 3, 4, 6])
    assert (again.expiring.tolist(), again.expiry.tolist(), again.times) == ([12, 5], [100, 500], [100, 500])
    assert np.shares_memory(again.seqs, grown.seqs) and np.shares_memory(again.lengths, grown.lengths)
    assert (grown.seqs.tolist(), grown.lengths.tolist()) == ([1, 5, 9, 10, 12], [7, 8, 9, 3, 4])
    assert held.seqs.tolist() == [1, 5, 9]
    assert _patched_admitted(again, rows(14), admitted([], [], [], [])) is again  # admits none of them
    dropped = _patched_admitted(again, rows(5, 14), admitted([14], [2], [], []))  # an old row left: copied
    assert (dropped.seqs.tolist(), dropped.expiring.tolist()) == ([1, 9, 10, 12, 13, 14], [12])
    assert not np.shares_memory(dropped.seqs, again.seqs) and again.seqs.tolist() == [1, 5, 9, 10, 12, 13]


def test_postgres_patched_keyword_arrays_equal_the_statement_after_every_kind_of_write(pg_url, monkeypatch):
    """Random writes of every kind by another server (creates into old and new sessions,
    text rewrites, policy, status and metadata changes, expiries, supersessions,
    archives, deletes), each followed by searches of every wide filter at times on either
    side of the expiries: each answer, bit for bit, the one statement's, from arrays patched
    with the changed rows (never read afresh); a change of more rows than `PATCH_ROWS` reads
    them afresh."""
    from datetime import datetime, timedelta, timezone

    import psycopg

    from ampkit.store import _pg_keyword, store_from_url
    searcher, writer = store_from_url(pg_url), store_from_url(pg_url)
    searcher.open()
    writer.open()
    try:
        rng = random.Random(17)
        service = MemoryService(store=writer)
        cells = _pg_world(service, rng, 160)
        now = datetime(2026, 1, 1, tzinfo=timezone.utc)
        searcher.keyword_candidates("piano", CellFilter(reader="team-lead"), 10)
        assert searcher.wide_keywords.wait_until_warm()
        generations = searcher.wide_keywords.generations
        queries = ["lena oslo", "piano dog tea budget garden the", "quokka window-seats 서울"]

        def check(step: str) -> None:
            for flt in WIDE_FILTERS:
                for at in (None, now + timedelta(days=2)):  # (on either side of the expiries set below)
                    timed = replace(flt, not_expired_at=at)
                    for query in queries:
                        expected = pg_reference(searcher, query, timed, 60)
                        got = [(c.cell_id, c.score) for c in searcher.keyword_candidates(query, timed, 60)]
                        assert got == expected, (step, query, timed)

        check("loaded")
        served = searcher.wide_keywords.served
        for step in range(16):  # each kind of write twice
            live = [c for c in cells if writer.get(c.id) is not None and writer.get(c.id).lifecycle.status == "active"]
            c = rng.choice(live)
            owner = c.identity.owner_id
            kind = step % 8
            if kind == 0:
                cells.append(service.create(owner, CellCreate(
                    content={"text": "quokka " + " ".join(rng.choice(WORDS) for _ in range(4))},
                    identity={"owner_id": owner, "session_id": c.identity.session_id},
                    access_policy=rng.choice([{}, {"readable_by": ["team-*"]}, {"public": True}]))))
            elif kind == 1:
                service.update(owner, c.id, CellPatch(content={"text": "window-seats the lena " * rng.randint(1, 3)}))
            elif kind == 2:
                service.update(owner, c.id, CellPatch(access_policy=rng.choice(
                    [{"readable_by": ["team-*"]}, {"readable_by": []}, {"readable_by": ["eve"]}, {"public": True}])))
            elif kind == 3:
                service.update(owner, c.id, CellPatch(lifecycle={"status": "archived"}))
            elif kind == 4:
                service.update(owner, c.id, CellPatch(lifecycle={"status": "archived"}))
                service.delete(owner, c.id)
            elif kind == 5:
                service.update(owner, c.id, CellPatch(lifecycle={"expires_at": (now + timedelta(days=1)).isoformat()}))
            elif kind == 6:
                service.update(owner, c.id, CellPatch(content={"metadata": {"topic": rng.choice(["x", "y"])}}))
            else:
                cells.append(service.create(owner, CellCreate(
                    content={"text": "a newer piano lena"}, identity={"owner_id": owner, "session_id": c.identity.session_id},
                    access_policy={"readable_by": ["team-*"]}, supersedes=c.id)))
            check(f"step {step} kind {kind}")
        with psycopg.connect(split_conninfo(pg_url), autocommit=True) as conn:  # rows removed (as a purge does)
            conn.execute("DELETE FROM cells WHERE id = ANY(%s)", ([c.id for c in cells[:5]],))
        check("removed")
        assert searcher.wide_keywords.generations == generations  # patched every time, never read afresh
        assert searcher.wide_keywords.patches >= 14  # (a metadata value set to what it was changes nothing)
        assert searcher.wide_keywords.served - served == 17 * len(WIDE_FILTERS) * 2 * len(queries)
        monkeypatch.setattr(_pg_keyword, "PATCH_ROWS", 3)
        service.create_many("ada", [CellCreate(content={"text": f"piano {i}"}, identity={"owner_id": "ada", "session_id": "bulk"})
                                    for i in range(4)])
        check("bulk")
        assert searcher.wide_keywords.generations == generations + 1
    finally:
        searcher.close()
        writer.close()


def test_postgres_warm_up_loads_nothing_into_arrays_the_database_has_moved_past(pg_url):
    """The background warm-up reads a generation's missing filters and lexemes only in a
    snapshot equal to the anchor's: after another server's write it loads nothing (the next
    search patches the arrays, and then the filter is read in that search's snapshot)."""
    from ampkit.store import store_from_url
    from ampkit.store.sql import POSTGRES, compile_filter
    searcher, writer = store_from_url(pg_url), store_from_url(pg_url)
    searcher.open()
    writer.open()
    try:
        service = MemoryService(store=writer)
        _pg_world(service, random.Random(4), 60)
        index = searcher.wide_keywords
        searcher.keyword_candidates("piano", CellFilter(reader="team-lead"), 10)
        assert index.wait_until_warm()
        searcher.keyword_candidates("piano", CellFilter(reader="team-lead"), 10)  # the anchor: now
        generation = index._generation
        service.create("ada", CellCreate(content={"text": "piano quokka"}, identity={"owner_id": "ada"},
                                         access_policy={"readable_by": ["team-*"]}))
        eve = CellFilter(reader="eve")  # a filter asked lately, in a generation the warm-up has not finished
        where, params = compile_filter(eve, POSTGRES)
        index._recent[(where, repr(params))] = params
        generation.warm, lexemes = False, set(generation.postings)
        assert index._warm(generation) is False and not generation.admitted.get((where, repr(params)))
        assert not generation.warm and set(generation.postings) == lexemes
        expected = pg_reference(searcher, "piano quokka", eve, 20)
        assert [(c.cell_id, c.score) for c in searcher.keyword_candidates("piano quokka", eve, 20)] == expected
    finally:
        searcher.close()
        writer.close()


def split_conninfo(url: str) -> str:
    from ampkit.store._pg_url import split_url
    return split_url(url)[0]


def test_postgres_search_changes_are_pruned_and_older_arrays_start_afresh(pg_url):
    """`PRUNE` removes the log rows of transactions that ended before a horizon recorded at
    least PRUNE_AFTER ago (later rows stay), and a server whose arrays were read before
    what it removed starts afresh instead of trusting a log with a hole in it."""
    import psycopg

    from ampkit.store import store_from_url
    from ampkit.store._pg_keyword import PRUNE
    store = store_from_url(pg_url)
    store.open()
    try:
        service = MemoryService(store=store)
        flt = CellFilter(reader="team-lead")
        with psycopg.connect(split_conninfo(pg_url), autocommit=True) as conn:
            def log() -> int:
                return conn.execute("SELECT COUNT(*) FROM search_changes").fetchone()[0]

            def age_horizon() -> None:
                conn.execute("UPDATE search_changes_pruned SET at = now() - interval '2 hours'")

            service.create("ada", CellCreate(content={"text": "first piano"}, identity={"owner_id": "ada"},
                                             access_policy={"readable_by": ["team-*"]}))
            assert log() == 1
            conn.execute(PRUNE)  # the horizon is recent (the migration's): nothing goes
            assert log() == 1
            age_horizon()
            conn.execute(PRUNE)  # the migration's horizon is older than this row: it stays; a new horizon
            assert log() == 1
            store.keyword_candidates("piano", flt, 10)
            assert store.wide_keywords.wait_until_warm()
            generations = store.wide_keywords.generations
            store.keyword_candidates("piano", flt, 10)
            assert store.wide_keywords.generations == generations  # nothing changed, nothing pruned
            service.create("ada", CellCreate(content={"text": "second"}, identity={"owner_id": "ada"}))
            age_horizon()
            conn.execute(PRUNE)
            assert log() == 1  # the first row went (before the horizon), the second stays
            conn.execute("DELETE FROM search_changes")  # as if the second had been pruned too
            conn.execute("UPDATE search_changes_pruned SET deleted_below = pg_snapshot_xmin(pg_current_snapshot())")
            store.keyword_candidates("piano", flt, 10)
            assert store.wide_keywords.generations == generations + 1
    finally:
        store.close()


def _sql_admitted(path: str, flt: CellFilter) -> list[int]:
    where, params = filter_sql(flt)
    with sqlite3.connect(path) as conn:
        return [r for (r,) in conn.execute(
            f"SELECT c.rowid FROM cells c JOIN cell_context x ON x.rowid = c.rowid WHERE {where} ORDER BY c.rowid", params)]


def test_caches_follow_this_process_writes_row_by_row(corpus, tmp_path):
    """A reader-wide filter's admitted rows come from the in-memory access snapshot, and term
    rows from the postings cache; this process's own commits patch both row by row (the
    snapshot is not reloaded). After every kind of write (create, new text, new readers,
    public, archive, delete, purge, expiry), each filter's admitted rows equal the SQL
    filter's and every answer equals the straightforward BM25, bit for bit."""
    import shutil
    from datetime import datetime, timezone

    path = str(tmp_path / "copy.db")
    shutil.copy(corpus, path)
    store = SQLiteStore(path, keyword_scan_max=0)
    store.open()
    rng = random.Random(7)
    now = datetime.now(timezone.utc)
    service = MemoryService(store=store, allow_clock_override=True)
    try:
        _, _, check = _wide_world(path, store)
        check()
        snapshot = store.access.snapshot
        generation = snapshot.generation
        _write_every_kind(service, rng, 24, now, check)
        assert store.access.snapshot is snapshot and snapshot.generation > generation  # patched, never reloaded
    finally:
        store.close()


def _wide_world(path: str, searcher: SQLiteStore) -> tuple[list[CellFilter], list[str], Callable[[], None]]:
    """The reader-wide filters and queries the row-by-row tests check, and the check: every
    admitted set equals the SQL filter's, every answer the straightforward BM25's."""
    from datetime import datetime, timedelta, timezone

    now = datetime.now(timezone.utc)
    wide = [f for f in FILTERS if f.owner_id is None] + [CellFilter(reader="eve", not_expired_at=now + timedelta(days=2))]
    queries = ["lena oslo", "quokka piano", "dark-roast march the", "coffee quokka budget"]

    def check() -> None:
        for flt in wide:
            rowids, _ = searcher.access.load().admitted(flt)
            assert rowids.tolist() == _sql_admitted(path, flt), flt
            for query in queries:
                got = [(c.cell_id, c.score) for c in searcher.keyword_candidates(query, flt, 30)]
                assert got == reference(path, query, flt, 30), (query, flt)

    return wide, queries, check


def _write_every_kind(service: MemoryService, rng: random.Random, steps: int, now: Any,
                      check: Callable[[], None]) -> None:
    """`steps` writes cycling through every kind (create, new text, new readers, public,
    archive, delete, purge, a cell that expires), `check()` after each."""
    from datetime import timedelta

    ids: list[tuple[str, str]] = []
    deleted: list[str] = []
    for step in range(steps):
        owner = rng.choice(["ada", "bob", "cy", "eve"])
        kind = step % 8 if ids else 0
        if kind in (0, 7):
            text = "quokka " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
            policy = rng.choice([{}, {"readable_by": ["team-*"]}, {"readable_by": ["eve", "t?am-lead"]}, {"public": True}])
            lifecycle = {"expires_at": (now + timedelta(days=1)).isoformat()} if kind == 7 else {}
            cell = service.create(owner, CellCreate(content={"text": text}, access_policy=policy, lifecycle=lifecycle,
                                                    identity={"owner_id": owner, "session_id": f"{owner}-s{rng.randint(0, 6)}"}))
            ids.append((owner, cell.id))
        else:
            owner, cid = rng.choice(ids)
            if kind == 1:
                service.update(owner, cid, CellPatch(content={"text": "quokka coffee " + rng.choice(WORDS)}))
            elif kind == 2:
                service.update(owner, cid, CellPatch(access_policy={"readable_by": [rng.choice(["team-*", "eve", "nobody"])]}))
            elif kind == 3:
                service.update(owner, cid, CellPatch(access_policy={"public": rng.random() < 0.5}))
            elif kind == 4:
                service.update(owner, cid, CellPatch(lifecycle={"status": "archived"}))
            elif kind == 5:
                service.update(owner, cid, CellPatch(lifecycle={"status": "archived"}))
                service.delete(owner, cid)
                ids.remove((owner, cid))
                deleted.append(cid)
            else:
                assert service.purge("admin", deleted, as_of=now + timedelta(days=400)).purged == deleted
                deleted.clear()
        check()


def test_another_process_writes_are_patched_in_not_reloaded(corpus, tmp_path):
    """A second store on the same file (another process) creates, rewrites, re-permissions,
    archives, deletes and purges cells; the first store's next reader-wide search takes those
    rows from the change log (migration 11) into its access snapshot and term rows, without
    loading either again, and answers as the straightforward BM25 over the file (bit for bit),
    as a store opened afresh does."""
    import shutil
    from datetime import datetime, timezone

    path = str(tmp_path / "copy.db")
    shutil.copy(corpus, path)
    searcher, other = SQLiteStore(path, keyword_scan_max=0), SQLiteStore(path)
    searcher.open()
    other.open()
    rng = random.Random(5)
    now = datetime.now(timezone.utc)
    service = MemoryService(store=other, allow_clock_override=True)
    try:
        _, queries, check = _wide_world(path, searcher)
        check()
        snapshot, postings, generation = searcher.access.snapshot, searcher.keyword.postings, searcher.access.snapshot.generation
        _write_every_kind(service, rng, 16, now, check)
        assert searcher.access.snapshot is snapshot and snapshot.generation > generation  # patched, never reloaded
        assert searcher.keyword.postings is postings
        fresh = SQLiteStore(path, keyword_scan_max=0)
        fresh.open()
        try:
            for flt in FILTERS:
                if flt.owner_id is None:
                    for query in queries:
                        assert [(c.cell_id, c.score) for c in searcher.keyword_candidates(query, flt, 50)] == \
                               [(c.cell_id, c.score) for c in fresh.keyword_candidates(query, flt, 50)], (query, flt)
        finally:
            fresh.close()
    finally:
        searcher.close()
        other.close()


def test_caches_load_afresh_when_the_change_log_cannot_say(corpus, tmp_path, monkeypatch):
    """Another process wrote more rows than a patch takes (or the log was pruned past what
    this process saw): the caches load again, and answers stay exact."""
    import shutil

    import ampkit.store.sqlite_changes as sqlite_changes

    path = str(tmp_path / "copy.db")
    shutil.copy(corpus, path)
    searcher, other = SQLiteStore(path, keyword_scan_max=0), SQLiteStore(path)
    searcher.open()
    other.open()
    try:
        _, _, check = _wide_world(path, searcher)
        check()
        snapshot = searcher.access.snapshot
        monkeypatch.setattr(sqlite_changes, "CHANGE_LOG_PATCH_MAX", 3)
        service = MemoryService(store=other)
        for i in range(4):
            service.create("ada", CellCreate(content={"text": f"quokka piano {i}"}, identity={"owner_id": "ada"},
                                             access_policy={"readable_by": ["team-*"]}))
        other.index_pending_windows()  # the writer indexes its own new windows: the searcher only reads
        check()
        assert searcher.access.snapshot is not snapshot  # loaded again
        snapshot = searcher.access.snapshot
        service.create("cy", CellCreate(content={"text": "quokka oslo"}, identity={"owner_id": "cy"}))
        other.index_pending_windows()
        # as if pruned past what this process saw (the pruning keeps the newest entry)
        other._require_writer().execute("DELETE FROM change_log WHERE seq < (SELECT MAX(seq) FROM change_log)")
        service.create("bob", CellCreate(content={"text": "quokka lena"}, identity={"owner_id": "bob"}, access_policy={"public": True}))
        other.index_pending_windows()
        check()
        assert searcher.access.snapshot is not snapshot
    finally:
        searcher.close()
        other.close()


def test_change_log_keeps_its_last_million_entries(tmp_path):
    """Migration 11's pruning: at every 4096th entry, entries a million or more behind go."""
    store = SQLiteStore(str(tmp_path / "log.db"))
    store.open()
    try:
        conn = store._require_writer()
        conn.executemany("INSERT INTO change_log(seq, rid) VALUES (?, 7)", [(1,), (4095,), (4097 + 1_000_000,)])
        assert [s for (s,) in conn.execute("SELECT seq FROM change_log")] == [1, 4095, 1_004_097]
        conn.execute("INSERT INTO change_log(seq, rid) VALUES (?, 7)", (4096 * 245,))  # 1,003,520: prunes <= 3,520
        assert [s for (s,) in conn.execute("SELECT seq FROM change_log ORDER BY seq")] == [4095, 1_003_520, 1_004_097]
    finally:
        store.close()


def test_a_word_spelled_like_an_owner_token_counts_only_its_text_occurrences(tmp_path):
    """Term rows are read without fts5vocab's column test, except for a word spelled like
    an owner token (the FTS `owner` column holds those): its owner-column occurrences must
    not count as text."""
    from ampkit.textindex import owner_token

    path = str(tmp_path / "tok.db")
    store = SQLiteStore(path, keyword_scan_max=0)
    store.open()
    try:
        service = MemoryService(store=store)
        token = owner_token("bob")
        for owner, text in [("bob", "piano lessons"), ("bob", "piano again"), ("ada", f"the word {token} {token}"),
                            ("ada", "piano")]:
            service.create(owner, CellCreate(content={"text": text}, identity={"owner_id": owner}, access_policy={"public": True}))
        flt = CellFilter(reader="cy")
        for query in (token, f"piano {token}"):
            want = reference(path, query, flt, 10)
            assert want and [(c.cell_id, c.score) for c in store.keyword_candidates(query, flt, 10)] == want
    finally:
        store.close()


def test_term_rows_warmed_at_open_answer_as_loaded_ones(corpus, expected):
    """Past `warm_terms_min_cells`, open() reads the most common words' term rows in the
    background; searches answering from them give the same bits."""
    store = SQLiteStore(corpus, keyword_scan_max=0, warm_terms_min_cells=0)
    store.open()
    try:
        assert store.wait_for_term_warmup(60)
        assert store.keyword.postings is not None and len(store.keyword.postings[1].items) > 10
        assert store.access.snapshot is not None  # the access snapshot is loaded first
        for query in QUERIES:
            for i, flt in enumerate(FILTERS):
                got = [(c.cell_id, c.score) for c in store.keyword_candidates(query, flt, 80)]
                assert got == expected[query, i][:80], (query, flt)
    finally:
        store.close()
    cold = SQLiteStore(corpus, keyword_scan_max=0)  # a small store: nothing read ahead
    cold.open()
    try:
        assert cold.wait_for_term_warmup(60) and cold.keyword.postings is None
    finally:
        cold.close()


def test_a_store_grown_past_the_threshold_while_open_warms_as_a_reopened_one(corpus, tmp_path, monkeypatch):
    """open() reads the common words' term rows ahead only when the store is already past
    `warm_terms_min_cells`. A store that grows past it by writes while open (how a server
    reaches a million cells) has its next reader-wide search start the same background
    warm-up, `/health` saying none (not read ahead) -> warming -> ready; so do a term cache
    started afresh (its change log overflowed) and a store grown WARM_TERMS_REGROWTH times
    over since. Writes alone never start one. Answers equal a freshly opened store's and
    the straightforward BM25's, bit for bit."""
    import shutil

    import ampkit.store.sqlite_keyword as sqlite_keyword
    from ampkit.store._bm25 import PostingsCache

    path = str(tmp_path / "copy.db")
    shutil.copy(corpus, path)
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT MAX(rowid) FROM cells").fetchone()[0]
    store = SQLiteStore(path, keyword_scan_max=0, warm_terms_min_cells=rows + 12)
    store.open()
    service = MemoryService(store=store)
    rng = random.Random(3)
    flt = CellFilter(reader="team-lead")

    def state() -> str:
        return store.vector_index_state()["keyword_warmup"]

    def grow(count: int) -> None:
        for _ in range(count):
            owner = rng.choice(["ada", "bob", "cy"])
            text = "quokka " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7)))
            service.create(owner, CellCreate(content={"text": text}, identity={"owner_id": owner},
                                             access_policy={"readable_by": ["team-*"]}))

    def cached_terms() -> set[str]:
        return {key for key in store.keyword.postings[1].items if key.startswith("t:")}

    def warm_through_a_search() -> None:
        store.keyword.warm_lock.acquire()  # hold the warm-up the search starts at its first step
        try:
            store.keyword_candidates("lena oslo", flt, 10)
            assert state() == "warming"
        finally:
            store.keyword.warm_lock.release()
        assert store.wait_for_term_warmup(60) and state() == "ready"
        assert len(cached_terms()) > 15  # the common words, not only the ones asked for

    try:
        assert store.wait_for_term_warmup(60) and store.keyword.postings is None and state() == "ready"  # small: nothing read
        store.keyword_candidates("lena oslo", flt, 10)
        assert cached_terms() == {"t:lena", "t:oslo"} and state() == "ready"
        grow(20)  # past the threshold, by writes
        assert state() == "none" and store.wait_for_term_warmup(0) and cached_terms() == {"t:lena", "t:oslo"}
        warm_through_a_search()

        monkeypatch.setattr(PostingsCache, "MAX_LOG_ROWS", 4)  # the next writes overflow the term cache's log
        grow(3)
        assert state() == "none" and len(cached_terms()) <= 4
        monkeypatch.setattr(PostingsCache, "MAX_LOG_ROWS", 200_000)
        warm_through_a_search()

        monkeypatch.setattr(sqlite_keyword, "WARM_TERMS_REGROWTH", 1.02)
        grow(8)  # grown 2% over since the last warm-up
        assert state() == "none"
        warm_through_a_search()

        _, queries, check = _wide_world(path, store)
        check()
        fresh = SQLiteStore(path, keyword_scan_max=0, warm_terms_min_cells=None)
        fresh.open()
        try:
            for wide in (f for f in FILTERS if f.owner_id is None):
                for query in queries + QUERIES:
                    assert [(c.cell_id, c.score) for c in store.keyword_candidates(query, wide, 50)] == \
                           [(c.cell_id, c.score) for c in fresh.keyword_candidates(query, wide, 50)], (query, wide)
        finally:
            fresh.close()
    finally:
        store.close()


@pytest.mark.parametrize("seed", range(6))
def test_top_k_over_many_scores_keeps_the_plain_answer(seed):
    """`top_k` past a few thousand scores partitions only those past a floor (the k-th best
    block maximum): the same indices as taking every positive score, ties at the k-th kept."""
    import numpy as np

    from ampkit.store._bm25 import top_k

    rng = np.random.default_rng(seed)
    n = int(rng.integers(70_000, 300_000))
    scores = np.round(rng.random(n) * rng.choice([3, 50, 10_000]), 1)  # many ties
    scores[rng.random(n) < rng.choice([0.1, 0.9, 0.9999])] = 0.0
    for k in (1, 10, 80):
        positive = np.flatnonzero(scores > 0)
        if positive.size <= k:
            want = positive
        else:
            kth = np.sort(scores[positive])[::-1][k - 1]
            want = positive[scores[positive] >= kth]
        assert top_k(scores, k).tolist() == want.tolist()


def test_opening_an_open_store_keeps_its_connections_and_warm_ups(corpus):
    """`ampkit serve` opens the store, then the app opens it again at startup: the second
    open() changes nothing (a second writer and second background warm-ups raced the first)."""
    store = SQLiteStore(corpus)
    store.open()
    try:
        writer, started = store._writer, store.scheduler.started
        store.open()
        assert store._writer is writer and store.scheduler.started == started
    finally:
        store.close()


def test_each_commit_reads_the_change_log_by_its_key_not_by_a_scan(tmp_path):
    """Every commit reads the log's bounds and the entries past what the caches saw: each
    a step of the primary key (a scan of a million-entry log at every commit otherwise; the
    bounds as MIN and MAX in one query were one)."""
    from ampkit.store.sqlite_changes import LOG_BOUNDS as _LOG_BOUNDS, LOG_SINCE as _LOG_SINCE

    store = SQLiteStore(str(tmp_path / "plan.db"))
    store.open()
    try:
        conn = store._require_writer()
        for sql, params in ((_LOG_BOUNDS, ()), (_LOG_SINCE, (1,))):
            plan = [row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
            assert not any(step.startswith("SCAN change_log") for step in plan), plan
    finally:
        store.close()


def test_cached_term_counts_widen_when_a_patched_row_needs_it():
    """Term rows keep their counts in the smallest type (one byte for most words); a changed
    window counting a word more often than that type holds widens it, losing nothing."""
    import numpy as np

    from ampkit.store._bm25 import PostingsCache, doc_counts

    rowids, tf = doc_counts(np.array([3, 3, 7, 9], dtype=np.int64))
    assert tf.dtype == np.uint8 and tf.tolist() == [2, 1, 1]
    cache = PostingsCache(1 << 20)
    cache.get("t:w", lambda: (rowids, tf))
    cache.record({5: {"w": 300}, 7: None})
    rows, counts = cache.get("t:w", lambda: pytest.fail("patched, not loaded"))
    assert rows.tolist() == [3, 5, 9] and counts.tolist() == [2, 300, 1] and counts.dtype == np.uint16
    assert doc_counts(np.repeat(np.array([4], dtype=np.int64), 70_000))[1].tolist() == [70_000]


def test_health_says_when_the_keyword_warm_up_is_done(corpus):
    """`/health`'s vector_index.keyword_warmup (the store's `vector_index_state`): warming
    while open()'s background reads run, ready after."""
    store = SQLiteStore(corpus, keyword_scan_max=0, warm_terms_min_cells=0)
    store.keyword.warm_lock.acquire()  # hold the warm-up at its first step
    store.open()
    try:
        assert store.vector_index_state()["keyword_warmup"] == "warming"
        store.keyword.warm_lock.release()
        assert store.wait_for_term_warmup(60)
        assert store.vector_index_state()["keyword_warmup"] == "ready"
    finally:
        if store.keyword.warm_lock.locked():
            store.keyword.warm_lock.release()
        store.close()


def test_a_warming_store_loads_its_access_snapshot_before_its_vectors(corpus):
    """open() of a store past `warm_terms_min_cells`: the vector warm-up, and the embedding
    worker's start-up scan (`wait_for_access_snapshot`), start once the access snapshot is
    loaded, which the first reader-wide search waits for (on two cores they had shared them)."""
    store = SQLiteStore(corpus, keyword_scan_max=0, warm_terms_min_cells=0)
    store.access.warm_lock.acquire()  # hold the warm-up at the snapshot's load
    store.open()
    try:
        assert not store.wait_for_access_snapshot(0.3)
        assert not store.vectors.ready.is_set() and store.access.snapshot is None
        store.access.warm_lock.release()
        assert store.wait_for_access_snapshot(60) and store.access.snapshot is not None
        store.wait_for_vector_index(60)
        assert store.vectors.ready.is_set() and store.wait_for_term_warmup(60)
    finally:
        if store.access.warm_lock.locked():
            store.access.warm_lock.release()
        store.close()
    small = SQLiteStore(corpus, keyword_scan_max=0)  # nothing to load ahead: nothing waits
    small.open()
    try:
        assert small.wait_for_access_snapshot(60) and small.access.snapshot is None
        small.wait_for_vector_index(60)
        assert small.vectors.ready.is_set()
    finally:
        small.close()


@pytest.mark.parametrize("seed", range(8))
def test_patched_term_rows_equal_rows_loaded_afresh(seed, monkeypatch):
    """The term cache's patches (`PostingsCache`): after any run of commits (new rows, rows
    changed again within and across commits, windows gone; single rows that share the log's
    open entry and large commits of their own; the log starting afresh), a cached word's rows
    and counts equal those read afresh from the windows as they are now, whichever commits
    it had already seen."""
    import numpy as np

    from ampkit.store._bm25 import PostingsCache, doc_counts

    monkeypatch.setattr(PostingsCache, "TAIL_ROWS", 6)
    monkeypatch.setattr(PostingsCache, "MAX_LOG_ROWS", 400)
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(12)]
    windows: dict[int, dict[str, int]] = {}  # the store: rowid -> its window's term counts
    cache = PostingsCache(1 << 20)

    def afresh(word: str):
        held = [row for row in sorted(windows) for _ in range(windows[row].get(word, 0))]
        return doc_counts(np.array(held, dtype=np.int64))

    def commit(rows: list[int]) -> None:
        changed: dict = {}
        for row in rows:
            if row in windows and rng.random() < 0.2:
                del windows[row]
                changed[row] = None
            else:
                windows[row] = {w: rng.choice([1, 1, 2, 300]) for w in rng.sample(words, rng.randint(1, 5))}
                changed[row] = dict(windows[row])
        cache.record(changed)

    shared = False
    for step in range(150):
        shared = shared or any(entry.last > entry.first for entry in cache.log)
        top = max(windows, default=0)
        size = rng.choice([1, 1, 2, 3, 9])
        commit([rng.randint(1, top + 3) if rng.random() < 0.5 else top + 1 + i for i in range(size)])
        for word in rng.sample(words, 3):
            rows, counts = cache.get("t:" + word, lambda: afresh(word))
            want_rows, want_counts = afresh(word)
            assert rows.tolist() == want_rows.tolist() and counts.tolist() == want_counts.tolist(), (step, word)
    assert cache.epoch >= 1 and shared  # it started afresh, and commits shared log entries
