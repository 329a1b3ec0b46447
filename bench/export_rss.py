"""Streaming export benchmark: does exporting a big store keep the server's memory flat?

    python bench/export_rss.py [--n 100000] [--store URL] [--bound-mb 64] [--json PATH] [--compare-json]

Fills a store with N cells (100 owners; one in ten edited, so history has more rows than
cells; one in fifty superseded), starts `ampkit serve` on it, then downloads
`GET /admin/export` (NDJSON) while sampling the server's resident memory (VmRSS) every 20 ms.
Reports the export's size and speed and the RSS growth over the server's warmed-up
baseline, and fails (exit 1) if the growth exceeds the documented bound (docs/time-travel.md:
64 MiB). `--compare-json` also measures the legacy reader-scoped `GET /export` (built in
memory) on one owner's cells, for contrast. Results go to bench/results/export_rss.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from ampkit.tls import tls_context  # one TLS context: httpx builds one per client (~30 ms)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from support import free_port, process_rss_kb  # noqa: E402  (the test helpers: a free loopback port, /proc)

from ampkit.models import CellCreate, CellPatch  # noqa: E402
from ampkit.service import MemoryService  # noqa: E402
from ampkit.store import store_from_url  # noqa: E402

OWNERS = 100


def fill(url: str, n: int) -> None:
    store = store_from_url(url)
    store.open()
    service = MemoryService(store=store)  # no embedder: the export does not read vectors
    try:
        made = 0
        while made < n:
            size = min(500, n - made)
            owner = f"owner-{(made // 500) % OWNERS:03d}"
            reqs = [CellCreate.model_validate({
                "content": {"text": f"memory {made + i}: {owner} prefers window seats and oat milk", "metadata": {"i": made + i}},
                "identity": {"owner_id": owner, "session_id": f"s{(made + i) // 10}"},
                "access_policy": {"readable_by": ["team-*"]},
            }) for i in range(size)]
            cells = service.create_many(owner, reqs)
            for cell in cells[::10]:
                service.update(owner, cell.id, CellPatch.model_validate({"content": {"text": cell.content.text + " (edited)"}}))
            for old in cells[1::50]:
                service.create(owner, CellCreate.model_validate({
                    "content": {"text": old.content.text + " (replaced)"}, "identity": {"owner_id": owner},
                    "supersedes": old.id}))
            made += size + len(cells[1::50])
            print(f"\rfilled {made}/{n}", end="", file=sys.stderr)
        print(file=sys.stderr)
    finally:
        store.close()


class Server:
    def __init__(self, url: str, log: Path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}/amp/v1"
        env = {**os.environ, "AMPKIT_EMBEDDER": "none"}
        cmd = [sys.executable, "-m", "ampkit.cli", "serve", "--port", str(self.port), "--store", url,
               "--lifecycle-interval", "0"]
        self.proc = subprocess.Popen(cmd, stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base}/health", timeout=1, verify=tls_context()).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server did not start; see {log}")

    def rss_mb(self) -> float:
        return process_rss_kb(self.proc.pid) / 1024

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def measure(server: Server, path: str, params: dict, agent: str, ndjson: bool = True) -> dict:
    """Download `path` while sampling RSS; returns size, time, the peak RSS seen and, for an
    NDJSON body, its lines (a JSON document has none to count: None)."""
    peak = [server.rss_mb()]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], server.rss_mb())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    size = lines = 0
    t0 = time.perf_counter()
    with httpx.stream("GET", f"{server.base}{path}", params=params, headers={"X-AMP-Agent-ID": agent},
                      timeout=600, verify=tls_context()) as answer:
        answer.raise_for_status()
        for chunk in answer.iter_bytes():
            size += len(chunk)
            lines += chunk.count(b"\n")
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join()
    return {"bytes": size, "lines": lines if ndjson else None, "seconds": round(seconds, 2), "peak_rss_mb": round(peak[0], 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="cells to create (supersessions add 2%%)")
    parser.add_argument("--store", default=None, help="store URL [default: a temporary SQLite file]")
    parser.add_argument("--bound-mb", type=float, default=64.0, help="allowed RSS growth during the export")
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "export_rss.json"))
    parser.add_argument("--compare-json", action="store_true", help="also measure the legacy GET /export of one owner")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ampkit-export-") as tmp:
        url = args.store or f"sqlite:///{tmp}/export.db"
        fill(url, args.n)
        server = Server(url, Path(tmp) / "server.log")
        try:
            # Warm up the route and the store's readers on a small export, then take the baseline.
            measure(server, "/admin/export", {"owner_id": "owner-000"}, "admin")
            time.sleep(0.5)
            baseline = server.rss_mb()
            full = measure(server, "/admin/export", {}, "admin")
            rows = [{"what": "GET /admin/export (NDJSON, whole store)", **full}]
            if args.compare_json:
                rows.append({"what": "GET /export (legacy JSON, one owner)",
                             **measure(server, "/export", {"owner_id": "owner-000"}, "owner-000", ndjson=False)})
        finally:
            server.stop()
    growth = round(full["peak_rss_mb"] - baseline, 1)
    print(f"\nexport of {args.n} cells (+2% superseding cells) | baseline RSS {baseline:.1f} MB | bound {args.bound_mb} MB")
    print(f"{'what':<42} {'lines':>9} {'MB':>8} {'s':>7} {'lines/s':>9} {'MB/s':>7} {'peak RSS MB':>12} {'growth MB':>10}")
    for row in rows:
        lines, per_s = ("-", "-") if row["lines"] is None else (row["lines"], f"{row['lines'] / row['seconds']:.0f}")
        print(f"{row['what']:<42} {lines:>9} {row['bytes'] / 1e6:>8.1f} {row['seconds']:>7.1f} "
              f"{per_s:>9} {row['bytes'] / 1e6 / row['seconds']:>7.1f} "
              f"{row['peak_rss_mb']:>12.1f} {row['peak_rss_mb'] - baseline:>10.1f}")
    result = {"n": args.n, "baseline_rss_mb": round(baseline, 1), "bound_mb": args.bound_mb,
              "rss_growth_mb": growth, "within_bound": growth < args.bound_mb, "runs": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"RSS growth {growth} MB {'<' if result['within_bound'] else '>='} bound {args.bound_mb} MB; wrote {args.json}")
    return 0 if result["within_bound"] else 1


if __name__ == "__main__":
    sys.exit(main())
