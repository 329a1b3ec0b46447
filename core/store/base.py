"""The store interface: the contract every backend implements and `tests/test_store_contract.py`
holds every backend to.

A store keeps cells, their history and (optionally) their vectors. It knows nothing of the
access rules or the lifecycle: `ampkit.service` decides, the store only filters and persists.
Two guarantees matter:

- every multi-row change runs inside `write()`, one transaction: the cell row, its keyword
  index, its readers and its history entry commit together or not at all;
- `CellFilter.reader` is applied *inside* the query (before ranking and before the page is
  cut), so a page or a top-k is never short because of cells the caller cannot read.
"""

from __future__ import annotations

import builtins
import base64
import hashlib
import json
import re
import warnings
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Iterator, Optional, Sequence

from pydantic_core import PydanticSerializationError

from ..errors import ValidationFailed
from ..models import HistoryEntry, MemoryCell, Status, storable_text
from ._files import FolderRecord, ProposalRecord

ALL_STATUSES: tuple[str, ...] = tuple(status.value for status in Status)

# Same-session neighbours on each side that a cell's keyword window includes, in every SQL
# store. Chosen on LoCoMo (bench/locomo.py): recall rises with the window up to this radius.
CONTEXT_RADIUS = 2


@dataclass
class CellFilter:
    """Which cells a list, count or search leg may consider."""

    reader: Optional[str] = None  # agent id; None = no access filter (lifecycle, admin, copy)
    owner_id: Optional[str] = None
    types: Optional[Sequence[str]] = None
    statuses: Sequence[str] = (Status.active.value,)  # never contains "deleted" for a reader
    include_superseded: bool = False
    session_id: Optional[str] = None
    metadata: Optional[dict[str, Any]] = None
    not_expired_at: Optional[datetime] = None  # hide cells whose expires_at <= this
    pinned_only: bool = False  # only cells with lifecycle.pinned (a search's pinned cells)


@dataclass
class Candidate:
    """One hit from a retrieval leg: the raw score of that leg (higher is better)."""

    cell_id: str
    score: float


@dataclass
class StoredVector:
    model: str
    vector: Any  # numpy float32 array, L2-normalised


@dataclass
class HistoryRecord:
    cell_id: str
    at: datetime
    actor: str
    action: str
    changes: dict[str, Any] = field(default_factory=dict)


@dataclass
class ApiKeyRecord:
    """One stored API key (see `ampkit.auth`). The secret itself is never stored.

    `key_id` is the public half of the key (`ampk_<key_id>_<secret>`) and the primary key;
    `secret_hash` is the hex SHA-256 of the secret. Timestamps are timezone-aware UTC.
    A key is valid while `revoked_at` is None and `expires_at` is None or in the future."""

    key_id: str
    agent_id: str
    scopes: tuple[str, ...]
    secret_hash: str
    created_at: datetime
    expires_at: Optional[datetime] = None
    revoked_at: Optional[datetime] = None
    replaced_by: Optional[str] = None  # key_id of the key that rotated this one out


def encode_cursor(cell_id: str) -> str:
    return base64.urlsafe_b64encode(cell_id.encode()).decode().rstrip("=")


def decode_text_cursor(cursor: str) -> str:
    """The text `encode_cursor` encoded (a cell id, an owner id, a metadata value)."""
    pad = "=" * (-len(cursor) % 4)
    try:
        return base64.urlsafe_b64decode(cursor + pad).decode()
    except Exception as exc:  # noqa: BLE001 - any decoding problem is a bad cursor
        raise ValueError("invalid cursor") from exc


def decode_cursor(cursor: str) -> str:
    value = decode_text_cursor(cursor)
    if not value.startswith("mem_"):
        raise ValueError("invalid cursor")
    return value


