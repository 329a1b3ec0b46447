"""The learned last stage of search: one linear score over a few features of each candidate.

The first pass (fusion x boosts, `core/retrieval.py`) ranks by hand-set weights; this stage
re-weighs what the first pass already knows (each leg's rank and score, the boosts, the
first-pass relevance and position) and adds a few things it does not look at, from the
candidate's own text: its length, first-person words ("I", "my", "we"), a question mark,
names, a word that dates an event, a digit, exclamation marks. In LoCoMo, evidence turns are
longer first-person reports of events more often than the turns around them; the first pass
cannot see that (BM25 even favours short texts).

The weights are fitted by `bench/train_ranker.py` (pairwise logistic regression: each
relevant candidate against each other candidate of the same question) on LoCoMo's
conversations and on searches of templated fact memories (without those, weights fitted on
conversation alone ranked fact memories worse than the first pass), and written below; the
script also prints a leave-one-conversation-out estimate, the held-out figure to quote.

Every feature is computed from the candidate itself and from the other candidates of the
same search, which are all cells the caller may read (the access check runs first), so the
score never depends on a cell the caller cannot read.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Mapping, Optional, Sequence

import numpy as np

# Read from the candidate's own text (`text_features`), in this order.
TEXT_FEATURES = ("length", "first_person", "question", "names", "time_words", "number", "exclamation")
FEATURES = (
    "keyword_rank", "dense_rank", "keyword_share", "dense", "entity", "own_text", "speaker", "date",
    "first_pass", "position", *TEXT_FEATURES,
)

# Fitted by `python bench/train_ranker.py --data ../shared/data/locomo/locomo-dev.json`
# (all five dev conversations and 300 searches of templated facts; default embedder; 2026-12-03).
DEFAULT_WEIGHTS: dict[str, float] = {
    "keyword_rank": 0.423,
    "dense_rank": 1.241,
    "keyword_share": 1.871,
    "dense": 0.051,
    "entity": -0.224,
    "own_text": 2.792,
    "speaker": 1.375,
    "date": 1.4,
    "first_pass": 0.846,
    "position": 0.795,
    "length": 0.672,
    "first_person": 0.223,
    "question": -0.566,
    "names": 1.08,
    "time_words": 0.274,
    "number": 0.822,
    "exclamation": -0.442,
}

_WORDS = re.compile(r"\w+")
_FIRST_PERSON = frozenset({"i", "my", "me", "mine", "we", "our", "ours", "us"})  # "I'm" is "i" + "m"
_SPEAKER_HEAD = re.compile(r"^[^\s:]{1,40}:\s")
_NAMES = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]+")  # capitalised, not after a sentence's end
_TIME_WORDS = re.compile(
    r"\b(?:yesterday|today|recently|just|ago|last (?:week|weekend|month|year|night|monday|tuesday|wednesday|thursday"
    r"|friday|saturday|sunday)|this (?:week|weekend|month))\b", re.IGNORECASE)
_DIGIT = re.compile(r"\d")


@lru_cache(maxsize=20_000)  # a search reads the same candidates again and again (~25 us a text)
def text_features(text: str) -> tuple[float, ...]:
    """What the ranker reads from a text, as `TEXT_FEATURES`, each in [0, ~1.5]: its length
    (log of its words), its first-person words (up to 4), a question mark, capitalised words
    that do not open a sentence (names, places, titles; up to 4), a word that dates an event
    ("yesterday", "last week", "ago"...), a digit, its exclamation marks (up to 3). A leading
    "Name: " (a conversation turn's speaker) is not counted."""
    body = _SPEAKER_HEAD.sub("", text, count=1)
    words = _WORDS.findall(body.lower())
    first_person = sum(1 for w in words if w in _FIRST_PERSON)
    return (
        math.log1p(len(words)) / 4.0,
        min(first_person, 4) / 4.0,
        1.0 if "?" in body else 0.0,
        min(len(_NAMES.findall(body)), 4) / 4.0,
        1.0 if _TIME_WORDS.search(body) else 0.0,
        1.0 if _DIGIT.search(body) else 0.0,
        min(body.count("!"), 3) / 3.0,
    )


def _rank_feature(rank: Optional[float]) -> float:
    return 0.0 if rank is None else 10.0 / (10.0 + rank)


def candidate_features(parts: Sequence[Mapping[str, float]], texts: Sequence[str]) -> np.ndarray:
    """One row of `FEATURES` per candidate of one search, in the first pass's order (best
    first): `parts` are the first pass's explain parts (legs' scores and ranks, boosts,
    `relevance`)."""
    keyword_best = max((p.get("keyword", 0.0) for p in parts), default=0.0) or 1.0
    rows = []
    for position, (p, text) in enumerate(zip(parts, texts)):
        rows.append((
            _rank_feature(p.get("keyword_rank")),
            _rank_feature(p.get("dense_rank")),
            p.get("keyword", 0.0) / keyword_best,
            p.get("dense", 0.0),
            p.get("entity", 0.0),
            p.get("own_text", 0.0),
            p.get("speaker", 0.0),
            p.get("date", 0.0),
            p["relevance"],
            10.0 / (10.0 + position),
            *text_features(text),
        ))
    return np.array(rows, dtype=float).reshape(len(rows), len(FEATURES))


class LinearRanker:
    """score = sum of weight x feature; the features are `FEATURES`."""

    def __init__(self, weights: Mapping[str, float]):
        unknown = set(weights) - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown ranker features: {sorted(unknown)}")
        self.weights = dict(weights)

        self.vector = np.array([self.weights.get(name, 0.0) for name in FEATURES])

    def scores(self, features: np.ndarray) -> np.ndarray:
        """The score of each row of `candidate_features`."""
        return features @ self.vector
