"""The memory cell and the request/response bodies of the `/amp/v1` wire protocol.

These pydantic models are the single source of the schema: the server validates with
them, the clients decode with them, `spec/memory-cell.schema.json` and `spec/openapi.json`
are generated from them. Every object is closed (`extra="forbid"`), as in AMP v0.1.

Fields marked "extension" are ampkit additions to AMP v0.1; an AMP v0.1 client that
ignores unknown response fields keeps working.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from enum import Enum
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, field_validator

from .limits import MAX_BATCH_CELLS, MAX_PAGE_SIZE, MAX_SEARCH_LIMIT  # noqa: F401 - re-exported

AMP_VERSION = "0.1.0"
CELL_ID_PATTERN = r"^mem_[0-9A-Z]{26}$"

# Agent and owner ids are opaque strings; the limits keep them printable and bounded.
IdString = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")]
CellId = Annotated[str, Field(pattern=CELL_ID_PATTERN)]
# fnmatch-style patterns: `*`, `?`, `[seq]`, `[!seq]`. `[^` is refused because fnmatch and
# SQL GLOB read it differently (literal `^` versus negation).
def _check_glob(value: str) -> str:
    if "[^" in value:
        raise ValueError("use [!seq] for a negated set; [^ is ambiguous between fnmatch and SQL GLOB")
    return value


GlobPattern = Annotated[
    str, Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$"), AfterValidator(_check_glob)
]
# Numbers and booleans are strict: "0.5" or "yes" is a 422, as the JSON Schema says, not coerced.
Unit = Annotated[float, Strict(), Field(ge=0.0, le=1.0)]
DecayRate = Annotated[float, Strict(), Field(ge=0.0, le=100.0)]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _as_utc(value: datetime) -> datetime:
    # A time without an offset is read as UTC; comparing it with the server's aware clock
    # would otherwise raise (and one such cell would break every lifecycle run).
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


as_utc = _as_utc  # the public name, for callers that take a datetime from Python
UtcDatetime = Annotated[datetime, AfterValidator(_as_utc)]


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", use_enum_values=True)


class MemoryType(str, Enum):
    episodic = "episodic"
    semantic = "semantic"
    procedural = "procedural"


class OwnerType(str, Enum):
    user = "user"
    agent = "agent"
    organization = "organization"


class Status(str, Enum):
    active = "active"
    stale = "stale"
    archived = "archived"
    deleted = "deleted"


class SourceType(str, Enum):
    conversation = "conversation"
    document = "document"
    inference = "inference"
    user_explicit = "user_explicit"


class ExtractionMethod(str, Enum):
    llm_extraction = "llm_extraction"
    rule_based = "rule_based"
    user_explicit = "user_explicit"


def _text_not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("text must contain a non-whitespace character")
    return value


class Content(Closed):
    text: str = Field(min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict)

    _check_text = field_validator("text")(_text_not_blank)


# A cell key: a caller-chosen name, unique among one owner's live cells (see Identity.key).
CellKey = Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[^\x00-\x1f\x7f]+$")]


class Identity(Closed):
    owner_id: IdString
    owner_type: OwnerType = OwnerType.user
    created_by: Optional[IdString] = None  # set by the server from the caller's identity
    session_id: Optional[IdString] = None
    key: Optional[CellKey] = Field(
        default=None,
        description=(
            "extension: a caller-chosen name, unique among the owner's live cells (active or stale, "
            "not superseded). Creating a second live cell with the same owner and key is a 409 "
            "CONFLICT; set `supersedes` to replace the holder. Fixed at creation."
        ),
    )


class Lifecycle(Closed):
    created_at: UtcDatetime
    last_accessed_at: Optional[UtcDatetime] = None
    last_updated_at: Optional[UtcDatetime] = None
    expires_at: Optional[UtcDatetime] = None
    status: Status = Status.active
    # extensions
    version: int = Field(default=1, ge=1, description="extension: increments on every change")
    supersedes: Optional[CellId] = Field(default=None, description="extension: the cell this one replaced")
    superseded_by: Optional[CellId] = Field(default=None, description="extension: the cell that replaced this one")


class Scoring(Closed):
    importance: Unit = 0.5
    confidence: Unit = 1.0
    decay_rate: DecayRate = 0.01
    access_count: Annotated[int, Field(ge=0)] = 0
    # extensions: playbook outcomes (procedural cells; null on other types)
    success_count: Optional[Annotated[int, Field(ge=0)]] = Field(
        default=None, description="extension: outcomes recorded as successes (procedural cells)")
    failure_count: Optional[Annotated[int, Field(ge=0)]] = Field(
        default=None, description="extension: outcomes recorded as failures (procedural cells)")


class AccessPolicy(Closed):
    readable_by: list[GlobPattern] = Field(default_factory=list, max_length=64)
    writable_by: list[GlobPattern] = Field(default_factory=list, max_length=64)
    public: StrictBool = False


MAX_SUPPORTING_EPISODES = 200


class Provenance(Closed):
    source_type: Optional[SourceType] = None
    source_ref: Optional[Annotated[str, Field(max_length=2048)]] = None
    extraction_method: Optional[ExtractionMethod] = None
    # extensions: what a consolidation run derived the cell from
    extraction_model: Optional[Annotated[str, Field(max_length=256)]] = Field(
        default=None, description="extension: the model that extracted this cell")
    supporting_episode_ids: Optional[list[CellId]] = Field(
        default=None, max_length=MAX_SUPPORTING_EPISODES, description="extension: the episodes this cell was distilled from")


class MemoryCell(Closed):
    """A stored memory cell, as the server returns it."""

    amp_version: str = AMP_VERSION
    id: CellId
    type: MemoryType
    content: Content
    identity: Identity
    lifecycle: Lifecycle
    scoring: Scoring = Field(default_factory=Scoring)
    access_policy: AccessPolicy = Field(default_factory=AccessPolicy)
    provenance: Provenance = Field(default_factory=Provenance)


# ---------------------------------------------------------------- request bodies


class DedupPolicy(str, Enum):
    """What a create does when the owner already has the same memory (docs/consolidation.md).

    off: always store. exact (default): the same normalised text (same owner and type, a cell
    the writer can read) is not stored again; the existing cell is returned. skip: also
    near-duplicates (similarity >= the threshold) return the existing cell. merge: as skip,
    and a writable existing cell takes the higher importance and confidence and the new
    metadata keys."""

    off = "off"
    exact = "exact"
    skip = "skip"
    merge = "merge"


class CreateScoring(Closed):
    importance: Unit = 0.5
    confidence: Unit = 1.0
    decay_rate: DecayRate = 0.01


class CreateLifecycle(Closed):
    expires_at: Optional[UtcDatetime] = None


class CellCreate(Closed):
    """POST /memories. Server-owned fields (id, timestamps, status, access_count) are refused."""

    amp_version: Optional[Literal["0.1.0"]] = None
    type: MemoryType = MemoryType.semantic
    content: Content
    identity: Identity
    scoring: CreateScoring = Field(default_factory=CreateScoring)
    access_policy: AccessPolicy = Field(default_factory=AccessPolicy)
    provenance: Provenance = Field(default_factory=Provenance)
    lifecycle: CreateLifecycle = Field(default_factory=CreateLifecycle)
    supersedes: Optional[CellId] = Field(default=None, description="extension: id of a cell this one replaces")
    dedup: Optional[DedupPolicy] = Field(
        default=None,
        description="extension: off | exact | skip | merge; unset: the server's default (exact unless "
        "AMPKIT_DEDUP_DEFAULT says otherwise); see docs/consolidation.md#dedup-on-write",
    )


class ContentPatch(Closed):
    text: Optional[str] = Field(default=None, min_length=1)
    metadata: Optional[dict[str, Any]] = None

    @field_validator("text")
    @classmethod
    def _not_blank(cls, value: Optional[str]) -> Optional[str]:
        return None if value is None else _text_not_blank(value)


class ScoringPatch(Closed):
    importance: Optional[Unit] = None
    confidence: Optional[Unit] = None
    decay_rate: Optional[DecayRate] = None


class AccessPolicyPatch(Closed):
    readable_by: Optional[list[GlobPattern]] = Field(default=None, max_length=64)
    writable_by: Optional[list[GlobPattern]] = Field(default=None, max_length=64)
    public: Optional[StrictBool] = None


class ProvenancePatch(Closed):
    source_type: Optional[SourceType] = None
    source_ref: Optional[Annotated[str, Field(max_length=2048)]] = None
    extraction_method: Optional[ExtractionMethod] = None


class LifecyclePatch(Closed):
    """Only `status` (active/stale -> archived) and `expires_at` may be patched."""

    status: Optional[Status] = None
    expires_at: Optional[UtcDatetime] = None


class IdentityPatch(Closed):
    session_id: Optional[IdString] = None


class CellPatch(Closed):
    """PATCH /memories/{id}: nested objects are merged field by field."""

    content: Optional[ContentPatch] = None
    scoring: Optional[ScoringPatch] = None
    access_policy: Optional[AccessPolicyPatch] = None
    provenance: Optional[ProvenancePatch] = None
    lifecycle: Optional[LifecyclePatch] = None
    identity: Optional[IdentityPatch] = None




class SearchRequest(Closed):
    query: str = Field(min_length=1, max_length=4096)
    owner_id: Optional[IdString] = None
    types: Optional[list[MemoryType]] = Field(default=None, max_length=3)
    status: Optional[list[Status]] = Field(default=None, max_length=4)
    include_stale: StrictBool = False
    include_superseded: StrictBool = Field(default=False, description="extension")
    session_id: Optional[IdString] = Field(default=None, description="extension")
    metadata: Optional[dict[str, Any]] = Field(default=None, description="equality filter on content.metadata keys")
    limit: StrictInt = Field(default=10, ge=1, le=MAX_SEARCH_LIMIT)
    explain: StrictBool = Field(default=False, description="extension: include each result's score breakdown")
    rank_playbooks: StrictBool = Field(
        default=False,
        description="extension: procedural hits are re-scored with the Wilson lower bound of their outcomes",
    )
    as_of: Optional[UtcDatetime] = Field(
        default=None,
        description="extension (as-of read): search the cells as they were at this time, rebuilt from history; "
        "keyword ranking only (docs/time-travel.md)",
    )

    @field_validator("query")
    @classmethod
    def _query_not_blank(cls, value: str) -> str:
        return _text_not_blank(value)


class SearchHit(MemoryCell):
    score: float
    explain: Optional[dict[str, float]] = None


class SearchResponse(Closed):
    results: list[SearchHit]
    total: int
    query: str


class ListResponse(Closed):
    results: list[MemoryCell]
    total: int
    next_cursor: Optional[str] = None


class HistoryEntry(Closed):
    seq: int
    cell_id: CellId
    at: UtcDatetime
    actor: str
    action: str
    changes: dict[str, Any] = Field(default_factory=dict)


class HistoryResponse(Closed):
    results: list[HistoryEntry]


class RollbackRequest(Closed):
    """POST /memories/{id}/rollback (extension): restore an earlier version as a new one."""

    to_version: StrictInt = Field(ge=1, description="the lifecycle.version to restore (content, scoring, access policy, provenance)")


class BatchCreate(Closed):
    cells: list[CellCreate] = Field(min_length=1, max_length=MAX_BATCH_CELLS)


class BatchCreateResponse(Closed):
    results: list[MemoryCell]
    deduplicated: list[int] = Field(
        default_factory=list, description="extension: indexes of results that are existing cells (dedup on write)")


class LifecycleRunRequest(Closed):
    as_of: Optional[UtcDatetime] = Field(
        default=None, description="evaluate as if the clock read this time (admin; for tests and back-fills)"
    )


class LifecycleRunResponse(Closed):
    evaluated: int
    to_stale: int
    to_active: int
    to_archived: int
    expired: int
    ran_at: UtcDatetime


class PurgeRequest(Closed):
    ids: Optional[list[CellId]] = Field(default=None, max_length=1000)
    as_of: Optional[UtcDatetime] = None


class PurgeRefusal(Closed):
    id: str
    reason: str


class PurgeResponse(Closed):
    purged: list[str]
    refused: list[PurgeRefusal]


class OutcomeRequest(Closed):
    """POST /memories/{id}/outcome: one run of a playbook (a procedural cell)."""

    success: StrictBool
    note: Optional[str] = Field(default=None, max_length=2048)


MAX_CONSOLIDATE_EPISODES = 1000


class ConsolidateRequest(Closed):
    """POST /memories/consolidate: distil an owner's episodes into facts and playbooks."""

    owner_id: IdString
    session_id: Optional[IdString] = Field(default=None, description="the session's episodes")
    episode_ids: Optional[list[CellId]] = Field(default=None, min_length=1, max_length=MAX_CONSOLIDATE_EPISODES,
                                                description="these episodes (a window picked by the caller)")
    since: Optional[UtcDatetime] = Field(default=None, description="episodes created at or after this")
    until: Optional[UtcDatetime] = Field(default=None, description="episodes created before this")
    playbooks: Literal["propose", "apply"] = Field(
        default="propose", description="propose: playbook changes are returned, not written (they need approval)")
    dry_run: StrictBool = Field(default=False, description="decide everything, write nothing")


class ConsolidationDecision(Closed):
    """What consolidation did with one candidate, and why."""

    action: Literal["ADD", "UPDATE", "CONTRADICT", "NOOP", "DROP"]
    applied: bool
    reason: str
    type: MemoryType
    text: str
    supporting_episode_ids: list[str] = Field(default_factory=list)
    target_id: Optional[str] = Field(default=None, description="the existing cell it updates, contradicts or duplicates")
    cell_id: Optional[str] = Field(default=None, description="the cell written")
    similarity: Optional[float] = None
    confidence: Optional[float] = None


class ConsolidateResponse(Closed):
    owner_id: str
    session_id: Optional[str] = None
    model: str
    episodes: int = Field(description="episodes read")
    model_calls: int
    decisions: list[ConsolidationDecision]
    written: list[str] = Field(default_factory=list, description="ids of the cells written")
    dry_run: bool = False


class ErrorDetail(Closed):
    code: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorEnvelope(Closed):
    error: ErrorDetail


class Health(Closed):
    status: Literal["ok"] = "ok"
    amp_version: str = AMP_VERSION


def is_cell_id(value: str) -> bool:
    return re.fullmatch(CELL_ID_PATTERN, value) is not None
