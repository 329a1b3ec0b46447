"""LangChain / LangGraph adapters: a LangGraph `BaseStore`, a middleware that brings shared
memory into every model call, a chat message history, a retriever, and remember/recall
tools, all on one ampkit client.

    import ampkit
    from ampkit.adapters.langchain import AmpkitStore, SharedMemoryMiddleware, memory_tools

    client = ampkit.connect("http://127.0.0.1:8765/amp/v1", agent_id="lc-agent")
    agent = create_agent(model, tools=memory_tools(client, owner_id="ada"),
                         middleware=[SharedMemoryMiddleware(client, owner_id="ada")],
                         store=AmpkitStore(client, owner_id="ada"))

Mapping (see docs/adapters.md): a store item `(namespace, key) -> value` is one semantic
cell, owned by the user the namespace names (`("memories", user_id)`), with the cell key
`langgraph:[...namespace, key]` so the server keeps one live item per key; the value dict is
kept whole in `metadata.langgraph_value`, the searchable text is the value's `index` fields
(or its "text"/"content"/"memory"/"data" field, or the JSON); the namespace joined by "." is
the scope tag. Chat messages are episodic cells in the session. `delete`/`clear` forget only
cells this agent created (or owns).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Optional, Sequence, Union

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ToolCallRequest
from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.documents import Document
from langchain_core.messages import (
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)
from langchain_core.retrievers import BaseRetriever
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    get_text_at_path,
)
from pydantic import ConfigDict, PrivateAttr

from ampkit import AccessDenied, AmpkitError, APIError, Conflict, MemoryCell
from ampkit.limits import DEFAULT_MIN_SCORE

from ._filters import item_matches, namespace_matches
from ._instructions import ainstructions, instructions, with_instructions
from ._mapping import (
    FRAMEWORK_TAG,
    LONG_TERM_TYPES,
    MAX_SEARCH,
    SCOPE_TAG,
    Clients,
    Sharing,
    call,
    forget_scope,
    render,
    run_async,
    run_sync,
    search_text,
    tags,
)

FRAMEWORK = "langgraph"
KEY_TAG = "langgraph_key"
VALUE_TAG = "langgraph_value"
TTL_TAG = "langgraph_ttl"
MESSAGE_TAG = "langchain_message"
TEXT_FIELDS = ("text", "content", "memory", "data")


# ---------------------------------------------------------------- LangGraph BaseStore


NAMESPACE_PAGE = 200  # namespaces per request (the server's largest page)


def namespace_scope(namespace: Sequence[str]) -> str:
    # LangGraph refuses "." inside labels, so the join is reversible.
    return FRAMEWORK + ":" + ".".join(namespace)


def prefix_tags(namespace: Sequence[str]) -> dict[str, str]:
    """`("a", "b")` -> `{"langgraph_ns_1": "a", "langgraph_ns_2": "a.b"}`: one equality tag per
    prefix, so that the server itself filters a search or a listing by namespace prefix."""
    return {f"langgraph_ns_{depth}": ".".join(namespace[:depth]) for depth in range(1, len(namespace) + 1)}


def prefix_filter(prefix: Sequence[str]) -> dict[str, str]:
    if not prefix:
        return {FRAMEWORK_TAG: FRAMEWORK}
    return {f"langgraph_ns_{len(prefix)}": ".".join(prefix)}


def cell_key(namespace: Sequence[str], key: str) -> str:
    """The cell key (`identity.key`) of a store item: unique among the owner's live cells,
    so the server itself keeps one item per (owner, namespace, key)."""
    return FRAMEWORK + ":" + json.dumps([*namespace, key], ensure_ascii=False, separators=(",", ":"))


def _namespace_of(cell: MemoryCell) -> tuple[str, ...]:
    scope = cell.content.metadata[SCOPE_TAG]
    return tuple(scope[len(FRAMEWORK) + 1:].split("."))


def item_text(value: dict[str, Any], index: Optional[Sequence[str]], key: str) -> str:
    """The cell text the server indexes for search."""
    if index:
        parts = [t for path in index for t in get_text_at_path(value, path)]
    else:
        parts = [value[f] for f in TEXT_FIELDS if isinstance(value.get(f), str)][:1]
        parts = parts or [json.dumps(value, sort_keys=True, default=str)]
    text = " ".join(p for p in parts if p and p.strip())
    return text if text.strip() else key


def _item(cell: MemoryCell, score: Optional[float] = None, searched: bool = False) -> Item:
    meta = cell.content.metadata
    fields = dict(
        value=meta.get(VALUE_TAG, {"text": cell.content.text}),
        key=meta.get(KEY_TAG, cell.id),
        namespace=_namespace_of(cell),
        created_at=cell.lifecycle.created_at,
        updated_at=cell.lifecycle.last_updated_at or cell.lifecycle.created_at,
    )
    return SearchItem(**fields, score=score) if searched else Item(**fields)


def _expiry(ttl_minutes: Optional[float]) -> Optional[datetime]:
    return None if ttl_minutes is None else datetime.now(timezone.utc) + timedelta(minutes=ttl_minutes)


OwnerRule = Union[int, Callable[[tuple[str, ...]], Optional[str]]]


class AmpkitStore(BaseStore):
    """LangGraph long-term memory store backed by ampkit: one item is one semantic cell.

    Whose memory an item is (its `owner_id`) comes from its namespace: by default the label
    at index 1, so `("memories", user_id)` and LangMem's `("memories", "{langgraph_user_id}")`
    are the user's. `owner=` changes the rule (another index, or a function of the namespace
    returning the owner or None); `owner_id=` fixes one owner for every namespace. A namespace
    the rule finds no owner in belongs to the client's agent.

    - `put` of a new key creates the cell with a cell key, so the server keeps one live item
      per (owner, namespace, key) even when agents race; `put` of an existing key updates that
      cell under the server's write rule (owner, creator, `writable_by`). A refused put raises
      `ampkit.AccessDenied` with a message for the model (see `RefusedWriteMiddleware`).
    - `delete` forgets the item only when this agent created it (or is its owner); an item a
      teammate wrote stays, and the refusal is an `AccessDenied` too.
    - `ttl` (minutes) becomes the cell's `expires_at`; reads with `refresh_ttl` push it on.
    - `search` with a query is the server's ranked search inside the namespace prefix; without
      one it pages through the prefix in creation order. A value `filter` is applied to what
      the server returns (the best 100 hits of a ranked search). `batch` runs on the sync
      client, `abatch` on the async one."""

    supports_ttl = True

    def __init__(self, client: Any, *, owner_id: Optional[str] = None, owner: OwnerRule = 1,
                 sharing: Sharing = Sharing(), ttl_config: Optional[TTLConfig] = None):
        self.clients = Clients(client)
        self.owner_id = owner_id
        self.owner = owner
        self.sharing = sharing
        self.ttl_config = ttl_config

    def owner_of(self, namespace: Sequence[str]) -> Optional[str]:
        """The owner of a namespace's items, or None when the rule finds none in it."""
        if self.owner_id is not None:
            return self.owner_id
        if callable(self.owner):
            return self.owner(tuple(namespace))
        return namespace[self.owner] if -len(namespace) <= self.owner < len(namespace) else None

    def _writer_owner(self, namespace: Sequence[str]) -> str:
        return self.owner_of(namespace) or self.clients.agent_id

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return [run_sync(self.clients.sync, self._plan(op)) for op in ops]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return [await run_async(self.clients.aio, self._plan(op)) for op in ops]

    # -- one generator per op (see _mapping.run_sync / run_async)
    def _plan(self, op: Op):
        if isinstance(op, GetOp):
            cell = yield from self._find(op.namespace, op.key)
            if cell is not None and op.refresh_ttl:
                yield from self._refresh([cell])
            return None if cell is None else _item(cell)
        if isinstance(op, PutOp):
            return (yield from self._put(op))
        if isinstance(op, SearchOp):
            return (yield from self._search(op))
        if isinstance(op, ListNamespacesOp):
            return (yield from self._list_namespaces(op))
        raise TypeError(f"unknown store op {type(op).__name__}")

    def _find(self, namespace: tuple[str, ...], key: str):
        owner = self._writer_owner(namespace)
        cells = yield call("list", owner_id=owner, limit=1,
                           metadata={SCOPE_TAG: namespace_scope(namespace), KEY_TAG: key})
        return cells[0] if cells else None

    def _refresh(self, cells: Sequence[MemoryCell]):
        """Push the expiry of items stored with a ttl; an item this agent may not write keeps its own."""
        for cell in cells:
            ttl = cell.content.metadata.get(TTL_TAG)
            if ttl is None:
                continue
            try:
                yield call("update", cell.id, expires_at=_expiry(ttl))
            except AmpkitError:
                pass

    def _put(self, op: PutOp):
        where = f"{'/'.join(op.namespace)}/{op.key}"
        if op.value is None:
            return (yield from self._delete(op.namespace, op.key, where))
        value = dict(op.value)
        fields = dict(
            text=item_text(value, op.index or None, op.key),
            metadata=tags(FRAMEWORK, namespace_scope(op.namespace), **prefix_tags(op.namespace),
                          **{KEY_TAG: op.key, VALUE_TAG: value, TTL_TAG: op.ttl}),
            expires_at=_expiry(op.ttl),
        )
        existing = yield from self._find(op.namespace, op.key)
        if existing is None:
            try:
                yield call("remember", owner_id=self._writer_owner(op.namespace), key=cell_key(op.namespace, op.key),
                           **fields, **self.sharing.fields())
                return None
            except Conflict:
                # Another writer created the key since the look-up, or holds it unseen by this agent.
                existing = yield from self._find(op.namespace, op.key)
                if existing is None:
                    raise AccessDenied(f"memory item {where} belongs to another agent and is not shared with this one; "
                                       "it was not changed") from None
        try:
            yield call("update", existing.id, **fields)
        except AccessDenied:
            raise AccessDenied(f"memory item {where} was written by {existing.identity.created_by} and this agent may "
                               "read but not change it (sharing needs writable_by); it was not changed") from None
        return None

    def _delete(self, namespace: tuple[str, ...], key: str, where: str):
        existing = yield from self._find(namespace, key)
        if existing is None:
            return None
        agent = self.clients.agent_id
        if agent not in (existing.identity.created_by, existing.identity.owner_id):
            raise AccessDenied(f"memory item {where} was written by {existing.identity.created_by}; only its writer "
                               "or its owner may delete it; it was kept")
        yield call("forget", existing.id)
        return None

    def _search(self, op: SearchOp):
        owner = self.owner_of(op.namespace_prefix)
        in_prefix = prefix_filter(op.namespace_prefix)
        wanted = op.offset + op.limit
        if op.query:
            # A value filter runs here, after ranking: then rank the widest window the server gives.
            window = MAX_SEARCH if op.filter else min(MAX_SEARCH, wanted)
            hits = yield call("search", op.query, owner_id=owner, limit=window, metadata=in_prefix)
            scored = [(h.cell, h.score) for h in hits if item_matches(_value(h.cell), op.filter)]
        else:
            # Page through the prefix in the store (creation order); with a value filter, read
            # a doubling window until enough items match or the prefix is exhausted.
            window = wanted
            while True:
                cells = yield call("list", owner_id=owner, metadata=in_prefix, limit=window)
                matching = [c for c in cells if item_matches(_value(c), op.filter)]
                if len(matching) >= wanted or len(cells) < window:
                    break
                window *= 2
            scored = [(c, None) for c in matching]
        page = scored[op.offset: wanted]
        if op.refresh_ttl:
            yield from self._refresh([c for c, _ in page])
        return [_item(cell, score, searched=True) for cell, score in page]

    def _list_namespaces(self, op: ListNamespacesOp):
        conditions = op.match_conditions or ()
        prefixes = [c.path for c in conditions if c.match_type == "prefix" and "*" not in c.path]
        owner = self.owner_of(prefixes[0] if prefixes else ())
        in_prefix = prefix_filter(prefixes[0]) if prefixes else {FRAMEWORK_TAG: FRAMEWORK}
        # The server groups the items' scope tags (one row per namespace, no item loaded).
        namespaces: set[tuple[str, ...]] = set()
        cursor = None
        while True:
            page = yield call("metadata_values", SCOPE_TAG, owner_id=owner, metadata=in_prefix,
                              page_size=NAMESPACE_PAGE, cursor=cursor)
            namespaces.update(tuple(v.value[len(FRAMEWORK) + 1:].split(".")) for v in page.results
                              if v.value.startswith(FRAMEWORK + ":"))
            cursor = page.next_cursor
            if not cursor:
                break
        namespaces = {ns for ns in namespaces
                      if all(namespace_matches(c.match_type, c.path, ns) for c in conditions)}
        if op.max_depth is not None:
            namespaces = {ns[: op.max_depth] for ns in namespaces}
        return sorted(namespaces)[op.offset: op.offset + op.limit]


