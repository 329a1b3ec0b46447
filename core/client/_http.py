"""HTTP transports: send a `Call` over one pooled httpx client, with timeouts and retries.

Retries (tenacity, exponential backoff with jitter) cover connection failures and 503 for
calls that are safe to resend (GET, search, DELETE, PATCH with If-Match, lifecycle run);
a 429 is retried for any call, after the server's Retry-After, since the server refused it
before doing anything. No httpx exception leaves this module: connection failures become
`TransportError`, error answers become the `APIError` subclass of their code.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import httpx
from tenacity import AsyncRetrying, Retrying, retry_if_exception, stop_after_attempt, wait_exponential, wait_random

from ..errors import APIError, RateLimited, TransportError, Unavailable, error_from_envelope
from ..models import AMP_VERSION
from ..operations import query_pairs
from ..tls import tls_context
from ._calls import Call

DEFAULT_TIMEOUT = httpx.Timeout(10.0, connect=5.0)
"""Per request: 10 s to read or write, 5 s to connect. `timeout=` on the client overrides it."""
DEFAULT_RETRIES = 2
"""Extra attempts after the first, for calls that are safe to resend."""
MAX_RETRY_AFTER = 30.0
"""A Retry-After longer than this is not waited for: the RateLimited error is raised."""

TimeoutTypes = Union[None, float, httpx.Timeout]
USER_AGENT = f"ampkit-python/{AMP_VERSION}"


def _headers(agent_id: Optional[str], api_key: Optional[str]) -> dict[str, str]:
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if agent_id:
        headers["X-AMP-Agent-ID"] = agent_id
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def build_request(http: Union[httpx.Client, httpx.AsyncClient], call: Call) -> httpx.Request:
    has_body = call.method in ("POST", "PATCH", "PUT")
    extra: dict[str, Any] = {} if call.timeout is None else {"timeout": httpx.Timeout(call.timeout, connect=5.0)}
    return http.build_request(call.method, call.path.lstrip("/"), params=tuple(query_pairs(call.query)),
                              json=call.body if has_body else None, headers=call.headers, **extra)


def decode_response(call: Call, response: httpx.Response) -> Any:
    """The call's result, or the exception the server answered with."""
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            body = {"text": response.text[:500]}
        exc = error_from_envelope(response.status_code, body)
        retry_after = response.headers.get("Retry-After")
        if retry_after and "retry_after" not in exc.details:
            exc.details["retry_after"] = retry_after
        raise exc
    if response.status_code == 204 or not response.content:
        return call.decode(None)
    try:
        return call.decode(response.json())
    except (ValueError, KeyError, TypeError) as exc:  # includes pydantic's ValidationError
        raise APIError(f"the server's answer to {call.method} {call.path} does not match the protocol: {exc}",
                       code="INVALID_RESPONSE") from exc


def _retry_after(exc: BaseException) -> Optional[float]:
    try:
        return float(exc.details.get("retry_after"))  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return None


class _RetryPolicy:
    """When to resend and how long to wait first; shared by the sync and async transports."""

    def __init__(self, retries: int):
        self.retries = max(0, int(retries))
        # 0.1 s doubling up to 2 s, plus up to 0.1 s of jitter; spelled with the wait strategies
        # every tenacity >= 8.2 has (wait_exponential_jitter's keywords changed between releases).
        self._backoff = wait_exponential(multiplier=0.1, max=2.0) + wait_random(0, 0.1)

    def should_retry(self, call: Call, exc: BaseException) -> bool:
        if isinstance(exc, RateLimited):
            delay = _retry_after(exc)
            return delay is not None and delay <= MAX_RETRY_AFTER
        return call.idempotent and isinstance(exc, (TransportError, Unavailable))

    def wait(self, state) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, RateLimited):
            return _retry_after(exc) or 0.0
        return self._backoff(state)

    def options(self, call: Call) -> dict[str, Any]:
        return {
            "stop": stop_after_attempt(self.retries + 1),
            "wait": self.wait,
            "retry": retry_if_exception(lambda exc: self.should_retry(call, exc)),
            "reraise": True,
        }


def _transport_error(call: Call, exc: httpx.HTTPError) -> TransportError:
    return TransportError(f"{call.method} {call.path}: {type(exc).__name__}: {exc}")


def _base_url(url: str) -> str:
    """`http://host:8765` and `http://host:8765/amp/v1` both mean the /amp/v1 API."""
    url = url.rstrip("/")
    if httpx.URL(url).path in ("", "/"):
        url += "/amp/v1"
    return url + "/"


class _HTTPTransportBase:
    """Holds the pooled httpx client (one per ampkit client) with the base URL and identity headers."""

    def __init__(self, url: str, http: Any, agent_id: Optional[str], api_key: Optional[str], retries: int):
        self.url = _base_url(url)
        self.policy = _RetryPolicy(retries)
        self._http = http
        self._http.base_url = self.url
        self._http.headers.update(_headers(agent_id, api_key))


class HTTPTransport(_HTTPTransportBase):
    def __init__(self, url: str, *, agent_id: Optional[str], api_key: Optional[str] = None,
                 timeout: TimeoutTypes = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES,
                 http_client: Optional[httpx.Client] = None):
        super().__init__(url, http_client or httpx.Client(timeout=timeout, verify=tls_context()), agent_id, api_key, retries)

    def _send_once(self, call: Call) -> Any:
        try:
            response = self._http.send(build_request(self._http, call))
        except httpx.HTTPError as exc:
            raise _transport_error(call, exc) from exc
        return decode_response(call, response)

    def open(self) -> None:
        """Nothing to do: httpx connects on the first request."""

    def send(self, call: Call) -> Any:
        for attempt in Retrying(**self.policy.options(call)):
            with attempt:
                return self._send_once(call)

    def close(self) -> None:
        self._http.close()


class AsyncHTTPTransport(_HTTPTransportBase):
    def __init__(self, url: str, *, agent_id: Optional[str], api_key: Optional[str] = None,
                 timeout: TimeoutTypes = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES,
                 http_client: Optional[httpx.AsyncClient] = None):
        super().__init__(url, http_client or httpx.AsyncClient(timeout=timeout, verify=tls_context()), agent_id, api_key, retries)

    async def _send_once(self, call: Call) -> Any:
        try:
            response = await self._http.send(build_request(self._http, call))
        except httpx.HTTPError as exc:
            raise _transport_error(call, exc) from exc
        return decode_response(call, response)

    async def open(self) -> None:
        """Nothing to do: httpx connects on the first request."""

    async def send(self, call: Call) -> Any:
        async for attempt in AsyncRetrying(**self.policy.options(call)):
            with attempt:
                return await self._send_once(call)

    async def close(self) -> None:
        await self._http.aclose()


__all__ = ["AsyncHTTPTransport", "DEFAULT_RETRIES", "DEFAULT_TIMEOUT", "HTTPTransport"]
