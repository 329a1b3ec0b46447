"""PostgreSQL store URLs: ampkit's own pool options ride on the query string, and passwords
never reach a message or a log. No psycopg import here, so the CLI can use it freely."""

from __future__ import annotations

from typing import Any, Callable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

# Options ampkit reads from the URL query (everything else goes to libpq untouched).
def _threshold(value: str) -> "int | None":
    return None if value.lower() in ("none", "off", "") else int(value)


POOL_OPTIONS: dict[str, Callable[[str], Any]] = {
    "pool_min": int,
    "pool_max": int,
    "pool_timeout": float,
    "ef_search": int,
    "keyword_ranker": str,
    "keyword_cache_mb": int,  # the wide keyword leg's arrays; 0: rank every keyword search in SQL
    "prepare_threshold": _threshold,  # psycopg's auto-prepare; "none" behind an old pgbouncer
    "approximate": lambda v: v.lower() not in ("off", "false", "0", "no"),  # the HNSW graph for the dense leg
}


def split_url(url: str) -> tuple[str, dict[str, Any]]:
    """`postgresql://...?pool_max=5&sslmode=require` -> (libpq URL, {"pool_max": 5})."""
    parts = urlsplit(url)
    scheme = "postgresql" if parts.scheme in ("postgres", "postgresql+psycopg") else parts.scheme
    query, options = [], {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in POOL_OPTIONS:
            options[key] = POOL_OPTIONS[key](value)
        else:
            query.append((key, value))
    return urlunsplit((scheme, parts.netloc, parts.path, urlencode(query, safe="/"), parts.fragment)), options


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
