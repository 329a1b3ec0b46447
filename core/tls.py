"""The process's one TLS context for outgoing HTTPS: ampkit's clients, the LLM client of
consolidation and the OpenAI-compatible embedder all verify with it."""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context (httpx's default verification) shared by every HTTP client of the
    process: httpx otherwise builds one per client, reading the whole CA bundle, a CPU cost
    per client even for plain-HTTP URLs. Read once: SSL_CERT_FILE / SSL_CERT_DIR set
    later are not seen; pass your own `http_client` for another trust store."""
    return httpx.create_ssl_context()
