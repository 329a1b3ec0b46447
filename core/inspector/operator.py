"""The operator view: what a signed-in key with the `admin` scope reads in the inspector.

An admin key may export the whole store (`GET /admin/export`), so the inspector lets it read
every owner's cells too, and no more than the export shows: every cell but deleted ones,
without counting a use. The read rule for everyone else stays `access.can_read` through the
service; only these reads skip it, and every page says the session acts as an administrator.
Writes always go through the service under the write rule, whoever is signed in.
"""

from __future__ import annotations

import builtins
from typing import Any, Optional, Sequence

from ..errors import access_denied
from ..models import HistoryEntry, MemoryCell, Status
from ..service import MemoryService, OwnerCounts
from ..service_reads import cell_cursor, owner_counts_page, text_cursor
from ..store.base import CellFilter, encode_cursor

LIVE = (Status.active.value, Status.stale.value, Status.archived.value)


def _statuses(status: Optional[Sequence[str]]) -> list[str]:
    return [s for s in dict.fromkeys(status or [Status.active.value]) if s != Status.deleted.value]


class OperatorReads:
    """The service's page reads (owners, list, peek, history) with no reader filter."""

    def __init__(self, service: MemoryService):
        self.service = service
        self.store = service.store

    def owners(self, *, limit: int, cursor: Optional[str]) -> "tuple[builtins.list[OwnerCounts], Optional[str]]":
        after = text_cursor(cursor, lambda owner: None)
        flt = CellFilter(reader=None, statuses=list(LIVE), not_expired_at=self.service.clock())
        return owner_counts_page(self.store, flt, limit, after)

    def list(self, *, limit: int, cursor: Optional[str],
             **filters: Any) -> "tuple[builtins.list[MemoryCell], int, Optional[str]]":
        after = cell_cursor(cursor)
        flt = CellFilter(reader=None, owner_id=filters.get("owner_id"), types=filters.get("types"),
                         statuses=_statuses(filters.get("status")), session_id=filters.get("session_id"),
                         metadata=filters.get("metadata"), include_superseded=bool(filters.get("include_superseded")),
                         not_expired_at=self.service.clock())
        page = builtins.list(self.store.list(flt, limit + 1, after))
        next_cursor = encode_cursor(page[limit - 1].id) if len(page) > limit else None
        return page[:limit], self.store.count(flt), next_cursor

    def peek(self, cell_id: str) -> MemoryCell:
        cell = self.store.get(cell_id)
        if cell is None or cell.lifecycle.status == Status.deleted.value:
            raise access_denied()
        return cell

    def history(self, cell_id: str) -> "builtins.list[HistoryEntry]":
        self.peek(cell_id)
        return [entry.model_copy(update={"seq": n}) for n, entry in enumerate(self.store.history(cell_id), start=1)]
