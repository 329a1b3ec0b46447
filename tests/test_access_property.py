"""Property: every read path agrees with the one access-decision function.

Hypothesis draws agents, cells with random owners, creators, statuses and access policies
(exact ids and glob patterns, including odd ones), then asks every read path (get, history,
list with and without paging, search, export, and the as-of get, list and search) as every agent. What each path returns must be
exactly the cells `ampkit.access.can_read` allows (no leak across owners, and no readable
cell missing). Runs through `MemoryService` over a real SQLite file, and through HTTP
against a real server for a smaller sample."""

from __future__ import annotations

import itertools
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ampkit.access import can_read
from ampkit.errors import AccessDenied
from ampkit.glob import GlobError, literal, parse as parse_glob
from ampkit.models import CellCreate, CellPatch, MemoryCell, SearchRequest
from ampkit.service import MemoryService
from ampkit.store.sqlite import SQLiteStore
from support import TLS, AppServer, examples, glob_witnesses

AGENTS = ["alice", "alex", "al", "bob", "bot-1", "bot-2", "Carol", "c4", "ev[1]", "x*y"]
PATTERNS = AGENTS + ["*", "a*", "al?ce", "bot-*", "bot-[12]", "[!a]*", "*o*", "[A-Z]*", "?4", "ev[[]1]",
                     "x[*]y", "*[", "[]", "nobody", "b??", "[a-c]*"]
ALL_STATUSES = ["active", "stale", "archived", "deleted"]
WORD = "zebracorn"  # in every cell's text, so a search can reach every cell



def _valid(pattern: str) -> bool:
    """Inside the one glob grammar (`ampkit.glob`); the rest is refused with 422 on write."""
    try:
        parse_glob(pattern)
    except GlobError:
        return False
    return True


patterns = st.one_of(
    st.sampled_from([p for p in PATTERNS if _valid(p)]),
    st.text(alphabet="abl-12*?[]!C", min_size=1, max_size=6).filter(_valid),
)


@dataclass
class CellSpec:
    creator: str
    owner: str
    readable_by: list[str]
    writable_by: list[str]
    public: bool
    status: str  # final status: active, archived or deleted


cell_specs = st.builds(
    CellSpec,
    creator=st.sampled_from(AGENTS),
    owner=st.sampled_from(AGENTS),
    readable_by=st.lists(patterns, max_size=3),
    writable_by=st.lists(patterns, max_size=2),
    public=st.booleans(),
    status=st.sampled_from(["active", "active", "archived", "deleted"]),
)
worlds = st.lists(cell_specs, min_size=1, max_size=7)


class Reads:
    """The read paths, as one agent sees them, answering sets of cell ids."""

    def __init__(self, get: Callable[[str], bool], history: Callable[[str], bool],
                 listing: Callable[[Optional[str], int], set[str]], search: Callable[[Optional[str]], set[str]],
                 export: Callable[[Optional[str]], set[str]]):
        self.get, self.history, self.listing, self.search, self.export = get, history, listing, search, export


def check_world(cells: list[MemoryCell], agents: list[str], owners: list[Optional[str]],
                reads_for: Callable[[str], Reads]) -> None:
    for agent in agents:
        reads = reads_for(agent)
        for cell in cells:
            allowed = can_read(cell, agent)
            assert reads.get(cell.id) == allowed, (agent, cell.access_policy, cell.identity, cell.lifecycle.status)
            assert reads.history(cell.id) == allowed, (agent, cell.id)
        for owner in owners:
            mine = [c for c in cells if owner is None or c.identity.owner_id == owner]
            readable = {c.id for c in mine if can_read(c, agent)}
            searchable = {c.id for c in mine if can_read(c, agent) and c.lifecycle.status in ("active", "archived")}
            assert reads.listing(owner, 100) == readable, (agent, owner)
            assert reads.listing(owner, 2) == readable, (agent, owner, "paged")
            assert reads.export(owner) == readable, (agent, owner)
            assert reads.search(owner) == searchable, (agent, owner)


def build_world(specs: list[CellSpec], create: Callable[[str, dict], MemoryCell],
                archive: Callable[[str, str], None], delete: Callable[[str, str], None],
                fetch: Callable[[str], MemoryCell], name: Callable[[str], str] = str) -> list[MemoryCell]:
    ids = []
    for i, spec in enumerate(specs):
        body = {
            "type": "semantic",
            "content": {"text": f"{WORD} fact number {i}"},
            "identity": {"owner_id": name(spec.owner), "owner_type": "agent"},
            "access_policy": {"readable_by": spec.readable_by, "writable_by": spec.writable_by, "public": spec.public},
        }
        cell = create(name(spec.creator), body)
        if spec.status in ("archived", "deleted"):
            archive(name(spec.creator), cell.id)
        if spec.status == "deleted":
            delete(name(spec.creator), cell.id)
        ids.append(cell.id)
    return [fetch(i) for i in ids]


