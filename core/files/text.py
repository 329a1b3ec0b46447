"""Pure text operations on file contents: line slices, exact replacement, grep, diffs, and
the sections file search ranks. No I/O."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from ..errors import ValidationFailed

SECTION_LINES = 20  # file search ranks sections of this many lines (or up to the next heading)


def lines_of(text: str) -> list[str]:
    """Lines without their endings (`a\\nb\\n` is two lines)."""
    return text.splitlines()


def slice_lines(text: str, offset: int, limit: int) -> tuple[str, int, int, int]:
    """Lines `offset` (0-based) to `offset + limit`, kept byte for byte with their endings:
    (content, first line number (1-based), last line number, total lines)."""
    kept = text.splitlines(keepends=True)
    chosen = kept[offset: offset + limit]
    return "".join(chosen), offset + 1, offset + len(chosen), len(kept)


def replace_exact(text: str, old: str, new: str, replace_all: bool) -> tuple[str, int]:
    """Replace `old` by `new`. `old` must occur, and exactly once unless `replace_all`."""
    count = text.count(old)
    if count == 0:
        raise ValidationFailed("`old` was not found in the file; read the file and copy the exact text "
                               "(whitespace and line breaks included)", {"occurrences": 0})
    if count > 1 and not replace_all:
        raise ValidationFailed(f"`old` occurs {count} times; include more surrounding text to make it unique, "
                               "or set replace_all", {"occurrences": count})
    return text.replace(old, new), count


def unified_diff(old: str, new: str, path: str) -> str:
    return "".join(difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True),
        fromfile=f"a/{path}" if old else "/dev/null", tofile=f"b/{path}" if new else "/dev/null"))


@dataclass(frozen=True)
class Section:
    start_line: int
    end_line: int
    text: str


def sections(text: str) -> list[Section]:
    """Markdown headings start a section; long runs are cut every SECTION_LINES lines."""
    out: list[Section] = []
    lines = lines_of(text)
    start = 0
    for i in range(len(lines) + 1):
        at_end = i == len(lines)
        boundary = at_end or (i > start and (lines[i].startswith("#") or i - start >= SECTION_LINES))
        if boundary and i > start:
            chunk = "\n".join(lines[start:i])
            if chunk.strip():
                out.append(Section(start + 1, i, chunk))
            start = i
    return out
