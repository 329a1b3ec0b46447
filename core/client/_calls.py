"""The request/response core shared by every client (no I/O here).

Each wire operation is built as a `Call`: a row of the operations table (`ampkit.operations`:
method, path, whether it is safe to resend), the inputs (path parameters, query, JSON body,
headers) and how to decode the answer into the models of `ampkit.models`. The HTTP transports
send a Call over httpx; the in-process transports run the same row on `MemoryService`. Both
decode with `call.decode`, so a result or an error looks the same whichever way it travelled.

Flat keyword names (`importance=0.9`, `readable_by=[...]`) are mapped here into the nested
cell body (`{"scoring": {"importance": 0.9}}`), once for every client.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Callable, Generator, Generic, Iterable, Mapping, Optional, TypeVar, Union

from pydantic import BaseModel, ConfigDict
from pydantic_core import to_jsonable_python

from ..errors import ValidationFailed, access_denied
from ..operations import BY_NAME, Operation
from ..models import (
    BatchCreateResponse,
    CellCreate,
    ConsolidateResponse,
    Health,
    HistoryEntry,
    HistoryResponse,
    LifecycleRunResponse,
    ListResponse,
    MemoryCell,
    MemoryType,
    MetadataValuesResponse,
    STORED,
    PurgeResponse,
    SearchResponse,
    Status,
)

T = TypeVar("T")

# Flat keyword -> the section of the cell body it lives in. `None`: top level of the body.
CELL_FIELDS: dict[str, Optional[str]] = {
    "text": "content",
    "metadata": "content",
    "owner_id": "identity",
    "owner_type": "identity",
    "session_id": "identity",
    "key": "identity",
    "importance": "scoring",
    "confidence": "scoring",
    "decay_rate": "scoring",
    "readable_by": "access_policy",
    "writable_by": "access_policy",
    "public": "access_policy",
    "source_type": "provenance",
    "source_ref": "provenance",
    "extraction_method": "provenance",
    "expires_at": "lifecycle",
    "status": "lifecycle",
    "type": None,
    "supersedes": None,
    "dedup": None,  # create only: off | exact | skip | merge (docs/consolidation.md)
}


class SearchResult(BaseModel):
    """One search hit: the cell, its relevance score, and (when asked) the score breakdown."""

    model_config = ConfigDict(frozen=True)

    cell: MemoryCell
    score: float
    explain: Optional[dict[str, float]] = None


@dataclass(frozen=True)
class Call(Generic[T]):
    """One wire operation, described before it is sent."""

    operation: Operation
    decode: Callable[[Any], T]
    body: Any = None  # JSON-ready
    query: dict[str, Any] = field(default_factory=dict)  # wire names, Python values
    headers: dict[str, str] = field(default_factory=dict)
    path_params: dict[str, str] = field(default_factory=dict)
    resend: Optional[bool] = None  # overrides the operation's idempotence for this call
    timeout: Optional[float] = None  # seconds to read the answer, when the client's default is too short

    @property
    def method(self) -> str:
        return self.operation.method

    @property
    def path(self) -> str:
        """Relative to the base URL (which ends in /amp/v1)."""
        return self.operation.url(self.path_params)

    @property
    def idempotent(self) -> bool:
        """Safe to resend after a connection error or a 503."""
        return self.operation.idempotent if self.resend is None else self.resend

    @property
    def needs_agent(self) -> bool:
        return self.operation.scope is not None


def with_decode(call: Call[Any], decode: Callable[[Any], T]) -> Call[T]:
    """The same call, decoding its answer another way (e.g. the whole SearchResponse)."""
    return replace(call, decode=decode)


def call(name: str, decode: Callable[[Any], T], **inputs: Any) -> Call[T]:
    """The Call for the operation named `name` in the operations table."""
    return Call(BY_NAME[name], decode, **inputs)


def nest(fields: Mapping[str, Any], *, allowed: Iterable[str] = CELL_FIELDS) -> dict[str, Any]:
    """`{"importance": 0.9, "text": "x"}` -> `{"scoring": {"importance": 0.9}, "content": {"text": "x"}}`."""
    allowed = set(allowed)
    body: dict[str, Any] = {}
    for name, value in fields.items():
        if name not in allowed:
            raise TypeError(f"unknown cell field {name!r}; known: {sorted(allowed)}")
        section = CELL_FIELDS[name]
        if section is None:
            body[name] = value
        else:
            body.setdefault(section, {})[name] = value
    return to_jsonable_python(body)


def _cell(cell_id: str) -> dict[str, str]:
    if not isinstance(cell_id, str) or not cell_id.strip():
        raise access_denied()  # no such cell; the same answer the server gives for any unknown id
    return {"memory_id": cell_id}


def _decode_cell(body: Any) -> MemoryCell:
    return MemoryCell.model_validate(body, context=STORED)


def _decode_search(body: Any) -> list[SearchResult]:
    response = SearchResponse.model_validate(body, context=STORED)
    return [
        SearchResult(cell=MemoryCell.model_validate(hit.model_dump(exclude={"score", "explain"}), context=STORED),
                     score=hit.score, explain=hit.explain)
        for hit in response.results
    ]


def _decode_nothing(body: Any) -> None:
    return None


def _check_values(values: Optional[Iterable[Any]], enum: type[Any]) -> Optional[list[str]]:
    """List filters travel as query strings; refuse unknown values before they leave."""
    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    out = [getattr(v, "value", v) for v in values]
    allowed = [e.value for e in enum]
    bad = [v for v in out if v not in allowed]
    if bad:
        raise ValidationFailed(f"unknown value(s) {bad}; allowed: {allowed}", {"invalid": bad})
    return out or None


# ---------------------------------------------------------------- the wire operations


def create_body(text: str, owner_id: str, type: Union[str, MemoryType] = MemoryType.semantic, **cell_fields: Any) -> dict[str, Any]:
    return nest({"text": text, "owner_id": owner_id, "type": type, **cell_fields},
                allowed=set(CELL_FIELDS) - {"status"})


def remember(text: str, *, owner_id: str, type: Union[str, MemoryType] = MemoryType.semantic, **cell_fields: Any) -> Call[MemoryCell]:
    """The new cell. With an API key that lacks the `read` scope the server answers 204 and
    this decodes to None (the cell is stored; a write-only key never receives a cell)."""
    return call("create_memory", _decode_optional_cell,  # type: ignore[arg-type]
                body=create_body(text, owner_id, type, **cell_fields))


def remember_many(items: Iterable[Union[Mapping[str, Any], CellCreate]]) -> Call[list[MemoryCell]]:
    cells = [
        item.model_dump(mode="json", exclude_unset=True) if isinstance(item, CellCreate) else create_body(**item)
        for item in items
    ]
    # A key without the read scope gets 204: the cells are stored, none is returned.
    return call("create_memories", lambda body: [] if body is None else BatchCreateResponse.model_validate(body, context=STORED).results,
                body={"cells": cells})


def _as_of_query(as_of: Optional[datetime]) -> dict[str, Any]:
    """An as-of read travels as `?as_of=<RFC 3339>`; a naive datetime means UTC."""
    return {} if as_of is None else {"as_of": to_jsonable_python(as_of)}


def get(cell_id: str, as_of: Optional[datetime] = None) -> Call[MemoryCell]:
    """With `as_of`: the cell as it was then (an as-of read; counts no access)."""
    return call("get_memory", _decode_cell, path_params=_cell(cell_id), query=_as_of_query(as_of))


def rollback(cell_id: str, to_version: int, *, expected_version: Optional[int] = None) -> Call[Optional[MemoryCell]]:
    """Restore version `to_version` as a new version; conditional (and resendable) with `expected_version`."""
    headers = {} if expected_version is None else {"If-Match": str(expected_version)}
    return call("rollback_memory", _decode_optional_cell, body={"to_version": to_version}, headers=headers,
                path_params=_cell(cell_id), resend=expected_version is not None)


def restore(cell_id: str, *, expected_version: Optional[int] = None) -> Call[Optional[MemoryCell]]:
    """An archived cell back to active; conditional (and resendable) with `expected_version`."""
    headers = {} if expected_version is None else {"If-Match": str(expected_version)}
    return call("restore_memory", _decode_optional_cell, headers=headers, path_params=_cell(cell_id),
                resend=expected_version is not None)


def _decode_optional_cell(body: Any) -> Optional[MemoryCell]:
    return None if body is None else MemoryCell.model_validate(body, context=STORED)


def update(cell_id: str, *, expected_version: Optional[int] = None, **changes: Any) -> Call[Optional[MemoryCell]]:
    """PATCH; with `expected_version` it is conditional (If-Match) and therefore safe to resend.
    Decodes to None when the caller may write but not read the cell (the server answers 204)."""
    headers = {} if expected_version is None else {"If-Match": str(expected_version)}
    body = nest(changes, allowed=set(CELL_FIELDS) - {"type", "supersedes", "dedup"})
    return call("patch_memory", _decode_optional_cell, body=body, headers=headers, path_params=_cell(cell_id),
                resend=expected_version is not None)


def record_outcome(cell_id: str, success: bool, note: Optional[str] = None) -> Call[Optional[MemoryCell]]:
    body: dict[str, Any] = {"success": success}
    if note is not None:
        body["note"] = note
    return call("record_outcome", _decode_optional_cell, body=body, path_params=_cell(cell_id))


def pin(cell_id: str) -> Call[Optional[MemoryCell]]:
    """Decodes to None when the caller may write but not read the cell (the server answers 204)."""
    return call("pin_memory", _decode_optional_cell, path_params=_cell(cell_id))


def unpin(cell_id: str) -> Call[Optional[MemoryCell]]:
    return call("unpin_memory", _decode_optional_cell, path_params=_cell(cell_id))


CONSOLIDATE_TIMEOUT = 300.0
"""Seconds a consolidation call may take over HTTP: it waits for the model."""


def consolidate(owner_id: str, *, session_id: Optional[str] = None, episode_ids: Optional[Iterable[str]] = None,
                since: Optional[datetime] = None, until: Optional[datetime] = None, playbooks: str = "propose",
                dry_run: bool = False, files: str = "off") -> Call[ConsolidateResponse]:
    body: dict[str, Any] = {"owner_id": owner_id, "session_id": session_id, "since": since, "until": until,
                            "episode_ids": None if episode_ids is None else list(episode_ids)}
    body = {k: v for k, v in body.items() if v is not None}
    body.update(playbooks=playbooks, dry_run=dry_run, files=files)
    # Not resent: a run that timed out may still be writing (re-running it would change nothing, but wait for it).
    return call("consolidate", ConsolidateResponse.model_validate, body=to_jsonable_python(body),
                timeout=CONSOLIDATE_TIMEOUT)


def delete(cell_id: str) -> Call[None]:
    return call("delete_memory", _decode_nothing, path_params=_cell(cell_id))


def search(query: str, *, owner_id: Optional[str] = None, types: Optional[Iterable[str]] = None,
           limit: int = 10, min_score: Optional[float] = None, include_files: bool = False,
           **filters: Any) -> Call[list[SearchResult]]:
    """`min_score`: only hits scoring at least this (none when nothing does); `include_files`:
    memory files too. Filters: status, include_stale, include_superseded, session_id,
    metadata, explain, as_of (an as-of read: the cells as they were then)."""
    body: dict[str, Any] = {"query": query, "limit": limit, **filters}
    if min_score is not None:
        body["min_score"] = min_score
    if include_files:
        body["include_files"] = True
    if owner_id is not None:
        body["owner_id"] = owner_id
    if types is not None:
        body["types"] = [types] if isinstance(types, str) else list(types)
    return call("search_memories", _decode_search, body=to_jsonable_python(body))


def list_page(*, owner_id: Optional[str] = None, types: Optional[Iterable[str]] = None,
              status: Optional[Iterable[str]] = None, session_id: Optional[str] = None,
              include_stale: bool = False, include_superseded: bool = False,
              metadata: Optional[dict[str, Any]] = None, page_size: Optional[int] = None,
              cursor: Optional[str] = None, as_of: Optional[datetime] = None) -> Call[ListResponse]:
    query = {
        "owner_id": owner_id,
        "type": _check_values(types, MemoryType),
        "status": _check_values(status, Status),
        "session_id": session_id,
        "include_stale": include_stale or None,
        "include_superseded": include_superseded or None,
        "metadata": metadata,
        "limit": page_size,
        "cursor": cursor,
        **_as_of_query(as_of),
    }
    return call("list_route", lambda body: ListResponse.model_validate(body, context=STORED), query={k: v for k, v in query.items() if v is not None})


def metadata_values(key: str, *, owner_id: Optional[str] = None, types: Optional[Iterable[str]] = None,
                    status: Optional[Iterable[str]] = None, session_id: Optional[str] = None,
                    include_stale: bool = False, metadata: Optional[dict[str, Any]] = None,
                    page_size: Optional[int] = None, cursor: Optional[str] = None) -> Call[MetadataValuesResponse]:
    """One page of the distinct values of `content.metadata[key]` among readable cells."""
    query = {
        "key": key,
        "owner_id": owner_id,
        "type": _check_values(types, MemoryType),
        "status": _check_values(status, Status),
        "session_id": session_id,
        "include_stale": include_stale or None,
        "metadata": metadata,
        "limit": page_size,
        "cursor": cursor,
    }
    return call("list_metadata_values", MetadataValuesResponse.model_validate,
                query={k: v for k, v in query.items() if v is not None})


def history(cell_id: str) -> Call[list[HistoryEntry]]:
    return call("memory_history", lambda body: HistoryResponse.model_validate(body).results,
                path_params=_cell(cell_id))


def export(owner_id: Optional[str] = None) -> Call[list[MemoryCell]]:
    query = {} if owner_id is None else {"owner_id": owner_id}
    return call("export", lambda body: [MemoryCell.model_validate(c, context=STORED) for c in body["cells"]], query=query)


def run_lifecycle(as_of: Optional[datetime] = None) -> Call[LifecycleRunResponse]:
    body = {} if as_of is None else {"as_of": to_jsonable_python(as_of)}
    return call("run_lifecycle", LifecycleRunResponse.model_validate, body=body)


def purge(ids: Optional[Iterable[str]] = None, as_of: Optional[datetime] = None) -> Call[PurgeResponse]:
    body: dict[str, Any] = {}
    if ids is not None:
        body["ids"] = list(ids)
    if as_of is not None:
        body["as_of"] = to_jsonable_python(as_of)
    return call("purge", PurgeResponse.model_validate, body=body)


def health() -> Call[Health]:
    return call("health", Health.model_validate)


def spec() -> Call[dict[str, Any]]:
    return call("spec", dict)


# ---------------------------------------------------------------- multi-step flows
# A flow is a generator that yields Calls and receives their results; the sync client
# drives it with a loop, the async client with an async loop. The steps are written once.


def forget_flow(cell_id: str, expected_version: Optional[int] = None) -> Generator[Call[Any], Any, None]:
    """Archive (a no-op when already archived), then delete: the only order the lifecycle
    allows (active|stale -> archived -> deleted). With `expected_version`, only a cell still
    at that version is forgotten (the archive is conditional)."""
    archive = update(cell_id, expected_version=expected_version, status=Status.archived.value)
    yield replace(archive, resend=True)  # archiving twice is a no-op, so this PATCH may be resent
    yield delete(cell_id)


def supersede_flow(old_id: str, text: str, cell_fields: dict[str, Any],
                   old: Optional[MemoryCell] = None) -> Generator[Call[Any], Any, MemoryCell]:
    """A new cell replacing `old_id`; owner, type and access policy default to the old cell's
    (`old`, when the caller has it: otherwise a GET, which counts as a use)."""
    if old is None:
        old = yield get(old_id)
    assert old is not None
    inherited = {
        "owner_id": old.identity.owner_id,
        "owner_type": old.identity.owner_type,
        "type": old.type,
        "readable_by": old.access_policy.readable_by,
        "writable_by": old.access_policy.writable_by,
        "public": old.access_policy.public,
    }
    fields = {**inherited, **cell_fields, "supersedes": old_id}
    new: MemoryCell = yield remember(text, **fields)
    return new


def list_flow(filters: dict[str, Any], limit: Optional[int] = None) -> Generator[Union[Call[Any], MemoryCell], Any, None]:
    """Cursor paging: yields Calls (to be answered with a ListResponse) and cells (to hand
    to the caller), stopping after `limit` cells if given."""
    if limit is not None and limit < 0:
        raise ValidationFailed("limit must be >= 0", {"limit": limit})
    seen = 0
    cursor = None
    while limit is None or seen < limit:
        page: ListResponse = yield list_page(**filters, cursor=cursor)
        for cell in page.results:
            if limit is not None and seen >= limit:
                return
            seen += 1
            yield cell
        if not page.next_cursor or not page.results:
            return
        cursor = page.next_cursor
