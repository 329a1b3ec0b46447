"""The server runs the lifecycle on its own interval, without the admin endpoint."""

from __future__ import annotations

import time

import httpx

from support import TLS


def test_server_runs_lifecycle_on_its_interval(server_factory):
    srv = server_factory(args=["--lifecycle-interval", "0.3"])
    headers = {"X-AMP-Agent-ID": "sched"}
    with httpx.Client(base_url=srv.base_url, headers=headers, timeout=5, verify=TLS) as http:
        spec = http.get("/spec").json()["capabilities"]["lifecycle_scheduler"]
        assert spec["interval_seconds"] == 0.3
        body = {"content": {"text": "faint memory"}, "identity": {"owner_id": "u"}, "scoring": {"importance": 0.1}}
        cell_id = http.post("/memories", json=body).json()["id"]
        deadline = time.monotonic() + 10
        status = "active"
        while status == "active" and time.monotonic() < deadline:
            time.sleep(0.1)
            page = http.get("/memories", params={"owner_id": "u", "status": "stale"}).json()
            status = "stale" if any(c["id"] == cell_id for c in page["results"]) else "active"
        assert status == "stale"
        history = http.get(f"/memories/{cell_id}/history").json()["results"]
        assert any(h["actor"] == "system:lifecycle" and h["changes"]["lifecycle.status"] == ["active", "stale"] for h in history)
