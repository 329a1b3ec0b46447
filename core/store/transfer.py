"""Moving a memory between stores (`ampkit copy`) and bringing a schema up to date
(`ampkit migrate`). Both work on any pair of backends through the `Store` interface only.

A copy carries every cell in every status (deleted ones too, so their retention window still
runs), each cell's history, the memory folders' approval modes and the proposed file changes
(pending and decided: who must approve what is policy, and travels with the memory), and the
API keys (hashes only, as stored). Vectors are not read
back from the source: they are recomputed with the configured embedder, exactly what
`ampkit reindex` would do, so a copy also moves a store onto a new model. History entries
get new sequence numbers in the destination (their order and content are kept); history of
cells already purged at the source is not carried.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from ..models import MemoryCell
from ..retrieval import Retriever
from .base import ALL_STATUSES, CellFilter, HistoryRecord, Store


def everything() -> CellFilter:
    return CellFilter(statuses=ALL_STATUSES, include_superseded=True)


@dataclass
class CopyReport:
    cells: int = 0
    history: int = 0
    keys: int = 0
    folders: int = 0
    proposals: int = 0
    vectors: int = 0
    mismatches: list[str] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        return not self.mismatches


class DestinationNotEmpty(Exception):
    """`ampkit copy` only fills an empty store, so nothing is merged by accident."""


def copy_store(
    source: Store,
    destination: Store,
    retriever: Optional[Retriever] = None,
    batch_size: int = 200,
    progress: Callable[[int], None] = lambda n: None,
) -> CopyReport:
    """Copy everything from `source` into the empty `destination`, then verify the counts.

    Each batch of cells (with their history and vectors) is one destination transaction."""
    if destination.count(everything()) or destination.keys.list():
        raise DestinationNotEmpty("the destination store already holds cells or keys; copy only fills an empty store")
    retriever = retriever or Retriever()
    report = CopyReport()
    batch: list[MemoryCell] = []

    def flush() -> None:
        vectors = retriever.vectors_for([c.content.text for c in batch])
        histories = {c.id: source.history(c.id) for c in batch}
        with destination.write() as tx:
            for cell, vector in zip(batch, vectors):
                tx.insert(cell, vector)
                for h in histories[cell.id]:
                    tx.add_history(HistoryRecord(h.cell_id, h.at, h.actor, h.action, h.changes))
        report.cells += len(batch)
        report.history += sum(len(h) for h in histories.values())
        report.vectors += sum(v is not None for v in vectors)
        progress(len(batch))
        batch.clear()

    for cell in source.iter_cells(batch_size=batch_size):
        batch.append(cell)
        if len(batch) >= batch_size:
            flush()
    if batch:
        flush()
    folders = source.folders()
    with destination.write() as tx:
        for folder in folders:
            tx.set_approval_mode(folder.owner_id, folder.approval_mode, folder.updated_at, folder.updated_by)
    report.folders = len(folders)
    for page in source.proposal_pages(batch_size=batch_size):
        with destination.write() as tx:
            for proposal in page:
                tx.put_proposal(proposal)
        report.proposals += len(page)
    for key in source.keys.list():
        destination.keys.put(key)
        report.keys += 1
    report.mismatches = verify_copy(source, destination)
    return report


def verify_copy(source: Store, destination: Store) -> list[str]:
    """Per-status cell counts, history length per cell and key ids must agree."""
    problems = []
    for status in ALL_STATUSES:
        flt = CellFilter(statuses=(status,), include_superseded=True)
        a, b = source.count(flt), destination.count(flt)
        if a != b:
            problems.append(f"{status} cells: {a} in the source, {b} in the destination")
    short = [c.id for c in source.iter_cells() if len(source.history(c.id)) != len(destination.history(c.id))]
    if short:
        problems.append(f"history differs for {len(short)} cells, e.g. {short[0]}")
    if {k.key_id for k in source.keys.list()} != {k.key_id for k in destination.keys.list()}:
        problems.append("API keys differ")
    if sorted(source.folders(), key=lambda f: f.owner_id) != sorted(destination.folders(), key=lambda f: f.owner_id):
        problems.append("folder approval modes differ")
    if source.list_proposals() != destination.list_proposals():
        problems.append("file proposals differ")
    return problems


# ------------------------------------------------------------------ migrations
def pending_migrations(url: str) -> list[tuple[int, str]]:
    """(version, name) of the migrations `open()` would apply to the store at `url`; reads only."""
    from . import store_from_url

    return store_from_url(url).pending_migrations()  # builds (no I/O), then reads only
