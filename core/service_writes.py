"""The memory service's writes: create (with dedup on write, supersession and keys), update,
rollback, outcomes and delete. Each request is one transaction; a create's steps are a
`NewCells` unit that the store's writes runner (`store.grouped_writes`) runs."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Hashable, Optional, Sequence

from pydantic import ValidationError

from .access import can_read, can_write, check_policy_change, may_change_policy
from .dedup import NEAR_POLICIES, Duplicate, find_duplicate, normalise_text, without_exact_candidates
from .textindex import text_key
from .errors import (
    Conflict,
    InvalidTransition,
    ValidationFailed,
    access_denied,
    validation_to_api_error,
)
from . import versions
from .lifecycle import (
    check_delete_transition,
    check_patch_transition,
    check_restore_transition,
    is_expired,
    scheduled_status,
)
from .models import (
    AMP_VERSION,
    PATCH_IGNORED,
    PATCH_SERVER_MANAGED,
    CellCreate,
    CellPatch,
    Identity,
    MemoryCell,
    MemoryType,
    Status,
)
from . import service_base
from .service_base import SYSTEM_ACTOR, ServiceBase
from .store.grouped_writes import Writes
from .store.base import HistoryRecord, WriteTx

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


def _diff(old: Any, new: Any, prefix: str = "") -> dict[str, list[Any]]:
    """Field-path -> [old, new] for every leaf that changed."""
    if isinstance(old, dict) and isinstance(new, dict) and not prefix.endswith("metadata"):
        out: dict[str, list[Any]] = {}
        for key in sorted(set(old) | set(new)):
            out.update(_diff(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else key))
        return out
    return {} if old == new else {prefix: [old, new]}



class CellWrites(ServiceBase):
    """The part of `MemoryService` that changes cells."""

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
                "id": service_base.new_cell_id(),  # (looked up when called: tests fix the ids there)
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
        self._check_batch_size(reqs)
        return self._writes().run(NewCells(self, agent, reqs))

    @property
    def commits_in_groups(self) -> bool:
        """Whether concurrent creates are committed together (`create_many_detailed_async`)."""
        return self._writes().grouped

    async def create_many_detailed_async(self, agent: str,
                                         reqs: Sequence[CellCreate]) -> list[tuple[MemoryCell, Optional[str]]]:
        """`create_many_detailed` for a request on an event loop, on a store that commits in
        groups: the request waits for its group's commit without a thread of its own."""
        self._check_batch_size(reqs)
        return await self._writes().run_async(NewCells(self, agent, reqs))

    def _writes(self) -> Writes:
        assert self.writes is not None  # (set by MemoryService.__post_init__)
        return self.writes

    def _check_batch_size(self, reqs: Sequence[CellCreate]) -> None:
        if len(reqs) > self.limits.max_batch_cells:
            raise ValidationFailed(f"at most {self.limits.max_batch_cells} cells per batch")

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
            self._check_version(cell, expected_version)
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
            self._check_version(cell, expected_version)
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
            self._check_version(cell, expected_version)
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


class NewCells:
    """A create request as the writes runner takes it (`store.grouped_writes.WriteUnit`): its
    cells built and embedded, their duplicates looked up among the committed cells while its
    keys (owner, type, normalised text) are held, then stored."""

    def __init__(self, service: CellWrites, agent: str, reqs: Sequence[CellCreate]):
        self.service, self.agent, self.reqs = service, agent, list(reqs)
        self.size = len(self.reqs)
        # text_key: the same digest of the normalised text that the exact-duplicate index holds
        self.keys: frozenset[Hashable] = frozenset(
            (r.identity.owner_id, r.type, text_key(r.content.text))
            for r in self.reqs if (r.dedup or service.dedup_default) != "off")
        self.now = service.clock()
        self.cells: list[MemoryCell] = []
        self.vectors: list[Any] = []
        self.dups: list[Optional[Duplicate]] = []

    def prepare(self) -> None:
        self.cells = [self.service._build(r, self.agent, self.now) for r in self.reqs]
        self.vectors = self.service._vectors_for_new(self.reqs, self.cells)

    def check(self) -> None:
        self.dups = self.service._duplicates(self.agent, self.reqs, self.cells, self.vectors, self.now)

    def write(self, tx: WriteTx) -> list[tuple[MemoryCell, Optional[str]]]:
        return self.service._store_created(tx, self.agent, self.reqs, self.cells, self.vectors, self.dups, self.now)
