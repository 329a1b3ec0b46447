"""The composition root: one settings model, loaded in one place; the embedder built once per
process; in-process clients take the environment, not a `.env` in the working directory."""

from __future__ import annotations

import ampkit
import pytest
from ampkit.bootstrap import build_service, cached_embedder, load_settings, settings_for_store
from ampkit.errors import PayloadTooLarge


def test_in_process_clients_share_one_embedder(tmp_path):
    with ampkit.connect(f"sqlite:///{tmp_path}/a.db", agent_id="a") as a, \
            ampkit.connect(f"sqlite:///{tmp_path}/b.db", agent_id="b") as b:
        first = a._transport.service.retriever.embedder
        second = b._transport.service.retriever.embedder
        assert first is not None and first is second is cached_embedder("default")
        # ... and it is the one the server's service would use.
        assert build_service(load_settings(env=False, store="memory://")).retriever.embedder is first


def test_in_process_client_ignores_dotenv_but_reads_the_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("AMPKIT_MAX_CELL_SIZE_BYTES=10\n")
    assert load_settings().max_cell_size_bytes == 10  # the server and the CLI read .env
    assert settings_for_store("memory://").max_cell_size_bytes == 65536
    with ampkit.connect("memory://", agent_id="a") as memory:
        memory.remember("longer than ten bytes", owner_id="u")
    monkeypatch.setenv("AMPKIT_MAX_CELL_SIZE_BYTES", "10")
    with ampkit.connect("memory://", agent_id="a") as memory, pytest.raises(PayloadTooLarge):
        memory.remember("longer than ten bytes", owner_id="u")


def test_load_settings_ignores_unset_overrides(monkeypatch):
    monkeypatch.setenv("AMPKIT_PORT", "9123")
    assert load_settings(port=None).port == 9123
    assert load_settings(port=9000).port == 9000
    assert load_settings(env=False).port == 8765


def test_client_defaults_come_from_the_same_model(monkeypatch, tmp_path):
    monkeypatch.setenv("AMPKIT_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("AMPKIT_URL", "memory://")
    monkeypatch.setenv("AMPKIT_AGENT_ID", "env-agent")
    monkeypatch.setenv("AMPKIT_API_KEY", "ampk_x_y")
    settings = load_settings(env=True)
    assert (settings.url, settings.agent_id, settings.api_key.get_secret_value()) == ("memory://", "env-agent", "ampk_x_y")
    client = ampkit.connect()
    assert (client.url, client.agent_id, client.config.api_key) == ("memory://", "env-agent", "ampk_x_y")
    client.close()


def test_cache_budgets_come_from_settings_to_the_stores_components(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPKIT_CACHE_POSTINGS_MB", "3")
    settings = load_settings(env=True, store=f"sqlite:///{tmp_path}/b.db", cache_admitted_rows=1234,
                             cache_term_scores_mb=5, cache_term_positions_mb=6, cache_term_matches_mb=7)
    store = build_service(settings).store
    assert store.keyword.postings_bytes == 3 * 2**20
    assert store.access.admitted_rows == 1234
    arrays = store.access.set_arrays
    assert (arrays.contributions._held.max_bytes, arrays.postings._held.max_bytes, arrays.matches._held.max_bytes) == \
        (5 * 2**20, 6 * 2**20, 7 * 2**20)
    assert store.scheduler is not None and store.scheduler.states() == []  # nothing runs before open()


def test_the_postgres_keyword_budget_comes_from_settings_unless_the_url_names_one():
    pytest.importorskip("psycopg")
    store = build_service(load_settings(env=False, store="postgresql://u@localhost/db", cache_pg_keyword_mb=7)).store
    assert store.keyword_cache_mb == 7 and store.wide_keywords.term_bytes == 7 * 2**20  # (built, not opened)
    assert store.wide_keywords.scheduler is store.scheduler
    url = "postgresql://u@localhost/db?keyword_cache_mb=9"
    assert build_service(load_settings(env=False, store=url, cache_pg_keyword_mb=7)).store.keyword_cache_mb == 9
