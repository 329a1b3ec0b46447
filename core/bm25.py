"""Okapi BM25, written once: the term score and the two IDFs, in Python (scalars or numpy
arrays alike) and in SQL (PostgreSQL's statement).

A document's score is the sum over the query terms it holds of
`term_score(idf, tf, length_norm(length, avgdl))`, summed in the caller's term order. Every
engine computes exactly these operations in this order, so equal inputs give equal bits
(the stores' numpy legs are compared with the SQL statement and with straightforward loops
score for score: `tests/test_keyword_bm25.py`, `tests/test_bm25.py`).

The two IDFs are two engines' choices, kept apart because rankings depend on them:
- `fts5_idf`: SQLite's keyword leg, FTS5's IDF (`log((N - df + 0.5) / (df + 0.5))`), floored
  at 1e-6 for a term in more than half the documents;
- `plus_one_idf`: PostgreSQL's keyword leg and the as-of search (`versions.py`),
  `ln(1 + (N - df + 0.5) / (df + 0.5))`, never negative.

Statistics (N, df, the mean length) are the caller's: always over the cells the search's
caller may read, never the whole corpus (non-interference).
"""

from __future__ import annotations

import math
from typing import Any

K1, B = 1.2, 0.75  # FTS5's bm25() constants


def fts5_idf(n: int, df: int) -> float:
    """FTS5's IDF, floored at 1e-6 for a term in more than half the documents; 0 for no match."""
    if not df:
        return 0.0
    value = math.log((n - df + 0.5) / (df + 0.5))
    return value if value > 0 else 1e-6


def plus_one_idf(n: float, df: float) -> float:
    """`ln(1 + (max(N, df) - df + 0.5) / (df + 0.5))` (libm's log, as PostgreSQL's `ln`)."""
    return math.log(1 + (max(n, df) - df + 0.5) / (df + 0.5))


def length_norm(length: Any, avgdl: float) -> Any:
    """`K1 * (1 - B + B * length / avgdl)`, of one length or an array of them. A mean of 0 (no
    words anywhere) takes every length as the mean: K1."""
    if not avgdl:
        return length * 0.0 + K1
    return K1 * (1 - B + B * length / avgdl)


def term_score(idf: float, tf: Any, norm: Any) -> Any:
    """One term's score in a document: `idf * tf * (K1 + 1) / (tf + norm)` (`norm`: `length_norm`),
    of one document or arrays of them."""
    return idf * tf * (K1 + 1) / (tf + norm)


# ------------------------------------------------------------------ the same in SQL
def sql_plus_one_idf(n: str, df: str) -> str:
    """`plus_one_idf` as a PostgreSQL expression over the SQL expressions `n` and `df`."""
    return f"ln(1 + (GREATEST({n}, {df}) - {df} + 0.5) / ({df} + 0.5))"


def sql_term_score(idf: str, tf: str, length: str, avgdl: str) -> str:
    """`term_score(idf, tf, length_norm(length, avgdl))` as a PostgreSQL expression over SQL
    expressions (the constants folded as Python folds them; `avgdl` never 0 there)."""
    return f"{idf} * {tf} * {K1 + 1} / ({tf} + {K1} * ({1 - B} + {B} * {length} / {avgdl}))"