# ---------------------------------------------------------------- through the service
def _denied_is_false(fn: Callable[[], object]) -> bool:
    try:
        fn()
        return True
    except AccessDenied:
        return False


def service_reads(service: MemoryService, agent: str) -> Reads:
    def listing(owner: Optional[str], page: int) -> set[str]:
        out: set[str] = set()
        cursor = None
        for _ in range(100):
            results, total, cursor = service.list(agent, owner_id=owner, status=ALL_STATUSES, limit=page, cursor=cursor)
            out |= {c.id for c in results}
            if cursor is None:
                break
        assert total == len(out)
        return out

    def search(owner: Optional[str]) -> set[str]:
        req = SearchRequest(query=WORD, owner_id=owner, status=["active", "archived"], limit=100)
        resp = service.search(agent, req)
        assert resp.total == len(resp.results)
        return {h.id for h in resp.results}

    return Reads(
        get=lambda cid: _denied_is_false(lambda: service.get(agent, cid)),
        history=lambda cid: _denied_is_false(lambda: service.history(agent, cid)),
        listing=listing,
        search=search,
        export=lambda owner: {c.id for c in service.export(agent, owner_id=owner)},
    )


def build_service_world(service: MemoryService, specs: list[CellSpec]) -> list[MemoryCell]:
    """`build_world` through the service's own create, archive and delete."""
    return build_world(
        specs,
        create=lambda agent, body: service.create(agent, CellCreate.model_validate(body)),
        archive=lambda agent, cid: service.update(agent, cid, CellPatch.model_validate({"lifecycle": {"status": "archived"}})),
        delete=service.delete,
        fetch=service.store.get,
    )


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds)
def test_service_read_paths_agree_with_can_read(specs):
    with tempfile.TemporaryDirectory(prefix="ampkit-prop-") as tmp:
        store = SQLiteStore(str(Path(tmp) / "prop.db"))
        store.open()
        try:
            service = MemoryService(store=store)
            cells = build_service_world(service, specs)
            owners = [None] + sorted({c.identity.owner_id for c in cells})
            check_world(cells, AGENTS, owners, lambda agent: service_reads(service, agent))
        finally:
            store.close()


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds)
def test_access_snapshot_admits_what_can_read_allows(specs):
    """The SQLite store's in-memory access snapshot (reader-wide filters) admits, for every
    agent, exactly the cells `can_read` allows (`can_read_columns`, the rule over columns),
    with the store's writes applied row by row after it was loaded."""
    from ampkit.store.base import CellFilter

    with tempfile.TemporaryDirectory(prefix="ampkit-prop-") as tmp:
        store = SQLiteStore(str(Path(tmp) / "prop.db"))
        store.open()
        try:
            store.access.load()  # loaded empty: every cell below arrives as a change
            service = MemoryService(store=store)
            cells = build_service_world(service, specs)
            rowid = {cid: r for r, cid in store._query("SELECT rowid, id FROM cells")}
            store.index_pending_windows()  # as any search does first: a cell without its window is admitted by no leg
            for agent in AGENTS:
                rowids, _ = store.access.load().admitted(CellFilter(reader=agent, statuses=ALL_STATUSES))
                assert set(rowids.tolist()) == {rowid[c.id] for c in cells if can_read(c, agent)}, agent
        finally:
            store.close()


# ---------------------------------------------------------------- through HTTP
@pytest.fixture(scope="module")
def http_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prop-http")
    with AppServer(f"sqlite:///{tmp}/prop.db", log_path=tmp / "server.log") as proc:
        yield proc


_example = itertools.count()


def http_reads(http: httpx.Client, agent: str) -> Reads:
    headers = {"X-AMP-Agent-ID": agent}

    def ok(r: httpx.Response) -> bool:
        assert r.status_code in (200, 403), r.text
        if r.status_code == 403:
            assert r.json()["error"]["code"] == "ACCESS_DENIED"
        return r.status_code == 200

    def listing(owner: Optional[str], page: int) -> set[str]:
        out: set[str] = set()
        params: dict = {"owner_id": owner, "status": ",".join(ALL_STATUSES), "limit": page}
        for _ in range(100):
            body = http.get("/memories", params=params, headers=headers).json()
            out |= {c["id"] for c in body["results"]}
            if not body["next_cursor"]:
                break
            params["cursor"] = body["next_cursor"]
        assert body["total"] == len(out)
        return out

    def search(owner: Optional[str]) -> set[str]:
        req = {"query": WORD, "owner_id": owner, "status": ["active", "archived"], "limit": 100}
        return {c["id"] for c in http.post("/memories/search", json=req, headers=headers).json()["results"]}

    return Reads(
        get=lambda cid: ok(http.get(f"/memories/{cid}", headers=headers)),
        history=lambda cid: ok(http.get(f"/memories/{cid}/history", headers=headers)),
        listing=listing,
        search=search,
        export=lambda owner: {c["id"] for c in http.get("/export", params={"owner_id": owner}, headers=headers).json()["cells"]},
    )


