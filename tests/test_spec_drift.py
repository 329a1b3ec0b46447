"""The checked-in spec artifacts are what the code generates, and they describe the real server."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from ampkit.spec_tools import cell_schema_document, spec_dir, stale_artifacts
from support import TLS


def test_checked_in_artifacts_match_the_code():
    drifted = stale_artifacts()
    assert not drifted, "spec artifacts are out of date; run `make openapi`\n" + "\n".join(drifted.values())


def test_served_openapi_is_the_checked_in_one(server):
    served = httpx.get(f"{server.base_url}/openapi.json", verify=TLS).json()
    checked_in = json.loads((spec_dir() / "openapi.json").read_text())
    assert served == checked_in, "the running server's OpenAPI differs from spec/openapi.json; run `make openapi`"
    assert {"/amp/v1/memories", "/amp/v1/memories/query", "/amp/v1/memories/{memory_id}"} <= set(served["paths"])


def validator(definition: str) -> jsonschema.Draft202012Validator:
    document = json.loads((spec_dir() / "memory-cell.schema.json").read_text())
    assert document == cell_schema_document()
    return jsonschema.Draft202012Validator({**document, "$ref": f"#/$defs/{definition}"})


def test_cells_from_the_server_validate_against_the_schema(server):
    body = {"content": {"text": "schema check", "metadata": {"k": [1, 2]}}, "identity": {"owner_id": "schema-owner"},
            "scoring": {"importance": 0.7}, "access_policy": {"readable_by": ["a_*"]}}
    validator("CellCreate").validate(body)
    created = httpx.post(f"{server.base_url}/memories", json=body, headers={"X-AMP-Agent-ID": "schema-agent"}, verify=TLS)
    assert created.status_code == 201
    validator("MemoryCell").validate(created.json())
    listed = httpx.get(f"{server.base_url}/memories", params={"owner_id": "schema-owner"}, headers={"X-AMP-Agent-ID": "schema-agent"}, verify=TLS)
    validator("ListResponse").validate(listed.json())
    denied = httpx.get(f"{server.base_url}/memories/mem_00000000000000000000000000", headers={"X-AMP-Agent-ID": "schema-agent"}, verify=TLS)
    validator("ErrorEnvelope").validate(denied.json())


@pytest.mark.parametrize("body", [
    {"content": {"text": "x"}, "identity": {"owner_id": "o"}, "id": "mem_01ARZ3NDEKTSV4RRFFQ69G5FAV"},
    {"content": {"text": ""}, "identity": {"owner_id": "o"}},
    {"content": {"text": "x"}, "identity": {"owner_id": "o"}, "type": "dream"},
    {"content": {"text": "x"}, "identity": {"owner_id": "o"}, "scoring": {"importance": 1.5}},
    {"content": {"text": "x"}},
])
def test_schema_refuses_what_the_server_refuses(server, body):
    assert not validator("CellCreate").is_valid(body)
    answer = httpx.post(f"{server.base_url}/memories", json=body, headers={"X-AMP-Agent-ID": "schema-agent"}, verify=TLS)
    assert answer.status_code == 422
