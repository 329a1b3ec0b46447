"""`ampkit.bm25`, the one BM25: its Python form (scalars and numpy arrays) and its SQL form
give the same score, bit for bit, in PostgreSQL as in Python; and the SQLite leg's formula
is FTS5's own `bm25()`.

The stores' legs are compared with their reference statements and loops in
`tests/test_keyword_bm25.py`; here the formula itself is held to the engines."""

from __future__ import annotations

import sqlite3

import numpy as np
import psycopg
import pytest

from ampkit.bm25 import fts5_idf, length_norm, plus_one_idf, sql_plus_one_idf, sql_term_score, term_score

# (N, df, tf, document length, mean length): a rare term, a term in every document, a long
# document, a short one, a mean that is not a short binary fraction.
CASES = [
    (10, 3, 2, 7, 5.5),
    (1, 1, 1, 1, 1.0),
    (1000, 999, 4, 120, 33.25),
    (5, 5, 1, 3, 3.0),
    (7, 2, 11, 40, 12.142857142857142),
    (123457, 17, 3, 9, 8.6),
]


def python_score(n: int, df: int, tf: int, length: int, avgdl: float) -> float:
    return term_score(plus_one_idf(float(n), float(df)), tf, length_norm(length, avgdl))


@pytest.mark.postgres
def test_postgres_sql_bm25_equals_the_python_bm25_bit_for_bit(pg_url):
    # Typed as the store's statement has them: N and the mean float8, df a COUNT(*), tf a
    # cardinality, the length cell_search.len (integer).
    expression = sql_term_score(sql_plus_one_idf("%(n)s::float8", "%(df)s::int8"),
                                "%(tf)s::int4", "%(len)s::int4", "%(avgdl)s::float8")
    with psycopg.connect(pg_url) as conn:
        for n, df, tf, length, avgdl in CASES:
            (got,) = conn.execute(f"SELECT {expression}", {"n": n, "df": df, "tf": tf, "len": length,
                                                           "avgdl": avgdl}).fetchone()
            assert got == python_score(n, df, tf, length, avgdl), (n, df, tf, length, avgdl)


def test_the_array_form_equals_the_scalar_form_bit_for_bit():
    tf = np.array([case[2] for case in CASES], dtype=np.uint8)  # as the caches keep term counts
    lengths = np.array([case[3] for case in CASES], dtype=np.int64)
    for n, df, _, _, avgdl in CASES:
        idf = plus_one_idf(float(n), float(df))
        arrays = term_score(idf, tf, length_norm(lengths, avgdl))
        assert arrays.tolist() == [term_score(idf, int(t), length_norm(int(d), avgdl)) for t, d in zip(tf, lengths)]
    assert length_norm(np.zeros(3, dtype=np.int64), 0).tolist() == [length_norm(0, 0)] * 3 == [1.2] * 3


DOCS = ["quokka piano quokka", "piano lessons on tuesday", "a quokka at the zoo", "coffee and cake",
        "piano piano piano and a quokka"]


def test_the_sqlite_legs_formula_is_fts5s_bm25():
    """FTS5's `bm25()` over a plain table of fixed documents (its statistics: every row)
    against `fts5_idf` and `term_score`. FTS5 groups the same operations differently, so
    they agree to rounding, not to the bit."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(body)")
    conn.executemany("INSERT INTO t(rowid, body) VALUES (?, ?)", list(enumerate(DOCS, 1)))
    words = [doc.split() for doc in DOCS]
    avgdl = sum(map(len, words)) / len(words)
    for query in (["quokka"], ["piano"], ["quokka", "piano"], ["coffee", "zoo"]):
        got = dict(conn.execute("SELECT rowid, -bm25(t) FROM t WHERE t MATCH ?", (" OR ".join(query),)))
        expected = {}
        for rowid, doc in enumerate(words, 1):
            held = [term for term in query if term in doc]
            if held:
                expected[rowid] = sum(term_score(fts5_idf(len(words), sum(term in w for w in words)),
                                                 doc.count(term), length_norm(len(doc), avgdl)) for term in held)
        assert got == pytest.approx(expected, rel=1e-12, abs=0), query
