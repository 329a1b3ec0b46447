"""Words related to a query's words, from a static embedding model's own vocabulary.

A LoCoMo multi-hop question rarely uses the words of its evidence: "What pets does Nate
have?" is answered by "this is Max!" beside "my dog"; "What activities does Melanie partake
in?" by turns about pottery and camping. The default model (model2vec, static) keeps one
vector per vocabulary token, so the tokens nearest a query word ("pets" -> dogs, cats,
animals; "instruments" -> violins, guitars, flute) are its related words, no language model
and no data involved. They become a second keyword query (the `related` leg,
`core/retrieval.py`). Only the model's vocabulary is read: nothing here depends on any cell.

The nearest words of every vocabulary word are computed once, offline, and shipped beside
the default model (`related_words.npz`; `python -m ampkit.related_words <model dir>`
rebuilds it): a lookup then costs nothing at query time, where it would otherwise be a
product over the whole vocabulary per word. A model without the table computes a word's neighbours
on first use and keeps them.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .textindex import STOP_WORDS

TABLE_FILE = "related_words.npz"
TABLE_WIDTH = 10  # neighbours kept per word in the shipped table


class RelatedWords:
    """`related(word)`: up to `per_word` vocabulary words whose vectors are nearest the
    word's (cosine >= `min_similarity`), best first. A word that is not one whole
    vocabulary token (a name the tokenizer splits, a typo) has none."""

    def __init__(self, vocabulary: Sequence[str], vectors: np.ndarray, per_word: int = 10,
                 min_similarity: float = 0.6, max_terms: int = 24, table: Optional[tuple[np.ndarray, np.ndarray]] = None):
        # Whole alphabetic words only: subword pieces ("##bies") and stop words make poor queries.
        keep = [i for i, tok in enumerate(vocabulary) if tok.isalpha() and len(tok) > 2 and tok not in STOP_WORDS]
        self.words = [vocabulary[i] for i in keep]
        matrix = np.asarray(vectors, dtype=np.float32)[keep]
        self.matrix = matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
        self.index = {w: i for i, w in enumerate(self.words)}
        self.per_word = per_word
        self.min_similarity = min_similarity
        self.max_terms = max_terms  # bounds the leg's cost: each term is read from every admitted window
        usable = table is not None and table[0].shape[0] == len(self.words) and table[0].shape[1] >= per_word
        self.table = table if usable else None
        self.related = lru_cache(maxsize=8192)(self._related)

    def neighbours(self, rows: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        """The `width` nearest words of each row's word (indices, cosines), best first."""
        sims = self.matrix[rows] @ self.matrix.T
        sims[np.arange(len(rows)), rows] = -1.0
        top = np.argpartition(-sims, width, axis=1)[:, :width]
        top_sims = np.take_along_axis(sims, top, axis=1)
        order = np.argsort(-top_sims, axis=1, kind="stable")
        return np.take_along_axis(top, order, axis=1), np.take_along_axis(top_sims, order, axis=1)

    def _related(self, word: str) -> tuple[str, ...]:
        row = self.index.get(word)
        if row is None:
            return ()
        if self.table is not None:
            idx, sims = self.table[0][row, : self.per_word], self.table[1][row, : self.per_word].astype(np.float32)
        else:
            idx, sims = (a[0] for a in self.neighbours(np.array([row]), self.per_word))
        return tuple(self.words[int(i)] for i, s in zip(idx, sims) if s >= self.min_similarity)

    def expand(self, words: Sequence[str]) -> list[str]:
        """The related words of every word, in order, each once, none of `words` itself, at
        most `max_terms`."""
        asked = set(words)
        out: dict[str, None] = {}
        for word in words:
            for rel in self.related(word):
                if rel not in asked:
                    out[rel] = None
        return list(out)[: self.max_terms]

    def build_table(self, width: int = TABLE_WIDTH, chunk: int = 1024) -> tuple[np.ndarray, np.ndarray]:
        parts = [self.neighbours(np.arange(i, min(i + chunk, len(self.words))), width)
                 for i in range(0, len(self.words), chunk)]
        return (np.concatenate([p[0] for p in parts]).astype(np.int32),
                np.concatenate([p[1] for p in parts]).astype(np.float16))


def related_words_of_static_model(model, model_dir: Optional[Path] = None) -> RelatedWords:
    """From a model2vec `StaticModel`: its tokenizer's vocabulary and its token vectors, with
    the precomputed table from `model_dir` when one is there."""
    vocab = model.tokenizer.get_vocab()
    tokens = [""] * len(vocab)
    for tok, i in vocab.items():
        if i < len(tokens):
            tokens[i] = tok
    table = None
    if model_dir is not None and (model_dir / TABLE_FILE).is_file():
        with np.load(model_dir / TABLE_FILE) as saved:
            table = (saved["indices"], saved["similarities"])
    return RelatedWords(tokens, np.asarray(model.embedding)[: len(tokens)], table=table)


def main(argv: list[str]) -> int:
    """Write the related-words table of the model2vec model in argv[0]."""
    from model2vec import StaticModel

    model_dir = Path(argv[0])
    related = related_words_of_static_model(StaticModel.from_pretrained(str(model_dir)))
    indices, sims = related.build_table()
    np.savez_compressed(model_dir / TABLE_FILE, indices=indices, similarities=sims)
    print(f"{model_dir / TABLE_FILE}: {indices.shape[0]} words x {indices.shape[1]} neighbours")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
