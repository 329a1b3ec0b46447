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

from .glob import GlobError, check as check_glob

AMP_VERSION = "0.1.0"
CELL_ID_PATTERN = r"^mem_[0-9A-Z]{26}$"

# Agent and owner ids are opaque strings; the limits keep them printable and bounded.
IdString = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")]
CellId = Annotated[str, Field(pattern=CELL_ID_PATTERN)]
# Access patterns: one grammar (`ampkit.glob`); anything outside it is a 422 with the reason.
def _check_glob(value: str) -> str:
    try:
        return check_glob(value)
    except GlobError as exc:
        raise ValueError(f"invalid pattern: {exc}") from None


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


class AccessPolicy(Closed):
    readable_by: list[GlobPattern] = Field(default_factory=list, max_length=64)
    writable_by: list[GlobPattern] = Field(default_factory=list, max_length=64)
    public: StrictBool = False


class Provenance(Closed):
    source_type: Optional[SourceType] = None
    source_ref: Optional[Annotated[str, Field(max_length=2048)]] = None
    extraction_method: Optional[ExtractionMethod] = None


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
