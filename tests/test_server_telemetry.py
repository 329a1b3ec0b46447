"""FastAPI's native OpenTelemetry: the server traces its requests when a provider is configured
before the app is made, and asks no provider per request when none is (ampkit.server.app
`_native_telemetry`: ~40 us of every request's event-loop time). Run in a fresh interpreter:
a process sets its global providers once. (The OpenTelemetry SDK comes with the `all` extra's
CrewAI, which the test environment installs.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import json, sys
    from fastapi.testclient import TestClient
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from ampkit.bootstrap import load_settings
    from ampkit.server.app import create_app

    def app():
        return create_app(load_settings(env=False, store="memory://", lifecycle_interval_seconds=0, allowed_hosts="testserver"))

    made_before = app()  # no provider yet: FastAPI's tracing off for this app
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    made_after = app()

    spans = {}
    for name, made in (("made_before", made_before), ("made_after", made_after)):
        exporter.clear()
        with TestClient(made, base_url="http://testserver/amp/v1") as http:
            assert http.get("/health").status_code == 200
            assert http.post("/memories", json={"content": {"text": "traced"}, "identity": {"owner_id": "a"}},
                             headers={"X-AMP-Agent-ID": "a"}).status_code == 201
        spans[name] = [span.name for span in exporter.get_finished_spans()]
    print(json.dumps(spans))
''')


def test_requests_are_traced_when_a_provider_is_configured_before_the_app_is_made():
    env = {k: v for k, v in os.environ.items() if k != "OTEL_SDK_DISABLED"}  # (conftest sets it, for CrewAI)
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    spans = json.loads(run.stdout.strip().splitlines()[-1])
    assert spans["made_before"] == []
    # FastAPI's own request spans, one per request at least, named by method and route
    assert any("GET" in name and "/health" in name for name in spans["made_after"]), spans
    assert any("POST" in name and "/memories" in name for name in spans["made_after"]), spans
