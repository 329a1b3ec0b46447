"""`Client` and `AsyncClient`: the same methods, over HTTP or in process, chosen by URL.

Every method builds a `Call` in `_calls` and hands it to the transport; multi-step
operations (`forget`, `supersede`, auto-paging `list`) are generators in `_calls`, driven
here by a sync or an async loop. Nothing else happens in these classes.
"""

from __future__ import annotations

import builtins

from datetime import datetime
from typing import Any, AsyncIterator, Generator, Iterable, Iterator, Mapping, Optional, Union

import httpx

from ..models import (
    CellCreate,
    ConsolidateResponse,
    Health,
    HistoryEntry,
    ImportReport,
    LifecycleRunResponse,
    MemoryCell,
    MemoryType,
    MetadataValuesResponse,
    PurgeResponse,
)
from ..files.models import (
    ApprovalMode,
    FileContent,
    FileHistoryResponse,
    FileListResponse,
    FileSearchResponse,
    FileWriteResult,
    GrepResponse,
    Proposal,
)
from . import _calls as calls
from . import _file_calls as fcalls
from ._calls import Call, SearchResult
from ._config import ClientConfig, resolve
from ._http import DEFAULT_RETRIES, DEFAULT_TIMEOUT, AsyncHTTPTransport, HTTPTransport, TimeoutTypes

CellItem = Union[Mapping[str, Any], CellCreate]


def _line_bytes(line: Union[str, bytes]) -> bytes:
    data = line.encode("utf-8") if isinstance(line, str) else line
    return data if data.endswith(b"\n") else data + b"\n"


class _BaseClient:
    """Settings shared by both shells: which URL, which agent, which transport."""

    _http_transport: type
    # The in-process transport's module name in `._local`: it loads the service, the stores and
    # numpy, so it is imported only when a local URL is used (a plain HTTP client stays light).
    _local_transport: str

    def __init__(self, url: Optional[str] = None, *, agent_id: Optional[str] = None, api_key: Optional[str] = None,
                 timeout: TimeoutTypes = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES,
                 http_client: Union[httpx.Client, httpx.AsyncClient, None] = None):
        self.config: ClientConfig = resolve(url, agent_id=agent_id, api_key=api_key)
        if self.config.is_http:
            self._transport = self._http_transport(
                self.config.url, agent_id=self.config.agent_id, api_key=self.config.api_key,
                timeout=timeout, retries=retries, http_client=http_client)
        else:
            from . import _local

            local_transport = getattr(_local, self._local_transport)
            self._transport = local_transport(self.config.url, agent_id=self.config.agent_id)

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def agent_id(self) -> Optional[str]:
        return self.config.agent_id

    @property
    def in_process(self) -> bool:
        return not self.config.is_http

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.config.display_url!r}, agent_id={self.agent_id!r})"


