"""The operations' routes take a shorter way through a request than FastAPI's own handler
(core/server/routes.py). Differential: the same requests, good and bad, to an app on the
short way and to one on FastAPI's handler (each on a SQLite file of its own, in process)
get the same status, the same content type and headers, and the same body (ids and times
masked)."""

from __future__ import annotations

import json
import re

import pytest
from fastapi.routing import APIRoute
from starlette.testclient import TestClient

from ampkit.auth import create_key
from ampkit.config import Settings
from ampkit.operations import OPERATIONS
from ampkit.server.app import api_routes, create_app
from ampkit.server.routes import OperationRoute

CELL = {"type": "semantic", "content": {"text": "the vault code is 4812"},
        "identity": {"owner_id": "ada", "owner_type": "user", "session_id": "chat-42"}}
JSON = {"Content-Type": "application/json"}


def body(**changes) -> bytes:
    cell = json.loads(json.dumps(CELL))
    for section, values in changes.items():
        if isinstance(values, dict):
            cell.setdefault(section, {}).update(values)
        else:
            cell[section] = values
    return json.dumps(cell).encode()


# (method, path, headers, body): headers name a key ("key") or an agent; ids of cells made
# earlier in the list are written {0}, {1}, ... (the n-th 201 answer's id).
REQUESTS = [
    ("GET", "/health", {}, None),
    ("GET", "/spec", {}, None),
    ("HEAD", "/health", {}, None),
    ("OPTIONS", "/memories", {}, None),
    ("POST", "/memories", JSON, body()),
    ("POST", "/memories", JSON, body()),  # the same text again: 200 and X-AMP-Dedup
    ("POST", "/memories", JSON, body(content={"text": "ada keeps a dog named rex"})),
    ("POST", "/memories", {"Content-Type": "application/json; charset=utf-8"}, body(content={"text": "third"})),
    ("POST", "/memories", {"Content-Type": "application/vnd.amp+json"}, body(content={"text": "fourth"})),
    ("POST", "/memories", JSON, b'{"type": "semantic", '),  # not JSON
    ("POST", "/memories", JSON, b'{"type": "\xff"}'),  # not UTF-8
    ("POST", "/memories", JSON, b"[" * 5000 + b"]" * 5000),  # nested too deep for the decoder
    ("POST", "/memories", {"Content-Type": "text/plain"}, body()),
    ("POST", "/memories", {}, body()),  # no Content-Type
    ("POST", "/memories", JSON, b""),  # no body
    ("POST", "/memories", JSON, b"[]"),
    ("POST", "/memories", JSON, b'{"type": "semantic"}'),
    ("POST", "/memories", JSON, body(type="lore")),
    ("POST", "/memories", JSON, body(scoring={"importance": 7})),
    ("POST", "/memories", {"Content-Type": "text/plain"}, b"{not json"),
    ("POST", "/memories/batch", JSON, json.dumps({"cells": [json.loads(body(content={"text": "b1"})),
                                                             json.loads(body(content={"text": "b2"}))]}).encode()),
    ("POST", "/memories/batch", JSON, b'{"cells": [{"type": 1}]}'),
    ("GET", "/memories?owner_id=ada", {}, None),
    ("GET", "/memories?owner_id=ada&limit=abc", {}, None),
    ("GET", "/memories?owner_id=ada&limit=0", {}, None),
    ("GET", "/memories?owner_id=ada&limit=2&type=episodic&type=semantic", {}, None),
    ("GET", "/memories/{0}", {}, None),
    ("GET", "/memories/mem_01M91ST0W4TW0V4ZB8JT6Y9DAY", {}, None),
    ("GET", "/memories/not-an-id", {}, None),
    ("GET", "/memories/{0}/history", {}, None),
    ("HEAD", "/memories/{0}", {}, None),
    ("GET", "/memories/{0}?as_of=yesterday", {}, None),
    ("GET", "/memories?owner_id=ada&owner_id=bob", {}, None),
    ("PATCH", "/memories/{0}", {**JSON, "If-Match": "1"}, b'{"scoring": {"importance": 0.9}}'),
    ("PATCH", "/memories/{0}", {**JSON, "If-Match": "1"}, b'{"scoring": {"importance": 0.8}}'),  # stale
    ("PATCH", "/memories/{0}", {**JSON, "If-Match": "one"}, b'{"scoring": {"importance": 0.8}}'),
    ("PATCH", "/memories/{0}", {**JSON, "If-Match": "one"}, b'{"scoring": '),
    ("PATCH", "/memories/{0}", {"Content-Type": "application/merge-patch+json"}, b'{"scoring": {"importance": 0.7}}'),
    ("POST", "/memories/search", JSON, b'{"query": "dog", "owner_id": "ada"}'),
    ("POST", "/memories/search", JSON, b'{"query": "dog", "owner_id": "ada", "limit": -1}'),
    ("POST", "/memories/search", JSON, b'{"query": "dog", "owner_id": "ada", "extra": 1}'),
    ("POST", "/memories/search", JSON, b'{"query": "dog", "owner_id": "ada"} trailing'),
    ("POST", "/memories/search", JSON, b'{"query": "\\u00e9t\\u00e9 \\ud83c\\udf1e", "owner_id": "ada"}'),
    ("POST", "/memories/search", JSON, b'{"query": "\\ud800", "owner_id": "ada"}'),  # a lone surrogate
    ("POST", "/memories/search?explain=true", JSON, b'{"query": "dog", "owner_id": "ada"}'),
    ("POST", "/memories/{1}/outcome", JSON, b'{"success": true}'),
    ("DELETE", "/memories/{1}", {}, None),  # active: refused
    ("PATCH", "/memories/{1}", JSON, b'{"lifecycle": {"status": "archived"}}'),
    ("DELETE", "/memories/{1}", {}, None),
    ("DELETE", "/memories/{1}?hard=maybe", {}, None),
    ("POST", "/admin/purge", JSON, b"{}"),
    ("GET", "/nowhere", {}, None),
    ("PUT", "/memories", JSON, body()),
]
IDENTITIES = ["ada", "mallory", None]  # who sends each request: an agent, another one, no one

