"""Reader-wide search on an existing store: latency, and what a write costs the next search.

    python bench/wide_search.py --db PATH [--queries 200] [--wide-queries 100] [--after-write 10] [--json out.json]

Runs on a SQLite file written by `bench/scale.py` (owners `user-NNNNN`, ~100 cells each, every
cell readable by its owner's team `team-<owner % 10>` and by `analyst`), so a million-cell
store is loaded once and measured many times. A real server on loopback (the store's ANN
graph loaded or built first, and the keyword warm-up done: `/health` says so); then, timed over HTTP with a warm-up:

- owner: an owner's search of its own cells (`owner_id`);
- analyst: the analyst's search across every owner (every cell admitted);
- team: a team member's search across its team's owners (a tenth of the store);
- after a write: rounds of one `POST /memories` then the first analyst and the first team
  search (the write changes what those readers may see, so no cache of the old state may
  answer); the new cell's unique word must come back in both (freshness, not only speed);
- another process: a second server on the same file writes a cell; the first server's next
  analyst search must find it (a snapshot is never stale across processes), timed.

THE FILE IS WRITTEN TO (the after-write rounds add cells): run it on a copy.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import sys
import time
from pathlib import Path

import httpx

from ampkit.tls import tls_context  # one TLS context: httpx builds one per client (~30 ms)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import TEAMS, Server, cell_body, memory_fact, percentiles, query_for  # noqa: E402


def search(http: httpx.Client, agent: str, body: dict) -> tuple[float, list[dict]]:
    t = time.perf_counter()
    r = http.post("/memories/search", json=body, headers={"X-AMP-Agent-ID": agent})
    ms = (time.perf_counter() - t) * 1000
    r.raise_for_status()
    return ms, r.json()["results"]


def timed(http: httpx.Client, work: list[tuple[str, dict]]) -> dict:
    for agent, body in work[:10]:  # warm-up (each filter's first search, the first words' postings)
        search(http, agent, body)
    return percentiles([search(http, agent, body)[0] for agent, body in work])


def wait_for_graph(http: httpx.Client, started: float, limit_s: float = 3600) -> float:
    """Seconds from `started` (the server process's spawn, perf_counter) until the vectors,
    the graph and the keyword warm-up are ready."""
    t0 = time.perf_counter()

    def warming() -> bool:  # the vectors' load, the graph, and the keyword leg's warm-up (access snapshot, common words)
        index = http.get("/health").json().get("vector_index", {})
        return (index.get("state") == "loading" or index.get("approximate") == "building"
                or index.get("keyword_warmup") == "warming")

    # Past the threshold, a wide search once the vectors are loaded starts the graph's build
    # (`approximate` then says building, then ready); below it, or with the graph off, it stays
    # none or off: nothing to wait for (waiting for "none" to end hung on a small store).
    search(http, "analyst", {"query": "window seats"})
    while warming() and time.perf_counter() - t0 < limit_s:
        time.sleep(1)
        search(http, "analyst", {"query": "window seats"})  # a search during the load started nothing
    return round(time.perf_counter() - started, 1)


def run(db: str, queries: int, wide_queries: int, after_write: int) -> dict:
    url = f"sqlite:///{db}"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        n = conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
        owners_n = conn.execute("SELECT COUNT(DISTINCT owner_id) FROM cells WHERE owner_id LIKE 'user-%'").fetchone()[0]
    owner_ids = [f"user-{i:05d}" for i in range(owners_n)]
    rng = random.Random(11)
    result: dict = {"db": db, "cells": n, "owners": owners_n, "load_at_start": [round(x, 2) for x in os.getloadavg()]}
    server = Server(url, "default", Path(db + ".bench.log"))
    other = None
    try:
        http = httpx.Client(base_url=server.base, timeout=600, verify=tls_context())
        result["graph_ready_s"] = wait_for_graph(http, server.started)
        work = {
            "owner": [(o, {"query": query_for(memory_fact(rng)[0], rng), "owner_id": o, "limit": 10})
                      for o in (owner_ids[rng.randrange(owners_n)] for _ in range(queries))],
            "analyst": [("analyst", {"query": query_for(memory_fact(rng)[0], rng), "limit": 10}) for _ in range(wide_queries)],
            "team": [(f"team-{i % TEAMS}", {"query": query_for(memory_fact(rng)[0], rng), "limit": 10})
                     for i in range(wide_queries)],
        }
        result["search_ms"] = {name: timed(http, w) for name, w in work.items()}
        for name, p in result["search_ms"].items():
            print(f"  {name}: {p}", file=sys.stderr, flush=True)

        # ---- a write, then the first wide searches
        rounds: dict[str, list[float]] = {"write": [], "analyst": [], "team": []}
        fresh = {"analyst": 0, "team": 0}
        for k in range(after_write):
            o = rng.randrange(owners_n)
            word = f"zqx{rng.randrange(10**9)}w{k}"
            text = f"{memory_fact(rng)[0]} {word}"
            t = time.perf_counter()
            http.post("/memories", json=cell_body(owner_ids[o], text, f"bench-{k}", team=o % TEAMS),
                      headers={"X-AMP-Agent-ID": owner_ids[o]}).raise_for_status()
            rounds["write"].append((time.perf_counter() - t) * 1000)
            for name, agent in (("analyst", "analyst"), ("team", f"team-{o % TEAMS}")):
                ms, hits = search(http, agent, {"query": f"{word} {query_for(text, rng)}", "limit": 10})
                rounds[name].append(ms)
                fresh[name] += any(word in h["content"]["text"] for h in hits)
        result["after_write_ms"] = {
            name: {"median": round(sorted(v)[len(v) // 2], 1), "max": round(max(v), 1), "all": [round(x, 1) for x in v]}
            for name, v in rounds.items() if v
        }
        result["after_write_found"] = {name: f"{c}/{after_write}" for name, c in fresh.items()}
        print(f"  after a write: {result['after_write_ms']} found {result['after_write_found']}", file=sys.stderr, flush=True)

        # ---- a write by another process on the same file
        other = Server(url, "default", Path(db + ".bench.log"))
        word = f"zqx{rng.randrange(10**9)}other"
        with httpx.Client(base_url=other.base, timeout=600, verify=tls_context()) as http2:
            http2.post("/memories", json=cell_body(owner_ids[0], f"Lena packed the blue notebook {word}", "bench-other", team=0),
                       headers={"X-AMP-Agent-ID": owner_ids[0]}).raise_for_status()
        ms, hits = search(http, "analyst", {"query": word, "limit": 10})
        result["other_process_write"] = {"first_analyst_ms": round(ms, 1),
                                         "found": any(word in h["content"]["text"] for h in hits)}
        print(f"  another process's write: {result['other_process_write']}", file=sys.stderr, flush=True)
        result["health"] = http.get("/health").json().get("vector_index")
        result["rss_mb"] = server.rss_mb()
        http.close()
    finally:
        if other is not None:
            other.stop()
        server.stop()
    result["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return result


def print_table(res: dict) -> None:
    print(f"wide search: {res['cells']} cells, {res['owners']} owners, load {res['load_at_start']} -> {res['load_at_end']}")
    print("| search over HTTP | p50 ms | p95 ms | p99 ms |\n|---|---|---|---|")
    for name, p in res["search_ms"].items():
        print(f"| {name} | {p['p50']} | {p['p95']} | {p['p99']} |")
    print("\n| after one write | median ms | max ms | found |\n|---|---|---|---|")
    for name, p in res["after_write_ms"].items():
        print(f"| {name} | {p['median']} | {p['max']} | {res['after_write_found'].get(name, '-')} |")
    o = res["other_process_write"]
    print(f"| analyst after another process's write | {o['first_analyst_ms']} | - | {o['found']} |")
    print(f"\ngraph ready {res['graph_ready_s']} s after start; vector index {res['health']}; rss {res['rss_mb']} MB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="a SQLite file written by bench/scale.py (it is written to: a copy)")
    parser.add_argument("--queries", type=int, default=200, help="owner searches to time")
    parser.add_argument("--wide-queries", type=int, default=100, help="analyst and team searches to time (each)")
    parser.add_argument("--after-write", type=int, default=10, help="write-then-search rounds")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    result = run(args.db, args.queries, args.wide_queries, args.after_write)
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