class Client(_BaseClient):
    """Synchronous client. `ampkit.connect(...)` builds one; use it as a context manager or
    call `close()` when done."""

    _http_transport = HTTPTransport
    _local_transport = "LocalTransport"

    # ------------------------------------------------------------ plumbing
    def _send(self, call: Call) -> Any:
        return self._transport.send(call)

    def _drive(self, flow: Generator[Call[Any], Any, Any]) -> Any:
        """Run a flow from `_calls`: send each Call it yields, hand back the result, return its value."""
        try:
            item = next(flow)
            while True:
                item = flow.send(self._send(item))
        except StopIteration as stop:
            return stop.value

    def close(self) -> None:
        self._transport.close()

    # ------------------------------------------------------------ NDJSON export and import (docs/time-travel.md)
    def export_ndjson(self, *, owner_id: Optional[str] = None, cursor: Optional[str] = None) -> Iterator[str]:
        """The whole store's NDJSON export (or one owner's), line by line as it streams
        (`GET /admin/export`; admin scope). `cursor`: resume after the line carrying it."""
        return self._transport.export_lines(owner_id, cursor)

    def import_ndjson(self, lines: Iterable[Union[str, bytes]]) -> ImportReport:
        """Import an NDJSON export (`POST /admin/import`; admin scope): validated whole, one
        transaction, idempotent. Over HTTP the file is one request body, bounded by the
        server's `max_request_bytes`."""
        chunks = (_line_bytes(line) for line in lines)
        return ImportReport.model_validate(self._transport.import_lines(chunks))

    def __enter__(self) -> "Client":
        self._transport.open()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # ------------------------------------------------------------ cells
    def remember(self, text: str, *, owner_id: str, type: Union[str, MemoryType] = MemoryType.semantic,
                 **cell_fields: Any) -> MemoryCell:
        return self._send(calls.remember(text, owner_id=owner_id, type=type, **cell_fields))

    def remember_many(self, items: Iterable[CellItem]) -> list[MemoryCell]:
        return self._send(calls.remember_many(items))

    def get(self, id: str, *, as_of: Optional[datetime] = None) -> MemoryCell:
        """The cell; with `as_of`, as it was then (an as-of read, rebuilt from history)."""
        return self._send(calls.get(id, as_of))

    def rollback(self, id: str, to_version: int, *, expected_version: Optional[int] = None) -> Optional[MemoryCell]:
        """Restore version `to_version` (content, scoring, access policy, provenance) as a new version."""
        return self._send(calls.rollback(id, to_version, expected_version=expected_version))

    def restore(self, id: str, *, expected_version: Optional[int] = None) -> Optional[MemoryCell]:
        """An archived cell back to active (the way back from `update(status="archived")`)."""
        return self._send(calls.restore(id, expected_version=expected_version))

    def update(self, id: str, *, expected_version: Optional[int] = None, **changes: Any) -> Optional[MemoryCell]:
        return self._send(calls.update(id, expected_version=expected_version, **changes))

    def supersede(self, old_id: str, text: str, **cell_fields: Any) -> MemoryCell:
        return self._drive(calls.supersede_flow(old_id, text, cell_fields))

    def forget(self, id: str) -> None:
        self._drive(calls.forget_flow(id))

    def history(self, id: str) -> list[HistoryEntry]:
        return self._send(calls.history(id))

    def record_outcome(self, id: str, success: bool, *, note: Optional[str] = None) -> Optional[MemoryCell]:
        """Count one run of a playbook (a procedural cell) as a success or a failure."""
        return self._send(calls.record_outcome(id, success, note))

    def pin(self, id: str) -> Optional[MemoryCell]:
        """Pin a cell: its owner's searches always include it, first, for callers that may read
        it (docs/clients.md#pinning). None when you may write but not read it."""
        return self._send(calls.pin(id))

    def unpin(self, id: str) -> Optional[MemoryCell]:
        """Undo `pin`: the cell is ranked like any other again."""
        return self._send(calls.unpin(id))

    # ------------------------------------------------------------ finding
    def search(self, query: str, *, owner_id: Optional[str] = None, types: Optional[Iterable[str]] = None,
               limit: int = 10, min_score: Optional[float] = None, include_files: bool = False,
               **filters: Any) -> list[SearchResult]:
        return self._send(calls.search(query, owner_id=owner_id, types=types, limit=limit, min_score=min_score,
                                       include_files=include_files, **filters))

    def export(self, owner_id: Optional[str] = None) -> list[MemoryCell]:
        return self._send(calls.export(owner_id))

    # ------------------------------------------------------------ learning
    def consolidate(self, owner_id: str, *, session_id: Optional[str] = None,
                    episode_ids: Optional[Iterable[str]] = None, since: Optional[datetime] = None,
                    until: Optional[datetime] = None, playbooks: str = "propose",
                    dry_run: bool = False, files: str = "off") -> ConsolidateResponse:
        """Distil the owner's episodes (a session, a list, or a since/until window) into facts
        and playbooks; every decision comes back with its reason (docs/consolidation.md)."""
        return self._send(calls.consolidate(owner_id, session_id=session_id, episode_ids=episode_ids,
                                              since=since, until=until, playbooks=playbooks, dry_run=dry_run,
                                              files=files))

    def remember_conversation(self, session_id: str, *, owner_id: str,
                              playbooks: str = "propose") -> ConsolidateResponse:
        """"Remember this": consolidate one conversation (session) now, instead of waiting for
        the background run."""
        return self._send(calls.consolidate(owner_id, session_id=session_id, playbooks=playbooks))

    # ------------------------------------------------------------ admin and meta
    def run_lifecycle(self, as_of: Optional[datetime] = None) -> LifecycleRunResponse:
        return self._send(calls.run_lifecycle(as_of))

    def purge(self, ids: Optional[Iterable[str]] = None, *, as_of: Optional[datetime] = None) -> PurgeResponse:
        return self._send(calls.purge(ids, as_of))

    def health(self) -> Health:
        return self._send(calls.health())

    def spec(self) -> dict[str, Any]:
        return self._send(calls.spec())

    # ------------------------------------------------------------ memory files (docs/files.md)
    def list_files(self, owner_id: str, *, glob: Optional[str] = None) -> FileListResponse:
        return self._send(fcalls.list_files(owner_id, glob))

    def read_file(self, path: str, *, owner_id: str, offset: int = 0, limit: int = 2000) -> FileContent:
        return self._send(fcalls.read_file(path, owner_id, offset, limit))

    def write_file(self, path: str, content: str, *, owner_id: str, reason: Optional[str] = None,
                   expected_version: Optional[int] = None, **access: Any) -> FileWriteResult:
        """Write a whole file; in `review` mode it becomes a proposal (`status == "proposed"`).
        The access policy of a new file: `access_policy={"readable_by": [...], ...}` (as on
        the wire) or the keywords `readable_by`, `writable_by`, `public`."""
        return self._send(fcalls.write_file(path, content, owner_id, reason, expected_version, **access))

    def edit_file(self, path: str, old: str, new: str, *, owner_id: str, replace_all: bool = False,
                  reason: Optional[str] = None, expected_version: Optional[int] = None) -> FileWriteResult:
        return self._send(fcalls.edit_file(path, old, new, owner_id, replace_all, reason, expected_version))

    def delete_file(self, path: str, *, owner_id: str, reason: Optional[str] = None,
                    expected_version: Optional[int] = None) -> FileWriteResult:
        return self._send(fcalls.delete_file(path, owner_id, reason, expected_version))

    def grep_files(self, pattern: str, *, owner_id: str, glob: Optional[str] = None, max_count: int = 200) -> GrepResponse:
        return self._send(fcalls.grep_files(pattern, owner_id, glob, max_count))

    def search_files(self, query: str, *, owner_id: str, glob: Optional[str] = None, limit: int = 10) -> FileSearchResponse:
        return self._send(fcalls.search_files(query, owner_id, glob, limit))

    def file_history(self, path: str, *, owner_id: str) -> FileHistoryResponse:
        return self._send(fcalls.file_history(path, owner_id))

    def get_approval_mode(self, owner_id: str) -> ApprovalMode:
        return self._send(fcalls.get_approval_mode(owner_id))

    def set_approval_mode(self, owner_id: str, mode: str) -> ApprovalMode:
        return self._send(fcalls.set_approval_mode(owner_id, mode))

    def list_proposals(self, *, owner_id: Optional[str] = None, status: Optional[str] = None,
                       proposed_by: Optional[str] = None) -> "builtins.list[Proposal]":
        return self._send(fcalls.list_proposals(owner_id, status, proposed_by))

    def get_proposal(self, proposal_id: str) -> Proposal:
        return self._send(fcalls.get_proposal(proposal_id))

    def approve_proposal(self, proposal_id: str, *, content: Optional[str] = None,
                         message: Optional[str] = None) -> Proposal:
        """Approve (with `content`: edit, then approve). Not by the agent that proposed it."""
        return self._send(fcalls.approve_proposal(proposal_id, content, message))

    def reject_proposal(self, proposal_id: str, *, message: Optional[str] = None) -> Proposal:
        return self._send(fcalls.reject_proposal(proposal_id, message))

    def metadata_values(self, key: str, **filters: Any) -> MetadataValuesResponse:
        """One page of the distinct values of `content.metadata[key]` among the readable cells
        `list` with these filters would show, with counts (`page_size`, `cursor` to page)."""
        return self._send(calls.metadata_values(key, **filters))

    # Last in the class body, so that `list[...]` in the annotations above means the builtin.
    def list(self, *, limit: Optional[int] = None, **filters: Any) -> Iterator[MemoryCell]:
        """Every matching cell, fetching pages as the iteration goes (`page_size` per request)."""
        flow = calls.list_flow(filters, limit)
        try:
            item = next(flow)
            while True:
                if isinstance(item, Call):
                    item = flow.send(self._send(item))
                else:
                    yield item
                    item = next(flow)
        except StopIteration:
            return


