"""The keyword leg alone, per store: SQLite FTS5 BM25 against PostgreSQL full-text search, on
LoCoMo (the same cells, questions and recall as bench/locomo.py, no embedder).

    python bench/keyword_legs.py --data ../shared/data/locomo/locomo-dev.json \
        --store sqlite:///tmp/kw.db --store postgresql://postgres@/kw?host=/path/to/sock

Each store URL must name an empty store. For PostgreSQL every ranker the store offers is
measured (`PostgresStore.KEYWORD_RANKERS`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from locomo import KS, questions, summarise, turn_cells  # noqa: E402

from ampkit.service import MemoryService  # noqa: E402
from ampkit.store import CellFilter, store_from_url  # noqa: E402


def measure(url: str, samples: list[dict]) -> dict:
    store = store_from_url(url)
    store.open()
    service = MemoryService(store=store)
    dia_of, workload = {}, []
    for sample in samples:
        owner = sample["sample_id"]
        cells = turn_cells(sample)
        for i in range(0, len(cells), 500):
            for cell in service.create_many(owner, cells[i : i + 500]):
                dia_of[cell.id] = cell.content.metadata["dia_id"]
        workload.extend((owner, q) for q in questions(sample, {c.content.metadata["dia_id"] for c in cells})[0])
    rankers = getattr(store, "KEYWORD_RANKERS", [None])
    results = {}
    for ranker in rankers:
        if ranker is not None:
            store.keyword_ranker = ranker
        rows, latencies = [], []
        for owner, q in workload:
            t = time.perf_counter()
            hits = store.keyword_candidates(q["question"], CellFilter(reader=owner, owner_id=owner), max(KS))
            latencies.append((time.perf_counter() - t) * 1000)
            rows.append((q["category"], [dia_of[h.cell_id] for h in hits], q["evidence"]))
        latencies.sort()
        summary = summarise(rows)
        summary["query_ms"] = {"p50": round(latencies[len(latencies) // 2], 2),
                               "p95": round(latencies[int(len(latencies) * 0.95)], 2)}
        results[f"{store.backend}:{ranker or 'bm25'}"] = summary
    store.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--store", action="append", required=True, help="an empty store URL (repeatable)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    samples = json.loads(args.data.read_text())
    results = {}
    for url in args.store:
        results.update(measure(url, samples))
    print(f"| keyword leg | questions | recall@5 | recall@10 | p50 ms | p95 ms |\n|---|---|---|---|---|---|")
    for name, r in results.items():
        o = r["overall"]
        print(f"| {name} | {r['questions']} | {o['recall@5']:.3f} | {o['recall@10']:.3f} | "
              f"{r['query_ms']['p50']} | {r['query_ms']['p95']} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
