"""Search ranking: candidates from the store's legs, fused, blended with decay.

Stages, each replaceable:
1. candidates: the keyword leg (BM25) and, when an embedder is configured, the dense leg;
   each over-fetches a pool, with the caller's access and filters applied inside the leg;
2. fusion of the legs' ranks (weighted reciprocal-rank fusion);
3. blend with the lifecycle decay score;
4. an optional reranker (default: none).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Optional, Protocol, Sequence

from .lifecycle import decay_score
from .models import MemoryCell
from .store.base import Candidate, CellFilter, Store, StoredVector


@dataclass
class ScoredCell:
    cell: MemoryCell
    score: float
    explain: dict[str, float] = field(default_factory=dict)


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]): ...


class Reranker(Protocol):
    def rerank(self, query: str, hits: list[ScoredCell]) -> list[ScoredCell]: ...


@dataclass
class RetrievalConfig:
    pool: int = 80  # candidates per leg, at least
    pool_factor: int = 8  # ... or limit x this
    rrf_k: float = 10.0
    keyword_weight: float = 1.0
    dense_weight: float = 0.5
    relevance_weight: float = 0.7  # final = relevance_weight x fused + decay_weight x decay
    decay_weight: float = 0.3


class Retriever:
    def __init__(
        self,
        embedder: Optional[Embedder] = None,
        config: Optional[RetrievalConfig] = None,
        reranker: Optional[Reranker] = None,
    ):
        self.embedder = embedder
        self.config = config or RetrievalConfig()
        self.reranker = reranker

    def vectors_for(self, texts: Sequence[str]) -> list[Optional[StoredVector]]:
        if self.embedder is None or not texts:
            return [None] * len(texts)
        matrix = self.embedder.embed(list(texts))
        return [StoredVector(self.embedder.name, row) for row in matrix]

    def search(
        self,
        store: Store,
        query: str,
        flt: CellFilter,
        limit: int,
        now: datetime,
        keep: Callable[[MemoryCell], bool] = lambda cell: True,
    ) -> tuple[list[ScoredCell], int]:
        """Ranked hits (at most `limit`) and the number of distinct candidates considered.

        `keep` is the caller's access check; it runs before the list is cut to `limit`.
        """
        cfg = self.config
        pool = max(cfg.pool, limit * cfg.pool_factor)
        legs: list[tuple[str, float, list[Candidate]]] = [
            ("keyword", cfg.keyword_weight, store.keyword_candidates(query, flt, pool))
        ]
        if self.embedder is not None:
            qvec = self.embedder.embed([query])[0]
            legs.append(("dense", cfg.dense_weight, store.vector_candidates(qvec, self.embedder.name, flt, pool)))

        fused: dict[str, dict[str, float]] = {}
        for name, weight, cands in legs:
            for rank, cand in enumerate(cands):
                parts = fused.setdefault(cand.cell_id, {})
                parts[name] = cand.score
                parts[f"{name}_rank"] = rank + 1
                parts["fused"] = parts.get("fused", 0.0) + weight / (cfg.rrf_k + rank + 1)
        if not fused:
            return [], 0
        best = max(p["fused"] for p in fused.values())
        cells = store.get_many(list(fused))
        hits: list[ScoredCell] = []
        for cid, parts in fused.items():
            cell = cells.get(cid)
            if cell is None or not keep(cell):  # purged meanwhile, or not the caller's to see
                continue
            relevance = parts["fused"] / best
            decay = decay_score(cell, now)
            score = cfg.relevance_weight * relevance + cfg.decay_weight * decay
            hits.append(ScoredCell(cell, score, {**parts, "relevance": relevance, "decay": decay, "score": score}))
        hits.sort(key=lambda h: (-h.score, h.cell.id))
        if self.reranker is not None:
            hits = self.reranker.rerank(query, hits)
        return hits[:limit], len(hits)
