"""The HTTP client against answers recorded from our real server (vcrpy cassettes).

Replay needs no server: it checks that the client parses every answer into the models and
maps every error to its class, sync and async. `test_recorded_bodies_match_the_schema`
fails when a recorded body no longer validates against the published schema
(`spec/openapi.json`, every cell also against `spec/memory-cell.schema.json`; the server's
generated OpenAPI document if the file is absent), and checks that the bodies the client
sent in successful calls are valid requests: the signal to look at what changed on the wire.

Re-record (serves the real app over HTTP on a temp SQLite file):

    RECORD_CASSETTES=1 .venv/bin/python -m pytest tests/test_client_cassettes.py

Requests are matched on method, path with cell ids wildcarded, and query with the cursor
wildcarded, so recorded ids and timestamps never break replay.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import jsonschema
import pytest
import vcr
import yaml

import ampkit
from ampkit import AccessDenied, Conflict, InvalidTransition, MissingAgentId, PayloadTooLarge, ValidationFailed
from support import ROOT, AppServer

RECORD = os.environ.get("RECORD_CASSETTES") == "1"  # conftest clears AMPKIT_* variables
CASSETTES = Path(__file__).parent / "cassettes"
_ID = re.compile(r"mem_[0-9A-Z]{26}")


def _path_pattern(r1, r2) -> None:
    assert _ID.sub("mem_*", urlsplit(r1.uri).path) == _ID.sub("mem_*", urlsplit(r2.uri).path)


def _query_pattern(r1, r2) -> None:
    def norm(uri):
        return sorted((k, "*" if k == "cursor" else v) for k, v in parse_qsl(urlsplit(uri).query))

    assert norm(r1.uri) == norm(r2.uri)


def _shorten_body(request):
    """Keep cassettes readable: the oversized-cell request body is 70 kB of one letter."""
    if request.body and len(request.body) > 2048:
        request.body = request.body[:200] + b"...(cut when recorded)"
    return request


recorder = vcr.VCR(
    cassette_library_dir=str(CASSETTES),
    record_mode="all" if RECORD else "none",
    match_on=["method", "path_pattern", "query_pattern"],
    filter_headers=["authorization"],
    before_record_request=_shorten_body,
)
recorder.register_matcher("path_pattern", _path_pattern)
recorder.register_matcher("query_pattern", _query_pattern)


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    if not RECORD:
        yield "http://127.0.0.1:9/amp/v1"  # nothing listens there: every answer comes from a cassette
        return
    tmp = tmp_path_factory.mktemp("record")
    with AppServer(f"sqlite:///{tmp}/memory.db", log_path=tmp / "server.log") as server:
        yield server.base_url


# ---------------------------------------------------------------- scenarios (recorded and replayed)


async def cells_scenario(mem) -> dict:
    """Every cell operation once. `mem` is an AsyncClient or an awaitable wrapper of a Client."""
    out: dict = {"health": await mem.health(), "spec": await mem.spec()}
    tea = await mem.remember("Ada prefers green tea", owner_id="ada", importance=0.9,
                             metadata={"topic": "drinks"}, readable_by=["team-*"])
    out["remember"] = tea
    out["remember_many"] = await mem.remember_many([{"text": f"fact {i}", "owner_id": "ada"} for i in range(4)])
    out["get"] = await mem.get(tea.id)
    out["update"] = await mem.update(tea.id, expected_version=1, text="Ada loves green tea")
    out["search"] = await mem.search("green tea", owner_id="ada", explain=True)
    out["list"] = [cell async for cell in mem.list(owner_id="ada", page_size=2)]
    out["supersede"] = await mem.supersede(tea.id, "Ada switched to coffee")
    out["history"] = await mem.history(tea.id)
    out["forget"] = await mem.forget(out["remember_many"][0].id)
    out["export"] = await mem.export(owner_id="ada")
    out["lifecycle"] = await mem.run_lifecycle()
    out["purge"] = await mem.purge([out["remember_many"][0].id])
    return out


ERRORS = {
    "missing agent": (MissingAgentId, lambda c: c["anonymous"].get(c["cell"].id)),
    "access denied": (AccessDenied, lambda c: c["mem"].get("mem_" + "0" * 26)),
    "invalid transition": (InvalidTransition, lambda c: c["mem"].update(c["cell"].id, status="deleted")),
    "conflict": (Conflict, lambda c: c["mem"].update(c["cell"].id, expected_version=9, text="x")),
    "validation": (ValidationFailed, lambda c: c["mem"].remember("x", owner_id="o", importance=3)),
    "too large": (PayloadTooLarge, lambda c: c["mem"].remember("x" * 70_000, owner_id="o")),
}


async def errors_scenario(mem, anonymous) -> dict:
    clients = {"mem": mem, "anonymous": anonymous, "cell": await mem.remember("guarded", owner_id="o")}
    out = {}
    for name, (_, action) in ERRORS.items():
        try:
            await action(clients)
        except ampkit.APIError as exc:
            out[name] = exc
    return out


class Awaitable:
    """A sync Client behind awaitable methods, so one scenario drives both shells."""

    def __init__(self, client: ampkit.Client):
        self._client = client

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if name == "list":
            async def pages(**kwargs):
                for cell in attr(**kwargs):
                    yield cell

            return pages

        async def call(*args, **kwargs):
            return attr(*args, **kwargs)

        return call


async def _run(shell: str, base_url: str, scenario, *agents):
    if shell == "async":
        clients = [ampkit.aconnect(base_url, agent_id=a, retries=0) for a in agents]
        try:
            return await scenario(*clients)
        finally:
            for c in clients:
                await c.aclose()
    sync_clients = [ampkit.connect(base_url, agent_id=a, retries=0) for a in agents]
    try:
        return await scenario(*[Awaitable(c) for c in sync_clients])
    finally:
        for c in sync_clients:
            c.close()


# Recording happens once, with the sync shell; the async shell replays the same cassette.
SHELLS = ["sync"] if RECORD else ["sync", "async"]


@pytest.mark.parametrize("shell", SHELLS)
def test_cells_cassette_parses_into_models(base_url, shell):
    with recorder.use_cassette("client_cells.yaml") as cassette:
        out = asyncio.run(_run(shell, base_url, cells_scenario, "recorder"))
    assert RECORD or cassette.all_played
    assert out["health"].status == "ok" and "extensions" in out["spec"]["capabilities"]
    tea = out["remember"]
    assert (tea.content.metadata, tea.scoring.importance, tea.access_policy.readable_by) == (
        {"topic": "drinks"}, 0.9, ["team-*"])
    assert [c.content.text for c in out["remember_many"]] == [f"fact {i}" for i in range(4)]
    assert out["get"].scoring.access_count == 1
    assert out["update"].content.text == "Ada loves green tea" and out["update"].lifecycle.version == 2
    assert out["search"][0].cell.id == tea.id and out["search"][0].score > 0 and out["search"][0].explain
    assert len(out["list"]) == 5 and len({c.id for c in out["list"]}) == 5  # three pages of two
    assert out["supersede"].lifecycle.supersedes == tea.id
    assert [e.action for e in out["history"]][:2] == ["create", "update"]
    assert out["forget"] is None
    assert out["remember_many"][0].id not in {c.id for c in out["export"]}
    assert out["lifecycle"].evaluated >= 1
    assert out["purge"].purged == [] and out["purge"].refused[0].id == out["remember_many"][0].id


@pytest.mark.parametrize("shell", SHELLS)
def test_errors_cassette_maps_each_code_to_its_class(base_url, shell):
    with recorder.use_cassette("client_errors.yaml") as cassette:
        out = asyncio.run(_run(shell, base_url, errors_scenario, "recorder", None))
    assert RECORD or cassette.all_played
    assert set(out) == set(ERRORS)
    for name, (expected, _) in ERRORS.items():
        exc = out[name]
        assert type(exc) is expected and exc.code == expected.code and exc.status == expected.status, name
        assert exc.message and isinstance(exc.details, dict)


# ---------------------------------------------------------------- the recorded bodies against the schema


def _openapi() -> dict:
    published = ROOT / "spec" / "openapi.json"
    if published.is_file():
        return json.loads(published.read_text())
    from ampkit.server.app import create_app  # generated from the same models until the file lands

    return create_app().openapi()


def _operation(openapi: dict, method: str, path: str) -> dict:
    """The OpenAPI operation a recorded request hit; static paths win over templated ones."""
    templates = sorted(openapi["paths"], key=lambda t: (t.count("{"), -len(t)))
    for template in templates:
        pattern = "^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$"
        operation = openapi["paths"][template].get(method.lower())
        if operation and re.match(pattern, path):
            return operation
    raise AssertionError(f"no operation in the schema for {method} {path}")


def _interactions():
    for cassette in sorted(CASSETTES.glob("*.yaml")):
        for i, interaction in enumerate(yaml.safe_load(cassette.read_text())["interactions"]):
            yield pytest.param(interaction, id=f"{cassette.stem}-{i}")


def _errors(schema: dict, openapi: dict, body) -> list:
    validator = jsonschema.Draft202012Validator({**schema, "components": openapi["components"]})
    return sorted(validator.iter_errors(body), key=str)


@pytest.mark.parametrize("interaction", list(_interactions()))
def test_recorded_bodies_match_the_schema(interaction):
    openapi = _openapi()
    request, response = interaction["request"], interaction["response"]
    status = response["status"]["code"]
    where = f"{request['method']} {request['uri']} ({status})"
    operation = _operation(openapi, request["method"], urlsplit(request["uri"]).path)
    declared = operation["responses"].get(str(status)) or operation["responses"].get("default")
    assert declared, f"{where}: the schema does not declare this status"
    if status < 400 and "requestBody" in operation:  # what the client sent is protocol-valid too
        sent = operation["requestBody"]["content"]["application/json"]["schema"]
        problems = _errors(sent, openapi, json.loads(request["body"] or "null"))
        assert not problems, f"{where} request: {problems[0].message}"
    body = response["body"]["string"]
    if status == 204:
        assert not body
        return
    schema = declared["content"]["application/json"]["schema"]
    problems = _errors(schema, openapi, json.loads(body))
    assert not problems, f"{where}: {problems[0].message}"
    cell_schema = ROOT / "spec" / "memory-cell.schema.json"
    if schema.get("$ref", "").endswith("/MemoryCell") and cell_schema.is_file():
        validator = jsonschema.Draft202012Validator(json.loads(cell_schema.read_text()))
        assert not list(validator.iter_errors(json.loads(body))), f"{where}: not a valid memory cell"
