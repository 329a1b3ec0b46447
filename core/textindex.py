"""Text as the keyword index sees it: words in any script, CJK as stems and bigrams.

SQLite's `unicode61` tokenizer splits on spaces and punctuation, so a run of Korean, Japanese
or Chinese characters becomes one long token ("서울에서" with its particle attached) and a
query for "서울" would never match it. Both the indexed text and the query are therefore
extended with CJK terms (`cjk_terms`):

- Korean words (eojeol) lose their particle or verb ending, a small rule-based stemmer
  (`korean_stem`): "강아지가" also indexes "강아지", "공부했어요" also "공부". Then the stem's
  character bigrams, so a compound still matches its parts ("여름휴가" finds "휴가"). The
  particles' and endings' own bigrams ("에서", "어요"), which every sentence shares, are
  left out: they matched unrelated memories (bench/multilingual.py measures both).
- Japanese and Chinese runs: overlapping character bigrams, the usual trick of CJK search
  engines ("東京で" also indexes "東京 京で").

Latin text is left untouched.

The store registers `index_text` as an SQL function so its FTS triggers can call it.
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from typing import Optional

# Hangul (syllables, jamo, compatibility jamo), kana, CJK ideographs (+ extension A, compat).
# One character class, also understood by SQLite's GLOB and PostgreSQL's `~` (the stores
# find CJK text with it: Store.queue_stale_embeddings).
CJK_CLASS = "[\u1100-\u11ff\u3040-\u309f\u30a0-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]"
_CJK_RUN = re.compile(CJK_CLASS + "+")
_WORD = re.compile(r"\w+", re.UNICODE)

_SPACE = re.compile(r"\s+")
_TRAILING = re.compile(r"[\s.!?;,…]+$")


def normalise_text(text: str) -> str:
    """A text as dedup compares it: Unicode NFKC, case-folded, whitespace collapsed,
    trailing punctuation dropped."""
    # A create normalises each text several times (dedup lock, duplicate check, digest):
    # short texts, the common case, are remembered for a while.
    return _normalise_short(text) if len(text) <= 1024 else _normalise(text)


def _normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    return _TRAILING.sub("", _SPACE.sub(" ", text).strip())


_normalise_short = functools.lru_cache(maxsize=4096)(_normalise)


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


_HANGUL_RUN = re.compile("[\uac00-\ud7af]+")

# Particles (조사) and endings (어미), longest first within each group, matched at the end of
# a word. A stem keeps at least one syllable; `korean_stem` removes one suffix (the longest),
# which covers "noun + particle" and "noun + 하다 + ending" ("공부했어요" -> "공부"), the forms
# a memory and a question about it most often differ by. A word is indexed as itself too,
# so a noun that happens to end like a particle ("휴가") still matches exactly.
_KO_SUFFIXES = sorted(set(
    # particles, with the combinations memories use most
    """이 가 은 는 을 를 의 에 께 도 만 와 과 로 랑 나 야 아
    으로 에서 에게 한테 하고 이랑 까지 부터 보다 처럼 마다 이나 이든 밖에 조차 께서 이라 이고 이며 이면 이랑
    에는 에도 에서는 에서도 으로는 으로도 로는 로도 에게는 한테는 까지는 부터는 보다는 처럼은 이라도 라도 이라고 라고
    이에요 예요 이었어요 였어요 이야 이었어 였어 이다 입니다 이었다 였다 이지 이죠 인데 이라서 라서 이니까
    """.split()
    # endings after a verb or adjective stem, and 하다 / 되다 forms after a noun
    + """어요 아요 해요 했어요 었어요 았어요 였어요 했어 었어 았어 해 어 아 했다 었다 았다 다 요
    습니다 합니다 됩니다 했습니다 었습니다 았습니다 어서 아서 해서 고 서 지 죠 지요 네요 군요 거든요 대요 래요
    는데 은데 던데 지만 면 으면 니까 으니까 더라 었더라 았더라 했더라 냐 니 나요 까 을까 ㄹ까
    하고 하는 하던 한 할 하면 하지 하다 하게 하기 하셨어요 하셨지 하셨어 하신 했지 했는데 했던 했고
    되고 되는 된 될 됐어요 됐어 되었어요 돼요 돼 되어 시켜요 시켰어요 시키는
    셨어요 셨지 셨어 세요 시고 으셨어요 으세요 고있어요
    """.split()
), key=lambda s: (-len(s), s))

# Question words, pronouns and light verbs: in a query they only pull in every memory.
KOREAN_STOP_WORDS = frozenset(
    """뭐 뭘 뭐야 뭐지 뭐였지 무엇 무슨 어디 어디야 어디였지 언제 언제야 몇 누구 누가 어떻게 어때 어떤 왜 얼마 얼마나
    나 내 내가 나는 저 제 저는 제가 우리 그 이 것 거 게 수 좀 더 또 잘 안 못 있 있어 있어요 없 하 해 했 되 돼
    요즘 그냥 정말 진짜 너무 혹시""".split()
)


def korean_stem(word: str) -> str:
    """The word less its longest particle or ending (at least one syllable is kept)."""
    for suffix in _KO_SUFFIXES:
        if len(word) > len(suffix) and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def _bigrams(run: str) -> list[str]:
    return [run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)]


def cjk_terms(text: str) -> list[str]:
    """The extra index (and query) terms of a text's CJK runs: a Korean word's stem and the
    stem's bigrams; a Japanese or Chinese run's bigrams. Korean stop words are left out."""
    out: list[str] = []
    for run in _CJK_RUN.findall(text):
        if not _HANGUL_RUN.fullmatch(run):
            out.extend(_bigrams(run))
            continue
        stem = korean_stem(run)
        if stem in KOREAN_STOP_WORDS or run in KOREAN_STOP_WORDS:
            continue
        out.append(stem)
        if len(stem) > 2:
            out.extend(_bigrams(stem))
    return out


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


def has_hangul(text: str) -> bool:
    return _HANGUL_RUN.search(text) is not None


def index_text(text: Optional[str]) -> str:
    """What the keyword index stores for a cell's text: the text, then its CJK terms."""
    if not text:
        return ""
    extra = cjk_terms(text)
    return text if not extra else text + "\n" + " ".join(extra)


def query_terms(text: str, max_terms: int = 64) -> list[str]:
    """Distinct lower-cased search terms: words minus stop words, plus CJK terms.

    When a query is nothing but stop words ("who are you"), they are kept: an empty query
    would find nothing at all.
    """
    words = [w.lower() for w in _WORD.findall(text)]
    # A Korean word stays a term of its own (an exact form matches the indexed text itself);
    # other CJK runs only count through their bigrams.
    content = [w for w in words if w not in STOP_WORDS and w not in KOREAN_STOP_WORDS
               and (not _CJK_RUN.fullmatch(w) or _HANGUL_RUN.fullmatch(w))]
    terms = content + cjk_terms(text)
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
