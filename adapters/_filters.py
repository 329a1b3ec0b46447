"""LangGraph's store filter and namespace-match semantics, written here so that the LangGraph
adapter needs none of LangGraph's private helpers. Pure functions, no framework import.

A value filter is a dict: `{"kind": "note"}` is equality; nested dicts match nested values;
lists match element by element; `{"score": {"$gte": 3}}` applies operators (`$eq`, `$ne`,
`$gt`, `$gte`, `$lt`, `$lte`), numbers compared as numbers, as LangGraph's own stores do.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

_ORDERED: dict[str, Callable[[float, float], bool]] = {
    "$gt": operator.gt, "$gte": operator.ge, "$lt": operator.lt, "$lte": operator.le,
}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _operator_holds(value: Any, op: str, wanted: Any) -> bool:
    if op == "$eq":
        return value == wanted
    if op == "$ne":
        return value != wanted
    if op in _ORDERED:
        a, b = _number(value), _number(wanted)
        return a is not None and b is not None and _ORDERED[op](a, b)
    raise ValueError(f"unsupported filter operator {op!r}; use one of $eq $ne $gt $gte $lt $lte")


def value_matches(value: Any, wanted: Any) -> bool:
    """Whether one stored value matches one filter value."""
    if isinstance(wanted, dict):
        if any(str(k).startswith("$") for k in wanted):
            return all(_operator_holds(value, op, arg) for op, arg in wanted.items())
        return isinstance(value, dict) and all(value_matches(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, (list, tuple)):
        return (isinstance(value, (list, tuple)) and len(value) == len(wanted)
                and all(value_matches(v, w) for v, w in zip(value, wanted)))
    return value == wanted


def item_matches(item_value: dict[str, Any], flt: dict[str, Any] | None) -> bool:
    """Whether a store item's value satisfies every key of a search filter."""
    return all(value_matches(item_value.get(k), v) for k, v in (flt or {}).items())


def namespace_matches(match_type: str, path: Sequence[str], namespace: Sequence[str]) -> bool:
    """A `MatchCondition`: `path` is a prefix or a suffix of `namespace`; `"*"` matches any label."""
    if len(namespace) < len(path):
        return False
    if match_type == "prefix":
        pairs = zip(namespace, path)
    elif match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path))
    else:
        raise ValueError(f"unsupported match type {match_type!r}")
    return all(p == "*" or n == p for n, p in pairs)