class AsyncClient(_BaseClient):
    """Asynchronous twin of `Client`: the same methods, awaited. Use `async with` (or
    `await client` to open it, then `await client.aclose()`)."""

    _http_transport = AsyncHTTPTransport
    _local_transport = "AsyncLocalTransport"

    # ------------------------------------------------------------ plumbing
    async def _send(self, call: Call) -> Any:
        return await self._transport.send(call)

    async def _drive(self, flow: Generator[Call[Any], Any, Any]) -> Any:
        try:
            item = next(flow)
            while True:
                item = flow.send(await self._send(item))
        except StopIteration as stop:
            return stop.value

    async def aclose(self) -> None:
        await self._transport.close()

    close = aclose

    async def _open(self) -> "AsyncClient":
        await self._transport.open()
        return self

    def __await__(self):
        return self._open().__await__()

    async def __aenter__(self) -> "AsyncClient":
        return await self._open()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    # ------------------------------------------------------------ cells
    async def remember(self, text: str, *, owner_id: str, type: Union[str, MemoryType] = MemoryType.semantic,
                       **cell_fields: Any) -> MemoryCell:
        return await self._send(calls.remember(text, owner_id=owner_id, type=type, **cell_fields))

    async def remember_many(self, items: Iterable[CellItem]) -> list[MemoryCell]:
        return await self._send(calls.remember_many(items))

    async def get(self, id: str, *, as_of: Optional[datetime] = None) -> MemoryCell:
        """The cell; with `as_of`, as it was then (an as-of read, rebuilt from history)."""
        return await self._send(calls.get(id, as_of))

    async def rollback(self, id: str, to_version: int, *, expected_version: Optional[int] = None) -> Optional[MemoryCell]:
        """Restore version `to_version` (content, scoring, access policy, provenance) as a new version."""
        return await self._send(calls.rollback(id, to_version, expected_version=expected_version))

    async def restore(self, id: str, *, expected_version: Optional[int] = None) -> Optional[MemoryCell]:
        """An archived cell back to active (the way back from `update(status="archived")`)."""
        return await self._send(calls.restore(id, expected_version=expected_version))

    async def update(self, id: str, *, expected_version: Optional[int] = None, **changes: Any) -> Optional[MemoryCell]:
        return await self._send(calls.update(id, expected_version=expected_version, **changes))

    async def supersede(self, old_id: str, text: str, **cell_fields: Any) -> MemoryCell:
        return await self._drive(calls.supersede_flow(old_id, text, cell_fields))

    async def forget(self, id: str) -> None:
        await self._drive(calls.forget_flow(id))

    async def metadata_values(self, key: str, **filters: Any) -> MetadataValuesResponse:
        return await self._send(calls.metadata_values(key, **filters))

    async def history(self, id: str) -> list[HistoryEntry]:
        return await self._send(calls.history(id))

    async def record_outcome(self, id: str, success: bool, *, note: Optional[str] = None) -> Optional[MemoryCell]:
        """Count one run of a playbook (a procedural cell) as a success or a failure."""
        return await self._send(calls.record_outcome(id, success, note))

    async def pin(self, id: str) -> Optional[MemoryCell]:
        """Pin a cell: its owner's searches always include it, first, for callers that may read
        it (docs/clients.md#pinning). None when you may write but not read it."""
        return await self._send(calls.pin(id))

    async def unpin(self, id: str) -> Optional[MemoryCell]:
        """Undo `pin`: the cell is ranked like any other again."""
        return await self._send(calls.unpin(id))

    # ------------------------------------------------------------ finding
    async def search(self, query: str, *, owner_id: Optional[str] = None, types: Optional[Iterable[str]] = None,
                     limit: int = 10, min_score: Optional[float] = None, include_files: bool = False,
                     **filters: Any) -> list[SearchResult]:
        return await self._send(calls.search(query, owner_id=owner_id, types=types, limit=limit, min_score=min_score,
                                             include_files=include_files, **filters))

    async def export(self, owner_id: Optional[str] = None) -> list[MemoryCell]:
        return await self._send(calls.export(owner_id))

    # ------------------------------------------------------------ learning
    async def consolidate(self, owner_id: str, *, session_id: Optional[str] = None,
                    episode_ids: Optional[Iterable[str]] = None, since: Optional[datetime] = None,
                    until: Optional[datetime] = None, playbooks: str = "propose",
                    dry_run: bool = False, files: str = "off") -> ConsolidateResponse:
        """Distil the owner's episodes (a session, a list, or a since/until window) into facts
        and playbooks; every decision comes back with its reason (docs/consolidation.md)."""
        return await self._send(calls.consolidate(owner_id, session_id=session_id, episode_ids=episode_ids,
                                              since=since, until=until, playbooks=playbooks, dry_run=dry_run,
                                              files=files))

    async def remember_conversation(self, session_id: str, *, owner_id: str,
                              playbooks: str = "propose") -> ConsolidateResponse:
        """"Remember this": consolidate one conversation (session) now, instead of waiting for
        the background run."""
        return await self._send(calls.consolidate(owner_id, session_id=session_id, playbooks=playbooks))

    # ------------------------------------------------------------ admin and meta
    async def run_lifecycle(self, as_of: Optional[datetime] = None) -> LifecycleRunResponse:
        return await self._send(calls.run_lifecycle(as_of))

    async def purge(self, ids: Optional[Iterable[str]] = None, *, as_of: Optional[datetime] = None) -> PurgeResponse:
        return await self._send(calls.purge(ids, as_of))

    async def health(self) -> Health:
        return await self._send(calls.health())

    async def spec(self) -> dict[str, Any]:
        return await self._send(calls.spec())

    # ------------------------------------------------------------ memory files (docs/files.md)
    async def list_files(self, owner_id: str, *, glob: Optional[str] = None) -> FileListResponse:
        return await self._send(fcalls.list_files(owner_id, glob))

    async def read_file(self, path: str, *, owner_id: str, offset: int = 0, limit: int = 2000) -> FileContent:
        return await self._send(fcalls.read_file(path, owner_id, offset, limit))

    async def write_file(self, path: str, content: str, *, owner_id: str, reason: Optional[str] = None,
                   expected_version: Optional[int] = None, **access: Any) -> FileWriteResult:
        """Write a whole file; in `review` mode it becomes a proposal (`status == "proposed"`).
        The access policy of a new file: `access_policy={"readable_by": [...], ...}` (as on
        the wire) or the keywords `readable_by`, `writable_by`, `public`."""
        return await self._send(fcalls.write_file(path, content, owner_id, reason, expected_version, **access))

    async def edit_file(self, path: str, old: str, new: str, *, owner_id: str, replace_all: bool = False,
                  reason: Optional[str] = None, expected_version: Optional[int] = None) -> FileWriteResult:
        return await self._send(fcalls.edit_file(path, old, new, owner_id, replace_all, reason, expected_version))

    async def delete_file(self, path: str, *, owner_id: str, reason: Optional[str] = None,
                    expected_version: Optional[int] = None) -> FileWriteResult:
        return await self._send(fcalls.delete_file(path, owner_id, reason, expected_version))

    async def grep_files(self, pattern: str, *, owner_id: str, glob: Optional[str] = None, max_count: int = 200) -> GrepResponse:
        return await self._send(fcalls.grep_files(pattern, owner_id, glob, max_count))

    async def search_files(self, query: str, *, owner_id: str, glob: Optional[str] = None, limit: int = 10) -> FileSearchResponse:
        return await self._send(fcalls.search_files(query, owner_id, glob, limit))

    async def file_history(self, path: str, *, owner_id: str) -> FileHistoryResponse:
        return await self._send(fcalls.file_history(path, owner_id))

    async def get_approval_mode(self, owner_id: str) -> ApprovalMode:
        return await self._send(fcalls.get_approval_mode(owner_id))

    async def set_approval_mode(self, owner_id: str, mode: str) -> ApprovalMode:
        return await self._send(fcalls.set_approval_mode(owner_id, mode))

    async def list_proposals(self, *, owner_id: Optional[str] = None, status: Optional[str] = None,
                       proposed_by: Optional[str] = None) -> "builtins.list[Proposal]":
        return await self._send(fcalls.list_proposals(owner_id, status, proposed_by))

    async def get_proposal(self, proposal_id: str) -> Proposal:
        return await self._send(fcalls.get_proposal(proposal_id))

    async def approve_proposal(self, proposal_id: str, *, content: Optional[str] = None,
                         message: Optional[str] = None) -> Proposal:
        """Approve (with `content`: edit, then approve). Not by the agent that proposed it."""
        return await self._send(fcalls.approve_proposal(proposal_id, content, message))

    async def reject_proposal(self, proposal_id: str, *, message: Optional[str] = None) -> Proposal:
        return await self._send(fcalls.reject_proposal(proposal_id, message))

    # Last in the class body, so that `list[...]` in the annotations above means the builtin.
    async def list(self, *, limit: Optional[int] = None, **filters: Any) -> AsyncIterator[MemoryCell]:
        """Every matching cell, fetching pages as the iteration goes (`async for`)."""
        flow = calls.list_flow(filters, limit)
        try:
            item = next(flow)
            while True:
                if isinstance(item, Call):
                    item = flow.send(await self._send(item))
                else:
                    yield item
                    item = next(flow)
        except StopIteration:
            return


def connect(url: Optional[str] = None, *, agent_id: Optional[str] = None, api_key: Optional[str] = None,
            timeout: TimeoutTypes = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES) -> Client:
    """A synchronous client for `url` (or `AMPKIT_URL`, or the config file); see docs/clients.md."""
    return Client(url, agent_id=agent_id, api_key=api_key, timeout=timeout, retries=retries)


def aconnect(url: Optional[str] = None, *, agent_id: Optional[str] = None, api_key: Optional[str] = None,
             timeout: TimeoutTypes = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES) -> AsyncClient:
    """The async twin of `connect`: `async with ampkit.aconnect(...) as memory:`."""
    return AsyncClient(url, agent_id=agent_id, api_key=api_key, timeout=timeout, retries=retries)
