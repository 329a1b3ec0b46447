"""Issue 42, item 5: DNS rebinding. A server bound to loopback answers only requests whose
Host (and Origin, when present) names localhost, 127.0.0.1 or ::1 (any port) or a host of
the allow-list (`AMPKIT_ALLOWED_HOSTS`, `ampkit serve --allowed-hosts`), on every route:
/amp/v1, /ui and /mcp alike (only /mcp checked, through the MCP SDK, before). Real servers
over HTTP; the Host header is what a browser sends for a rebound name."""

from __future__ import annotations

import httpx
import pytest

from support import TLS, AppServer

ROUTES = ("/amp/v1/health", "/amp/v1/memories", "/ui/", "/mcp")


def _root(server) -> str:
    return server.base_url.removesuffix("/amp/v1")


def _statuses(server, host: str, origin: str | None = None) -> list[int]:
    headers = {"Host": host, "X-AMP-Agent-ID": "rebind-probe"}
    if origin is not None:
        headers["Origin"] = origin
    with httpx.Client(verify=TLS, timeout=30) as http:
        answers = [http.get(_root(server) + path, headers=headers) for path in ROUTES]
    for r in answers:
        if r.status_code == 403:
            assert r.json()["error"]["code"] == "FORBIDDEN", r.text
    return [r.status_code for r in answers]


def _refused(statuses: list[int]) -> bool:
    return statuses == [403] * len(ROUTES)


def _served(statuses: list[int]) -> bool:
    return 403 not in statuses


@pytest.fixture(scope="module")
def proxied(tmp_path_factory):
    """A loopback server behind a proxy that forwards two names."""
    tmp = tmp_path_factory.mktemp("proxied")
    with AppServer(f"sqlite:///{tmp}/memory.db", args=["--allowed-hosts", "memory.example.com, *.corp.example"]) as srv:
        yield srv


def test_a_loopback_server_refuses_a_foreign_host_on_every_route(server):
    port = server.port
    for host in (f"evil.example:{port}", "evil.example", "127.0.0.1.evil.example", f"memory.example.com:{port}", ""):
        assert _refused(_statuses(server, host)), host


def test_loopback_names_with_any_port_are_served(server):
    port = server.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost", "127.0.0.1", "[::1]",
                 f"LOCALHOST:{port}"):
        assert _served(_statuses(server, host)), host


def test_a_foreign_origin_is_refused_and_a_loopback_one_served(server):
    host = f"127.0.0.1:{server.port}"
    for origin in ("http://evil.example", f"http://evil.example:{server.port}", "null"):
        assert _refused(_statuses(server, host, origin)), origin
    for origin in (f"http://127.0.0.1:{server.port}", "http://localhost:3000", f"http://[::1]:{server.port}"):
        assert _served(_statuses(server, host, origin)), origin


def test_the_allow_list_admits_its_names_and_still_refuses_others(proxied):
    for host in ("memory.example.com", "MEMORY.example.com:443", "a.corp.example", f"127.0.0.1:{proxied.port}"):
        assert _served(_statuses(proxied, host)), host
    for host in ("evil.example", "corp.example", "memory.example.com.evil.example"):
        assert _refused(_statuses(proxied, host)), host
    assert _served(_statuses(proxied, "memory.example.com", "https://memory.example.com"))
    assert _refused(_statuses(proxied, "memory.example.com", "https://evil.example"))


def test_the_allow_list_from_the_environment(tmp_path):
    with AppServer(f"sqlite:///{tmp_path}/memory.db", env={"AMPKIT_ALLOWED_HOSTS": "memory.example.com"}) as srv:
        assert _served(_statuses(srv, "memory.example.com"))
        assert _refused(_statuses(srv, "evil.example"))


def test_a_server_bound_off_loopback_answers_any_host_unless_listed(tmp_path):
    """Off loopback the proxy or the keys decide, as the MCP endpoint did; a list still applies."""
    with AppServer(f"sqlite:///{tmp_path}/any.db", args=["--host", "0.0.0.0", "--insecure"]) as srv:
        assert _served(_statuses(srv, "memory.example.com"))
    with AppServer(f"sqlite:///{tmp_path}/listed.db", args=["--host", "0.0.0.0", "--insecure",
                                                               "--allowed-hosts", "memory.example.com"]) as srv:
        assert _served(_statuses(srv, "memory.example.com"))
        assert _refused(_statuses(srv, "evil.example"))
