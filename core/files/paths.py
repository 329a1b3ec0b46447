"""File paths: what kind of memory a path holds (the COALA mapping) and which paths are
virtual (read-only views the service builds, never stored)."""

from __future__ import annotations

import fnmatch
from urllib.parse import quote, unquote

from pydantic import TypeAdapter, ValidationError

from ..errors import ValidationFailed
from ..models import FilePath, MemoryType

AGENTS_MD = "AGENTS.md"
TOOLS_JSON = "tools.json"
SESSIONS_DIR = "sessions/"  # episodic memory: one read-only file per session
PROPOSALS_FILE = "proposals.md"  # the caller's own proposals and their outcomes (read-only)

_PATH: TypeAdapter[str] = TypeAdapter(FilePath)


def normalise(path: str) -> str:
    """A path as stored: DeepAgents and Claude Code-style tools send `/AGENTS.md`, the store
    keeps `AGENTS.md`. Anything else outside the FilePath grammar is a 422 naming the rule."""
    value = path[1:] if path.startswith("/") else path
    try:
        return _PATH.validate_python(value)
    except ValidationError as exc:
        raise ValidationFailed(f"path {path!r}: {exc.errors()[0]['msg']}", {"path": path[:600]}) from None


def memory_type(path: str) -> str:
    """COALA: instructions, tool choices and helper definitions are procedural memory; skills
    (playbooks the agent reads when a task calls for them) and knowledge files are semantic."""
    if path in (AGENTS_MD, TOOLS_JSON) or path.startswith("subagents/"):
        return MemoryType.procedural.value
    return MemoryType.semantic.value


def is_virtual(path: str) -> bool:
    return path.startswith(SESSIONS_DIR) or path == PROPOSALS_FILE


def session_path(session_id: str) -> str:
    return SESSIONS_DIR + quote(session_id, safe="-_.@:+=,") + ".md"


def session_of(path: str) -> str | None:
    if not path.startswith(SESSIONS_DIR) or not path.endswith(".md"):
        return None
    return unquote(path[len(SESSIONS_DIR):-3]) or None


def matches(path: str, pattern: str | None) -> bool:
    """Glob over paths: `*` stays within a segment, `**` crosses segments (`skills/**`), a
    leading `/` is ignored; a pattern without `/` matches the file name anywhere."""
    if not pattern:
        return True
    pattern = pattern.lstrip("/")
    if "/" not in pattern:
        return fnmatch.fnmatchcase(path.rsplit("/", 1)[-1], pattern)
    return _glob(path.split("/"), pattern.split("/"))


def _glob(parts: list[str], pats: list[str]) -> bool:
    if not pats:
        return not parts
    if pats[0] == "**":
        return any(_glob(parts[i:], pats[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pats[0]) and _glob(parts[1:], pats[1:])
