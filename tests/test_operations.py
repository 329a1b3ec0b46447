"""The operations table is the one description of the wire: the routes, the in-process
transport and the client's calls are all made from it, so they cannot disagree."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

import ampkit
from ampkit.bootstrap import load_settings
from ampkit.client import _calls as calls
from ampkit.errors import APIError
from ampkit.operations import OPERATIONS, PREFIX
from ampkit.server.app import create_app


@pytest.fixture(scope="module")
def app():
    return create_app(load_settings(env=False, store="memory://", lifecycle_interval_seconds=0, allowed_hosts="testserver"))


def test_every_row_is_a_route_with_its_method_path_and_security(app):
    document = app.openapi()
    served = {(path, method) for path, operations in document["paths"].items() for method in operations}
    rows = set()
    for op in OPERATIONS:
        for path in (op.path, *(alias for alias, _ in op.aliases)):
            rows.add((PREFIX + path, op.method.lower()))
            operation = document["paths"][PREFIX + path][op.method.lower()]
            assert operation["operationId"].startswith(op.name + "_"), op.name
            assert str(op.status_code) in operation["responses"], op.name
            assert (operation["security"] == []) == (op.scope is None), op.name
    # No route that is not a row, but for the two NDJSON byte streams (docs/architecture.md).
    assert served - rows == {(PREFIX + "/admin/export", "get"), (PREFIX + "/admin/import", "post")}
    assert rows <= served


def test_client_calls_take_method_path_and_retry_rule_from_the_row():
    built = {
        "create_memory": calls.remember("x", owner_id="o"),
        "get_memory": calls.get("mem_X"),
        "patch_memory": calls.update("mem_X", text="y"),
        "delete_memory": calls.delete("mem_X"),
        "memory_history": calls.history("mem_X"),
        "list_route": calls.list_page(),
        "health": calls.health(),
    }
    for name, call in built.items():
        assert call.operation.name == name
        assert call.method == call.operation.method
    assert built["get_memory"].path == "/memories/mem_X"
    assert built["memory_history"].path == "/memories/mem_X/history"
    assert not built["create_memory"].idempotent and built["get_memory"].idempotent
    assert not built["patch_memory"].idempotent and calls.update("mem_X", expected_version=2, text="y").idempotent
    assert not built["health"].needs_agent and built["get_memory"].needs_agent


def _error(action) -> tuple:
    with pytest.raises(APIError) as info:
        action()
    exc = info.value
    return type(exc), exc.code, exc.status, exc.message, exc.details


@pytest.mark.parametrize("case", ["page_size_0", "page_size_too_big", "bad_status", "bad_metadata", "bad_if_match"])
def test_parameters_are_validated_the_same_in_process_and_over_http(app, case):
    actions = {
        "page_size_0": lambda m: list(m.list(page_size=0)),
        "page_size_too_big": lambda m: list(m.list(page_size=10_000)),
        "bad_status": lambda m: m._send(calls.call("list_route", dict, query={"status": ["alive"]})),
        "bad_metadata": lambda m: m._send(calls.call("list_route", dict, query={"metadata": "[1]"})),
        "bad_if_match": lambda m: m._send(calls.call("patch_memory", dict, path_params={"memory_id": "mem_X"},
                                                    headers={"If-Match": "soon"}, body={})),
    }
    with TestClient(app) as http_client, \
            ampkit.Client("http://testserver/amp/v1", agent_id="a", http_client=http_client) as over_http, \
            ampkit.connect("memory://", agent_id="a") as in_process:
        assert _error(lambda: actions[case](over_http)) == _error(lambda: actions[case](in_process))


def test_every_json_row_checks_the_content_type_then_the_caller_then_the_body(app):
    """A row with a required JSON body answers a wrong Content-Type with 415 before it asks
    who calls (the check and the caller are one dependency, in that order), and a missing
    caller with 401 before it validates the body."""
    import re

    rows = [op for op in OPERATIONS if op.request is not None and op.body_required]
    assert any(op.scope == "admin" for op in rows) and any(op.scope not in (None, "admin") for op in rows)
    with TestClient(app, base_url="http://testserver" + PREFIX) as http:
        for op in rows:
            path = re.sub(r"\{[^}]+\}", "x", op.path)
            wrong = http.request(op.method, path, content=b"{}", headers={"Content-Type": "text/plain"})
            assert wrong.status_code == 415 and wrong.json()["error"]["code"] == "UNSUPPORTED_MEDIA_TYPE", op.name
            if op.scope is not None:
                anonymous = http.request(op.method, path, content=b"{}", headers={"Content-Type": "application/json"})
                assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "MISSING_AGENT_ID", op.name
