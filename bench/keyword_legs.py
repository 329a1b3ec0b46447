"""The keyword leg alone, per store: SQLite FTS5 BM25 against PostgreSQL full-text search, on
LoCoMo (the same cells, questions and recall as bench/locomo.py). With `--embedder`, also the
full hybrid search through the service (keyword + dense leg, fused), per store.

    python bench/keyword_legs.py --data ../shared/data/locomo/locomo-dev.json \
        --store sqlite:///tmp/kw.db --store postgresql://postgres@/kw?host=/path/to/sock [--embedder default]

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

from locomo import KS, load, summarise  # noqa: E402

from ampkit.embeddings import embedder_from_name  # noqa: E402
from ampkit.models import SearchRequest  # noqa: E402
from ampkit.retrieval import Retriever  # noqa: E402
from ampkit.service import MemoryService  # noqa: E402
from ampkit.store import CellFilter, store_from_url  # noqa: E402


def timed_recall(workload, dia_of, search) -> dict:
    rows, latencies = [], []
    for owner, q in workload:
        t = time.perf_counter()
        ids = search(owner, q["question"])
        latencies.append((time.perf_counter() - t) * 1000)
        rows.append((q["category"], [dia_of[i] for i in ids], q["evidence"]))
    latencies.sort()
    summary = summarise(rows)
    summary["query_ms"] = {"p50": round(latencies[len(latencies) // 2], 2),
                           "p95": round(latencies[int(len(latencies) * 0.95)], 2)}
    return summary


def measure(url: str, samples: list[dict], embedder: str) -> dict:
    store = store_from_url(url)
    store.open()
    service = MemoryService(store=store, retriever=Retriever(embedder=embedder_from_name(embedder)))
    dia_of, workload, _ = load(service, samples)
    results = {}
    default_ranker = getattr(store, "keyword_ranker", None)
    for ranker in getattr(store, "KEYWORD_RANKERS", [None]):
        if ranker is not None:
            store.keyword_ranker = ranker
        results[f"{store.backend}:{ranker or 'bm25'}"] = timed_recall(workload, dia_of, lambda owner, q: [
            h.cell_id for h in store.keyword_candidates(q, CellFilter(reader=owner, owner_id=owner), max(KS))])
    if default_ranker is not None:
        store.keyword_ranker = default_ranker
    if embedder != "none":
        results[f"{store.backend}:hybrid"] = timed_recall(workload, dia_of, lambda owner, q: [
            h.id for h in service.search(owner, SearchRequest(query=q, owner_id=owner, limit=max(KS))).results])
    store.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--store", action="append", required=True, help="an empty store URL (repeatable)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--embedder", default="none", help="also measure the full hybrid search with this embedder")
    args = parser.parse_args(argv)
    samples = json.loads(args.data.read_text())
    results = {}
    for url in args.store:
        results.update(measure(url, samples, args.embedder))
    print("| leg | questions | recall@5 | recall@10 | p50 ms | p95 ms |\n|---|---|---|---|---|---|")
    for name, r in results.items():
        o = r["overall"]
        print(f"| {name} | {r['questions']} | {o['recall@5']:.3f} | {o['recall@10']:.3f} | "
              f"{r['query_ms']['p50']} | {r['query_ms']['p95']} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
