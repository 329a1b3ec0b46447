"""The wire models of the files API (docs/files.md): closed, like every AMP body."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Optional

from pydantic import BeforeValidator, Field, StrictBool, StrictInt

from ..models import AccessPolicy, Closed, FilePath, IdString, MemoryType, StorableStr

def _strip_root(value: Any) -> Any:
    # DeepAgents and Claude Code-style tools name files from the folder root: `/AGENTS.md`.
    return value[1:] if isinstance(value, str) and value.startswith("/") else value


FileRef = Annotated[FilePath, BeforeValidator(_strip_root)]
ApprovalModeName = Literal["review", "yolo"]
ProposalStatus = Literal["pending", "approved", "rejected"]
MAX_FILE_TEXT = 4 * 1024 * 1024  # a request bound; the cell size limit applies to what is stored
MAX_GREP_MATCHES = 1000
MAX_READ_LINES = 10000


class FileInfo(Closed):
    path: str
    type: MemoryType
    size: int = Field(description="bytes of UTF-8 text")
    lines: int
    version: Optional[int] = Field(default=None, description="the file cell's lifecycle.version (None: virtual)")
    modified_at: Optional[datetime] = None
    read_only: bool = Field(default=False, description="a virtual file: an episodic session or proposals.md")
    id: Optional[str] = Field(default=None, description="the file's cell id")


class FileListResponse(Closed):
    owner_id: str
    results: list[FileInfo]


class FileContent(Closed):
    path: str
    content: str = Field(description="the lines asked for, byte for byte (line endings kept)")
    start_line: int = Field(description="number (1-based) of the first line returned")
    end_line: int
    total_lines: int
    next_offset: Optional[int] = Field(default=None, description="offset of the next page; None at the end")
    version: Optional[int] = None
    read_only: bool = False


class FileWrite(Closed):
    """Write a whole file (create or replace)."""

    owner_id: IdString
    path: FileRef
    content: StorableStr = Field(max_length=MAX_FILE_TEXT)
    reason: Optional[str] = Field(default=None, max_length=2048, description="why (shown to the approver)")
    expected_version: Optional[StrictInt] = Field(default=None, ge=1, description="refuse (409) unless the file is at this version")
    access_policy: Optional[AccessPolicy] = Field(default=None, description="who may read and write a new file "
                                                  "(default: its owner and its writer); ignored for an existing file")


class FileEdit(Closed):
    """Replace an exact string (DeepAgents' and Claude Code's edit)."""

    owner_id: IdString
    path: FileRef
    old: StorableStr = Field(min_length=1, max_length=MAX_FILE_TEXT)
    new: StorableStr = Field(max_length=MAX_FILE_TEXT)
    replace_all: StrictBool = False
    reason: Optional[str] = Field(default=None, max_length=2048)
    expected_version: Optional[StrictInt] = Field(default=None, ge=1)


class FileDelete(Closed):
    owner_id: IdString
    path: FileRef
    reason: Optional[str] = Field(default=None, max_length=2048)
    expected_version: Optional[StrictInt] = Field(default=None, ge=1)


class FileWriteResult(Closed):
    path: str
    status: Literal["written", "proposed", "unchanged", "deleted"]
    message: str = Field(description="what happened, in words for a model")
    version: Optional[int] = Field(default=None, description="the file's version after the write")
    proposal_id: Optional[str] = Field(default=None, description="the pending proposal (status proposed)")
    occurrences: Optional[int] = Field(default=None, description="replacements made (edit)")


class GrepMatch(Closed):
    path: str
    line: int
    text: str


class GrepResponse(Closed):
    matches: list[GrepMatch]
    truncated: bool = False


class FileSearchRequest(Closed):
    owner_id: IdString
    query: StorableStr = Field(min_length=1, max_length=4096)
    glob: Optional[str] = Field(default=None, max_length=512)
    limit: StrictInt = Field(default=10, ge=1, le=100)


class FileSearchHit(Closed):
    path: str
    start_line: int
    end_line: int
    score: float
    text: str


class FileSearchResponse(Closed):
    query: str
    results: list[FileSearchHit]


class FileVersion(Closed):
    version: int
    at: datetime
    actor: str = Field(description="who wrote it (the proposer, for an approved proposal)")
    action: str
    approved_by: Optional[str] = None
    proposal_id: Optional[str] = None
    diff: str = Field(description="unified diff from the previous version")


class FileHistoryResponse(Closed):
    path: str
    results: list[FileVersion]


class ApprovalMode(Closed):
    owner_id: IdString
    approval_mode: ApprovalModeName


class Proposal(Closed):
    id: str
    owner_id: str
    path: str
    action: Literal["write", "delete"]
    base_version: Optional[int] = Field(description="the file's version it was proposed against (None: a new file)")
    content: Optional[str] = Field(description="the whole proposed text (None for a delete)")
    diff: str
    reason: Optional[str] = None
    proposed_by: str
    created_at: datetime
    status: ProposalStatus
    decided_by: Optional[str] = None
    decided_at: Optional[datetime] = None
    message: Optional[str] = None
    result_version: Optional[int] = None


class ProposalList(Closed):
    results: list[Proposal]


class ApproveRequest(Closed):
    content: Optional[StorableStr] = Field(default=None, max_length=MAX_FILE_TEXT,
                                           description="edit then approve: the text to write instead")
    message: Optional[str] = Field(default=None, max_length=2048)


class RejectRequest(Closed):
    message: Optional[str] = Field(default=None, max_length=2048, description="told to the proposing agent")
