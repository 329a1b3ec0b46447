"""Past versions of a cell, rebuilt from its history: as-of reads and rollback.

Every change to a cell appends a history entry whose `changes` map each changed field path
(`content.text`, `access_policy.readable_by`, ...) to `[old, new]`. Undoing the entries
recorded after a time T, newest first, from the cell as it is now, gives the cell as it was
at T; undoing them down to a version number gives that version (for rollback). Nothing is
stored twice: the history is the only record of the past.

What an as-of view carries (docs/time-travel.md):
- content, identity, scoring (importance, confidence, decay rate), access policy,
  provenance and lifecycle (status, expiry, supersession, version, last_updated_at) as they
  were at T;
- `scoring.access_count` 0 and `lifecycle.last_accessed_at` null: reads are not history,
  so what they counted at T is not known;
- nothing for a cell created after T, and nothing for a purged cell (its row is gone and
  its history keeps only who and when).

These are *as-of reads*; the `as_of` of `POST /admin/lifecycle/run` and `POST /admin/purge`
is something else, a clock override for those admin runs.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional, Sequence

from .access import can_read
from .bm25 import length_norm, plus_one_idf, term_score
from .models import STORED, HistoryEntry, MemoryCell, Status
from .store.base import CellFilter
from .textindex import cjk_terms, query_terms

if TYPE_CHECKING:
    from .store.base import Store

# Actions that wrote a new version (each bumped lifecycle.version by one). `create` is
# version 1; `purge` removes the row and writes no version.
UNVERSIONED_ACTIONS = frozenset({"create", "purge"})


def _undo(doc: dict[str, Any], changes: dict[str, Any]) -> None:
    """Put back the old value of every `section.field: [old, new]` pair of one entry.
    Other keys (`reason`, `to_version`, a create's summary) describe the change; they are
    not field values."""
    for path, pair in changes.items():
        if "." not in path or not isinstance(pair, list) or len(pair) != 2:
            continue
        *sections, leaf = path.split(".")
        target = doc
        for name in sections:
            target = target.setdefault(name, {})
        target[leaf] = pair[0]


def _rewind(current: MemoryCell, entries: Sequence[HistoryEntry], keep: int) -> MemoryCell:
    """The cell after its first `keep` history entries (the rest undone, newest first)."""
    doc = current.model_dump(mode="json")
    undone_versions = 0
    for entry in reversed(entries[keep:]):
        _undo(doc, entry.changes)
        undone_versions += entry.action not in UNVERSIONED_ACTIONS
    kept = [e for e in entries[:keep] if e.action not in UNVERSIONED_ACTIONS]
    lifecycle = doc["lifecycle"]
    lifecycle["version"] = max(1, current.lifecycle.version - undone_versions)
    if undone_versions:
        lifecycle["last_updated_at"] = kept[-1].at.isoformat() if kept else lifecycle["created_at"]
    lifecycle["last_accessed_at"] = None
    doc["scoring"]["access_count"] = 0
    return MemoryCell.model_validate(doc, context=STORED)


def cell_as_of(current: MemoryCell, entries: Sequence[HistoryEntry], at: datetime) -> Optional[MemoryCell]:
    """`current` as it was at `at`, or None when it did not exist yet.

    The state at T is the state after the last history entry (in recorded order) made at
    or before T; entries are never reordered by their timestamps."""
    if current.lifecycle.created_at > at:
        return None
    keep = 0
    for i, entry in enumerate(entries):
        if entry.at <= at:
            keep = i + 1
    return _rewind(current, entries, keep)


def cell_at_version(current: MemoryCell, entries: Sequence[HistoryEntry], version: int) -> Optional[MemoryCell]:
    """`current` as it was at `lifecycle.version == version`, or None if history does not
    reach back that far (a cell imported without its history)."""
    if not 1 <= version <= current.lifecycle.version:
        return None
    versions_to_undo = current.lifecycle.version - version
    keep = len(entries)
    while versions_to_undo and keep:
        keep -= 1
        versions_to_undo -= entries[keep].action not in UNVERSIONED_ACTIONS
    if versions_to_undo:
        return None
    # Entries after the target version that wrote no version (none today) stay undone too.
    return _rewind(current, entries, keep)


def readable_as_of(then: MemoryCell, now: MemoryCell, agent: str) -> bool:
    """The as-of access rule: readable under the policy as it stood then AND as it stands
    now. Revoking a reader hides the past from it too; a grant made later does not open up
    what was private then. A cell deleted since is gone from the past as well."""
    return can_read(then, agent) and can_read(now, agent)


def readable_history(current: MemoryCell, entries: Sequence[HistoryEntry], agent: str) -> list[HistoryEntry]:
    """The history `agent` may see, under the as-of rule (`readable_as_of`): an entry shows
    its `changes` (old and new values, texts included) only when the agent may read the
    version before it and the version after it, each under its policy then and now; any
    other entry keeps who, when and what action, with empty `changes`. So a reader granted
    access today does not read, in history, the text of versions that were private then.
    The versions are rebuilt newest first by undoing one entry at a time."""
    doc = current.model_dump(mode="json")
    readable_after = readable_as_of(current, current, agent)
    shown: list[HistoryEntry] = []
    for entry in reversed(entries):
        _undo(doc, entry.changes)
        if entry.action == "create":  # nothing before it
            readable_before = readable_after
        else:
            try:
                readable_before = readable_as_of(MemoryCell.model_validate(doc), current, agent)
            except ValueError:  # a version that no longer validates: shown as unreadable
                readable_before = False
        visible = readable_before and readable_after
        shown.append(entry if visible or not entry.changes else entry.model_copy(update={"changes": {}}))
        readable_after = readable_before
    shown.reverse()
    return shown


# ------------------------------------------------------------------ set filters at T
def json_equal(a: Any, b: Any) -> bool:
    """JSON equality as the stores' metadata filters compute it: 3 == 3.0, but true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b if not (_number(a) and _number(b)) else a == b


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def matches_at(
    cell: MemoryCell,
    at: datetime,
    *,
    statuses: Sequence[str],
    include_superseded: bool,
    session_id: Optional[str],
    metadata: Optional[dict[str, Any]],
) -> bool:
    """The list/search filter, applied to a cell as it was at `at` (the same meaning as
    `CellFilter`, evaluated in Python because the stores index only the present)."""
    lc = cell.lifecycle
    if lc.status not in statuses or lc.status == Status.deleted.value:
        return False
    if not include_superseded and lc.superseded_by is not None:
        return False
    if session_id is not None and cell.identity.session_id != session_id:
        return False
    if lc.expires_at is not None and lc.expires_at <= at:
        return False
    for key, value in (metadata or {}).items():
        if key not in cell.content.metadata or not json_equal(cell.content.metadata[key], value):
            return False
    return True


# ------------------------------------------------------------------ keyword ranking at T
_WORD = re.compile(r"\w+", re.UNICODE)


def bm25_scores(query: str, cells: Iterable[MemoryCell]) -> list[tuple[MemoryCell, float]]:
    """Okapi BM25 of `query` over the texts of `cells` (the as-of set the caller may read):
    the statistics come from these cells only, so no unreadable cell moves a score."""
    kept = list(cells)
    scores = bm25_text_scores(query, [cell.content.text for cell in kept])
    return [(cell, score) for cell, score in zip(kept, scores) if score > 0]


def bm25_text_scores(query: str, texts: Sequence[str]) -> list[float]:
    """BM25 of `query` over `texts`, statistics from these texts only; one score per text
    (`ampkit.bm25`, PostgreSQL's IDF)."""
    terms = query_terms(query)
    docs = [[w.lower() for w in _words(text)] for text in texts]
    if not docs or not terms:
        return [0.0] * len(docs)
    mean_len = sum(len(words) for words in docs) / len(docs) or 1.0
    df = {t: sum(t in set(words) for words in docs) for t in terms}
    out = []
    for words in docs:
        score = 0.0
        for t in terms:
            tf = words.count(t)
            if not tf:
                continue
            score += term_score(plus_one_idf(len(docs), df[t]), tf, length_norm(len(words), mean_len))
        out.append(score)
    return out


def _words(text: str) -> list[str]:
    return _WORD.findall(text) + cjk_terms(text)


# ------------------------------------------------------------------ the service's as-of reads
AS_OF_STATUSES = (Status.active.value, Status.stale.value, Status.archived.value)


def iter_as_of(
    store: "Store",
    agent: str,
    at: datetime,
    *,
    owner_id: Optional[str] = None,
    types: Optional[Sequence[str]] = None,
    statuses: Sequence[str] = (Status.active.value,),
    include_superseded: bool = False,
    session_id: Optional[str] = None,
    metadata: Optional[dict[str, Any]] = None,
    batch_size: int = 200,
) -> Iterator[MemoryCell]:
    """Every cell as it was at `at` that the caller may read (then and now) and that matched
    the filter then, in id order.

    The store pre-filters on what cannot have changed since (owner, type) and on the current
    access rule (`reader`, compiled to SQL from the same patterns `can_read` matches); the
    rest is decided per cell on its rebuilt past, so the cost is linear in the number of
    cells the caller may read now (docs/time-travel.md)."""
    flt = CellFilter(reader=agent, owner_id=owner_id, types=types, statuses=AS_OF_STATUSES, include_superseded=True)
    after: Optional[str] = None
    while True:
        page = store.list(flt, batch_size, after)
        if not page:
            return
        for cell in page:
            if not can_read(cell, agent):
                continue
            then = cell_as_of(cell, store.history(cell.id), at)
            if then is None or not readable_as_of(then, cell, agent):
                continue
            if matches_at(then, at, statuses=statuses, include_superseded=include_superseded,
                          session_id=session_id, metadata=metadata):
                yield then
        after = page[-1].id
