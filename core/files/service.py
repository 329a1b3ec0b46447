"""The files service: an owner's memory folder over cells (docs/files.md).

A file is a live cell with `identity.path`; every read goes through `access.can_read` (the
one access rule) and every write through `access.can_write`, the validators
(`files.validate`) and the owner's approval mode:

- `yolo`: a write lands at once, as a new version of the file's cell (a new file from anyone
  but the owner is still a proposal, which only a person may approve: `planted`);
- `review` (the default): a write becomes a pending proposal (the whole new text and its
  diff) and the file does not change until an approver approves it.

Approvers: the folder's owner, or a caller whose key holds the `approve` (or `admin`) scope;
never the agent that proposed. A proposal is visible to whoever may read the file it changes
(for a new file: the cell it would create, i.e. its owner and its proposer).

Two virtual, read-only kinds of file are built per caller: `sessions/<id>.md` (the owner's
episodic cells of one session that the caller may read) and `proposals.md` (the caller's own
proposals in the folder and their outcomes).
"""

from __future__ import annotations

import builtins
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Optional

from ulid import ULID

from ..access import can_read, can_write, check_policy_change
from ..errors import Conflict, Forbidden, InvalidTransition, PayloadTooLarge, ValidationFailed, access_denied
from ..limits import Limits
from ..models import AccessPolicy, MemoryCell, MemoryType, Status, storable_text
from ..retrieval import Retriever
from ..store.base import CellFilter, HistoryRecord, Store, WriteTx
from ..store._files import ProposalRecord
from ..versions import UNVERSIONED_ACTIONS, bm25_text_scores, readable_history
from . import validate
from .models import (
    ApprovalMode,
    ApproveRequest,
    FileContent,
    FileDelete,
    FileEdit,
    FileHistoryResponse,
    FileInfo,
    FileListResponse,
    FileSearchHit,
    FileSearchRequest,
    FileSearchResponse,
    FileVersion,
    FileWrite,
    FileWriteResult,
    GrepMatch,
    GrepResponse,
    Proposal,
    ProposalList,
    RejectRequest,
)
from .paths import PROPOSALS_FILE, SESSIONS_DIR, is_virtual, matches, memory_type, normalise, session_of, session_path
from .text import replace_exact, sections, slice_lines, unified_diff

DEFAULT_MODE = "review"
DEFAULT_READ_LINES = 2000
MAX_SEARCH_SECTIONS = 5000  # sections embedded per file search, when an embedder is configured
PLACEHOLDER_ID = "mem_" + "0" * 26  # the cell a proposed new file would be (access checks only)


def new_proposal_id() -> str:
    return f"prop_{ULID()}"


def _bytes(text: str) -> int:
    return len(text.encode("utf-8"))


def planted(owner_id: str, writer: str, new_file: bool) -> bool:
    """A new file written into someone else's folder. It is always a proposal, whatever the
    folder's mode (`yolo` is for the owner's own agent), and only a person may approve it
    (docs/files.md#approval): the owner's agent would otherwise take on another agent's
    instructions (an `AGENTS.md`, a skill) with one call."""
    return new_file and writer != owner_id


