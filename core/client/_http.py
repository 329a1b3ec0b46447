"""HTTP transports: send a `Call` over one pooled httpx client, with timeouts and retries.

Retries (exponential backoff with jitter) cover connection failures and 503 for calls that
are safe to resend (GET, search, DELETE, PATCH with If-Match, lifecycle run); a 429 is
retried for any call, after the server's Retry-After, since the server refused it before
doing anything. No httpx exception leaves this module: connection failures become
`TransportError`, error answers become the `APIError` subclass of their code.

Per request the client's own CPU is mostly httpx's; what is ours is kept small (measured by
bench/client_cpu.py): a call's URL is parsed once per path, not once or twice per
request, and a call that succeeds at once passes no retry machinery (a plain loop resends).
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any, Iterable, Iterator, Optional, Union

import httpx

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

STREAM_TIMEOUT = httpx.Timeout(300.0, connect=5.0)
"""The NDJSON export and import: a large store's stream or a whole import's transaction."""
EXPORT_PATH, IMPORT_PATH, NDJSON = "admin/export", "admin/import", "application/x-ndjson"

TimeoutTypes = Union[None, float, httpx.Timeout]
USER_AGENT = f"ampkit-python/{AMP_VERSION}"


def _headers(agent_id: Optional[str], api_key: Optional[str]) -> dict[str, str]:
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if agent_id:
        headers["X-AMP-Agent-ID"] = agent_id
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def build_request(http: Union[httpx.Client, httpx.AsyncClient], call: Call, url: httpx.URL) -> httpx.Request:
    """The request for `call` to `url` (its absolute URL). Query parameters only when it has
    some: httpx parses the URL again for any `params`, even empty."""
    has_body = call.method in ("POST", "PATCH", "PUT")
    extra: dict[str, Any] = {} if call.timeout is None else {"timeout": httpx.Timeout(call.timeout, connect=5.0)}
    params = query_pairs(call.query)
    return http.build_request(call.method, url, params=tuple(params) if params else None,
                              json=call.body if has_body else None, headers=call.headers, **extra)


def raise_for_error(response: httpx.Response) -> None:
    """The exception an error answer carries (its envelope's class), if it is one."""
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


def decode_response(call: Call, response: httpx.Response) -> Any:
    """The call's result, or the exception the server answered with."""
    raise_for_error(response)
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

    def should_retry(self, call: Call, exc: BaseException) -> bool:
        if isinstance(exc, RateLimited):
            delay = _retry_after(exc)
            return delay is not None and delay <= MAX_RETRY_AFTER
        return call.idempotent and isinstance(exc, (TransportError, Unavailable))

    def delay(self, call: Call, exc: BaseException, attempt: int) -> Optional[float]:
        """Seconds to wait before sending `call` again after its `attempt`-th try (from 1)
        failed with `exc`; None: give up and raise it. The server's Retry-After for a 429,
        otherwise 0.1 s doubling up to 2 s, plus up to 0.1 s of jitter."""
        if attempt > self.retries or not self.should_retry(call, exc):
            return None
        if isinstance(exc, RateLimited):
            return _retry_after(exc) or 0.0
        return min(0.1 * 2 ** (attempt - 1), 2.0) + random.uniform(0, 0.1)


def _transport_error(call: Call, url: httpx.URL, exc: httpx.HTTPError) -> TransportError:
    # The whole URL: "connection refused" alone does not say which host or port was tried.
    return TransportError(f"{call.method} {url}: {type(exc).__name__}: {exc}")


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
        self._urls: dict[str, httpx.URL] = {}

    def _request(self, call: Call) -> httpx.Request:
        return build_request(self._http, call, self._url(call.path))

    def _url(self, path: str) -> httpx.URL:
        """The absolute URL of `path` under the base URL (joined as httpx joins a relative
        one), parsed once per path: a relative URL string is parsed anew by every request."""
        url = self._urls.get(path)
        if url is None:
            if len(self._urls) >= 1024:  # paths with cell ids come and go
                self._urls.clear()
            base = self._http.base_url
            url = self._urls[path] = base.copy_with(raw_path=base.raw_path + path.lstrip("/").encode("ascii"))
        return url


class HTTPTransport(_HTTPTransportBase):
    def __init__(self, url: str, *, agent_id: Optional[str], api_key: Optional[str] = None,
                 timeout: TimeoutTypes = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES,
                 http_client: Optional[httpx.Client] = None):
        super().__init__(url, http_client or httpx.Client(timeout=timeout, verify=tls_context()), agent_id, api_key, retries)

    def _send_once(self, call: Call) -> Any:
        try:
            response = self._http.send(self._request(call))
        except httpx.HTTPError as exc:
            raise _transport_error(call, self._url(call.path), exc) from exc
        return decode_response(call, response)

    def open(self) -> None:
        """Nothing to do: httpx connects on the first request."""

    def send(self, call: Call) -> Any:
        attempt = 1
        while True:
            try:
                return self._send_once(call)
            except (APIError, TransportError) as exc:
                delay = self.policy.delay(call, exc, attempt)
                if delay is None:
                    raise
            time.sleep(delay)
            attempt += 1

    def close(self) -> None:
        self._http.close()

    # The NDJSON export and import are byte streams, not operations of the table (their
    # routes are declared in server/app.py), so they bypass `Call`.
    def export_lines(self, owner_id: Optional[str], cursor: Optional[str]) -> Iterator[str]:
        params = {k: v for k, v in (("owner_id", owner_id), ("cursor", cursor)) if v is not None}
        url = self._url(EXPORT_PATH)
        try:
            with self._http.stream("GET", url, params=params, timeout=STREAM_TIMEOUT) as response:
                if response.status_code >= 400:
                    response.read()
                    raise_for_error(response)
                for line in response.iter_lines():
                    yield line + "\n"
        except httpx.HTTPError as exc:
            raise TransportError(f"GET {url}: {type(exc).__name__}: {exc}") from exc

    def import_lines(self, chunks: Iterable[bytes]) -> dict[str, Any]:
        url = self._url(IMPORT_PATH)
        try:
            response = self._http.post(url, content=chunks, timeout=STREAM_TIMEOUT,
                                       headers={"Content-Type": NDJSON})
        except httpx.HTTPError as exc:
            raise TransportError(f"POST {url}: {type(exc).__name__}: {exc}") from exc
        raise_for_error(response)
        return dict(response.json())


class AsyncHTTPTransport(_HTTPTransportBase):
    def __init__(self, url: str, *, agent_id: Optional[str], api_key: Optional[str] = None,
                 timeout: TimeoutTypes = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES,
                 http_client: Optional[httpx.AsyncClient] = None):
        super().__init__(url, http_client or httpx.AsyncClient(timeout=timeout, verify=tls_context()), agent_id, api_key, retries)

    async def _send_once(self, call: Call) -> Any:
        try:
            response = await self._http.send(self._request(call))
        except httpx.HTTPError as exc:
            raise _transport_error(call, self._url(call.path), exc) from exc
        return decode_response(call, response)

    async def open(self) -> None:
        """Nothing to do: httpx connects on the first request."""

    async def send(self, call: Call) -> Any:
        attempt = 1
        while True:
            try:
                return await self._send_once(call)
            except (APIError, TransportError) as exc:
                delay = self.policy.delay(call, exc, attempt)
                if delay is None:
                    raise
            await asyncio.sleep(delay)
            attempt += 1

    async def close(self) -> None:
        await self._http.aclose()


__all__ = ["AsyncHTTPTransport", "DEFAULT_RETRIES", "DEFAULT_TIMEOUT", "HTTPTransport"]
