"""Concurrent search throughput over HTTP, one server process against several (`--workers`).

    python bench/search_throughput.py (--db PATH | --store URL) [--workers 1 2] [--rounds 2] [--clients 4]
                                      [--seconds 10] [--warm 8] [--kind mix|owner|team] [--json out.json]

Runs on a store written by `bench/scale.py --store` (owners `user-NNNNN`, ~100 cells each,
every cell readable by its owner's team `team-<owner % 10>`), which searches do not change: a
SQLite file (`--db`) or any store URL (`--store`, e.g. PostgreSQL). For each `--workers` value in turn (alternating, `--rounds` times): `ampkit serve
--workers N` on the file, `--clients` client processes (the standard library's HTTP client,
one kept-alive connection each, ~0.2 ms of CPU a request) searching as fast as answers come
for `--seconds`, after each has searched for `--warm` seconds untimed (every worker's caches warm: each
reader's first search on a process loads what it may read). Searches: an owner's own memories
(`owner`), a team member's across the team's owners (`team`), or half each (`mix`), with
three words of a stored memory as the query.

Prints one row per run: searches/s, p50/p95/p99 ms, the server's CPU per search (every
process: the supervisor and its workers), the clients', how busy the whole machine was, and
the server's resident memory (every worker holds its own caches).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import httpx

from ampkit.tls import tls_context  # one TLS context: httpx builds one per client (~30 ms)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import TEAMS, Server, memory_text, query_for  # noqa: E402
from writes import json_poster, machine_cpu_jiffies, server_cpu_seconds  # noqa: E402
from support import process_rss_kb, process_tree  # noqa: E402  (on the path since scale)


def client(base: str, seed: int, owners: int, kind: str, warm_s: float, seconds: float,
           ready, start: "multiprocessing.synchronize.Event", out) -> None:
    """One client process: searches over one connection; sends back (latencies, CPU seconds)."""
    rng = random.Random(seed)
    with json_poster(base, lean=True) as post:

        def one() -> float:
            if kind == "owner" or (kind == "mix" and rng.random() < 0.5):
                agent = f"user-{rng.randrange(owners):05d}"
                body = {"query": query_for(memory_text(rng), rng), "owner_id": agent}
            else:
                agent = f"team-{rng.randrange(TEAMS)}"
                body = {"query": query_for(memory_text(rng), rng)}
            t = time.perf_counter()
            status, _ = post("/memories/search", body, {"X-AMP-Agent-ID": agent})
            if status != 200:
                raise RuntimeError(f"search answered {status}")
            return time.perf_counter() - t

        end = time.monotonic() + warm_s
        while time.monotonic() < end:
            one()
        ready.put(seed)
        start.wait()
        latencies: list[float] = []
        cpu = time.process_time()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            latencies.append(one())
        out.put((latencies, time.process_time() - cpu))


def rss_mb(pid: int) -> float:
    """Resident memory of the server and its workers."""
    return round(sum(process_rss_kb(member) for member in process_tree(pid)) / 1024, 1)


def owners_of(store: str) -> int:
    """How many owners `bench/scale.py` wrote (`user-00000` ...): one query of its table."""
    query = "SELECT COUNT(DISTINCT owner_id) FROM cells WHERE owner_id LIKE 'user-%'"
    if store.startswith("sqlite:///"):
        import sqlite3

        conn = sqlite3.connect(f"file:{store[len('sqlite:///'):]}?mode=ro", uri=True)
        try:
            return conn.execute(query).fetchone()[0]
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(store) as conn:
        return conn.execute(query).fetchone()[0]


def measure(store: str, owners: int, workers: int, clients: int, seconds: float, warm: float, kind: str,
            log: Path) -> dict:
    server = Server(store, "default", log, extra=["--workers", str(workers)])  # (answers /health)
    pid = server.proc.pid
    try:
        # Every worker warm (vectors loaded, common words' term rows read) before the clients
        # connect: a worker still warming up is slow to accept, and the other would take
        # every connection. /health on new connections reaches either worker.
        deadline, warm_answers = time.monotonic() + 600, 0
        while warm_answers < 4 * workers:
            try:
                health = httpx.get(f"{server.base}/health", timeout=2, verify=tls_context())
                index = health.json().get("vector_index", {}) if health.status_code == 200 else {}
                warm = index.get("state") != "loading" and index.get("keyword_warmup") != "warming"
                warm_answers = warm_answers + 1 if warm else 0
            except httpx.HTTPError:
                warm_answers = 0
            if time.monotonic() > deadline or server.proc.poll() is not None:
                raise RuntimeError(f"the server did not warm up; see {log}")
            time.sleep(0.1)
        ctx = multiprocessing.get_context("spawn")
        ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=client, args=(server.base, k, owners, kind, warm, seconds, ready, start, out))
                 for k in range(clients)]
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=300)
        cpu = server_cpu_seconds(pid)
        machine = machine_cpu_jiffies()
        start.set()
        results = [out.get(timeout=seconds + 300) for _ in procs]
        cpu = server_cpu_seconds(pid) - cpu
        busy, ticks = (now - then for now, then in zip(machine_cpu_jiffies(), machine))
        rss = rss_mb(pid)
        for p in procs:
            p.join()
    finally:
        server.stop()
    latencies = [s * 1000 for lat, _ in results for s in lat]
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    n = len(latencies)
    return {"workers": workers, "clients": clients, "kind": kind, "searches": n,
            "searches_per_s": round(n / seconds, 1), "p50_ms": round(q[49], 2), "p95_ms": round(q[94], 2),
            "p99_ms": round(q[98], 2), "server_cpu_ms_per_search": round(1000 * cpu / n, 2),
            "client_cpu_ms_per_search": round(1000 * sum(c for _, c in results) / n, 3),
            "machine_busy": round(busy / max(1, ticks), 2), "server_rss_mb": rss}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", help="a SQLite file written by bench/scale.py --store")
    where.add_argument("--store", help="a store URL (sqlite:///..., postgresql://...) written by bench/scale.py --store")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=1, help="times to run each --workers value, alternating")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warm", type=float, default=8.0, help="untimed seconds of searching per client first")
    parser.add_argument("--kind", choices=("mix", "owner", "team"), default="mix")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    store = args.store or f"sqlite:///{args.db}"
    owners = owners_of(store)
    runs = []
    with tempfile.TemporaryDirectory(prefix="ampkit-search-tp-") as tmp:
        for _ in range(args.rounds):
            for workers in args.workers:
                runs.append(measure(store, owners, workers, args.clients, args.seconds, args.warm, args.kind,
                                    Path(tmp) / "server.log"))
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    result = {"store": store.split(":")[0], "owners": owners, "runs": runs, "machine": {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()}}
    print(f"search throughput over HTTP: {args.clients} lean clients, {args.kind} searches, {args.seconds:g} s a run")
    print("| workers | searches/s | p50 ms | p95 ms | p99 ms | server CPU ms/search | client CPU ms/search "
          "| machine busy | server RSS MB |\n|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['workers']} | {r['searches_per_s']} | {r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} "
              f"| {r['server_cpu_ms_per_search']} | {r['client_cpu_ms_per_search']} | {round(100 * r['machine_busy'])}% "
              f"| {r['server_rss_mb']} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
