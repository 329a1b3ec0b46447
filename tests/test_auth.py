"""API keys and bearer auth, end to end: the `ampkit keys` CLI writes to a real SQLite file,
a real `ampkit serve --auth` process reads the same file, and every check goes over HTTP."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
from datetime import timedelta

import httpx
import pytest

from ampkit.auth import create_key, key_state, parse_duration, revoke_key, rotate_key, verify_key
from ampkit.errors import Unauthorized
from ampkit.server.identity import is_loopback_host
from ampkit.store.sqlite import SQLiteStore
from support import TLS, ManualClock, free_port, run_cli

CELL = {"type": "semantic", "content": {"text": "the launch code is in the blue folder"},
        "identity": {"owner_id": "alice", "owner_type": "agent"}}


def ampkit(*args: str) -> subprocess.CompletedProcess:
    """The `ampkit keys` commands, in this process (their code, output and exit codes)."""
    return run_cli(*args)


def ampkit_process(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """A real `ampkit` process: for `serve`, whose start-up checks are what is tested (without
    the embedding model, which they do not involve)."""
    return subprocess.run([sys.executable, "-m", "ampkit.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "AMPKIT_EMBEDDER": "none"})


def bearer(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **extra}


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "auth.db"
    store = SQLiteStore(str(path))
    store.open()
    yield path, store
    store.close()


@pytest.fixture
def auth_server(db, server_factory):
    path, store = db
    keys = {
        "alice": create_key(store, "alice", "read,write").token,
        "bob": create_key(store, "bob", "read,write").token,
        "reader": create_key(store, "alice", "read").token,
        "admin": create_key(store, "ops", "read,write,admin").token,
    }
    srv = server_factory(f"sqlite:///{path}", args=["--auth"], clock=ManualClock())
    return srv, store, keys


# ---------------------------------------------------------------- library and CLI
def test_cli_prints_the_key_once_and_stores_only_its_hash(tmp_path):
    url = f"sqlite:///{tmp_path}/k.db"
    made = ampkit("keys", "create", "--agent", "alice", "--scopes", "read,write", "--expires", "30d", "--store", url)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("ampk_") and len(token.splitlines()) == 1
    key_id, secret = token.split("_")[1], token.split("_", 2)[2]
    assert "shown only once" in made.stderr and key_id in made.stderr and secret not in made.stderr

    listed = ampkit("keys", "list", "--store", url)
    assert listed.returncode == 0 and key_id in listed.stdout and "alice" in listed.stdout
    assert secret not in listed.stdout and "active" in listed.stdout
    # The database file holds the hash, never the secret.
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("k.db*"))
    assert secret.encode() not in raw
    with sqlite3.connect(tmp_path / "k.db") as conn:
        (stored,) = conn.execute("SELECT secret_hash FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
    assert len(stored) == 64 and stored != secret

    revoked = ampkit("keys", "revoke", key_id, "--store", url)
    assert revoked.returncode == 0
    assert "revoked" in ampkit("keys", "list", "--json", "--store", url).stdout
    assert ampkit("keys", "revoke", "0123456789abcdef", "--store", url).returncode != 0
    bad = ampkit("keys", "create", "--agent", "x", "--scopes", "read,root", "--store", url)
    assert bad.returncode != 0 and "scopes" in bad.stderr


def test_verify_key_rejects_tampering_expiry_and_revocation(db):
    _, store = db
    issued = create_key(store, "alice", "read")
    assert verify_key(store, issued.token).agent_id == "alice"
    key_id = issued.record.key_id
    flipped = issued.token[:-1] + ("A" if issued.token[-1] != "A" else "B")
    for token in (flipped, "ampk_0000000000000000_" + "x" * 43, "not-a-key", "", issued.token + "x"):
        with pytest.raises(Unauthorized):
            verify_key(store, token)
    later = issued.record.created_at + timedelta(days=1)
    short = create_key(store, "alice", "read", timedelta(hours=1))
    with pytest.raises(Unauthorized, match="expired"):
        verify_key(store, short.token, now=later)
    revoke_key(store, key_id)
    with pytest.raises(Unauthorized, match="revoked"):
        verify_key(store, issued.token)
    assert key_state(store.keys.get(key_id)) == "revoked"


def test_rotation_keeps_agent_and_scopes_and_overlaps(db):
    _, store = db
    old = create_key(store, "alice", "read,admin")
    t0 = old.record.created_at
    new = rotate_key(store, old.record.key_id, timedelta(hours=24), now=t0)
    assert (new.record.agent_id, new.record.scopes) == ("alice", ("read", "admin"))
    assert verify_key(store, old.token, now=t0 + timedelta(hours=23)).key_id == old.record.key_id
    assert verify_key(store, new.token, now=t0 + timedelta(hours=23)).key_id == new.record.key_id
    with pytest.raises(Unauthorized, match="expired"):
        verify_key(store, old.token, now=t0 + timedelta(hours=25))
    assert verify_key(store, new.token, now=t0 + timedelta(days=400)).agent_id == "alice"
    assert store.keys.get(old.record.key_id).replaced_by == new.record.key_id


def test_durations_and_loopback_detection():
    assert parse_duration("30d") == timedelta(days=30)
    assert parse_duration("90s") == timedelta(seconds=90) == parse_duration("90")
    assert parse_duration("1.5h") == timedelta(minutes=90)
    with pytest.raises(ValueError):
        parse_duration("soon")
    for host in ("127.0.0.1", "127.8.9.10", "localhost", "::1", "[::1]"):
        assert is_loopback_host(host), host
    for host in ("0.0.0.0", "::", "10.0.0.5", "192.0.2.1", "example.com"):
        assert not is_loopback_host(host), host


# ---------------------------------------------------------------- the server with --auth
def test_missing_or_bad_key_is_401_in_the_envelope(auth_server):
    srv, _, keys = auth_server
    with httpx.Client(base_url=srv.base_url, verify=TLS) as http:
        for headers in ({}, {"X-AMP-Agent-ID": "alice"}, bearer("ampk_nope"), bearer(keys["alice"] + "x"),
                        {"Authorization": f"Basic {keys['alice']}"}):
            for method, path in (("GET", "/memories"), ("POST", "/memories/search"), ("GET", "/export")):
                r = http.request(method, path, headers=headers, json={"query": "x"})
                assert r.status_code == 401, (headers, path)
                assert r.json()["error"]["code"] == "UNAUTHORIZED"
                assert r.headers["WWW-Authenticate"].startswith("Bearer")
        # health and spec stay open; spec says what is required.
        assert http.get("/health").status_code == 200
        auth = http.get("/spec").json()["capabilities"]["auth"]
        assert auth["mode"] == "required" and auth["scheme"] == "bearer"


def test_identity_comes_from_the_key_and_cannot_be_spoofed(auth_server):
    srv, _, keys = auth_server
    with httpx.Client(base_url=srv.base_url, verify=TLS) as http:
        made = http.post("/memories", json=CELL, headers=bearer(keys["alice"]))
        assert made.status_code == 201
        cell = made.json()
        assert cell["identity"]["created_by"] == "alice"
        # bob's key with alice's name in the header: refused, never treated as alice.
        spoof = http.get(f"/memories/{cell['id']}", headers=bearer(keys["bob"], **{"X-AMP-Agent-ID": "alice"}))
        assert spoof.status_code == 403 and spoof.json()["error"]["code"] == "FORBIDDEN"
        spoof_write = http.post("/memories", json=CELL, headers=bearer(keys["bob"], **{"X-AMP-Agent-ID": "alice"}))
        assert spoof_write.status_code == 403
        # bob as bob cannot read alice's private cell (the usual no-oracle 403).
        denied = http.get(f"/memories/{cell['id']}", headers=bearer(keys["bob"]))
        assert denied.status_code == 403 and denied.json()["error"]["code"] == "ACCESS_DENIED"
        assert http.post("/memories/search", json={"query": "launch code"}, headers=bearer(keys["bob"])).json()["results"] == []
        # a header that agrees with the key is fine.
        ok = http.get(f"/memories/{cell['id']}", headers=bearer(keys["alice"], **{"X-AMP-Agent-ID": "alice"}))
        assert ok.status_code == 200 and ok.json()["content"]["text"] == CELL["content"]["text"]
        # bob's write lands as bob, whatever the body claims.
        body = {**CELL, "identity": {"owner_id": "bob", "owner_type": "agent", "created_by": "alice"}}
        r = http.post("/memories", json=body, headers=bearer(keys["bob"]))
        assert r.status_code == 201 and r.json()["identity"]["created_by"] == "bob"


def test_scopes_are_enforced(auth_server):
    srv, _, keys = auth_server
    with httpx.Client(base_url=srv.base_url, verify=TLS) as http:
        cell = http.post("/memories", json=CELL, headers=bearer(keys["alice"])).json()
        reader = bearer(keys["reader"])  # alice, read only
        assert http.get(f"/memories/{cell['id']}", headers=reader).status_code == 200
        for method, path, body in (("POST", "/memories", CELL),
                                   ("PATCH", f"/memories/{cell['id']}", {"content": {"text": "changed"}}),
                                   ("DELETE", f"/memories/{cell['id']}", None),
                                   ("POST", "/admin/lifecycle/run", {}),
                                   ("POST", "/admin/purge", {})):
            r = http.request(method, path, json=body, headers=reader)
            assert r.status_code == 403, (method, path)
            assert r.json()["error"] == {"code": "FORBIDDEN", "message": r.json()["error"]["message"],
                                         "details": {"required_scope": "write" if "admin" not in path else "admin"}}
        assert http.post("/admin/lifecycle/run", json={}, headers=bearer(keys["alice"])).status_code == 403
        assert http.post("/admin/lifecycle/run", json={}, headers=bearer(keys["admin"])).status_code == 200
        assert http.get(f"/memories/{cell['id']}", headers=reader).json()["content"]["text"] == CELL["content"]["text"]


def test_revocation_expiry_and_rotation_take_effect_on_a_running_server(auth_server, db):
    srv, _, _ = auth_server
    path, _ = db
    url = f"sqlite:///{path}"
    token = ampkit("keys", "create", "--agent", "carol", "--store", url).stdout.strip()
    short = ampkit("keys", "create", "--agent", "carol", "--expires", "2s", "--store", url).stdout.strip()
    with httpx.Client(base_url=srv.base_url, verify=TLS) as http:
        assert http.get("/memories", headers=bearer(token)).status_code == 200
        assert http.get("/memories", headers=bearer(short)).status_code == 200
        rotated = ampkit("keys", "rotate", token.split("_")[1], "--overlap", "2s", "--store", url)
        assert rotated.returncode == 0, rotated.stderr
        new = rotated.stdout.strip()
        assert new != token
        assert http.get("/memories", headers=bearer(token)).status_code == 200  # overlap
        assert http.get("/memories", headers=bearer(new)).status_code == 200
        srv.clock.advance(2.5)
        for gone in (token, short):
            r = http.get("/memories", headers=bearer(gone))
            assert r.status_code == 401 and r.json()["error"]["details"]["state"] == "expired"
        assert http.get("/memories", headers=bearer(new)).status_code == 200
        assert ampkit("keys", "revoke", new, "--store", url).returncode == 0
        r = http.get("/memories", headers=bearer(new))
        assert r.status_code == 401 and r.json()["error"]["details"]["state"] == "revoked"


def test_env_var_turns_auth_on(db, server_factory):
    path, store = db
    token = create_key(store, "dave", "read").token
    srv = server_factory(f"sqlite:///{path}", env={"AMPKIT_AUTH": "required"})
    assert httpx.get(f"{srv.base_url}/memories", headers={"X-AMP-Agent-ID": "dave"}, verify=TLS).status_code == 401
    assert httpx.get(f"{srv.base_url}/memories", headers=bearer(token), verify=TLS).status_code == 200


def test_auth_off_trusts_the_header_and_says_so(server):
    spec = httpx.get(f"{server.base_url}/spec", verify=TLS).json()["capabilities"]["auth"]
    assert spec["mode"] == "off" and spec["header"] == "X-AMP-Agent-ID"
    r = httpx.get(f"{server.base_url}/memories", verify=TLS)
    assert r.status_code == 401 and r.json()["error"]["code"] == "MISSING_AGENT_ID"


# ---------------------------------------------------------------- exposure
@pytest.mark.slow
def test_non_loopback_without_auth_is_refused_with_a_reason(tmp_path):
    url = f"sqlite:///{tmp_path}/x.db"
    # The refusal comes before anything starts, so it runs in this process; the port is held
    # here, so that a server that did not refuse would fail to bind instead of listening.
    with socket.create_server(("0.0.0.0", 0)) as held:
        refused = run_cli("serve", "--host", "0.0.0.0", "--port", str(held.getsockname()[1]), "--store", url)
    assert refused.returncode == 2
    assert "refusing to listen on 0.0.0.0 with auth off" in refused.stderr and "--auth" in refused.stderr
    # With --insecure (or --auth) the check passes: it then fails only at bind time, because
    # 192.0.2.1 (TEST-NET-1) is no address of this machine; nothing ever listens off loopback.
    for extra in (["--insecure"], ["--auth"]):
        passed = ampkit_process("serve", "--host", "192.0.2.1", "--port", str(free_port()), "--store", url, *extra)
        assert "refusing" not in passed.stderr
        assert "192.0.2.1" in passed.stdout + passed.stderr


# ---------------------------------------------------------------- rate limiting
def test_rate_limit_answers_429_with_retry_after_per_agent(server_factory):
    clock = ManualClock()
    srv = server_factory(args=["--rate-limit", "2"], clock=clock)  # 2/s sustained, burst 4
    spec = httpx.get(f"{srv.base_url}/spec", verify=TLS).json()["capabilities"]["auth"]["rate_limit"]
    assert spec == {"requests_per_second": 2.0, "burst": 4, "per": "agent"}
    with httpx.Client(base_url=srv.base_url, verify=TLS) as http:
        codes = [http.get("/memories", headers={"X-AMP-Agent-ID": "flooder"}).status_code for _ in range(12)]
        assert codes[:4] == [200] * 4 and codes.count(429) >= 6
        r = http.get("/memories", headers={"X-AMP-Agent-ID": "flooder"})
        assert r.status_code == 429 and r.json()["error"]["code"] == "RATE_LIMITED"
        assert int(r.headers["Retry-After"]) >= 1 and r.json()["error"]["details"]["retry_after"] >= 1
        # Another agent has its own bucket; health is never limited.
        assert http.get("/memories", headers={"X-AMP-Agent-ID": "calm"}).status_code == 200
        assert all(http.get("/health").status_code == 200 for _ in range(10))
        clock.advance(1.1)  # two tokens back
        assert http.get("/memories", headers={"X-AMP-Agent-ID": "flooder"}).status_code == 200


def test_auth_servers_limit_by_default_and_zero_turns_it_off(db, server_factory):
    path, _ = db
    default = server_factory(f"sqlite:///{path}", args=["--auth"], process=True)  # reads the CLI's warning
    assert httpx.get(f"{default.base_url}/spec", verify=TLS).json()["capabilities"]["auth"]["rate_limit"]["requests_per_second"] == 50
    assert "no active API key" in default.log_path.read_text()  # this store has no keys yet
    off = server_factory(f"sqlite:///{path}", args=["--auth", "--rate-limit", "0"])
    assert httpx.get(f"{off.base_url}/spec", verify=TLS).json()["capabilities"]["auth"]["rate_limit"] is None


def test_the_python_client_sends_the_key_from_the_environment(auth_server, monkeypatch):
    from ampkit.client import connect
    from ampkit.errors import Forbidden

    srv, _, keys = auth_server
    monkeypatch.setenv("AMPKIT_API_KEY", keys["alice"])
    with connect(srv.base_url) as client:
        made = client.remember("alice keeps her notes here", owner_id="alice")
        assert made.identity.created_by == "alice"
        assert client.get(made.id).content.text == "alice keeps her notes here"
    with pytest.raises(Unauthorized):
        with connect(srv.base_url, api_key=keys["alice"] + "x") as client:
            client.get(made.id)
    with pytest.raises(Forbidden):  # a read-only key passed by argument wins over the env var
        with connect(srv.base_url, api_key=keys["reader"]) as client:
            client.remember("not allowed", owner_id="alice")


@pytest.mark.postgres
def test_keys_and_auth_on_postgresql(pg_url, server_factory):
    token = ampkit("keys", "create", "--agent", "erin", "--scopes", "read,write", "--store", pg_url).stdout.strip()
    assert token.startswith("ampk_")
    srv = server_factory(pg_url, args=["--auth"])
    with httpx.Client(base_url=srv.base_url, verify=TLS) as http:
        made = http.post("/memories", json={**CELL, "identity": {"owner_id": "erin", "owner_type": "agent"}},
                         headers=bearer(token))
        assert made.status_code == 201 and made.json()["identity"]["created_by"] == "erin"
        assert http.get("/memories", headers=bearer(token, **{"X-AMP-Agent-ID": "frank"})).status_code == 403
        new = ampkit("keys", "rotate", token, "--overlap", "0s", "--store", pg_url).stdout.strip()
        assert http.get("/memories", headers=bearer(token)).status_code == 401
        assert http.get(f"/memories/{made.json()['id']}", headers=bearer(new)).status_code == 200
        assert '"state": "expired"' in ampkit("keys", "list", "--json", "--store", pg_url).stdout


def test_the_python_client_waits_out_a_real_rate_limit(server_factory):
    from ampkit.client import connect

    srv = server_factory(args=["--rate-limit", "4"])  # burst 8
    started = time.monotonic()
    with connect(srv.base_url, agent_id="patient", retries=5) as client:
        made = [client.remember(f"note {i}", owner_id="patient") for i in range(12)]
        assert len({c.id for c in made}) == 12  # no call failed ...
        assert time.monotonic() - started >= 0.9  # ... because the client honoured Retry-After
        listed = list(client.list(owner_id="patient", limit=100))  # (waits out the limit too)
    assert sorted(c.id for c in listed) == sorted(c.id for c in made)  # a refused (429) create was never stored twice
