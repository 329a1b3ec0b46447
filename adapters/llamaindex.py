"""LlamaIndex adapters: a memory block for the new `Memory`, and a full `BaseMemory`.

    from llama_index.core.memory import Memory
    from ampkit.adapters.llamaindex import AmpkitLlamaIndexMemory, AmpkitMemoryBlock

    # shared long-term memory as one block beside LlamaIndex's own short-term queue
    memory = Memory.from_defaults(session_id="s1", memory_blocks=[AmpkitMemoryBlock(client=client, owner_id="ada")])
    # or: the whole memory (session history + shared recall) in ampkit
    memory = AmpkitLlamaIndexMemory.from_defaults(client=client, owner_id="ada", session_id="s1")
    await agent.run(user_msg="...", memory=memory)

Workflow agents call only the async methods; those do real async I/O on an
`ampkit.AsyncClient` (given, or opened on the same URL as the sync client given).
"""

from __future__ import annotations

from typing import Any, List, Optional

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.memory import BaseMemory, BaseMemoryBlock
from pydantic import ConfigDict, Field, PrivateAttr

from ampkit.limits import DEFAULT_MIN_SCORE

from ._instructions import ainstructions, instructions_plan, with_instructions
from ._mapping import LONG_TERM_TYPES, Clients, Sharing, call, forget_scope, render, run_async, run_sync, search_text, tags

FRAMEWORK = "llamaindex"
MESSAGE_TAG = "llamaindex_message"


def _message_text(message: ChatMessage) -> str:
    text = (message.content or "").strip()
    return text or f"({message.role.value} message)"


def _remember_message(owner_id: str, session_id: Optional[str], scope: str, sharing: Sharing, message: ChatMessage):
    return call(
        "remember", _message_text(message), owner_id=owner_id, type="episodic", session_id=session_id,
        metadata=tags(FRAMEWORK, scope, **{MESSAGE_TAG: message.model_dump(mode="json")}), **sharing.fields(),
    )


