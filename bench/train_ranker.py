"""Fit the learned ranker's weights (core/ranker.py) on LoCoMo and on fact-style memories,
and estimate them held out.

Two kinds of training questions, each a search with the ranker off, keeping the candidates
the ranker would see at `limit` 10 (the best 40 of the first pass) with their features
(`ampkit.ranker.candidate_features`, the function search uses):
- LoCoMo: every answerable question of the conversations in `--data`; evidence turns are
  the positives;
- facts: `bench/scale.py`'s templated memories ("Alice prefers window seats when
  travelling to Lisbon") in a store of `--fact-cells` cells over owners and teams, each
  target asked five ways (its owner's words and paraphrase, a team's words, an analyst's
  words and paraphrase); the target and any cell of the same text are the positives.
  Without them the weights fitted on conversation alone lost 2-4 points of hit@10 on these
  (team and analyst searches), against the first pass.
The weights come from pairwise logistic regression: every positive against every other
candidate of the same question, each question weighing the same, a little L2. The LoCoMo
estimate to quote is leave-one-conversation-out (each conversation ranked by weights fitted
on the others and the facts); the facts are checked on a second store made with another
seed.

    python bench/train_ranker.py --data ../shared/data/locomo/locomo-dev.json [--json out.json]

It prints recall@10 per LoCoMo category and hit@10 per fact search (first pass alone,
held out, fitted on all) and the weights fitted on everything, as `core/ranker.py` takes them.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from locomo import CATEGORIES, load
from scale import TEAMS, fact_plan, plan_batches, query_for

from ampkit.bootstrap import retriever_from_settings
from ampkit.config import Settings
from ampkit.ranker import FEATURES, candidate_features
from ampkit.models import CellCreate
from ampkit.retrieval import Retriever
from ampkit.service import MemoryService
from ampkit.store.base import CellFilter
from ampkit.store.sqlite import SQLiteStore

CANDIDATES = 40  # what search loads and rescores for a limit of 10 (RetrievalConfig.rescore), date-session extras aside


def first_pass_retriever(embedder: str) -> Retriever:
    """The server's retriever with the ranker off, pool and rescore set so that a search of
    any limit loads the candidates a search for 10 does (pools of 80, the best 40 fused, and
    the date-session leg's extra candidates)."""
    retriever = retriever_from_settings(Settings(embedder=embedder))
    retriever.ranker = None
    retriever.config = replace(retriever.config, pool_factor=0, rescore=0)
    return retriever


def candidates(retriever: Retriever, store: SQLiteStore, query: str, flt: CellFilter) -> tuple[list, np.ndarray]:
    """Every candidate the ranker would see (the first pass's 40 and the date-session leg's
    extra ones), in the first pass's order, and their features."""
    limit = CANDIDATES + retriever.config.date_extra
    hits, _ = retriever.search(store, query, flt, limit, datetime.now(timezone.utc))
    hits.sort(key=lambda h: (-h.explain["relevance"], h.cell.id))  # the first pass's order
    return hits, candidate_features([h.explain for h in hits], [h.cell.content.text for h in hits])


def collect(data: Path, embedder: str) -> list[dict]:
    """Per LoCoMo question: its owner, category, and each candidate's features and evidence label."""
    samples = json.loads(data.read_text())
    with tempfile.TemporaryDirectory(prefix="ampkit-ranker-") as tmp:
        store = SQLiteStore(str(Path(tmp) / "locomo.db"), synchronous="OFF")
        store.open()
        first_pass = first_pass_retriever(embedder)
        dia_of, workload, _ = load(MemoryService(store=store, retriever=first_pass), samples)
        questions = []
        for owner, q in workload:
            hits, features = candidates(first_pass, store, q["question"], CellFilter(reader=owner, owner_id=owner))
            questions.append({
                "owner": owner, "category": CATEGORIES[q["category"]], "x": features,
                "y": np.array([dia_of[h.cell.id] in q["evidence"] for h in hits], dtype=float),
                "evidence": len(q["evidence"]),
            })
        store.close()
    return questions


FACT_SEARCHES = ("owner_words", "owner_paraphrase", "team_words", "broad_words", "broad_paraphrase")


def collect_facts(cells: int, targets: int, seed: int, embedder: str) -> list[dict]:
    """Questions about bench/scale.py's templated memories (its generator, owners, teams and
    access): each of `targets` memories asked the five ways of FACT_SEARCHES."""
    rng = random.Random(seed)
    owners = [f"user-{i:05d}" for i in range(max(1, cells // 100))]
    with tempfile.TemporaryDirectory(prefix="ampkit-ranker-") as tmp:
        store = SQLiteStore(str(Path(tmp) / "facts.db"), synchronous="OFF")
        store.open()
        first_pass = first_pass_retriever(embedder)
        service = MemoryService(store=store, retriever=first_pass)
        facts: dict[str, list[tuple[str, str, str]]] = {o: [] for o in owners}
        for _, by_owner in plan_batches(fact_plan(cells, owners, rng), owners):
            for owner, rows in by_owner.items():
                created = service.create_many(owner, [CellCreate.model_validate(body) for body, _, _ in rows])
                for cell, (_, text, para) in zip(created, rows):
                    facts[owner].append((cell.id, text, para))
        questions = []
        for _ in range(targets):
            o = rng.randrange(len(owners))
            owner = owners[o]
            target, text, para = rng.choice(facts[owner])
            asks = (("owner_words", owner, query_for(text, rng), owner), ("owner_paraphrase", owner, para, owner),
                    ("team_words", f"team-{o % TEAMS}", query_for(text, rng), None),
                    ("broad_words", "analyst", query_for(text, rng), None), ("broad_paraphrase", "analyst", para, None))
            for kind, reader, query, owner_id in asks:
                hits, features = candidates(first_pass, store, query, CellFilter(reader=reader, owner_id=owner_id))
                if hits:
                    questions.append({"owner": "facts", "category": kind, "x": features, "evidence": 1, "y": np.array(
                        [h.cell.id == target or h.cell.content.text == text for h in hits], dtype=float)})
        store.close()
    return questions


def fit(questions: list[dict], l2: float = 1e-3, steps: int = 2000, rate: float = 1.0) -> np.ndarray:
    """Pairwise logistic regression by gradient descent: P(evidence above other) = sigmoid(w . (x_e - x_o))."""
    diffs, weights = [], []
    for q in questions:
        pos, neg = q["x"][q["y"] == 1], q["x"][q["y"] == 0]
        if len(pos) and len(neg):
            d = (pos[:, None, :] - neg[None, :, :]).reshape(-1, pos.shape[1])
            diffs.append(d)
            weights.append(np.full(len(d), 1.0 / len(d)))
    D, W = np.vstack(diffs), np.concatenate(weights)
    W /= W.sum()
    w = np.zeros(D.shape[1])
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(D @ w)))
        w -= rate * (D.T @ ((p - 1.0) * W) + l2 * w)
    return w


def recall_at_10(q: dict, w: Optional[np.ndarray]) -> float:
    """Share of the question's positives in the top 10 (for a fact: 1 when any is, a cell of
    the target's text counting as the target)."""
    order = np.arange(len(q["y"])) if w is None else np.argsort(-(q["x"] @ w), kind="stable")
    found = float(q["y"][order[:10]].sum())
    return min(found, 1.0) if q["owner"] == "facts" else found / q["evidence"]


def table(questions: list[dict], columns: dict[str, list[float]], categories: Sequence[str]) -> dict:
    out: dict = {}
    for name in [*categories, "overall"]:
        rows = [i for i, q in enumerate(questions) if name in ("overall", q["category"])]
        out[name] = {"questions": len(rows), **{col: round(statistics.fmean(vals[i] for i in rows), 4) for col, vals in columns.items()}}
    return out


def print_table(title: str, result: dict, columns: Sequence[str]) -> None:
    print(f"\n{title}\n")
    print("| search | n | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for name, row in result.items():
        print(f"| {name} | {row['questions']} | " + " | ".join(f"{row[c]:.3f}" for c in columns) + " |")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, type=Path, help="LoCoMo JSON (a list of conversations)")
    parser.add_argument("--embedder", default="default")
    parser.add_argument("--fact-cells", type=int, default=20000, help="templated memories in each fact store")
    parser.add_argument("--fact-targets", type=int, default=60, help="memories asked about for training (x5 searches)")
    parser.add_argument("--check-targets", type=int, default=300, help="memories asked about in the check store")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    locomo = collect(args.data, args.embedder)
    facts = collect_facts(args.fact_cells, args.fact_targets, 7, args.embedder)
    check = collect_facts(args.fact_cells, args.check_targets, 42, args.embedder)
    owners = sorted({q["owner"] for q in locomo})
    held_out = [0.0] * len(locomo)
    for owner in owners:  # leave one conversation out (the facts always in)
        w = fit([q for q in locomo if q["owner"] != owner] + facts)
        for i, q in enumerate(locomo):
            if q["owner"] == owner:
                held_out[i] = recall_at_10(q, w)
    w_all = fit(locomo + facts)
    categories = list(CATEGORIES.values())
    locomo_result = table(locomo, {
        "first_pass": [recall_at_10(q, None) for q in locomo],
        "ranker_held_out": held_out,
        "ranker_fitted_on_all": [recall_at_10(q, w_all) for q in locomo],
    }, categories)
    facts_result = table(check, {
        "first_pass": [recall_at_10(q, None) for q in check],
        "ranker": [recall_at_10(q, w_all) for q in check],
    }, FACT_SEARCHES)
    weights = {name: round(float(v), 3) for name, v in zip(FEATURES, w_all)}

    print(f"Trained on {len(locomo)} LoCoMo questions ({len(owners)} conversations) and {len(facts)} fact searches; "
          f"{CANDIDATES} candidates each")
    print_table("LoCoMo recall@10 (held out: leave one conversation out)", locomo_result,
                ["first_pass", "ranker_held_out", "ranker_fitted_on_all"])
    print_table(f"Fact memories hit@10, a second store ({args.fact_cells} cells, another seed)", facts_result,
                ["first_pass", "ranker"])
    print("\nDEFAULT_WEIGHTS = {")
    for name, v in weights.items():
        print(f'    "{name}": {v},')
    print("}")
    if args.json:
        args.json.write_text(json.dumps({"locomo_recall@10": locomo_result, "facts_hit@10": facts_result,
                                         "weights": weights, "conversations": owners}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
