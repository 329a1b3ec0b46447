"""Scale benchmark: N short memories across many owners, a real server on loopback.

    python bench/scale.py --n 100000 [--json out.json] [--store URL] [--embedder default]

Loads N generated memories (about 100 per owner, in sessions of 10) through POST
/memories/batch, then measures: search latency over HTTP and in process (p50/p95/p99, an
owner's search for words of one of its memories), single-cell writes from one client and from
8 concurrent clients, batch writes, bytes per cell on disk and the server's resident memory.
The store defaults to a temporary SQLite file; `--store postgresql://...` measures PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support import free_port  # noqa: E402  (the test helper: a free loopback port)

NAMES = ["Alice", "Bruno", "Chen", "Dara", "Emeka", "Farah", "Goran", "Hana", "Ivan", "Jun", "Kemal", "Lena",
         "Mateo", "Noor", "Olga", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Viktor", "Wen", "Yusuf"]
PLACES = ["Lisbon", "Osaka", "Nairobi", "Toronto", "Krakow", "Lima", "Hanoi", "Oslo", "Austin", "Cairo",
          "the office", "the gym", "the lake house", "the airport", "the new flat"]
THINGS = ["window seats", "oat milk", "dark roast coffee", "morning meetings", "vegetarian food", "jazz",
          "printed boarding passes", "standing desks", "quiet hotels", "trail running", "spicy ramen",
          "sci-fi novels", "early flights", "the blue notebook", "async standups", "pour-over coffee"]
EVENTS = ["started piano lessons", "moved to a new team", "adopted a rescue dog", "booked a trip",
          "finished the quarterly report", "signed the lease", "ran a half marathon", "lost the car keys",
          "renewed the passport", "switched to the night shift", "planted tomatoes", "fixed the bike"]
MONTHS = ["January", "March", "April", "June", "August", "October", "November", "December"]
TEMPLATES = [
    "{name} prefers {thing} when travelling to {place}",
    "{name} {event} in {month}",
    "{name} said the meeting about {thing} moved to {place}",
    "Remind {name} that {thing} are available at {place}",
    "{name}'s sister {event} last {month}",
    "{name} dislikes {thing} and avoids {place} on Mondays",
    "The user {event} near {place} with {name}",
    "{name} asked to order {thing} for the team in {month}",
]


def memory_text(rng: random.Random) -> str:
    return rng.choice(TEMPLATES).format(name=rng.choice(NAMES), place=rng.choice(PLACES), thing=rng.choice(THINGS),
                                        event=rng.choice(EVENTS), month=rng.choice(MONTHS))


def query_for(text: str, rng: random.Random) -> str:
    words = [w for w in text.replace("'s", "").split() if len(w) > 3]
    return " ".join(rng.sample(words, min(3, len(words))))


def percentiles(samples: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return {"p50": round(q[49], 2), "p95": round(q[94], 2), "p99": round(q[98], 2)}


class Server:
    def __init__(self, store_url: str, embedder: str, log: Path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}/amp/v1"
        env = {**os.environ, "AMPKIT_EMBEDDER": embedder}
        cmd = [sys.executable, "-m", "ampkit.cli", "serve", "--port", str(self.port), "--store", store_url,
               "--lifecycle-interval", "0"]
        self.proc = subprocess.Popen(cmd, stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server did not start; see {log}")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
        return 0.0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def cell_body(owner: str, text: str, session: str) -> dict:
    return {"content": {"text": text}, "identity": {"owner_id": owner, "session_id": session}}


def run(n: int, store_url: str, embedder: str, queries: int, workdir: Path) -> dict:
    rng = random.Random(42)
    owners = [f"user-{i:05d}" for i in range(max(1, n // 100))]
    server = Server(store_url, embedder, workdir / "server.log")
    memories: dict[str, list[str]] = {o: [] for o in owners}
    try:
        http = httpx.Client(base_url=server.base, timeout=120)
        # ---- bulk load, in batches of 500 cells of one owner each (how an import runs)
        plan = [(owners[i % len(owners)], memory_text(rng)) for i in range(n)]
        plan.sort(key=lambda p: p[0])
        t0 = time.perf_counter()
        for i in range(0, n, 500):
            chunk = plan[i : i + 500]
            by_owner: dict[str, list[dict]] = {}
            for j, (owner, text) in enumerate(chunk):
                by_owner.setdefault(owner, []).append(cell_body(owner, text, f"{owner}-s{(i + j) // 10}"))
                memories[owner].append(text)
            for owner, cells in by_owner.items():
                r = http.post("/memories/batch", json={"cells": cells}, headers={"X-AMP-Agent-ID": owner})
                r.raise_for_status()
        batch_s = time.perf_counter() - t0
        print(f"loaded {n} cells in {batch_s:.1f} s ({n / batch_s:.0f} cells/s)", file=sys.stderr)

        # ---- search over HTTP (first a warm-up: the server loads its vector index lazily)
        workload = []
        for _ in range(queries):
            owner = rng.choice(owners)
            workload.append((owner, query_for(rng.choice(memories[owner]), rng)))
        for owner, q in workload[:20]:
            http.post("/memories/search", json={"query": q, "owner_id": owner}, headers={"X-AMP-Agent-ID": owner})
        http_ms = []
        for owner, q in workload:
            t = time.perf_counter()
            r = http.post("/memories/search", json={"query": q, "owner_id": owner, "limit": 10},
                          headers={"X-AMP-Agent-ID": owner})
            http_ms.append((time.perf_counter() - t) * 1000)
            r.raise_for_status()

        # ---- single-cell writes: one client, then 8 concurrent clients
        def write_many(count: int, tag: str) -> None:
            with httpx.Client(base_url=server.base, timeout=60) as client:
                for k in range(count):
                    owner = owners[k % len(owners)]
                    client.post("/memories", json=cell_body(owner, memory_text(random.Random(k)), f"{tag}-{k // 10}"),
                                headers={"X-AMP-Agent-ID": owner}).raise_for_status()

        t = time.perf_counter()
        write_many(500, "single")
        single_ws = 500 / (time.perf_counter() - t)
        threads = [threading.Thread(target=write_many, args=(100, f"conc{c}")) for c in range(8)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        concurrent_ws = 800 / (time.perf_counter() - t)
        rss = server.rss_mb()
        http.close()
    finally:
        server.stop()

    # ---- in process: the same service code the server runs, on the same store
    from ampkit.bootstrap import build_service, load_settings
    from ampkit.models import SearchRequest

    service = build_service(load_settings(store=store_url, embedder=embedder))
    service.store.open()
    try:
        for owner, q in workload[:20]:
            service.search(owner, SearchRequest(query=q, owner_id=owner))
        inproc_ms = []
        for owner, q in workload:
            t = time.perf_counter()
            service.search(owner, SearchRequest(query=q, owner_id=owner, limit=10))
            inproc_ms.append((time.perf_counter() - t) * 1000)
        stats = service.store.stats()
    finally:
        service.store.close()
    written = n + 500 + 800  # bulk load + single-client + concurrent writes
    return {
        "n": n,
        "owners": len(owners),
        "store": stats.get("backend", store_url.split(":")[0]),
        "embedder": embedder,
        "search_http_ms": percentiles(http_ms),
        "search_inproc_ms": percentiles(inproc_ms),
        "writes_per_s": round(single_ws, 1),
        "writes_per_s_8_clients": round(concurrent_ws, 1),
        "batch_writes_per_s": round(n / batch_s, 1),
        "bytes_per_cell": round(stats["bytes"] / written) if stats.get("bytes") else None,
        "rss_mb": rss,
        "machine": {"cpus": os.cpu_count(), "loadavg_at_end": [round(x, 2) for x in os.getloadavg()]},
    }


def print_table(res: dict) -> None:
    print(f"scale: {res['n']} cells, {res['owners']} owners, store {res['store']}, embedder {res['embedder']}")
    print("| measure | p50 | p95 | p99 |\n|---|---|---|---|")
    for key in ("search_http_ms", "search_inproc_ms"):
        p = res[key]
        print(f"| {key} | {p['p50']} | {p['p95']} | {p['p99']} |")
    print("\n| measure | value |\n|---|---|")
    for key in ("writes_per_s", "writes_per_s_8_clients", "batch_writes_per_s", "bytes_per_cell", "rss_mb"):
        print(f"| {key} | {res[key]} |")
    print(f"\nmachine: {res['machine']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, required=True, help="memories to load")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--store", default=None, help="store URL [default: a temporary SQLite file]")
    parser.add_argument("--embedder", default="default", help="AMPKIT_EMBEDDER for the server and in-process runs")
    parser.add_argument("--queries", type=int, default=500, help="searches to time")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ampkit-scale-") as tmp:
        store_url = args.store or f"sqlite:///{tmp}/scale.db"
        result = run(args.n, store_url, args.embedder, args.queries, Path(tmp))
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