@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(specs=worlds)
def test_http_read_paths_agree_with_can_read(http_server, specs):
    # One server for every example: each example's agents get a unique suffix, and every
    # set-valued read is scoped to one of this example's owners, so earlier examples' cells
    # (which "*" patterns may also let these agents read) stay out of the comparison.
    n = next(_example)
    name = lambda agent: f"{agent}@{n}"  # noqa: E731
    with httpx.Client(base_url=http_server.base_url, timeout=30, verify=TLS) as http:
        def call(method: str, agent: str, path: str, **kw) -> httpx.Response:
            r = http.request(method, path, headers={"X-AMP-Agent-ID": agent}, **kw)
            assert r.status_code < 300, r.text
            return r

        created: dict[str, MemoryCell] = {}

        def create(agent: str, body: dict) -> MemoryCell:
            cell = MemoryCell.model_validate(call("POST", agent, "/memories", json=body).json())
            created[cell.id] = cell
            return cell

        def archive(agent: str, cid: str) -> None:
            created[cid] = MemoryCell.model_validate(
                call("PATCH", agent, f"/memories/{cid}", json={"lifecycle": {"status": "archived"}}).json())

        def delete(agent: str, cid: str) -> None:
            call("DELETE", agent, f"/memories/{cid}")
            gone = created[cid]
            created[cid] = gone.model_copy(update={"lifecycle": gone.lifecycle.model_copy(update={"status": "deleted"})})

        cells = build_world(specs, create, archive, delete, fetch=lambda cid: created[cid], name=name)
        owners = sorted({c.identity.owner_id for c in cells})
        check_world(cells, [name(a) for a in AGENTS], owners, lambda agent: http_reads(http, agent))


# ---------------------------------------------------------------- as-of reads (issue 16)
def as_of_reads(service: MemoryService, agent: str) -> Reads:
    """The as-of read paths at a time after every change: they must answer exactly what the
    live paths answer (the policy then and now are the same policy). History and export have
    no as-of form; the live ones stand in so that `check_world` runs unchanged."""
    from datetime import datetime, timezone

    later = datetime(2100, 1, 1, tzinfo=timezone.utc)
    live = service_reads(service, agent)

    def listing(owner: Optional[str], page: int) -> set[str]:
        out: set[str] = set()
        cursor = None
        for _ in range(100):
            results, total, cursor = service.list(agent, owner_id=owner, status=ALL_STATUSES, limit=page,
                                                  cursor=cursor, as_of=later)
            out |= {c.id for c in results}
            if cursor is None:
                break
        assert total == len(out)
        return out

    def search(owner: Optional[str]) -> set[str]:
        resp = service.search(agent, SearchRequest(query=WORD, owner_id=owner, status=["active", "archived"],
                                                   limit=100, as_of=later))
        assert resp.total == len(resp.results)
        return {h.id for h in resp.results}

    return Reads(
        get=lambda cid: _denied_is_false(lambda: service.get(agent, cid, as_of=later)),
        history=live.history,
        listing=listing,
        search=search,
        export=live.export,
    )


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds)
def test_as_of_read_paths_agree_with_can_read(specs):
    with tempfile.TemporaryDirectory(prefix="ampkit-prop-") as tmp:
        store = SQLiteStore(str(Path(tmp) / "prop.db"))
        store.open()
        try:
            service = MemoryService(store=store)
            cells = build_service_world(service, specs)
            owners = [None] + sorted({c.identity.owner_id for c in cells})
            check_world(cells, AGENTS, owners, lambda agent: as_of_reads(service, agent))
        finally:
            store.close()


# ---------------------------------------------------------------- PostgreSQL's compiled rule
# Agent ids a regular expression would read differently from the glob: regex metacharacters,
# glob syntax written literally, a backslash, non-ASCII, a case twin.
PG_AGENTS = ["alice", "al", "a.b", "axb", "a+b", "aab", "ab", "a*b", "a?b", "ev[1]", "ev1", "(a)", "a|b", "^a$",
             "a\\b", "é", "bot-1", "Bot-1", "x*y", "x]y"]
PG_PATTERNS = ([literal(a) for a in PG_AGENTS]  # each agent by name (`a[*]b`, `ev[[]1]`...)
               + ["a.b", "a+b", "(a)", "a|b", "^a$", "a\\b", "ev[1]", "[aa]", "a[.]b", "x]y",  # names, with no wildcard
                  "*", "a*", "a?b", "a*b", "[!a]*", "a[.+]b", "*b", "bot-[0-9]", "[A-Z]*", "?"])  # globs