@dataclass(frozen=True)
class FileService:
    store: Store
    clock: Callable[[], datetime]
    limits: Limits
    retriever: Retriever
    new_cell_id: Callable[[], str]
    new_proposal_id: Callable[[], str] = new_proposal_id

    # ---------------------------------------------------------------- the folder as a caller sees it
    def _files(self, agent: Optional[str], owner_id: str) -> dict[str, MemoryCell]:
        """path -> file cell, for the owner's live files the caller may read (None: everyone's,
        for the command line, which acts for the person running it)."""
        return {c.identity.path: c for c in self.store.file_cells(owner_id)
                if c.identity.path is not None and (agent is None or can_read(c, agent))}

    def _file(self, agent: Optional[str], owner_id: str, path: str) -> Optional[MemoryCell]:
        """One file, if the caller may read it (`_files` for a single path)."""
        cell = self.store.file_cell(owner_id, path)
        return cell if cell is not None and (agent is None or can_read(cell, agent)) else None

    def _sessions(self, agent: str, owner_id: str, session_id: Optional[str] = None) -> dict[str, str]:
        """path -> text of one virtual file per session (or only `session_id`'s): the
        readable episodes, oldest first."""
        flt = CellFilter(reader=agent, owner_id=owner_id, types=[MemoryType.episodic.value], session_id=session_id,
                         statuses=[Status.active.value, Status.stale.value], not_expired_at=self.clock())
        by_session: dict[str, list[str]] = {}
        for cell in self.store.scan(flt):
            if cell.identity.session_id is None or not can_read(cell, agent):
                continue
            role = cell.content.metadata.get("role") or cell.identity.created_by or ""
            at = cell.lifecycle.created_at.strftime("%Y-%m-%d %H:%M:%S")
            by_session.setdefault(cell.identity.session_id, []).append(f"[{at}] {role}: {cell.content.text}\n")
        return {session_path(s): "".join(lines) for s, lines in sorted(by_session.items())}

    def _own_proposals_text(self, agent: str, owner_id: str) -> Optional[str]:
        mine = [p for p in self.store.list_proposals(owner_id=owner_id, proposed_by=agent)
                if self._proposal_readable(p, agent)]
        if not mine:
            return None
        lines = ["# Your proposals in this folder (newest first)\n\n"]
        for p in reversed(mine[-50:]):
            line = f"- {p.id} {p.action} `{p.path}`: {p.status}"
            if p.status != "pending":
                line += f" by {p.decided_by}"
            if p.message:
                line += f" ({p.message})"
            lines.append(line + "\n")
        return "".join(lines)

    def _virtual(self, agent: str, owner_id: str, path: str) -> Optional[str]:
        if path == PROPOSALS_FILE:
            return self._own_proposals_text(agent, owner_id)
        session = session_of(path)
        if session is not None:
            return self._sessions(agent, owner_id, session).get(path)
        return None

    def _all_texts(self, agent: str, owner_id: str, glob: Optional[str]) -> list[tuple[str, str]]:
        """(path, text) of every file and virtual file the caller may read, by path."""
        found = [(p, c.content.text) for p, c in self._files(agent, owner_id).items()]
        found += list(self._sessions(agent, owner_id).items())
        own = self._own_proposals_text(agent, owner_id)
        if own is not None:
            found.append((PROPOSALS_FILE, own))
        return sorted((p, t) for p, t in found if matches(p, glob))

    # ---------------------------------------------------------------- reads
    def list(self, agent: Optional[str], owner_id: str, glob: Optional[str] = None) -> FileListResponse:
        """The folder as `agent` may read it; None (the command line): the stored files only."""
        results = [FileInfo(path=p, type=c.type, size=_bytes(c.content.text), lines=len(c.content.text.splitlines()),
                            version=c.lifecycle.version, modified_at=c.lifecycle.last_updated_at or c.lifecycle.created_at,
                            id=c.id)
                   for p, c in self._files(agent, owner_id).items() if matches(p, glob)]
        virtual = list(self._sessions(agent, owner_id).items()) if agent is not None else []
        own = self._own_proposals_text(agent, owner_id) if agent is not None else None
        if own is not None:
            virtual.append((PROPOSALS_FILE, own))
        results += [FileInfo(path=p, type=MemoryType.episodic.value if p.startswith(SESSIONS_DIR) else MemoryType.semantic.value,
                             size=_bytes(t), lines=len(t.splitlines()), read_only=True)
                    for p, t in virtual if matches(p, glob)]
        return FileListResponse(owner_id=owner_id, results=sorted(results, key=lambda f: f.path))

    def read(self, agent: str, owner_id: str, path: str, offset: int = 0,
             limit: int = DEFAULT_READ_LINES) -> FileContent:
        path = normalise(path)
        if offset < 0 or limit < 1:
            raise ValidationFailed("offset must be >= 0 and limit >= 1", {"offset": offset, "limit": limit})
        cell = self._file(agent, owner_id, path)
        text = cell.content.text if cell is not None else self._virtual(agent, owner_id, path)
        if text is None:
            raise access_denied()  # missing and unreadable look the same
        content, start, end, total = slice_lines(text, offset, limit)
        return FileContent(path=path, content=content, start_line=start, end_line=end, total_lines=total,
                           next_offset=end if end < total else None,
                           version=cell.lifecycle.version if cell is not None else None, read_only=cell is None)

    def grep(self, agent: str, owner_id: str, pattern: str, glob: Optional[str] = None,
             max_count: int = 200) -> GrepResponse:
        """Literal (not regular expression) search, line by line, in path order."""
        if not pattern:
            raise ValidationFailed("pattern must not be empty", {"pattern": pattern})
        matches_: list[GrepMatch] = []
        for path, text in self._all_texts(agent, owner_id, glob):
            for number, line in enumerate(text.splitlines(), start=1):
                if pattern in line:
                    if len(matches_) == max_count:
                        return GrepResponse(matches=matches_, truncated=True)
                    matches_.append(GrepMatch(path=path, line=number, text=line))
        return GrepResponse(matches=matches_)

    def search(self, agent: str, req: FileSearchRequest) -> FileSearchResponse:
        """Rank sections (heading-delimited, at most 20 lines) of the files the caller may read:
        BM25 over these sections only, blended with cosine similarity when an embedder is
        configured. Every statistic comes from readable text."""
        chunks = [(path, s) for path, text in self._all_texts(agent, req.owner_id, req.glob) for s in sections(text)]
        keyword = bm25_text_scores(req.query, [s.text for _, s in chunks])
        best = max(keyword, default=0.0) or 1.0
        scores = [k / best for k in keyword]
        embedder = self.retriever.embedder
        if embedder is not None and chunks and len(chunks) <= MAX_SEARCH_SECTIONS:
            matrix = embedder.embed([req.query] + [s.text for _, s in chunks])
            query, rows = matrix[0], matrix[1:]
            cosine = [float(sum(float(a) * float(b) for a, b in zip(query, row))) for row in rows]
            scores = [0.5 * s + 0.5 * max(c, 0.0) for s, c in zip(scores, cosine)]
        ranked = sorted(((score, path, s) for score, (path, s) in zip(scores, chunks) if score > 0 and not math.isnan(score)),
                        key=lambda r: (-r[0], r[1], r[2].start_line))[: req.limit]
        return FileSearchResponse(query=req.query, results=[
            FileSearchHit(path=path, start_line=s.start_line, end_line=s.end_line, score=round(score, 6), text=s.text)
            for score, path, s in ranked])

    def history(self, agent: Optional[str], owner_id: str, path: str) -> FileHistoryResponse:
        """Every version of the live file, oldest first: who wrote it, who approved it, the diff."""
        path = normalise(path)
        cell = self._file(agent, owner_id, path)
        if cell is None:
            raise access_denied()
        entries = self.store.history(cell.id)
        # A version the caller could not read at its time shows who and when, not its diff
        # (the grant-time rule of the cell history, `versions.readable_history`).
        shown = entries if agent is None else readable_history(cell, entries, agent)
        hidden = {i for i, (e, s) in enumerate(zip(entries, shown)) if e.changes and not s.changes}
        out: list[FileVersion] = []
        text, version = cell.content.text, cell.lifecycle.version
        for i, entry in reversed(list(enumerate(entries))):
            pair = entry.changes.get("content.text")
            before = pair[0] if isinstance(pair, list) and len(pair) == 2 else text
            if entry.action == "create":
                before = ""
            if entry.action == "create" or before != text or entry.action == "delete":
                out.append(FileVersion(version=version, at=entry.at, actor=entry.actor, action=entry.action,
                                       approved_by=entry.changes.get("approved_by"),
                                       proposal_id=entry.changes.get("proposal_id"),
                                       diff="" if i in hidden else unified_diff(before, text, path)))
            text = before
            if entry.action not in UNVERSIONED_ACTIONS:
                version -= 1
        return FileHistoryResponse(path=path, results=list(reversed(out)))

    def approval_mode(self, owner_id: str) -> ApprovalMode:
        return ApprovalMode(owner_id=owner_id, approval_mode=self.store.approval_mode(owner_id) or DEFAULT_MODE)

    def folder(self, agent: Optional[str], owner_id: str) -> dict[str, str]:
        """path -> text of the owner's stored files (not the virtual ones): what an export writes."""
        return {p: c.content.text for p, c in sorted(self._files(agent, owner_id).items())}

    # ---------------------------------------------------------------- proposals: the read rule
    def _subject(self, p: ProposalRecord) -> Optional[MemoryCell]:
        """The cell a proposal is about: the file it changes, or the one it would create."""
        if p.cell_id is not None:
            return self.store.get(p.cell_id)
        policy = AccessPolicy.model_validate(p.access_policy or {})
        return self._new_cell(p.owner_id, p.path, p.content or " ", p.proposed_by, policy, p.created_at, PLACEHOLDER_ID)

    def _proposal_readable(self, p: ProposalRecord, agent: Optional[str], may_approve: bool = False) -> bool:
        """The read rule of proposals: whoever may read the file it changes (`can_read` on the
        subject cell), and approvers, whose queue it is (an approve or admin key, or the
        command line: `agent` None)."""
        if agent is None or may_approve:
            return True
        subject = self._subject(p)
        return subject is not None and can_read(subject, agent)

    @staticmethod
    def _proposal(p: ProposalRecord) -> Proposal:
        return Proposal(id=p.id, owner_id=p.owner_id, path=p.path, action=p.action, base_version=p.base_version,
                        content=p.content, diff=p.diff, reason=p.reason, proposed_by=p.proposed_by,
                        created_at=p.created_at, status=p.status, decided_by=p.decided_by,
                        decided_at=p.decided_at, message=p.message, result_version=p.result_version)

    def proposals(self, agent: Optional[str], owner_id: Optional[str] = None, status: Optional[str] = None,
                  proposed_by: Optional[str] = None, *, may_approve: bool = False) -> ProposalList:
        found = self.store.list_proposals(owner_id=owner_id, status=status, proposed_by=proposed_by)
        return ProposalList(results=[self._proposal(p) for p in found if self._proposal_readable(p, agent, may_approve)])

    def proposal(self, agent: Optional[str], proposal_id: str, *, may_approve: bool = False) -> Proposal:
        p = self.store.get_proposal(proposal_id)
        if p is None or not self._proposal_readable(p, agent, may_approve):
            raise access_denied()
        return self._proposal(p)

    # ---------------------------------------------------------------- writes
    def _new_cell(self, owner_id: str, path: str, text: str, writer: str, policy: Optional[AccessPolicy],
                  now: datetime, cell_id: Optional[str] = None) -> MemoryCell:
        kind = memory_type(path)
        outcomes = {"success_count": 0, "failure_count": 0} if kind == MemoryType.procedural.value else {}
        return MemoryCell.model_validate({
            "id": cell_id or self.new_cell_id(), "type": kind,
            "content": {"text": text, "metadata": {}},
            "identity": {"owner_id": owner_id, "created_by": writer, "path": path},
            "lifecycle": {"created_at": now, "last_updated_at": now, "status": Status.active.value},
            "scoring": {"access_count": 0, **outcomes},
            "access_policy": (policy or AccessPolicy()).model_dump(),
            "provenance": {"source_type": "user_explicit" if writer.startswith("human:") else "inference"},
        })

    def _check_text(self, path: str, text: Optional[str]) -> None:
        """The validators' verdict plus the rules every file shares; one 422 with every problem."""
        if text is None:
            return
        if not text.strip():
            raise ValidationFailed(f"{path}: a file must contain a non-whitespace character; delete it instead",
                                   {"errors": [{"path": path, "loc": "file", "message": "empty file"}]})
        validate.check({path: text})
        if _bytes(text) > self.limits.max_cell_size_bytes - 64:
            raise PayloadTooLarge(f"{path} is {_bytes(text)} bytes; a file holds at most "
                                  f"{self.limits.max_cell_size_bytes - 64}", {"path": path})

    def _apply(self, tx: WriteTx, owner_id: str, path: str, action: str, text: Optional[str],
               current: Optional[MemoryCell], writer: str, now: datetime, *, approved_by: Optional[str] = None,
               proposal_id: Optional[str] = None, policy: Optional[AccessPolicy] = None,
               note: Optional[str] = None) -> int:
        """Write one change as a new version with its history entry; returns the version."""
        extra = {k: v for k, v in (("approved_by", approved_by), ("proposal_id", proposal_id), ("note", note))
                 if v is not None}
        if action == "delete":
            assert current is not None
            lifecycle = current.lifecycle.model_copy(update={
                "status": Status.deleted.value, "last_updated_at": now, "version": current.lifecycle.version + 1})
            tx.update(current.model_copy(update={"lifecycle": lifecycle}))
            tx.add_history(HistoryRecord(current.id, now, writer, "delete",
                                         {"lifecycle.status": [current.lifecycle.status, Status.deleted.value], **extra}))
            return lifecycle.version
        assert text is not None
        vector = self.retriever.vectors_for([text])[0]
        if current is None:
            cell = self._new_cell(owner_id, path, text, writer, policy, now)
            tx.insert(cell, vector)
            tx.add_history(HistoryRecord(cell.id, now, writer, "create",
                                         {"type": cell.type, "owner_id": owner_id, "path": path, **extra}))
            return 1
        content = current.content.model_copy(update={"text": text})
        lifecycle = current.lifecycle.model_copy(update={"last_updated_at": now, "version": current.lifecycle.version + 1})
        changes: dict[str, Any] = {"content.text": [current.content.text, text]} if text != current.content.text else {}
        update: dict[str, Any] = {"content": content, "lifecycle": lifecycle}
        if policy is not None and policy != current.access_policy:
            update["access_policy"] = policy
            # One entry per changed field, as every history records it (versions.py replays them).
            before, after = current.access_policy.model_dump(mode="json"), policy.model_dump(mode="json")
            changes.update({f"access_policy.{field}": [before[field], after[field]]
                            for field in sorted(before) if before[field] != after[field]})
        tx.update(current.model_copy(update=update), vector)
        tx.add_history(HistoryRecord(current.id, now, writer, "update", {**changes, **extra}))
        return lifecycle.version

    def _change(self, agent: str, owner_id: str, raw_path: str, action: str,
                compute: Callable[[Optional[MemoryCell]], tuple[Optional[str], Optional[int]]],
                *, reason: Optional[str], expected_version: Optional[int],
                policy: Optional[AccessPolicy] = None, review: bool = False) -> FileWriteResult:
        path = normalise(raw_path)
        if is_virtual(path):
            raise ValidationFailed(f"{path} is read-only (episodic sessions and proposals.md are views)", {"path": path})
        mode = "review" if review else self.approval_mode(owner_id).approval_mode
        now = self.clock()
        with self.store.write() as tx:
            current = tx.path_holder(owner_id, path)
            if current is not None and not can_write(current, agent):
                raise access_denied()
            if expected_version is not None and (current is None or current.lifecycle.version != expected_version):
                have = current.lifecycle.version if current is not None and can_read(current, agent) else None
                raise Conflict(f"{path} is not at version {expected_version}" + (f" (it is at {have})" if have else ""),
                               {"current_version": have})
            text, occurrences = compute(current)
            old = current.content.text if current is not None else None
            new_policy = policy is not None and current is not None and policy != current.access_policy
            if new_policy:
                assert current is not None and policy is not None
                # The access-policy rule of every other write path: only the owner or creator
                # changes who may read a file (a writer never grants itself reading).
                check_policy_change(current, agent, policy, sees_policy=can_read(current, agent))
            if action == "write" and text == old and not new_policy:
                return FileWriteResult(path=path, status="unchanged", message=f"{path} already has this content",
                                       version=current.lifecycle.version if current is not None else None,
                                       occurrences=occurrences)
            self._check_text(path, text)
            if mode == "yolo" and not planted(owner_id, agent, current is None):
                version = self._apply(tx, owner_id, path, action, text, current, agent, now, policy=policy, note=reason)
                done = "deleted" if action == "delete" else "written"
                return FileWriteResult(path=path, status=done, version=version, occurrences=occurrences,
                                       message=f"{path} {done} (version {version})")
            proposal = ProposalRecord(
                id=self.new_proposal_id(), owner_id=owner_id, path=path, action=action,
                cell_id=current.id if current is not None else None,
                base_version=current.lifecycle.version if current is not None else None,
                content=text, diff=unified_diff(old or "", text or "", path), reason=reason,
                access_policy=policy.model_dump(mode="json") if policy is not None and (current is None or new_policy)
                else None,
                proposed_by=agent, created_at=now)
            tx.put_proposal(proposal)
        return FileWriteResult(
            path=path, status="proposed", proposal_id=proposal.id, occurrences=occurrences,
            version=current.lifecycle.version if current is not None else None,
            message=(f"Proposed, not yet applied: this change to {path} awaits a person's approval "
                     f"(proposal {proposal.id}); the file is unchanged until then. Do not retry; "
                     f"the outcome will appear in {PROPOSALS_FILE}."))

    def write(self, agent: str, req: FileWrite, *, review: bool = False) -> FileWriteResult:
        """Write a whole file; `review=True` makes it a proposal even in a `yolo` folder (a
        model's edit distilled from conversations, for example: consolidation)."""
        return self._change(agent, req.owner_id, req.path, "write", lambda current: (req.content, None),
                            reason=req.reason, expected_version=req.expected_version, policy=req.access_policy,
                            review=review)

    def readable_file(self, agent: str, owner_id: str, path: str) -> Optional[MemoryCell]:
        """The stored file at `path` if `agent` may read it (virtual files are not cells)."""
        return self._file(agent, owner_id, normalise(path))

    def edit(self, agent: str, req: FileEdit) -> FileWriteResult:
        def compute(current: Optional[MemoryCell]) -> tuple[Optional[str], Optional[int]]:
            # Editing needs the text: a writer-only caller must not learn how often `old` occurs.
            if current is None or not can_read(current, agent):
                raise access_denied()
            return replace_exact(current.content.text, req.old, req.new, req.replace_all)

        return self._change(agent, req.owner_id, req.path, "write", compute,
                            reason=req.reason, expected_version=req.expected_version)

    def delete(self, agent: str, req: FileDelete) -> FileWriteResult:
        def compute(current: Optional[MemoryCell]) -> tuple[Optional[str], Optional[int]]:
            if current is None:
                raise access_denied()
            return None, None

        return self._change(agent, req.owner_id, req.path, "delete", compute,
                            reason=req.reason, expected_version=req.expected_version)

    # ---------------------------------------------------------------- decisions
    def _decidable(self, tx: WriteTx, agent: str, proposal_id: str, may_approve: bool,
                   may_write: bool, *, approving: bool = False, in_person: bool = False) -> ProposalRecord:
        """The approver rule, in one place: the owner (with write access) or an approve/admin
        key may decide; the proposing agent never may. Approving a new file another agent
        put in the folder (`planted`) needs a person: an approve/admin key, or the owner
        `in_person` (signed in to the inspector), not the owner's agent."""
        p = tx.locked_proposal(proposal_id)
        if p is None or not self._proposal_readable(p, agent, may_approve):
            raise access_denied()
        if agent == p.proposed_by:
            raise Forbidden("the agent that proposed a change cannot decide it; a person (the owner or a key "
                            "with the approve scope) must", {"proposed_by": p.proposed_by})
        if not ((agent == p.owner_id and may_write) or may_approve):
            raise Forbidden("deciding a proposal needs the folder's owner or a key with the approve (or admin) scope",
                            {"required_scope": "approve"})
        if approving and planted(p.owner_id, p.proposed_by, p.cell_id is None) and not (may_approve or in_person):
            raise Forbidden(f"{p.path} is a new file {p.proposed_by} put in {p.owner_id}'s folder: only a person may "
                            "approve it (a key with the approve scope, or the owner in the inspector); the owner's "
                            "agent may reject it", {"required_scope": "approve"})
        if p.status != "pending":
            raise InvalidTransition(f"proposal {p.id} is already {p.status}", {"status": p.status})
        return p

    def approve(self, agent: str, proposal_id: str, req: Optional[ApproveRequest] = None, *,
                may_approve: bool = False, may_write: bool = True, in_person: bool = False) -> Proposal:
        """Apply the proposal (or, with `req.content`, the approver's edited text) as a new
        version written by the proposer and approved by `agent`. A proposal made against a
        version the file has since left is refused (409): reject it and propose again.
        `in_person`: the caller is a person at the inspector, not an agent (`_decidable`)."""
        req = req or ApproveRequest()
        now = self.clock()
        with self.store.write() as tx:
            p = self._decidable(tx, agent, proposal_id, may_approve, may_write, approving=True, in_person=in_person)
            current = tx.path_holder(p.owner_id, p.path)
            now_at = (current.id, current.lifecycle.version) if current is not None else None
            if now_at != ((p.cell_id, p.base_version) if p.cell_id is not None else None):
                raise Conflict(
                    f"proposal {p.id} is stale: {p.path} changed since it was proposed (proposed against "
                    f"{'version ' + str(p.base_version) if p.base_version else 'no file'}, now "
                    f"{'version ' + str(current.lifecycle.version) if current is not None else 'no file'}); "
                    "reject it and propose the change again", {"base_version": p.base_version, "stale": True})
            text = req.content if req.content is not None and p.action == "write" else p.content
            self._check_text(p.path, text)
            policy = AccessPolicy.model_validate(p.access_policy) if p.access_policy else None
            version = self._apply(tx, p.owner_id, p.path, p.action, text, current, p.proposed_by, now,
                                  approved_by=agent, proposal_id=p.id, policy=policy,
                                  note="edited by the approver" if text != p.content else None)
            p.status, p.decided_by, p.decided_at, p.message, p.result_version = "approved", agent, now, req.message, version
            tx.decide_proposal(p)
        return self._proposal(p)

    def reject(self, agent: str, proposal_id: str, req: Optional[RejectRequest] = None, *,
               may_approve: bool = False, may_write: bool = True) -> Proposal:
        now = self.clock()
        with self.store.write() as tx:
            p = self._decidable(tx, agent, proposal_id, may_approve, may_write)
            p.status, p.decided_by, p.decided_at, p.message = "rejected", agent, now, (req.message if req else None)
            tx.decide_proposal(p)
        return self._proposal(p)

    def set_approval_mode(self, agent: str, req: ApprovalMode) -> ApprovalMode:
        with self.store.write() as tx:
            tx.set_approval_mode(req.owner_id, req.approval_mode, self.clock(), agent)
        return req

    # ---------------------------------------------------------------- a whole folder (command line)
    def import_folder(self, actor: str, owner_id: str, files: dict[str, str]) -> builtins.list[FileWriteResult]:
        """Write every file directly (the person running the command approves by running it),
        in one transaction, after validating all of them: one invalid file refuses the whole
        import with every problem listed, and nothing is stored."""
        texts = {normalise(p): t for p, t in files.items()}
        problems: list[dict[str, str]] = []
        for path, text in texts.items():
            try:
                storable_text(text)
                if is_virtual(path):
                    raise ValidationFailed(f"{path} is a read-only view and cannot be imported")
                self._check_text(path, text)
            except ValueError as exc:
                problems.append({"path": path, "loc": "file", "message": str(exc)})
            except (ValidationFailed, PayloadTooLarge) as exc:
                problems += exc.details.get("errors") or [{"path": path, "loc": "file", "message": exc.message}]
        if problems:
            lines = "; ".join(f"{e['path']} {e['loc']}: {e['message']}" for e in problems)
            raise ValidationFailed(f"{len(problems)} problem(s), nothing was imported: {lines}", {"errors": problems})
        now = self.clock()
        out = []
        with self.store.write() as tx:
            for path, text in sorted(texts.items()):
                current = tx.path_holder(owner_id, path)
                if current is not None and current.content.text == text:
                    out.append(FileWriteResult(path=path, status="unchanged", message="unchanged",
                                               version=current.lifecycle.version))
                    continue
                version = self._apply(tx, owner_id, path, "write", text, current, actor, now, note="import")
                out.append(FileWriteResult(path=path, status="written", message="imported", version=version))
        return out
