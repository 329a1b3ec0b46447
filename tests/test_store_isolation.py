"""Non-interference on the store side (issue 10), through a real server on SQLite and PostgreSQL.

The reproductions of the issue, each a regression test:
- keyword windows: a cell's keyword entry held its session neighbours' text whatever their
  access or status, so an agent with no grants could plant a cell in a victim's session and
  probe the private turns around it with `explain` (also after the victim deleted them, and by
  PATCHing a cell it may only write into a session it planted in);
- glob patterns: one `readable_by` pattern outside the grammar broke every other agent's
  search, list and export on PostgreSQL, and made the SQL filter and `can_read` disagree;
- BM25 statistics: a caller's scores moved when cells it cannot read gained a word.
Plus the one glob dialect itself: the matcher, the SQLite GLOB and the PostgreSQL regular
expression, all compiled from one parsed pattern, agree on every pattern the grammar admits.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from ampkit import glob
from ampkit.access import can_read
from ampkit.store import CellFilter, store_from_url
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import TLS, AppServer, examples, glob_witnesses


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request, tmp_path_factory) -> Iterator[AppServer]:
    tmp = tmp_path_factory.mktemp(f"isolation-{request.param}")
    if request.param == "sqlite":
        url = f"sqlite:///{tmp}/memory.db"
    else:
        pg = request.getfixturevalue("pg_server")
        url = pg.create_database(f"isolation_{os.getpid()}_{uuid.uuid4().hex[:8]}", template="ampkit_template")
    proc = AppServer(url, args=["--lifecycle-interval", "0"], log_path=tmp / "server.log")
    proc.start()
    yield proc
    proc.stop()


def call(server: AppServer, agent: str, method: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.request(method, server.base_url + path, json=body, headers={"X-AMP-Agent-ID": agent}, timeout=30, verify=TLS)


def create(server: AppServer, agent: str, text: str, owner: str, session: str | None = None, **policy: Any) -> str:
    body: dict[str, Any] = {"content": {"text": text}, "identity": {"owner_id": owner}}
    if session is not None:
        body["identity"]["session_id"] = session
    if policy:
        body["access_policy"] = policy
    r = call(server, agent, "POST", "/memories", body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def keyword_hits(server: AppServer, agent: str, query: str, owner: str | None = None) -> dict[str, dict]:
    """cell id -> explain, for the hits the keyword leg found (the dense leg finds anything)."""
    body: dict[str, Any] = {"query": query, "explain": True, "limit": 100}
    if owner is not None:
        body["owner_id"] = owner
    r = call(server, agent, "POST", "/memories/search", body)
    assert r.status_code == 200, r.text
    return {hit["id"]: hit["explain"] for hit in r.json()["results"] if "keyword_rank" in hit["explain"]}


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ------------------------------------------------------------------ hole 1: keyword windows
def test_planted_cell_learns_nothing_of_private_neighbours(server):
    ada, session = fresh("ada"), fresh("chat")
    create(server, "mallory", ".", ada, session)  # mallory has no grants on ada's cells
    create(server, ada, "my bank PIN is 4812", ada, session)  # a later private turn
    create(server, ada, "the doctor said gout", ada, session)
    assert keyword_hits(server, "mallory", "4812", ada) == {}
    assert keyword_hits(server, "mallory", "gout", ada) == {}
    # The owner still finds her turns, and a turn by its neighbour's words (same readers).
    assert len(keyword_hits(server, ada, "4812", ada)) == 2


def test_deleted_neighbour_leaves_every_window(server):
    ada, session = fresh("ada"), fresh("chat")
    create(server, ada, "the weather is nice", ada, session, public=True)
    secret = create(server, ada, "my diagnosis is zanzibarosis", ada, session, public=True)
    assert len(keyword_hits(server, "mallory", "zanzibarosis", ada)) == 2  # public: its window holds it
    r = call(server, ada, "PATCH", f"/memories/{secret}", {"lifecycle": {"status": "archived"}})  # AMP: archive, then delete
    assert r.status_code == 200, r.text
    assert call(server, ada, "DELETE", f"/memories/{secret}").status_code == 204
    assert keyword_hits(server, "mallory", "zanzibarosis", ada) == {}
    assert keyword_hits(server, ada, "zanzibarosis", ada) == {}


def test_window_changes_with_a_neighbours_policy(server):
    ada, session = fresh("ada"), fresh("chat")
    create(server, ada, "shared note about lunch", ada, session, readable_by=["bob"])
    private = create(server, ada, "the safe code is 3141", ada, session, readable_by=["bob"])
    assert len(keyword_hits(server, "bob", "3141", ada)) == 2
    r = call(server, ada, "PATCH", f"/memories/{private}", {"access_policy": {"readable_by": []}})
    assert r.status_code == 200, r.text
    assert keyword_hits(server, "bob", "3141", ada) == {}
    r = call(server, ada, "PATCH", f"/memories/{private}", {"access_policy": {"readable_by": ["bob"]}})
    assert len(keyword_hits(server, "bob", "3141", ada)) == 2


def test_writer_cannot_move_an_unreadable_cell_into_its_trap(server):
    ada = fresh("ada")
    trap = fresh("trap")
    create(server, "mallory", ".", ada, trap)
    diary = create(server, ada, "the alarm code is 7731", ada, fresh("diary"), writable_by=["mallory"])
    r = call(server, "mallory", "PATCH", f"/memories/{diary}", {"identity": {"session_id": trap}})
    assert r.status_code in (200, 204), r.text
    assert keyword_hits(server, "mallory", "7731", ada) == {}


# ------------------------------------------------------------------ hole 2: one glob dialect
@pytest.mark.parametrize("pattern", ["team-[a-Z]*", "[z-a]", "[[:alpha:]]", "[a-\\]", "team[", "ev[*", "[^a]*", "[]", "[!]"])
def test_pattern_outside_the_grammar_is_refused_and_breaks_nothing(server, pattern):
    owner = fresh("ada")
    r = call(server, owner, "POST", "/memories", {"content": {"text": "x"}, "identity": {"owner_id": owner},
                                                   "access_policy": {"readable_by": [pattern]}})
    assert r.status_code == 422, r.text
    assert "invalid pattern" in r.text
    cell = create(server, owner, "fine", owner)
    r = call(server, owner, "PATCH", f"/memories/{cell}", {"access_policy": {"writable_by": [pattern]}})
    assert r.status_code == 422, r.text
    for method, path, body in (("POST", "/memories/search", {"query": "fine"}), ("GET", "/memories", None),
                               ("GET", "/export", None)):
        assert call(server, "someone-else", method, path, body).status_code == 200


def test_stored_pattern_outside_the_grammar_is_migrated_to_match_literally(tmp_path, pg_url):
    """Cells stored before the grammar may hold such a pattern. The migration (SQLite 5,
    PostgreSQL 6; its Python step is run here on a cell written the old way) rewrites it to
    the pattern matching its text literally: it grants exactly the agent id spelled like it,
    in `can_read` and in the SQL filter alike, and the cell still loads."""
    from ampkit.models import CellCreate
    from ampkit.service import MemoryService
    from ampkit.store import _pg_schema
    from ampkit.store import sqlite as sqlite_store

    for url in (f"sqlite:///{tmp_path}/old.db", pg_url):
        store = store_from_url(url)
        store.open()
        try:
            cell = MemoryService(store=store)._build(CellCreate(content={"text": "x"}, identity={"owner_id": "ada"}),
                                                    "ada", _now())
            policy = cell.access_policy.model_copy(update={"readable_by": ["team[", "a-[z-a]"], "writable_by": ["w*["]})
            with store.write() as tx:
                tx.insert(cell.model_copy(update={"access_policy": policy}))
            if store.backend == "sqlite":
                with store.write() as tx:
                    sqlite_store._rebuild_access_and_windows(tx.conn)
            else:
                with store.write() as tx:
                    _pg_schema.rebuild_access_and_windows(tx.conn)
            stored = store.get(cell.id)
            assert stored.access_policy.readable_by == ["team[[]", "a-[[]z-a]"]
            assert stored.access_policy.writable_by == ["w[*][[]"]  # its "*" is literal too
            for agent in ("team[", "a-[z-a]", "team[x", "teamx", "a-b", "a-[z-a]x"):
                listed = [c.id for c in store.list(CellFilter(reader=agent), 10)]
                assert (listed == [cell.id]) == can_read(stored, agent) == (agent in ("team[", "a-[z-a]")), (url, agent)
        finally:
            store.close()


def _now():
    from datetime import datetime, timezone

    return datetime(2026, 1, 1, tzinfo=timezone.utc)


# Characters that exercise every corner of the three dialects: the pattern syntax itself, the
# GLOB set specials, regex specials, a backslash, and non-ASCII (ranges compare code points).
ALPHABET = "ab-]^[!*?\\.Zé中$"
_set_members = st.text(alphabet=ALPHABET, min_size=1, max_size=4)
_items = st.one_of(
    st.sampled_from(["*", "?"]),
    st.sampled_from([c for c in ALPHABET if c not in "*?["]),
    _set_members.map(lambda body: f"[{body}]"),
    _set_members.map(lambda body: f"[!{body}]"),
)
grammar_patterns = st.lists(_items, min_size=1, max_size=4).map("".join).filter(
    lambda p: _parses(p))
agent_ids = st.text(alphabet=ALPHABET + "xy", min_size=1, max_size=6)


def _parses(pattern: str) -> bool:
    try:
        glob.parse(pattern)
    except glob.GlobError:
        return False
    return True


@pytest.fixture(scope="module")
def pg_conn(pg_server):
    import psycopg

    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        yield conn


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=grammar_patterns, agents=st.lists(agent_ids, min_size=1, max_size=8))
def test_matcher_sqlite_glob_and_postgres_regex_agree(pg_conn, pattern, agents):
    parsed = glob.parse(pattern)
    lite = sqlite3.connect(":memory:")
    for agent in agents + [pattern]:
        expected = parsed.matches(agent)
        assert bool(lite.execute("SELECT ? GLOB ?", (agent, parsed.sqlite_glob())).fetchone()[0]) == expected, (
            pattern, parsed.sqlite_glob(), agent)
        assert pg_conn.execute("SELECT %s ~ %s", (agent, parsed.postgres_regex())).fetchone()[0] == expected, (
            pattern, parsed.postgres_regex(), agent)


# Long patterns with many `*` over few characters, and long ids over the same ones: the matcher
# takes each piece between `*`s at its leftmost place (`ampkit.glob._matches`), which these
# exercise (near misses, several places a piece fits); ids the pattern matches are added.
_long_items = st.one_of(st.just("*"), st.just("?"), st.sampled_from("ab"), st.sampled_from(["[ab]", "[!a]", "[b-b]"]))
long_patterns = st.lists(_long_items, min_size=1, max_size=40).map("".join).filter(
    lambda p: p.count("*") <= 16)
long_agent_ids = st.one_of(st.text(alphabet="ab", min_size=1, max_size=8), st.text(alphabet="ab", min_size=1, max_size=60))


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=long_patterns, agents=st.lists(long_agent_ids, min_size=1, max_size=8))
def test_matcher_sqlite_glob_and_postgres_regex_agree_on_long_patterns(pg_conn, pattern, agents):
    parsed = glob.parse(pattern)
    lite = sqlite3.connect(":memory:")
    for agent in agents + glob_witnesses(pattern) + [w + "ab" for w in glob_witnesses(pattern)]:
        expected = parsed.matches(agent)
        assert bool(lite.execute("SELECT ? GLOB ?", (agent, parsed.sqlite_glob())).fetchone()[0]) == expected, (
            pattern, parsed.sqlite_glob(), agent)
        assert pg_conn.execute("SELECT %s ~ %s", (agent, parsed.postgres_regex())).fetchone()[0] == expected, (
            pattern, parsed.postgres_regex(), agent)


# Patterns without wildcards, whose text is full of what a regular expression reads as syntax.
literal_patterns = st.text(alphabet=ALPHABET + ".+()|{}$", min_size=1, max_size=5).map(glob.literal)


@pytest.fixture(scope="module")
def pg_schema_conn(pg_server):
    """A connection to a database with ampkit's schema (its SQL functions)."""
    import psycopg

    from ampkit.store.postgres import PostgresStore

    url = pg_server.create_database(f"isolation_schema_{os.getpid()}_{uuid.uuid4().hex[:8]}", template="ampkit_template")
    store = PostgresStore(url)
    store.open()
    store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        yield conn


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(patterns=st.lists(st.one_of(grammar_patterns, literal_patterns), max_size=4),
       agents=st.lists(agent_ids, min_size=1, max_size=8))
