"""Agent memory as files (docs/files.md): AGENTS.md, skills, subagents, tools.json and
knowledge files kept as cells with a path, validated, versioned and human-approved."""

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
from .paths import AGENTS_MD, PROPOSALS_FILE, SESSIONS_DIR, TOOLS_JSON, memory_type, normalise
from .service import FileService
from .validate import VALIDATORS, Problem, frontmatter, problems_for

__all__ = [
    "AGENTS_MD", "ApprovalMode", "ApproveRequest", "FileContent", "FileDelete", "FileEdit", "FileHistoryResponse",
    "FileInfo", "FileListResponse", "FileSearchHit", "FileSearchRequest", "FileSearchResponse", "FileService",
    "FileVersion", "FileWrite", "FileWriteResult", "GrepMatch", "GrepResponse", "PROPOSALS_FILE", "Problem",
    "Proposal", "ProposalList", "RejectRequest", "SESSIONS_DIR", "TOOLS_JSON", "VALIDATORS", "frontmatter", "memory_type",
    "normalise", "problems_for",
]