# `json.dumps(value, ensure_ascii=False, separators=(",", ":"))`, one encoder for every call
# (window classes here, window terms in the SQLite store).
COMPACT_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def window_class(owner_id: str, session_id: Optional[str], created_by: Optional[str], public: bool,
                 readable_by: Sequence[str], status: str, superseded_by: Optional[str]) -> Optional[str]:
    """Which cells may lend each other keyword context (the session windows of the keyword
    index): those with the same value here. It is the same owner and session, the same
    readers (creator, `public`, the set of `readable_by` patterns) and the same status, so a
    window never shows anyone text they could not read themselves; a deleted or superseded
    cell, or one without a session, has no class and no neighbours."""
    if session_id is None or status == "deleted" or superseded_by is not None:
        return None
    key = COMPACT_JSON.encode([owner_id, session_id, created_by, bool(public), sorted(set(readable_by)), status])
    return hashlib.blake2b(key.encode("utf-8"), digest_size=16).hexdigest()


def cell_columns(cell: MemoryCell) -> tuple[dict[str, Any], dict[str, Any]]:
    """What every store keeps of a cell: the indexed columns (plain Python values, each store
    adapts the types) and the JSON body without its text, which lives once, in `text`."""
    columns, body, _ = cell_columns_json(cell)
    return columns, body


def cell_columns_json(cell: MemoryCell) -> tuple[dict[str, Any], dict[str, Any], str]:
    """`cell_columns` with the body also as compact JSON: it is serialised once, for the
    storability check and for a store that keeps it as text."""
    body = cell.model_dump(mode="json")
    text = body["content"].pop("text")
    serialised = json.dumps(body, separators=(",", ":"), ensure_ascii=False, check_circular=False)
    check_storable(body, serialised)
    check_storable(text)
    return _columns(cell, text), body, serialised


_BODY_EXCLUDE = {"content": {"text"}}


def cell_columns_text(cell: MemoryCell) -> tuple[dict[str, Any], str]:
    """`cell_columns` with the body only as compact JSON (a store that keeps it as text),
    serialised by pydantic in one pass: a third of `cell_columns_json`'s time, which a
    batch write pays per cell. The same values (a float may be spelled differently, 1e-7 for
    1e-07: JSON that reads back equal). A cell no store can keep takes `cell_columns_json`'s
    path, for its one 422."""
    try:
        serialised = cell.model_dump_json(exclude=_BODY_EXCLUDE)
    except PydanticSerializationError:  # a lone surrogate is no UTF-8
        serialised = ""
    text = cell.content.text
    if not serialised or "\\u0000" in serialised or _SURROGATE.search(text) is not None or "\x00" in text:
        columns, _, serialised = cell_columns_json(cell)
        return columns, serialised
    return _columns(cell, text), serialised


def _columns(cell: MemoryCell, text: str) -> dict[str, Any]:
    return {
        "id": cell.id,
        "owner_id": cell.identity.owner_id,
        "created_by": cell.identity.created_by,
        "session_id": cell.identity.session_id,
        "type": cell.type,
        "status": cell.lifecycle.status,
        "public": bool(cell.access_policy.public),
        "expires_at": cell.lifecycle.expires_at,
        "superseded_by": cell.lifecycle.superseded_by,
        "cell_key": cell.identity.key,
        "cell_path": cell.identity.path,
        "text": text,
        "window_class": window_class(
            cell.identity.owner_id, cell.identity.session_id, cell.identity.created_by, cell.access_policy.public,
            cell.access_policy.readable_by, cell.lifecycle.status, cell.lifecycle.superseded_by,
        ),
    }


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_storable(body: Any, serialised: Optional[str] = None) -> None:
    """Refuse a cell holding text no store can keep (NUL, a lone surrogate) with the same 422
    on every store. The models already refuse it on input; this holds the stores to one
    answer whatever builds the cell (SQLite would keep it, PostgreSQL would fail).
    `serialised`: `body` already as JSON (with ensure_ascii=False), if the caller has it."""
    # Fast path: a NUL in any key or value is serialised as the escape below, and a lone
    # surrogate passes through as itself, so a clean serialisation is a clean cell.
    if serialised is None:
        serialised = json.dumps(body, ensure_ascii=False, check_circular=False)
    if "\\u0000" not in serialised and _SURROGATE.search(serialised) is None:
        return
    pending = [body]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            try:
                storable_text(item)
            except ValueError as exc:
                raise ValidationFailed(f"cell: {exc}") from None


