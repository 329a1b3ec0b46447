"""AutoGen 0.7 adapter: an `autogen_core.memory.Memory` on ampkit.

    from ampkit.adapters.autogen import AmpkitAutoGenMemory

    memory = AmpkitAutoGenMemory(client, owner_id="ada")        # client: ampkit Client or AsyncClient
    agent = AssistantAgent("assistant", model_client=model, memory=[memory])   # a list, not a tuple

Before every model call the agent runs `update_context`, which searches shared memory with
the latest message and appends the hits as one system message. AutoGen agents never write
memory by themselves: call `await memory.add(MemoryContent(...))` (or give the agent a tool).
The component config round-trips (`dump_component()` / `AmpkitAutoGenMemory.load_component(...)`);
the api key is not part of it, pass `api_key=` or rely on the client's own default.
"""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

from autogen_core import CancellationToken, Component
from autogen_core.memory import Memory, MemoryContent, MemoryMimeType, MemoryQueryResult, UpdateContextResult
from autogen_core.model_context import ChatCompletionContext
from autogen_core.models import SystemMessage, UserMessage
from pydantic import BaseModel, Field

from ampkit.limits import DEFAULT_MIN_SCORE

from ._instructions import ainstructions
from ._mapping import (
    LONG_TERM_TYPES,
    Clients,
    Sharing,
    forget_scope,
    render,
    run_async,
    search_text,
    tags,
    user_metadata,
)

FRAMEWORK = "autogen"
MIME_TAG = "autogen_mime_type"


class AmpkitMemoryConfig(BaseModel):
    """Everything needed to rebuild the memory, except secrets."""

    url: str
    agent_id: str
    owner_id: str
    name: str = "default"
    session_id: Optional[str] = None
    k: int = 5
    types: Optional[list[str]] = Field(default_factory=lambda: list(LONG_TERM_TYPES))
    memory_type: str = "semantic"
    readable_by: list[str] = Field(default_factory=list)
    writable_by: list[str] = Field(default_factory=list)
    public: bool = False
    record_episodes: bool = False  # record each user turn as an episodic cell (docs/consolidation.md)
    min_score: float = DEFAULT_MIN_SCORE  # what update_context (the automatic recall) requires of a hit


def _content_text(content: MemoryContent) -> str:
    value = content.content
    if isinstance(value, bytes):
        raise ValueError("ampkit stores text; binary or image memory content is not supported")
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _memory_content(cell: Any, score: float) -> MemoryContent:
    """A hit as the MemoryContent that was added: its mime type (JSON content as a dict again)
    and its own metadata, plus the cell's id, score and author."""
    metadata = cell.content.metadata or {}
    mime = metadata.get(MIME_TAG) or MemoryMimeType.TEXT.value
    content: Any = cell.content.text
    if mime == MemoryMimeType.JSON.value:
        try:
            content = json.loads(content)
        except ValueError:  # written as JSON by something else and not JSON: hand back the text
            mime = MemoryMimeType.TEXT.value
    known = {m.value: m for m in MemoryMimeType}
    return MemoryContent(content=content, mime_type=known.get(mime, mime),
                         metadata={**user_metadata(metadata), "id": cell.id, "score": score,
                                   "created_by": cell.identity.created_by})


def _shown(content: MemoryContent) -> str:
    return json.dumps(content.content, sort_keys=True) if isinstance(content.content, dict) else str(content.content)


