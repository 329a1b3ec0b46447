"""bench/writes.py and bench/startup.py run end to end (a real `ampkit serve`, client processes,
a SQLite file) and report what they claim: every write counted and read back, each phase's
clients, latencies and CPU, the machine's busy share and the CPU-bound rate beside each phase;
each restart's steps timed from the process start. Their numbers are not checked here
(benchmarks keep their targets, docs/testing.md); that they measure is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_write_benchmark_counts_every_write_and_reports_each_phase(tmp_path):
    out = tmp_path / "writes.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "writes.py"), "--single", "40", "--clients", "4",
         "--batch-cells", "30", "--json", str(out)],
        capture_output=True, text=True, timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert result["lost_writes"] == 0
    # 50 warm-up writes, 40 from one client, 40 split over 4 clients, 30 in a batch
    assert result["acked_writes"] == 50 + 40 + 40 + 30
    for phase, clients in (("single_1_client", 1), ("single_4_clients", 4)):
        p = result[phase]
        assert (p["clients"], p["writes"], p["errors"]) == (clients, 40, 0)
        assert p["writes_per_s"] > 0 and p["p50_ms"] <= p["p99_ms"]
        assert 0 < p["machine_busy"] <= 1
        assert p["server_cpu_ms_per_write"] > 0 and p["client_cpu_ms_per_write"] > 0
        # both cores' worth of the measured CPU per write: never below what the phase achieved
        # with part of the machine idle (the rate includes the phase's final search)
        assert p["cpu_bound_writes_per_s"] >= p["writes_per_s"] * 0.9
    assert "| single_4_clients | 4 |" in run.stdout
    # one batch (fewer cells than 500): its own size in the table, and its latency as every percentile
    batch = result["batch"]
    assert batch["cells_per_batch"] == 30 and batch["batches"] == 1
    assert batch["p50_ms"] == batch["p99_ms"] > 0
    assert f"| batches of 30 (cells/s; CPU per cell) | 1 | {batch['cells_per_s']} | {batch['p50_ms']} |" in run.stdout


@pytest.mark.slow
def test_the_write_benchmark_with_the_lean_client_counts_every_write(tmp_path):
    """`--client http.client`: the same requests from the standard library's HTTP client."""
    out = tmp_path / "writes.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "writes.py"), "--single", "24", "--clients", "2", "--batch-cells", "0",
         "--client", "http.client", "--json", str(out)],
        capture_output=True, text=True, timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert result["client"] == "http.client" and result["lost_writes"] == 0
    assert result["acked_writes"] == 50 + 24 + 24
    for phase in ("single_1_client", "single_2_clients"):
        assert (result[phase]["writes"], result[phase]["errors"]) == (24, 0)
    assert "clients http.client" in run.stdout


@pytest.mark.slow
def test_the_startup_benchmark_times_each_step_from_the_process_start(tmp_path):
    """bench/startup.py: every restart reports ready, then the first owner search, the first
    analyst search and the first /mcp call, each from the process start, so in that order."""
    out = tmp_path / "startup.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "startup.py"), "--rounds", "2", "--cells", "60", "--embedder", "none",
         "--json", str(out)],
        capture_output=True, text=True, timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert len(result["rounds"]) == 2
    for r in result["rounds"]:
        assert 0 < r["ready"] <= r["first_search"] <= r["first_wide_search"] <= r["first_mcp"]
        assert 0 < r["cpu_at_ready"] <= r["cpu_total"]
    assert "| /health answers" in run.stdout


@pytest.mark.slow
def test_the_write_stages_benchmark_times_each_stage_in_the_thread_that_runs_it(tmp_path):
    """bench/write_stages.py wraps the service's and the store's methods by name: a renamed
    method must fail here, not in the next session's measurement."""
    out = tmp_path / "stages.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "write_stages.py"), "--creates", "60", "--preload", "20", "--json", str(out)],
        capture_output=True, text=True, timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    stages, windows = result["stages_ms_per_create"], result["windows_thread_ms_per_create"]
    for stage in ("build the cell (models, id, size check)", "exact-duplicate check (one reader query)",
                  "store the cell (row, readers, history)"):
        assert stages[stage] > 0, stage
    # every new cell's window is indexed by the windows thread, after its commit, and its text
    # embedded there too (the creates' exact-duplicate checks need no vector)
    assert windows["keyword windows pass (BEGIN to COMMIT)"] >= windows["of which: rewrite the windows (flush)"] > 0
    assert windows["of which: take the pending rows, find the windows they change"] >= windows["of which: embed the new rows' texts (one call a pass)"] > 0
    assert stages["embed the text (only for a near-duplicate check; else the windows pass embeds it)"] == 0
    assert 0 < result["cpu_ms_per_create"] <= result["wall_ms_per_create"] * 1.5 and result["wal_pages_per_create"] > 0
