"""Agent memory as files (docs/files.md): AGENTS.md, skills, subagents, tools.json and
knowledge files kept as cells with a path, validated, versioned and human-approved."""

from typing import TYPE_CHECKING

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

# The service and the validators pull in retrieval and YAML; the client imports only the
# models, so those load on first use (PEP 562).
_LAZY = {
    "FileService": ".service",
    "VALIDATORS": ".validate",
    "Problem": ".validate",
    "frontmatter": ".validate",
    "problems_for": ".validate",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    from .service import FileService
    from .validate import VALIDATORS, Problem, frontmatter, problems_for

__all__ = [
    "AGENTS_MD", "ApprovalMode", "ApproveRequest", "FileContent", "FileDelete", "FileEdit", "FileHistoryResponse",
    "FileInfo", "FileListResponse", "FileSearchHit", "FileSearchRequest", "FileSearchResponse", "FileService",
    "FileVersion", "FileWrite", "FileWriteResult", "GrepMatch", "GrepResponse", "PROPOSALS_FILE", "Problem",
    "Proposal", "ProposalList", "RejectRequest", "SESSIONS_DIR", "TOOLS_JSON", "VALIDATORS", "frontmatter", "memory_type",
    "normalise", "problems_for",
]
