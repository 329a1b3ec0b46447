"""Issue 10, edge side: each hole found by attacking `ampkit serve` is a regression test here,
run against a real server (the app over HTTP, served in the test process) on SQLite and on
PostgreSQL.

- scopes decide what a key may see: a body containing a cell needs `read` (hole 3);
- error details do not measure hidden text (hole 7, second part);
- clock overrides (`as_of`) only on a server started with `--allow-clock-override` (hole 4);
- validation at the edge: depth, NUL, lone surrogates, dates, non-finite numbers, filter
  values, malformed bodies; each a 4xx in the envelope on a connection that stays usable
  (holes 5 and 6);
- AMP 0.1's own client can archive and delete (hole 8).
"""

from __future__ import annotations

import itertools
import json
import socket
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from starlette.testclient import TestClient

from ampkit.auth import create_key
from ampkit.config import Settings
from ampkit.server.app import create_app
from support import TLS, AppServer, run_cli

CELL = {"type": "semantic", "content": {"text": "the vault code is 4812"},
        "identity": {"owner_id": "ada", "owner_type": "user", "session_id": "chat-42"}}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def store_url(request, tmp_path_factory):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('edge')}/edge.db"
    pg_server = request.getfixturevalue("pg_server")
    return pg_server.create_database(f"edge_{id(request)}", template="ampkit_template")


@pytest.fixture(scope="module")
def srv(store_url, tmp_path_factory):
    """A production server: auth off, no clock override."""
    tmp = tmp_path_factory.mktemp("edge-srv")
    with AppServer(store_url, env={"AMPKIT_EMBEDDER": "none"}, log_path=tmp / "server.log") as proc:
        yield proc


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(base_url=srv.base_url, timeout=30, verify=TLS) as client:
        yield client


def as_agent(agent: str) -> dict[str, str]:
    return {"X-AMP-Agent-ID": agent}


_serial = itertools.count(1)


def fresh() -> dict:
    """CELL with a text of its own: the same text twice for one owner is one cell (dedup on
    write), and these tests each want cells of their own on the module's store."""
    body = json.loads(json.dumps(CELL))
    body["content"]["text"] += f" #{next(_serial)}"
    return body


def make_cell(http: httpx.Client, agent: str = "ada", **changes) -> dict:
    body = fresh()
    for section, values in changes.items():
        body.setdefault(section, {}).update(values)
    r = http.post("/memories", json=body, headers=as_agent(agent))
    assert r.status_code == 201, r.text
    return r.json()


