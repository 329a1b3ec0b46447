"""Per-call cost of the client over HTTP versus in process: create, get, search.

Starts its own `ampkit serve` on a free loopback port over a temp SQLite file, and opens a
second temp SQLite file in process; runs each operation N times after a warmup, on the same
synchronous `ampkit.Client` API, and prints p50/p95 per call.

    .venv/bin/python bench/client_overhead.py [--n 300] [--warmup 30] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import ampkit  # noqa: E402
from support import ServerProcess  # noqa: E402  (the test suite's real-server launcher)

WORDS = "tea coffee cat dog garden deploy runbook wiki budget travel paris berlin piano chess".split()


def sentence(i: int) -> str:
    picked = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(4)]
    return f"note {i}: Ada mentioned {' and '.join(picked)}"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def timed(fn: Callable[[int], object], n: int, warmup: int) -> list[float]:
    for i in range(warmup):
        fn(i)
    samples = []
    for i in range(n):
        start = time.perf_counter()
        fn(warmup + i)
        samples.append((time.perf_counter() - start) * 1000.0)
    return samples


def measure(client: ampkit.Client, n: int, warmup: int) -> dict[str, dict[str, float]]:
    ids: list[str] = []

    def create(i: int) -> None:
        ids.append(client.remember(sentence(i), owner_id="ada", importance=0.7).id)

    def get(i: int) -> None:
        client.get(ids[i % len(ids)])

    def search(i: int) -> None:
        client.search(WORDS[i % len(WORDS)], owner_id="ada", limit=10)

    out = {}
    for name, fn in (("create", create), ("get", get), ("search", search)):
        samples = timed(fn, n, warmup)
        out[name] = {"p50_ms": percentile(samples, 0.50), "p95_ms": percentile(samples, 0.95),
                     "mean_ms": statistics.fmean(samples), "n": n}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="timed calls per operation")
    parser.add_argument("--warmup", type=int, default=30, help="untimed calls first")
    parser.add_argument("--json", dest="json_path", help="also write the results here")
    args = parser.parse_args()

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="ampkit-bench-") as tmp:
        server = ServerProcess(f"sqlite:///{tmp}/server.db", args=["--lifecycle-interval", "0"])
        with server, ampkit.connect(server.base_url, agent_id="bench") as http:
            results["http"] = measure(http, args.n, args.warmup)
        with ampkit.connect(f"sqlite:///{tmp}/local.db", agent_id="bench") as local:
            results["in-process"] = measure(local, args.n, args.warmup)

    print(f"ampkit client overhead: {args.n} calls per operation after {args.warmup} warmup, "
          f"SQLite store, Python {platform.python_version()}")
    print(f"{'operation':<10}{'transport':<12}{'p50 ms':>9}{'p95 ms':>9}{'mean ms':>9}")
    for op in ("create", "get", "search"):
        for transport in ("http", "in-process"):
            r = results[transport][op]
            print(f"{op:<10}{transport:<12}{r['p50_ms']:>9.3f}{r['p95_ms']:>9.3f}{r['mean_ms']:>9.3f}")
    if args.json_path:
        payload = {"n": args.n, "warmup": args.warmup, "python": platform.python_version(), "results": results}
        Path(args.json_path).write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
