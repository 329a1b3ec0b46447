"""The memory service: every protocol rule, over any store.

The HTTP routes and the in-process clients both call this class, so a rule (who may read,
which transitions are legal, what a PATCH merges) is written once. Methods take the caller's
agent id and raise `ampkit.errors` exceptions; they never see HTTP.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from pydantic import TypeAdapter, ValidationError
from ulid import ULID

from .access import can_read, can_write, check_policy_change, may_change_policy
from .consolidation import ConsolidationPolicy, Consolidator
from .files.service import FileService
from .groupcommit import GroupCommit, Submission
from .dedup import DEFAULT_THRESHOLD, NEAR_POLICIES, Duplicate, find_duplicate, normalise_text, without_exact_candidates
from .textindex import text_key
from .errors import (
    APIError,
    Conflict,
    FileManaged,
    Forbidden,
    InvalidTransition,
    Unavailable,
    ValidationFailed,
    access_denied,
    validation_to_api_error,
)
from . import versions
from .lifecycle import (
    LifecyclePolicy,
    decay_score,
    check_delete_transition,
    check_patch_transition,
    check_restore_transition,
    is_expired,
    purge_eligible,
    scheduled_status,
)
from .limits import Limits
from .models import (
    cell_size_bytes,
    check_cell_size,
    AMP_VERSION,
    MAX_CONSOLIDATE_EPISODES,
    MAX_METADATA_DEPTH,
    MAX_PATTERN_LENGTH,
    MAX_PATTERN_STARS,
    PATCH_IGNORED,
    PATCH_SERVER_MANAGED,
    CellCreate,
    CellPatch,
    IdString,
    ConsolidateRequest,
    ConsolidateResponse,
    HistoryEntry,
    Identity,
    LifecycleRunResponse,
    MemoryCell,
    MemoryType,
    MetadataValue,
    MetadataValuesResponse,
    PurgeRefusal,
    PurgeResponse,
    SearchHit,
    SearchRequest,
    SearchResponse,
    Status,
    as_utc,
    check_json_value,
    is_cell_id,
    storable_text,
    utcnow,
)
from .playbooks import playbook_score
from .retrieval import Retriever, ScoredCell, clears, tie_broken
from .store.base import CellFilter, HistoryRecord, Store, WriteTx, decode_cursor, decode_text_cursor, encode_cursor

if TYPE_CHECKING:
    from .llm import ChatModel

SYSTEM_ACTOR = "system:lifecycle"


@dataclass
class OwnerCounts:
    """One row of `MemoryService.owners`: an owner's readable cells, counted."""

    owner_id: str
    total: int = 0
    by_type: dict[str, int] = field(default_factory=dict)
    by_status: dict[str, int] = field(default_factory=dict)


def new_cell_id() -> str:
    return f"mem_{ULID()}"


# How far back a search embeds its caller's queued writes: a write's own burst, not a backlog
# (a model change re-queues every cell; the worker embeds those).
RECENT_WRITES_SECONDS = 60.0


def first_id_since(seconds_ago: float) -> str:
    """The smallest cell id a cell created since `seconds_ago` (wall clock: ids carry it) has."""
    return f"mem_{str(ULID.from_timestamp(time.time() - seconds_ago))[:10]}{'0' * 16}"


def searched(cell: MemoryCell, req: SearchRequest) -> bool:
    """Whether a search considers `cell` beyond its filter: memory files (cells with a path,
    docs/files.md) have the files API and the instructions path, and join an ordinary search
    only with `include_files`."""
    return req.include_files or cell.identity.path is None


def _check_sent_back(patch: CellPatch, cell: MemoryCell, reader: bool) -> None:
    """Server-managed fields in a PATCH (AMP 0.1 clients send them back) must equal the cell's.
    Only a reader may send them: comparing them for a writer-only caller would answer its
    guesses about fields it may not read, so that caller is refused on sight of the field."""
    sent = []
    for section, name in PATCH_SERVER_MANAGED:
        part = patch if section is None else getattr(patch, section)
        if part is not None and name in part.model_fields_set:
            sent.append((section, name, getattr(part, name)))
    if sent and not reader:
        fields = [f"{s}.{n}" if s else n for s, n, _ in sent]
        raise ValidationFailed(
            f"{', '.join(fields)}: server-managed fields can only be sent back by a caller that may read the cell",
            {"fields": fields},
        )
    for section, name, value in sent:
        current = getattr(cell if section is None else getattr(cell, section), name)
        if value != current:
            path = f"{section}.{name}" if section else name
            raise ValidationFailed(
                f"{path} is managed by the server and cannot be changed; send it unchanged or leave it out",
                {"field": path},
            )


_ID_PARAM: TypeAdapter[str] = TypeAdapter(IdString)


def storable_or_none(value: str) -> Optional[str]:
    """`value` when it can be echoed in an error's details (as JSON), else None."""
    try:
        return storable_text(value)
    except ValueError:
        return None


def _text_cursor(cursor: Optional[str], check: Callable[[str], Any]) -> Optional[str]:
    """Where a page keyed by text (owner ids, metadata values) starts; `check` refuses a
    decoded value that could not be a key."""
    if not cursor:
        return None
    try:
        after = decode_text_cursor(cursor)
        check(after)
    except (ValueError, ValidationFailed):
        raise ValidationFailed("invalid cursor", {"cursor": storable_or_none(cursor)}) from None
    return after


def _check_params(*, metadata: Optional[dict[str, Any]] = None, **ids: Optional[str]) -> None:
    """List and export parameters, checked like the same fields of a search body (HTTP query
    strings and in-process calls both come through here)."""
    for name, value in ids.items():
        if value is None:
            continue
        try:
            _ID_PARAM.validate_python(value)
        except ValidationError as exc:
            raise ValidationFailed(f"{name}: {exc.errors()[0]['msg']}", {"param": name}) from None
    if metadata is not None:
        try:
            check_json_value(metadata)
        except ValueError as exc:
            raise ValidationFailed(f"metadata: {exc}", {"param": "metadata"}) from None


def with_pinned(pinned: Sequence[MemoryCell], hits: Sequence[ScoredCell], limit: int) -> list[ScoredCell]:
    """The first `limit` results of a search: the owner's pinned cells first (the best-scored
    first; one outside the ranked hits scores 0), then the other hits in rank order. `pinned`
    and `hits` hold only cells the caller may read."""
    ranked = {hit.cell.id: hit for hit in hits}
    top = [ScoredCell(ranked[c.id].cell, ranked[c.id].score, {**ranked[c.id].explain, "pinned": 1.0})
           if c.id in ranked else ScoredCell(c, 0.0, {"pinned": 1.0}) for c in pinned]
    top.sort(key=lambda h: (-h.score, h.cell.id))
    ids = {c.id for c in pinned}
    return (top + [hit for hit in hits if hit.cell.id not in ids])[:limit]


def _diff(old: Any, new: Any, prefix: str = "") -> dict[str, list[Any]]:
    """Field-path -> [old, new] for every leaf that changed."""
    if isinstance(old, dict) and isinstance(new, dict) and not prefix.endswith("metadata"):
        out: dict[str, list[Any]] = {}
        for key in sorted(set(old) | set(new)):
            out.update(_diff(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else key))
        return out
    return {} if old == new else {prefix: [old, new]}


