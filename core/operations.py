"""Every wire operation, once: one row per operation, from which the FastAPI routes
(`server/app.py`), the in-process transport (`client/_local.py`) and the client's call
builders (`client/_calls.py`) are all made.

A row says what an operation is on the wire (method, path, query/header/path parameters,
request and response models, status code, required scope, whether it is safe to resend) and
what it does (`run`: a call of one `MemoryService` method). Nothing here does I/O or knows
HTTP frameworks, so the plain client (no `server` extra) can import it.

Adding an operation: one `Operation` row in `OPERATIONS` plus the service method it calls
(docs/architecture.md walks through it).
"""

from __future__ import annotations

import functools
import json
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Optional, Sequence
from urllib.parse import quote

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from .auth import SCOPES
from .errors import ValidationFailed, validation_to_api_error
from .limits import Limits
from .models import (
    AMP_VERSION,
    BackgroundHealth,
    BatchCreate,
    BatchCreateResponse,
    CellCreate,
    CellPatch,
    ConsolidateRequest,
    ConsolidateResponse,
    ErrorEnvelope,
    EmbeddingHealth,
    Health,
    VectorIndexHealth,
    HistoryResponse,
    LifecycleRunRequest,
    LifecycleRunResponse,
    ListResponse,
    MemoryCell,
    MemoryType,
    MetadataValuesResponse,
    OutcomeRequest,
    PurgeRequest,
    PurgeResponse,
    RollbackRequest,
    SearchRequest,
    SearchResponse,
    Status,
    UtcDatetime,
)

from .files.models import (
    MAX_GREP_MATCHES,
    MAX_READ_LINES,
    ApprovalMode,
    ApproveRequest,
    FileContent,
    FileDelete,
    FileEdit,
    FileHistoryResponse,
    FileListResponse,
    FileSearchRequest,
    FileSearchResponse,
    FileWrite,
    FileWriteResult,
    GrepResponse,
    Proposal,
    ProposalList,
    ProposalStatus,
    RejectRequest,
)

if TYPE_CHECKING:
    from .service import MemoryService

PREFIX = "/amp/v1"


@dataclass(frozen=True)
class Param:
    """A path, query or header parameter. `name` is the Python name; a header travels as the
    name with `-` for `_` (`if_match` -> `If-Match`)."""

    name: str
    annotation: Any  # the parsed type, e.g. Optional[list[str]]
    source: str  # "path" | "query" | "header"
    default: Any = None
    description: Optional[str] = None
    bounds: Optional[Callable[[Limits], dict[str, Any]]] = None  # e.g. ge/le from the server's limits

    @property
    def required(self) -> bool:
        return self.source == "path"

    @property
    def wire_name(self) -> str:
        return self.name.replace("_", "-") if self.source == "header" else self.name

    @property
    def repeated(self) -> bool:
        """A list parameter (`?type=a&type=b`)."""
        inner = [a for a in typing.get_args(self.annotation) if a is not type(None)] or [self.annotation]
        return any(typing.get_origin(a) is list for a in inner)


@dataclass(frozen=True)
class Context:
    """What an operation runs with: the service, the calling agent ("" on open routes) and
    the description of how callers identify (part of GET /spec)."""

    service: "MemoryService"
    agent: str
    auth: Mapping[str, Any]
    mcp: Optional[Mapping[str, Any]] = None  # the MCP endpoint GET /spec advertises, if served
    # Whether the caller's key holds the `read` scope. A body that contains a cell needs it:
    # writes by a key without it answer 204, whatever the access policy lets its agent read.
    may_read: bool = True
    # The caller's key scopes (every scope in process and with auth off): deciding a proposal
    # needs `approve` or `admin`, unless the caller owns the folder (docs/files.md#approval).
    scopes: frozenset[str] = frozenset(SCOPES)
    # Whether the caller proved its identity with an API key holding the `admin` scope: such
    # a caller may change any cell's access policy (`access.may_change_policy`). Never true
    # with auth off or in process, where every caller holds every scope.
    admin_key: bool = False

    @property
    def may_approve(self) -> bool:
        return "approve" in self.scopes or "admin" in self.scopes


