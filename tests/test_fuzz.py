"""Fuzzing: schemathesis drives the checked-in OpenAPI document against the real server
app over HTTP (served in the test process), with a bounded number of cases per operation. Whatever it sends, the server must not
answer 5xx, and every error must be the `{"error": {"code", "message", "details"}}` envelope.
It runs twice: auth off (X-AMP-Agent-ID) and auth required (a Bearer key with every scope).
`AMPKIT_FUZZ_EXAMPLES` raises the number of cases per operation for a longer run.

The document is `spec/openapi.json` when it exists (the one clients are told to trust);
otherwise the app's own `/amp/v1/openapi.json`, generated in-process."""

from __future__ import annotations

import json
import os

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from support import ROOT, AppServer

MAX_EXAMPLES = int(os.environ.get("AMPKIT_FUZZ_EXAMPLES", "10"))
SPEC = ROOT / "spec" / "openapi.json"


def _document() -> dict:
    if SPEC.exists():
        return json.loads(SPEC.read_text())
    from ampkit.config import Settings
    from ampkit.server.app import create_app

    return create_app(Settings(store="memory://", lifecycle_interval_seconds=0)).openapi()


schema = schemathesis.openapi.from_dict(_document())


@pytest.fixture(scope="module", params=["auth-off", "auth-required"])
def fuzz_server(request, tmp_path_factory):
    """A server and the headers that identify the fuzzer to it (an all-scopes key with auth on)."""
    tmp = tmp_path_factory.mktemp("fuzz")
    url = f"sqlite:///{tmp}/fuzz.db"
    headers = {"X-AMP-Agent-ID": "fuzzer"}
    args: list[str] = []
    if request.param == "auth-required":
        from ampkit.auth import create_key
        from ampkit.store.sqlite import SQLiteStore

        store = SQLiteStore(f"{tmp}/fuzz.db")
        store.open()
        headers = {"Authorization": f"Bearer {create_key(store, 'fuzzer', 'read,write,admin').token}"}
        store.close()
        args = ["--auth", "--rate-limit", "0"]
    with AppServer(url, args=args, log_path=tmp / "server.log") as proc:
        yield proc, headers


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
    server, headers = fuzz_server
    generated = {k.lower() for k in (case.headers or {})}
    # Let the fuzzer's own (maybe hostile) identity headers through.
    headers = {k: v for k, v in headers.items() if k.lower() not in generated}
    case.call_and_validate(
        base_url=_origin(server.base_url),
        headers=headers,
        checks=[schemathesis.checks.not_a_server_error, check_error_envelope],
        timeout=30,
    )
