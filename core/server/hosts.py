"""The Host allow-list: which host names the server answers to, on every route.

A web page can reach a server on loopback through DNS rebinding: its own name, re-pointed at
127.0.0.1, makes the browser send the page's requests there with `Host: <the page's name>`.
So a server bound to loopback answers only requests whose `Host` (and `Origin`, when a
browser sends one) names an allowed host: `localhost`, `127.0.0.1` and `::1` with any port,
plus `allowed_hosts` (`AMPKIT_ALLOWED_HOSTS`, `ampkit serve --allowed-hosts`), for a proxy in
front that forwards another name. A server bound elsewhere answers any host unless
`allowed_hosts` is set. Anything else is 403 `FORBIDDEN` in the error envelope.

Starlette's `TrustedHostMiddleware` does not fit: it cuts the port at the first ":" (an IPv6
literal such as `[::1]:8765` becomes `[`), answers in plain text, and ignores `Origin`.
This one check covers `/amp/v1`, `/ui` and `/mcp` (whose SDK check is off, see
`mcp_server._transport_security`).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence
from urllib.parse import urlsplit

from ..errors import Forbidden
from .errors import envelope_response
from .identity import is_loopback_host

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def allowed_hosts(bind_host: str, configured: Optional[str]) -> Optional[tuple[str, ...]]:
    """The host names a server bound to `bind_host` answers to, lower-case, IPv6 without
    brackets (`*.example.com` allows its subdomains, `*` any host); None: any host. The
    loopback names are always allowed: no page can make a browser send them but a page
    served from this machine."""
    names = tuple(_bare(n) for n in (configured or "").split(",") if n.strip())
    if "*" in names or (not names and not is_loopback_host(bind_host)):
        return None
    return LOOPBACK_HOSTS + names


def _bare(host: str) -> str:
    return host.strip().lower().removeprefix("[").removesuffix("]")


def host_of(header: str) -> str:
    """The host name of a `Host` header value: port cut, IPv6 brackets dropped."""
    header = header.strip()
    if header.startswith("["):
        return _bare(header.partition("]")[0] + "]")
    return _bare(header.partition(":")[0])


def is_allowed(host: str, allowed: Sequence[str]) -> bool:
    return bool(host) and any(host == name or (name.startswith("*.") and host.endswith(name[1:])) for name in allowed)


class HostAllowList:
    """ASGI middleware: refuse an HTTP request whose `Host`, or whose `Origin` when present,
    names a host outside `allowed` (see the module docstring)."""

    def __init__(self, app: Any, allowed: Sequence[str]):
        self.app = app
        self.allowed = tuple(allowed)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await envelope_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Any) -> Optional[Forbidden]:
        host = origin = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
        if host is None or not is_allowed(host_of(host), self.allowed):
            return Forbidden("the Host header names a host this server does not answer to "
                             "(set AMPKIT_ALLOWED_HOSTS for a proxy in front of it)", {"host": host})
        if origin is not None and not is_allowed(_bare(urlsplit(origin).hostname or ""), self.allowed):
            return Forbidden("the Origin header names a host this server does not answer to "
                             "(set AMPKIT_ALLOWED_HOSTS for a proxy in front of it)", {"origin": origin})
        return None
