"""Memory files in the SQL stores (docs/files.md): the schema both stores migrate to, the
proposal record, and the few reads and writes the files service needs, written once for
both databases (the SQL here is plain enough to mean the same on SQLite and PostgreSQL; only
the placeholder and the row lock differ).

A file is a cell with `identity.path` (column `cell_path`): a unique index makes the path
one live cell's per owner, as `cell_key` does for keys. Proposals (`file_proposals`) are not
cells: a pending change to one file, decided by an approver. `file_folders` holds each
owner's approval mode. Times are ISO 8601 UTC text in both databases, as in SQLite's history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional, Sequence

from ..models import STORED, MemoryCell

FILES_SCHEMA = """
ALTER TABLE cells ADD COLUMN cell_path TEXT;
CREATE UNIQUE INDEX cells_live_path ON cells (owner_id, cell_path)
    WHERE cell_path IS NOT NULL AND status IN ('active', 'stale') AND superseded_by IS NULL;
CREATE TABLE file_proposals (
    id            TEXT PRIMARY KEY,
    owner_id      TEXT NOT NULL,
    path          TEXT NOT NULL,
    action        TEXT NOT NULL,
    cell_id       TEXT,
    base_version  INTEGER,
    content       TEXT,
    diff          TEXT NOT NULL,
    reason        TEXT,
    access_policy TEXT,
    proposed_by   TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    status        TEXT NOT NULL,
    decided_by    TEXT,
    decided_at    TEXT,
    message       TEXT,
    result_version INTEGER
);
CREATE INDEX file_proposals_owner ON file_proposals (owner_id, status, id);
CREATE TABLE file_folders (
    owner_id      TEXT PRIMARY KEY,
    approval_mode TEXT NOT NULL,
    updated_at    TEXT NOT NULL,
    updated_by    TEXT NOT NULL
);
"""

LIVE = "status IN ('active', 'stale') AND superseded_by IS NULL"


@dataclass
class ProposalRecord:
    """A proposed change to one file: `action` "write" (content is the whole new text) or
    "delete". `cell_id`/`base_version`: the file as it was when proposed (None: a new file).
    `status`: pending | approved | rejected."""

    id: str
    owner_id: str
    path: str
    action: str
    cell_id: Optional[str]
    base_version: Optional[int]
    content: Optional[str]
    diff: str
    reason: Optional[str]
    access_policy: Optional[dict[str, Any]]
    proposed_by: str
    created_at: datetime
    status: str = "pending"
    decided_by: Optional[str] = None
    decided_at: Optional[datetime] = None
    message: Optional[str] = None
    result_version: Optional[int] = None


@dataclass(frozen=True)
class FolderRecord:
    """An owner's memory folder settings: its approval mode and who set it when."""

    owner_id: str
    approval_mode: str
    updated_at: datetime
    updated_by: str


PROPOSAL_COLUMNS = ("id, owner_id, path, action, cell_id, base_version, content, diff, reason, access_policy, "
                    "proposed_by, created_at, status, decided_by, decided_at, message, result_version")


def _stamp(value: Optional[datetime]) -> Optional[str]:
    return None if value is None else value.astimezone(timezone.utc).isoformat()


def _when(value: Optional[str]) -> Optional[datetime]:
    return None if value is None else datetime.fromisoformat(value)


def proposal_row(p: ProposalRecord) -> tuple[Any, ...]:
    return (p.id, p.owner_id, p.path, p.action, p.cell_id, p.base_version, p.content, p.diff, p.reason,
            None if p.access_policy is None else json.dumps(p.access_policy), p.proposed_by, _stamp(p.created_at),
            p.status, p.decided_by, _stamp(p.decided_at), p.message, p.result_version)


def proposal_from_row(row: Sequence[Any]) -> ProposalRecord:
    (pid, owner, path, action, cell_id, base, content, diff, reason, policy, by, created, status, decided_by,
     decided_at, message, result) = row
    created_at = _when(created)
    assert created_at is not None  # NOT NULL
    return ProposalRecord(pid, owner, path, action, cell_id, base, content, diff, reason,
                          None if policy is None else json.loads(policy), by, created_at, status, decided_by,
                          _when(decided_at), message, result)


def folder_from_row(row: Sequence[Any]) -> FolderRecord:
    owner, mode, at, by = row
    updated_at = _when(at)
    assert updated_at is not None  # NOT NULL
    return FolderRecord(owner, mode, updated_at, by)


def cell_from_row(text: str, body: Any) -> MemoryCell:
    # SQLite keeps the body as JSON text, psycopg decodes JSON columns.
    data = json.loads(body) if isinstance(body, str) else body
    data["content"]["text"] = text
    return MemoryCell.model_validate(data, context=STORED)


