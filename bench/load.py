"""Load test: N concurrent clients doing mixed reads, writes and searches against a real server.

    python bench/load.py --clients 16 --seconds 30 [--json out.json] [--base-url URL] [--store URL]

Without --base-url it starts `ampkit serve` on a free loopback port over a fresh SQLite file
and stops it afterwards. Each client acts as its own agent (`load-<i>`) and owns its cells.
Reports throughput, p50/p99 latency per operation and overall, errors by status, and then
verifies that every acknowledged write (every 201) is readable with the text it was written
with: `lost_writes` must be 0 (the exit status is 1 otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from typing import Optional

import httpx

from ampkit.tls import tls_context  # one TLS context: httpx builds one per client (~30 ms)

WORDS = ("river mountain coffee invoice deploy kafka postgres budget meeting holiday python rust "
         "customer refund latency outage roadmap design review hiring onboarding").split()
MIX = (("read", 0.45), ("write", 0.30), ("search", 0.20), ("list", 0.05))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(store: str, log_path: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "ampkit.cli", "serve", "--port", str(port), "--store", store,
           "--lifecycle-interval", "0", "--rate-limit", "0"]
    proc = subprocess.Popen(cmd, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/amp/v1"
    for _ in range(300):
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}:\n{_tail(log_path)}")
        try:
            if httpx.get(f"{base}/health", timeout=1, verify=tls_context()).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.terminate()
    raise SystemExit(f"server did not start:\n{_tail(log_path)}")


def _tail(path: str, lines: int = 30) -> str:
    """The end of the server's log (it lives in a directory removed when the script ends)."""
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def percentile(values: list[float], q: float) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


class Stats:
    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: Counter = Counter()
        self.acked: dict[str, tuple[str, str]] = {}  # cell id -> (agent, text)


async def client(i: int, http: httpx.AsyncClient, deadline: float, stats: Stats, auth: dict[str, str]) -> None:
    agent = f"load-{i}"
    headers = auth or {"X-AMP-Agent-ID": agent}
    rng = random.Random(i)
    mine: list[str] = []
    ops, weights = zip(*MIX)
    n = 0
    while time.monotonic() < deadline:
        op = rng.choices(ops, weights)[0] if mine else "write"
        n += 1
        started = time.perf_counter()
        try:
            if op == "write":
                text = f"{agent} note {n}: " + " ".join(rng.choices(WORDS, k=12))
                body = {"type": "episodic", "content": {"text": text}, "identity": {"owner_id": agent, "owner_type": "agent"}}
                r = await http.post("/memories", json=body, headers=headers)
                if r.status_code == 201:
                    cid = r.json()["id"]
                    stats.acked[cid] = (agent, text)
                    mine.append(cid)
            elif op == "read":
                r = await http.get(f"/memories/{rng.choice(mine)}", headers=headers)
            elif op == "search":
                r = await http.post("/memories/search", json={"query": " ".join(rng.choices(WORDS, k=3)), "limit": 10},
                                    headers=headers)
            else:
                r = await http.get("/memories", params={"limit": 20}, headers=headers)
            status = r.status_code
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        stats.latency[op].append(time.perf_counter() - started)
        if not isinstance(status, int) or status >= 400:
            stats.errors[f"{op}:{status}"] += 1


async def verify(http: httpx.AsyncClient, stats: Stats, auth: dict[str, str]) -> int:
    """Count acknowledged writes that cannot be read back with their text."""
    by_agent: dict[str, dict[str, str]] = defaultdict(dict)
    for cid, (agent, text) in stats.acked.items():
        by_agent[agent][cid] = text
    lost = 0
    for agent, cells in by_agent.items():
        r = await http.get("/export", params={"owner_id": agent}, headers=auth or {"X-AMP-Agent-ID": agent})
        r.raise_for_status()
        found = {c["id"]: c["content"]["text"] for c in r.json()["cells"]}
        lost += sum(1 for cid, text in cells.items() if found.get(cid) != text)
    return lost


async def run(base_url: str, clients: int, seconds: float, api_key: Optional[str]) -> dict:
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    stats = Stats()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits, verify=tls_context()) as http:
        started = time.monotonic()
        await asyncio.gather(*(client(i, http, started + seconds, stats, auth) for i in range(clients)))
        elapsed = time.monotonic() - started
        lost = await verify(http, stats, auth)
    every = [x for values in stats.latency.values() for x in values]
    return {
        "clients": clients,
        "seconds": round(elapsed, 2),
        "requests": len(every),
        "throughput_rps": round(len(every) / elapsed, 1),
        "p50_ms": percentile(every, 0.50),
        "p99_ms": percentile(every, 0.99),
        "mean_ms": round(statistics.fmean(every) * 1000, 2) if every else None,
        "by_operation": {
            op: {"count": len(v), "p50_ms": percentile(v, 0.50), "p99_ms": percentile(v, 0.99)}
            for op, v in sorted(stats.latency.items())
        },
        "errors": sum(stats.errors.values()),
        "errors_by_kind": dict(stats.errors),
        "acked_writes": len(stats.acked),
        "lost_writes": lost,
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", dest="json_path", default=None, help="also write the report here")
    parser.add_argument("--base-url", default=None, help="use a running server (…/amp/v1) instead of starting one")
    parser.add_argument("--store", default=None, help="store URL for the server this starts [default: temp SQLite]")
    parser.add_argument("--api-key", default=os.environ.get("AMPKIT_API_KEY"),
                        help="for servers with --auth (every client then acts as the key's agent)")
    args = parser.parse_args(argv)

    proc = None
    base_url = args.base_url
    # The server's store (unless --store) and its log live in a directory removed at the end.
    with tempfile.TemporaryDirectory(prefix="ampkit-load-") as tmp:
        if base_url is None:
            proc, base_url = start_server(args.store or f"sqlite:///{tmp}/memory.db", os.path.join(tmp, "server.log"))
        try:
            report = asyncio.run(run(base_url.rstrip("/"), args.clients, args.seconds, args.api_key))
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(10)
    report["base_url"] = base_url if args.base_url else "started by bench/load.py (SQLite)"
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_path:
        with open(args.json_path, "w") as f:
            f.write(text + "\n")
    return 1 if report["lost_writes"] else 0


if __name__ == "__main__":
    sys.exit(main())
