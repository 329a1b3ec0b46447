"""CrewAI 1.x adapter: a unified-memory `Memory` whose recall and remember go to ampkit.

    from ampkit.adapters.crewai import AmpkitCrewMemory

    memory = AmpkitCrewMemory(client=client, owner_id="ada")
    Crew(agents=[...], tasks=[...], memory=memory)      # or Agent(..., memory=memory)

CrewAI 1.x takes memory only through `memory=`: the 0.x keywords `external_memory`,
`memory_config`, `short_term_memory`, ... are accepted by `Crew` and silently ignored.

This subclass keeps CrewAI's runtime contract (recall before a task, extract + remember after
it, the "Search memory"/"Save to memory" tools, `reset_memories`) but replaces the parts that
need an embedder, LanceDB and an analysis LLM: recall is the server's own ranked search, and
writes are plain cells. `extract_memories` uses CrewAI's LLM extraction only when the memory
was given an LLM instance; otherwise the task summary is kept as one cell.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from crewai.llms.base_llm import BaseLLM
from crewai.memory.types import MemoryMatch, MemoryRecord
from crewai.memory.unified_memory import Memory
from pydantic import Field, PrivateAttr

from ampkit import MemoryCell

from ._mapping import LONG_TERM_TYPES, MAX_SEARCH, SCOPE_TAG, Clients, Sharing, owned_by_scope, tags, user_metadata

FRAMEWORK = "crewai"
CREW_SCOPE_TAG = "crewai_scope"
CATEGORIES_TAG = "crewai_categories"
ROLE_TAG = "crewai_agent_role"


def _join(root: Optional[str], scope: Optional[str]) -> str:
    parts = [p.strip("/") for p in (root, scope) if p and p.strip("/")]
    return "/" + "/".join(parts)


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


class AmpkitCrewMemory(Memory):
    """CrewAI memory on ampkit. `owner_id` is whose memory it is (usually the user); the
    cells are written by the client's agent id with the `sharing` access policy.
    `recall_types` limits what recall returns (long-term facts by default, not chat logs).
    `reset()` forgets the cells this agent wrote under this memory's `name`, nothing else."""

    client: Any = Field(default=None, exclude=True)
    owner_id: str
    name: str = "crew"
    memory_type: Literal["semantic", "episodic", "procedural"] = "semantic"
    recall_types: Optional[list[str]] = Field(default_factory=lambda: list(LONG_TERM_TYPES))
    sharing: Sharing = Sharing()
    storage: Any = "ampkit"  # never opened: every method that would use CrewAI storage is overridden
    _clients: Clients = PrivateAttr()

    def model_post_init(self, __context: Any) -> None:
        # Deliberately not calling Memory.model_post_init: it would open LanceDB storage.
        self._clients = Clients(self.client)
        self._llm_instance = self.llm if isinstance(self.llm, BaseLLM) else None

    def __deepcopy__(self, memo: Optional[dict[int, Any]] = None) -> "AmpkitCrewMemory":
        # CrewAI copies agents and crews; every copy must keep talking to the same client.
        return self.model_copy()

    @property
    def scope_tag(self) -> str:
        return f"{FRAMEWORK}:{self.name}"

    # -- what the CrewAI runtime calls
    def extract_memories(self, content: str) -> list[str]:
        if self._llm_instance is not None:
            return super().extract_memories(content)
        return [content]

    def remember(self, content: str, scope: Optional[str] = None, categories: Optional[list[str]] = None,
                 metadata: Optional[dict[str, Any]] = None, importance: Optional[float] = None,
                 source: Optional[str] = None, private: bool = False, agent_role: Optional[str] = None,
                 root_scope: Optional[str] = None) -> Optional[MemoryRecord]:
        if self.read_only:
            return None
        meta = tags(FRAMEWORK, self.scope_tag, **(metadata or {}),
                    **{CREW_SCOPE_TAG: _join(root_scope or self.root_scope, scope),
                       CATEGORIES_TAG: list(categories or []), ROLE_TAG: agent_role})
        cell = self._clients.sync.remember(
            content, owner_id=self.owner_id, type=self.memory_type, metadata=meta,
            importance=self.default_importance if importance is None else importance,
            **(Sharing().fields() if private else self.sharing.fields()),
        )
        return _record(cell)

    def remember_many(self, contents: list[str], scope: Optional[str] = None, categories: Optional[list[str]] = None,
                      metadata: Optional[dict[str, Any]] = None, importance: Optional[float] = None,
                      source: Optional[str] = None, private: bool = False, agent_role: Optional[str] = None,
                      root_scope: Optional[str] = None) -> list[MemoryRecord]:
        # Synchronous on purpose: CrewAI's background saves swallow failures; these raise.
        records = [self.remember(c, scope, categories, metadata, importance, source, private, agent_role, root_scope)
                   for c in contents if c and c.strip()]
        return [r for r in records if r is not None]

    def recall(self, query: str, scope: Optional[str] = None, categories: Optional[list[str]] = None,
               limit: int = 10, depth: Literal["shallow", "deep"] = "deep", source: Optional[str] = None,
               include_private: bool = False) -> list[MemoryMatch]:
        query = query.strip()[-4000:]
        if not query:
            return []
        hits = self._clients.sync.search(query, owner_id=self.owner_id, types=self.recall_types,
                                         limit=min(max(limit, 1), MAX_SEARCH))
        matches = [MemoryMatch(record=_record(h.cell), score=h.score, match_reasons=["ampkit search"]) for h in hits]
        if scope:
            prefix = _join(self.root_scope, scope)
            matches = [m for m in matches if m.record.scope.startswith(prefix)]
        if categories:
            matches = [m for m in matches if set(categories) & set(m.record.categories)]
        return matches

    def update(self, record_id: str, content: Optional[str] = None, scope: Optional[str] = None,
               categories: Optional[list[str]] = None, metadata: Optional[dict[str, Any]] = None,
               importance: Optional[float] = None) -> MemoryRecord:
        cell = self._clients.sync.get(record_id)
        meta = dict(cell.content.metadata)
        meta.update(metadata or {})
        if scope is not None:
            meta[CREW_SCOPE_TAG] = _join(self.root_scope, scope)
        if categories is not None:
            meta[CATEGORIES_TAG] = list(categories)
        changes: dict[str, Any] = {"metadata": meta}
        if content is not None:
            changes["text"] = content
        if importance is not None:
            changes["importance"] = importance
        return _record(self._clients.sync.update(record_id, **changes))

    def forget(self, scope: Optional[str] = None, categories: Optional[list[str]] = None, older_than: Any = None,
               metadata_filter: Optional[dict[str, Any]] = None, record_ids: Optional[list[str]] = None) -> int:
        """Forget this memory's own cells (written by this agent under `name`) that match."""
        cells = list(self._clients.sync.list(owner_id=self.owner_id, metadata={SCOPE_TAG: self.scope_tag}))
        mine = set(owned_by_scope(cells, self._clients.agent_id))
        chosen = [
            c for c in cells if c.id in mine
            and (record_ids is None or c.id in record_ids)
            and (scope is None or _record(c).scope.startswith(_join(self.root_scope, scope)))
            and (not categories or set(categories) & set(_record(c).categories))
            and (older_than is None or c.lifecycle.created_at < older_than)
            and all(c.content.metadata.get(k) == v for k, v in (metadata_filter or {}).items())
        ]
        for cell in chosen:
            self._clients.sync.forget(cell.id)
        return len(chosen)

    def reset(self, scope: Optional[str] = None) -> None:
        self.forget(scope=scope)

    def reset_all(self) -> None:
        # Even "all" means all of this memory's own cells: never the user's or other agents'.
        self.forget()

    def close(self) -> None:
        self._clients.close()
