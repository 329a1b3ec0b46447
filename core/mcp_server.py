"""The MCP surface: every MCP client reads and writes the same memory as the HTTP API, as the
same identities, under the same access rule (needs the `mcp` extra).

Tools do not touch the store. Each builds the `Call` the clients build (`client/_calls.py`)
and hands it to a gateway:

- `ServiceGateway` runs it on a `MemoryService` through the in-process handlers (the routes'
  twins), as an identity resolved per request: the caller of the HTTP request that carried
  the MCP message (`/mcp` in `ampkit serve`), or a fixed one (`ampkit mcp` on a store URL).
  The key's scopes apply: a read tool needs `read`, a write tool `write`.
- `ClientGateway` sends it over HTTP to an ampkit server (`ampkit mcp --url`), which applies
  its own identity and rules.

So a tool answers exactly what the REST call would: the same cells, the same totals, the same
errors. An error is a tool result with `isError` set and the server's error envelope
`{"error": {"code", "message", "details"}}` as its text and structured content, never a
crashed session; a missing, deleted and forbidden id all give the one ACCESS_DENIED body.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Callable, Generator, Literal, Optional, Protocol, Sequence, cast

import anyio
import anyio.to_thread
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.server.fastmcp.tools import Tool
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import McpError
from mcp.types import CallToolResult, ErrorData, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import __version__ as ampkit_version
from .client import _calls as calls
from .client import _file_calls as fcalls
from .client._calls import Call
from .client._local import run_call
from .errors import (
    APIError,
    InternalError,
    MissingAgentId,
    NotFound,
    TransportError,
    Unavailable,
    ValidationFailed,
    validation_to_api_error,
)
from .mcp_http import CALLER_SCOPE_KEY, INVALID_PARAMS, envelope_text, non_finite_refusal
from .files.models import MAX_READ_LINES, FileContent, FileListResponse, FileWriteResult, GrepResponse
from .limits import MAX_OUTCOME_NOTE, MAX_PAGE_SIZE, MAX_SEARCH_LIMIT
from .models import ConsolidateResponse, HistoryResponse, ListResponse, MemoryCell, SearchResponse
from .operations import OPERATIONS
from .service import MemoryService

log = logging.getLogger("ampkit.mcp")

SERVER_NAME = "ampkit"
INSTRUCTIONS = (
    "Long-term memory shared with other agents and frameworks (AMP v0.1). Before answering, `recall` what "
    "is known about the user or task; `remember` durable facts, preferences, decisions and procedures as "
    "short self-contained statements; when something you remembered is no longer true, `supersede` it "
    "instead of adding a contradiction. You only ever see memories your identity may read."
)
# JSON-RPC error code the MCP spec gives for an unknown resource; every unreadable cell gets it.
RESOURCE_NOT_FOUND = -32002
INTERNAL_ERROR = -32603

MemoryKind = Literal["semantic", "episodic", "procedural"]
StatusName = Literal["active", "stale", "archived"]


# ---------------------------------------------------------------- results


class ForgetResult(BaseModel):
    """What `forget` did."""

    model_config = ConfigDict(extra="forbid")

    id: str
    status: Literal["deleted"] = "deleted"


class Remembered(BaseModel):
    """What `remember` stored. `cell` is the stored memory (or the existing one it repeats,
    when the owner's memory already holds the same text); null when your key may write but
    not read (it learns nothing about the memory, duplicates included: REST answers 204)."""

    model_config = ConfigDict(extra="forbid")

    stored: bool = True
    cell: Optional[MemoryCell] = None


class UpdateResult(BaseModel):
    """What `update_memory` did. `cell` is null when you may change this memory but not read it."""

    model_config = ConfigDict(extra="forbid")

    updated: bool = True
    cell: Optional[MemoryCell] = None


# ---------------------------------------------------------------- gateways


class Gateway(Protocol):
    """Where a tool's calls go, and who is calling."""

    async def send(self, ctx: Context, call: Call) -> Any: ...

    def agent_id(self, ctx: Context) -> Optional[str]: ...


class Caller(Protocol):
    """An identity with scopes (`ampkit.server.identity.Caller` is one)."""

    @property
    def agent_id(self) -> str: ...

    @property
    def scopes(self) -> frozenset[str]: ...

    @property
    def admin_key(self) -> bool: ...  # identified by a key with the admin scope

    def need(self, scope: str) -> str: ...




def caller_from_request(ctx: Context) -> Caller:
    """The caller of the HTTP request carrying this MCP message (set before the MCP app ran)."""
    request = ctx.request_context.request
    caller = getattr(request, "scope", {}).get(CALLER_SCOPE_KEY) if request is not None else None
    if caller is None:  # never reached through /mcp, whose identity check runs first
        raise MissingAgentId("no caller identity on this MCP request")
    return caller


# What GET /spec says about identity when it is run through MCP.
MCP_AUTH = {"mode": "mcp", "header": None}


@dataclass
class ServiceGateway:
    """Runs calls on a service in worker threads, as the identity `caller_for(ctx)` names,
    holding the scope the operation's row requires."""

    service: MemoryService
    caller_for: Callable[[Context], Caller]

    async def send(self, ctx: Context, call: Call) -> Any:
        caller = self.caller_for(ctx)
        agent = caller.need(call.operation.scope or "")
        for scope in call.operation.extra_scopes:  # consolidation reads as well as writes
            caller.need(scope)
        return await anyio.to_thread.run_sync(run_call, self.service, agent, call, MCP_AUTH, caller.scopes,
                                              caller.admin_key)

    def agent_id(self, ctx: Context) -> Optional[str]:
        return self.caller_for(ctx).agent_id


@dataclass
class ClientGateway:
    """Sends calls through a client transport (HTTP to an ampkit server)."""

    transport: Any  # AsyncHTTPTransport or AsyncLocalTransport: `async send(call)`
    agent: Optional[str] = None

    async def send(self, ctx: Context, call: Call) -> Any:
        return await self.transport.send(call)

    def agent_id(self, ctx: Context) -> Optional[str]:
        return self.agent


def fixed_caller(caller: Caller) -> Callable[[Context], Caller]:
    return lambda ctx: caller


# ---------------------------------------------------------------- errors


def as_api_error(exc: BaseException) -> APIError:
    """The wire error a failed tool reports: ours as raised, argument errors as 422, anything
    unexpected as 500 (logged here; its text stays in the server log)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, APIError):
            return seen
        if isinstance(seen, ValidationError):
            return validation_to_api_error([dict(e) for e in seen.errors()])
        if isinstance(seen, TransportError):
            return Unavailable(f"cannot reach the ampkit server: {seen}")
        # FastMCP re-raises with and without `from`: follow both links.
        seen = seen.__cause__ or seen.__context__
    log.error("MCP tool failed", exc_info=exc)
    return InternalError("internal server error; see the server log")


def tool_error(err: APIError) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=envelope_text(err))],
                          structuredContent=err.envelope(), isError=True)


class AmpkitMCP(FastMCP):
    """FastMCP whose tool and resource failures carry the server's error envelope; its tools
    reach the store through `gateway` (set by `build_mcp_server`)."""

    gateway: Gateway

    async def run_stdio_async(self) -> None:
        """FastMCP's stdio loop, with requests holding NaN or an infinity answered by
        `non_finite_refusal` before the SDK re-encodes them (over HTTP `MCPEndpoint` does it)."""
        from mcp.server.stdio import stdio_server
        from mcp.shared.message import SessionMessage
        from mcp.types import JSONRPCMessage

        async with stdio_server() as (read_stream, write_stream):
            checked_send, checked_read = anyio.create_memory_object_stream[Any](0)

            async def check() -> None:
                async with checked_send, read_stream:
                    async for item in read_stream:
                        refusal = None
                        if isinstance(item, SessionMessage):
                            refusal = non_finite_refusal(item.message.model_dump(by_alias=True, exclude_none=True))
                        if refusal is None:
                            await checked_send.send(item)
                        else:
                            await write_stream.send(SessionMessage(JSONRPCMessage.model_validate(refusal)))

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(check)
                await self._mcp_server.run(checked_read, write_stream, self._mcp_server.create_initialization_options())

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        if self._tool_manager.get_tool(name) is None:
            return tool_error(NotFound(f"no tool {name!r}", {"tool": name}))
        try:
            result = await super().call_tool(name, arguments)
        except ToolError as exc:
            return tool_error(as_api_error(exc.__cause__ or exc))
        if isinstance(result, tuple):
            # (content, structured), already validated by the tool's pydantic output model:
            # answered as a finished result, the SDK does not validate it again with
            # jsonschema, which re-checks the whole schema on every call at a real CPU cost.
            content, structured = result
            return CallToolResult(content=list(content), structuredContent=structured, isError=False)
        return result

    async def read_resource(self, uri: Any) -> Any:
        try:
            return await super().read_resource(uri)
        except McpError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes a JSON-RPC error with the envelope
            err = as_api_error(exc) if _has_api_cause(exc) else NotFound(f"no resource {uri}", {"uri": str(uri)})
            code = RESOURCE_NOT_FOUND if err.code in ("ACCESS_DENIED", "NOT_FOUND") else (
                INVALID_PARAMS if err.status < 500 else INTERNAL_ERROR)
            raise McpError(ErrorData(code=code, message=err.message, data=err.envelope())) from None


def _has_api_cause(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (APIError, ValidationError, TransportError)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


# ---------------------------------------------------------------- the server


def _drop_none(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


async def _drive(gateway: Gateway, ctx: Context, flow: Generator[Any, Any, Any]) -> Any:
    """Run a multi-step flow from `_calls` (forget, supersede) through the gateway."""
    try:
        item = next(flow)
        while True:
            item = flow.send(await gateway.send(ctx, item))
    except StopIteration as stop:
        return stop.value


READ = ToolAnnotations(readOnlyHint=True, openWorldHint=False)
WRITE = ToolAnnotations(readOnlyHint=False, destructiveHint=False, openWorldHint=False)
DESTRUCTIVE = ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True, openWorldHint=False)

MemoryId = Annotated[str, Field(description="A memory id, e.g. mem_01J9Z3K8Q4V7X2N5B6C8D0E1F2")]
OwnerId = Annotated[Optional[str], Field(description="Whose memory: a user or agent id. Default: yourself, the calling agent.")]
Importance = Annotated[Optional[float], Field(ge=0.0, le=1.0, description="0..1, how much this matters (default 0.5)")]
Metadata = Annotated[Optional[dict[str, Any]], Field(description="Free-form JSON object stored with the text")]
SessionId = Annotated[Optional[str], Field(description="The conversation or run this belongs to")]
Patterns = Annotated[Optional[list[str]], Field(description="Agent id patterns (globs such as 'team-*')")]
FilePathArg = Annotated[str, Field(description="A file in the memory folder, e.g. AGENTS.md or skills/release-notes/SKILL.md")]
AsOf = Annotated[Optional[datetime], Field(description="Read the past: the memory as it was at this time (ISO 8601)")]


def build_mcp_server(gateway: Gateway, *, host: str = "127.0.0.1", max_request_bytes: Optional[int] = None) -> AmpkitMCP:
    """The MCP server (tools, resources, prompt) over `gateway`. Serve it over stdio with
    `run_stdio_async()`, or over HTTP with `mount_streamable_http`."""
    options: dict[str, Any] = {}
    if max_request_bytes is not None:
        options["max_request_body_size"] = max_request_bytes
    mcp = AmpkitMCP(
        SERVER_NAME, instructions=INSTRUCTIONS, log_level="WARNING", host=host,
        transport_security=_transport_security(host), tools=_tools(), **options,
    )
    mcp.gateway = gateway
    # FastMCP (1.x) takes no version, and the low-level server then reports the SDK's own in
    # `serverInfo`; a client should see which ampkit it talks to.
    mcp._mcp_server.version = ampkit_version

    # ------------------------------------------------------------ resources
    @mcp.resource("amp://memories/{id}", name="memory", mime_type="application/json",
                  description="One memory cell as JSON (AMP v0.1 wire format)")
    async def memory_resource(id: str, ctx: Context) -> str:
        cell: MemoryCell = await gateway.send(ctx, calls.get(id))
        return cell.model_dump_json()

    @mcp.resource("amp://memories/{id}/history", name="memory-history", mime_type="application/json",
                  description="Every change to one memory cell, as JSON")
    async def memory_history_resource(id: str, ctx: Context) -> str:
        entries = await gateway.send(ctx, calls.history(id))
        return HistoryResponse(results=entries).model_dump_json()

    # ------------------------------------------------------------ prompt
    @mcp.prompt(name="remember", title="Remember what matters from this conversation",
                description="Reflect on the conversation so far and store what should be remembered")
    def remember_prompt(
        focus: Annotated[Optional[str], Field(description="What to pay most attention to (optional)")] = None,
        owner_id: Annotated[Optional[str], Field(description="Whose memory to store it in (optional)")] = None,
    ) -> str:
        return remember_request(focus, owner_id)

    return mcp


def _gateway(ctx: Context) -> Gateway:
    """The gateway of the server a tool call came to (tools are shared, see `_tools`)."""
    return cast(AmpkitMCP, ctx.fastmcp).gateway


def _owner_or_self(ctx: Context, owner_id: Optional[str]) -> tuple[str, Optional[str]]:
    if owner_id:
        return owner_id, None
    agent = _gateway(ctx).agent_id(ctx)
    if not agent:
        raise ValidationFailed("owner_id is required: this MCP server does not know which agent it acts as "
                               "(start `ampkit mcp` with --agent-id, or pass owner_id)", {"field": "owner_id"})
    return agent, "agent"


@functools.cache
def _tools() -> list[Tool]:
    """The tools, built once per process and shared by every server: building their argument
    and output models is slow, and every app (and every test server) paid it again. A
    tool finds its server's gateway through its context (`_gateway`)."""
    built: list[Tool] = []

    def tool(annotations: ToolAnnotations) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            built.append(Tool.from_function(fn, annotations=annotations))
            return fn
        return register

    @tool(annotations=WRITE)
    async def remember(
        ctx: Context,
        text: Annotated[str, Field(description="What to remember: one short, self-contained statement that makes sense on its own later")],
        type: Annotated[MemoryKind, Field(description="semantic: a fact or preference; episodic: something that happened; procedural: how to do something")] = "semantic",
        owner_id: OwnerId = None,
        importance: Importance = None,
        metadata: Metadata = None,
        session_id: SessionId = None,
        readable_by: Annotated[Optional[list[str]], Field(description="Other agents that may read it (globs such as 'team-*'); by default only you and the owner")] = None,
        writable_by: Annotated[Optional[list[str]], Field(description="Other agents that may change it (globs); being able to change it does not let them read it")] = None,
        public: Annotated[Optional[bool], Field(description="true: every agent may read it")] = None,
        expires_at: Annotated[Optional[datetime], Field(description="When it stops being true (ISO 8601); it is not recalled after that")] = None,
    ) -> Remembered:
        """Store a new memory in the shared long-term memory. Returns the stored memory with its
        id (`cell`; null if your key may write but not read)."""
        owner, owner_type = _owner_or_self(ctx, owner_id)
        fields = _drop_none(owner_type=owner_type, importance=importance, metadata=metadata, session_id=session_id,
                            readable_by=readable_by, writable_by=writable_by, public=public, expires_at=expires_at)
        return Remembered(cell=await _gateway(ctx).send(ctx, calls.remember(text, owner_id=owner, type=type, **fields)))

    @tool(annotations=READ)
    async def recall(
        ctx: Context,
        query: Annotated[str, Field(description="What you want to know, in natural language or keywords")],
        limit: Annotated[int, Field(ge=1, le=MAX_SEARCH_LIMIT, description="At most this many memories, best first")] = 10,
        owner_id: Annotated[Optional[str], Field(description="Only memories of this owner (user or agent id)")] = None,
        types: Annotated[Optional[list[MemoryKind]], Field(description="Only these kinds")] = None,
        session_id: Annotated[Optional[str], Field(description="Only memories of this conversation or run")] = None,
        include_stale: Annotated[bool, Field(description="Also memories not used for a long time")] = False,
        metadata: Annotated[Optional[dict[str, Any]], Field(description="Only memories whose metadata has these key/value pairs")] = None,
        as_of: AsOf = None,
        min_score: Annotated[float, Field(ge=0.0, le=1.0, description="Only memories scoring at least this (0..1); none when nothing is that relevant")] = 0.0,
        include_files: Annotated[bool, Field(description="Also memory files (AGENTS.md, skills), which are left out by default")] = False,
    ) -> SearchResponse:
        """Search the shared memory for what is relevant to a query (hybrid keyword and meaning search).
        Returns the best matches with a relevance score, and how many memories matched in all."""
        call = calls.search(query, owner_id=owner_id, types=types, limit=limit, min_score=min_score or None,
                            include_files=include_files,
                            **_drop_none(session_id=session_id, metadata=metadata, include_stale=include_stale or None,
                                         as_of=as_of))
        return await _gateway(ctx).send(ctx, calls.with_decode(call, SearchResponse.model_validate))

    @tool(annotations=READ)
    async def get_memory(ctx: Context, id: MemoryId, as_of: AsOf = None) -> MemoryCell:
        """Read one memory by id (also counts as a use, which keeps it fresh; a read of the
        past with as_of does not)."""
        return await _gateway(ctx).send(ctx, calls.get(id, as_of=as_of))

    @tool(annotations=WRITE)
    async def update_memory(
        ctx: Context,
        id: MemoryId,
        text: Annotated[Optional[str], Field(description="New text (to replace a fact that changed, prefer supersede, which keeps the old one in history)")] = None,
        metadata: Annotated[Optional[dict[str, Any]], Field(description="Replaces the metadata object")] = None,
        importance: Importance = None,
        confidence: Annotated[Optional[float], Field(ge=0.0, le=1.0, description="0..1, how sure this is")] = None,
        readable_by: Patterns = None,
        writable_by: Patterns = None,
        public: Optional[bool] = None,
        expires_at: Annotated[Optional[datetime], Field(description="When it stops being true (ISO 8601)")] = None,
        session_id: SessionId = None,
        expected_version: Annotated[Optional[int], Field(description="Only apply if the memory is still at this lifecycle.version")] = None,
    ) -> UpdateResult:
        """Change fields of a memory you may write. Fields you leave out stay as they are."""
        changes = _drop_none(text=text, metadata=metadata, importance=importance, confidence=confidence,
                             readable_by=readable_by, writable_by=writable_by, public=public,
                             expires_at=expires_at, session_id=session_id)
        cell = await _gateway(ctx).send(ctx, calls.update(id, expected_version=expected_version, **changes))
        return UpdateResult(cell=cell)

    @tool(annotations=DESTRUCTIVE)
    async def forget(ctx: Context, id: MemoryId) -> ForgetResult:
        """Delete a memory (archived, then deleted; it is never recalled again)."""
        await _drive(_gateway(ctx), ctx, calls.forget_flow(id))
        return ForgetResult(id=id)

    @tool(annotations=WRITE)
    async def supersede(
        ctx: Context,
        id: Annotated[str, Field(description="The id of the memory that is no longer true")],
        text: Annotated[str, Field(description="What is true now")],
        importance: Importance = None,
        metadata: Metadata = None,
    ) -> MemoryCell:
        """Replace a memory that is no longer true with a new one. The old one stays in history,
        linked to its replacement, and is no longer recalled. Returns the new memory."""
        return await _drive(_gateway(ctx), ctx, calls.supersede_flow(id, text, _drop_none(importance=importance, metadata=metadata)))

    @tool(annotations=WRITE)
    async def pin(ctx: Context, id: MemoryId) -> UpdateResult:
        """Pin a memory that must never be missed (a standing instruction, a hard constraint):
        every recall of its owner's memories returns it first, whatever the query."""
        return UpdateResult(cell=await _gateway(ctx).send(ctx, calls.pin(id)))

    @tool(annotations=WRITE)
    async def unpin(ctx: Context, id: MemoryId) -> UpdateResult:
        """Unpin a memory: recall ranks it like any other again."""
        return UpdateResult(cell=await _gateway(ctx).send(ctx, calls.unpin(id)))

    @tool(annotations=READ)
    async def list_memories(
        ctx: Context,
        owner_id: Annotated[Optional[str], Field(description="Only memories of this owner")] = None,
        types: Annotated[Optional[list[MemoryKind]], Field(description="Only these kinds")] = None,
        status: Annotated[Optional[list[StatusName]], Field(description="Only these states (default: active)")] = None,
        session_id: Annotated[Optional[str], Field(description="Only memories of this conversation or run")] = None,
        include_stale: bool = False,
        include_superseded: Annotated[bool, Field(description="Also memories replaced by newer ones")] = False,
        limit: Annotated[int, Field(ge=1, le=MAX_PAGE_SIZE, description="Page size")] = 20,
        cursor: Annotated[Optional[str], Field(description="next_cursor from the previous page")] = None,
        as_of: AsOf = None,
    ) -> ListResponse:
        """List memories page by page, oldest first. Pass next_cursor back to get the next page;
        total is how many match in all."""
        call = calls.list_page(owner_id=owner_id, types=types, status=status, session_id=session_id,
                               include_stale=include_stale, include_superseded=include_superseded,
                               page_size=limit, cursor=cursor, as_of=as_of)
        return await _gateway(ctx).send(ctx, call)

    @tool(annotations=READ)
    async def memory_history(ctx: Context, id: MemoryId) -> HistoryResponse:
        """Every change to a memory: who created, changed, superseded or deleted it, and when."""
        return HistoryResponse(results=await _gateway(ctx).send(ctx, calls.history(id)))

    # ------------------------------------------------------------ memory files (docs/files.md)
    @tool(annotations=READ)
    async def ls_files(
        ctx: Context,
        owner_id: OwnerId = None,
        glob: Annotated[Optional[str], Field(description="Only paths matching this glob ('skills/**', '*.md')")] = None,
    ) -> FileListResponse:
        """List the memory folder: AGENTS.md (your instructions), skills/*/SKILL.md, subagents/,
        tools.json, notes, and read-only sessions/*.md (past conversations) and proposals.md."""
        owner, _ = _owner_or_self(ctx, owner_id)
        return await _gateway(ctx).send(ctx, fcalls.list_files(owner, glob))

    @tool(annotations=READ)
    async def read_file(
        ctx: Context,
        path: FilePathArg,
        owner_id: OwnerId = None,
        offset: Annotated[int, Field(ge=0, description="First line to return, 0-based")] = 0,
        limit: Annotated[int, Field(ge=1, le=MAX_READ_LINES, description="How many lines")] = 2000,
    ) -> FileContent:
        """Read lines of a memory file (with their numbers: start_line, end_line, total_lines)."""
        owner, _ = _owner_or_self(ctx, owner_id)
        return await _gateway(ctx).send(ctx, fcalls.read_file(path, owner, offset, limit))

    @tool(annotations=READ)
    async def grep_files(
        ctx: Context,
        pattern: Annotated[str, Field(description="A literal string (not a regular expression)")],
        owner_id: OwnerId = None,
        glob: Annotated[Optional[str], Field(description="Only files matching this glob")] = None,
    ) -> GrepResponse:
        """Find the lines of memory files (past sessions included) that contain a string."""
        owner, _ = _owner_or_self(ctx, owner_id)
        return await _gateway(ctx).send(ctx, fcalls.grep_files(pattern, owner, glob))

    @tool(annotations=WRITE)
    async def write_file(
        ctx: Context,
        path: FilePathArg,
        content: Annotated[str, Field(description="The whole new text of the file")],
        owner_id: OwnerId = None,
        reason: Annotated[Optional[str], Field(description="Why, for the person who approves it")] = None,
    ) -> FileWriteResult:
        """Create or replace a memory file. It is validated (SKILL.md frontmatter, tools.json...);
        unless the folder is in yolo mode it becomes a proposal a person must approve (status
        proposed): the file does not change until then."""
        owner, _ = _owner_or_self(ctx, owner_id)
        return await _gateway(ctx).send(ctx, fcalls.write_file(path, content, owner, reason))

    @tool(annotations=WRITE)
    async def edit_file(
        ctx: Context,
        path: FilePathArg,
        old: Annotated[str, Field(description="The exact text to replace (copy it from read_file, unique in the file)")],
        new: Annotated[str, Field(description="The replacement")],
        owner_id: OwnerId = None,
        replace_all: Annotated[bool, Field(description="Replace every occurrence of old")] = False,
        reason: Annotated[Optional[str], Field(description="Why, for the person who approves it")] = None,
    ) -> FileWriteResult:
        """Replace an exact string in a memory file (e.g. a rule in AGENTS.md the user corrected).
        Validated, and a proposal awaiting approval unless the folder is in yolo mode."""
        owner, _ = _owner_or_self(ctx, owner_id)
        return await _gateway(ctx).send(ctx, fcalls.edit_file(path, old, new, owner, replace_all, reason))

    # ------------------------------------------------------------ learning (docs/consolidation.md)
    @tool(annotations=WRITE)
    async def record_outcome(
        ctx: Context,
        id: Annotated[str, Field(description="The id of the playbook (a procedural memory) you followed")],
        success: Annotated[bool, Field(description="Did following it work?")],
        note: Annotated[Optional[str], Field(max_length=MAX_OUTCOME_NOTE, description="What happened, briefly (especially on failure)")] = None,
    ) -> UpdateResult:
        """Report whether following a playbook worked. Outcomes rank playbooks in recall and tell
        consolidation which ones to refine."""
        return UpdateResult(cell=await _gateway(ctx).send(ctx, calls.record_outcome(id, success, note)))

    @tool(annotations=WRITE)
    async def consolidate(
        ctx: Context,
        owner_id: OwnerId = None,
        session_id: Annotated[Optional[str], Field(description="Only this conversation's episodes")] = None,
        since: Annotated[Optional[datetime], Field(description="Only episodes from this time on (ISO 8601)")] = None,
        until: Annotated[Optional[datetime], Field(description="Only episodes before this time (ISO 8601)")] = None,
        playbooks: Annotated[Literal["propose", "apply"], Field(description="propose: playbook changes are returned for approval, not written")] = "propose",
        dry_run: Annotated[bool, Field(description="Decide everything, write nothing")] = False,
        files: Annotated[Literal["off", "propose"], Field(description="propose: also propose an AGENTS.md edit, which a person approves")] = "off",
    ) -> ConsolidateResponse:
        """Distil recorded episodes (what happened in conversations) into lasting facts and
        playbooks, adding, updating or superseding memories. Needs a model configured on the
        server; returns every decision with its reason."""
        owner, _ = _owner_or_self(ctx, owner_id)
        return await _gateway(ctx).send(ctx, calls.consolidate(owner, session_id=session_id, since=since, until=until,
                                                         playbooks=playbooks, dry_run=dry_run, files=files))

    # ------------------------------------------------------------ AMP's amp-mcp names
    @tool(annotations=WRITE)
    async def amp_remember(
        ctx: Context,
        content: Annotated[str, Field(description="What to remember")],
        owner_id: Annotated[str, Field(description="Whose memory: a user or agent id")],
        type: MemoryKind = "semantic",
        importance: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5,
        readable_by: Patterns = None,
    ) -> Remembered:
        """AMP amp-mcp compatible: store a memory (same as `remember`)."""
        fields = _drop_none(importance=importance, readable_by=readable_by)
        return Remembered(cell=await _gateway(ctx).send(ctx, calls.remember(content, owner_id=owner_id, type=type, **fields)))

    @tool(annotations=READ)
    async def amp_recall(
        ctx: Context,
        query: str,
        owner_id: Annotated[str, Field(description="Whose memories to search")],
        limit: Annotated[int, Field(ge=1, le=MAX_SEARCH_LIMIT)] = 5,
        include_stale: bool = False,
    ) -> SearchResponse:
        """AMP amp-mcp compatible: search one owner's memories (same as `recall`)."""
        call = calls.search(query, owner_id=owner_id, limit=limit, **_drop_none(include_stale=include_stale or None))
        return await _gateway(ctx).send(ctx, calls.with_decode(call, SearchResponse.model_validate))

    @tool(annotations=DESTRUCTIVE)
    async def amp_forget(
        ctx: Context,
        memory_id: MemoryId,
        owner_id: Annotated[Optional[str], Field(description="Accepted for compatibility; your identity and the memory's access policy decide")] = None,
    ) -> ForgetResult:
        """AMP amp-mcp compatible: delete a memory (same as `forget`)."""
        await _drive(_gateway(ctx), ctx, calls.forget_flow(memory_id))
        return ForgetResult(id=memory_id)

    @tool(annotations=READ)
    async def amp_list_memories(
        ctx: Context,
        owner_id: Annotated[str, Field(description="Whose memories to list")],
        type: Optional[MemoryKind] = None,
        limit: Annotated[int, Field(ge=1, le=MAX_PAGE_SIZE)] = 20,
    ) -> ListResponse:
        """AMP amp-mcp compatible: list one owner's memories (same as `list_memories`)."""
        call = calls.list_page(owner_id=owner_id, types=[type] if type else None, page_size=limit)
        return await _gateway(ctx).send(ctx, call)

    return built


def remember_request(focus: Optional[str] = None, owner_id: Optional[str] = None) -> str:
    """The "/remember" request: reflect on the conversation and store what matters."""
    lines = [
        "Reflect on our conversation so far and decide what is worth remembering beyond it.",
        "",
        "1. List the durable facts, preferences, decisions, commitments and working procedures that came up.",
        "   Skip small talk, one-off details and anything already obvious from context.",
        "2. For each, call `recall` first: if it is already remembered, do nothing; if a remembered one is",
        "   no longer true, call `supersede` with its id and the new statement.",
        "3. Otherwise call `remember` with one short, self-contained statement (type semantic for facts and",
        "   preferences, episodic for events, procedural for how-tos) and an importance between 0 and 1.",
        "4. Finish with a one-line summary of what you stored, changed or skipped.",
    ]
    if owner_id:
        lines.insert(1, f"Store these memories with owner_id {owner_id!r}.")
    if focus:
        lines.insert(1, f"Pay most attention to: {focus}")
    return "\n".join(lines)


def _transport_security(host: str) -> TransportSecuritySettings:
    """Off: `ampkit serve` checks Host and Origin for every route, `/mcp` included, in one
    place (`server.hosts.HostAllowList`, with the allow-list setting); the SDK's own check
    would refuse names that setting allows."""
    return TransportSecuritySettings(enable_dns_rebinding_protection=False)


# From the operations table: every row names its tools (or why it has none).
TOOL_NAMES: Sequence[str] = tuple(tool.name for op in OPERATIONS for tool in op.mcp)
READ_TOOLS: Sequence[str] = tuple(tool.name for op in OPERATIONS for tool in op.mcp if tool.read_only)
"""The tools that only read: the differential non-interference test calls these."""

__all__ = [
    "AmpkitMCP", "CALLER_SCOPE_KEY", "ClientGateway", "ForgetResult",
    "Gateway", "READ_TOOLS", "Remembered", "ServiceGateway", "TOOL_NAMES", "UpdateResult", "as_api_error", "build_mcp_server",
    "caller_from_request", "fixed_caller", "remember_request", "tool_error",
]