class AmpkitAutoGenMemory(Memory, Component[AmpkitMemoryConfig]):
    """Shared ampkit memory for AutoGen agents. `owner_id` is whose memory it is; writes
    carry the client's agent id and the `sharing` policy; `clear()` forgets only the cells
    this agent added through a memory of the same `name`."""

    component_type = "memory"
    component_config_schema = AmpkitMemoryConfig
    component_provider_override = "ampkit.adapters.autogen.AmpkitAutoGenMemory"

    def __init__(self, client: Any, *, owner_id: str, name: str = "default", session_id: Optional[str] = None,
                 k: int = 5, types: Optional[Sequence[str]] = LONG_TERM_TYPES, memory_type: str = "semantic",
                 sharing: Sharing = Sharing(), record_episodes: bool = False, instructions: bool = False,
                 min_score: float = DEFAULT_MIN_SCORE):
        self._clients = Clients(client)
        self.instructions = instructions  # add the owner's AGENTS.md and skills index (docs/files.md)
        self._config = AmpkitMemoryConfig(
            url=client.url, agent_id=client.agent_id, owner_id=owner_id, name=name, session_id=session_id, k=k,
            types=None if types is None else list(types), memory_type=memory_type, **sharing.fields(),
            record_episodes=record_episodes, min_score=min_score,
        )

    @property
    def scope(self) -> str:
        return f"{FRAMEWORK}:{self._config.name}"

    @property
    def sharing(self) -> Sharing:
        c = self._config
        return Sharing(readable_by=c.readable_by, writable_by=c.writable_by, public=c.public)

    async def add(self, content: MemoryContent, cancellation_token: Optional[CancellationToken] = None) -> None:
        c = self._config
        mime = getattr(content.mime_type, "value", content.mime_type)
        metadata = tags(FRAMEWORK, self.scope, **(content.metadata or {}), **{MIME_TAG: mime})
        await self._clients.aio.remember(
            _content_text(content), owner_id=c.owner_id, type=c.memory_type, session_id=c.session_id,
            metadata=metadata, **self.sharing.fields(),
        )

    async def query(self, query: str | MemoryContent, cancellation_token: Optional[CancellationToken] = None,
                    **kwargs: Any) -> MemoryQueryResult:
        """An explicit search: every hit (`min_score` is for `update_context`)."""
        return await self._recall(query, 0.0)

    async def _recall(self, query: str | MemoryContent, min_score: float) -> MemoryQueryResult:
        text = search_text([query if isinstance(query, str) else _content_text(query)])
        if not text:
            return MemoryQueryResult(results=[])
        c = self._config
        hits = await self._clients.aio.search(text, owner_id=c.owner_id, types=c.types, limit=c.k, min_score=min_score)
        return MemoryQueryResult(results=[_memory_content(h.cell, h.score) for h in hits])

    async def update_context(self, model_context: ChatCompletionContext) -> UpdateContextResult:
        messages = await model_context.get_messages()
        contents = [getattr(m, "content", None) for m in messages[-1:]]
        latest = [c for c in contents if isinstance(c, str)]
        c = self._config
        if c.record_episodes and latest and isinstance(messages[-1], UserMessage) and latest[0].strip():
            # The user's turn, once: later calls of the same turn end with the model's or a tool's message.
            await self._clients.aio.remember(latest[0], owner_id=c.owner_id, type="episodic", session_id=c.session_id,
                                             metadata=tags(FRAMEWORK, f"{self.scope}.episodes"), **self.sharing.fields())
        if self.instructions:
            block = await ainstructions(self._clients.aio, c.owner_id)
            if block:
                await model_context.add_message(SystemMessage(content=block))
        result = await self._recall(latest[0], c.min_score) if latest else MemoryQueryResult(results=[])
        if result.results:
            text = render(_shown(m) for m in result.results)
            await model_context.add_message(SystemMessage(content=text))
        return UpdateContextResult(memories=result)

    async def clear(self) -> None:
        await run_async(self._clients.aio, forget_scope(self._config.owner_id, self.scope, self._clients.agent_id))

    async def close(self) -> None:
        await self._clients.aclose()

    def _to_config(self) -> AmpkitMemoryConfig:
        return self._config.model_copy()

    @classmethod
    def _from_config(cls, config: AmpkitMemoryConfig) -> "AmpkitAutoGenMemory":
        import ampkit

        c = config
        memory = cls(ampkit.aconnect(c.url, agent_id=c.agent_id), owner_id=c.owner_id, name=c.name,
                     session_id=c.session_id, k=c.k, types=c.types, memory_type=c.memory_type,
                     sharing=Sharing(readable_by=c.readable_by, writable_by=c.writable_by, public=c.public),
                     record_episodes=c.record_episodes, min_score=c.min_score)
        memory._clients.owned = True  # it opened the client, so close() closes it
        return memory


def __getattr__(name: str) -> Any:
    # The LlamaIndex and AutoGen adapters both called their class `AmpkitMemory`; each now has
    # its own name. The old one still works, with a warning, until 0.3.
    if name == "AmpkitMemory":
        import warnings

        warnings.warn("ampkit.adapters.autogen.AmpkitMemory is renamed AmpkitAutoGenMemory; the old name goes in 0.3",
                      DeprecationWarning, stacklevel=2)
        return AmpkitAutoGenMemory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