def assert_envelope(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    assert set(body["error"]) == {"code", "message", "details"}


# ---------------------------------------------------------------- hole 3: scopes
@pytest.fixture(scope="module")
def keyed(store_url):
    """An auth-required app on the module's store (in process: scopes are not about the
    process boundary), with keys for ada (read+write), ada (write only), mallory (write only)."""
    settings = Settings(store=store_url, auth="required", embedder="none", lifecycle_interval_seconds=0)
    app = create_app(settings)
    with TestClient(app, base_url="http://testserver/amp/v1") as client:
        store = app.state.service.store
        keys = {name: create_key(store, agent, scopes).token for name, agent, scopes in (
            ("ada", "ada", "read,write"), ("ada_writer", "ada", "write"), ("mallory_writer", "mallory", "write"))}
        yield client, {k: {"Authorization": f"Bearer {v}"} for k, v in keys.items()}


def test_a_write_only_key_never_receives_a_cell(keyed):
    http, keys = keyed
    writer = keys["ada_writer"]
    own = http.post("/memories", json=fresh(), headers=keys["ada"]).json()

    created = http.post("/memories", json=fresh(), headers=writer)
    assert created.status_code == 204 and created.content == b""

    batch = http.post("/memories/batch", json={"cells": [fresh(), fresh()]}, headers=writer)
    assert batch.status_code == 204 and batch.content == b""

    for patch in ({}, {"scoring": {"importance": 0.5}}, {"content": {"metadata": {"k": 1}}}):
        r = http.patch(f"/memories/{own['id']}", json=patch, headers=writer)
        assert r.status_code == 204 and r.content == b"", (patch, r.text)

    superseding = http.post("/memories", json={**fresh(), "supersedes": own["id"]}, headers=writer)
    assert superseding.status_code == 204 and superseding.content == b""

    # The same key's agent with the read scope still gets the cells.
    body = fresh()
    r = http.post("/memories", json=body, headers=keys["ada"])
    assert r.status_code == 201 and r.json()["content"]["text"] == body["content"]["text"]
    r = http.post("/memories/batch", json={"cells": [fresh()]}, headers=keys["ada"])
    assert r.status_code == 201 and len(r.json()["results"]) == 1


@pytest.mark.parametrize("text", ["a", "héllo \"q\" \\ \n\t\x01\x7f \u2028 한국어 😀", "x" * 3000])
def test_a_cell_without_metadata_measures_as_its_content_serialised(text):
    """`cell_size_bytes` spells out the common case (no metadata) without dumping the model:
    the same number as the content object serialised as compact UTF-8 JSON."""
    from ampkit.models import MemoryCell
    from ampkit.service import cell_size_bytes

    cell = MemoryCell.model_validate({"id": "mem_01ARZ3NDEKTSV4RRFFQ69G5FAV", "content": {"text": text},
                                      "identity": {"owner_id": "u"}, "type": "semantic",
                                      "lifecycle": {"created_at": "2026-01-01T00:00:00Z"}})
    content = cell.content.model_dump(mode="json")
    assert cell_size_bytes(cell) == len(json.dumps(content, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def test_a_413_does_not_measure_text_the_caller_cannot_read(keyed, srv):
    http, keys = keyed
    limit = http.get("/spec").json()["capabilities"]["max_cell_size_bytes"]
    hidden = http.post("/memories", json={**CELL, "content": {"text": "s" * 1000},
                                          "access_policy": {"writable_by": ["mallory"]}},
                       headers=keys["ada"]).json()
    r = http.patch(f"/memories/{hidden['id']}", json={"content": {"metadata": {"pad": "x" * (limit - 20)}}},
                   headers=keys["mallory_writer"])
    assert_envelope(r, 413, "PAYLOAD_TOO_LARGE")
    assert "size_bytes" not in r.json()["error"]["details"]
    assert str(1000) not in r.json()["error"]["message"]
    # A reader is told the size.
    r = http.patch(f"/memories/{hidden['id']}", json={"content": {"metadata": {"pad": "x" * (limit - 20)}}},
                   headers=keys["ada"])
    assert_envelope(r, 413, "PAYLOAD_TOO_LARGE")
    assert r.json()["error"]["details"]["size_bytes"] > limit


def test_a_writer_only_agent_cannot_probe_hidden_fields_through_patch_errors(http):
    """Server-managed fields in a PATCH are compared with the cell only for a reader; a
    writer-only agent gets one answer whatever it guesses."""
    cell = make_cell(http, access_policy={"writable_by": ["mallory"]})
    for section, name, guesses in (("lifecycle", "created_at", (cell["lifecycle"]["created_at"], "2001-01-01T00:00:00Z")),
                                   ("identity", "owner_id", ("ada", "eve")), ("identity", "created_by", ("ada", "bob"))):
        answers = set()
        for guess in guesses:
            r = http.patch(f"/memories/{cell['id']}", json={section: {name: guess}}, headers=as_agent("mallory"))
            answers.add((r.status_code, r.content))
        assert len(answers) == 1, answers


# ---------------------------------------------------------------- hole 4: clock overrides
def test_a_production_server_refuses_clock_overrides(http):
    spec = http.get("/spec").json()["capabilities"]
    assert spec["clock_override"] is False
    assert "lifecycle_as_of" not in spec["extensions"]
    for path in ("/admin/lifecycle/run", "/admin/purge"):
        r = http.post(path, json={"as_of": "2100-01-01T00:00:00Z"}, headers=as_agent("ops"))
        assert_envelope(r, 403, "FORBIDDEN")
        assert r.json()["error"]["details"] == {"clock_override": False}
    # Without as_of both still work.
    assert http.post("/admin/lifecycle/run", json={}, headers=as_agent("ops")).status_code == 200
    assert http.post("/admin/purge", json={}, headers=as_agent("ops")).status_code == 200


def test_no_api_call_purges_a_recent_deletion_or_pushes_lifecycle_into_the_future(http):
    """The retention promise on a production server: every admin call, with every body the
    API accepts or refuses, leaves a cell deleted seconds ago in place and no cell dated
    after the real clock."""
    cell = make_cell(http)
    http.patch(f"/memories/{cell['id']}", json={"lifecycle": {"status": "archived"}}, headers=as_agent("ada"))
    assert http.delete(f"/memories/{cell['id']}", headers=as_agent("ada")).status_code == 204
    future = "2100-01-01T00:00:00Z"
    attempts = [
        ("/admin/purge", {}), ("/admin/purge", {"ids": [cell["id"]]}), ("/admin/purge", {"as_of": future}),
        ("/admin/purge", {"ids": [cell["id"]], "as_of": future}), ("/admin/lifecycle/run", {"as_of": future}),
        ("/admin/lifecycle/run", {}), ("/admin/purge", {"ids": [cell["id"]], "now": future}),
    ]
    for path, body in attempts:
        r = http.post(path, json=body, headers=as_agent("ops"))
        assert r.status_code in (200, 403, 422), r.text
        if path == "/admin/purge" and r.status_code == 200:
            assert cell["id"] not in r.json()["purged"]
    history = http.get(f"/memories/{cell['id']}/history", headers=as_agent("ada"))
    assert history.status_code == 403  # deleted: never readable, but still stored:
    refused = http.post("/admin/purge", json={"ids": [cell["id"]]}, headers=as_agent("ops")).json()["refused"]
    assert [x["id"] for x in refused] == [cell["id"]] and "retention" in refused[0]["reason"]
    other = make_cell(http)
    now = datetime.now(timezone.utc)
    got = http.get(f"/memories/{other['id']}", headers=as_agent("ada")).json()["lifecycle"]
    assert datetime.fromisoformat(got["last_updated_at"].replace("Z", "+00:00")) <= now + timedelta(minutes=1)


def test_clock_override_is_an_explicit_flag_refused_with_auth(tmp_path, monkeypatch):
    settings = Settings(store=f"sqlite:///{tmp_path}/clock.db", embedder="none", allow_clock_override=True)
    with TestClient(create_app(settings), base_url="http://testserver/amp/v1") as http:
        caps = http.get("/spec").json()["capabilities"]
        assert caps["clock_override"] is True and "lifecycle_as_of" in caps["extensions"]
        r = http.post("/admin/lifecycle/run", json={"as_of": "2031-05-06T07:08:09Z"}, headers=as_agent("ops"))
        assert r.status_code == 200 and r.json()["ran_at"].startswith("2031-05-06T07:08:09")
    assert Settings().allow_clock_override is False
    monkeypatch.setenv("AMPKIT_ALLOW_CLOCK_OVERRIDE", "true")
    assert Settings().allow_clock_override is True
    monkeypatch.delenv("AMPKIT_ALLOW_CLOCK_OVERRIDE")
    # The refusal precedes everything `serve` starts, so it runs in this process; the port is
    # held here, so that a server that did not refuse would fail to bind instead of listening.
    with socket.create_server(("127.0.0.1", 0)) as held:
        refused = run_cli("serve", "--auth", "--allow-clock-override", "--port", str(held.getsockname()[1]),
                          "--store", f"sqlite:///{tmp_path}/x.db")
    assert refused.returncode == 2 and "clock override" in refused.stderr


# ---------------------------------------------------------------- holes 5 and 6: validation
def nested(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"n": value}
    return value


BAD_CREATES = {
    "nul in text": {"content": {"text": "a\u0000b"}},
    "lone surrogate in text": {"content": {"text": "a\ud800b"}},
    "nul in metadata value": {"content": {"text": "t", "metadata": {"k": "a\u0000"}}},
    "nul in metadata key": {"content": {"text": "t", "metadata": {"k\u0000": 1}}},
    "surrogate in metadata key": {"content": {"text": "t", "metadata": {"\udfff": 1}}},
    "surrogate in metadata value": {"content": {"text": "t", "metadata": {"k": ["\ud834"]}}},
    "nul in owner_id": {"identity": {"owner_id": "ada\u0000"}},
    "surrogate in owner_id": {"identity": {"owner_id": "ada\ud800"}},
    "nul in session_id": {"identity": {"owner_id": "ada", "session_id": "s\u0000"}},
    "surrogate in session_id": {"identity": {"owner_id": "ada", "session_id": "s\udc00"}},
    "surrogate in readable_by": {"access_policy": {"readable_by": ["bo\udc00b"]}},
    "surrogate in source_ref": {"provenance": {"source_ref": "x\ud800"}},
    "nul in source_ref": {"provenance": {"source_ref": "x\u0000"}},
    "metadata too deep": {"content": {"text": "t", "metadata": nested(300)}},
    "metadata over the advertised depth": {"content": {"text": "t", "metadata": nested(33)}},
    "expires_at before year 1 in UTC": {"lifecycle": {"expires_at": "0001-01-01T00:00:00+05:00"}},
    "expires_at after year 9999 in UTC": {"lifecycle": {"expires_at": "9999-12-31T23:59:59-05:00"}},
    "integer metadata over 2^63": {"content": {"text": "t", "metadata": {"k": 2 ** 63}}},
}
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999"]


def raw_post(http: httpx.Client, path: str, raw: bytes, agent: str = "ada") -> httpx.Response:
    return http.post(path, content=raw, headers={**as_agent(agent), "Content-Type": "application/json"})


def body_with(changes: dict) -> dict:
    body = json.loads(json.dumps(CELL))
    for section, values in changes.items():
        body[section] = {**body.get(section, {}), **values}
    return body


@pytest.mark.parametrize("case", sorted(BAD_CREATES))
def test_bad_values_are_refused_with_422_on_a_connection_that_stays_usable(http, case):
    raw = json.dumps(body_with(BAD_CREATES[case])).encode()  # ensure_ascii: \ud800 stays an escape
    r = raw_post(http, "/memories", raw)
    assert_envelope(r, 422, "VALIDATION_ERROR")
    assert r.headers.get("connection") != "close"
    assert http.get("/health").status_code == 200


def test_the_metadata_depth_limit_is_advertised_and_exact(http):
    depth = http.get("/spec").json()["capabilities"]["max_metadata_depth"]
    assert depth == 32
    ok = http.post("/memories", json=body_with({"content": {"text": "t", "metadata": nested(depth)}}), headers=as_agent("ada"))
    assert ok.status_code == 201, ok.text
    deep = http.post("/memories", json=body_with({"content": {"text": "t", "metadata": nested(depth + 1)}}), headers=as_agent("ada"))
    assert_envelope(deep, 422, "VALIDATION_ERROR")
    r = http.get("/export", headers=as_agent("ada"))
    assert r.status_code == 200


@pytest.mark.parametrize("literal", NON_FINITE)
def test_non_finite_numbers_are_refused_not_stored_as_null(http, literal):
    raw = ('{"content": {"text": "t", "metadata": {"k": %s, "n": [1, {"x": %s}]}}, "identity": {"owner_id": "ada"}}'
           % (literal, literal)).encode()
    assert_envelope(raw_post(http, "/memories", raw), 422, "VALIDATION_ERROR")
    search = ('{"query": "x", "metadata": {"k": %s}}' % literal).encode()
    assert_envelope(raw_post(http, "/memories/search", search), 422, "VALIDATION_ERROR")
    r = http.get("/memories", params={"metadata": '{"k": %s}' % literal}, headers=as_agent("ada"))
    assert_envelope(r, 422, "VALIDATION_ERROR")


BAD_FILTERS = [{"k": 2 ** 63}, {"k": -(2 ** 63) - 1}, {"\u0000": 1}, {"k\u0000": "v"}, {"k": "v\u0000"},
               {"k": {"n": [1, "\u0000"]}}, {"\ud800": 1}, {"k": "\udfff"}, nested(40)]


@pytest.mark.parametrize("flt", BAD_FILTERS, ids=range(len(BAD_FILTERS)))
def test_filter_values_sql_cannot_compare_are_refused(http, flt):
    raw = json.dumps({"query": "vault", "metadata": flt}).encode()
    assert_envelope(raw_post(http, "/memories/search", raw), 422, "VALIDATION_ERROR")
    r = http.get("/memories", params={"metadata": json.dumps(flt)}, headers=as_agent("ada"))
    assert_envelope(r, 422, "VALIDATION_ERROR")
    assert http.get("/health").status_code == 200


def test_filters_at_the_edge_of_the_grammar_are_answered(http):
    for flt in ({"k": 2 ** 63 - 1}, {"k": -(2 ** 63)}, {"k": 1e300}, {"k": "é\u2028"}, {"k": None}, {"k": [1, {"a": True}]}):
        assert http.post("/memories/search", json={"query": "vault", "metadata": flt}, headers=as_agent("ada")).status_code == 200
        assert http.get("/memories", params={"metadata": json.dumps(flt)}, headers=as_agent("ada")).status_code == 200


@pytest.mark.parametrize("param", ["owner_id", "session_id", "cursor"])
@pytest.mark.parametrize("value", ["a\u0000b", "mem_\u0000"])
def test_list_parameters_with_nul_are_refused(http, param, value):
    r = http.get("/memories", params={param: value}, headers=as_agent("ada"))
    assert_envelope(r, 422, "VALIDATION_ERROR")
    r = http.get("/export", params={"owner_id": value}, headers=as_agent("ada"))
    assert_envelope(r, 422, "VALIDATION_ERROR")
    # The streamed NDJSON export too: refused before its stream starts, not a broken stream.
    r = http.get("/admin/export", params={"owner_id": value}, headers=as_agent("ada"))
    assert_envelope(r, 422, "VALIDATION_ERROR")


def test_a_cursor_that_decodes_to_nul_is_refused(http):
    import base64

    cursor = base64.urlsafe_b64encode("mem_\u0000\u0000".encode()).decode().rstrip("=")
    assert_envelope(http.get("/memories", params={"cursor": cursor}, headers=as_agent("ada")), 422, "VALIDATION_ERROR")


def test_search_fields_with_nul_or_surrogates_are_refused(http):
    for body in ('{"query": "a\\u0000"}', '{"query": "\\ud800"}', '{"query": "x", "owner_id": "a\\u0000"}',
                 '{"query": "x", "session_id": "\\udfff"}'):
        assert_envelope(raw_post(http, "/memories/search", body.encode()), 422, "VALIDATION_ERROR")


def test_patches_are_validated_like_creates(http):
    cell = make_cell(http)
    for patch in ({"content": {"text": "a\u0000"}}, {"content": {"metadata": {"k": "\ud800"}}},
                  {"identity": {"session_id": "s\u0000"}}, {"content": {"metadata": nested(33)}},
                  {"lifecycle": {"expires_at": "0001-01-01T00:00:00+05:00"}}):
        r = http.patch(f"/memories/{cell['id']}", content=json.dumps(patch).encode(),
                       headers={**as_agent("ada"), "Content-Type": "application/json"})
        assert_envelope(r, 422, "VALIDATION_ERROR")
    raw = b'{"content": {"metadata": {"k": NaN}}}'
    r = http.patch(f"/memories/{cell['id']}", content=raw, headers={**as_agent("ada"), "Content-Type": "application/json"})
    assert_envelope(r, 422, "VALIDATION_ERROR")


def test_admin_times_that_cannot_be_converted_are_refused(http):
    for body in ({"as_of": "0001-01-01T00:00:00+05:00"}, {"as_of": "9999-12-31T23:59:59-05:00"}):
        for path in ("/admin/lifecycle/run", "/admin/purge"):
            r = http.post(path, json=body, headers=as_agent("ops"))
            assert_envelope(r, 422, "VALIDATION_ERROR")


@pytest.mark.parametrize("raw", [b'{"query": "\xff\xfe"}', b"[" * 100_000 + b"]" * 100_000,
                                 b'{"query": "x", "metadata": ' + b'{"a":' * 5000 + b"1" + b"}" * 5001])
def test_undecodable_or_overdeep_json_is_malformed_json(http, raw):
    r = raw_post(http, "/memories/search", raw)
    assert_envelope(r, 400, "MALFORMED_JSON")
    assert http.get("/health").status_code == 200


def test_overdeep_metadata_query_parameter_is_a_422(http):
    r = http.get("/memories", params={"metadata": "[" * 3000 + "]" * 3000}, headers=as_agent("ada"))
    assert_envelope(r, 422, "VALIDATION_ERROR")


def test_every_refusal_keeps_the_keep_alive_connection(srv):
    """One raw socket, several bad requests and a good one after each: all answered."""
    host, port = "127.0.0.1", srv.port
    bad = [
        ("POST", "/amp/v1/memories", b'{"content": {"text": "a\\u0000"}, "identity": {"owner_id": "ada"}}'),
        ("POST", "/amp/v1/memories/search", b'{"query": "x", "metadata": {"k": 1e999}}'),
        ("POST", "/amp/v1/memories/search", b'{"query": "\xff"}'),
        ("GET", "/amp/v1/memories?owner_id=a%00b", b""),
        ("POST", "/amp/v1/memories", json.dumps(body_with({"lifecycle": {"expires_at": "9999-12-31T23:59:59-05:00"}})).encode()),
    ]
    with socket.create_connection((host, port), timeout=30) as sock:
        stream = sock.makefile("rb")
        for method, path, body in bad + [("GET", "/amp/v1/health", b"")]:
            head = (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nX-AMP-Agent-ID: ada\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
            sock.sendall(head + body)
            status = stream.readline().split()[1]
            length, close = 0, False
            while (line := stream.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
                if name.lower() == "connection" and "close" in value.lower():
                    close = True
            stream.read(length)
            assert not close, (path, status)
            assert int(status) < 500, (path, status)


def test_export_answers_for_everything_accepted(http):
    make_cell(http, content={"text": "edge é \u2028 \U0001f600", "metadata": {"big": 2 ** 63 - 1, "f": 1e308,
                                                                          "deep": nested(31), "s": "\u2029"}})
    r = http.get("/export", headers=as_agent("ada"))
    assert r.status_code == 200, r.text
    assert r.json()["count"] >= 1


# ---------------------------------------------------------------- hole 8: AMP wire compatibility
def test_patch_accepts_server_managed_fields_sent_back_unchanged(http):
    cell = make_cell(http)
    got = http.get(f"/memories/{cell['id']}", headers=as_agent("ada")).json()
    whole = {k: v for k, v in got.items()}
    whole["lifecycle"] = {**got["lifecycle"], "status": "archived"}
    whole["scoring"] = {**got["scoring"], "importance": 0.9}
    r = http.patch(f"/memories/{cell['id']}", json=whole, headers=as_agent("ada"))
    assert r.status_code == 200, r.text
    assert r.json()["lifecycle"]["status"] == "archived" and r.json()["scoring"]["importance"] == 0.9
    assert r.json()["lifecycle"]["created_at"] == got["lifecycle"]["created_at"]

    for change in ({"lifecycle": {"created_at": "2001-01-01T00:00:00Z"}}, {"identity": {"owner_id": "eve"}},
                   {"identity": {"created_by": "eve"}}, {"id": "mem_" + "0" * 26}, {"type": "episodic"},
                   {"lifecycle": {"superseded_by": "mem_" + "1" * 26}}, {"amp_version": "0.2.0"}):
        r = http.patch(f"/memories/{cell['id']}", json=change, headers=as_agent("ada"))
        assert_envelope(r, 422, "VALIDATION_ERROR")
        assert "server" in r.json()["error"]["message"]


def test_amp_0_1_client_archive_then_delete_sequence(http):
    """AMP 0.1's `AMPClient.forget`: GET the cell, PATCH {"lifecycle": {"created_at": <as
    read>, "status": "archived"}}, DELETE, expecting 204."""
    cell = make_cell(http)
    agent = as_agent("ada")
    got = http.get(f"/memories/{cell['id']}", headers=agent)
    assert got.status_code == 200
    created_at = got.json()["lifecycle"]["created_at"]
    patched = http.patch(f"/memories/{cell['id']}", json={"lifecycle": {"created_at": created_at, "status": "archived"}},
                         headers=agent)
    assert 200 <= patched.status_code < 300, patched.text
    deleted = http.delete(f"/memories/{cell['id']}", headers=agent)
    assert deleted.status_code == 204
    assert_envelope(http.get(f"/memories/{cell['id']}", headers=agent), 403, "ACCESS_DENIED")


def test_an_unexpected_error_answers_500_and_keeps_the_connection(tmp_path):
    """A bug that escapes every handler: 500 in the envelope, and the same keep-alive
    connection serves the next request (Starlette's outer error middleware would close it)."""
    import threading
    import time

    import uvicorn

    from support import free_port

    app = create_app(Settings(store=f"sqlite:///{tmp_path}/boom.db", embedder="none", lifecycle_interval_seconds=0))

    @app.get("/amp/v1/test-boom")
    def boom() -> None:
        raise RuntimeError("a bug")

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            stream = sock.makefile("rb")
            statuses = []
            for path in ("/amp/v1/test-boom", "/amp/v1/health", "/amp/v1/test-boom", "/amp/v1/health"):
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                statuses.append(int(stream.readline().split()[1]))
                length = 0
                while (line := stream.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                    assert not (name.lower() == "connection" and "close" in value.lower())
                body = stream.read(length)
                if statuses[-1] == 500:
                    assert json.loads(body)["error"]["code"] == "INTERNAL_ERROR"
            assert statuses == [500, 200, 500, 200]
    finally:
        server.should_exit = True
        thread.join(10)
