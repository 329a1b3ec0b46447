"""Two `ampkit serve` processes on one PostgreSQL database, written to at the same time.

Every acknowledged write must be there afterwards: every 201 is readable through either
server, and every acknowledged PATCH of a shared cell is present (each appends a mark to the
cell's metadata with an If-Match read-modify-write loop; a 409 CONFLICT means "re-read and
retry", never a lost mark), and every acknowledged GET counted once in `access_count` (the
server's own read-modify-write under a row lock)."""

from __future__ import annotations

import threading

import httpx
import pytest

from support import TLS

pytestmark = pytest.mark.postgres

WORKERS = 4
CREATES_PER_WORKER = 12
PATCHES_PER_WORKER = 6
MAX_ATTEMPTS = 50  # per PATCH; bounded so a bug cannot spin forever


def headers(agent: str, **extra: str) -> dict[str, str]:
    return {"X-AMP-Agent-ID": agent, **extra}


@pytest.mark.slow
def test_two_servers_on_one_database_lose_no_acknowledged_write(pg_url, server_factory):
    # The second also shows that --no-access-log turns the per-request log lines off.
    servers = [server_factory(pg_url, args=["--lifecycle-interval", "0", *more], process=True)
               for more in ([], ["--no-access-log"])]
    clients = [httpx.Client(base_url=s.base_url, timeout=30, verify=TLS) for s in servers]
    try:
        shared = []
        for i in range(2):
            r = clients[i].post("/memories", headers=headers("team"), json={
                "content": {"text": f"shared notes {i}", "metadata": {"marks": []}},
                "identity": {"owner_id": "team"},
                "access_policy": {"readable_by": ["worker_*"], "writable_by": ["worker_*"]},
            })
            assert r.status_code == 201
            shared.append(r.json()["id"])

        created: list[tuple[str, str]] = []  # (cell id, its owner)
        acked: dict[str, list[str]] = {cid: [] for cid in shared}
        conflicts = [0]
        reads = {cid: 0 for cid in shared}  # acknowledged GETs: each bumps access_count under a row lock
        failures: list[str] = []
        lock = threading.Lock()

        def work(n: int) -> None:
            agent = f"worker_{n}"
            try:
                for i in range(max(CREATES_PER_WORKER, PATCHES_PER_WORKER)):
                    client = clients[(n + i) % 2]  # alternate servers
                    if i < CREATES_PER_WORKER:
                        r = client.post("/memories", headers=headers(agent), json={
                            "content": {"text": f"{agent} fact {i}"}, "identity": {"owner_id": agent}})
                        if r.status_code == 201:
                            with lock:
                                created.append((r.json()["id"], agent))
                    if i < PATCHES_PER_WORKER:
                        cell_id, mark = shared[i % 2], f"{agent}:{i}"
                        for attempt in range(MAX_ATTEMPTS):
                            cur = clients[(n + attempt) % 2].get(f"/memories/{cell_id}", headers=headers(agent))
                            assert cur.status_code == 200, cur.text
                            with lock:
                                reads[cell_id] += 1
                            body = cur.json()
                            marks = body["content"]["metadata"]["marks"] + [mark]
                            r = clients[(n + attempt + 1) % 2].patch(
                                f"/memories/{cell_id}", json={"content": {"metadata": {"marks": marks}}},
                                headers=headers(agent, **{"If-Match": str(body["lifecycle"]["version"])}))
                            if r.status_code == 200:
                                with lock:
                                    acked[cell_id].append(mark)
                                break
                            assert r.status_code == 409 and r.json()["error"]["code"] == "CONFLICT", r.text
                            assert "current_version" in r.json()["error"]["details"]
                            with lock:
                                conflicts[0] += 1
            except BaseException as exc:  # noqa: BLE001
                failures.append(repr(exc))

        threads = [threading.Thread(target=work, args=(n,)) for n in range(WORKERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not failures, failures

        # Every 201 is readable through both servers.
        assert len(created) == WORKERS * CREATES_PER_WORKER
        for cell_id, owner in created:
            for client in clients:
                r = client.get(f"/memories/{cell_id}", headers=headers(owner))
                assert r.status_code == 200 and r.json()["identity"]["owner_id"] == owner
        for client in clients:
            listed: set[str] = set()
            for n in range(WORKERS):
                page = client.get("/memories", headers=headers(f"worker_{n}"),
                                  params={"owner_id": f"worker_{n}", "limit": 200}).json()
                assert page["total"] == CREATES_PER_WORKER
                listed |= {c["id"] for c in page["results"]}
            assert listed == {cell_id for cell_id, _ in created}

        # Every acknowledged PATCH is present, once; versions and history agree.
        assert sum(len(m) for m in acked.values()) == WORKERS * PATCHES_PER_WORKER
        for cell_id, marks in acked.items():
            for extra, client in enumerate(clients, start=1):
                cell = client.get(f"/memories/{cell_id}", headers=headers("team")).json()
                assert sorted(cell["content"]["metadata"]["marks"]) == sorted(marks)
                assert cell["lifecycle"]["version"] == 1 + len(marks)
                # Plain read-modify-writes (no If-Match) lost nothing either.
                assert cell["scoring"]["access_count"] == reads[cell_id] + extra
            history = clients[0].get(f"/memories/{cell_id}/history", headers=headers("team")).json()["results"]
            assert [h["action"] for h in history].count("update") == len(marks)
        logs = [s.log_path.read_text() for s in servers]
        assert '"POST /amp/v1/memories HTTP/1.1" 201' in logs[0]
        assert "/amp/v1/memories" not in logs[1] and "Uvicorn running" in logs[1]
    finally:
        for client in clients:
            client.close()