class AmpkitMemoryBlock(BaseMemoryBlock[str]):
    """Shared long-term memory as a block of LlamaIndex's `Memory`.

    On every `aget` it searches the owner's readable long-term cells (semantic and
    procedural, written by any framework) with the recent messages as the query; the hits
    scoring at least `min_score` are rendered into the system prompt inside `<shared_memory>`
    (none: the block is empty, and `Memory` leaves it out). Messages that `Memory`
    flushes out of its short-term queue arrive in `aput` and are kept as episodic cells."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str = "shared_memory"
    client: Any = Field(exclude=True)
    owner_id: str
    limit: int = 5
    min_score: float = DEFAULT_MIN_SCORE
    recall_types: Optional[list[str]] = Field(default_factory=lambda: list(LONG_TERM_TYPES))
    sharing: Sharing = Sharing()
    instructions: bool = False  # lead with the owner's AGENTS.md and skills index (docs/files.md)
    _clients: Clients = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        self._clients = Clients(self.client)

    async def _aget(self, messages: Optional[List[ChatMessage]] = None, **block_kwargs: Any) -> str:
        block = await ainstructions(self._clients.aio, self.owner_id) if self.instructions else ""
        query = search_text(m.content for m in (messages or [])[-3:])
        if not query:
            return block
        hits = await self._clients.aio.search(query, owner_id=self.owner_id, types=self.recall_types, limit=self.limit,
                                              min_score=self.min_score)
        return with_instructions(render((h.cell.content.text for h in hits), header=""), block)

    def _put(self, messages: List[ChatMessage]):
        for message in messages:
            session_id = message.additional_kwargs.get("session_id")
            yield _remember_message(self.owner_id, session_id, f"llamaindex.block:{self.owner_id}", self.sharing, message)

    async def _aput(self, messages: List[ChatMessage]) -> None:
        await run_async(self._clients.aio, self._put(messages))


class AmpkitLlamaIndexMemory(BaseMemory):
    """The whole agent memory in ampkit: the session's chat history (episodic cells with the
    session id) plus shared long-term memory recalled for the latest user message and given to
    the model as a system message. `reset()` forgets this session's messages written by
    this agent, nothing else."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Any = Field(exclude=True)
    owner_id: str
    session_id: str = "default"
    recall_limit: int = 5
    min_score: float = DEFAULT_MIN_SCORE  # recalled memories score at least this; none: no system message
    recall_types: Optional[list[str]] = Field(default_factory=lambda: list(LONG_TERM_TYPES))
    sharing: Sharing = Sharing()
    instructions: bool = False  # lead with the owner's AGENTS.md and skills index (docs/files.md)
    _clients: Clients = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        self._clients = Clients(self.client)

    @classmethod
    def class_name(cls) -> str:
        return "AmpkitLlamaIndexMemory"

    @classmethod
    # The base declares only **kwargs; this one needs a client and an owner, so it names them.
    def from_defaults(  # type: ignore[override]
        cls, *, client: Any, owner_id: str, session_id: str = "default", **kwargs: Any
    ) -> "AmpkitLlamaIndexMemory":
        return cls(client=client, owner_id=owner_id, session_id=session_id, **kwargs)

    @property
    def scope(self) -> str:
        return f"llamaindex.chat:{self.session_id}"

    # -- plans, each run by the sync or the async client
    def _history(self):
        cells = yield call("list", owner_id=self.owner_id, session_id=self.session_id, metadata={"ampkit_scope": self.scope})
        cells.sort(key=lambda c: (c.lifecycle.created_at, c.id))
        return [ChatMessage.model_validate(c.content.metadata[MESSAGE_TAG]) for c in cells]

    def _get(self, input: Optional[str]):
        history = yield from self._history()
        block = (yield from instructions_plan(self.owner_id)) if self.instructions else ""
        lead = [ChatMessage(role=MessageRole.SYSTEM, content=block)] if block else []
        latest_user = [m.content for m in history if m.role == MessageRole.USER][-1:]
        query = search_text([input] if input else latest_user)
        if not query:
            return lead + history
        hits = yield call("search", query, owner_id=self.owner_id, types=self.recall_types, limit=self.recall_limit,
                          min_score=self.min_score)
        recalled = render(h.cell.content.text for h in hits)
        return lead + ([ChatMessage(role=MessageRole.SYSTEM, content=recalled)] if recalled else []) + history

    def _put(self, messages: List[ChatMessage]):
        for message in messages:
            yield _remember_message(self.owner_id, self.session_id, self.scope, self.sharing, message)

    def _set(self, messages: List[ChatMessage]):
        yield from forget_scope(self.owner_id, self.scope, self._clients.agent_id)
        yield from self._put(messages)

    # -- BaseMemory, sync side
    def get(self, input: Optional[str] = None, **kwargs: Any) -> List[ChatMessage]:
        return run_sync(self._clients.sync, self._get(input))

    def get_all(self) -> List[ChatMessage]:
        return run_sync(self._clients.sync, self._history())

    def put(self, message: ChatMessage) -> None:
        run_sync(self._clients.sync, self._put([message]))

    def put_messages(self, messages: List[ChatMessage]) -> None:
        run_sync(self._clients.sync, self._put(messages))

    def set(self, messages: List[ChatMessage]) -> None:
        run_sync(self._clients.sync, self._set(messages))

    def reset(self) -> None:
        run_sync(self._clients.sync, forget_scope(self.owner_id, self.scope, self._clients.agent_id))

    # -- async side: what workflow agents call
    async def aget(self, input: Optional[str] = None, **kwargs: Any) -> List[ChatMessage]:
        return await run_async(self._clients.aio, self._get(input))

    async def aget_all(self) -> List[ChatMessage]:
        return await run_async(self._clients.aio, self._history())

    async def aput(self, message: ChatMessage) -> None:
        await run_async(self._clients.aio, self._put([message]))

    async def aput_messages(self, messages: List[ChatMessage]) -> None:
        await run_async(self._clients.aio, self._put(messages))

    async def aset(self, messages: List[ChatMessage]) -> None:
        await run_async(self._clients.aio, self._set(messages))

    async def areset(self) -> None:
        await run_async(self._clients.aio, forget_scope(self.owner_id, self.scope, self._clients.agent_id))


def __getattr__(name: str) -> Any:
    # The LlamaIndex and AutoGen adapters both called their class `AmpkitMemory`; each now has
    # its own name. The old one still works, with a warning, until 0.3.
    if name == "AmpkitMemory":
        import warnings

        warnings.warn("ampkit.adapters.llamaindex.AmpkitMemory is renamed AmpkitLlamaIndexMemory; the old name goes in 0.3",
                      DeprecationWarning, stacklevel=2)
        return AmpkitLlamaIndexMemory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
