"""The wire bounds: the hard maxima the request models enforce, and `Limits`, the bounds a
server runs with (advertised in GET /spec; see docs/configuration.md). Settings may lower the
configurable ones; nothing may advertise more than the models accept."""

from __future__ import annotations

import json
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import TYPE_CHECKING

from .errors import PayloadTooLarge

if TYPE_CHECKING:
    from .models import MemoryCell

MAX_SEARCH_LIMIT = 100
MAX_PAGE_SIZE = 200
MAX_BATCH_CELLS = 500
DEFAULT_PAGE_SIZE = 20
# An access pattern (`readable_by` / `writable_by`, grammar in `ampkit.glob`) written by a request
# or an import: at most this many characters and this many `*`. Matching is linear in the
# pattern and the id whatever the pattern; the bounds keep every engine's work per row small.
MAX_PATTERN_LENGTH = 256
MAX_PATTERN_STARS = 16


@dataclass(frozen=True)
class Limits:
    """Advertised in GET /spec and enforced (see docs/configuration.md)."""

    max_cell_size_bytes: int = 65536
    max_request_bytes: int = 4 * 1024 * 1024
    max_search_limit: int = MAX_SEARCH_LIMIT
    max_page_size: int = MAX_PAGE_SIZE
    default_page_size: int = DEFAULT_PAGE_SIZE
    max_batch_cells: int = MAX_BATCH_CELLS


_EMPTY_METADATA_CONTENT = len('{"text":,"metadata":{}}')


def cell_size_bytes(cell: "MemoryCell") -> int:
    """The measured size of a cell: its `content` object as compact UTF-8 JSON."""
    if not cell.content.metadata:  # most cells: the same bytes, spelled out without a dump
        return _EMPTY_METADATA_CONTENT + len(encode_basestring(cell.content.text).encode("utf-8"))
    content = cell.content.model_dump(mode="json")
    return len(json.dumps(content, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def check_cell_size(cell: "MemoryCell", limits: Limits, measured: bool = True) -> None:
    """413 over `max_cell_size_bytes`: the one size rule of every write (create, batch, PATCH,
    rollback, import). `measured=False` (a caller that cannot read the cell) leaves the size
    out: it would tell a writer-only agent the length of text it may not read."""
    size = cell_size_bytes(cell)
    if size <= limits.max_cell_size_bytes:
        return
    if not measured:
        raise PayloadTooLarge(f"the changed cell's content exceeds {limits.max_cell_size_bytes} bytes",
                              {"max_cell_size_bytes": limits.max_cell_size_bytes})
    raise PayloadTooLarge(f"cell content is {size} bytes; the maximum is {limits.max_cell_size_bytes}",
                          {"size_bytes": size, "max_cell_size_bytes": limits.max_cell_size_bytes})


__all__ = ["DEFAULT_PAGE_SIZE", "Limits", "cell_size_bytes", "check_cell_size", "MAX_BATCH_CELLS", "MAX_PAGE_SIZE", "MAX_PATTERN_LENGTH", "MAX_PATTERN_STARS",
           "MAX_SEARCH_LIMIT"]
