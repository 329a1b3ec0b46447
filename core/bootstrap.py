"""The composition root: the one place that loads `Settings` and builds what they describe.

    settings = load_settings(port=9000)       # init args > AMPKIT_* env > .env > defaults
    service = build_service(settings)         # store (not opened), retriever, limits, policy

The server, the CLI and the in-process clients all come through here, so they run the same
store, limits, lifecycle policy and retriever. The core modules (`service`, `retrieval`,
`store`, `embeddings`) never read settings: they take what they need as arguments.

An embedder is built once per process and name and shared by every service that names it:
loading the default model takes a while, which an in-process client would otherwise pay
each time it is constructed.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any, Callable, Optional

from .config import Settings
from .consolidation import ConsolidationPolicy
from .embed_queue import EmbeddingWorker
from .embeddings import embedder_from_name
from .llm import ChatModel, ModelConfig
from .models import utcnow
from .retrieval import Embedder, RetrievalConfig, Retriever
from .scheduler import Scheduler
from .service import MemoryService
from .store import Store, store_from_url

_embedders: dict[str, Optional[Embedder]] = {}
_embedders_lock = threading.Lock()


def load_settings(*, env: bool = True, **overrides: Any) -> Settings:
    """Settings from `AMPKIT_*` variables and `.env` (with `env=False`: the defaults only),
    with `overrides` (None values ignored, so CLI flags left unset change nothing) on top."""
    given = {name: value for name, value in overrides.items() if value is not None}
    if env:
        return Settings(**given)
    defaults = {name: field.default for name, field in Settings.model_fields.items()}
    return Settings(_env_file=None, **{**defaults, **given})


def settings_for_store(url: str) -> Settings:
    """What an in-process client runs with: the store it was given, everything else from the
    `AMPKIT_*` environment (not from a `.env` in whatever directory the program runs in)."""
    return Settings(_env_file=None, store=url)


def cached_embedder(name: str) -> Optional[Embedder]:
    """The embedder `name` describes, built once per process."""
    with _embedders_lock:
        if name not in _embedders:
            _embedders[name] = embedder_from_name(name)
        return _embedders[name]


def retriever_from_settings(settings: Settings, *, background: bool = False) -> Retriever:
    """The retriever `settings` name; `background=True` lets it embed after the write when
    `settings.embed_in_background` says so (unset: when the embedder is slow). Batch tools
    (import, copy, reindex) embed as they go."""
    embedder = cached_embedder(settings.embedder)
    wanted = settings.embed_in_background
    if wanted is None:
        wanted = bool(getattr(embedder, "background", False))
    config = RetrievalConfig(own_text_weight=settings.retrieval_own_text_weight,
                             prf_docs=settings.retrieval_feedback_docs,
                             speaker_weight=settings.retrieval_speaker_weight,
                             date_weight=settings.retrieval_date_weight,
                             related_weight=settings.retrieval_related_weight,
                             date_session_weight=settings.retrieval_date_session_weight,
                             relevance_models=None if settings.retrieval_ranker else {})
    return Retriever(embedder=embedder, config=config, background=background and wanted)


def store_from_settings(settings: Settings) -> Store:
    """The store (built, not opened) at `settings.store_url()`, with the SQLite options and the
    approximate-search switch."""
    url = settings.store_url()
    embedded = url.startswith(("sqlite", "memory"))
    # One scheduler per store: its background loops, started by open(), stopped by close(),
    # listed in /health.
    options: dict[str, Any] = ({"synchronous": settings.sqlite_synchronous, "budgets": settings.cache_budgets()}
                               if embedded else {"keyword_cache_mb": settings.cache_pg_keyword_mb})
    options["scheduler"] = Scheduler()
    if not settings.approximate_search:
        options.update({"ann_threshold": None} if embedded else {"approximate": False})
    return store_from_url(url, **options)


def model_from_settings(settings: Settings) -> Optional[ChatModel]:
    """The consolidation model, or None when `llm_url` or `llm_model` is unset."""
    if not settings.llm_url or not settings.llm_model:
        return None
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
    return ChatModel(ModelConfig(
        base_url=settings.llm_url, model=settings.llm_model, api_key=key,
        timeout_seconds=settings.llm_timeout_seconds, json_mode=settings.llm_json_mode,
    ))


def connect_embedding(store: Store, retriever: Retriever) -> None:
    """Tell a store (before `open()`) how its cells get their vectors: cells written without
    one wait in its queue when the retriever embeds in the background, and a store that
    embeds new rows itself (SQLite: with their keyword windows, after the commit, one call a
    pass) does so with the retriever's `vectors_for`."""
    store.embed_queue = retriever.background
    if store.embeds_new_rows and retriever.embedder is not None:
        store.embed_new = retriever.vectors_for


def build_service(settings: Settings, *, clock: Callable[[], datetime] = utcnow) -> MemoryService:
    """The service a Settings describes (its store not opened)."""
    store = store_from_settings(settings)
    retriever = retriever_from_settings(settings, background=True)
    connect_embedding(store, retriever)
    return MemoryService(
        store=store,
        policy=settings.lifecycle_policy(),
        limits=settings.limits(),
        retriever=retriever,
        clock=clock,
        allow_clock_override=settings.allow_clock_override,
        search_embeds_pending=settings.search_embeds_pending,
        dedup_threshold=settings.dedup_threshold,
        dedup_default=settings.dedup_default,
        model=model_from_settings(settings),
        consolidation=ConsolidationPolicy(
            confidence_floor=settings.consolidation_confidence_floor,
            interval_seconds=settings.consolidation_interval_seconds,
            quiet_seconds=settings.consolidation_quiet_seconds,
        ),
    )


def start_background(service: MemoryService, embedding: EmbeddingWorker) -> None:
    """Open the service's store, which starts its loops on its scheduler, and the embedding
    worker (a loop of the same scheduler, when the retriever embeds in the background). The
    server's lifespan and the in-process clients start and stop through here."""
    service.store.open()
    embedding.start()


def stop_background(service: MemoryService, embedding: EmbeddingWorker) -> None:
    """The embedding worker first (its batch in hand), then the store (its loops, a last
    windows pass, the caches saved), then whatever else is left on the store's scheduler."""
    embedding.stop()
    service.store.close()
    scheduler = getattr(service.store, "scheduler", None)
    if scheduler is not None:
        scheduler.stop_all()


__all__ = [
    "build_service", "cached_embedder", "connect_embedding", "load_settings", "model_from_settings", "retriever_from_settings", "settings_for_store",
    "start_background", "stop_background", "store_from_settings",
]
