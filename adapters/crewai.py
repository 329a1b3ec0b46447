"""CrewAI 1.x adapter: a unified-memory `Memory` on ampkit, through CrewAI's public storage
interface.

    from ampkit.adapters.crewai import AmpkitCrewMemory

    memory = AmpkitCrewMemory(client=client, owner_id="ada")
    Crew(agents=[...], tasks=[...], memory=memory)      # or Agent(..., memory=memory)

CrewAI 1.x takes memory only through `memory=`: the 0.x keywords `external_memory`,
`memory_config`, `short_term_memory`, ... are accepted by `Crew` and silently ignored.

`AmpkitCrewStorage` implements CrewAI's `StorageBackend` protocol on ampkit cells, and
`AmpkitCrewMemory` is a `Memory` built on it the ordinary way (`storage=`), so every inherited
method works on ampkit: `forget`, `reset`, `reset_all`, `list_records`, `list_scopes`,
`list_categories`, `info`, `tree`. Three methods are replaced because CrewAI would need an
embedder and an analysis LLM for them: `recall` is the server's own ranked search (CrewAI's
storage `search` gets only a query vector), `remember` writes a plain cell, and `update`
changes the cell without re-embedding. `extract_memories` uses CrewAI's LLM extraction only
when the memory was given an LLM instance; otherwise the task summary is kept as one cell.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Literal, Optional

from crewai.memory.types import MemoryMatch, MemoryRecord, ScopeInfo
from crewai.memory.unified_memory import Memory
from pydantic import Field, PrivateAttr

from ampkit import APIError, MemoryCell
from ampkit.limits import DEFAULT_MIN_SCORE

from ._instructions import instructions
from ._mapping import LONG_TERM_TYPES, MAX_SEARCH, SCOPE_TAG, Clients, Sharing, tags, user_metadata

FRAMEWORK = "crewai"
CREW_SCOPE_TAG = "crewai_scope"
CATEGORIES_TAG = "crewai_categories"
ROLE_TAG = "crewai_agent_role"
log = logging.getLogger(__name__)


def _join(root: Optional[str], scope: Optional[str]) -> str:
    parts = [p.strip("/") for p in (root, scope) if p and p.strip("/")]
    return "/" + "/".join(parts)


def _under(scope: str, prefix: Optional[str]) -> bool:
    if not prefix or prefix == "/":
        return True
    prefix = "/" + prefix.strip("/")
    return scope == prefix or scope.startswith(prefix + "/")


def _record(cell: MemoryCell) -> MemoryRecord:
    meta = cell.content.metadata
    return MemoryRecord(
        id=cell.id,
        content=cell.content.text,
        scope=meta.get(CREW_SCOPE_TAG, "/"),
        categories=list(meta.get(CATEGORIES_TAG, [])),
        metadata=user_metadata(meta),
        importance=cell.scoring.importance,
        created_at=cell.lifecycle.created_at,
        last_accessed=cell.lifecycle.last_accessed_at or cell.lifecycle.created_at,
        source=cell.identity.created_by,
    )


class AmpkitCrewStorage:
    """CrewAI's `StorageBackend` on ampkit: one record is one cell of `owner_id`, tagged with
    the memory's scope tag. Reads see the cells of that tag the agent may read (any writer);
    `delete` and `reset` forget only the cells this agent wrote, never a teammate's or the
    user's. `search` by vector is not offered (it returns nothing): recall is a text search,
    done by `AmpkitCrewMemory.recall`."""

    def __init__(self, client: Any, *, owner_id: str, scope_tag: str, memory_type: str = "semantic",
                 sharing: Sharing = Sharing()):
        self.clients = Clients(client)
        self.owner_id = owner_id
        self.scope_tag = scope_tag
        self.memory_type = memory_type
        self.sharing = sharing

    # -- writes
    def write(self, record: MemoryRecord, agent_role: Optional[str] = None) -> MemoryRecord:
        meta = tags(FRAMEWORK, self.scope_tag, **(record.metadata or {}),
                    **{CREW_SCOPE_TAG: record.scope or "/", CATEGORIES_TAG: list(record.categories), ROLE_TAG: agent_role})
        cell = self.clients.sync.remember(
            record.content, owner_id=self.owner_id, type=self.memory_type, metadata=meta, importance=record.importance,
            **(Sharing().fields() if record.private else self.sharing.fields()),
        )
        return _record(cell)

    def save(self, records: list[MemoryRecord]) -> None:
        for record in records:
            self.write(record)

    def update(self, record: MemoryRecord) -> None:
        cell = self.clients.sync.get(record.id)
        meta = {**cell.content.metadata, **(record.metadata or {}),
                CREW_SCOPE_TAG: record.scope or "/", CATEGORIES_TAG: list(record.categories)}
        self.clients.sync.update(record.id, text=record.content, metadata=meta, importance=record.importance)

    def delete(self, scope_prefix: Optional[str] = None, categories: Optional[list[str]] = None,
               record_ids: Optional[list[str]] = None, older_than: Optional[datetime] = None,
               metadata_filter: Optional[dict[str, Any]] = None) -> int:
        agent = self.clients.agent_id
        chosen = [
            c for c in self._cells() if c.identity.created_by == agent
            and (record_ids is None or c.id in record_ids)
            and _under(c.content.metadata.get(CREW_SCOPE_TAG, "/"), scope_prefix)
            and (not categories or set(categories) & set(c.content.metadata.get(CATEGORIES_TAG, [])))
            and (older_than is None or c.lifecycle.created_at < older_than)
            and all(c.content.metadata.get(k) == v for k, v in (metadata_filter or {}).items())
        ]
        for cell in chosen:
            self.clients.sync.forget(cell.id)
        return len(chosen)

    def reset(self, scope_prefix: Optional[str] = None) -> None:
        self.delete(scope_prefix=scope_prefix)

    # -- reads
    def _cells(self, scope_prefix: Optional[str] = None) -> list[MemoryCell]:
        cells = self.clients.sync.list(owner_id=self.owner_id, metadata={SCOPE_TAG: self.scope_tag})
        return [c for c in cells if _under(c.content.metadata.get(CREW_SCOPE_TAG, "/"), scope_prefix)]

    def search(self, query_embedding: list[float], scope_prefix: Optional[str] = None,
               categories: Optional[list[str]] = None, metadata_filter: Optional[dict[str, Any]] = None,
               limit: int = 10, min_score: float = 0.0) -> list[tuple[MemoryRecord, float]]:
        return []

    def get_record(self, record_id: str) -> Optional[MemoryRecord]:
        try:
            return _record(self.clients.sync.get(record_id))
        except APIError:
            return None

    def list_records(self, scope_prefix: Optional[str] = None, limit: int = 200, offset: int = 0) -> list[MemoryRecord]:
        cells = sorted(self._cells(scope_prefix), key=lambda c: (c.lifecycle.created_at, c.id), reverse=True)
        return [_record(c) for c in cells[offset: offset + limit]]

    def get_scope_info(self, scope: str) -> ScopeInfo:
        records = [_record(c) for c in self._cells(scope)]
        return ScopeInfo(
            path=scope or "/", record_count=len(records),
            categories=sorted({cat for r in records for cat in r.categories}),
            oldest_record=min((r.created_at for r in records), default=None),
            newest_record=max((r.created_at for r in records), default=None),
            child_scopes=self.list_scopes(scope),
        )

    def list_scopes(self, parent: str = "/") -> list[str]:
        base = "/" + parent.strip("/") if parent and parent.strip("/") else ""
        children = set()
        for cell in self._cells(parent):
            rest = cell.content.metadata.get(CREW_SCOPE_TAG, "/")[len(base):].strip("/")
            if rest:
                children.add(f"{base}/{rest.split('/')[0]}")
        return sorted(children)

    def list_categories(self, scope_prefix: Optional[str] = None) -> dict[str, int]:
        counts: dict[str, int] = {}
        for cell in self._cells(scope_prefix):
            for cat in cell.content.metadata.get(CATEGORIES_TAG, []):
                counts[cat] = counts.get(cat, 0) + 1
        return counts

    def count(self, scope_prefix: Optional[str] = None) -> int:
        return len(self._cells(scope_prefix))

    # -- the protocol's async side (CrewAI 1.x never calls it; the sync calls in a thread)
    async def asave(self, records: list[MemoryRecord]) -> None:
        import asyncio

        await asyncio.to_thread(self.save, records)

    async def asearch(self, query_embedding: list[float], scope_prefix: Optional[str] = None,
                      categories: Optional[list[str]] = None, metadata_filter: Optional[dict[str, Any]] = None,
                      limit: int = 10, min_score: float = 0.0) -> list[tuple[MemoryRecord, float]]:
        return []

    async def adelete(self, scope_prefix: Optional[str] = None, categories: Optional[list[str]] = None,
                      record_ids: Optional[list[str]] = None, older_than: Optional[datetime] = None,
                      metadata_filter: Optional[dict[str, Any]] = None) -> int:
        import asyncio

        return await asyncio.to_thread(self.delete, scope_prefix, categories, record_ids, older_than, metadata_filter)

    def close(self) -> None:
        self.clients.close()


class AmpkitCrewMemory(Memory):
    """CrewAI memory on ampkit. `owner_id` is whose memory it is (usually the user); the
    cells are written by the client's agent id with the `sharing` access policy.
    `recall_types` limits what recall returns (long-term facts by default, not chat logs).
    `reset()` forgets the cells this agent wrote under this memory's `name`, nothing else.
    With `record_episodes=True`, each request the crew recalls for (a task's description with
    its kickoff inputs, or a standalone agent's message) is stored once as an episodic cell of
    `session_id`, ready for consolidation; it is tagged apart and never recalled as a fact."""

    client: Any = Field(default=None, exclude=True)
    owner_id: str
    name: str = "crew"
    memory_type: Literal["semantic", "episodic", "procedural"] = "semantic"
    recall_types: Optional[list[str]] = Field(default_factory=lambda: list(LONG_TERM_TYPES))
    min_score: float = DEFAULT_MIN_SCORE  # what recall (the crew's context) requires of a hit
    sharing: Sharing = Sharing()
    storage: Any = None  # AmpkitCrewStorage, built from the fields above unless given
    record_episodes: bool = False
    session_id: Optional[str] = None
    instructions: bool = False  # recall leads with the owner's AGENTS.md and skills index (docs/files.md)
    _last_episode: Optional[str] = PrivateAttr(default=None)

    def model_post_init(self, __context: Any) -> None:
        if not isinstance(self.storage, AmpkitCrewStorage):
            self.storage = AmpkitCrewStorage(self.client, owner_id=self.owner_id, scope_tag=self.scope_tag,
                                             memory_type=self.memory_type, sharing=self.sharing)
        super().model_post_init(__context)

    def __deepcopy__(self, memo: Optional[dict[int, Any]] = None) -> "AmpkitCrewMemory":
        # CrewAI copies agents and crews; every copy must keep talking to the same storage.
        return self.model_copy()

    @property
    def scope_tag(self) -> str:
        return f"{FRAMEWORK}:{self.name}"

    @property
    def ampkit_storage(self) -> AmpkitCrewStorage:
        return self.storage

    # -- what the CrewAI runtime calls
    def extract_memories(self, content: str) -> list[str]:
        if not isinstance(self.llm, str):  # an LLM instance was given: CrewAI's own extraction
            return super().extract_memories(content)
        return [content]

    def remember(self, content: str, scope: Optional[str] = None, categories: Optional[list[str]] = None,
                 metadata: Optional[dict[str, Any]] = None, importance: Optional[float] = None,
                 source: Optional[str] = None, private: bool = False, agent_role: Optional[str] = None,
                 root_scope: Optional[str] = None) -> Optional[MemoryRecord]:
        """Write one cell now. A refusal (4xx) raises `ampkit.APIError`; called from the
        "Save to memory" tool, CrewAI hands the error text to the model as the tool's output."""
        if self.read_only:
            return None
        record = MemoryRecord(
            content=content, scope=_join(root_scope or self.root_scope, scope), categories=list(categories or []),
            metadata=metadata or {}, importance=self.default_importance if importance is None else importance,
            private=private,
        )
        return self.ampkit_storage.write(record, agent_role=agent_role)

    def remember_many(self, contents: list[str], scope: Optional[str] = None, categories: Optional[list[str]] = None,
                      metadata: Optional[dict[str, Any]] = None, importance: Optional[float] = None,
                      source: Optional[str] = None, private: bool = False, agent_role: Optional[str] = None,
                      root_scope: Optional[str] = None) -> list[MemoryRecord]:
        """Write each item now (not in CrewAI's background saver). An item the server refuses
        (too large, invalid) is logged and skipped, as CrewAI's own saver does, so the crew's
        after-task save never ends a kickoff; server and network failures still raise."""
        records = []
        for content in (c for c in contents if c and c.strip()):
            try:
                record = self.remember(content, scope, categories, metadata, importance, source, private, agent_role,
                                       root_scope)
            except APIError as exc:
                if exc.status >= 500:
                    raise
                log.warning("ampkit refused a CrewAI memory (%s): %s", exc.code, exc.message)
                continue
            if record is not None:
                records.append(record)
        return records

    def recall(self, query: str, scope: Optional[str] = None, categories: Optional[list[str]] = None,
               limit: int = 10, depth: Literal["shallow", "deep"] = "deep", source: Optional[str] = None,
               include_private: bool = False) -> list[MemoryMatch]:
        query = query.strip()[-4000:]
        if not query:
            return []
        if self.record_episodes and not self.read_only and query != self._last_episode:
            # One episode per request: CrewAI may recall again for the same task.
            self.ampkit_storage.clients.sync.remember(
                query, owner_id=self.owner_id, type="episodic", session_id=self.session_id,
                metadata=tags(FRAMEWORK, f"{self.scope_tag}.episodes"), **self.sharing.fields())
            self._last_episode = query
        hits = self.ampkit_storage.clients.sync.search(query, owner_id=self.owner_id, types=self.recall_types,
                                                       limit=min(max(limit, 1), MAX_SEARCH), min_score=self.min_score)
        matches = [MemoryMatch(record=_record(h.cell), score=h.score, match_reasons=["ampkit search"]) for h in hits]
        if scope:
            prefix = _join(self.root_scope, scope)
            matches = [m for m in matches if _under(m.record.scope, prefix)]
        if categories:
            matches = [m for m in matches if set(categories) & set(m.record.categories)]
        if self.instructions:
            block = instructions(self.ampkit_storage.clients.sync, self.owner_id)
            if block:
                lead = MemoryRecord(content=block, scope=self.root_scope or "/", importance=1.0, source="ampkit:files")
                matches = [MemoryMatch(record=lead, score=1.0, match_reasons=["the agent's instructions"]), *matches]
        return matches

    def update(self, record_id: str, content: Optional[str] = None, scope: Optional[str] = None,
               categories: Optional[list[str]] = None, metadata: Optional[dict[str, Any]] = None,
               importance: Optional[float] = None) -> MemoryRecord:
        existing = self.ampkit_storage.get_record(record_id)
        if existing is None:
            raise ValueError(f"Record not found: {record_id}")
        if self.read_only:
            return existing
        changes: dict[str, Any] = {"content": content, "categories": categories, "metadata": metadata,
                                   "importance": importance,
                                   "scope": None if scope is None else _join(self.root_scope, scope)}
        updated = existing.model_copy(update={k: v for k, v in changes.items() if v is not None})
        self.ampkit_storage.update(updated)
        return updated
