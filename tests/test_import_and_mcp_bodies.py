"""Issue 42, items 9 and 10: bodies the REST routes refuse cleanly, refused the same way on
`/mcp` and by the NDJSON import (`POST /admin/import`, `ampkit import`).

- JSON nested too deeply to decode is 400 `MALFORMED_JSON` (it was a 500), and the server
  keeps serving;
- an imported cell is held to the write limits a create is held to (`max_cell_size_bytes`:
  a 3.9 MB text was written), reported by line like every other problem of the file, with
  nothing written, on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import httpx
import pytest

from ampkit.limits import Limits
from ampkit.portable import ImportInvalid, import_lines
from ampkit.store import store_from_url
from support import TLS, run_cli

HEADER = {"kind": "header", "format": "ampkit-export", "format_version": 1, "amp_version": "0.1.0", "owner_id": None}
MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def _ndjson(*records: object) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def _assert_malformed(r: httpx.Response) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["error"]["code"] == "MALFORMED_JSON" and set(body["error"]) == {"code", "message", "details"}, body


def test_an_overdeep_mcp_body_is_malformed_json_and_mcp_keeps_serving(server):
    mcp = server.base_url.removesuffix("/amp/v1") + "/mcp"
    with httpx.Client(verify=TLS, timeout=30, headers={"X-AMP-Agent-ID": "deep", **MCP_HEADERS}) as http:
        _assert_malformed(http.post(mcp, content="[" * 20_000 + "]" * 20_000))
        _assert_malformed(http.post(mcp, content='{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": '
                                                 + '{"a":' * 5_000 + "1" + "}" * 5_001))
        listed = http.post(mcp, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert listed.status_code == 200 and any(t["name"] == "remember" for t in listed.json()["result"]["tools"])
        assert http.get(f"{server.base_url}/health").status_code == 200


def _cell(server, owner: str, text: str) -> dict:
    created = httpx.post(f"{server.base_url}/memories", headers={"X-AMP-Agent-ID": owner}, verify=TLS,
                         json={"content": {"text": text}, "identity": {"owner_id": owner}})
    assert created.status_code == 201, created.text
    return created.json()


def test_an_overdeep_import_line_is_malformed_json_and_nothing_is_written(server):
    deep_line = '{"kind": "cell", "cell": ' + "[" * 10_000 + "]" * 10_000 + "}"
    body = _ndjson(HEADER, deep_line, {"kind": "end"})
    with httpx.Client(base_url=server.base_url, verify=TLS, timeout=30) as http:
        r = http.post("/admin/import", content=body, headers={"X-AMP-Agent-ID": "ops", "Content-Type": "application/x-ndjson"})
        _assert_malformed(r)
        assert r.json()["error"]["details"]["line"] == 2
        assert http.get("/health").status_code == 200


def test_ampkit_import_reports_an_overdeep_line(tmp_path):
    path = tmp_path / "deep.ndjson"
    path.write_text(_ndjson(HEADER, '{"kind": "cell", "cell": ' + "[" * 10_000 + "]" * 10_000 + "}", {"kind": "end"}))
    result = run_cli("import", str(path), "--store", f"sqlite:///{tmp_path}/memory.db")
    assert result.returncode == 1
    assert f"{path}:2: line 2 is JSON nested too deeply" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def _oversized_export(server, owner: str) -> tuple[dict, str]:
    """An export line of a real cell, its text grown past the server's limit (64 KiB)."""
    cell = _cell(server, owner, "small enough")
    big = {**cell, "id": "mem_" + "9" * 26, "content": {"text": "x" * 3_900_000, "metadata": {}}}
    return big, _ndjson(HEADER, {"kind": "cell", "cursor": f"cell:{big['id']}", "cell": big}, {"kind": "end"})


def test_an_import_over_the_cell_size_limit_is_refused_by_line(server_factory):
    srv = server_factory(env={"AMPKIT_MAX_REQUEST_BYTES": str(8 * 1024 * 1024)})
    big, body = _oversized_export(srv, "importer")
    with httpx.Client(base_url=srv.base_url, verify=TLS, timeout=60) as http:
        r = http.post("/admin/import", content=body, headers={"X-AMP-Agent-ID": "ops", "Content-Type": "application/x-ndjson"})
        assert r.status_code == 422, r.text[:500]
        errors = r.json()["error"]["details"]["errors"]
        assert errors == [{"line": 2, "error": f"cell {big['id']}: cell content is 3900025 bytes; the maximum is 65536"}]
        assert http.get(f"/memories/{big['id']}", headers={"X-AMP-Agent-ID": "importer"}).status_code == 403
    # one byte under the limit is written
    fits = {**big, "content": {"text": "x" * (65536 - 25), "metadata": {}}}
    with httpx.Client(base_url=srv.base_url, verify=TLS, timeout=60) as http:
        r = http.post("/admin/import", content=_ndjson(HEADER, {"kind": "cell", "cell": fits}, {"kind": "end"}),
                      headers={"X-AMP-Agent-ID": "ops", "Content-Type": "application/x-ndjson"})
        assert r.status_code == 200 and r.json()["cells_written"] == 1, r.text[:500]


def test_ampkit_import_holds_cells_to_the_configured_limit(server, tmp_path):
    big, body = _oversized_export(server, "cli-importer")
    path = tmp_path / "big.ndjson"
    path.write_text(body)
    store = f"sqlite:///{tmp_path}/memory.db"
    refused = run_cli("import", str(path), "--store", store)
    assert refused.returncode == 1 and f"{path}:2: cell {big['id']}: cell content is 3900025 bytes" in refused.stderr
    allowed = run_cli("import", str(path), "--store", store, env={"AMPKIT_MAX_CELL_SIZE_BYTES": "4000000"})
    assert allowed.returncode == 0, allowed.stderr


@pytest.mark.postgres
def test_import_into_postgres_holds_cells_to_the_limit(server, pg_url):
    big, body = _oversized_export(server, "pg-importer")
    store = store_from_url(pg_url)
    store.open()
    try:
        with pytest.raises(ImportInvalid) as refused:
            import_lines(store, lambda: body.splitlines(), limits=Limits())
        assert refused.value.details["errors"][0]["line"] == 2
        assert store.get(big["id"]) is None
        assert import_lines(store, lambda: body.splitlines(), limits=Limits(max_cell_size_bytes=4_000_000)).cells_written == 1
    finally:
        store.close()
