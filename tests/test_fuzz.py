"""Fuzzing: schemathesis drives the checked-in OpenAPI document against the real server
app over HTTP (served in the test process), with a bounded number of cases per operation. Whatever it sends, the server must not
answer 500 (nor a 5xx its operation does not document, such as consolidation's 501
NOT_CONFIGURED on a server without a model), and every error must be the
`{"error": {"code", "message", "details"}}` envelope.
It runs twice: auth off (X-AMP-Agent-ID) and auth required (a Bearer key with every scope).
Cases per operation: 10 under the `ci` Hypothesis profile, scaled like every property test
(tests/conftest.py); `AMPKIT_FUZZ_EXAMPLES` sets the number outright.

The document is `spec/openapi.json` when it exists (the one clients are told to trust);
otherwise the app's own `/amp/v1/openapi.json`, generated in-process."""

from __future__ import annotations

import json
import os

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings

from support import ROOT, AppServer, examples

MAX_EXAMPLES = int(os.environ.get("AMPKIT_FUZZ_EXAMPLES") or examples(10))
SPEC = ROOT / "spec" / "openapi.json"


def _document() -> dict:
    if SPEC.exists():
        return json.loads(SPEC.read_text())
    from ampkit.config import Settings
    from ampkit.server.app import create_app

    return create_app(Settings(store="memory://", lifecycle_interval_seconds=0)).openapi()


@schemathesis.serializer("application/x-ndjson")
def _ndjson(ctx, value) -> bytes:
    """POST /admin/import takes NDJSON, documented as a string: send the generated string as is
    (anything else as one JSON line), so the import route is fuzzed like the others."""
    if isinstance(value, bytes):
        return value
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else (json.dumps(value) + "\n").encode()


schema = schemathesis.openapi.from_dict(_document())
DOCUMENTED = {(method.upper(), path): {int(code) for code in op.get("responses", {}) if code.isdigit()}
              for path, item in _document()["paths"].items() for method, op in item.items()}


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
    with AppServer(url, args=args, log_path=tmp / "server.log") as proc, requests.Session() as session:
        yield proc, headers, session  # one keep-alive connection for all of the module's cases


def _origin(base_url: str) -> str:
    # The document's paths already carry /amp/v1.
    return base_url[: -len("/amp/v1")] if base_url.endswith("/amp/v1") else base_url


def check_no_undocumented_server_error(ctx, response, case) -> None:
    """No 500 ever; another 5xx only where the operation documents it (501 NOT_CONFIGURED,
    502 from a model, 503 store unavailable): those are states of the server, not bugs."""
    status = response.status_code
    documented = DOCUMENTED.get((case.method.upper(), case.path), set())
    assert status < 500 or (status != 500 and status in documented), (
        f"{status} from {case.method} {case.path}: {response.content[:300]!r}")


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
    server, headers, session = fuzz_server
    generated = {k.lower() for k in (case.headers or {})}
    # Let the fuzzer's own (maybe hostile) identity headers through.
    headers = {k: v for k, v in headers.items() if k.lower() not in generated}
    case.call_and_validate(
        base_url=_origin(server.base_url),
        session=session,
        headers=headers,
        checks=[check_no_undocumented_server_error, check_error_envelope],
        timeout=30,
    )