# Module-level, because inside `Store` the name `list` is the method.
HistoryPage = list[HistoryEntry]


@dataclass(frozen=True)
class FacetRow:
    """One group of `Store.facets`: how many matching cells an owner has of a type and status."""

    owner_id: str
    type: str
    status: str
    count: int


class WriteTx(ABC):
    """One open write transaction. Rows read with `get` are locked until it ends."""

    def savepoint(self) -> AbstractContextManager[None]:
        """A nested part of the transaction: an exception inside undoes the part alone (and
        propagates). Needed by group commit (`Store.serialised_writes`)."""
        raise NotImplementedError(f"{type(self).__name__} has no savepoints")

    @abstractmethod
    def get(self, cell_id: str) -> Optional[MemoryCell]: ...

    @abstractmethod
    def insert(self, cell: MemoryCell, vector: Optional[StoredVector] = None) -> None: ...

    @abstractmethod
    def key_holder(self, owner_id: str, key: str) -> Optional[MemoryCell]:
        """The owner's live cell (active or stale, not superseded) holding `key`, locked until
        the transaction ends; concurrent writers of the same key take turns here. A unique
        index on (owner_id, cell_key) over live cells backs it."""

    @abstractmethod
    def update(self, cell: MemoryCell, vector: Optional[StoredVector] = None) -> None:
        """Replace the stored cell (and its vector when given)."""

    @abstractmethod
    def add_history(self, record: HistoryRecord) -> None: ...

    @abstractmethod
    def purge(self, cell_id: str) -> None:
        """Physically remove the cell, its vector and its index entries; scrub its history."""

    def set_vector(self, cell_id: str, vector: StoredVector) -> None:
        """Store the cell's vector (the embedding queue's worker) and take it off the queue."""
        raise NotImplementedError

    # ------------------------------------------------------------ memory files (store/_files.py)
    def path_holder(self, owner_id: str, path: str) -> Optional[MemoryCell]:
        """The owner's live cell at file `path`, locked until the transaction ends (a unique
        index on (owner_id, cell_path) over live cells backs it)."""
        raise NotImplementedError

    def put_proposal(self, proposal: ProposalRecord) -> None:
        raise NotImplementedError

    def locked_proposal(self, proposal_id: str) -> Optional[ProposalRecord]:
        raise NotImplementedError

    def decide_proposal(self, proposal: ProposalRecord) -> None:
        """Store the decision fields (status, decided_by, decided_at, message, result_version)."""
        raise NotImplementedError

    def set_approval_mode(self, owner_id: str, mode: str, at: datetime, by: str) -> None:
        raise NotImplementedError


