"""LoCoMo retrieval benchmark: recall of the evidence turns, through the real service.

Each conversation's turns become cells of one owner (the conversation id): the cell text is
"<speaker>: <turn text>" (plus the shared photo's caption, if any), the session's date and
the turn id go in `content.metadata`, the session in `identity.session_id`. Every answerable
question (categories 1-4 with evidence that resolves) is a search by that owner; recall@k is
the fraction of a question's evidence turns among the top k, averaged over questions; hit@1
the share of questions whose first result is an evidence turn, MRR@10 the mean of 1 / the
rank of the first evidence turn in the top 10 (0 when none is there).

    python bench/locomo.py --data ../shared/data/locomo/locomo-dev.json [--json out.json]

The table also splits the conversations in two halves, in file order: the boosts added for
multi-hop questions (issue 15) were tuned on the first half only ("tune": conv-26, 30, 41 of
the dev file), so the second ("held": conv-42, 43) was a held-out-style check for them. The
learned ranker's weights are fitted on all five conversations: its held-out figure is
`bench/train_ranker.py`'s (leave one conversation out). Query time is
reported as wall time and as the thread's CPU time (on a shared, loaded machine the wall
time mostly measures the wait for a core).

The store is a temporary SQLite file; the service, retriever and embedder are the ones the
server builds (`AMPKIT_EMBEDDER`, default `default`; the `AMPKIT_RETRIEVAL_*` settings switch
stages, e.g. `AMPKIT_RETRIEVAL_RELATED_WEIGHT=0`). "BM25 only" is the keyword leg alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ampkit.bootstrap import retriever_from_settings
from ampkit.config import Settings
from ampkit.models import CellCreate, SearchRequest
from ampkit.service import MemoryService
from ampkit.store.base import CellFilter
from ampkit.store.sqlite import SQLiteStore

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
KS = (5, 10)


def turn_cells(sample: dict) -> list[CellCreate]:
    conv, owner = sample["conversation"], sample["sample_id"]
    cells = []
    sessions = sorted(int(k.split("_")[1]) for k in conv if k.startswith("session_") and not k.endswith("date_time"))
    for n in sessions:
        date = conv.get(f"session_{n}_date_time", "")
        for turn in conv[f"session_{n}"]:
            text = f"{turn['speaker']}: {turn['text']}"
            if turn.get("blip_caption"):
                text += f" [shares a photo: {turn['blip_caption']}]"
            cells.append(CellCreate(
                type="episodic",
                content={"text": text, "metadata": {"dia_id": turn["dia_id"], "date": date, "speaker": turn["speaker"]}},
                identity={"owner_id": owner, "session_id": f"{owner}-s{n}"},
            ))
    return cells


def questions(sample: dict, known: set[str]) -> tuple[list[dict], int]:
    kept, skipped = [], 0
    for qa in sample["qa"]:
        if qa.get("category") not in CATEGORIES:
            continue
        evidence = {e.strip() for e in qa.get("evidence", []) if e.strip() in known}
        if not evidence:
            skipped += 1
            continue
        kept.append({"question": qa["question"], "category": qa["category"], "evidence": evidence})
    return kept, skipped


def recall(ranked: list[str], evidence: set[str], k: int) -> float:
    return len(evidence & set(ranked[:k])) / len(evidence)


def reciprocal_rank(ranked: list[str], evidence: set[str], depth: int = 10) -> float:
    """1 / the rank of the first evidence turn in the top `depth` (0 when none is)."""
    return next((1 / (i + 1) for i, turn in enumerate(ranked[:depth]) if turn in evidence), 0.0)


def scores(rows: list[tuple[int, list[str], set[str]]]) -> dict:
    """recall@k; hit@1 (an evidence turn is first) and MRR@10 (what an agent that reads the top few sees)."""
    out = {f"recall@{k}": round(statistics.fmean(recall(r, e, k) for _, r, e in rows), 4) for k in KS}
    out["hit@1"] = round(statistics.fmean(bool(r) and r[0] in e for _, r, e in rows), 4)
    out["mrr@10"] = round(statistics.fmean(reciprocal_rank(r, e) for _, r, e in rows), 4)
    return out


def summarise(rows: list[tuple[int, list[str], set[str]]]) -> dict:
    out: dict = {"overall": scores(rows), "by_category": {}}
    for cat, name in CATEGORIES.items():
        sub = [(c, r, e) for c, r, e in rows if c == cat]
        if sub:
            out["by_category"][name] = scores(sub)
            out["by_category"][name]["questions"] = len(sub)
    out["questions"] = len(rows)
    return out


def halves(samples: list[dict]) -> dict[str, set[str]]:
    """The first ceil(n/2) conversations (the one multi-hop stages were tuned on) and the rest."""
    ids = [s["sample_id"] for s in samples]
    cut = (len(ids) + 1) // 2
    return {"tune": set(ids[:cut]), "held": set(ids[cut:])}


def load(service: MemoryService, samples: list[dict]) -> tuple[dict[str, str], list[tuple[str, dict]], int]:
    """Each conversation's turns become cells of one owner (the sample id), in batches.
    Returns cell id -> dialogue id, the (owner, question) workload, and questions skipped."""
    dia_of: dict[str, str] = {}
    workload: list[tuple[str, dict]] = []
    skipped = 0
    for sample in samples:
        owner = sample["sample_id"]
        cells = turn_cells(sample)
        for i in range(0, len(cells), 500):
            for cell in service.create_many(owner, cells[i : i + 500]):
                dia_of[cell.id] = cell.content.metadata["dia_id"]
        qs, missing = questions(sample, {c.content.metadata["dia_id"] for c in cells})
        skipped += missing
        workload.extend((owner, q) for q in qs)
    return dia_of, workload, skipped


def mix_in_multilingual(service: MemoryService, owners: list[str]) -> int:
    """A bilingual user's store: each owner also holds the Korean, Japanese and Chinese
    memories of bench/data/multilingual_ko.tsv (English questions must still find English
    turns). Returns the cells added."""
    from multilingual import read_dataset

    memories, _ = read_dataset()
    texts = [m["text"] for m in memories.values()]
    for owner in owners:
        service.create_many(owner, [CellCreate(type="semantic", content={"text": t}, identity={"owner_id": owner},
                                               dedup="off") for t in texts])
    return len(texts) * len(owners)


def run(data: Path, embedder_name: str, mix_multilingual: bool = False) -> dict:
    samples = json.loads(data.read_text())
    tmp = tempfile.TemporaryDirectory(prefix="ampkit-locomo-")
    store = SQLiteStore(str(Path(tmp.name) / "locomo.db"), synchronous="OFF")
    store.open()
    # As the server builds it: AMPKIT_RETRIEVAL_* settings switch stages (e.g. "before" runs).
    retriever = retriever_from_settings(Settings(embedder=embedder_name))
    service = MemoryService(store=store, retriever=retriever)

    t0 = time.perf_counter()
    dia_of, workload, skipped = load(service, samples)
    index_s = time.perf_counter() - t0
    mixed = mix_in_multilingual(service, [s["sample_id"] for s in samples]) if mix_multilingual else 0

    full, bm25, latencies, intruders, cpu = [], [], [], [], []
    owners = []
    for owner, q in workload:
        t, c = time.perf_counter(), time.thread_time()
        hits = service.search(owner, SearchRequest(query=q["question"], owner_id=owner, limit=max(KS))).results
        latencies.append((time.perf_counter() - t) * 1000)
        cpu.append((time.thread_time() - c) * 1000)
        ranked = [dia_of.get(h.id, "") for h in hits]  # "": a mixed-in CJK memory (never evidence)
        intruders.append(sum(r == "" for r in ranked))
        full.append((q["category"], ranked, q["evidence"]))
        owners.append(owner)
        flt = CellFilter(reader=owner, owner_id=owner)
        kw = store.keyword_candidates(q["question"], flt, max(KS))
        bm25.append((q["category"], [dia_of[c.cell_id] for c in kw], q["evidence"]))
    store.close()
    tmp.cleanup()

    result = summarise(full)
    latencies.sort()
    cpu.sort()
    split = halves(samples)
    result["halves"] = {name: {**summarise([row for row, o in zip(full, owners) if o in ids]), "conversations": sorted(ids)}
                        for name, ids in split.items() if ids}
    result.update({
        "embedder": retriever.embedder.name if retriever.embedder else "none",
        "cells": len(dia_of),
        "skipped_questions": skipped,
        "multilingual_cells_mixed_in": mixed,
        "mixed_in_per_top10": round(statistics.fmean(intruders), 3),
        "index_s": round(index_s, 2),
        "query_ms": {"p50": round(latencies[len(latencies) // 2], 2), "p95": round(latencies[int(len(latencies) * 0.95)], 2)},
        "query_cpu_ms": {"p50": round(cpu[len(cpu) // 2], 2), "p95": round(cpu[int(len(cpu) * 0.95)], 2)},
        "bm25_only": summarise(bm25),
    })
    return result


def print_table(result: dict) -> None:
    print(f"LoCoMo: {result['cells']} turns, {result['questions']} questions "
          f"({result['skipped_questions']} skipped: no resolvable evidence); embedder {result['embedder']}"
          + (f"; {result['multilingual_cells_mixed_in']} CJK memories mixed in, "
             f"{result['mixed_in_per_top10']} of them per top 10" if result.get("multilingual_cells_mixed_in") else ""))
    print(f"index {result['index_s']} s; query p50 {result['query_ms']['p50']} ms, p95 {result['query_ms']['p95']} ms "
          f"(CPU p50 {result['query_cpu_ms']['p50']} ms, p95 {result['query_cpu_ms']['p95']} ms)\n")
    print(f"| {'category':<12} | {'n':>4} | BM25 r@5 | BM25 r@10 | full r@5 | full r@10 | full hit@1 | full MRR@10 |")
    print(f"|{'-' * 14}|{'-' * 6}|----------|-----------|----------|-----------|------------|-------------|")
    rows = [(name, result["by_category"][name], result["bm25_only"]["by_category"][name]) for name in result["by_category"]]
    rows.append(("overall", {**result["overall"], "questions": result["questions"]}, result["bm25_only"]["overall"]))
    for name, full, bm in rows:
        print(f"| {name:<12} | {full['questions']:>4} | {bm['recall@5']:8.3f} | {bm['recall@10']:9.3f} | "
              f"{full['recall@5']:8.3f} | {full['recall@10']:9.3f} | {full['hit@1']:10.3f} | {full['mrr@10']:11.3f} |")
    for half, summary in result.get("halves", {}).items():
        print(f"\n{half} half ({', '.join(summary['conversations'])}), full pipeline:")
        print(f"| {'category':<12} | {'n':>4} | r@5   | r@10  | hit@1 | MRR@10 |")
        print(f"|{'-' * 14}|{'-' * 6}|-------|-------|-------|--------|")
        cats = [(name, summary["by_category"][name]) for name in summary["by_category"]]
        cats.append(("overall", {**summary["overall"], "questions": summary["questions"]}))
        for name, part in cats:
            print(f"| {name:<12} | {part['questions']:>4} | {part['recall@5']:.3f} | {part['recall@10']:.3f} | "
                  f"{part['hit@1']:.3f} | {part['mrr@10']:6.3f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, type=Path, help="LoCoMo JSON (a list of conversations)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--embedder", default="default", help="none | default | sentence-transformers:... | openai:...")
    parser.add_argument("--mix-multilingual", action="store_true",
                        help="also give every owner the Korean/Japanese/Chinese memories of bench/multilingual.py")
    args = parser.parse_args(argv)
    result = run(args.data, args.embedder, args.mix_multilingual)
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
