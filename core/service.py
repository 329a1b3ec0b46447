"""The memory service: every protocol rule, over any store.

The HTTP routes and the in-process clients both call this class, so a rule (who may read,
which transitions are legal, what a PATCH merges) is written once. Methods take the caller's
agent id and raise `ampkit.errors` exceptions; they never see HTTP.

`MemoryService` is composed of parts, one module each: `service_base` (the checks every
path shares), `service_writes` (create, update, rollback, outcomes, delete),
`service_reads` (get, history, search, list, export, counts) and `service_upkeep`
(lifecycle, purge, the embedding queue). Each request is one store transaction; how the
store's writes run (one at a time, or grouped on a store with one writer) is the writes
runner's concern (`store.grouped_writes`), not the service's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Optional

from .consolidation import ConsolidationPolicy, Consolidator
from .dedup import DEFAULT_THRESHOLD
from .files.service import FileService
from .lifecycle import LifecyclePolicy
from .limits import Limits
from .models import (AMP_VERSION, MAX_CONSOLIDATE_EPISODES, MAX_METADATA_DEPTH, MAX_PATTERN_LENGTH, MAX_PATTERN_STARS,
                     ConsolidateRequest, ConsolidateResponse, utcnow)
from .retrieval import Retriever
from . import service_base
from .service_base import SYSTEM_ACTOR, cell_size_bytes, new_cell_id
from .service_reads import OwnerCounts, CellReads
from .service_upkeep import ServiceUpkeep
from .service_writes import CellWrites
from .store.base import Store
from .store.grouped_writes import Writes, writes_for

if TYPE_CHECKING:
    from .llm import ChatModel


@dataclass
class MemoryService(CellWrites, CellReads, ServiceUpkeep):
    store: Store
    policy: LifecyclePolicy = field(default_factory=LifecyclePolicy)
    limits: Limits = field(default_factory=Limits)
    retriever: Retriever = field(default_factory=Retriever)
    clock: Callable[[], datetime] = utcnow
    dedup_threshold: float = DEFAULT_THRESHOLD
    dedup_default: str = "exact"
    model: Optional["ChatModel"] = None  # consolidation's model; None = not configured
    consolidation: ConsolidationPolicy = field(default_factory=ConsolidationPolicy)
    # `as_of` on lifecycle runs and purges moves the clock for the whole store: it would purge
    # a cell deleted a second ago. Only test servers allow it (`--allow-clock-override`).
    allow_clock_override: bool = False
    # Read-your-writes for meaning (docs/retrieval.md): with a background embedder a search
    # first embeds up to this many of the caller's own queued cells that it would consider,
    # created in the last RECENT_WRITES_SECONDS, newest first. 0: never.
    search_embeds_pending: int = 16
    # How the creates' transactions run; None: the store's way (`grouped_writes.writes_for`:
    # grouped on a store with one writer, one at a time elsewhere).
    writes: Optional[Writes] = None

    def __post_init__(self) -> None:
        if self.writes is None:
            self.writes = writes_for(self.store, max(1, self.limits.max_batch_cells))

    @property
    def files(self) -> FileService:
        """The memory folder of each owner (docs/files.md), over the same store and clock."""
        return FileService(self.store, self.clock, self.limits, self.retriever, lambda: service_base.new_cell_id())

# ---------------------------------------------------------------- learning
    def consolidate(self, agent: str, req: ConsolidateRequest,
                    progress: Optional[Callable[[int], None]] = None) -> ConsolidateResponse:
        """Distil episodes into facts and playbooks (core/consolidation.py); 501 without a model."""
        return self.consolidator().run(agent, req, progress)

    def consolidator(self) -> Consolidator:
        return Consolidator(self, self.model, self.consolidation)


# Protocol extensions this implementation offers, advertised in GET /spec.
EXTENSIONS = [
    "history",
    "supersession",
    "batch_create",
    "search_explain",
    "search_abstention",
    "export",
    "lifecycle_as_of",
    "if_match_version",
    "list_cursor",
    "as_of_reads",
    "rollback",
    "restore",
    "ndjson_export",
    "cell_keys",
    "dedup_on_write",
    "playbook_outcomes",
    "consolidation",
    "pin",
]
# Advertised only by a server that accepts clock overrides (conformance cases that move the
# clock require it and are skipped elsewhere).
CLOCK_OVERRIDE_EXTENSION = "lifecycle_as_of"


def spec_document(service: MemoryService, auth: dict[str, Any], mcp: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The body of GET /spec (also what an in-process client's `spec()` returns); `mcp`
    describes the MCP endpoint when the server offers one."""
    limits = service.limits
    return {
        "amp_version": AMP_VERSION,
        "capabilities": {
            "max_cell_size_bytes": limits.max_cell_size_bytes,
            "max_request_bytes": limits.max_request_bytes,
            "max_search_limit": limits.max_search_limit,
            "max_page_size": limits.max_page_size,
            "max_batch_cells": limits.max_batch_cells,
            "max_metadata_depth": MAX_METADATA_DEPTH,
            "max_pattern_length": MAX_PATTERN_LENGTH,
            "max_pattern_stars": MAX_PATTERN_STARS,
            "clock_override": service.allow_clock_override,
            "storage_backends": [service.store.backend],
            "lifecycle_scheduler": {
                "interval_seconds": service.policy.interval_seconds,
                "manual_run_endpoint": "/amp/v1/admin/lifecycle/run",
            },
            "lifecycle": {
                "stale_threshold": service.policy.stale_threshold,
                "stale_archive_days": service.policy.stale_archive_days,
                "retention_days": service.policy.retention_days,
            },
            "auth": auth,
            "embedder": service.retriever.embedder.name if service.retriever.embedder else None,
            "consolidation": {
                "endpoint": "/amp/v1/memories/consolidate",
                "model": service.model.name if service.model else None,
                "dedup_default": service.dedup_default,
                "dedup_threshold": service.dedup_threshold,
                "confidence_floor": service.consolidation.confidence_floor,
                "max_episodes": MAX_CONSOLIDATE_EPISODES,
                "background_interval_seconds": service.consolidation.interval_seconds if service.model else 0,
            },
            "mcp_compatible": mcp is not None,
            **({"mcp": mcp} if mcp is not None else {}),
            "extensions": [e for e in EXTENSIONS
                           if e != CLOCK_OVERRIDE_EXTENSION or service.allow_clock_override],
        },
    }


__all__ = [
    "EXTENSIONS", "MemoryService", "Limits", "OwnerCounts", "SYSTEM_ACTOR", "cell_size_bytes", "new_cell_id",
    "spec_document",
]
