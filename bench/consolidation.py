"""Consolidation throughput against a fake model with a fixed per-call latency, and the
write path's cost of dedup on write.

1. dedup on write: an in-process service over a temp SQLite file (default embedder), an owner
   with `--preload` cells; then `--n` creates of new texts (so every check runs in full and
   finds nothing) with dedup off, exact (the default) and skip (near-duplicates: both legs of
   the hybrid retriever). p50/p99 per create.
2. consolidation: `--sessions` sessions of `--episodes` episodes, consolidated one session at
   a time; the fake model (tests/fake_llm.py, a real HTTP server) answers each extraction with
   one fact per two episodes and each decision with ADD, after `--latency` seconds.
   Episodes per second, model calls, and the time per session.

    .venv/bin/python bench/consolidation.py [--latency 0.05] [--json bench/results/consolidation.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from ampkit.bootstrap import build_service, load_settings  # noqa: E402
from ampkit.models import CellCreate, ConsolidateRequest  # noqa: E402
from fake_llm import FakeModel  # noqa: E402  (the test suite's fake model server)

WORDS = ("tea coffee cat dog garden deploy runbook wiki budget travel paris berlin piano chess "
         "river mountain bicycle violin pasta sushi kayak novel poetry jazz opera").split()


def sentence(i: int, prefix: str = "note") -> str:
    picked = [WORDS[(i * 7 + k * 5) % len(WORDS)] for k in range(5)]
    return f"{prefix} {i}: the user talked about {', '.join(picked)} on day {i % 97}"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def bench_dedup(tmp: str, preload: int, n: int) -> dict:
    service = build_service(load_settings(env=False, store=f"sqlite:///{tmp}/dedup.db"))
    service.store.open()
    try:
        for start in range(0, preload, 500):
            service.create_many("bench", [
                CellCreate.model_validate({"content": {"text": sentence(i, "stored")}, "identity": {"owner_id": "ada"},
                                           "dedup": "off"})
                for i in range(start, min(preload, start + 500))])
        out = {}
        for policy in ("off", "exact", "skip"):
            samples = []
            for i in range(n):
                req = CellCreate.model_validate({"content": {"text": sentence(i, f"new-{policy}")},
                                                 "identity": {"owner_id": "ada"}, "dedup": policy})
                t0 = time.perf_counter()
                service.create("bench", req)
                samples.append((time.perf_counter() - t0) * 1000)
            out[policy] = {"p50_ms": percentile(samples, 0.5), "p99_ms": percentile(samples, 0.99), "n": n}
        return out
    finally:
        service.store.close()


def _facts(prompt: str) -> dict:
    rows = json.loads(prompt.split("<episodes>\n", 1)[1].split("\n</episodes>", 1)[0])
    return {"candidates": [
        {"text": f"The user said: {rows[i]['text']}", "type": "fact", "confidence": 0.9,
         "supporting_episode_ids": [r["id"] for r in rows[i : i + 2]]}
        for i in range(0, len(rows), 2)]}


def bench_consolidation(tmp: str, sessions: int, episodes: int, latency: float) -> dict:
    fake = FakeModel(latency=latency).start()
    fake.on("extract", reply=_facts)
    fake.on("decide", reply={"decision": "ADD", "reason": "new", "confidence": 0.9})
    service = build_service(load_settings(env=False, store=f"sqlite:///{tmp}/consolidation.db",
                                          llm_url=fake.url, llm_model="fake"))
    service.store.open()
    try:
        for s in range(sessions):
            service.create_many("bench", [
                CellCreate.model_validate({"type": "episodic", "content": {"text": sentence(s * episodes + i, f"s{s}")},
                                           "identity": {"owner_id": "ada", "session_id": f"s{s}"}})
                for i in range(episodes)])
        calls = written = 0
        per_session = []
        t0 = time.perf_counter()
        for s in range(sessions):
            t1 = time.perf_counter()
            result = service.consolidate("bench", ConsolidateRequest(owner_id="ada", session_id=f"s{s}"))
            per_session.append((time.perf_counter() - t1) * 1000)
            calls += result.model_calls
            written += len(result.written)
        elapsed = time.perf_counter() - t0
        return {"sessions": sessions, "episodes_per_session": episodes, "latency_s": latency,
                "episodes_per_s": sessions * episodes / elapsed, "model_calls": calls, "written": written,
                "model_wait_share": calls * latency / elapsed,
                "session_p50_ms": percentile(per_session, 0.5), "session_p99_ms": percentile(per_session, 0.99)}
    finally:
        service.store.close()
        fake.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preload", type=int, default=2000, help="cells the owner has before the timed creates")
    parser.add_argument("--n", type=int, default=300, help="timed creates per dedup policy")
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--episodes", type=int, default=20, help="episodes per session")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds the fake model takes per call")
    parser.add_argument("--json", dest="json_path", default=str(ROOT / "bench" / "results" / "consolidation.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ampkit-bench-") as tmp:
        dedup = bench_dedup(tmp, args.preload, args.n)
        cons = bench_consolidation(tmp, args.sessions, args.episodes, args.latency)

    print(f"dedup on write: {args.n} creates per policy, owner with {args.preload} cells, SQLite, default embedder")
    print(f"{'policy':<8}{'p50 ms':>9}{'p99 ms':>9}{'p50 overhead':>14}")
    for policy, r in dedup.items():
        print(f"{policy:<8}{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}{r['p50_ms'] - dedup['off']['p50_ms']:>+14.3f}")
    print(f"\nconsolidation: {cons['sessions']} sessions x {cons['episodes_per_session']} episodes, "
          f"fake model latency {cons['latency_s'] * 1000:.0f} ms per call")
    print(f"{'episodes/s':>11}{'model calls':>13}{'written':>9}{'model wait':>12}{'session p50 ms':>16}{'p99 ms':>9}")
    print(f"{cons['episodes_per_s']:>11.1f}{cons['model_calls']:>13}{cons['written']:>9}"
          f"{cons['model_wait_share']:>11.0%}{cons['session_p50_ms']:>16.1f}{cons['session_p99_ms']:>9.1f}")
    Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_path).write_text(json.dumps({
        "python": platform.python_version(), "preload": args.preload, "n": args.n,
        "dedup_on_write": dedup, "consolidation": cons}, indent=2) + "\n")
    print(f"\nwrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
