"""How each SQL database spells what the compiler (`compiler.py`) asks for.

A dialect answers "how do I write this here" and nothing else: placeholders, a membership
test, a boolean column, the reader-pattern match (patterns compiled by `ampkit.glob`, the one
grammar), a metadata value compared as JSON, the encoding of times, row locks, and which
driver errors mean what. The meaning of a filter lives once, in the compiler.

No driver is imported at module level: the PostgreSQL dialect must load without psycopg.
"""

from __future__ import annotations

from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, Sequence

from ...glob import literal, parse, parse_stored

SQLFragment = tuple[str, list[Any]]


class Dialect:
    """The spelling interface; see SQLiteDialect and PostgresDialect."""

    name = "abstract"
    param = "?"  # the driver's placeholder
    false = "0"  # a condition that is never true
    for_update = ""  # suffix of a SELECT that locks its rows until the transaction ends
    timestamp_type = "TEXT"  # the column type of a bookkeeping time (schema_migrations.applied_at)
    binary_collation = ""  # appended to a text expression to order it by code point
    owner_order = ""  # after `FROM cells c`: read the cells in owner order (facets' page of owners)

    def one_of(self, column: str, values: Sequence[Any]) -> SQLFragment:
        raise NotImplementedError

    def is_true(self, column: str) -> str:
        raise NotImplementedError

    def reader_pattern(self, pattern: str) -> str:
        """A stored `readable_by` pattern compiled for `reader_matches` (ampkit.glob)."""
        raise NotImplementedError

    def reader_matches(self, alias: str, reader: str) -> SQLFragment:
        """A condition that some `readable_by` pattern of the row `alias`, as stored for this
        dialect, matches the agent `reader`."""
        raise NotImplementedError

    def expiry(self, value: datetime) -> Any:
        """A time as the `expires_at` column holds it."""
        raise NotImplementedError

    def history_time(self, value: datetime) -> Any:
        """A history entry's time as the `history.at` column holds it."""
        raise NotImplementedError

    def timestamp(self, value: datetime) -> Any:
        """A time in a `timestamp_type` column (api_keys, schema_migrations)."""
        raise NotImplementedError

    def now(self) -> SQLFragment:
        """An expression for the current time, in a `timestamp_type` column."""
        raise NotImplementedError

    def metadata_equals(self, alias: str, key: str, value: Any) -> SQLFragment:
        """`content.metadata[key]` equals `value` as JSON (`ampkit.versions.json_equal`):
        3 = 3.0, true != 1, "3" != 3, objects equal whatever their key order, arrays in order,
        null matches only an explicit null, a missing key matches nothing."""
        raise NotImplementedError

    def pinned(self, alias: str) -> str:
        """A condition that the row `alias` holds `lifecycle.pinned: true` (in its body: a
        pin needs no column of its own, and an owner's cells are few next to the index scan
        that finds them)."""
        raise NotImplementedError

    def metadata_text(self, alias: str, key: str) -> SQLFragment:
        """The string `content.metadata[key]` of row `alias`; NULL when missing or not a string."""
        raise NotImplementedError

    # ------------------------------------------------------------ the error map
    def is_unique_violation(self, exc: BaseException) -> bool:
        raise NotImplementedError

    def is_unstorable_text(self, exc: BaseException) -> bool:
        """The database refused a value it cannot hold (NUL in text)."""
        return False


class SQLiteDialect(Dialect):
    name = "sqlite"
    param = "?"
    false = "0"
    for_update = ""  # writers are serialised (BEGIN IMMEDIATE): every row read is already ours
    # Left to itself the planner scans by status and sorts every readable owner to find a page;
    # walking the owner index stops after the page's rows.
    owner_order = " INDEXED BY cells_owner_status"

    def one_of(self, column: str, values: Sequence[Any]) -> SQLFragment:
        return f"{column} IN ({','.join('?' * len(values))})", list(values)

    def is_true(self, column: str) -> str:
        return f"{column} = 1"

    def reader_pattern(self, pattern: str) -> str:
        return parse_stored(pattern).sqlite_glob()

    def reader_matches(self, alias: str, reader: str) -> SQLFragment:
        return f"EXISTS (SELECT 1 FROM cell_readers r WHERE r.cell_id = {alias}.id AND ? GLOB r.pattern)", [reader]

    def expiry(self, value: datetime) -> float:
        return value.timestamp()

    def history_time(self, value: datetime) -> str:
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")

    def timestamp(self, value: datetime) -> str:
        return value.astimezone(timezone.utc).isoformat()

    def now(self) -> SQLFragment:
        return "?", [self.timestamp(datetime.now(timezone.utc))]

    def metadata_equals(self, alias: str, key: str, value: Any) -> SQLFragment:
        # json_each instead of a JSON path: a path cannot name every key (a '"' or a trailing
        # '\' in a key makes json_extract answer NULL), and `m.key = ?` can.
        params: list[Any] = [key]
        condition = self._json_equals("m0", value, 1, params)
        return (f"EXISTS (SELECT 1 FROM json_each({alias}.body, '$.content.metadata') m0 "
                f"WHERE m0.key = ? AND {condition})", params)

    def pinned(self, alias: str) -> str:
        return f"json_extract({alias}.body, '$.lifecycle.pinned') = 1"

    def metadata_text(self, alias: str, key: str) -> SQLFragment:
        return (f"(SELECT mv.atom FROM json_each({alias}.body, '$.content.metadata') mv "
                f"WHERE mv.key = ? AND mv.type = 'text')", [key])

    def _json_equals(self, entry: str, value: Any, depth: int, params: list[Any]) -> str:
        """The json_each row `entry` holds `value` (structurally, so key order never counts)."""
        if value is None:
            return f"{entry}.type = 'null'"
        if isinstance(value, bool):
            return f"{entry}.type = '{'true' if value else 'false'}'"
        if isinstance(value, (int, float)):
            params.append(value)
            return f"{entry}.type IN ('integer', 'real') AND {entry}.atom = ?"
        if isinstance(value, str):
            params.append(value)
            return f"{entry}.type = 'text' AND {entry}.atom = ?"
        child = f"m{depth}"
        if isinstance(value, dict):
            items: list[tuple[Any, Any]] = list(value.items())
            shape = f"{entry}.type = 'object' AND (SELECT COUNT(*) FROM json_each({entry}.value)) = {len(items)}"
        else:
            items = list(enumerate(value))
            shape = f"{entry}.type = 'array' AND json_array_length({entry}.value) = {len(items)}"
        parts = [shape]
        for k, v in items:
            params.append(k)
            inner = self._json_equals(child, v, depth + 1, params)
            parts.append(f"EXISTS (SELECT 1 FROM json_each({entry}.value) {child} WHERE {child}.key = ? AND {inner})")
        return " AND ".join(parts)

    def is_unique_violation(self, exc: BaseException) -> bool:
        import sqlite3

        return isinstance(exc, sqlite3.IntegrityError) and "UNIQUE" in str(exc)