def test_postgres_reader_literals_and_globs_grant_what_the_matcher_grants(pg_schema_conn, patterns, agents):
    """A `readable_by` list as PostgreSQL reads it since migration 14 (the compiled patterns
    split by the database into `reader_literals`, compared by equality with the reader's own
    literal, and `reader_globs`, run as regular expressions), through the compiled condition
    itself, grants exactly the agents the access rule's matcher grants. A pattern written as
    `glob.literal(agent)` is always a literal; a literal matches exactly the one id whose
    literal compiles to it (checked against ids the patterns match, `glob_witnesses`)."""
    import re

    from ampkit.store.sql import POSTGRES
    from ampkit.store.sql.dialects import READER_LITERAL

    regexes = sorted({POSTGRES.reader_pattern(p) for p in patterns})
    literals, globs = pg_schema_conn.execute("SELECT ampkit_reader_literals(%s::text[]), ampkit_reader_globs(%s::text[])",
                                             (regexes, regexes)).fetchone()
    assert literals == [r for r in regexes if re.fullmatch(READER_LITERAL, r)]  # the same shape in both
    assert sorted(literals + globs) == regexes
    candidates = [a for a in agents + patterns + [w for p in patterns for w in glob_witnesses(p)] if a]  # (ids are never empty)
    for agent in candidates:
        assert POSTGRES.reader_literal(agent) in pg_schema_conn.execute(
            "SELECT ampkit_reader_literals(ARRAY[%s])", (POSTGRES.reader_literal(agent),)).fetchone()[0]
    for pattern in patterns:
        if POSTGRES.reader_pattern(pattern) in literals:
            assert all(glob.parse(pattern).matches(a) == (POSTGRES.reader_literal(a) == POSTGRES.reader_pattern(pattern))
                       for a in candidates), pattern
    for agent in candidates:
        expected = any(glob.parse(p).matches(agent) for p in patterns)
        condition, params = POSTGRES.reader_matches("c", agent)
        got = pg_schema_conn.execute(
            f"SELECT {condition} FROM (SELECT %s::text[] AS reader_literals, %s::text[] AS reader_globs) c",
            [*params, literals, globs]).fetchone()[0]
        assert got == expected, (patterns, literals, globs, agent)