class Store(ABC):
    """A memory store. Constructors do no I/O; `open()` connects and migrates."""

    backend: str = "abstract"
    # The embedding queue (docs/retrieval.md#embedding-in-the-background): when True, a write
    # transaction queues every cell it inserts without a vector, or whose text it changes
    # without one, and `set_vector` takes it off. The composition root sets it before `open()`
    # when the retriever embeds in the background.
    embed_queue: bool = False
    # A store that embeds new rows itself (SQLite: with their keyword windows, after the
    # commit, one batch per pass) takes `embed_new`, a function of texts to their vectors
    # (None for a text the queue above embeds instead); the composition root sets it before
    # `open()`, and the service then writes a new cell without its vector.
    embeds_new_rows: bool = False
    embed_new: Optional[Callable[[Sequence[str]], builtins.list[Any]]] = None
    # One writer at a time (SQLite): its creates' transactions are then grouped, concurrent
    # ones committed together (`grouped_writes.writes_for`), which needs `WriteTx.savepoint`.
    serialised_writes: bool = False

    @abstractmethod
    def open(self) -> None:
        """Connect (and migrate). Opening an open store changes nothing."""

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def write(self) -> AbstractContextManager[WriteTx]:
        """A transaction; commits on normal exit, rolls back on an exception."""

    @abstractmethod
    def get(self, cell_id: str) -> Optional[MemoryCell]: ...

    @abstractmethod
    def get_many(self, cell_ids: Sequence[str]) -> dict[str, MemoryCell]: ...

    @abstractmethod
    def list(self, flt: CellFilter, limit: int, after_id: Optional[str] = None) -> list[MemoryCell]:
        """Cells matching `flt`, ordered by id, starting after `after_id`."""

    @abstractmethod
    def count(self, flt: CellFilter) -> int: ...

    @abstractmethod
    def keyword_candidates(self, query: str, flt: CellFilter, k: int) -> builtins.list[Candidate]:
        """Top-k by the backend's keyword ranker (BM25 for SQLite), best first."""

    def keyword_candidates_many(self, queries: Sequence[str], flt: CellFilter, k: int) -> builtins.list[builtins.list[Candidate]]:
        """`keyword_candidates` of each query, in order (a backend may share work between
        them, never scores: each list equals the query's own)."""
        return [self.keyword_candidates(query, flt, k) for query in queries]

    def texts_with_candidates(self, texts: Sequence[str], flt: CellFilter) -> Optional[set[str]]:
        """Which of `texts` `same_text_candidates` could find anything for under `flt` (a
        superset is fine), asked once for a batch; None when the store cannot tell more
        cheaply than asking for each text (the default)."""
        return None

    def same_text_candidates(self, text: str, flt: CellFilter, k: int) -> builtins.list[str]:
        """Ids of cells that may have the same words as `text` (a superset is fine: the caller
        compares the normalised texts), for dedup on write. Default: the keyword leg's top k
        for the text's first 64 words."""
        return [c.cell_id for c in self.keyword_candidates(" ".join(text.split()[:64]), flt, k)]

    def vector_candidates(self, vector: Any, model: str, flt: CellFilter, k: int) -> builtins.list[Candidate]:
        """Top-k by cosine similarity among cells embedded with `model`. Default: no dense leg.

        `flt` must be applied before ranking, exactly as in `keyword_candidates`: the top-k
        is taken among the cells the filter admits, never filtered after the cut."""
        return []

    def has_vectors(self, model: str, flt: CellFilter) -> bool:
        """Whether a cell `flt` admits has a vector of `model` (the multilingual leg runs only
        then). Decided on the admitted rows; a store-wide shortcut may only make it faster."""
        return False

    def vector_models(self, cell_ids: Sequence[str]) -> dict[str, str]:
        """cell id -> name of the model its stored vector came from (cells without a vector
        are absent). `ampkit reindex` uses it to skip cells already embedded with the current
        model; the default (empty) makes reindex re-embed everything, which is also correct."""
        return {}

    @abstractmethod
    def history(self, cell_id: str) -> HistoryPage: ...

    def history_scan(self, after: Optional[tuple[str, int]], limit: int) -> HistoryPage:
        """Up to `limit` history entries of every cell (purged ones too), ordered by
        (cell_id, seq), starting after the entry `after` = (cell_id, seq): the export's
        history section, one page at a time."""
        raise NotImplementedError(f"{type(self).__name__} cannot scan its history")

    def scan(self, flt: CellFilter, batch_size: int = 500) -> Iterator[MemoryCell]:
        """Every cell matching `flt`, in id order, one `list` page at a time."""
        after: Optional[str] = None
        while True:
            page = self.list(flt, batch_size, after)
            if not page:
                return
            yield from page
            after = page[-1].id

    def iter_cells(self, statuses: Optional[Sequence[str]] = None, batch_size: int = 500) -> Iterator[MemoryCell]:
        """Every cell (optionally of some statuses), in id order; for lifecycle runs, purge, copy."""
        return self.scan(CellFilter(statuses=tuple(statuses or ALL_STATUSES), include_superseded=True), batch_size)

    def try_lifecycle_lock(self) -> AbstractContextManager[bool]:
        """Held while a lifecycle run goes; yields False when another process holds it."""
        from contextlib import nullcontext

        return nullcontext(True)

    def claim_scheduled_lifecycle(self, interval_seconds: float) -> bool:
        """For the server's scheduler: True when this process should run the scheduled
        lifecycle now, False when another server sharing the store already ran it within the
        interval (so N servers run it once per interval, not N times). Manual runs never ask.
        Default: True (a store that one process owns)."""
        return True

    def claim_scheduled_job(self, name: str, interval_seconds: float) -> bool:
        """`claim_scheduled_lifecycle` for any named job (e.g. "consolidation"): True when this
        process should run it now. Default: True (a store that one process owns)."""
        return True

    def holds_embedding_lease(self) -> bool:
        """For the embedding worker (`ampkit.embed_queue`): True while this process is the one
        that embeds the store's queue, so that processes sharing the store (`ampkit serve
        --workers`, in-process clients beside a server) do not all embed the same cells with
        a slow model. The worker asks until it is granted (then it holds it until the store
        closes): a process that gets False asks again later, and takes over when the holder
        is gone. Default: True (a store that one process owns; on
        PostgreSQL every server embeds, which is harmless: the same vector is written twice)."""
        return True

    def ping(self) -> None:
        """Raise `Unavailable` when the store cannot answer a trivial read (GET /health).
        Default: a count that matches nothing, the cheapest query every store already has."""
        self.count(CellFilter(statuses=()))

    def facets(self, flt: CellFilter, limit: int, after_owner: Optional[str] = None) -> builtins.list[FacetRow]:
        """Counts of the cells matching `flt`, grouped by (owner, type, status), for the first
        `limit` owners (in owner order) after `after_owner` that have any: one GROUP BY, so an
        owners page never loads cells. The reader filter applies inside the query, as in
        `count`."""
        raise NotImplementedError(f"{type(self).__name__} cannot count by owner")

    def metadata_values(self, flt: CellFilter, key: str, limit: int,
                        after: Optional[str] = None) -> builtins.list[tuple[str, int]]:
        """The distinct string values of `content.metadata[key]` among the cells matching
        `flt`, in order, the first `limit` after `after`, each with how many cells hold it:
        one GROUP BY, no cell loaded. The reader filter applies inside the query."""
        raise NotImplementedError(f"{type(self).__name__} cannot group by a metadata value")

    def pending_migrations(self) -> builtins.list[tuple[int, str]]:
        """(version, name) of the migrations `open()` would apply; reads only, needs no
        `open()` (`ampkit migrate --check`). Default: none (a store without a schema)."""
        return []

    def stats(self) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------ embedding queue
    def embedding_queue_depth(self) -> int:
        """Cells waiting for a vector (all owners: an operational count, no cell's identity)."""
        return 0

    def queued_embeddings(self, limit: int) -> builtins.list[tuple[str, str]]:
        """(cell id, text) of up to `limit` queued cells, oldest first."""
        return []

    def pending_embeddings(self, flt: CellFilter, created_by: str, since_id: str,
                           limit: int) -> builtins.list[tuple[str, str]]:
        """(cell id, text) of up to `limit` queued cells that `flt` admits, written by
        `created_by`, with an id of at least `since_id` (created since then): newest first.
        What a search embeds before ranking (read-your-writes, docs/retrieval.md)."""
        return []

    def queue_stale_embeddings(self, model: str, batch_size: int = 10000, cjk_model: Optional[str] = None) -> int:
        """Queue every cell whose vector is missing or from another model (after the model
        changed); with `cjk_model`, a cell whose text has Korean, Japanese or Chinese script
        (textindex.CJK_CLASS) should have that model's vector instead. Returns how many were
        queued."""
        return 0

    # ------------------------------------------------------------ memory files (store/_files.py)
    def file_cells(self, owner_id: str) -> builtins.list[MemoryCell]:
        """The owner's live cells that have a path, ordered by path (no access filter)."""
        raise NotImplementedError

    def file_cell(self, owner_id: str, path: str) -> Optional[MemoryCell]:
        """The owner's live cell at `path`, or None (no access filter)."""
        raise NotImplementedError

    def get_proposal(self, proposal_id: str) -> Optional[ProposalRecord]:
        raise NotImplementedError

    def list_proposals(self, owner_id: Optional[str] = None, status: Optional[str] = None,
                       proposed_by: Optional[str] = None, after: Optional[str] = None,
                       limit: Optional[int] = None) -> builtins.list[ProposalRecord]:
        raise NotImplementedError

    def proposal_pages(self, owner_id: Optional[str] = None, after: Optional[str] = None,
                       batch_size: int = 500) -> Iterator[builtins.list[ProposalRecord]]:
        """Proposals (one owner's, or all) in id order after `after`, a page at a time; for
        export and copy."""
        while page := self.list_proposals(owner_id=owner_id, after=after, limit=batch_size):
            yield page
            after = page[-1].id

    def folders(self, owner_id: Optional[str] = None) -> builtins.list[FolderRecord]:
        """Owners' folder settings (approval modes), by owner; only those ever set."""
        raise NotImplementedError

    def approval_mode(self, owner_id: str) -> Optional[str]:
        """The owner's stored approval mode, None when never set (the default applies)."""
        raise NotImplementedError

    # ------------------------------------------------------------ API keys (ampkit.auth)
    @property
    @abstractmethod
    def keys(self) -> "ApiKeyStore":
        """The store's API keys: their own small interface, in the same database."""

    def put_key(self, key: ApiKeyRecord) -> None:
        """Deprecated: `store.keys.put(key)`."""
        _deprecated("put_key", "keys.put")
        self.keys.put(key)

    def get_key(self, key_id: str) -> Optional[ApiKeyRecord]:
        """Deprecated: `store.keys.get(key_id)`."""
        _deprecated("get_key", "keys.get")
        return self.keys.get(key_id)

    def list_keys(self, agent_id: Optional[str] = None) -> builtins.list[ApiKeyRecord]:
        """Deprecated: `store.keys.list(agent_id)`."""
        _deprecated("list_keys", "keys.list")
        return self.keys.list(agent_id)

    def update_key(self, key: ApiKeyRecord) -> None:
        """Deprecated: `store.keys.update(key)`."""
        _deprecated("update_key", "keys.update")
        self.keys.update(key)


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"Store.{old} is deprecated; use Store.{new}", DeprecationWarning, stacklevel=3)


class ApiKeyStore(ABC):
    """Where API keys live (see `ampkit.auth`); split from the cell store's interface because
    nothing about keys is a cell: no filter, no history, no index touches them."""

    @abstractmethod
    def put(self, key: ApiKeyRecord) -> None:
        """Insert a new key record; raise ValueError if `key.key_id` already exists.
        Must be durable when it returns (the CLI prints the key right after)."""

    @abstractmethod
    def get(self, key_id: str) -> Optional[ApiKeyRecord]:
        """The record for `key_id` (whatever its state: expired and revoked keys too), or None.
        Called once per authenticated request: make it one indexed lookup."""

    @abstractmethod
    def list(self, agent_id: Optional[str] = None) -> builtins.list[ApiKeyRecord]:
        """Every key record (or only `agent_id`'s), oldest first (created_at, then key_id)."""

    @abstractmethod
    def update(self, key: ApiKeyRecord) -> None:
        """Store the mutable fields of an existing key: `expires_at`, `revoked_at`,
        `replaced_by` (the rest never changes). Raise KeyError if `key.key_id` is unknown."""