Inputs = Mapping[str, Any]  # parameter name -> parsed value; the body under "body"


@dataclass(frozen=True)
class Answer:
    """A result with a status code or headers other than the row's (a create that found a
    duplicate answers 200 and `X-AMP-Dedup`). In process only `value` matters."""

    value: Any
    status_code: int
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class McpTool:
    """An MCP tool made from a row (`ampkit.mcp_server`): its name, and whether it only reads
    (the tool's `readOnlyHint`; the differential non-interference test calls every read tool).
    Its description and argument descriptions are the tool function's docstring and
    annotations, next to the arguments they explain."""

    name: str
    read_only: bool


@dataclass(frozen=True)
class Operation:
    name: str  # also the route's name, hence its OpenAPI operationId and summary
    method: str
    path: str  # relative to PREFIX; `{name}` marks a path parameter
    run: Callable[[Context, Inputs], Any]  # None answers 204 No Content
    # The same for a server's event loop, awaited there instead of running `run` in a worker
    # thread, when the service `commits_in_groups`: a create waits for its group commit
    # without a thread of its own (ampkit.store.grouped_writes).
    run_grouped: Optional[Callable[[Context, Inputs], Awaitable[Any]]] = None
    request: Optional[type[BaseModel]] = None  # the JSON body
    body_required: bool = True
    response: Any = None  # the response model (None: no body)
    status_code: int = 200
    scope: Optional[str] = "read"  # None: an open route, no identity needed
    params: tuple[Param, ...] = ()
    idempotent: bool = True  # safe to resend after a connection error or a 503
    tags: tuple[str, ...] = ("memories",)
    responses: Mapping[int, Any] = field(default_factory=dict)  # extra documented answers
    aliases: tuple[tuple[str, str], ...] = ()  # (path, summary): the same operation at another path
    extra_scopes: tuple[str, ...] = ()  # scopes needed besides `scope` (consolidation reads and writes)
    # The callable surface (docs/architecture.md#the-callable-surface): the `Client` and
    # `AsyncClient` methods that send this row (hand-written, typed and documented twins;
    # `tests/test_surface.py` checks both exist with one signature), and its MCP tools, or
    # `mcp_opt_out`, the reason it has none.
    client: tuple[str, ...] = ()
    mcp: tuple[McpTool, ...] = ()
    mcp_opt_out: Optional[str] = None

    def __post_init__(self) -> None:
        if self.scope is not None and self.scope not in SCOPES:
            raise ValueError(f"{self.name}: unknown scope {self.scope!r}")
        if bool(self.mcp) == bool(self.mcp_opt_out):
            raise ValueError(f"{self.name}: name its MCP tools or give mcp_opt_out, a reason for none (not both)")

    def grouped(self, service: "MemoryService") -> Optional[Callable[[Context, Inputs], Awaitable[Any]]]:
        """`run_grouped`, when the row has one and `service` commits creates in groups: then an
        event loop awaits it instead of running `run` in a thread (the server, the in-process
        AsyncClient)."""
        return self.run_grouped if self.run_grouped is not None and service.commits_in_groups else None

    def url(self, path_params: Mapping[str, str]) -> str:
        """The path with its parameters filled in (quoted), relative to PREFIX."""
        return self.path.format(**{k: quote(str(v), safe="") for k, v in path_params.items()})

    def parse(self, *, path: Mapping[str, str], query: Sequence[tuple[str, str]], headers: Mapping[str, str],
              body: Any, limits: Limits) -> dict[str, Any]:
        """Validate wire inputs exactly as the server's routes do (same types, bounds and error
        locations), for transports that do not go through the HTTP framework."""
        lowered = {k.lower(): v for k, v in headers.items()}
        values: dict[str, Any] = {}
        errors: list[dict[str, Any]] = []
        for param in self.params:
            if param.source == "path":
                raw: Any = path.get(param.name)
            elif param.source == "header":
                raw = lowered.get(param.wire_name)
            else:
                found = [v for k, v in query if k == param.wire_name]
                raw = (found or None) if param.repeated else (found[-1] if found else None)
            if raw is None:
                values[param.name] = param.default
                continue
            try:
                values[param.name] = _adapter(param, limits).validate_python(raw)
            except ValidationError as exc:
                errors += [{**e, "loc": (param.source, param.wire_name, *e.get("loc", ()))} for e in exc.errors()]
        if errors:
            raise validation_to_api_error(errors)
        if self.request is not None:
            if body is None and not self.body_required:
                values["body"] = None
            else:
                try:
                    values["body"] = self.request.model_validate(body)
                except ValidationError as exc:
                    # The server reports body errors at loc ("body", ...); keep the details identical.
                    raise validation_to_api_error(
                        [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors()]
                    ) from None
        return values


