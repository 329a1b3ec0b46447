"""The conformance suite through the `ampkit conformance` command.

Once as CI runs it: a real `ampkit serve` process and a real `ampkit conformance` process. The
other cases run the same command in this process (`run_cli`) against the app served in a
thread (`AppServer`): what they test is the runner and the store, not the process boundary.

A dedicated server started with `--allow-clock-override`: the lifecycle vectors move the clock
with `as_of`, which touches every cell in the store, so they must not share a store with other
tests. Against a production server (no override) those vectors are reported as skipped."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from ampkit.spec.conformance import load_cases
import support

SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?$", re.M)


def run_cli(base_url: str, *args: str) -> subprocess.CompletedProcess:
    """`ampkit conformance` in this process."""
    return support.run_cli("conformance", "--base-url", base_url, *args)


def run_process(base_url: str, *args: str) -> subprocess.CompletedProcess:
    """`ampkit conformance` as a real process, as CI and users run it."""
    return subprocess.run(
        [sys.executable, "-m", "ampkit.cli", "conformance", "--base-url", base_url, *args],
        capture_output=True, text=True, timeout=240,
    )


@pytest.fixture(scope="module")
def conformance_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("conformance")
    with support.AppServer(f"sqlite:///{tmp}/memory.db", args=["--allow-clock-override"],
                           log_path=tmp / "server.log") as srv:
        yield srv


def test_runner_imports_only_httpx_and_the_standard_library():
    """Black box: the runner must not lean on the server's code."""
    import ast
    import ampkit.spec.conformance as runner

    tree = ast.parse(open(runner.__file__, encoding="utf-8").read())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported - sys.stdlib_module_names == {"httpx"}


def test_bundled_suite_has_unique_ids_and_at_least_40_cases():
    cases = load_cases()
    assert len(cases) >= 40
    assert {c["tier"] for c in cases} <= {"MUST", "SHOULD", "EXT"}
    topics = {c["topic"] for c in cases}
    assert {"identity", "errors", "access_denied_parity", "crud", "patch", "lifecycle", "access",
            "search_list", "limits_validation", "spec_honesty"} <= topics


@pytest.mark.slow
def test_suite_passes_against_ampkit_serve(tmp_path):
    """Black box, as CI runs it: `ampkit serve` and `ampkit conformance`, two processes."""
    store = f"sqlite:///{tmp_path}/memory.db"
    with support.ServerProcess(store, args=["--allow-clock-override"], log_path=tmp_path / "server.log") as srv:
        result = run_process(srv.base_url)
    summary = SUMMARY.findall(result.stdout)
    assert summary, result.stdout + result.stderr
    passed, failed, skipped = (int(n or 0) for n in summary[-1])
    assert (failed, result.returncode) == (0, 0), result.stdout
    assert passed >= 40 and skipped == 0, result.stdout
    assert result.stdout.strip().splitlines()[-1] == f"{passed} passed, 0 failed"


def test_clock_moving_cases_are_skipped_cleanly_on_a_production_server(server_factory):
    # A server of its own: lifecycle-006 expects a search for a fresh random word to find
    # nothing, which a store other tests filled with public cells cannot promise.
    result = run_cli(server_factory().base_url, "--only", "lifecycle")
    passed, failed, skipped = (int(n or 0) for n in SUMMARY.findall(result.stdout)[-1])
    needs_clock = [c["id"] for c in load_cases() if "lifecycle" in c["id"] and "lifecycle_as_of" in c.get("requires", [])]
    assert (failed, result.returncode) == (0, 0), result.stdout
    assert skipped == len(needs_clock) > 0 and passed > 0, result.stdout
    for case_id in needs_clock:
        assert f"SKIP {case_id}: server does not advertise lifecycle_as_of" in result.stdout


def test_suite_is_repeatable_against_one_server(conformance_server):
    """Random per-run ids: a second run of a subset sees none of the first run's cells."""
    first = run_cli(conformance_server.base_url, "--only", "access")
    second = run_cli(conformance_server.base_url, "--only", "access")
    assert first.returncode == second.returncode == 0, first.stdout + second.stdout
    assert SUMMARY.findall(second.stdout)[-1][1] == "0"


def test_runner_reports_a_failing_vector(conformance_server, tmp_path):
    wrong = {
        "topic": "deliberately wrong",
        "cases": [
            {"id": "wrong-001", "tier": "MUST", "title": "expects 200 for a missing cell",
             "agent": "{uid}-alice",
             "steps": [{"method": "GET", "path": "/memories/mem_00000000000000000000000000", "expect": {"status": 200}}]},
            {"id": "wrong-002", "tier": "MUST", "title": "expects the wrong default importance",
             "agent": "{uid}-alice",
             "steps": [{"method": "POST", "path": "/memories",
                        "body": {"content": {"text": "x {uid}"}, "identity": {"owner_id": "{uid}-alice"}},
                        "expect": {"status": 201, "equals": {"scoring.importance": 0.75}}}]},
            {"id": "right-001", "tier": "MUST", "title": "a true statement",
             "steps": [{"method": "GET", "path": "/health", "expect": {"status": 200, "equals": {"status": "ok"}}}]},
            {"id": "ext-001", "tier": "EXT", "title": "needs an extension nobody serves", "requires": ["time_travel"],
             "steps": [{"method": "GET", "path": "/health", "expect": {"status": 500}}]},
        ],
    }
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(wrong))
    result = run_cli(conformance_server.base_url, "--vectors", str(path))
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 1
    assert lines[-1] == "1 passed, 2 failed, 1 skipped"
    assert any(l.startswith("FAIL wrong-001 [MUST] step 1") and "status: expected 200, got 403" in l for l in lines), lines
    assert any(l.startswith("FAIL wrong-002") and "scoring.importance: expected 0.75, got 0.5" in l for l in lines), lines
    assert any(l.startswith("SKIP ext-001") and "time_travel" in l for l in lines), lines


def test_runner_fails_cleanly_when_nothing_listens(tmp_path):
    from support import free_port

    result = run_cli(f"http://127.0.0.1:{free_port()}/amp/v1")
    assert result.returncode == 1
    assert result.stdout.strip().splitlines()[-1] == "0 passed, 1 failed"


@pytest.mark.postgres
def test_suite_passes_against_ampkit_serve_on_postgres(server_factory, pg_url):
    """The same vectors hold the PostgreSQL store to the same protocol."""
    result = run_cli(server_factory(store_url=pg_url, args=["--allow-clock-override"]).base_url)
    assert result.returncode == 0, result.stdout
    passed, failed, _ = SUMMARY.findall(result.stdout)[-1]
    assert int(passed) >= 40 and failed == "0", result.stdout