_DEDUP_STRIPES = [threading.Lock() for _ in range(64)]


@dataclass
class MemoryService:
    store: Store
    policy: LifecyclePolicy = field(default_factory=LifecyclePolicy)
    limits: Limits = field(default_factory=Limits)
    retriever: Retriever = field(default_factory=Retriever)
    clock: Callable[[], datetime] = utcnow
    dedup_threshold: float = DEFAULT_THRESHOLD
    dedup_default: str = "exact"
    model: Optional["ChatModel"] = None  # consolidation's model; None = not configured
    consolidation: ConsolidationPolicy = field(default_factory=ConsolidationPolicy)
    # `as_of` on lifecycle runs and purges moves the clock for the whole store: it would purge
    # a cell deleted a second ago. Only test servers allow it (`--allow-clock-override`).
    allow_clock_override: bool = False
    # Concurrent creates committed together (ampkit.groupcommit) on a store with one writer.
    group_commit: bool = True
    # Read-your-writes for meaning (docs/retrieval.md): with a background embedder a search
    # first embeds up to this many of the caller's own queued cells that it would consider,
    # created in the last RECENT_WRITES_SECONDS, newest first. 0: never.
    search_embeds_pending: int = 16

    def __post_init__(self) -> None:
        self._creates: Optional[GroupCommit[tuple[str, list[CellCreate]]]] = (
            GroupCommit(self._create_group, max(1, self.limits.max_batch_cells))
            if self.group_commit and self.store.serialised_writes else None
        )

    # ---------------------------------------------------------------- helpers
    def _page_limit(self, limit: Optional[int]) -> int:
        limit = self.limits.default_page_size if limit is None else limit
        if not 1 <= limit <= self.limits.max_page_size:
            raise ValidationFailed(f"limit must be between 1 and {self.limits.max_page_size}", {"limit": limit})
        return limit

    def _clock_or(self, as_of: Optional[datetime]) -> datetime:
        if as_of is None:
            return self.clock()
        if not self.allow_clock_override:
            raise Forbidden(
                "as_of (a clock override) is refused: it would break the retention promise; "
                "only a test server started with --allow-clock-override accepts it",
                {"clock_override": False},
            )
        return as_of

    def _check_size(self, cell: MemoryCell, measured: bool = True) -> None:
        check_cell_size(cell, self.limits, measured)

    def _readable(self, cell: Optional[MemoryCell], agent: str) -> MemoryCell:
        if cell is None or not can_read(cell, agent):
            raise access_denied()
        return cell

    def _writable(self, cell: Optional[MemoryCell], agent: str) -> MemoryCell:
        # Missing, deleted and forbidden answer the same body: no oracle.
        if cell is None or not can_write(cell, agent):
            raise access_denied()
        return cell

    @property
    def files(self) -> FileService:
        """The memory folder of each owner (docs/files.md), over the same store and clock."""
        return FileService(self.store, self.clock, self.limits, self.retriever, lambda: new_cell_id())

    @staticmethod
    def _not_a_file(cell: MemoryCell, what: str) -> None:
        """The rule: a cell that is a memory file changes only through the files operations,
        where validation and approval apply (docs/files.md). Every change to an existing cell
        outside `files` (PATCH, rollback, delete, outcome, supersede) calls this after the
        write check and before it changes anything."""
        if cell.identity.path is not None:
            # The path is not named: a writer-only caller may not read the cell.
            raise FileManaged(f"this cell is a memory file: {what} it through the files API "
                              "(/files/write, /files/edit, /files/delete), which validates and asks for approval",
                              {"files_api": "/amp/v1/files"})

    def _build(self, req: CellCreate, agent: str, now: datetime) -> MemoryCell:
        if req.identity.path is not None:
            raise ValidationFailed("identity.path is set by the files API (POST /files/write), which validates "
                                   "the file and asks for approval; a plain create cannot make a file",
                                   {"field": "identity.path"})
        outcomes = {"success_count": 0, "failure_count": 0} if req.type == MemoryType.procedural.value else {}
        # The request's content, access policy and provenance are the very models a cell holds,
        # already validated: the cell takes them as they are (pydantic does not validate an
        # instance twice), which halves what a batch pays here per cell. Nothing changes a
        # model in place (changes are copies), so sharing them with the request is safe.
        cell = MemoryCell.model_validate(
            {
                "type": req.type,
                "content": req.content,
                "identity": Identity.model_validate({**req.identity.model_dump(), "created_by": agent}),
                "access_policy": req.access_policy,
                "provenance": req.provenance,
                "amp_version": AMP_VERSION,
                "id": new_cell_id(),
                "scoring": {**req.scoring.model_dump(), "access_count": 0, **outcomes},
                "lifecycle": {
                    "created_at": now,
                    "last_updated_at": now,
                    "expires_at": req.lifecycle.expires_at,
                    "status": Status.active.value,
                    "supersedes": req.supersedes,
                },
            }
        )
        self._check_size(cell)
        return cell

    def _claim_key(self, tx: WriteTx, cell: MemoryCell, agent: str, now: datetime) -> None:
        """One live cell per (owner, key). An expired holder is archived now (what the next
        lifecycle run would do) and frees the key; a live one makes this create a CONFLICT.
        The refusal tells the caller the key is taken even when it may not read the holder:
        a key is a name shared by everyone who writes into the owner's memory (docs/api.md)."""
        owner_id, key = cell.identity.owner_id, str(cell.identity.key)
        holder = tx.key_holder(owner_id, key)
        if holder is None:
            return
        if is_expired(holder, now):
            tx.update(self._with_status(holder, Status.archived.value, now))
            tx.add_history(HistoryRecord(holder.id, now, SYSTEM_ACTOR, "status",
                                         {"lifecycle.status": [holder.lifecycle.status, "archived"], "reason": "expired"}))
            return
        raise Conflict(f"owner {owner_id!r} already has a live cell with key {key!r}; supersede it to replace it",
                       {"key": key})

    # ---------------------------------------------------------------- create
    def _dedup_stripes(self, reqs: Sequence[CellCreate]) -> frozenset[int]:
        """The dedup locks these creates need: one per (owner, type, normalised text)."""
        # text_key: the same digest of the normalised text that the exact-duplicate index holds
        return frozenset(hash((r.identity.owner_id, r.type, text_key(r.content.text))) % len(_DEDUP_STRIPES)
                         for r in reqs if (r.dedup or self.dedup_default) != "off")

    @staticmethod
    def _dedup_guard(stripes: frozenset[int]) -> contextlib.ExitStack:
        """Holds, from the duplicate check to the commit, one lock per (owner, type, normalised
        text) among these cells: two identical writes racing each other in this process store
        one cell, not two. (Across server processes the check stays best effort.)"""
        stack = contextlib.ExitStack()
        for i in sorted(stripes):  # in order: no two batches wait for each other
            stack.enter_context(_DEDUP_STRIPES[i])
        return stack

    def create(self, agent: str, req: CellCreate) -> MemoryCell:
        return self.create_many(agent, [req])[0]

    def create_many(self, agent: str, reqs: Sequence[CellCreate]) -> list[MemoryCell]:
        """Create cells in one transaction: all are stored, or none."""
        return [cell for cell, _ in self.create_many_detailed(agent, reqs)]

    def _vectors_for_new(self, reqs: Sequence[CellCreate], cells: Sequence[MemoryCell]) -> list[Any]:
        """The vectors new cells are written with: none when the store embeds new rows itself
        (SQLite, with their keyword windows: docs/deployment.md#keyword-windows-after-the-commit-sqlite),
        except where a near-duplicate check needs the vector now."""
        if self.store.embed_new is None:
            return self.retriever.vectors_for([c.content.text for c in cells])
        now = [i for i, (req, cell) in enumerate(zip(reqs, cells)) if self._dedup_policy(req, cell) in NEAR_POLICIES]
        vectors: list[Any] = [None] * len(cells)
        for i, vector in zip(now, self.retriever.vectors_for([cells[i].content.text for i in now]) if now else []):
            vectors[i] = vector
        return vectors

    def _dedup_policy(self, req: CellCreate, cell: MemoryCell) -> str:
        """The dedup policy a create is checked under; "off" for an episodic cell, an explicit
        replacement (supersedes) or a named cell (key)."""
        if cell.type == MemoryType.episodic.value or req.supersedes is not None or cell.identity.key is not None:
            return "off"
        return str(req.dedup or self.dedup_default)

    def _duplicates(self, agent: str, reqs: Sequence[CellCreate], cells: list[MemoryCell],
                    vectors: Sequence[Any], now: datetime) -> list[Optional[Duplicate]]:
        """Per new cell: the readable cell it duplicates (docs/consolidation.md#dedup-on-write)."""
        found: list[Optional[Duplicate]] = []
        first_in_batch: dict[tuple[str, str, str], MemoryCell] = {}
        policies = [self._dedup_policy(req, cell) for req, cell in zip(reqs, cells)]
        # Exact-only checks: the batch's texts are looked up together first, and only those
        # with a candidate are compared one by one (most new memories have none).
        no_candidate = without_exact_candidates(
            self.store, agent, [cell for cell, policy in zip(cells, policies) if policy == "exact"], now)
        for cell, vector, policy in zip(cells, vectors, policies):
            if policy == "off":
                found.append(None)
                continue
            key = (cell.identity.owner_id, cell.type, normalise_text(cell.content.text))
            if key in first_in_batch:
                found.append(Duplicate(first_in_batch[key], "exact", 1.0))
                continue
            if cell.id in no_candidate:
                dup = None
            else:
                dup = find_duplicate(self.store, self.retriever, agent, cell, vector,
                                     near=policy in NEAR_POLICIES, threshold=self.dedup_threshold, now=now)
            if dup is None:
                first_in_batch[key] = cell
            found.append(dup)
        return found

    def _apply_duplicate(self, tx: Any, agent: str, req: CellCreate, new: MemoryCell, dup: Duplicate,
                         now: datetime) -> Optional[tuple[MemoryCell, str]]:
        """Count a restated memory as a use of the existing cell (access_count + 1, decay clock
        restarted); with `merge` and write access also take the higher importance and
        confidence and any new metadata keys. None when the cell changed meanwhile."""
        existing = tx.get(dup.cell.id)
        if existing is None or not can_read(existing, agent) or existing.lifecycle.superseded_by is not None \
                or existing.lifecycle.status not in (Status.active.value, Status.stale.value):
            return None
        before = existing.model_dump(mode="json")
        scoring = existing.scoring.model_copy(update={"access_count": existing.scoring.access_count + 1})
        lifecycle = existing.lifecycle.model_copy(update={"last_accessed_at": now})
        content = existing.content
        kind = dup.kind
        if (req.dedup or self.dedup_default) == "merge" and can_write(existing, agent):
            kind = "merged"
            scoring = scoring.model_copy(update={
                "importance": max(scoring.importance, new.scoring.importance),
                "confidence": max(scoring.confidence, new.scoring.confidence),
            })
            content = content.model_copy(update={"metadata": {**new.content.metadata, **content.metadata}})
        touched = existing.model_copy(update={"scoring": scoring, "lifecycle": lifecycle, "content": content})
        if kind == "merged":  # a change: a new version with its history entry
            changes: dict[str, Any] = _diff(before, touched.model_dump(mode="json"))
            changes.pop("lifecycle.last_accessed_at", None)
            changes.pop("scoring.access_count", None)
            changes.update({"dedup": kind, "similarity": round(dup.similarity, 4),
                            "merged_text": new.content.text})  # kept in the history: nothing said is lost
            touched = touched.model_copy(update={"lifecycle": touched.lifecycle.model_copy(
                update={"version": existing.lifecycle.version + 1, "last_updated_at": now})})
            tx.add_history(HistoryRecord(existing.id, now, agent, "dedup", changes))
        # Otherwise a use, like a read: counted, no history. A use revives a stale cell, as a read does.
        new_status, reason = scheduled_status(touched, now, self.policy)
        if new_status == Status.active.value:
            previous = touched.lifecycle.status
            touched = self._with_status(touched, new_status, now)
            tx.add_history(HistoryRecord(existing.id, now, agent, "status",
                                         {"lifecycle.status": [previous, new_status], "reason": reason}))
        tx.update(touched)
        return touched, kind

    def create_many_detailed(self, agent: str, reqs: Sequence[CellCreate]) -> list[tuple[MemoryCell, Optional[str]]]:
        """`create_many`, saying per request whether an existing cell was returned instead
        ("exact", "near" or "merged") or a new one stored (None)."""
        if self._creates is not None:
            return self._creates.submit(self._submission(agent, reqs))
        self._check_batch_size(reqs)
        now = self.clock()
        cells = [self._build(r, agent, now) for r in reqs]
        vectors = self._vectors_for_new(reqs, cells)
        with self._dedup_guard(self._dedup_stripes(reqs)):
            dups = self._duplicates(agent, reqs, cells, vectors, now)
            with self.store.write() as tx:
                return self._store_created(tx, agent, reqs, cells, vectors, dups, now)

    @property
    def commits_in_groups(self) -> bool:
        """Whether concurrent creates are committed together (`create_many_detailed_async`)."""
        return self._creates is not None

    async def create_many_detailed_async(self, agent: str,
                                         reqs: Sequence[CellCreate]) -> list[tuple[MemoryCell, Optional[str]]]:
        """`create_many_detailed` for a request on an event loop, on a store that commits in
        groups: the request waits for its group's commit without a thread of its own."""
        if self._creates is None:
            raise RuntimeError("this store does not commit creates in groups: call create_many_detailed in a thread")
        return await self._creates.submit_async(self._submission(agent, reqs))

    def _check_batch_size(self, reqs: Sequence[CellCreate]) -> None:
        if len(reqs) > self.limits.max_batch_cells:
            raise ValidationFailed(f"at most {self.limits.max_batch_cells} cells per batch")

    def _submission(self, agent: str, reqs: Sequence[CellCreate]) -> Submission[tuple[str, list[CellCreate]]]:
        self._check_batch_size(reqs)
        return Submission((agent, list(reqs)), max(1, len(reqs)), self._dedup_stripes(reqs))

    def _create_group(self, group: Sequence[Submission[tuple[str, list[CellCreate]]]]) -> None:
        """Group commit (ampkit.groupcommit): the creates of several requests, built and
        embedded together and written in one transaction, each in its own savepoint. A
        request's error (validation, access, conflict) is its own; the others still commit."""
        now = self.clock()
        built: list[tuple[Submission[tuple[str, list[CellCreate]]], list[MemoryCell]]] = []
        for sub in group:
            agent, reqs = sub.payload
            try:
                built.append((sub, [self._build(r, agent, now) for r in reqs]))
            except APIError as exc:  # the request's own error, raised in its thread
                sub.error = exc
        flat = self._vectors_for_new([r for sub, _ in built for r in sub.payload[1]],
                                     [c for _, cells in built for c in cells])
        vectors, at = [], 0
        for _, cells in built:
            vectors.append(flat[at : at + len(cells)])
            at += len(cells)
        with self._dedup_guard(frozenset().union(*(sub.stripes for sub, _ in built))):
            checked = []
            for (sub, cells), vecs in zip(built, vectors):
                agent, reqs = sub.payload
                try:
                    checked.append((sub, cells, vecs, self._duplicates(agent, reqs, cells, vecs, now)))
                except APIError as exc:
                    sub.error = exc
            with self.store.write() as tx:
                for sub, cells, vecs, dups in checked:
                    agent, reqs = sub.payload
                    try:
                        with tx.savepoint():
                            sub.result = self._store_created(tx, agent, reqs, cells, vecs, dups, now)
                    except APIError as exc:  # undone alone; a store failure fails the group
                        sub.error = exc

    def _store_created(self, tx: WriteTx, agent: str, reqs: Sequence[CellCreate], cells: list[MemoryCell],
                       vectors: Sequence[Any], dups: Sequence[Optional[Duplicate]],
                       now: datetime) -> list[tuple[MemoryCell, Optional[str]]]:
        out: list[tuple[MemoryCell, Optional[str]]] = []
        stored: set[str] = set()
        for req, cell, vector, dup in zip(reqs, cells, vectors, dups):
            if dup is not None:
                if dup.cell.id in stored:  # a duplicate within this batch
                    out.append((dup.cell, "exact"))
                    continue
                applied = self._apply_duplicate(tx, agent, req, cell, dup, now)
                if applied is not None:
                    out.append(applied)
                    continue
            old_id = cell.lifecycle.supersedes
            old = tx.get(old_id) if old_id is not None else None
            if old_id is not None:
                if old is None or not can_write(old, agent):
                    raise access_denied()
                self._not_a_file(old, "replace")
                cell = self._replacement_policy(req, cell, old, agent)
            out.append((cell, None))
            stored.add(cell.id)
            if old_id is not None and old is not None:
                if old.lifecycle.superseded_by is not None:
                    raise InvalidTransition(
                        f"{old_id} is already superseded by {old.lifecycle.superseded_by}",
                        {"superseded_by": old.lifecycle.superseded_by},
                    )
                replaced = old.model_copy(
                    update={
                        "lifecycle": old.lifecycle.model_copy(
                            update={
                                "superseded_by": cell.id,
                                "last_updated_at": now,
                                "version": old.lifecycle.version + 1,
                            }
                        )
                    }
                )
                tx.update(replaced)
                tx.add_history(HistoryRecord(old_id, now, agent, "supersede", {"lifecycle.superseded_by": [None, cell.id]}))
            if cell.identity.key is not None:
                self._claim_key(tx, cell, agent, now)
            tx.insert(cell, vector)
            created = {"type": cell.type, "owner_id": cell.identity.owner_id}
            if old_id:
                created["supersedes"] = old_id
            tx.add_history(HistoryRecord(cell.id, now, agent, "create", created))
        return out

    @staticmethod
    def _replacement_policy(req: CellCreate, cell: MemoryCell, old: MemoryCell, agent: str) -> MemoryCell:
        """The access policy of a cell that supersedes `old`. The owner or creator of `old`
        gives the replacement any policy; anyone else (a writer, an admin key too: an admin
        changes a policy with PATCH) replaces the content, not who may read it: the new cell
        takes `old`'s policy, and a request that names another one is refused (one naming
        any policy at all, when the writer may not read `old`)."""
        if "access_policy" in req.model_fields_set:
            check_policy_change(old, agent, cell.access_policy, sees_policy=can_read(old, agent))
        if may_change_policy(old, agent) or cell.access_policy == old.access_policy:
            return cell
        return cell.model_copy(update={"access_policy": old.access_policy})

    # ---------------------------------------------------------------- read
    def get(self, agent: str, cell_id: str, as_of: Optional[datetime] = None) -> MemoryCell:
        """Read a cell; counts the access and restarts its decay clock. With `as_of`, the cell
        as it was then (an as-of read: rebuilt from history, counts nothing, see `versions`).

        When the store cannot write (disk full or read-only) the read is still answered,
        uncounted: losing one access count is better than refusing every read."""
        if as_of is not None:
            return self.get_as_of(agent, cell_id, as_of)
        now = self.clock()
        try:
            with self.store.write() as tx:
                cell = self._readable(tx.get(cell_id), agent)
                scoring = cell.scoring.model_copy(update={"access_count": cell.scoring.access_count + 1})
                lifecycle = cell.lifecycle.model_copy(update={"last_accessed_at": now})
                touched = cell.model_copy(update={"scoring": scoring, "lifecycle": lifecycle})
                new_status, reason = scheduled_status(touched, now, self.policy)
                if new_status == Status.active.value:  # a read revives a stale cell
                    touched = self._with_status(touched, new_status, now)
                    tx.add_history(HistoryRecord(cell_id, now, agent, "status", {"lifecycle.status": [cell.lifecycle.status, new_status], "reason": reason}))
                tx.update(touched)
        except Unavailable:
            return self._readable(self.store.get(cell_id), agent)
        return touched

    def get_as_of(self, agent: str, cell_id: str, as_of: datetime) -> MemoryCell:
        """The cell as it was at `as_of`, readable under its policy then AND now. A cell that
        did not exist yet, was deleted then or since, or was purged: the usual ACCESS_DENIED."""
        current = self.store.get(cell_id)
        if current is None or not can_read(current, agent):
            raise access_denied()
        then = versions.cell_as_of(current, self.store.history(cell_id), as_utc(as_of))
        if then is None or not versions.readable_as_of(then, current, agent):
            raise access_denied()
        return then

    def rollback(
        self, agent: str, cell_id: str, to_version: int, *, expected_version: Optional[int] = None,
        may_read: bool = True, admin_key: bool = False,
    ) -> Optional[MemoryCell]:
        """Restore the content, scoring, access policy and provenance of version `to_version`
        as a new version (history action `rollback`, recording `to_version`), under the write
        rule. Lifecycle (status, expiry, supersession) and identity are not rolled back, and
        neither is the access policy when the caller may not change it (`may_change_policy`:
        a writer restores content, never who could read it then).
        Returns None, like `update`, when the caller may write but not read the cell (or, with
        `may_read=False`, its key lacks the read scope)."""
        now = self.clock()
        with self.store.write() as tx:
            cell = self._writable(tx.get(cell_id), agent)
            self._not_a_file(cell, "roll back")
            if expected_version is not None and expected_version != cell.lifecycle.version:
                raise Conflict(
                    f"cell is at version {cell.lifecycle.version}, not {expected_version}",
                    {"current_version": cell.lifecycle.version},
                )
            target = versions.cell_at_version(cell, self.store.history(cell_id), to_version)
            if target is None or to_version == cell.lifecycle.version:
                raise ValidationFailed(
                    f"to_version must be an earlier version this cell's history reaches (1 to {cell.lifecycle.version - 1})",
                    {"to_version": to_version, "current_version": cell.lifecycle.version},
                )
            before = cell.model_dump(mode="json")
            merged = json.loads(json.dumps(before))
            restored = target.model_dump(mode="json")
            sections = ["content", "provenance"]
            if may_change_policy(cell, agent, admin_key=admin_key):
                sections.append("access_policy")
            for section in sections:
                merged[section] = restored[section]
            for key in ("importance", "confidence", "decay_rate"):
                merged["scoring"][key] = restored["scoring"][key]
            diff = _diff(before, merged)
            if not diff:
                return cell if may_read and can_read(cell, agent) else None
            merged["lifecycle"]["last_updated_at"] = now
            merged["lifecycle"]["version"] = cell.lifecycle.version + 1
            updated = MemoryCell.model_validate(merged)
            vector = self.retriever.vectors_for([updated.content.text])[0] if "content.text" in diff else None
            tx.update(updated, vector)
            tx.add_history(HistoryRecord(cell_id, now, agent, "rollback", {**diff, "to_version": to_version}))
        return updated if may_read and can_read(updated, agent) else None

    def history(self, agent: str, cell_id: str) -> list[HistoryEntry]:
        """The cell's history, `seq` numbered from 1 within the cell: the store's sequence
        runs across all cells, so its gaps would count writes to cells the caller cannot read.
        The changes of versions the caller could not read at their time are left out, by the
        as-of read rule (`versions.readable_history`)."""
        current = self._readable(self.store.get(cell_id), agent)
        entries = versions.readable_history(current, self.store.history(cell_id), agent)
        return [entry.model_copy(update={"seq": n}) for n, entry in enumerate(entries, start=1)]

    # ---------------------------------------------------------------- update
    def _with_status(self, cell: MemoryCell, status: str, now: datetime) -> MemoryCell:
        lifecycle = cell.lifecycle.model_copy(
            update={"status": status, "last_updated_at": now, "version": cell.lifecycle.version + 1}
        )
        return cell.model_copy(update={"lifecycle": lifecycle})

    def update(
        self, agent: str, cell_id: str, patch: CellPatch, *, expected_version: Optional[int] = None,
        may_read: bool = True, admin_key: bool = False,
    ) -> Optional[MemoryCell]:
        """Merge a PATCH. Returns the updated cell, or None when the caller may write but not
        read it: being writable never makes a cell readable, not even through the answer.
        `may_read=False` (a key without the `read` scope) treats a reader as a writer-only
        caller: no cell in the answer, no measurement of the cell in an error. A change of the
        access policy needs the owner, the creator or an admin key (`admin_key`), see
        `access.check_policy_change`."""
        now = self.clock()
        changes = patch.model_dump(mode="json", exclude_unset=True)
        with self.store.write() as tx:
            cell = self._writable(tx.get(cell_id), agent)
            self._not_a_file(cell, "change")
            reader = may_read and can_read(cell, agent)
            if expected_version is not None and expected_version != cell.lifecycle.version:
                raise Conflict(
                    f"cell is at version {cell.lifecycle.version}, not {expected_version}",
                    {"current_version": cell.lifecycle.version},
                )
            _check_sent_back(patch, cell, reader)
            for section, name in PATCH_SERVER_MANAGED + PATCH_IGNORED:
                (changes if section is None else changes.get(section) or {}).pop(name, None)
            before = cell.model_dump(mode="json")
            merged = json.loads(json.dumps(before))
            for section, values in changes.items():
                if values is None:
                    continue
                merged[section].update(values)
            policy_values = changes.get("access_policy")
            check_policy_change(cell, agent, cell.access_policy.model_copy(update=policy_values) if policy_values else None,
                                admin_key=admin_key, sees_policy=reader)
            requested = (changes.get("lifecycle") or {}).get("status")
            if requested is not None:
                check_patch_transition(cell.lifecycle.status, requested)
            diff = _diff(before, merged)
            if not diff:
                return cell if reader else None
            merged["lifecycle"]["last_updated_at"] = now
            merged["lifecycle"]["version"] = cell.lifecycle.version + 1
            try:
                updated = MemoryCell.model_validate(merged)
            except ValidationError as exc:  # a merged cell that breaks a model rule
                # The cleaned errors carry no input values: nothing of the cell leaks.
                raise validation_to_api_error([dict(e) for e in exc.errors()]) from None
            self._check_size(updated, measured=reader)
            vector = None
            if "content.text" in diff:
                vector = self.retriever.vectors_for([updated.content.text])[0]
            tx.update(updated, vector)
            action = "status" if set(diff) == {"lifecycle.status"} else "update"
            tx.add_history(HistoryRecord(cell_id, now, agent, action, diff))
        return updated if may_read and can_read(updated, agent) else None

    def restore(self, agent: str, cell_id: str, *, expected_version: Optional[int] = None,
                may_read: bool = True) -> Optional[MemoryCell]:
        """Bring an archived cell back to active (extension `restore`: the way back from an
        archive, which PATCH may not take), under the write rule; history action `status` with
        reason `restored`. Refused for a memory file (the files API owns a file's existence),
        for a cell past its `expires_at` (the lifecycle would archive it again), and, as a
        create is, when a live cell now holds its key. Returns None like `update` when the
        caller may write but not read the cell."""
        now = self.clock()
        with self.store.write() as tx:
            cell = self._writable(tx.get(cell_id), agent)
            self._not_a_file(cell, "restore")
            if expected_version is not None and expected_version != cell.lifecycle.version:
                raise Conflict(
                    f"cell is at version {cell.lifecycle.version}, not {expected_version}",
                    {"current_version": cell.lifecycle.version},
                )
            check_restore_transition(cell.lifecycle.status)
            if is_expired(cell, now):
                raise InvalidTransition("this cell is past its expires_at: restored, it would be archived again",
                                        {"from": cell.lifecycle.status, "to": Status.active.value})
            if cell.identity.key is not None and cell.lifecycle.superseded_by is None:
                self._claim_key(tx, cell, agent, now)
            updated = self._with_status(cell, Status.active.value, now)
            tx.update(updated)
            tx.add_history(HistoryRecord(cell_id, now, agent, "status",
                                         {"lifecycle.status": [cell.lifecycle.status, updated.lifecycle.status],
                                          "reason": "restored"}))
        return updated if may_read and can_read(updated, agent) else None

    def record_outcome(self, agent: str, cell_id: str, success: bool, note: Optional[str] = None) -> Optional[MemoryCell]:
        """One run of a playbook, under the write rule. Returns the cell, or None when the
        caller may write but not read it (as PATCH does)."""
        now = self.clock()
        with self.store.write() as tx:
            cell = self._writable(tx.get(cell_id), agent)
            self._not_a_file(cell, "change")
            if cell.type != MemoryType.procedural.value:
                raise ValidationFailed("outcomes are recorded on procedural cells (playbooks)", {"type": cell.type})
            name = "success_count" if success else "failure_count"
            old = getattr(cell.scoring, name) or 0
            scoring = cell.scoring.model_copy(update={
                "success_count": cell.scoring.success_count or 0,
                "failure_count": cell.scoring.failure_count or 0,
                name: old + 1,
            })
            lifecycle = cell.lifecycle.model_copy(update={"last_updated_at": now, "version": cell.lifecycle.version + 1})
            updated = cell.model_copy(update={"scoring": scoring, "lifecycle": lifecycle})
            tx.update(updated)
            changes: dict[str, Any] = {f"scoring.{name}": [old, old + 1], "success": success}
            if note:
                changes["note"] = note
            tx.add_history(HistoryRecord(cell_id, now, agent, "outcome", changes))
        return updated if can_read(updated, agent) else None

    def set_pinned(self, agent: str, cell_id: str, pinned: bool, *, may_read: bool = True) -> Optional[MemoryCell]:
        """Pin (always in its owner's searches) or unpin a cell, under the write rule; pinning
        a pinned cell changes nothing. Returns the cell, or None when the caller may write but
        not read it (as PATCH does)."""
        now = self.clock()
        with self.store.write() as tx:
            cell = self._writable(tx.get(cell_id), agent)
            self._not_a_file(cell, "change")
            updated = cell
            if cell.lifecycle.pinned != pinned:
                lifecycle = cell.lifecycle.model_copy(
                    update={"pinned": pinned, "last_updated_at": now, "version": cell.lifecycle.version + 1})
                updated = cell.model_copy(update={"lifecycle": lifecycle})
                tx.update(updated)
                tx.add_history(HistoryRecord(cell_id, now, agent, "pin" if pinned else "unpin",
                                             {"lifecycle.pinned": [cell.lifecycle.pinned, pinned]}))
        return updated if may_read and can_read(updated, agent) else None

    def delete(self, agent: str, cell_id: str) -> None:
        now = self.clock()
        with self.store.write() as tx:
            cell = self._writable(tx.get(cell_id), agent)
            self._not_a_file(cell, "delete")
            check_delete_transition(cell.lifecycle.status)
            tx.update(self._with_status(cell, Status.deleted.value, now))
            tx.add_history(HistoryRecord(cell_id, now, agent, "delete", {"lifecycle.status": [cell.lifecycle.status, Status.deleted.value]}))

    # ---------------------------------------------------------------- embedding queue
    def embed_queued(self, batch_size: int = 16) -> int:
        """Embed up to `batch_size` queued cells (oldest first) and store their vectors; returns
        how many were looked at (0: the queue is empty). The embedding runs outside the write
        transaction; a cell whose text changed meanwhile stays queued for its new text, and a
        purged one has left the queue with its row."""
        if self.retriever.embedder is None:
            return 0
        queued = self.store.queued_embeddings(batch_size)
        if not queued:
            return 0
        self._store_vectors(queued)
        return len(queued)

    def _store_vectors(self, queued: Sequence[tuple[str, str]]) -> None:
        """Embed queued (cell id, text) pairs outside any transaction and store each vector,
        unless the cell's text changed meanwhile (it stays queued for its new text)."""
        vectors = self.retriever.embed_now([text for _, text in queued])
        with self.store.write() as tx:
            for (cell_id, text), vector in zip(queued, vectors):
                current = tx.get(cell_id)
                if current is not None and current.content.text == text:
                    tx.set_vector(cell_id, vector)

    def _embed_own_pending(self, agent: str, flt: CellFilter) -> None:
        """Read-your-writes for meaning: the caller's own recent writes that this search would
        consider and that still wait in the embedding queue get their vectors now, so the
        dense leg ranks them as it will once the worker has been by. Only cells the filter
        admits (readable by the caller) and that the caller wrote: the search never waits on,
        nor embeds, anyone else's cells. The worker takes the queue oldest first, this the
        newest first."""
        if self.search_embeds_pending <= 0 or not self.retriever.background or self.retriever.embedder is None:
            return
        pending = self.store.pending_embeddings(flt, agent, first_id_since(RECENT_WRITES_SECONDS),
                                                self.search_embeds_pending)
        if pending:
            self._store_vectors(pending)

    def drain_embeddings(self, batch_size: int = 16) -> int:
        """Embed until the queue is empty (benchmarks, tests, `ampkit reindex`); returns cells done."""
        done = 0
        while (n := self.embed_queued(batch_size)):
            done += n
        return done

    def embedding_status(self) -> dict[str, Any]:
        """What GET /health says about embedding: the model, the mode and the queue's depth (a
        count over all owners, no cell's identity: nothing a caller could not read leaks)."""
        embedder = self.retriever.embedder
        return {
            "model": embedder.name if embedder is not None else None,
            "multilingual_model": self.retriever.cjk_model,
            "background": self.retriever.background,
            "queued": self.store.embedding_queue_depth() if self.retriever.background else 0,
        }

    # ---------------------------------------------------------------- search and list
    def _statuses(self, status: Optional[Sequence[str]], include_stale: bool) -> list[str]:
        wanted = list(status) if status else [Status.active.value]
        if include_stale and Status.stale.value not in wanted:
            wanted.append(Status.stale.value)
        # A deleted cell is never returned, whatever the filter asks for.
        return [s for s in dict.fromkeys(wanted) if s != Status.deleted.value]

    def search(self, agent: str, req: SearchRequest) -> SearchResponse:
        if req.as_of is not None:
            return self._search_as_of(agent, req)
        now = self.clock()
        flt = CellFilter(
            reader=agent,
            owner_id=req.owner_id,
            types=req.types,
            statuses=self._statuses(req.status, req.include_stale),
            include_superseded=req.include_superseded,
            session_id=req.session_id,
            metadata=req.metadata,
            not_expired_at=now,
        )
        self._embed_own_pending(agent, flt)
        # The owner's pinned cells come first whatever the query and `min_score` (a person
        # asked for them), among those the caller may read and the search's filters admit.
        pinned = [c for c in self.store.list(replace(flt, owner_id=req.owner_id or agent, pinned_only=True), req.limit)
                  if can_read(c, agent) and searched(c, req)]
        fetch = min(self.limits.max_search_limit, req.limit * 4) if req.rank_playbooks else req.limit
        hits, total = self.retriever.search(
            self.store, req.query, flt, fetch + len(pinned), now,
            keep=lambda c: can_read(c, agent) and searched(c, req),
            min_score=0.0 if req.rank_playbooks else req.min_score,
        )
        if req.rank_playbooks:
            for hit in hits:
                hit.score, wilson = playbook_score(hit.cell, hit.score)
                if hit.cell.type == MemoryType.procedural.value:
                    hit.explain = {**hit.explain, "wilson": wilson, "score": hit.score}
            # min_score applies to the final (re-scored) score; the total counts the re-scored.
            hits = sorted((h for h in hits if clears(h.score, req.min_score)), key=lambda h: (-h.score, h.cell.id))
            total = len(hits)
        hits = with_pinned(pinned, hits, req.limit)
        results = [
            SearchHit(**h.cell.model_dump(), score=round(h.score, 6), explain=h.explain if req.explain else None)
            for h in hits
        ]
        return SearchResponse(results=results, total=total, query=req.query)

    def _search_as_of(self, agent: str, req: SearchRequest) -> SearchResponse:  # req.as_of is set
        """Keyword (BM25) ranking over the cells as they were at `req.as_of` that the caller
        may read: the stored indexes and vectors describe the present, so the past is ranked
        from its own texts, blended with decay as of that time like a live search."""
        assert req.as_of is not None
        at = as_utc(req.as_of)
        cells = versions.iter_as_of(
            self.store, agent, at, owner_id=req.owner_id, types=req.types,
            statuses=self._statuses(req.status, req.include_stale), include_superseded=req.include_superseded,
            session_id=req.session_id, metadata=req.metadata,
        )
        readable = [c for c in cells if searched(c, req)]
        owner = req.owner_id or agent
        pinned = [c for c in readable if c.lifecycle.pinned and c.identity.owner_id == owner][: req.limit]
        scored = versions.bm25_scores(req.query, readable)
        relevance = self.retriever.keyword_relevance(req.query, scored)
        hits = []
        for (cell, _), parts in zip(scored, relevance):
            decay = decay_score(cell, at)
            score = tie_broken(parts["relevance"], decay, self.retriever.config.decay_weight)
            if clears(score, req.min_score):
                hits.append((cell, score, {**parts, "decay": decay, "score": score}))
        hits.sort(key=lambda h: (-h[1], h[0].id))
        ranked = with_pinned(pinned, [ScoredCell(cell, score, parts) for cell, score, parts in hits], req.limit)
        results = [
            SearchHit(**h.cell.model_dump(), score=round(h.score, 6), explain=h.explain if req.explain else None)
            for h in ranked
        ]
        return SearchResponse(results=results, total=len(hits), query=req.query)

    def list(
        self,
        agent: str,
        *,
        owner_id: Optional[str] = None,
        types: Optional[Sequence[str]] = None,
        status: Optional[Sequence[str]] = None,
        include_stale: bool = False,
        include_superseded: bool = False,
        session_id: Optional[str] = None,
        metadata: Optional[dict[str, Any]] = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
        as_of: Optional[datetime] = None,
    ) -> tuple[list[MemoryCell], int, Optional[str]]:
        limit = self._page_limit(limit)
        _check_params(owner_id=owner_id, session_id=session_id, metadata=metadata)
        after = None
        if cursor:
            try:
                after = decode_cursor(cursor)
            except ValueError:
                after = None
            if after is None or not is_cell_id(after):
                raise ValidationFailed("invalid cursor", {"cursor": storable_or_none(cursor)})
        if as_of is not None:
            matching = versions.iter_as_of(
                self.store, agent, as_utc(as_of), owner_id=owner_id, types=types,
                statuses=self._statuses(status, include_stale), include_superseded=include_superseded,
                session_id=session_id, metadata=metadata,
            )
            total, page = 0, []  # type: tuple[int, list[MemoryCell]]
            for cell in matching:  # the total needs the whole set, so one pass gives both
                total += 1
                if (after is None or cell.id > after) and len(page) <= limit:
                    page.append(cell)
            next_cursor = encode_cursor(page[limit - 1].id) if len(page) > limit else None
            return page[:limit], total, next_cursor
        flt = CellFilter(
            reader=agent,
            owner_id=owner_id,
            types=types,
            statuses=self._statuses(status, include_stale),
            include_superseded=include_superseded,
            session_id=session_id,
            metadata=metadata,
            not_expired_at=self.clock(),
        )
        page = [c for c in self.store.list(flt, limit + 1, after) if can_read(c, agent)]
        next_cursor = encode_cursor(page[limit - 1].id) if len(page) > limit else None
        return page[:limit], self.store.count(flt), next_cursor

    def export(self, agent: str, owner_id: Optional[str] = None) -> builtins.list[MemoryCell]:
        """Every cell the caller may read (any status but deleted), for portability."""
        _check_params(owner_id=owner_id)
        statuses = [Status.active.value, Status.stale.value, Status.archived.value]
        flt = CellFilter(reader=agent, owner_id=owner_id, statuses=statuses, include_superseded=True)
        return [c for c in self.store.scan(flt) if can_read(c, agent)]

    def owners(
        self, agent: str, *, types: Optional[Sequence[str]] = None, status: Optional[Sequence[str]] = None,
        limit: Optional[int] = None, cursor: Optional[str] = None,
    ) -> tuple[builtins.list[OwnerCounts], Optional[str]]:
        """A page of the owners whose cells the caller may read, each with its counts by type
        and status (the cells `list` would show, superseded ones left out). Counted in the
        store (one GROUP BY over the readable cells): no cell is loaded."""
        limit = self._page_limit(limit)
        after = _text_cursor(cursor, lambda owner: _check_params(cursor=owner))
        wanted = status or [Status.active.value, Status.stale.value, Status.archived.value]
        flt = CellFilter(reader=agent, types=types, statuses=self._statuses(wanted, False),
                         not_expired_at=self.clock())
        page: dict[str, OwnerCounts] = {}
        for row in self.store.facets(flt, limit + 1, after):
            counts = page.setdefault(row.owner_id, OwnerCounts(row.owner_id))
            counts.total += row.count
            counts.by_type[row.type] = counts.by_type.get(row.type, 0) + row.count
            counts.by_status[row.status] = counts.by_status.get(row.status, 0) + row.count
        owners = builtins.list(page.values())
        next_cursor = None
        if len(owners) > limit:
            next_cursor = encode_cursor(owners[limit - 1].owner_id)
        return owners[:limit], next_cursor

    def metadata_values(
        self, agent: str, key: str, *, owner_id: Optional[str] = None, types: Optional[Sequence[str]] = None,
        status: Optional[Sequence[str]] = None, include_stale: bool = False, session_id: Optional[str] = None,
        metadata: Optional[dict[str, Any]] = None, limit: Optional[int] = None, cursor: Optional[str] = None,
    ) -> MetadataValuesResponse:
        """The distinct string values of `content.metadata[key]` among the cells the caller
        may read that `list` with these filters would show (superseded ones left out), each
        with its count; grouped in the store, so no cell is loaded (the LangGraph adapter
        lists namespaces with it)."""
        limit = self._page_limit(limit)
        if not key or len(key) > 256:
            raise ValidationFailed("key: a metadata key of 1 to 256 characters", {"param": "key"})
        _check_params(owner_id=owner_id, session_id=session_id, metadata=metadata)
        try:
            check_json_value({key: None})
        except ValueError as exc:
            raise ValidationFailed(f"key: {exc}", {"param": "key"}) from None
        after = _text_cursor(cursor, check_json_value)
        flt = CellFilter(reader=agent, owner_id=owner_id, types=types, statuses=self._statuses(status, include_stale),
                         session_id=session_id, metadata=metadata, not_expired_at=self.clock())
        rows = self.store.metadata_values(flt, key, limit + 1, after)
        next_cursor = None
        if len(rows) > limit:
            next_cursor = encode_cursor(rows[limit - 1][0])
        return MetadataValuesResponse(key=key, results=[MetadataValue(value=v, count=n) for v, n in rows[:limit]],
                                      next_cursor=next_cursor)

    def peek(self, agent: str, cell_id: str) -> MemoryCell:
        """Read a cell under the read rule without counting a use: a person inspecting a
        memory is not the agent using it, so its decay clock and access count stay put."""
        return self._readable(self.store.get(cell_id), agent)

    # ---------------------------------------------------------------- learning
    def consolidate(self, agent: str, req: ConsolidateRequest,
                    progress: Optional[Callable[[int], None]] = None) -> ConsolidateResponse:
        """Distil episodes into facts and playbooks (core/consolidation.py); 501 without a model."""
        return self.consolidator().run(agent, req, progress)

    def consolidator(self) -> Consolidator:
        return Consolidator(self, self.model, self.consolidation)

    # ---------------------------------------------------------------- lifecycle
    def run_lifecycle(self, as_of: Optional[datetime] = None) -> LifecycleRunResponse:
        now = self._clock_or(as_of)
        counts = {"evaluated": 0, "to_stale": 0, "to_active": 0, "to_archived": 0, "expired": 0}
        changes: list[tuple[str, str, str]] = []
        with self.store.try_lifecycle_lock() as got:
            if not got:  # another server is running it this interval
                return LifecycleRunResponse(**counts, ran_at=now)
            for cell in self.store.iter_cells([Status.active.value, Status.stale.value]):
                counts["evaluated"] += 1
                new_status, reason = scheduled_status(cell, now, self.policy)
                if new_status is not None:
                    changes.append((cell.id, new_status, reason))
            for i in range(0, len(changes), 200):
                with self.store.write() as tx:
                    for cell_id, new_status, reason in changes[i : i + 200]:
                        current = tx.get(cell_id)
                        if current is None:
                            continue
                        # Re-evaluate under the row lock: a request may have touched it meanwhile.
                        confirmed, reason = scheduled_status(current, now, self.policy)
                        if confirmed != new_status:
                            continue
                        tx.update(self._with_status(current, new_status, now))
                        tx.add_history(HistoryRecord(cell_id, now, SYSTEM_ACTOR, "status", {"lifecycle.status": [current.lifecycle.status, new_status], "reason": reason}))
                        counts[f"to_{new_status}"] += 1  # to_stale, to_active, to_archived
                        if reason == "expired":
                            counts["expired"] += 1
        return LifecycleRunResponse(**counts, ran_at=now)

    def purge(self, agent: str, ids: Optional[Sequence[str]] = None, as_of: Optional[datetime] = None) -> PurgeResponse:
        """Physically remove deleted cells past the retention window; refuse the rest."""
        now = self._clock_or(as_of)
        purged: list[str] = []
        refused: list[PurgeRefusal] = []
        if ids is None:
            ids = [c.id for c in self.store.iter_cells([Status.deleted.value])]
        for i in range(0, len(ids), 200):
            with self.store.write() as tx:
                for cell_id in ids[i : i + 200]:
                    cell = tx.get(cell_id)
                    if cell is None:
                        refused.append(PurgeRefusal(id=cell_id, reason="no such cell"))
                        continue
                    ok, why = purge_eligible(cell, now, self.policy)
                    if not ok:
                        refused.append(PurgeRefusal(id=cell_id, reason=why))
                        continue
                    tx.purge(cell_id)
                    tx.add_history(HistoryRecord(cell_id, now, agent, "purge", {}))
                    purged.append(cell_id)
        return PurgeResponse(purged=purged, refused=refused)


