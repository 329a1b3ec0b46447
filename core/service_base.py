"""The memory service's common part: what every other part of it uses.

`MemoryService` (core/service.py) is composed of parts, each a class of methods over the same
fields: this one (the checks every path calls: page limits, the clock override, the size
limit, the read and write rules, the rule that files change through the files API), then
writes (`service_writes`), reads (`service_reads`) and upkeep (`service_upkeep`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Callable, Optional, Sequence

from ulid import ULID

from .access import can_read, can_write
from .errors import (
    Conflict,
    FileManaged,
    Forbidden,
    ValidationFailed,
    access_denied,
)
from .lifecycle import (
    LifecyclePolicy,
)
from .limits import Limits
from .models import (  # noqa: F401 - cell_size_bytes re-exported (ampkit.service)
    MemoryCell,
    Status,
    cell_size_bytes,
    check_cell_size,
)
from .retrieval import Retriever
from .store.grouped_writes import Writes
from .store.base import Store

SYSTEM_ACTOR = "system:lifecycle"


def new_cell_id() -> str:
    return f"mem_{ULID()}"


class ServiceBase:
    """The fields every part of the service reads (declared on `MemoryService`) and the
    checks they share."""

    store: Store
    policy: LifecyclePolicy
    limits: Limits
    retriever: Retriever
    clock: Callable[[], datetime]
    dedup_threshold: float
    dedup_default: str
    allow_clock_override: bool
    search_embeds_pending: int
    writes: Optional[Writes]  # how the creates' transactions run (`store.grouped_writes`)

    def _page_limit(self, limit: Optional[int]) -> int:
        limit = self.limits.default_page_size if limit is None else limit
        if not 1 <= limit <= self.limits.max_page_size:
            raise ValidationFailed(f"limit must be between 1 and {self.limits.max_page_size}", {"limit": limit})
        return limit

    def _clock_or(self, as_of: Optional[datetime]) -> datetime:
        if as_of is None:
            return self.clock()
        if not self.allow_clock_override:
            raise Forbidden(
                "as_of (a clock override) is refused: it would break the retention promise; "
                "only a test server started with --allow-clock-override accepts it",
                {"clock_override": False},
            )
        return as_of

    def _check_size(self, cell: MemoryCell, measured: bool = True) -> None:
        check_cell_size(cell, self.limits, measured)

    @staticmethod
    def _check_version(cell: MemoryCell, expected_version: Optional[int]) -> None:
        """`If-Match`: 409 unless the cell is at the version the caller read (None: any)."""
        if expected_version is not None and expected_version != cell.lifecycle.version:
            raise Conflict(f"cell is at version {cell.lifecycle.version}, not {expected_version}",
                           {"current_version": cell.lifecycle.version})

    def _readable(self, cell: Optional[MemoryCell], agent: str) -> MemoryCell:
        if cell is None or not can_read(cell, agent):
            raise access_denied()
        return cell

    def _writable(self, cell: Optional[MemoryCell], agent: str) -> MemoryCell:
        # Missing, deleted and forbidden answer the same body: no oracle.
        if cell is None or not can_write(cell, agent):
            raise access_denied()
        return cell


    @staticmethod
    def _not_a_file(cell: MemoryCell, what: str) -> None:
        """The rule: a cell that is a memory file changes only through the files operations,
        where validation and approval apply (docs/files.md). Every change to an existing cell
        outside `files` (PATCH, rollback, delete, outcome, supersede) calls this after the
        write check and before it changes anything."""
        if cell.identity.path is not None:
            # The path is not named: a writer-only caller may not read the cell.
            raise FileManaged(f"this cell is a memory file: {what} it through the files API "
                              "(/files/write, /files/edit, /files/delete), which validates and asks for approval",
                              {"files_api": "/amp/v1/files"})


    def _with_status(self, cell: MemoryCell, status: str, now: datetime) -> MemoryCell:
        lifecycle = cell.lifecycle.model_copy(
            update={"status": status, "last_updated_at": now, "version": cell.lifecycle.version + 1}
        )
        return cell.model_copy(update={"lifecycle": lifecycle})


    def _statuses(self, status: Optional[Sequence[str]], include_stale: bool) -> list[str]:
        wanted = list(status) if status else [Status.active.value]
        if include_stale and Status.stale.value not in wanted:
            wanted.append(Status.stale.value)
        # A deleted cell is never returned, whatever the filter asks for.
        return [s for s in dict.fromkeys(wanted) if s != Status.deleted.value]

    def _store_vectors(self, queued: Sequence[tuple[str, str]]) -> None:
        """Embed queued (cell id, text) pairs outside any transaction and store each vector,
        unless the cell's text changed meanwhile (it stays queued for its new text)."""
        vectors = self.retriever.embed_now([text for _, text in queued])
        with self.store.write() as tx:
            for (cell_id, text), vector in zip(queued, vectors):
                current = tx.get(cell_id)
                if current is not None and current.content.text == text:
                    tx.set_vector(cell_id, vector)