def test_grammar_examples():
    assert glob.parse("bot-[12]").matches("bot-1") and not glob.parse("bot-[12]").matches("bot-3")
    assert glob.parse("[!a]*").matches("bob") and not glob.parse("[!a]*").matches("al")
    assert glob.parse("[]a]").matches("]") and glob.parse("[a-]").matches("-")
    assert glob.parse("x\\y").matches("x\\y")  # no escape character
    assert glob.parse("a**b").matches("ab")
    for bad in ("", "[", "a[b", "[]", "[!]", "[z-a]", "[^x]", "[[:digit:]]"):
        with pytest.raises(glob.GlobError):
            glob.parse(bad)


# ------------------------------------------------------------------ hole 7: term statistics
def test_keyword_scores_do_not_move_with_unreadable_cells(server):
    """carol reads ada's public cells; ada's private cells, and other owners' cells, gaining
    the same words must not move carol's scores or ranks by a bit, nor her total."""
    ada, session = fresh("ada"), fresh("s")
    for text in ("kiwi smoothie recipe", "kiwi and mango salad", "walk in the park"):
        create(server, ada, text, ada, session, public=True)

    def seen(owner: str | None) -> tuple:
        body: dict[str, Any] = {"query": "kiwi mango", "explain": True, "limit": 100}
        if owner:
            body["owner_id"] = owner
        r = call(server, "carol", "POST", "/memories/search", body).json()
        hits = [(h["id"], h["explain"].get("keyword"), h["explain"].get("keyword_rank")) for h in r["results"]
                if h["identity"]["owner_id"] == ada]
        return hits, r["total"] if owner else None

    before = seen(ada), seen(None)
    for i in range(6):
        create(server, ada, f"kiwi kiwi mango private {i}", ada, fresh("p"))  # ada's, unreadable by carol
        create(server, fresh("dan"), "kiwi mango mango", fresh("dan"))
    assert (seen(ada), seen(None)) == before
