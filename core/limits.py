"""The wire bounds: the hard maxima the request models enforce, and `Limits`, the bounds a
server runs with (advertised in GET /spec; see docs/configuration.md). Settings may lower the
configurable ones; nothing may advertise more than the models accept."""

from __future__ import annotations

from dataclasses import dataclass

MAX_SEARCH_LIMIT = 100
MAX_PAGE_SIZE = 200
MAX_BATCH_CELLS = 500
DEFAULT_PAGE_SIZE = 20
# The search score below which a hit is taken not to answer the query (adapters inject none
# of those): search scores are calibrated probabilities of relevance (core/ranker.py), and
# this is the threshold chosen on the precision dev stores (docs/retrieval.md).
DEFAULT_MIN_SCORE = 0.05

# An access pattern (`readable_by` / `writable_by`, grammar in `ampkit.glob`) written by a request
# or an import: at most this many characters and this many `*`. Matching is linear in the
# pattern and the id whatever the pattern; the bounds keep every engine's work per row small.
MAX_PATTERN_LENGTH = 256
MAX_PATTERN_STARS = 16
MAX_OUTCOME_NOTE = 2048  # characters of an outcome note (POST /memories/{id}/outcome)


@dataclass(frozen=True)
class Limits:
    """Advertised in GET /spec and enforced (see docs/configuration.md)."""

    max_cell_size_bytes: int = 65536
    max_request_bytes: int = 4 * 1024 * 1024
    max_search_limit: int = MAX_SEARCH_LIMIT
    max_page_size: int = MAX_PAGE_SIZE
    default_page_size: int = DEFAULT_PAGE_SIZE
    max_batch_cells: int = MAX_BATCH_CELLS


__all__ = ["DEFAULT_MIN_SCORE", "DEFAULT_PAGE_SIZE", "Limits", "MAX_BATCH_CELLS", "MAX_OUTCOME_NOTE", "MAX_PAGE_SIZE",
           "MAX_PATTERN_LENGTH", "MAX_PATTERN_STARS", "MAX_SEARCH_LIMIT"]
