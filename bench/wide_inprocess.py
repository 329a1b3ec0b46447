"""Reader-wide search in process on an existing store: wall and CPU time, first and later searches.

    python bench/wide_inprocess.py --db PATH [--first 60] [--later 100] [--foreign 3] [--json out.json]

The in-process companion of `bench/wide_search.py` (same files: written by `bench/scale.py`,
owners `user-NNNNN`, every cell readable by its team and by `analyst`). One service opens the
store and waits for its background loading (vectors, graph, the term rows read at open);
then, timed with `time.perf_counter` and `time.process_time` (CPU of this process, which
separates the code's cost from the other work on a shared machine):

- first: the first analyst searches of the process, then the first team searches (each new
  word is read or scored over its filter's rows for the first time);
- later: more of each, after those;
- another process: a second store on the same file writes a cell, and the first service's
  next analyst search must find it (the change log catches the first store up), timed.

THE FILE IS WRITTEN TO (the foreign rounds add cells): run it on a copy.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import TEAMS, memory_fact, percentiles, query_for  # noqa: E402

from ampkit.bootstrap import build_service, load_settings  # noqa: E402
from ampkit.models import CellCreate, SearchRequest  # noqa: E402
from ampkit.service import MemoryService  # noqa: E402
from ampkit.store import store_from_url  # noqa: E402


def timed(service, work: list[tuple[str, str]]) -> dict:
    wall, cpu = [], []
    for agent, query in work:
        c, t = time.process_time(), time.perf_counter()
        service.search(agent, SearchRequest(query=query, limit=10))
        wall.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    return {**percentiles(wall), "cpu": percentiles(cpu)}


def run(db: str, first: int, later: int, foreign: int) -> dict:
    url = f"sqlite:///{db}"
    rng = random.Random(3)
    result: dict = {"db": db, "load_at_start": [round(x, 2) for x in os.getloadavg()]}
    service = build_service(load_settings(store=url, embedder="default"))
    store = service.store
    t0 = time.perf_counter()
    store.open()
    try:
        store.wait_for_vector_index()
        store.wait_for_term_warmup()
        result["ready_s"] = round(time.perf_counter() - t0, 1)

        def work(n: int) -> dict[str, list[tuple[str, str]]]:
            return {"analyst": [("analyst", query_for(memory_fact(rng)[0], rng)) for _ in range(n)],
                    "team": [(f"team-{i % TEAMS}", query_for(memory_fact(rng)[0], rng)) for i in range(n)]}

        result["first_ms"] = {name: timed(service, w) for name, w in work(first).items()}
        result["later_ms"] = {name: timed(service, w) for name, w in work(later).items()}
        other = store_from_url(url)
        other.open()
        rounds = []
        try:
            for k in range(foreign):
                word = f"zqxforeign{os.getpid()}x{k}"
                # Another server on the file, with the same embedder (deployment.md: every server
                # the same settings): a cell written without a vector is ranked by the keyword leg
                # alone and may well sit below cells both legs find.
                MemoryService(store=other, retriever=service.retriever).create("user-00001", CellCreate(
                    content={"text": f"Lena packed {word}"}, identity={"owner_id": "user-00001"},
                    access_policy={"readable_by": ["analyst"]}))
                c, t = time.process_time(), time.perf_counter()
                hits = service.search("analyst", SearchRequest(query=f"{word} window seats", limit=10)).results
                rounds.append({"ms": round((time.perf_counter() - t) * 1000, 1),
                               "cpu_ms": round((time.process_time() - c) * 1000, 1),
                               "found": any(word in h.content.text for h in hits)})
        finally:
            other.close()
        result["after_other_process_write"] = rounds
    finally:
        store.close()
    result["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    result["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return result


def print_table(res: dict) -> None:
    print(f"wide search in process: {res['db']}, load {res['load_at_start']} -> {res['load_at_end']}, "
          f"ready {res['ready_s']} s, max RSS {res['max_rss_mb']} MB")
    print("| search | p50 ms | p95 ms | p99 ms | CPU p50 ms | CPU p95 ms |\n|---|---|---|---|---|---|")
    for phase in ("first", "later"):
        for name, p in res[f"{phase}_ms"].items():
            print(f"| {phase} {name} | {p['p50']} | {p['p95']} | {p['p99']} | {p['cpu']['p50']} | {p['cpu']['p95']} |")
    for r in res["after_other_process_write"]:
        print(f"| analyst after another process's write | {r['ms']} | - | - | {r['cpu_ms']} | - | (found: {r['found']})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="a SQLite file written by bench/scale.py (it is written to: a copy)")
    parser.add_argument("--first", type=int, default=60, help="first analyst and team searches to time (each)")
    parser.add_argument("--later", type=int, default=100, help="later analyst and team searches to time (each)")
    parser.add_argument("--foreign", type=int, default=3, help="rounds of another store's write, then a search")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    result = run(args.db, args.first, args.later, args.foreign)
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