ULID = re.compile(r"mem_[0-9A-HJKMNP-TV-Z]{26}")
CURSOR = re.compile(r'"next_cursor":"[^"]+"')  # it encodes a cell's id
# /health's: where its background start-up work is, and each background loop's state of the moment
STATE = re.compile(r'"vector_index":\{[^}]*\}|"state":"[a-z]+"')
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")


def _swap_to_fastapis_handler(app) -> None:
    """Replace the app's /amp/v1 routes with the same ones on FastAPI's own handler."""
    limits = app.state.service.limits
    ours = {id(route): i for i, route in enumerate(api_routes(limits))}
    generic = api_routes(limits, APIRoute)
    routes = app.router.routes
    for i, route in enumerate(list(routes)):
        if id(route) in ours:
            routes[i] = generic[ours[id(route)]]


def _answers(tmp_path, name: str, auth: str, fastapi_handler: bool) -> list[tuple]:
    settings = Settings(store=f"sqlite:///{tmp_path}/{name}.db", auth=auth, embedder="none",
                        lifecycle_interval_seconds=0)
    app = create_app(settings)
    if fastapi_handler:
        _swap_to_fastapis_handler(app)
    answers = []
    with TestClient(app, base_url="http://testserver/amp/v1") as http:
        store = app.state.service.store
        tokens = {agent: create_key(store, agent, "read,write,admin").token for agent in ("ada", "mallory")}
        ids: list[str] = []
        for who in IDENTITIES:
            for method, path, headers, content in REQUESTS:
                if who is not None:
                    headers = {**headers, **({"Authorization": f"Bearer {tokens[who]}"} if auth == "required"
                                             else {"X-AMP-Agent-ID": who})}
                try:
                    path = path.format(*ids)
                except IndexError:  # the cells it names were not made (no one may write)
                    path = path.replace("{", "").replace("}", "")
                r = http.request(method, path, headers=headers, content=content)
                if r.status_code == 201 and method == "POST" and path == "/memories":
                    ids.append(r.json()["id"])
                text = CURSOR.sub("C", STATE.sub("S", TIME.sub("T", ULID.sub("mem_X", r.text))))
                kept = {k: v for k, v in r.headers.items() if k not in ("date", "content-length")}
                answers.append((who, method, path if "mem_" not in path else ULID.sub("mem_X", path),
                                r.status_code, kept, text))
    return answers


@pytest.mark.parametrize("auth", ["off", "required"])
def test_the_short_way_answers_every_request_as_fastapis_handler_does(tmp_path, auth):
    short = _answers(tmp_path, "short", auth, fastapi_handler=False)
    generic = _answers(tmp_path, "generic", auth, fastapi_handler=True)
    assert len(short) == len(generic) == len(REQUESTS) * len(IDENTITIES)
    for ours, theirs in zip(short, generic):
        assert ours == theirs
    statuses = {answer[3] for answer in short}
    # The list reaches what it is meant to: successes, refusals and each kind of bad input.
    assert {200, 201, 204, 400, 404, 405, 409, 415, 422} <= statuses, statuses
    assert 401 in statuses if auth == "required" else True


def test_every_operation_takes_the_short_way():
    limits = create_app(Settings(store="memory://", lifecycle_interval_seconds=0)).state.service.limits
    routes = {route.name: route for route in api_routes(limits) if isinstance(route, OperationRoute)}
    assert {op.name for op in OPERATIONS} <= set(routes)
    assert all(routes[op.name].straight for op in OPERATIONS), [
        op.name for op in OPERATIONS if not routes[op.name].straight]
    assert routes["export_ndjson"].straight is False  # a sync endpoint streaming bytes: FastAPI's handler
