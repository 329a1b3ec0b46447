"""Who may read and who may write a cell: the one access-decision function.

Every path that returns or changes a cell (get, patch, delete, search, list, history,
export, supersede) calls `can_read` / `can_write`. Stores also pre-filter in SQL with the
GLOB / regular expression compiled from the same parsed pattern (`ampkit.glob`), so that pages
and rankings are built only from readable cells; the service then re-checks every cell with
`can_read`, so the SQL is an optimisation and this module stays the authority.

Rules (AMP v0.1, with portable case-sensitive matching):
- the owner and the creator may read and write;
- an agent matching a `readable_by` pattern may read; `public` lets any agent read;
- an agent matching a `writable_by` pattern may write, and being writable does NOT make a
  cell readable (a writer-only agent can blindly append or archive, never see the text);
- writing never grants reading by another route either: the access policy (any part of it)
  is changed only by the owner, the creator or an admin key (`may_change_policy`, enforced by
  `check_policy_change`); a writer changes content, never who can read;
- patterns are globs (`*`, `?`, `[seq]`, `[!seq]`; grammar in `ampkit.glob`), matched
  case-sensitively against the whole agent id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Optional, Sequence

from .errors import MissingAgentId, PolicyChangeDenied, ValidationFailed
from .glob import parse_stored
from .models import AccessPolicy, MemoryCell, Status

if TYPE_CHECKING:
    import numpy as np


def check_agent_id(value: Optional[str]) -> str:
    """The caller's agent id as the protocol accepts it (the X-AMP-Agent-ID rule): 1-256
    printable characters after trimming. Server, in-process clients and key issuing share it."""
    agent = (value or "").strip()
    if not agent:
        raise MissingAgentId("X-AMP-Agent-ID header is required")
    if len(agent) > 256 or any(ord(ch) < 32 or ord(ch) == 127 for ch in agent):
        raise ValidationFailed("X-AMP-Agent-ID must be 1-256 printable characters")
    return agent


def _matches_any(agent_id: str, patterns: Iterable[str]) -> bool:
    return any(parse_stored(p).matches(agent_id) for p in patterns)


def is_principal(cell: MemoryCell, agent_id: str) -> bool:
    """Owner or creator: full access."""
    return agent_id == cell.identity.owner_id or agent_id == cell.identity.created_by


def can_read(cell: MemoryCell, agent_id: str) -> bool:
    if cell.lifecycle.status == Status.deleted.value:
        return False
    policy = cell.access_policy
    return is_principal(cell, agent_id) or policy.public or _matches_any(agent_id, policy.readable_by)


def can_read_columns(
    agent_id: str,
    *,
    deleted: np.ndarray,
    owner_is_agent: np.ndarray,
    creator_is_agent: np.ndarray,
    public: np.ndarray,
    reader_set: np.ndarray,
    reader_sets: Sequence[Sequence[str]],
) -> np.ndarray:
    """`can_read` for many cells at once, over their columns (the SQLite store's in-memory
    access snapshot): one boolean per cell. `reader_set[i]` is the index in `reader_sets` of
    cell i's `readable_by` patterns (cells share a few distinct pattern sets); each set is
    matched once, by the same matcher as `can_read`. A property test holds the two equal."""
    import numpy as np  # here, not at the top: the HTTP client imports this module and needs no numpy

    set_matches = np.fromiter((_matches_any(agent_id, patterns) for patterns in reader_sets),
                              dtype=bool, count=len(reader_sets))
    granted = owner_is_agent | creator_is_agent | public
    if set_matches.any():
        granted |= set_matches[reader_set]
    return granted & ~deleted


def can_write(cell: MemoryCell, agent_id: str) -> bool:
    if cell.lifecycle.status == Status.deleted.value:
        return False
    return is_principal(cell, agent_id) or _matches_any(agent_id, cell.access_policy.writable_by)


def may_change_policy(cell: MemoryCell, agent_id: str, *, admin_key: bool = False) -> bool:
    """Who may change a cell's access policy (public, readable_by, writable_by, any part): its
    owner or creator, or a caller holding an API key with the `admin` scope (`admin_key`;
    never implied by auth being off or by an in-process client). A writer that is neither
    changes content only: otherwise writing would grant reading, by naming itself a reader."""
    return admin_key or is_principal(cell, agent_id)


POLICY_CHANGE_DENIED_MESSAGE = ("only the cell's owner or creator, or an admin key, may change its access policy; "
                                "a writer may change the content, never who can read it")


def check_policy_change(cell: MemoryCell, agent_id: str, requested: Optional[AccessPolicy], *,
                        admin_key: bool = False, sees_policy: bool = True) -> None:
    """Refuse (403 POLICY_CHANGE_DENIED) a request that would give `cell` the access policy
    `requested` (None: the request does not touch it) when `may_change_policy` says no.
    Sending the policy unchanged is allowed to a caller that may read the cell
    (`sees_policy`, e.g. a form that sends every field back); a caller that may not read it
    is refused on sight of the field, so its answer never tells whether a guess equalled the
    policy it may not see. Every write path (PATCH, supersede) calls this."""
    if requested is None or may_change_policy(cell, agent_id, admin_key=admin_key):
        return
    if not sees_policy or requested != cell.access_policy:
        raise PolicyChangeDenied(POLICY_CHANGE_DENIED_MESSAGE, {"field": "access_policy"})


def readers_kept(old: MemoryCell, new: MemoryCell) -> bool:
    """Whether every agent that may read `old` may read `new` as well (a replacement that
    leaves no reader of the old cell with nothing to read). Decided conservatively, since
    patterns cannot always be compared: a pattern of `old` counts as kept only when `new`
    holds the same pattern, or is public; an agent named outright (the owner, the creator,
    a pattern without wildcards) when `can_read(new, agent)`. False when it cannot tell."""
    if new.access_policy.public:
        return True
    if old.access_policy.public:
        return False
    named = [old.identity.owner_id, old.identity.created_by]
    for pattern in old.access_policy.readable_by:
        if pattern in new.access_policy.readable_by:
            continue
        if any(ch in pattern for ch in "*?["):
            return False
        named.append(pattern)
    return all(agent is None or can_read(new, agent) for agent in named)
