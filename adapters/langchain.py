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
cell owned by `owner_id`; the value dict is kept whole in `metadata.langgraph_value`, the
searchable text is the value's `index` fields (or its "text"/"content"/"memory" field, or the
JSON); the namespace joined by "." is the scope tag. Chat messages are episodic cells in
the session. `delete`/`clear` forget only cells this agent created in that scope.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Optional, Sequence

from langchain.agents.middleware import AgentMiddleware, ModelRequest
from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.documents import Document
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, message_to_dict, messages_from_dict
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
    get_text_at_path,
)
from langgraph.store.memory import _compare_values, _does_match
from pydantic import ConfigDict, PrivateAttr

from ampkit import MemoryCell

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
MESSAGE_TAG = "langchain_message"
TEXT_FIELDS = ("text", "content", "memory", "data")


# ---------------------------------------------------------------- LangGraph BaseStore


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


class AmpkitStore(BaseStore):
    """LangGraph long-term memory store backed by ampkit.

    `owner_id` is whose memory this is (a user id, usually); it defaults to the client's
    agent id. `sharing` sets the access policy of the cells the store writes. Search is the
    server's ranked search (keyword, plus dense vectors if the server has them) over the
    owner's readable items under the namespace prefix (filtered by the server); a value
    `filter` is applied here, to the best `MAX_SEARCH` hits. `batch` runs on the sync client
    and `abatch` on the async one. TTLs are not supported."""

    supports_ttl = False

    def __init__(self, client: Any, *, owner_id: Optional[str] = None, sharing: Sharing = Sharing()):
        self.clients = Clients(client)
        self.owner_id = owner_id or self.clients.agent_id
        self.sharing = sharing

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return [run_sync(self.clients.sync, self._plan(op)) for op in ops]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return [await run_async(self.clients.aio, self._plan(op)) for op in ops]

    # -- one generator per op (see _mapping.run_sync / run_async)
    def _plan(self, op: Op):
        if isinstance(op, GetOp):
            cell = yield from self._find(op.namespace, op.key)
            return None if cell is None else _item(cell)
        if isinstance(op, PutOp):
            return (yield from self._put(op))
        if isinstance(op, SearchOp):
            return (yield from self._search(op))
        if isinstance(op, ListNamespacesOp):
            return (yield from self._list_namespaces(op))
        raise TypeError(f"unknown store op {type(op).__name__}")

    def _find(self, namespace: tuple[str, ...], key: str):
        cells = yield call("list", owner_id=self.owner_id, metadata={SCOPE_TAG: namespace_scope(namespace), KEY_TAG: key})
        return cells[0] if cells else None

    def _put(self, op: PutOp):
        existing = yield from self._find(op.namespace, op.key)
        if op.value is None:
            if existing is not None:
                yield call("forget", existing.id)
            return None
        value = dict(op.value)
        text = item_text(value, op.index or None, op.key)
        metadata = tags(FRAMEWORK, namespace_scope(op.namespace), **prefix_tags(op.namespace),
                        **{KEY_TAG: op.key, VALUE_TAG: value})
        if existing is not None:
            yield call("update", existing.id, text=text, metadata=metadata)
        else:
            yield call("remember", text, owner_id=self.owner_id, metadata=metadata, **self.sharing.fields())
        return None

    def _search(self, op: SearchOp):
        in_prefix = prefix_filter(op.namespace_prefix)
        if op.query:
            # The value filter runs here, after ranking: then rank a wider window.
            window = MAX_SEARCH if op.filter else min(MAX_SEARCH, op.offset + op.limit)
            hits = yield call("search", op.query, owner_id=self.owner_id, limit=window, metadata=in_prefix)
            scored = [(h.cell, h.score) for h in hits]
        else:
            cells = yield call("list", owner_id=self.owner_id, metadata=in_prefix)
            cells.sort(key=lambda c: c.lifecycle.last_updated_at or c.lifecycle.created_at, reverse=True)
            scored = [(c, None) for c in cells]
        wanted = [
            _item(cell, score, searched=True)
            for cell, score in scored
            if all(_compare_values(cell.content.metadata.get(VALUE_TAG, {}).get(k), v) for k, v in (op.filter or {}).items())
        ]
        return wanted[op.offset: op.offset + op.limit]

    def _list_namespaces(self, op: ListNamespacesOp):
        cells = yield call("list", owner_id=self.owner_id, metadata={FRAMEWORK_TAG: FRAMEWORK})
        namespaces = {_namespace_of(c) for c in cells}
        if op.match_conditions:
            namespaces = {ns for ns in namespaces if all(_does_match(cond, ns) for cond in op.match_conditions)}
        if op.max_depth is not None:
            namespaces = {ns[: op.max_depth] for ns in namespaces}
        return sorted(namespaces)[op.offset: op.offset + op.limit]


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
    """Ranked search over every cell the client's agent may read (any framework wrote it)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Any
    owner_id: Optional[str] = None
    types: Optional[list[str]] = None
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


class SharedMemoryMiddleware(AgentMiddleware):
    """For `create_agent(..., middleware=[...])`: before every model call, search the owner's
    shared long-term memories (any framework's) with the latest human message and add the
    hits to the system message of that call. Nothing is added to the agent's saved state."""

    def __init__(self, client: Any, *, owner_id: str, k: int = 5, types: Optional[Sequence[str]] = LONG_TERM_TYPES,
                 record_episodes: bool = False, session_id: Optional[str] = None, sharing: Sharing = Sharing()):
        super().__init__()
        self.clients = Clients(client)
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
    def _with_memories(request: ModelRequest, hits: list) -> ModelRequest:
        recalled = render(h.cell.content.text for h in hits)
        if not recalled:
            return request
        system = request.system_message.text + "\n\n" if request.system_message else ""
        return request.override(system_message=SystemMessage(system + recalled))

    def wrap_model_call(self, request: ModelRequest, handler: Callable) -> Any:
        episode = self._episode(request)
        if episode is not None:
            self.clients.sync.remember(**episode)
        query = self._query(request)
        hits = self.clients.sync.search(query, owner_id=self.owner_id, types=self.types, limit=self.k) if query else []
        return handler(self._with_memories(request, hits))

    async def awrap_model_call(self, request: ModelRequest, handler: Callable) -> Any:
        episode = self._episode(request)
        if episode is not None:
            await self.clients.aio.remember(**episode)
        query = self._query(request)
        hits = await self.clients.aio.search(query, owner_id=self.owner_id, types=self.types, limit=self.k) if query else []
        return await handler(self._with_memories(request, hits))


# ---------------------------------------------------------------- tools


def memory_tools(client: Any, *, owner_id: str, sharing: Sharing = Sharing(), k: int = 5) -> list[BaseTool]:
    """`remember` and `recall` tools for any LangChain agent (sync and async)."""
    clients = Clients(client)
    scope = f"langchain.tools:{owner_id}"

    def _remember(fact: str) -> str:
        cell = clients.sync.remember(fact, owner_id=owner_id, metadata=tags("langchain", scope), **sharing.fields())
        return f"remembered ({cell.id})"

    async def _aremember(fact: str) -> str:
        cell = await clients.aio.remember(fact, owner_id=owner_id, metadata=tags("langchain", scope), **sharing.fields())
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
