"""The memory service's upkeep: lifecycle runs, purges and the embedding queue."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Optional, Sequence


from .lifecycle import (
    purge_eligible,
    scheduled_status,
)
from .models import (
    LifecycleRunResponse,
    PurgeRefusal,
    PurgeResponse,
    Status,
)
from .service_base import SYSTEM_ACTOR, ServiceBase
from .store.base import HistoryRecord



class ServiceUpkeep(ServiceBase):
    """The part of `MemoryService` that keeps the store in shape: the scheduled lifecycle,
    purges past retention, and embedding the queued cells."""

    def embed_queued(self, batch_size: int = 16) -> int:
        """Embed up to `batch_size` queued cells (oldest first) and store their vectors; returns
        how many were looked at (0: the queue is empty). The embedding runs outside the write
        transaction; a cell whose text changed meanwhile stays queued for its new text, and a
        purged one has left the queue with its row."""
        if self.retriever.embedder is None:
            return 0
        queued = self.store.queued_embeddings(batch_size)
        if not queued:
            return 0
        self._store_vectors(queued)
        return len(queued)


    def drain_embeddings(self, batch_size: int = 16) -> int:
        """Embed until the queue is empty (benchmarks, tests, `ampkit reindex`); returns cells done."""
        done = 0
        while (n := self.embed_queued(batch_size)):
            done += n
        return done

    def embedding_status(self) -> dict[str, Any]:
        """What GET /health says about embedding: the model, the mode and the queue's depth (a
        count over all owners, no cell's identity: nothing a caller could not read leaks)."""
        embedder = self.retriever.embedder
        return {
            "model": embedder.name if embedder is not None else None,
            "multilingual_model": self.retriever.cjk_model,
            "background": self.retriever.background,
            "queued": self.store.embedding_queue_depth() if self.retriever.background else 0,
        }


    def run_lifecycle(self, as_of: Optional[datetime] = None) -> LifecycleRunResponse:
        now = self._clock_or(as_of)
        counts = {"evaluated": 0, "to_stale": 0, "to_active": 0, "to_archived": 0, "expired": 0}
        changes: list[tuple[str, str, str]] = []
        with self.store.try_lifecycle_lock() as got:
            if not got:  # another server is running it this interval
                return LifecycleRunResponse(**counts, ran_at=now)
            for cell in self.store.iter_cells([Status.active.value, Status.stale.value]):
                counts["evaluated"] += 1
                new_status, reason = scheduled_status(cell, now, self.policy)
                if new_status is not None:
                    changes.append((cell.id, new_status, reason))
            for i in range(0, len(changes), 200):
                with self.store.write() as tx:
                    for cell_id, new_status, reason in changes[i : i + 200]:
                        current = tx.get(cell_id)
                        if current is None:
                            continue
                        # Re-evaluate under the row lock: a request may have touched it meanwhile.
                        confirmed, reason = scheduled_status(current, now, self.policy)
                        if confirmed != new_status:
                            continue
                        tx.update(self._with_status(current, new_status, now))
                        tx.add_history(HistoryRecord(cell_id, now, SYSTEM_ACTOR, "status", {"lifecycle.status": [current.lifecycle.status, new_status], "reason": reason}))
                        counts[f"to_{new_status}"] += 1  # to_stale, to_active, to_archived
                        if reason == "expired":
                            counts["expired"] += 1
        return LifecycleRunResponse(**counts, ran_at=now)

    def purge(self, agent: str, ids: Optional[Sequence[str]] = None, as_of: Optional[datetime] = None) -> PurgeResponse:
        """Physically remove deleted cells past the retention window; refuse the rest."""
        now = self._clock_or(as_of)
        purged: list[str] = []
        refused: list[PurgeRefusal] = []
        if ids is None:
            ids = [c.id for c in self.store.iter_cells([Status.deleted.value])]
        for i in range(0, len(ids), 200):
            with self.store.write() as tx:
                for cell_id in ids[i : i + 200]:
                    cell = tx.get(cell_id)
                    if cell is None:
                        refused.append(PurgeRefusal(id=cell_id, reason="no such cell"))
                        continue
                    ok, why = purge_eligible(cell, now, self.policy)
                    if not ok:
                        refused.append(PurgeRefusal(id=cell_id, reason=why))
                        continue
                    tx.purge(cell_id)
                    tx.add_history(HistoryRecord(cell_id, now, agent, "purge", {}))
                    purged.append(cell_id)
        return PurgeResponse(purged=purged, refused=refused)