pg_patterns = st.one_of(
    st.sampled_from(PG_PATTERNS),
    st.text(alphabet="ab.+*?[]!\\|()^$", min_size=1, max_size=5).filter(_valid),
)


@dataclass
class PgCellSpec:
    creator: str
    owner: str
    readable_by: list[str]
    public: bool
    status: str
    readable_later: Optional[list[str]]  # a policy change after the first reads, or none


pg_worlds = st.lists(st.builds(
    PgCellSpec,
    creator=st.sampled_from(["own-1", "own-2", "alice"]),
    owner=st.sampled_from(["own-1", "own-2", "ab"]),
    readable_by=st.lists(pg_patterns, max_size=4),
    public=st.sampled_from([False, False, False, True]),
    status=st.sampled_from(["active", "active", "archived", "deleted"]),
    readable_later=st.one_of(st.none(), st.lists(pg_patterns, max_size=3)),
), min_size=1, max_size=6)


@pytest.fixture(scope="module")
def pg_stores(pg_server):
    """One database for the module, emptied by each example: a store whose wide keyword searches
    always use the arrays (loaded inline), and one that ranks every search in SQL."""
    from ampkit.store.postgres import PostgresStore

    url = pg_server.create_database("access_property", template="ampkit_template")
    arrays, statement = PostgresStore(url, keyword_warm_inline=True), PostgresStore(url, keyword_cache_mb=0)
    arrays.open()
    statement.open()
    yield arrays, statement
    arrays.close()
    statement.close()


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(specs=pg_worlds)
@example(specs=[  # every kind at least once, whatever the draw
    PgCellSpec("own-1", "own-1", ["a.b", "a[.+]b"], False, "active", ["alice"]),
    PgCellSpec("own-2", "own-2", ["a[*]b", "ev[1]", "(a)"], False, "archived", None),
    PgCellSpec("own-1", "own-1", ["[aa]", "x]y", "a?b"], False, "active", ["a\\b", "bot-[0-9]"]),
    PgCellSpec("alice", "ab", ["alice"], False, "active", []),
    PgCellSpec("own-2", "own-2", [], True, "active", None),
    PgCellSpec("own-1", "own-2", ["a|b", "*b"], False, "deleted", None),
])
def test_postgres_compiled_read_rule_admits_what_can_read_allows(pg_stores, specs):
    """The read rule as PostgreSQL runs it (`reader_literals` by equality, `reader_globs` as
    regular expressions: `PostgresDialect.reader_matches`), in the store's own queries (list, count,
    the wide keyword leg from its arrays and from the statement), admits for every agent
    exactly the cells `can_read` allows: literal names that look like regular expressions,
    glob syntax written literally, empty lists, public cells and mixes; then again after some
    cells' `readable_by` changed (the arrays are patched from the triggers' log). Store
    level, so the service's own re-check cannot hide a cell the SQL admits wrongly."""
    from ampkit.store.base import CellFilter

    arrays, statement = pg_stores
    with arrays._connection() as conn:
        conn.execute("TRUNCATE cells CASCADE")
    service = MemoryService(store=arrays)
    cells = build_world(
        [CellSpec(s.creator, s.owner, s.readable_by, [], s.public, s.status) for s in specs],
        create=lambda agent, body: service.create(agent, CellCreate.model_validate(body)),
        archive=lambda agent, cid: service.update(agent, cid, CellPatch.model_validate({"lifecycle": {"status": "archived"}})),
        delete=service.delete, fetch=arrays.get)
    named = {w for s in specs for p in s.readable_by + (s.readable_later or []) for w in glob_witnesses(p) if w}
    agents = sorted(set(PG_AGENTS) | {"own-1", "ab", "stranger"} | named)
    live = ["active", "stale", "archived"]

    def check(cells: list[MemoryCell], when: str) -> None:
        for agent in agents:
            flt = CellFilter(reader=agent, statuses=live)
            expected = {c.id for c in cells if can_read(c, agent)}
            assert {c.id for c in arrays.list(flt, 100)} == expected, (when, agent)
            assert arrays.count(flt) == len(expected), (when, agent)
            for store in (arrays, statement):
                found = {c.cell_id for c in store.keyword_candidates(WORD, flt, 100)}
                assert found == expected, (when, agent, store.wide_keywords is not None)

    check(cells, "created")
    assert arrays.wide_keywords.served > 0
    changed = False
    for spec, cell in zip(specs, cells):
        if spec.readable_later is not None and cell.lifecycle.status != "deleted":
            service.update(cell.identity.owner_id, cell.id, CellPatch.model_validate(
                {"access_policy": {"readable_by": spec.readable_later}}))
            changed = True
    if changed:
        check([arrays.get(c.id) or c for c in cells], "changed")
