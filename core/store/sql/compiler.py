"""One compiler for `CellFilter`: what a filter means is written here once, for every SQL store.

`compile_filter(flt, dialect)` gives the WHERE conditions (without the keyword) and their
parameters; the dialect (`dialects.py`) only spells them. The same conditions serve list,
count, and the keyword and vector legs, so a page, a total and a top-k admit the same cells.
"""

from __future__ import annotations

from typing import Any, Optional

from ...errors import ValidationFailed
from ...models import storable_text
from ..base import CellFilter
from .dialects import Dialect, SQLFragment


def check_filter(flt: CellFilter) -> None:
    """Refuse filter values no store can hold (NUL, lone surrogates) with the same 422 on every
    store: SQLite would quietly match nothing and PostgreSQL would fail in the driver."""
    for name, value in (("reader", flt.reader), ("owner_id", flt.owner_id), ("session_id", flt.session_id)):
        _check_text(name, value)
    for name, values in (("types", flt.types or ()), ("statuses", flt.statuses)):
        for value in values:
            _check_text(name, value)
    pending: list[Any] = [flt.metadata]
    while pending:  # iterative: nesting depth cannot exhaust the stack
        item = pending.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                _check_text("metadata", key if isinstance(key, str) else None)
                pending.append(value)
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            _check_text("metadata", item)


def _check_text(name: str, value: Optional[str]) -> None:
    if value is None:
        return
    try:
        storable_text(value)
    except ValueError as exc:
        raise ValidationFailed(f"{name}: {exc}", {"param": name}) from None


def compile_filter(flt: CellFilter, dialect: Dialect, alias: str = "c") -> SQLFragment:
    """The conditions of `flt` on the cells row `alias`, joined by AND, and their parameters."""
    check_filter(flt)
    a = alias
    p = dialect.param
    where: list[str] = []
    params: list[Any] = []

    def add(fragment: SQLFragment) -> None:
        where.append(fragment[0])
        params.extend(fragment[1])

    add(dialect.one_of(f"{a}.status", flt.statuses) if flt.statuses else (dialect.false, []))
    if flt.reader is not None:
        # The read rule of `ampkit.access.can_read`, inside the query: owner, creator, public,
        # or a `readable_by` pattern (compiled from the same parsed glob) matching the agent.
        match, match_params = dialect.reader_matches(a, flt.reader)
        add((f"({a}.owner_id = {p} OR {a}.created_by = {p} OR {dialect.is_true(f'{a}.public')} OR {match})",
             [flt.reader, flt.reader, *match_params]))
    if flt.owner_id is not None:
        add((f"{a}.owner_id = {p}", [flt.owner_id]))
    if flt.types:
        add(dialect.one_of(f"{a}.type", flt.types))
    if flt.session_id is not None:
        add((f"{a}.session_id = {p}", [flt.session_id]))
    if not flt.include_superseded:
        add((f"{a}.superseded_by IS NULL", []))
    if flt.not_expired_at is not None:
        add((f"({a}.expires_at IS NULL OR {a}.expires_at > {p})", [dialect.expiry(flt.not_expired_at)]))
    for key, value in (flt.metadata or {}).items():
        add(dialect.metadata_equals(a, str(key), value))
    if flt.pinned_only:
        add((dialect.pinned(a), []))
    return " AND ".join(where), params
