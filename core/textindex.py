"""Text as the keyword index sees it: words in any script, CJK as overlapping bigrams.

SQLite's `unicode61` tokenizer splits on spaces and punctuation, so a run of Korean, Japanese
or Chinese characters becomes one long token ("서울에서" with its particle attached) and a
query for "서울" would never match it. Both the indexed text and the query are therefore
extended with the character bigrams of every CJK run, the usual trick of CJK search engines:
"서울에서" also indexes "서울 울에 에서". Latin text is left untouched.

The store registers `index_text` as an SQL function so its FTS triggers can call it.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from typing import Optional

# Hangul (syllables, jamo, compatibility jamo), kana, CJK ideographs (+ extension A, compat).
_CJK_RUN = re.compile(
    "[\u1100-\u11ff\u3040-\u309f\u30a0-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+"
)
_WORD = re.compile(r"\w+", re.UNICODE)

_SPACE = re.compile(r"\s+")
_TRAILING = re.compile(r"[\s.!?;,…]+$")


def normalise_text(text: str) -> str:
    """A text as dedup compares it: Unicode NFKC, case-folded, whitespace collapsed,
    trailing punctuation dropped."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return _TRAILING.sub("", _SPACE.sub(" ", text).strip())


def text_key(text: str) -> str:
    """A short digest of `normalise_text(text)`: equal for texts dedup calls the same, so an
    index on it finds exact duplicates with one lookup (collisions only widen the candidates,
    which the caller compares in full)."""
    return hashlib.blake2b(normalise_text(text).encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


# Function words that only add noise to an OR query (BM25 gives them little weight, but they
# still pull in long, unrelated texts). Kept short on purpose: negations and pronouns that
# carry meaning in a memory ("not", "never", names) stay.
STOP_WORDS = frozenset(
    """a about after again all also am an and any are as at be because been before being
    between both but by can could did do does doing down during each few for from further
    had has have having he her here hers herself him himself his how i if in into is it its
    itself just me more most my myself of off on once only or other our ours ourselves out
    over own same she should so some such than that the their theirs them themselves then
    there these they this those through to too under until up very was we were what when
    where which while who whom why will with would you your yours yourself yourselves
    s t d ll m re ve""".split()
)


def cjk_bigrams(text: str) -> list[str]:
    """Overlapping character bigrams of each CJK run (a one-character run is kept as is)."""
    out: list[str] = []
    for run in _CJK_RUN.findall(text):
        if len(run) == 1:
            out.append(run)
        else:
            out.extend(run[i : i + 2] for i in range(len(run) - 1))
    return out


def has_cjk(text: str) -> bool:
    return _CJK_RUN.search(text) is not None


def index_text(text: Optional[str]) -> str:
    """What the keyword index stores for a cell's text."""
    if not text:
        return ""
    bigrams = cjk_bigrams(text)
    return text if not bigrams else text + "\n" + " ".join(bigrams)


def query_terms(text: str, max_terms: int = 64) -> list[str]:
    """Distinct lower-cased search terms: words minus stop words, plus CJK bigrams.

    When a query is nothing but stop words ("who are you"), they are kept: an empty query
    would find nothing at all.
    """
    words = [w.lower() for w in _WORD.findall(text)]
    content = [w for w in words if w not in STOP_WORDS and not _CJK_RUN.fullmatch(w)]
    terms = content + cjk_bigrams(text)
    if not terms:
        terms = words
    return list(dict.fromkeys(terms))[:max_terms]


def fts_match(text: str) -> Optional[str]:
    """Free text -> an FTS5 OR query of quoted terms (quoting means no operator injection)."""
    terms = query_terms(text)
    if not terms:
        return None
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


def owner_token(owner_id: str) -> str:
    """A single index token standing for an owner, so an owner's keyword search is an FTS
    AND over its own cells instead of a scan of every owner's matches."""
    return "o" + hashlib.blake2b(owner_id.encode("utf-8"), digest_size=8).hexdigest()
