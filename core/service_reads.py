"""The memory service's reads: get (current or as of a time), history, search, list, export,
the owners' and metadata values' counts, and read-your-writes for meaning."""

from __future__ import annotations

import builtins
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Callable, Optional, Sequence

from pydantic import TypeAdapter, ValidationError
from ulid import ULID

from .access import can_read
from .errors import (
    Unavailable,
    ValidationFailed,
    access_denied,
)
from . import versions
from .lifecycle import (
    decay_score,
    scheduled_status,
)
from .models import (
    IdString,
    HistoryEntry,
    MemoryCell,
    MemoryType,
    MetadataValue,
    MetadataValuesResponse,
    SearchHit,
    SearchRequest,
    SearchResponse,
    Status,
    as_utc,
    check_json_value,
    is_cell_id,
    storable_text,
)
from .playbooks import playbook_score
from .retrieval import ScoredCell, clears, tie_broken
from .service_base import ServiceBase
from .store.base import CellFilter, HistoryRecord, decode_cursor, decode_text_cursor, encode_cursor

@dataclass
class OwnerCounts:
    """One row of `MemoryService.owners`: an owner's readable cells, counted."""

    owner_id: str
    total: int = 0
    by_type: dict[str, int] = field(default_factory=dict)
    by_status: dict[str, int] = field(default_factory=dict)


# How far back a search embeds its caller's queued writes: a write's own burst, not a backlog
# (a model change re-queues every cell; the worker embeds those).
RECENT_WRITES_SECONDS = 60.0


def first_id_since(seconds_ago: float) -> str:
    """The smallest cell id a cell created since `seconds_ago` (wall clock: ids carry it) has."""
    return f"mem_{str(ULID.from_timestamp(time.time() - seconds_ago))[:10]}{'0' * 16}"


def searched(cell: MemoryCell, req: SearchRequest) -> bool:
    """Whether a search considers `cell` beyond its filter: memory files (cells with a path,
    docs/files.md) have the files API and the instructions path, and join an ordinary search
    only with `include_files`."""
    return req.include_files or cell.identity.path is None


def with_pinned(pinned: Sequence[MemoryCell], hits: Sequence[ScoredCell], limit: int) -> list[ScoredCell]:
    """The first `limit` results of a search: the owner's pinned cells first (the best-scored
    first; one outside the ranked hits scores 0), then the other hits in rank order. `pinned`
    and `hits` hold only cells the caller may read."""
    ranked = {hit.cell.id: hit for hit in hits}
    top = [ScoredCell(ranked[c.id].cell, ranked[c.id].score, {**ranked[c.id].explain, "pinned": 1.0})
           if c.id in ranked else ScoredCell(c, 0.0, {"pinned": 1.0}) for c in pinned]
    top.sort(key=lambda h: (-h.score, h.cell.id))
    ids = {c.id for c in pinned}
    return (top + [hit for hit in hits if hit.cell.id not in ids])[:limit]


_ID_PARAM: TypeAdapter[str] = TypeAdapter(IdString)


def storable_or_none(value: str) -> Optional[str]:
    """`value` when it can be echoed in an error's details (as JSON), else None."""
    try:
        return storable_text(value)
    except ValueError:
        return None


def owner_counts_page(store: Any, flt: CellFilter, limit: int,
                      after: Optional[str]) -> tuple[list[OwnerCounts], Optional[str]]:
    """A page of owners after `after` with their cells' counts by type and status, counted
    in the store (one GROUP BY over the cells `flt` admits), and the next page's cursor."""
    page: dict[str, OwnerCounts] = {}
    for row in store.facets(flt, limit + 1, after):
        counts = page.setdefault(row.owner_id, OwnerCounts(row.owner_id))
        counts.total += row.count
        counts.by_type[row.type] = counts.by_type.get(row.type, 0) + row.count
        counts.by_status[row.status] = counts.by_status.get(row.status, 0) + row.count
    owners = list(page.values())
    next_cursor = encode_cursor(owners[limit - 1].owner_id) if len(owners) > limit else None
    return owners[:limit], next_cursor


def cell_cursor(cursor: Optional[str]) -> Optional[str]:
    """The cell id a list page's `cursor` resumes after (None: the first page); 422 for
    anything that is not a cursor this server made."""
    if not cursor:
        return None
    try:
        after = decode_cursor(cursor)
    except ValueError:
        after = None
    if after is None or not is_cell_id(after):
        raise ValidationFailed("invalid cursor", {"cursor": storable_or_none(cursor)})
    return after


