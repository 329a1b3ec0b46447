"""Decay and the status state machine.

    decay = importance x confidence x e^(-decay_rate x days since last access, else creation)

    active --(decay < stale_threshold)--> stale --(stale_archive_days without update)--> archived
    stale  --(decay back >= threshold: read or re-scored)--> active
    active|stale --(expires_at passed)--> archived
    active|stale --(PATCH lifecycle.status=archived)--> archived
    archived --(DELETE)--> deleted            (terminal; purge after retention_days)

Everything here is pure: no I/O, the clock is an argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Optional

from .errors import InvalidTransition
from .models import MemoryCell, Status

SECONDS_PER_DAY = 86400.0


@dataclass(frozen=True)
class LifecyclePolicy:
    """The documented thresholds (see docs/configuration.md)."""

    stale_threshold: float = 0.3
    stale_archive_days: float = 30.0
    retention_days: float = 30.0
    interval_seconds: float = 3600.0


def decay_score(cell: MemoryCell, now: datetime) -> float:
    s = cell.scoring
    since = cell.lifecycle.last_accessed_at or cell.lifecycle.created_at
    days = max(0.0, (now - since).total_seconds() / SECONDS_PER_DAY)
    return s.importance * s.confidence * math.exp(-s.decay_rate * days)


def is_expired(cell: MemoryCell, now: datetime) -> bool:
    return cell.lifecycle.expires_at is not None and cell.lifecycle.expires_at <= now


def scheduled_status(cell: MemoryCell, now: datetime, policy: LifecyclePolicy) -> tuple[Optional[str], str]:
    """What a lifecycle run does to one cell: (new status or None, reason)."""
    status = cell.lifecycle.status
    if status in (Status.archived.value, Status.deleted.value):
        return None, ""
    if cell.identity.path is not None:  # a memory file changes only through the files API
        return None, ""
    if is_expired(cell, now):
        return Status.archived.value, "expired"
    score = decay_score(cell, now)
    if status == Status.active.value and score < policy.stale_threshold:
        return Status.stale.value, "decayed"
    if status == Status.stale.value:
        if score >= policy.stale_threshold:
            return Status.active.value, "revived"
        updated = cell.lifecycle.last_updated_at or cell.lifecycle.created_at
        if (now - updated).total_seconds() >= policy.stale_archive_days * SECONDS_PER_DAY:
            return Status.archived.value, "stale_too_long"
    return None, ""


def check_patch_transition(current: str, requested: str) -> None:
    """PATCH may only archive an active or stale cell (or leave the status as it is)."""
    if requested == current:
        return
    if requested == Status.archived.value and current in (Status.active.value, Status.stale.value):
        return
    raise InvalidTransition(
        f"PATCH cannot move a cell from {current} to {requested}; "
        "only active or stale -> archived is allowed (use DELETE on an archived cell)",
        {"from": current, "to": requested},
    )


def check_restore_transition(current: str) -> None:
    """Restore (extension `restore`) brings an archived cell back to active, and nothing else."""
    if current != Status.archived.value:
        raise InvalidTransition(
            f"restore brings an archived cell back to active; this one is {current}",
            {"from": current, "to": Status.active.value},
        )


def check_delete_transition(current: str) -> None:
    if current != Status.archived.value:
        raise InvalidTransition(
            f"DELETE needs an archived cell; this one is {current} (archive it first with PATCH)",
            {"from": current, "to": Status.deleted.value},
        )


def purge_eligible(cell: MemoryCell, now: datetime, policy: LifecyclePolicy) -> tuple[bool, str]:
    if cell.lifecycle.status != Status.deleted.value:
        return False, f"cell is {cell.lifecycle.status}, only deleted cells can be purged"
    deleted_at = cell.lifecycle.last_updated_at or cell.lifecycle.created_at
    age_days = (now - deleted_at).total_seconds() / SECONDS_PER_DAY
    if age_days < policy.retention_days:
        return False, f"deleted {age_days:.2f} days ago; retention is {policy.retention_days:g} days"
    return True, ""