@functools.lru_cache(maxsize=512)
def _adapter(param: Param, limits: Limits) -> TypeAdapter[Any]:
    # Cached: building a TypeAdapter costs more than most in-process calls themselves.
    bounds = param.bounds(limits) if param.bounds else {}
    return TypeAdapter(typing.Annotated[param.annotation, Field(**bounds)] if bounds else param.annotation)


def query_pairs(query: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Python values -> query pairs: lists repeat the key, dicts travel as JSON, bools as true/false."""
    pairs: list[tuple[str, str]] = []
    for key, value in query.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if isinstance(v, bool):
                v = "true" if v else "false"
            elif isinstance(v, dict):
                v = json.dumps(v, separators=(",", ":"))
            pairs.append((key, str(v)))
    return pairs


# ---------------------------------------------------------------- input helpers


def split_values(values: Optional[list[str]], enum: type[Any]) -> Optional[list[str]]:
    """Accept `?type=a&type=b` and `?type=a,b`; refuse values the enum does not name."""
    if not values:
        return None
    allowed = [member.value for member in enum]
    out = [v.strip() for value in values for v in value.split(",") if v.strip()]
    bad = [v for v in out if v not in allowed]
    if bad:
        raise ValidationFailed(f"unknown value(s) {bad}; allowed: {allowed}", {"invalid": bad})
    return out or None


def metadata_filter(raw: Optional[str]) -> Optional[dict[str, Any]]:
    """`?metadata={"k": "v"}`: the same equality filter that search takes in its body."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep to decode
        raise ValidationFailed("metadata must be a JSON object", {"param": "metadata"}) from exc
    if not isinstance(value, dict):
        raise ValidationFailed("metadata must be a JSON object", {"param": "metadata"})
    return value


# ---------------------------------------------------------------- what each operation does


def _health(ctx: Context, inputs: Inputs) -> Health:
    # Readiness, not just liveness: a load balancer takes a server whose store is down
    # out of rotation (503 UNAVAILABLE) and back when the store returns.
    ctx.service.store.ping()
    state = getattr(ctx.service.store, "vector_index_state", None)  # stores with an in-memory index
    scheduler = getattr(ctx.service.store, "scheduler", None)  # stores with background loops
    return Health(vector_index=VectorIndexHealth(**state()) if state else VectorIndexHealth(),
                  embedding=EmbeddingHealth(**ctx.service.embedding_status()),
                  background=[BackgroundHealth(**item) for item in scheduler.states()] if scheduler else [])


def batch_response(created: Sequence[tuple[MemoryCell, Optional[str]]]) -> BatchCreateResponse:
    return BatchCreateResponse(results=[cell for cell, _ in created],
                               deduplicated=[i for i, (_, dedup) in enumerate(created) if dedup is not None])


def _spec(ctx: Context, inputs: Inputs) -> dict[str, Any]:
    from .service import spec_document

    return spec_document(ctx.service, dict(ctx.auth), mcp=dict(ctx.mcp) if ctx.mcp else None)


def _list(ctx: Context, inputs: Inputs) -> ListResponse:
    results, total, next_cursor = ctx.service.list(
        ctx.agent,
        owner_id=inputs["owner_id"],
        types=split_values(inputs["type"], MemoryType),
        status=split_values(inputs["status"], Status),
        include_stale=inputs["include_stale"],
        include_superseded=inputs["include_superseded"],
        session_id=inputs["session_id"],
        metadata=metadata_filter(inputs["metadata"]),
        limit=inputs["limit"],
        cursor=inputs["cursor"],
        as_of=inputs["as_of"],
    )
    return ListResponse(results=results, total=total, next_cursor=next_cursor)


def _metadata_values(ctx: Context, inputs: Inputs) -> MetadataValuesResponse:
    return ctx.service.metadata_values(
        ctx.agent, inputs["key"] or "",
        owner_id=inputs["owner_id"],
        types=split_values(inputs["type"], MemoryType),
        status=split_values(inputs["status"], Status),
        include_stale=inputs["include_stale"],
        session_id=inputs["session_id"],
        metadata=metadata_filter(inputs["metadata"]),
        limit=inputs["limit"],
        cursor=inputs["cursor"],
    )


def _export(ctx: Context, inputs: Inputs) -> dict[str, Any]:
    cells = ctx.service.export(ctx.agent, owner_id=inputs["owner_id"])
    return {"amp_version": AMP_VERSION, "count": len(cells), "cells": [c.model_dump(mode="json") for c in cells]}


def _purge(ctx: Context, inputs: Inputs) -> PurgeResponse:
    body = inputs["body"] or PurgeRequest()
    return ctx.service.purge(ctx.agent, ids=body.ids, as_of=body.as_of)


MEMORY_ID = Param("memory_id", str, "path")
IF_MATCH = Param("if_match", Optional[int], "header", description="extension: expected lifecycle.version")
# An as-of read (extension): the cell or set as it was at this time, rebuilt from history.
# Not the admin runs' `as_of` clock override; see docs/time-travel.md.
AS_OF = Param("as_of", Optional[UtcDatetime], "query", description=(
    "extension (as-of read): the state at this time (RFC 3339; no offset means UTC), rebuilt from history"))
WRITER_ONLY_204 = {204: {"description": "applied; the caller may write but not read this cell "
                                          "(or its key lacks the read scope)"}}
WRITE_ONLY_KEY_204 = {204: {"description": "created; the key lacks the read scope, so no cell in the answer"}}


def _create(ctx: Context, inputs: Inputs) -> Any:
    return _created(ctx, ctx.service.create_many_detailed(ctx.agent, [inputs["body"]])[0])


async def _create_async(ctx: Context, inputs: Inputs) -> Any:
    return _created(ctx, (await ctx.service.create_many_detailed_async(ctx.agent, [inputs["body"]]))[0])


def _created(ctx: Context, created: tuple[MemoryCell, Optional[str]]) -> Any:
    cell, dedup = created
    if not ctx.may_read:  # a key without the read scope learns nothing, duplicates included
        return None
    # Nothing new was stored: the existing cell, 200 instead of 201 (extension dedup_on_write).
    return cell if dedup is None else Answer(cell, 200, {"X-AMP-Dedup": dedup})


def _outcome(ctx: Context, inputs: Inputs) -> Optional[MemoryCell]:
    cell = ctx.service.record_outcome(ctx.agent, inputs["memory_id"], inputs["body"].success, inputs["body"].note)
    return cell if ctx.may_read else None


def _create_many(ctx: Context, inputs: Inputs) -> Optional[BatchCreateResponse]:
    created = ctx.service.create_many_detailed(ctx.agent, inputs["body"].cells)
    return batch_response(created) if ctx.may_read else None


async def _create_many_async(ctx: Context, inputs: Inputs) -> Optional[BatchCreateResponse]:
    created = await ctx.service.create_many_detailed_async(ctx.agent, inputs["body"].cells)
    return batch_response(created) if ctx.may_read else None


LIST_PARAMS = (
    Param("owner_id", Optional[str], "query"),
    Param("type", Optional[list[str]], "query"),
    Param("status", Optional[list[str]], "query"),
    Param("session_id", Optional[str], "query"),
    Param("include_stale", bool, "query", default=False),
    Param("include_superseded", bool, "query", default=False),
    Param("limit", Optional[int], "query", bounds=lambda limits: {"ge": 1, "le": limits.max_page_size}),
    Param("cursor", Optional[str], "query"),
    Param("metadata", Optional[str], "query",
          description="extension: JSON object, equality filter on content.metadata keys"),
    AS_OF,
)
# ---------------------------------------------------------------- memory files (docs/files.md)
FILE_OWNER = Param("owner_id", Optional[str], "query", description="whose memory folder (required)")
FILE_PATH = Param("path", Optional[str], "query", description="the file's path in the folder (required)")
FILE_GLOB = Param("glob", Optional[str], "query", description="only paths matching this glob (`*`, `**`, `?`)")
PROPOSAL_ID = Param("proposal_id", str, "path")


def reads(*names: str) -> tuple[McpTool, ...]:
    return tuple(McpTool(name, read_only=True) for name in names)


def writes(*names: str) -> tuple[McpTool, ...]:
    return tuple(McpTool(name, read_only=False) for name in names)


PERSON_DECIDES = "a person decides approvals (docs/files.md), in the inspector or a client"
MCP_HANDSHAKE = "the MCP handshake already names the server and its version"


def required(inputs: Inputs, name: str) -> str:
    value = inputs[name]
    if value is None or not str(value).strip():
        raise ValidationFailed(f"the query parameter {name} is required", {"param": name})
    return str(value)


def _files(rows: Callable[..., Any]) -> Callable[[Context, Inputs], Any]:
    """A files row: `rows(files_service, ctx, inputs)`."""
    return lambda c, i: rows(c.service.files, c, i)


def _decide(decision: str) -> Callable[[Context, Inputs], Any]:
    def run(c: Context, i: Inputs) -> Proposal:
        method = c.service.files.approve if decision == "approve" else c.service.files.reject
        return method(c.agent, i["proposal_id"], i["body"], may_approve=c.may_approve, may_write="write" in c.scopes)
    return run


FILE_OPERATIONS: tuple[Operation, ...] = (
    Operation("list_files", "GET", "/files",
              _files(lambda f, c, i: f.list(c.agent, required(i, "owner_id"), i["glob"])),
              response=FileListResponse, params=(FILE_OWNER, FILE_GLOB), tags=("files",),
              client=("list_files",), mcp=reads("ls_files")),
    Operation("read_file", "GET", "/files/read",
              _files(lambda f, c, i: f.read(c.agent, required(i, "owner_id"), required(i, "path"), i["offset"], i["limit"])),
              response=FileContent, tags=("files",),
              params=(FILE_OWNER, FILE_PATH,
                      Param("offset", int, "query", default=0, description="first line, 0-based",
                            bounds=lambda limits: {"ge": 0}),
                      Param("limit", int, "query", default=2000, description="lines to return",
                            bounds=lambda limits: {"ge": 1, "le": MAX_READ_LINES})),
              client=("read_file",), mcp=reads("read_file")),
    Operation("grep_files", "GET", "/files/grep",
              _files(lambda f, c, i: f.grep(c.agent, required(i, "owner_id"), required(i, "pattern"), i["glob"],
                                            i["max_count"])),
              response=GrepResponse, tags=("files",),
              params=(FILE_OWNER, Param("pattern", Optional[str], "query", description="a literal string (required)"),
                      FILE_GLOB, Param("max_count", int, "query", default=200,
                                       bounds=lambda limits: {"ge": 1, "le": MAX_GREP_MATCHES})),
              client=("grep_files",), mcp=reads("grep_files")),
    Operation("search_files", "POST", "/files/search", _files(lambda f, c, i: f.search(c.agent, i["body"])),
              request=FileSearchRequest, response=FileSearchResponse, tags=("files",),
              client=("search_files",), mcp_opt_out="few short files: agents use ls_files, grep_files"),
    Operation("file_history", "GET", "/files/history",
              _files(lambda f, c, i: f.history(c.agent, required(i, "owner_id"), required(i, "path"))),
              response=FileHistoryResponse, params=(FILE_OWNER, FILE_PATH), tags=("files",),
              client=("file_history",), mcp_opt_out="a person reviews a file's versions, in the inspector or a client"),
    Operation("write_file", "POST", "/files/write", _files(lambda f, c, i: f.write(c.agent, i["body"])),
              request=FileWrite, response=FileWriteResult, scope="write", idempotent=False, tags=("files",),
              client=("write_file",), mcp=writes("write_file")),
    Operation("edit_file", "POST", "/files/edit", _files(lambda f, c, i: f.edit(c.agent, i["body"])),
              request=FileEdit, response=FileWriteResult, scope="write", idempotent=False, tags=("files",),
              client=("edit_file",), mcp=writes("edit_file")),
    Operation("delete_file", "POST", "/files/delete", _files(lambda f, c, i: f.delete(c.agent, i["body"])),
              request=FileDelete, response=FileWriteResult, scope="write", idempotent=False, tags=("files",),
              client=("delete_file",), mcp_opt_out="deleting a file is left to a person; an agent edits"),
    Operation("get_approval_mode", "GET", "/files/mode",
              _files(lambda f, c, i: f.approval_mode(required(i, "owner_id"))),
              response=ApprovalMode, params=(FILE_OWNER,), tags=("files",),
              client=("get_approval_mode",), mcp_opt_out=PERSON_DECIDES),
    Operation("set_approval_mode", "PUT", "/files/mode", _files(lambda f, c, i: f.set_approval_mode(c.agent, i["body"])),
              request=ApprovalMode, response=ApprovalMode, scope="admin", tags=("files",),
              client=("set_approval_mode",), mcp_opt_out=PERSON_DECIDES),
    Operation("list_proposals", "GET", "/proposals",
              _files(lambda f, c, i: f.proposals(c.agent, i["owner_id"], i["status"], i["proposed_by"],
                                                 may_approve=c.may_approve)),
              response=ProposalList, tags=("files",),
              params=(Param("owner_id", Optional[str], "query"), Param("status", Optional[ProposalStatus], "query"),
                      Param("proposed_by", Optional[str], "query")),
              client=("list_proposals",), mcp_opt_out=PERSON_DECIDES),
    Operation("get_proposal", "GET", "/proposals/{proposal_id}",
              _files(lambda f, c, i: f.proposal(c.agent, i["proposal_id"], may_approve=c.may_approve)),
              response=Proposal, params=(PROPOSAL_ID,), tags=("files",),
              client=("get_proposal",), mcp_opt_out=PERSON_DECIDES),
    # Deciding needs the owner (with write) or the approve/admin scope (a new file another agent
    # put in the folder: the approve/admin scope): checked by the service.
    Operation("approve_proposal", "POST", "/proposals/{proposal_id}/approve", _decide("approve"),
              request=ApproveRequest, body_required=False, response=Proposal, idempotent=False,
              params=(PROPOSAL_ID,), tags=("files",),
              client=("approve_proposal",), mcp_opt_out=PERSON_DECIDES),
    Operation("reject_proposal", "POST", "/proposals/{proposal_id}/reject", _decide("reject"),
              request=RejectRequest, body_required=False, response=Proposal, idempotent=False,
              params=(PROPOSAL_ID,), tags=("files",),
              client=("reject_proposal",), mcp_opt_out=PERSON_DECIDES),
)

ERROR_503 = {503: {"model": ErrorEnvelope, "description": "the store cannot be reached"}}

# Registration order matters: the static /memories/... paths come before /memories/{memory_id}.
OPERATIONS: tuple[Operation, ...] = (
    Operation("health", "GET", "/health", _health, response=Health, scope=None, tags=("meta",), responses=ERROR_503,
              client=("health",), mcp_opt_out=MCP_HANDSHAKE),
    Operation("spec", "GET", "/spec", _spec, response=dict[str, Any], scope=None, tags=("meta",),
              client=("spec",), mcp_opt_out=MCP_HANDSHAKE),
    Operation("create_memory", "POST", "/memories", _create, run_grouped=_create_async, request=CellCreate,
              response=MemoryCell, status_code=201, scope="write", idempotent=False,
              responses={**WRITE_ONLY_KEY_204,
                         200: {"model": MemoryCell, "description": "a duplicate: the existing cell (header X-AMP-Dedup)"}},
              client=("remember", "supersede"), mcp=writes("remember", "supersede", "amp_remember")),
    Operation("create_memories", "POST", "/memories/batch", _create_many, run_grouped=_create_many_async,
              request=BatchCreate,
              response=BatchCreateResponse, status_code=201, scope="write", idempotent=False,
              responses=WRITE_ONLY_KEY_204,
              client=("remember_many",), mcp_opt_out="a bulk import; an agent remembers one at a time"),
    Operation("consolidate", "POST", "/memories/consolidate",
              lambda c, i: c.service.consolidate(c.agent, i["body"]),
              request=ConsolidateRequest, response=ConsolidateResponse, scope="write", extra_scopes=("read",),
              tags=("learning",),
              responses={501: {"model": ErrorEnvelope, "description": "no model is configured"},
                         502: {"model": ErrorEnvelope, "description": "the model failed; nothing was written"}},
              client=("consolidate", "remember_conversation"), mcp=writes("consolidate")),
    Operation("search_memories", "POST", "/memories/search", lambda c, i: c.service.search(c.agent, i["body"]),
              request=SearchRequest, response=SearchResponse,
              client=("search",), mcp=reads("recall", "amp_recall")),
    Operation("list_route", "GET", "/memories", _list, response=ListResponse, params=LIST_PARAMS,
              aliases=(("/memories/query", "Alias of GET /memories (AMP v0.1 name)"),),
              client=("list",), mcp=reads("list_memories", "amp_list_memories")),
    Operation("list_metadata_values", "GET", "/memories/values", _metadata_values, response=MetadataValuesResponse,
              params=(Param("key", Optional[str], "query", description="the metadata key (required)"),
                      *(p for p in LIST_PARAMS if p.name not in ("include_superseded", "as_of"))),
              client=("metadata_values",), mcp_opt_out="filter menus of browsing UIs; agents filter list_memories"),
    Operation("export", "GET", "/export", _export, response=dict[str, Any], params=(Param("owner_id", Optional[str], "query"),),
              client=("export",), mcp_opt_out="a bulk copy for backups, too large for a conversation"),
    Operation("get_memory", "GET", "/memories/{memory_id}",
              lambda c, i: c.service.get(c.agent, i["memory_id"], as_of=i["as_of"]),
              response=MemoryCell, params=(MEMORY_ID, AS_OF),
              client=("get",), mcp=reads("get_memory")),
    Operation("patch_memory", "PATCH", "/memories/{memory_id}",
              lambda c, i: c.service.update(c.agent, i["memory_id"], i["body"], expected_version=i["if_match"],
                                            may_read=c.may_read, admin_key=c.admin_key),
              request=CellPatch, response=MemoryCell, scope="write", idempotent=False,
              params=(MEMORY_ID, IF_MATCH), responses=WRITER_ONLY_204,
              client=("update",), mcp=writes("update_memory")),
    Operation("delete_memory", "DELETE", "/memories/{memory_id}", lambda c, i: c.service.delete(c.agent, i["memory_id"]),
              status_code=204, scope="write", params=(MEMORY_ID,),
              client=("forget",), mcp=writes("forget", "amp_forget")),
    Operation("rollback_memory", "POST", "/memories/{memory_id}/rollback",
              lambda c, i: c.service.rollback(c.agent, i["memory_id"], i["body"].to_version,
                                              expected_version=i["if_match"], may_read=c.may_read,
                                              admin_key=c.admin_key),
              request=RollbackRequest, response=MemoryCell, scope="write", idempotent=False,
              params=(MEMORY_ID, IF_MATCH), responses=WRITER_ONLY_204,
              client=("rollback",), mcp_opt_out="restoring a version is an operator's call, history in view"),
    Operation("restore_memory", "POST", "/memories/{memory_id}/restore",
              lambda c, i: c.service.restore(c.agent, i["memory_id"], expected_version=i["if_match"],
                                             may_read=c.may_read),
              response=MemoryCell, scope="write", idempotent=False,
              params=(MEMORY_ID, IF_MATCH), responses=WRITER_ONLY_204,
              client=("restore",), mcp_opt_out="bringing an archived memory back is a person's call (the inspector)"),
    Operation("record_outcome", "POST", "/memories/{memory_id}/outcome",
              _outcome,
              request=OutcomeRequest, response=MemoryCell, scope="write", idempotent=False, params=(MEMORY_ID,),
              tags=("playbooks",), responses=WRITER_ONLY_204,
              client=("record_outcome",), mcp=writes("record_outcome")),
    # Pinning twice changes nothing: both rows are safe to resend.
    Operation("pin_memory", "PUT", "/memories/{memory_id}/pin",
              lambda c, i: c.service.set_pinned(c.agent, i["memory_id"], True, may_read=c.may_read),
              response=MemoryCell, scope="write", params=(MEMORY_ID,), responses=WRITER_ONLY_204,
              client=("pin",), mcp=writes("pin")),
    Operation("unpin_memory", "DELETE", "/memories/{memory_id}/pin",
              lambda c, i: c.service.set_pinned(c.agent, i["memory_id"], False, may_read=c.may_read),
              response=MemoryCell, scope="write", params=(MEMORY_ID,), responses=WRITER_ONLY_204,
              client=("unpin",), mcp=writes("unpin")),
    Operation("memory_history", "GET", "/memories/{memory_id}/history",
              lambda c, i: HistoryResponse(results=c.service.history(c.agent, i["memory_id"])),
              response=HistoryResponse, params=(MEMORY_ID,),
              client=("history",), mcp=reads("memory_history")),
    # A lifecycle run only moves cells whose schedule says so: running it twice is harmless.
    Operation("run_lifecycle", "POST", "/admin/lifecycle/run",
              lambda c, i: c.service.run_lifecycle(as_of=i["body"].as_of if i["body"] else None),
              request=LifecycleRunRequest, body_required=False, response=LifecycleRunResponse, scope="admin",
              tags=("admin",),
              client=("run_lifecycle",), mcp_opt_out="admin: the server runs it on a schedule"),
    Operation("purge", "POST", "/admin/purge", _purge, request=PurgeRequest, body_required=False,
              response=PurgeResponse, scope="admin", tags=("admin",),
              client=("purge",), mcp_opt_out="admin: erases deleted cells for good"),
    *FILE_OPERATIONS,
)

BY_NAME: dict[str, Operation] = {op.name: op for op in OPERATIONS}


__all__ = [
    "Answer", "BY_NAME", "Context", "Inputs", "OPERATIONS", "Operation", "PREFIX", "Param", "metadata_filter", "query_pairs",
    "split_values",
]
