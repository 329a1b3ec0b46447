"""Calendar dates in text, normalised, so a query's date can meet a cell's.

A question names a date the way people write it ("on 16 June, 2023", "in December 2023",
"October 13, 2023"); a memory carries its date in its metadata, often in another format
(LoCoMo's session date "1:56 pm on 8 May, 2023", or "2023-05-08"). Both are reduced to
(year, month, day or None) here; the retriever's date boost compares them
(`core/retrieval.py`). Year-only and relative expressions ("last week") are not dates here:
a year matches too much, a relative one needs the writer's own date.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Optional

_MONTH_NAMES = "january february march april may june july august september october november december".split()
MONTHS = {name: i for i, name in enumerate(_MONTH_NAMES, start=1)}
MONTHS.update({name[:3]: i for name, i in list(MONTHS.items())})
MONTHS["sept"] = 9
_MONTH = r"(january|february|march|april|may|june|july|august|september|october|november|december|jan|feb|mar|apr|jun|jul|aug|sept|sep|oct|nov|dec)\.?"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"((?:19|20)\d\d)"
DAY_MONTH_YEAR = re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}\b", re.I)
MONTH_DAY_YEAR = re.compile(rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b", re.I)
MONTH_YEAR = re.compile(rf"\b{_MONTH},?\s+{_YEAR}\b", re.I)
ISO_DATE = re.compile(r"\b((?:19|20)\d\d)-(\d\d)(?:-(\d\d))?\b")

Date = tuple[int, int, Optional[int]]  # year, month, day (None: the whole month)


def dates_in(text: str) -> set[Date]:
    """Every day ("8 May, 2023", "May 8, 2023", "2023-05-08") and month ("May 2023",
    "2023-05") the text names."""
    found: set[Date] = set()
    days: list[tuple[int, int]] = []
    for m in DAY_MONTH_YEAR.finditer(text):
        found.add((int(m[3]), MONTHS[m[2].lower()], int(m[1])))
        days.append(m.span())
    for m in MONTH_DAY_YEAR.finditer(text):
        found.add((int(m[3]), MONTHS[m[1].lower()], int(m[2])))
        days.append(m.span())
    for m in MONTH_YEAR.finditer(text):
        if not any(start <= m.start() < end for start, end in days):  # "8 May, 2023" is a day
            found.add((int(m[2]), MONTHS[m[1].lower()], None))
    for m in ISO_DATE.finditer(text):
        month = int(m[2])
        if 1 <= month <= 12:
            found.add((int(m[1]), month, int(m[3]) if m[3] else None))
    return {d for d in found if 1 <= d[1] <= 12 and (d[2] is None or 1 <= d[2] <= 31)}


def dates_of_metadata(metadata: dict[str, Any]) -> set[Date]:
    """The dates a cell's metadata names in its (top-level) string values."""
    found: set[Date] = set()
    for value in metadata.values():
        if isinstance(value, str) and any(ch.isdigit() for ch in value):
            found |= dates_in(value)
    return found


def date_match(asked: Iterable[Date], carried: Iterable[Date]) -> float:
    """1.0 when a cell's date is a day the query names, 0.5 when it falls in a month the
    query names, else 0 (a query's day never matches a cell that only knows the month)."""
    carried = list(carried)
    best = 0.0
    for year, month, day in asked:
        for c_year, c_month, c_day in carried:
            if (year, month) != (c_year, c_month):
                continue
            if day is None:
                best = max(best, 0.5)
            elif day == c_day:
                return 1.0
    return best
