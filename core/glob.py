"""The one glob dialect of `readable_by` / `writable_by`: one parser, three compilations.

Grammar (a pattern is matched against the whole agent id, case-sensitively):

    pattern := item+
    item    := "*"                 any run of characters, the empty one included
             | "?"                 exactly one character
             | "[" "!"? set "]"    one character in (or, with "!", not in) the set
             | any other character itself
    set     := "]"? element+       a "]" right after "[" or "[!" is a member, not the end
             | "]"
    element := c "-" c             a range, first <= last by code point
             | c                   one character ("-" first or last is itself)

Anything else is refused: an unclosed "[", an empty set "[]" / "[!]", a range whose ends are
reversed (`[z-a]`, `[a-Z]`), POSIX classes (`[[:alpha:]]`), and `[^` (fnmatch reads it as a
literal "^", SQL GLOB and regular expressions as negation). There is no escape character:
"\\" is an ordinary character.

`parse` turns a pattern into a `Pattern`; `matches` (the access rule's matcher, used by
`ampkit.access`), `sqlite_glob` (SQLite's GLOB) and `postgres_regex` (PostgreSQL's `~`) are
all generated from that one parsed form, and a property test holds them to the same answer on
every pattern the grammar admits. Stored patterns written before this grammar existed and
outside it are rewritten by a numbered migration (SQLite 5, PostgreSQL 6) into the pattern
that matches their text literally (`upgrade_stored`): they grant exactly the agent id spelled
like them, nothing a guess at their meaning would add.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from .limits import MAX_PATTERN_LENGTH, MAX_PATTERN_STARS


class GlobError(ValueError):
    """A pattern outside the grammar; the message says where and why."""


@dataclass(frozen=True)
class AnyRun:
    """`*`"""


@dataclass(frozen=True)
class AnyOne:
    """`?`"""


@dataclass(frozen=True)
class CharSet:
    """`[...]` / `[!...]`: ranges of code points, single characters as (c, c)."""

    negated: bool
    ranges: tuple[tuple[str, str], ...]


Item = str | AnyRun | AnyOne | CharSet  # a str item is one literal character


@dataclass(frozen=True)
class Pattern:
    source: str
    items: tuple[Item, ...]

    def matches(self, agent_id: str) -> bool:
        return _matches(self, agent_id)

    def sqlite_glob(self) -> str:
        return _sqlite_glob(self)

    def postgres_regex(self) -> str:
        return _postgres_regex(self)


def _parse_set(pattern: str, start: int) -> tuple[CharSet, int]:
    """The set opening at pattern[start] == "["; returns it and the index after its "]"."""
    i, n = start + 1, len(pattern)
    negated = i < n and pattern[i] == "!"
    if negated:
        i += 1
    if pattern.startswith("[^", start):
        raise GlobError(f"'[^' at position {start}: write a negated set as [!...]")
    if pattern.startswith("[:", i):
        raise GlobError(f"POSIX character classes such as [:alpha:] are not supported (position {i})")
    members: list[str] = []
    if i < n and pattern[i] == "]":
        members.append("]")
        i += 1
    while i < n and pattern[i] != "]":
        members.append(pattern[i])
        i += 1
    if i >= n:
        raise GlobError(f"unclosed '[' at position {start}")
    if not members:
        raise GlobError(f"empty set at position {start}")
    ranges: list[tuple[str, str]] = []
    j = 0
    while j < len(members):
        if j + 2 < len(members) and members[j + 1] == "-":
            lo, hi = members[j], members[j + 2]
            if lo > hi:
                raise GlobError(f"reversed range '{lo}-{hi}' in the set at position {start}")
            ranges.append((lo, hi))
            j += 3
        else:
            ranges.append((members[j], members[j]))
            j += 1
    return CharSet(negated, tuple(ranges)), i + 1


@lru_cache(maxsize=4096)
def parse(pattern: str) -> Pattern:
    """The parsed pattern, or GlobError."""
    if not pattern:
        raise GlobError("a pattern must not be empty")
    items: list[Item] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "*":
            if not items or items[-1] != AnyRun():  # "**" means what "*" means
                items.append(AnyRun())
            i += 1
        elif ch == "?":
            items.append(AnyOne())
            i += 1
        elif ch == "[":
            charset, i = _parse_set(pattern, i)
            items.append(charset)
        else:
            items.append(ch)
            i += 1
    return Pattern(pattern, tuple(items))


def literal(text: str) -> str:
    """The pattern that matches exactly `text` (its `*`, `?` and `[` written as one-member sets)."""
    return "".join(f"[{ch}]" if ch in "*?[" else ch for ch in text)


def upgrade_stored(pattern: str) -> str:
    """A pattern stored before this grammar existed, as the migrations rewrite it: unchanged
    when valid, else the pattern matching its text literally (it fails closed: it grants
    exactly the agent id spelled like it, nothing a guess at its meaning would add)."""
    try:
        parse(pattern)
    except GlobError:
        return literal(pattern)
    return pattern


@lru_cache(maxsize=4096)
def parse_stored(pattern: str) -> Pattern:
    """A stored pattern, parsed; one the migrations have not rewritten yet (see
    `upgrade_stored`) is read the way they rewrite it."""
    return parse(upgrade_stored(pattern))


def check(pattern: str) -> str:
    """Validate a pattern about to be written (pydantic validator); returns it unchanged."""
    parse(pattern)
    return pattern


def check_bounds(pattern: str) -> str:
    """The bounds of a pattern about to be written (`MAX_PATTERN_LENGTH` characters,
    `MAX_PATTERN_STARS` `*`); returns it unchanged. Stored patterns are not held to them:
    one written before they existed still loads and matches (in linear time, like any)."""
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise GlobError(f"{len(pattern)} characters, at most {MAX_PATTERN_LENGTH}")
    stars = pattern.count("*")
    if stars > MAX_PATTERN_STARS:
        raise GlobError(f"{stars} '*', at most {MAX_PATTERN_STARS}")
    return pattern


# ------------------------------------------------------------------ compilations
def _segment_regex(items: Sequence[Item]) -> str:
    """A run of one-character items as a regular expression with no repetition: it matches
    only strings of exactly len(items) characters, without backtracking."""
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(re.escape(item))
        elif isinstance(item, AnyOne):
            out.append(".")
        elif isinstance(item, CharSet):
            body = "".join(re.escape(lo) if lo == hi else f"{re.escape(lo)}-{re.escape(hi)}" for lo, hi in item.ranges)
            out.append(f"[{'^' if item.negated else ''}{body}]")
    return "".join(out)


@lru_cache(maxsize=4096)
def _segments(p: Pattern) -> tuple[tuple[re.Pattern[str], int], ...]:
    """The pattern cut at its `*`s: each piece a fixed-width regular expression and its width."""
    pieces: list[list[Item]] = [[]]
    for item in p.items:
        if isinstance(item, AnyRun):
            pieces.append([])
        else:
            pieces[-1].append(item)
    return tuple((re.compile(_segment_regex(piece), re.DOTALL), len(piece)) for piece in pieces)


def _matches(p: Pattern, agent_id: str) -> bool:
    """The one Python matcher, in time linear in the pattern and the id whatever the pattern.

    A regular expression with several `.*` backtracks exponentially on an id it cannot match
    (`*?*?...!` can freeze a server); here only the pieces between `*`s are regular
    expressions, each of fixed width and without repetition. The first piece must match at
    the start, the last at the end, and each middle one is taken at its leftmost place after
    the previous one (the classic wildcard algorithm: a later `*` can absorb whatever an
    earlier, leftmost choice leaves, so no other choice needs trying)."""
    pieces = _segments(p)
    n = len(agent_id)
    if len(pieces) == 1:
        regex, width = pieces[0]
        return width == n and regex.fullmatch(agent_id) is not None
    (head, head_width), middle, (tail, tail_width) = pieces[0], pieces[1:-1], pieces[-1]
    if head_width + tail_width + sum(width for _, width in middle) > n:
        return False
    end = n - tail_width
    if head.fullmatch(agent_id, 0, head_width) is None or tail.fullmatch(agent_id, end, n) is None:
        return False
    at = head_width
    for regex, _ in middle:
        found = regex.search(agent_id, at, end)
        if found is None:
            return False
        at = found.end()
    return True


def _postgres_char(ch: str) -> str:
    # A character-entry escape means the character itself everywhere in an ARE, brackets included.
    code = ord(ch)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


@lru_cache(maxsize=4096)
def _postgres_regex(p: Pattern) -> str:
    out = ["^"]
    for item in p.items:
        if isinstance(item, str):
            out.append(item if item.isascii() and item.isalnum() else _postgres_char(item))
        elif isinstance(item, AnyRun):
            out.append(".*")
        elif isinstance(item, AnyOne):
            out.append(".")
        else:
            body = "".join(
                _postgres_char(lo) if lo == hi else f"{_postgres_char(lo)}-{_postgres_char(hi)}" for lo, hi in item.ranges
            )
            out.append(f"[{'^' if item.negated else ''}{body}]")
    out.append("$")
    return "".join(out)


_GLOB_SPECIAL = ("]", "-", "^")  # members a GLOB set can only hold in certain places


def _glob_set(charset: CharSet) -> str:
    """A GLOB set with the same members. GLOB has no escapes, so "]" goes first, "-" last, "^"
    never first, and ranges are split so that none of those three is ever a range end."""
    specials: set[str] = set()
    ranges: list[str] = []
    for lo, hi in charset.ranges:
        a, b = ord(lo), ord(hi)
        start = a
        for cut in sorted(ord(s) for s in _GLOB_SPECIAL if a <= ord(s) <= b) + [b + 1]:
            if cut <= b:
                specials.add(chr(cut))
            if start <= cut - 1:
                ranges.append(chr(start) if start == cut - 1 else f"{chr(start)}-{chr(cut - 1)}")
            start = cut + 1
    head: list[str] = ["]"] if "]" in specials else []
    tail: list[str] = [s for s in ("^", "-") if s in specials]
    if not charset.negated and not head and not ranges and tail and tail[0] == "^":
        if tail == ["^"]:
            return "^"  # the set of one "^" is that character, written outside a set
        tail = ["-", "^"]  # "-" first is a member too, and keeps "^" from negating
    return f"[{'^' if charset.negated else ''}{''.join(head + ranges + tail)}]"


@lru_cache(maxsize=4096)
def _sqlite_glob(p: Pattern) -> str:
    out = []
    for item in p.items:
        if isinstance(item, str):
            out.append(f"[{item}]" if item in "*?[" else item)
        elif isinstance(item, AnyRun):
            out.append("*")
        elif isinstance(item, AnyOne):
            out.append("?")
        else:
            out.append(_glob_set(item))
    return "".join(out)