def _value(cell: MemoryCell) -> dict[str, Any]:
    return cell.content.metadata.get(VALUE_TAG, {})


# ---------------------------------------------------------------- chat message history


class AmpkitChatMessageHistory(BaseChatMessageHistory):
    """Episodic chat history of one session: each message is an episodic cell with the
    session id, owned by `owner_id`, the full message kept in `metadata.langchain_message`.
    `clear()` forgets the messages this agent wrote in this session, nothing else."""

    def __init__(self, client: Any, *, session_id: str, owner_id: Optional[str] = None, sharing: Sharing = Sharing()):
        self.clients = Clients(client)
        self.session_id = session_id
        self.owner_id = owner_id or self.clients.agent_id
        self.sharing = sharing
        self.scope = f"langchain.chat:{session_id}"

    def _read(self):
        cells = yield call("list", owner_id=self.owner_id, session_id=self.session_id, metadata={SCOPE_TAG: self.scope})
        cells.sort(key=lambda c: (c.lifecycle.created_at, c.id))
        return messages_from_dict([c.content.metadata[MESSAGE_TAG] for c in cells])

    def _add(self, messages: Sequence[BaseMessage]):
        for message in messages:
            text = message.text if isinstance(message.text, str) else str(message.content)
            yield call(
                "remember", text.strip() or f"({message.type} message)", owner_id=self.owner_id, type="episodic",
                session_id=self.session_id,
                metadata=tags("langchain", self.scope, **{MESSAGE_TAG: message_to_dict(message)}),
                **self.sharing.fields(),
            )

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return run_sync(self.clients.sync, self._read())

    async def aget_messages(self) -> list[BaseMessage]:
        return await run_async(self.clients.aio, self._read())

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        run_sync(self.clients.sync, self._add(messages))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        await run_async(self.clients.aio, self._add(messages))

    def clear(self) -> None:
        run_sync(self.clients.sync, forget_scope(self.owner_id, self.scope, self.clients.agent_id))

    async def aclear(self) -> None:
        await run_async(self.clients.aio, forget_scope(self.owner_id, self.scope, self.clients.agent_id))