def text_cursor(cursor: Optional[str], check: Callable[[str], Any]) -> Optional[str]:
    """Where a page keyed by text (owner ids, metadata values) starts; `check` refuses a
    decoded value that could not be a key."""
    if not cursor:
        return None
    try:
        after = decode_text_cursor(cursor)
        check(after)
    except (ValueError, ValidationFailed):
        raise ValidationFailed("invalid cursor", {"cursor": storable_or_none(cursor)}) from None
    return after


def _check_params(*, metadata: Optional[dict[str, Any]] = None, **ids: Optional[str]) -> None:
    """List and export parameters, checked like the same fields of a search body (HTTP query
    strings and in-process calls both come through here)."""
    for name, value in ids.items():
        if value is None:
            continue
        try:
            _ID_PARAM.validate_python(value)
        except ValidationError as exc:
            raise ValidationFailed(f"{name}: {exc.errors()[0]['msg']}", {"param": name}) from None
    if metadata is not None:
        try:
            check_json_value(metadata)
        except ValueError as exc:
            raise ValidationFailed(f"metadata: {exc}", {"param": "metadata"}) from None



class CellReads(ServiceBase):
    """The part of `MemoryService` that reads cells."""

    def get(self, agent: str, cell_id: str, as_of: Optional[datetime] = None) -> MemoryCell:
        """Read a cell; counts the access and restarts its decay clock. With `as_of`, the cell
        as it was then (an as-of read: rebuilt from history, counts nothing, see `versions`).

        When the store cannot write (disk full or read-only) the read is still answered,
        uncounted: losing one access count is better than refusing every read."""
        if as_of is not None:
            return self.get_as_of(agent, cell_id, as_of)
        now = self.clock()
        try:
            with self.store.write() as tx:
                cell = self._readable(tx.get(cell_id), agent)
                scoring = cell.scoring.model_copy(update={"access_count": cell.scoring.access_count + 1})
                lifecycle = cell.lifecycle.model_copy(update={"last_accessed_at": now})
                touched = cell.model_copy(update={"scoring": scoring, "lifecycle": lifecycle})
                new_status, reason = scheduled_status(touched, now, self.policy)
                if new_status == Status.active.value:  # a read revives a stale cell
                    touched = self._with_status(touched, new_status, now)
                    tx.add_history(HistoryRecord(cell_id, now, agent, "status", {"lifecycle.status": [cell.lifecycle.status, new_status], "reason": reason}))
                tx.update(touched)
        except Unavailable:
            return self._readable(self.store.get(cell_id), agent)
        return touched

    def get_as_of(self, agent: str, cell_id: str, as_of: datetime) -> MemoryCell:
        """The cell as it was at `as_of`, readable under its policy then AND now. A cell that
        did not exist yet, was deleted then or since, or was purged: the usual ACCESS_DENIED."""
        current = self.store.get(cell_id)
        if current is None or not can_read(current, agent):
            raise access_denied()
        then = versions.cell_as_of(current, self.store.history(cell_id), as_utc(as_of))
        if then is None or not versions.readable_as_of(then, current, agent):
            raise access_denied()
        return then


    def history(self, agent: str, cell_id: str) -> list[HistoryEntry]:
        """The cell's history, `seq` numbered from 1 within the cell: the store's sequence
        runs across all cells, so its gaps would count writes to cells the caller cannot read.
        The changes of versions the caller could not read at their time are left out, by the
        as-of read rule (`versions.readable_history`)."""
        current = self._readable(self.store.get(cell_id), agent)
        entries = versions.readable_history(current, self.store.history(cell_id), agent)
        return [entry.model_copy(update={"seq": n}) for n, entry in enumerate(entries, start=1)]


    def _embed_own_pending(self, agent: str, flt: CellFilter) -> None:
        """Read-your-writes for meaning: the caller's own recent writes that this search would
        consider and that still wait in the embedding queue get their vectors now, so the
        dense leg ranks them as it will once the worker has been by. Only cells the filter
        admits (readable by the caller) and that the caller wrote: the search never waits on,
        nor embeds, anyone else's cells. The worker takes the queue oldest first, this the
        newest first."""
        if self.search_embeds_pending <= 0 or not self.retriever.background or self.retriever.embedder is None:
            return
        pending = self.store.pending_embeddings(flt, agent, first_id_since(RECENT_WRITES_SECONDS),
                                                self.search_embeds_pending)
        if pending:
            self._store_vectors(pending)


    def search(self, agent: str, req: SearchRequest) -> SearchResponse:
        if req.as_of is not None:
            return self._search_as_of(agent, req)
        now = self.clock()
        flt = CellFilter(
            reader=agent,
            owner_id=req.owner_id,
            types=req.types,
            statuses=self._statuses(req.status, req.include_stale),
            include_superseded=req.include_superseded,
            session_id=req.session_id,
            metadata=req.metadata,
            not_expired_at=now,
        )
        self._embed_own_pending(agent, flt)
        # The owner's pinned cells come first whatever the query and `min_score` (a person
        # asked for them), among those the caller may read and the search's filters admit.
        pinned = [c for c in self.store.list(replace(flt, owner_id=req.owner_id or agent, pinned_only=True), req.limit)
                  if can_read(c, agent) and searched(c, req)]
        fetch = min(self.limits.max_search_limit, req.limit * 4) if req.rank_playbooks else req.limit
        hits, total = self.retriever.search(
            self.store, req.query, flt, fetch + len(pinned), now,
            keep=lambda c: can_read(c, agent) and searched(c, req),
            min_score=0.0 if req.rank_playbooks else req.min_score,
        )
        if req.rank_playbooks:
            for hit in hits:
                hit.score, wilson = playbook_score(hit.cell, hit.score)
                if hit.cell.type == MemoryType.procedural.value:
                    hit.explain = {**hit.explain, "wilson": wilson, "score": hit.score}
            # min_score applies to the final (re-scored) score; the total counts the re-scored.
            hits = sorted((h for h in hits if clears(h.score, req.min_score)), key=lambda h: (-h.score, h.cell.id))
            total = len(hits)
        hits = with_pinned(pinned, hits, req.limit)
        results = [
            SearchHit(**h.cell.model_dump(), score=round(h.score, 6), explain=h.explain if req.explain else None)
            for h in hits
        ]
        return SearchResponse(results=results, total=total, query=req.query)

    def _search_as_of(self, agent: str, req: SearchRequest) -> SearchResponse:  # req.as_of is set
        """Keyword (BM25) ranking over the cells as they were at `req.as_of` that the caller
        may read: the stored indexes and vectors describe the present, so the past is ranked
        from its own texts, scored by the keyword relevance model, decay breaking near ties."""
        assert req.as_of is not None
        at = as_utc(req.as_of)
        cells = versions.iter_as_of(
            self.store, agent, at, owner_id=req.owner_id, types=req.types,
            statuses=self._statuses(req.status, req.include_stale), include_superseded=req.include_superseded,
            session_id=req.session_id, metadata=req.metadata,
        )
        readable = [c for c in cells if searched(c, req)]
        owner = req.owner_id or agent
        pinned = [c for c in readable if c.lifecycle.pinned and c.identity.owner_id == owner][: req.limit]
        scored = versions.bm25_scores(req.query, readable)
        relevance = self.retriever.keyword_relevance(req.query, scored)
        hits = []
        for (cell, _), parts in zip(scored, relevance):
            decay = decay_score(cell, at)
            score = tie_broken(parts["relevance"], decay, self.retriever.config.decay_weight)
            if clears(score, req.min_score):
                hits.append((cell, score, {**parts, "decay": decay, "score": score}))
        hits.sort(key=lambda h: (-h[1], h[0].id))
        ranked = with_pinned(pinned, [ScoredCell(cell, score, parts) for cell, score, parts in hits], req.limit)
        results = [
            SearchHit(**h.cell.model_dump(), score=round(h.score, 6), explain=h.explain if req.explain else None)
            for h in ranked
        ]
        return SearchResponse(results=results, total=len(hits), query=req.query)

    def list(
        self,
        agent: str,
        *,
        owner_id: Optional[str] = None,
        types: Optional[Sequence[str]] = None,
        status: Optional[Sequence[str]] = None,
        include_stale: bool = False,
        include_superseded: bool = False,
        session_id: Optional[str] = None,
        metadata: Optional[dict[str, Any]] = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
        as_of: Optional[datetime] = None,
    ) -> tuple[list[MemoryCell], int, Optional[str]]:
        limit = self._page_limit(limit)
        _check_params(owner_id=owner_id, session_id=session_id, metadata=metadata)
        after = cell_cursor(cursor)
        if as_of is not None:
            matching = versions.iter_as_of(
                self.store, agent, as_utc(as_of), owner_id=owner_id, types=types,
                statuses=self._statuses(status, include_stale), include_superseded=include_superseded,
                session_id=session_id, metadata=metadata,
            )
            total, page = 0, []  # type: tuple[int, list[MemoryCell]]
            for cell in matching:  # the total needs the whole set, so one pass gives both
                total += 1
                if (after is None or cell.id > after) and len(page) <= limit:
                    page.append(cell)
            next_cursor = encode_cursor(page[limit - 1].id) if len(page) > limit else None
            return page[:limit], total, next_cursor
        flt = CellFilter(
            reader=agent,
            owner_id=owner_id,
            types=types,
            statuses=self._statuses(status, include_stale),
            include_superseded=include_superseded,
            session_id=session_id,
            metadata=metadata,
            not_expired_at=self.clock(),
        )
        page = [c for c in self.store.list(flt, limit + 1, after) if can_read(c, agent)]
        next_cursor = encode_cursor(page[limit - 1].id) if len(page) > limit else None
        return page[:limit], self.store.count(flt), next_cursor

    def export(self, agent: str, owner_id: Optional[str] = None) -> builtins.list[MemoryCell]:
        """Every cell the caller may read (any status but deleted), for portability."""
        _check_params(owner_id=owner_id)
        statuses = [Status.active.value, Status.stale.value, Status.archived.value]
        flt = CellFilter(reader=agent, owner_id=owner_id, statuses=statuses, include_superseded=True)
        return [c for c in self.store.scan(flt) if can_read(c, agent)]

    def owners(
        self, agent: str, *, types: Optional[Sequence[str]] = None, status: Optional[Sequence[str]] = None,
        limit: Optional[int] = None, cursor: Optional[str] = None,
    ) -> tuple[builtins.list[OwnerCounts], Optional[str]]:
        """A page of the owners whose cells the caller may read, each with its counts by type
        and status (the cells `list` would show, superseded ones left out). Counted in the
        store (one GROUP BY over the readable cells): no cell is loaded."""
        limit = self._page_limit(limit)
        after = text_cursor(cursor, lambda owner: _check_params(cursor=owner))
        wanted = status or [Status.active.value, Status.stale.value, Status.archived.value]
        flt = CellFilter(reader=agent, types=types, statuses=self._statuses(wanted, False),
                         not_expired_at=self.clock())
        return owner_counts_page(self.store, flt, limit, after)

    def metadata_values(
        self, agent: str, key: str, *, owner_id: Optional[str] = None, types: Optional[Sequence[str]] = None,
        status: Optional[Sequence[str]] = None, include_stale: bool = False, session_id: Optional[str] = None,
        metadata: Optional[dict[str, Any]] = None, limit: Optional[int] = None, cursor: Optional[str] = None,
    ) -> MetadataValuesResponse:
        """The distinct string values of `content.metadata[key]` among the cells the caller
        may read that `list` with these filters would show (superseded ones left out), each
        with its count; grouped in the store, so no cell is loaded (the LangGraph adapter
        lists namespaces with it)."""
        limit = self._page_limit(limit)
        if not key or len(key) > 256:
            raise ValidationFailed("key: a metadata key of 1 to 256 characters", {"param": "key"})
        _check_params(owner_id=owner_id, session_id=session_id, metadata=metadata)
        try:
            check_json_value({key: None})
        except ValueError as exc:
            raise ValidationFailed(f"key: {exc}", {"param": "key"}) from None
        after = text_cursor(cursor, check_json_value)
        flt = CellFilter(reader=agent, owner_id=owner_id, types=types, statuses=self._statuses(status, include_stale),
                         session_id=session_id, metadata=metadata, not_expired_at=self.clock())
        rows = self.store.metadata_values(flt, key, limit + 1, after)
        next_cursor = None
        if len(rows) > limit:
            next_cursor = encode_cursor(rows[limit - 1][0])
        return MetadataValuesResponse(key=key, results=[MetadataValue(value=v, count=n) for v, n in rows[:limit]],
                                      next_cursor=next_cursor)

    def peek(self, agent: str, cell_id: str) -> MemoryCell:
        """Read a cell under the read rule without counting a use: a person inspecting a
        memory is not the agent using it, so its decay clock and access count stay put."""
        return self._readable(self.store.get(cell_id), agent)
