"""Dedup on write: does the owner already have this memory? No model needed.

Two tests, both among the cells the *writer can read* (the same filter a search by that
writer uses, so a "duplicate" answer never reveals a cell the writer could not see), of the
same owner and type, active or stale, not superseded, not expired:

- exact: the same normalised text (Unicode NFKC, case-folded, whitespace collapsed,
  trailing punctuation dropped). Candidates: the store's `same_text_candidates` (SQLite and
  PostgreSQL: an indexed digest of the normalised text, one lookup; a store without one: the
  keyword leg's top 25 for the text's first 64 words).
- near: similarity >= the threshold (default 0.90): the cosine of the embedder's vectors
  when one is configured (the dense leg's raw score), otherwise the Jaccard overlap of the
  normalised word sets. Candidates come from both legs of the hybrid retriever.

Episodic cells are never deduplicated: the same words said twice are two events. A create
that supersedes a cell is never deduplicated either: it is an explicit replacement. Memory
files are never candidates (`comparable`): a file changes only through the files API, so a
restated memory neither merges into one nor is answered by one.
The service holds a lock per (owner, type, normalised text) from the check to the commit, so
identical writes racing each other in one server process store one cell. Across server
processes (several replicas on one PostgreSQL) and for near duplicates the check is best
effort: two racing writes can both be stored, and the next consolidation treats them as
duplicates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Optional, Sequence

from .access import can_read
from .models import MemoryCell
from .retrieval import Retriever
from .textindex import normalise_text
from .store.base import CellFilter, Store, StoredVector

EXACT_POOL = 25  # candidates compared for an exact duplicate
NEAR_POOL = 10  # candidates per leg searched for a near duplicate
QUERY_WORDS = 64  # a long text is looked up by its first words
DEFAULT_THRESHOLD = 0.90
# The policies that compare by meaning (near duplicates), so need the new cell's vector now.
NEAR_POLICIES = frozenset({"skip", "merge"})

_WORD = re.compile(r"\w+")


def lexical_similarity(a: str, b: str) -> float:
    """Jaccard overlap of the two texts' normalised word sets (1.0 = the same words)."""
    wa, wb = set(_WORD.findall(normalise_text(a))), set(_WORD.findall(normalise_text(b)))
    if not wa or not wb:
        return 0.0
    return len(wa & wb) / len(wa | wb)


@dataclass(frozen=True)
class Duplicate:
    cell: MemoryCell
    kind: str  # "exact" or "near"
    similarity: float


def comparable(cell: MemoryCell, agent: Optional[str]) -> bool:
    """Whether `cell` may be the existing memory a new one is compared with (and merged into):
    one the writer can read, and not a memory file."""
    return cell.identity.path is None and (agent is None or can_read(cell, agent))


def comparison_filter(agent: Optional[str], owner_id: str, cell_type: str, now: datetime) -> CellFilter:
    """The cells a new memory of `owner_id` is compared with: what `agent` could find by search."""
    return CellFilter(reader=agent, owner_id=owner_id, types=[cell_type], statuses=("active", "stale"),
                      include_superseded=False, not_expired_at=now)


def similar_cells(
    store: Store, retriever: Retriever, agent: Optional[str], text: str, flt: CellFilter,
    vector: Optional[StoredVector], pool: int,
) -> list[tuple[MemoryCell, float]]:
    """Readable cells near `text` by either leg, each with its similarity, most similar first."""
    query = " ".join(text.split()[:QUERY_WORDS])
    scores: dict[str, Optional[float]] = {c.cell_id: None for c in store.keyword_candidates(query, flt, pool)}
    if vector is not None:
        for cand in store.vector_candidates(vector.vector, vector.model, flt, pool):
            scores[cand.cell_id] = float(cand.score)
    cells = store.get_many(list(scores))
    out: list[tuple[MemoryCell, float]] = []
    for cid, cosine in scores.items():
        cell = cells.get(cid)
        if cell is None or not comparable(cell, agent):
            continue
        if cosine is None and vector is not None and retriever.embedder is not None:
            # Found by the keyword leg only: embed it to compare on the same scale.
            other = retriever.embedder.embed([cell.content.text])[0]
            cosine = float(other @ vector.vector)
        similarity = cosine if cosine is not None else lexical_similarity(text, cell.content.text)
        if normalise_text(cell.content.text) == normalise_text(text):
            similarity = 1.0
        out.append((cell, similarity))
    out.sort(key=lambda pair: (-pair[1], pair[0].id))
    return out


def without_exact_candidates(store: Store, agent: str, cells: Sequence[MemoryCell], now: datetime) -> set[str]:
    """Ids of `cells` for which an exact-only `find_duplicate` has no candidate to compare and
    so finds nothing: asked once per owner and type of the batch (the store's
    `texts_with_candidates`), not once per cell. Empty when the store cannot tell."""
    groups: dict[tuple[str, str], list[MemoryCell]] = {}
    for cell in cells:
        groups.setdefault((cell.identity.owner_id, cell.type), []).append(cell)
    clean: set[str] = set()
    for (owner_id, cell_type), members in groups.items():
        found = store.texts_with_candidates([c.content.text for c in members],
                                            comparison_filter(agent, owner_id, cell_type, now))
        if found is not None:
            clean.update(c.id for c in members if c.content.text not in found)
    return clean


def find_duplicate(
    store: Store, retriever: Retriever, agent: str, cell: MemoryCell, vector: Optional[StoredVector],
    *, near: bool, threshold: float, now: datetime,
) -> Optional[Duplicate]:
    flt = comparison_filter(agent, cell.identity.owner_id, cell.type, now)
    key = normalise_text(cell.content.text)
    if not near:
        found = store.get_many(store.same_text_candidates(cell.content.text, flt, EXACT_POOL))
        exact = sorted(
            (c for c in found.values() if comparable(c, agent) and normalise_text(c.content.text) == key),
            key=lambda c: c.id,
        )
        return Duplicate(exact[0], "exact", 1.0) if exact else None
    for other, similarity in similar_cells(store, retriever, agent, cell.content.text, flt, vector, NEAR_POOL):
        if similarity >= 1.0 and normalise_text(other.content.text) == key:
            return Duplicate(other, "exact", 1.0)
        if similarity >= threshold:
            return Duplicate(other, "near", similarity)
    return None


__all__ = ["DEFAULT_THRESHOLD", "NEAR_POLICIES", "Duplicate", "comparable", "comparison_filter", "find_duplicate", "lexical_similarity",
           "normalise_text", "similar_cells", "without_exact_candidates"]