class SQLFileTx:
    """Inside a write transaction (`self.conn`): the path's live holder, proposals, modes."""

    PARAM = "?"
    LOCKING = ""  # appended to row reads that must stay locked until the transaction ends
    conn: Any

    def _serialise(self, name: str) -> None:
        """Make concurrent writers of one name take turns (SQLite's writers already do)."""

    def path_holder(self, owner_id: str, path: str) -> Optional[MemoryCell]:
        """The owner's live cell at `path`, locked until the transaction ends."""
        self._serialise(json.dumps(["path", owner_id, path]))
        q = self.PARAM
        row = self.conn.execute(
            f"SELECT text, body FROM cells WHERE owner_id = {q} AND cell_path = {q} AND {LIVE}{self.LOCKING}",
            (owner_id, path)).fetchone()
        return None if row is None else cell_from_row(*row)

    def put_proposal(self, proposal: ProposalRecord) -> None:
        marks = ", ".join([self.PARAM] * 17)
        self.conn.execute(f"INSERT INTO file_proposals ({PROPOSAL_COLUMNS}) VALUES ({marks})", proposal_row(proposal))

    def locked_proposal(self, proposal_id: str) -> Optional[ProposalRecord]:
        row = self.conn.execute(f"SELECT {PROPOSAL_COLUMNS} FROM file_proposals WHERE id = {self.PARAM}{self.LOCKING}",
                                (proposal_id,)).fetchone()
        return None if row is None else proposal_from_row(row)

    def decide_proposal(self, proposal: ProposalRecord) -> None:
        q = self.PARAM
        self.conn.execute(
            f"UPDATE file_proposals SET status = {q}, decided_by = {q}, decided_at = {q}, message = {q}, "
            f"result_version = {q} WHERE id = {q}",
            (proposal.status, proposal.decided_by, _stamp(proposal.decided_at), proposal.message,
             proposal.result_version, proposal.id))

    def set_approval_mode(self, owner_id: str, mode: str, at: datetime, by: str) -> None:
        q = self.PARAM
        self.conn.execute(
            f"INSERT INTO file_folders (owner_id, approval_mode, updated_at, updated_by) VALUES ({q}, {q}, {q}, {q}) "
            "ON CONFLICT (owner_id) DO UPDATE SET approval_mode = excluded.approval_mode, "
            "updated_at = excluded.updated_at, updated_by = excluded.updated_by",
            (owner_id, mode, _stamp(at), by))


class PostgresFileTx(SQLFileTx):
    PARAM = "%s"
    LOCKING = " FOR UPDATE"

    def _serialise(self, name: str) -> None:
        # A new path has no row to lock: writers of one (owner, path) take turns on a
        # transaction-scoped lock instead, so the second sees the first's cell.
        self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (name,))


class SQLFileReads:
    """Reads outside a transaction, for a store with `_query(sql, params)` and `PARAM`."""

    PARAM = "?"

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:  # provided by the store
        raise NotImplementedError

    def file_cells(self, owner_id: str) -> list[MemoryCell]:
        """The owner's live files, by path. The service applies the access rule to each."""
        rows = self._query(f"SELECT text, body FROM cells WHERE owner_id = {self.PARAM} AND cell_path IS NOT NULL "
                           f"AND {LIVE} ORDER BY cell_path", (owner_id,))
        return [cell_from_row(*r) for r in rows]

    def file_cell(self, owner_id: str, path: str) -> Optional[MemoryCell]:
        """The owner's live file at `path` (one indexed lookup; no access filter)."""
        q = self.PARAM
        rows = self._query(f"SELECT text, body FROM cells WHERE owner_id = {q} AND cell_path = {q} AND {LIVE}",
                           (owner_id, path))
        return cell_from_row(*rows[0]) if rows else None

    def get_proposal(self, proposal_id: str) -> Optional[ProposalRecord]:
        rows = self._query(f"SELECT {PROPOSAL_COLUMNS} FROM file_proposals WHERE id = {self.PARAM}", (proposal_id,))
        return proposal_from_row(rows[0]) if rows else None

    def list_proposals(self, owner_id: Optional[str] = None, status: Optional[str] = None,
                       proposed_by: Optional[str] = None, after: Optional[str] = None,
                       limit: Optional[int] = None) -> list[ProposalRecord]:
        """Proposals, oldest first (ids sort by creation time); `after`/`limit` page by id."""
        where: list[str] = []
        params: list[Any] = []
        for condition, value in (("owner_id =", owner_id), ("status =", status), ("proposed_by =", proposed_by),
                                 ("id >", after)):
            if value is not None:
                where.append(f"{condition} {self.PARAM}")
                params.append(value)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        page = "" if limit is None else f" LIMIT {int(limit)}"
        rows = self._query(f"SELECT {PROPOSAL_COLUMNS} FROM file_proposals {clause} ORDER BY id{page}", params)
        return [proposal_from_row(r) for r in rows]

    def folders(self, owner_id: Optional[str] = None) -> list[FolderRecord]:
        """Every owner's folder settings (or one owner's), by owner."""
        clause, params = (f"WHERE owner_id = {self.PARAM}", [owner_id]) if owner_id is not None else ("", [])
        rows = self._query("SELECT owner_id, approval_mode, updated_at, updated_by FROM file_folders "
                           f"{clause} ORDER BY owner_id", params)
        return [folder_from_row(r) for r in rows]

    def approval_mode(self, owner_id: str) -> Optional[str]:
        found = self.folders(owner_id)
        return found[0].approval_mode if found else None
