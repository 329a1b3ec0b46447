"""The keyword leg alone at scale, in process: latency of `Store.keyword_candidates` over N
generated memories, for an owner's search and for a search across every owner the caller may
read (the case where access-scoped BM25 statistics cost the most).

    python bench/keyword_scale.py --n 100000 [--store URL] [--json out.json]

Cells are written through the service in batches (about 100 per owner, sessions of 10, no
embedder); every fifth owner shares its cells with `team-*`, so the reader `team-lead`
searches about a fifth of the corpus. The store defaults to a temporary SQLite file;
`--store postgresql://...` must name an empty database.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from ampkit.models import CellCreate
from ampkit.retrieval import Retriever
from ampkit.service import MemoryService
from ampkit.store import CellFilter, store_from_url
from scale import memory_text, percentiles, query_for

READER = "team-lead"


def run(n: int, store_url: str, queries: int, reuse: bool = False) -> dict:
    rng = random.Random(7)
    owners = [f"user-{i:05d}" for i in range(max(1, n // 100))]
    store = store_from_url(store_url)
    store.open()
    service = MemoryService(store=store, retriever=Retriever())
    memories: dict[str, list[str]] = {o: [] for o in owners}
    t0 = time.perf_counter()
    for idx, owner in enumerate(owners):
        shared = {"readable_by": ["team-*"]} if idx % 5 == 0 else {}
        cells = []
        for j in range(n // len(owners)):
            text = memory_text(rng)
            memories[owner].append(text)
            cells.append(CellCreate(content={"text": text}, identity={"owner_id": owner, "session_id": f"{owner}-s{j // 10}"},
                                    access_policy=shared))
        if not reuse:  # --reuse: the store already holds these cells (same seed), only the texts are needed
            service.create_many(owner, cells)
    load_s = time.perf_counter() - t0
    print(f"loaded {n} cells in {load_s:.1f} s", file=sys.stderr)

    def timed(workload: list[tuple[CellFilter, str]]) -> dict:
        for flt, q in workload[:20]:
            store.keyword_candidates(q, flt, 80)
        ms = []
        for flt, q in workload:
            t = time.perf_counter()
            store.keyword_candidates(q, flt, 80)
            ms.append((time.perf_counter() - t) * 1000)
        return percentiles(ms)

    own, team = [], []
    for _ in range(queries):
        owner = rng.choice(owners)
        own.append((CellFilter(reader=owner, owner_id=owner), query_for(rng.choice(memories[owner]), rng)))
        sharer = rng.choice(owners[::5])
        team.append((CellFilter(reader=READER), query_for(rng.choice(memories[sharer]), rng)))
    result = {"n": n, "store": store.backend, "load_s": round(load_s, 1),
              "owner_search_ms": timed(own), "reader_search_ms": timed(team),
              "machine": {"cpus": os.cpu_count(), "loadavg_at_end": [round(x, 2) for x in os.getloadavg()]}}
    store.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--store", default=None, help="store URL [default: a temporary SQLite file]")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--reuse", action="store_true",
                        help="--store already holds the cells of an earlier run with the same --n (skip loading)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ampkit-kwscale-") as tmp:
        result = run(args.n, args.store or f"sqlite:///{tmp}/kw.db", args.queries, args.reuse)
    print(f"keyword leg, {result['n']} cells, {result['store']} (k=80, ms; load average at end "
          f"{result['machine']['loadavg_at_end']})")
    print("| search | p50 | p95 | p99 |\n|---|---|---|---|")
    for name in ("owner_search_ms", "reader_search_ms"):
        p = result[name]
        print(f"| {name[:-3]} | {p['p50']} | {p['p95']} | {p['p99']} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
