"""Fuzzing: schemathesis drives the checked-in OpenAPI document against a real server
process, with a bounded number of cases per operation. Whatever it sends, the server must not
answer 5xx, and every error must be the `{"error": {"code", "message", "details"}}` envelope.

The document is `spec/openapi.json` when it exists (the one clients are told to trust);
otherwise the app's own `/amp/v1/openapi.json`, generated in-process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from support import ROOT, ServerProcess

MAX_EXAMPLES = int(os.environ.get("AMPKIT_FUZZ_EXAMPLES", "15"))
SPEC = ROOT / "spec" / "openapi.json"


def _document() -> dict:
    if SPEC.exists():
        return json.loads(SPEC.read_text())
    from ampkit.config import Settings
    from ampkit.server.app import create_app

    return create_app(Settings(store="memory://", lifecycle_interval_seconds=0)).openapi()


schema = schemathesis.openapi.from_dict(_document())


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    with ServerProcess(f"sqlite:///{tmp}/fuzz.db", log_path=tmp / "server.log") as proc:
        proc.log = tmp / "server.log"
        yield proc


def _origin(base_url: str) -> str:
    # The document's paths already carry /amp/v1.
    return base_url[: -len("/amp/v1")] if base_url.endswith("/amp/v1") else base_url


def check_error_envelope(ctx, response, case) -> None:
    """Every 4xx/5xx answer is the ampkit error envelope."""
    if response.status_code < 400:
        return
    try:
        body = json.loads(response.content)
    except ValueError as exc:
        raise AssertionError(f"{response.status_code} with a non-JSON body: {response.content[:200]!r}") from exc
    err = body.get("error") if isinstance(body, dict) else None
    assert isinstance(err, dict) and set(err) == {"code", "message", "details"}, body
    assert isinstance(err["code"], str) and err["code"].isupper() and isinstance(err["details"], dict), body


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None,
          suppress_health_check=list(HealthCheck))
def test_no_server_errors_and_every_error_in_the_envelope(case, fuzz_server):
    headers = {"X-AMP-Agent-ID": "fuzzer"}
    if case.headers and "x-amp-agent-id" in {k.lower() for k in case.headers}:
        headers = {}  # let the fuzzer's own (maybe hostile) identity header through
    case.call_and_validate(
        base_url=_origin(fuzz_server.base_url),
        headers=headers,
        checks=[schemathesis.checks.not_a_server_error, check_error_envelope],
        timeout=30,
    )