class PostgresDialect(Dialect):
    name = "postgresql"
    param = "%s"
    false = "FALSE"
    for_update = " FOR UPDATE"  # two servers updating one cell queue on the row lock
    timestamp_type = "TIMESTAMPTZ"
    binary_collation = ' COLLATE "C"'

    def one_of(self, column: str, values: Sequence[Any]) -> SQLFragment:
        return f"{column} = ANY(%s)", [list(values)]

    def is_true(self, column: str) -> str:
        return column

    def reader_pattern(self, pattern: str) -> str:
        return parse_stored(pattern).postgres_regex()

    def reader_literal(self, agent_id: str) -> str:
        """What `reader_pattern` makes of the pattern that names exactly `agent_id`
        (`ampkit.glob.literal`): a stored regular expression equal to it names that agent."""
        return _literal_regex(agent_id)

    def reader_matches(self, alias: str, reader: str) -> SQLFragment:
        # `reader_patterns` holds every pattern as a regular expression; migration 14 derives
        # from it, in the database, `reader_literals` (those of READER_LITERAL's shape: each
        # matches one agent id, the one `reader_literal` compiles to that same text) and
        # `reader_globs` (the rest). A literal is then compared by equality rather than run as
        # a regular expression on every row a wide filter scans, which makes a new wide
        # reader's admitted rows cheaper to find (README, "Readers named, not matched").
        # `~ ANY` of an empty array costs nothing measurable. Same answer as
        # `~ ANY(reader_patterns)`, and so as `can_read`'s matcher: a regular expression of
        # that shape matches exactly the one id whose literal compiles to it; both columns
        # are NOT NULL, with no NULL element.
        return (f"(%s = ANY({alias}.reader_literals) OR %s ~ ANY({alias}.reader_globs))",
                [self.reader_literal(reader), reader])

    def expiry(self, value: datetime) -> datetime:
        return value

    def history_time(self, value: datetime) -> datetime:
        return value.astimezone(timezone.utc)

    def timestamp(self, value: datetime) -> datetime:
        return value

    def now(self) -> SQLFragment:
        return "now()", []

    def metadata_equals(self, alias: str, key: str, value: Any) -> SQLFragment:
        import json

        # JSONB equality is already structural: key order never counts, 3 = 3.0, true != 1.
        return f"{alias}.metadata -> %s = %s::jsonb", [str(key), json.dumps(value)]

    def pinned(self, alias: str) -> str:
        return f"({alias}.body -> 'lifecycle' ->> 'pinned') = 'true'"

    def metadata_text(self, alias: str, key: str) -> SQLFragment:
        return (f"(CASE WHEN jsonb_typeof({alias}.metadata -> %s) = 'string' THEN {alias}.metadata ->> %s END)",
                [key, key])

    def is_unique_violation(self, exc: BaseException) -> bool:
        import psycopg

        return isinstance(exc, psycopg.errors.UniqueViolation)

    def is_unstorable_text(self, exc: BaseException) -> bool:
        import psycopg

        # psycopg refuses NUL in a text parameter itself (DataError); the server refuses a
        # \u0000 escape inside JSON it must convert (UntranslatableCharacter).
        return isinstance(exc, psycopg.errors.UntranslatableCharacter) or (
            isinstance(exc, psycopg.DataError) and "NUL" in str(exc))


# The regular expressions `PostgresDialect.reader_pattern` makes of a pattern that names one
# agent id (no wildcard; a set only where `ampkit.glob.literal` writes one, for `*`, `?`, `[`):
# anchored, every item one character, spelled one way (`ampkit.glob._postgres_regex`). The
# same text is a PostgreSQL regular expression (migration 14's functions) and a Python one
# (tests). A change to it, or to how `ampkit.glob` spells a regular expression, needs a
# migration: the stored split and `reader_literal` must keep agreeing.
READER_LITERAL = r"^\^([A-Za-z0-9]|\\u[0-9a-f]{4}|\\U[0-9a-f]{8}|\[\\u(002a|003f|005b)\])*\$$"


@lru_cache(maxsize=4096)
def _literal_regex(agent_id: str) -> str:
    return parse(literal(agent_id)).postgres_regex()


SQLITE = SQLiteDialect()
POSTGRES = PostgresDialect()