# Protocol extensions this implementation offers, advertised in GET /spec.
EXTENSIONS = [
    "history",
    "supersession",
    "batch_create",
    "search_explain",
    "search_abstention",
    "export",
    "lifecycle_as_of",
    "if_match_version",
    "list_cursor",
    "as_of_reads",
    "rollback",
    "restore",
    "ndjson_export",
    "cell_keys",
    "dedup_on_write",
    "playbook_outcomes",
    "consolidation",
    "pin",
]
# Advertised only by a server that accepts clock overrides (conformance cases that move the
# clock require it and are skipped elsewhere).
CLOCK_OVERRIDE_EXTENSION = "lifecycle_as_of"


def spec_document(service: MemoryService, auth: dict[str, Any], mcp: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The body of GET /spec (also what an in-process client's `spec()` returns); `mcp`
    describes the MCP endpoint when the server offers one."""
    limits = service.limits
    return {
        "amp_version": AMP_VERSION,
        "capabilities": {
            "max_cell_size_bytes": limits.max_cell_size_bytes,
            "max_request_bytes": limits.max_request_bytes,
            "max_search_limit": limits.max_search_limit,
            "max_page_size": limits.max_page_size,
            "max_batch_cells": limits.max_batch_cells,
            "max_metadata_depth": MAX_METADATA_DEPTH,
            "max_pattern_length": MAX_PATTERN_LENGTH,
            "max_pattern_stars": MAX_PATTERN_STARS,
            "clock_override": service.allow_clock_override,
            "storage_backends": [service.store.backend],
            "lifecycle_scheduler": {
                "interval_seconds": service.policy.interval_seconds,
                "manual_run_endpoint": "/amp/v1/admin/lifecycle/run",
            },
            "lifecycle": {
                "stale_threshold": service.policy.stale_threshold,
                "stale_archive_days": service.policy.stale_archive_days,
                "retention_days": service.policy.retention_days,
            },
            "auth": auth,
            "embedder": service.retriever.embedder.name if service.retriever.embedder else None,
            "consolidation": {
                "endpoint": "/amp/v1/memories/consolidate",
                "model": service.model.name if service.model else None,
                "dedup_default": service.dedup_default,
                "dedup_threshold": service.dedup_threshold,
                "confidence_floor": service.consolidation.confidence_floor,
                "max_episodes": MAX_CONSOLIDATE_EPISODES,
                "background_interval_seconds": service.consolidation.interval_seconds if service.model else 0,
            },
            "mcp_compatible": mcp is not None,
            **({"mcp": mcp} if mcp is not None else {}),
            "extensions": [e for e in EXTENSIONS
                           if e != CLOCK_OVERRIDE_EXTENSION or service.allow_clock_override],
        },
    }


__all__ = [
    "EXTENSIONS", "MemoryService", "Limits", "OwnerCounts", "cell_size_bytes", "new_cell_id", "spec_document",
]
