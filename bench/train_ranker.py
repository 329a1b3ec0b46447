"""Fit the learned ranker's weights (core/ranker.py) on LoCoMo, and estimate them held out.

For every answerable question, search runs with the ranker off and the candidates the
ranker would see at `limit` 10 (the best 40 of the first pass) are kept with their
features (`ampkit.ranker.candidate_features`, the function search uses). The weights come
from pairwise logistic regression: every evidence turn against every other candidate of the
same question, each question weighing the same, a little L2. The estimate to quote is
leave-one-conversation-out: each conversation ranked by weights fitted on the others.

    python bench/train_ranker.py --data ../shared/data/locomo/locomo-dev.json [--json out.json]

It prints recall@10 per category (first pass alone, held-out ranker, ranker fitted on all)
and the weights fitted on every conversation, as `core/ranker.py` takes them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from locomo import CATEGORIES, load

from ampkit.bootstrap import retriever_from_settings
from ampkit.config import Settings
from ampkit.ranker import FEATURES, candidate_features
from ampkit.retrieval import RetrievalConfig
from ampkit.service import MemoryService
from ampkit.store.base import CellFilter
from ampkit.store.sqlite import SQLiteStore

CANDIDATES = 40  # what search loads and rescores for a limit of 10 (RetrievalConfig.rescore)


def collect(data: Path, embedder: str) -> list[dict]:
    """Per question: its owner, category, and each candidate's features and evidence label."""
    samples = json.loads(data.read_text())
    with tempfile.TemporaryDirectory(prefix="ampkit-ranker-") as tmp:
        store = SQLiteStore(str(Path(tmp) / "locomo.db"), synchronous="OFF")
        store.open()
        first_pass = retriever_from_settings(Settings(embedder=embedder))
        service = MemoryService(store=store, retriever=first_pass)
        dia_of, workload, _ = load(service, samples)
        # The ranker off, and pool and rescore set so that asking for 40 hits loads the same
        # 40 candidates a search for 10 does (pool 80, best 40 fused).
        cfg = first_pass.config
        first_pass.ranker = None
        first_pass.config = RetrievalConfig(**{**cfg.__dict__, "pool_factor": 2, "rescore": 1})
        now = datetime.now(timezone.utc)
        questions = []
        for owner, q in workload:
            hits, _ = first_pass.search(store, q["question"], CellFilter(reader=owner, owner_id=owner), CANDIDATES, now)
            hits.sort(key=lambda h: (-h.explain["relevance"], h.cell.id))  # the first pass's order
            features = candidate_features([h.explain for h in hits], [h.cell.content.text for h in hits])
            questions.append({
                "owner": owner, "category": q["category"],
                "x": features,
                "y": np.array([dia_of[h.cell.id] in q["evidence"] for h in hits], dtype=float),
                "evidence": len(q["evidence"]),
            })
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


def recall_at_10(q: dict, w: np.ndarray | None) -> float:
    order = np.arange(len(q["y"])) if w is None else np.argsort(-(q["x"] @ w), kind="stable")
    return float(q["y"][order[:10]].sum()) / q["evidence"]


def table(questions: list[dict], columns: dict[str, list[float]]) -> dict:
    out: dict = {}
    for cat, name in [*CATEGORIES.items(), (0, "overall")]:
        rows = [i for i, q in enumerate(questions) if cat in (0, q["category"])]
        out[name] = {"questions": len(rows), **{col: round(statistics.fmean(vals[i] for i in rows), 4) for col, vals in columns.items()}}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, type=Path, help="LoCoMo JSON (a list of conversations)")
    parser.add_argument("--embedder", default="default")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    questions = collect(args.data, args.embedder)
    owners = sorted({q["owner"] for q in questions})
    held_out = [0.0] * len(questions)
    for owner in owners:  # leave one conversation out
        w = fit([q for q in questions if q["owner"] != owner])
        for i, q in enumerate(questions):
            if q["owner"] == owner:
                held_out[i] = recall_at_10(q, w)
    w_all = fit(questions)
    result = table(questions, {
        "first_pass": [recall_at_10(q, None) for q in questions],
        "ranker_held_out": held_out,
        "ranker_fitted_on_all": [recall_at_10(q, w_all) for q in questions],
    })
    weights = {name: round(float(v), 3) for name, v in zip(FEATURES, w_all)}

    print(f"LoCoMo recall@10, {len(questions)} questions in {len(owners)} conversations, "
          f"{CANDIDATES} candidates each (held out: leave one conversation out)\n")
    print("| category     |    n | first pass | ranker, held out | ranker, fitted on all |")
    print("|--------------|------|------------|------------------|-----------------------|")
    for name, row in result.items():
        print(f"| {name:<12} | {row['questions']:>4} | {row['first_pass']:10.3f} | {row['ranker_held_out']:16.3f} | "
              f"{row['ranker_fitted_on_all']:21.3f} |")
    print("\nDEFAULT_WEIGHTS = {")
    for name, v in weights.items():
        print(f'    "{name}": {v},')
    print("}")
    if args.json:
        args.json.write_text(json.dumps({"recall@10": result, "weights": weights, "conversations": owners}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