# ---------------------------------------------------------------- retriever


def _document(hit: Any) -> Document:
    cell = hit.cell
    return Document(
        id=cell.id,
        page_content=cell.content.text,
        metadata={"score": hit.score, "type": cell.type, "owner_id": cell.identity.owner_id,
                  "created_by": cell.identity.created_by, "session_id": cell.identity.session_id},
    )


class AmpkitRetriever(BaseRetriever):
    """Ranked search over the cells the client's agent may read, whichever framework wrote
    them: durable memory (semantic and procedural) by default; `types=None` adds chat logs."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Any
    owner_id: Optional[str] = None
    types: Optional[list[str]] = list(LONG_TERM_TYPES)
    k: int = 4
    _clients: Clients = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        self._clients = Clients(self.client)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        hits = self._clients.sync.search(query, owner_id=self.owner_id, types=self.types, limit=self.k)
        return [_document(h) for h in hits]

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun) -> list[Document]:
        hits = await self._clients.aio.search(query, owner_id=self.owner_id, types=self.types, limit=self.k)
        return [_document(h) for h in hits]


# ---------------------------------------------------------------- middleware


def refusal_text(exc: APIError) -> str:
    """What a model reads when memory refused a write: the reason, and that nothing changed."""
    return f"Memory refused this ({exc.code}): {exc.message}"


def _refused(request: ToolCallRequest, exc: APIError) -> ToolMessage:
    call_ = request.tool_call
    return ToolMessage(refusal_text(exc), tool_call_id=call_["id"], name=call_["name"], status="error")


class RefusedWriteMiddleware(AgentMiddleware):
    """Turns a memory write that ampkit refuses inside a tool (an `AccessDenied`, a `Conflict`,
    a too-large or invalid value: any 4xx) into that tool's result, so the model reads why and
    the turn goes on; without it the exception ends `invoke`. Server and network failures
    (5xx, timeouts) still raise. `SharedMemoryMiddleware` includes it."""

    def wrap_tool_call(self, request: ToolCallRequest, handler: Callable) -> Any:
        try:
            return handler(request)
        except APIError as exc:
            if exc.status >= 500:
                raise
            return _refused(request, exc)

    async def awrap_tool_call(self, request: ToolCallRequest, handler: Callable) -> Any:
        try:
            return await handler(request)
        except APIError as exc:
            if exc.status >= 500:
                raise
            return _refused(request, exc)


class SharedMemoryMiddleware(RefusedWriteMiddleware):
    """For `create_agent(..., middleware=[...])`: before every model call, search the owner's
    shared long-term memories (any framework's) with the latest human message and add the
    hits to the system message of that call (only hits scoring at least `min_score`: when none
    does, the system message is left as it was). Nothing is added to the agent's saved state.
    A memory write a tool makes that ampkit refuses becomes the tool's result (see
    `RefusedWriteMiddleware`)."""

    def __init__(self, client: Any, *, owner_id: str, k: int = 5, types: Optional[Sequence[str]] = LONG_TERM_TYPES,
                 record_episodes: bool = False, session_id: Optional[str] = None, sharing: Sharing = Sharing(),
                 instructions: bool = False, min_score: float = DEFAULT_MIN_SCORE):
        super().__init__()
        self.clients = Clients(client)
        self.min_score = min_score
        # With instructions, the owner's AGENTS.md and skills index (docs/files.md) lead the
        # system message of every call: the same file agents in other frameworks read.
        self.instructions = instructions
        self.owner_id = owner_id
        self.k = k
        self.types = None if types is None else list(types)
        # With record_episodes, each user turn is also stored as an episodic cell of
        # `session_id`, for consolidation (docs/consolidation.md).
        self.record_episodes = record_episodes
        self.session_id = session_id
        self.sharing = sharing

    def _episode(self, request: ModelRequest) -> Optional[dict[str, Any]]:
        """The user's turn to record: only on the turn's first model call (the last message is
        the human's; later calls of the turn end with the model's or a tool's message)."""
        if not self.record_episodes or not request.messages or not isinstance(request.messages[-1], HumanMessage):
            return None
        text = request.messages[-1].text
        if not isinstance(text, str) or not text.strip():
            return None
        return {"text": text, "owner_id": self.owner_id, "type": "episodic", "session_id": self.session_id,
                "metadata": tags("langchain", "langchain.episodes"), **self.sharing.fields()}

    @staticmethod
    def _query(request: ModelRequest) -> str:
        return search_text([m.text for m in request.messages if isinstance(m, HumanMessage)][-1:])

    @staticmethod
    def _with_memories(request: ModelRequest, hits: list, block: str = "") -> ModelRequest:
        recalled = render(h.cell.content.text for h in hits)
        if not recalled and not block:
            return request
        system = request.system_message.text + "\n\n" if request.system_message else ""
        return request.override(system_message=SystemMessage(with_instructions((system + recalled).strip(), block)))

    def wrap_model_call(self, request: ModelRequest, handler: Callable) -> Any:
        episode = self._episode(request)
        if episode is not None:
            self.clients.sync.remember(**episode)
        query = self._query(request)
        hits = self.clients.sync.search(query, owner_id=self.owner_id, types=self.types, limit=self.k,
                                        min_score=self.min_score) if query else []
        block = instructions(self.clients.sync, self.owner_id) if self.instructions else ""
        return handler(self._with_memories(request, hits, block))

    async def awrap_model_call(self, request: ModelRequest, handler: Callable) -> Any:
        episode = self._episode(request)
        if episode is not None:
            await self.clients.aio.remember(**episode)
        query = self._query(request)
        hits = await self.clients.aio.search(query, owner_id=self.owner_id, types=self.types, limit=self.k,
                                             min_score=self.min_score) if query else []
        block = await ainstructions(self.clients.aio, self.owner_id) if self.instructions else ""
        return await handler(self._with_memories(request, hits, block))


# ---------------------------------------------------------------- tools


def memory_tools(client: Any, *, owner_id: str, sharing: Sharing = Sharing(), k: int = 5) -> list[BaseTool]:
    """`remember` and `recall` tools for any LangChain agent (sync and async)."""
    clients = Clients(client)
    scope = f"langchain.tools:{owner_id}"

    def _remember(fact: str) -> str:
        try:
            cell = clients.sync.remember(fact, owner_id=owner_id, metadata=tags("langchain", scope), **sharing.fields())
        except APIError as exc:
            if exc.status >= 500:
                raise
            return refusal_text(exc)
        return f"remembered ({cell.id})"

    async def _aremember(fact: str) -> str:
        try:
            cell = await clients.aio.remember(fact, owner_id=owner_id, metadata=tags("langchain", scope),
                                              **sharing.fields())
        except APIError as exc:
            if exc.status >= 500:
                raise
            return refusal_text(exc)
        return f"remembered ({cell.id})"

    def _format(hits: list) -> str:
        return "\n".join(f"- {h.cell.content.text}" for h in hits) or "nothing relevant in memory"

    def _recall(query: str) -> str:
        return _format(clients.sync.search(query, owner_id=owner_id, limit=k))

    async def _arecall(query: str) -> str:
        return _format(await clients.aio.search(query, owner_id=owner_id, limit=k))

    return [
        StructuredTool.from_function(_remember, coroutine=_aremember, name="remember",
                                     description="Save one durable fact about the user to shared long-term memory."),
        StructuredTool.from_function(_recall, coroutine=_arecall, name="recall",
                                     description="Search shared long-term memory for facts relevant to the query."),
    ]
