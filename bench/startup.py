"""Start-up time of `ampkit serve`: process start -> `/health` answers -> first search -> first
MCP request, over several restarts of one store.

    python bench/startup.py [--rounds 7] [--cells 2000] [--store URL] [--embedder default] [--json out.json]

Without `--store` it writes `--cells` memories of 20 owners (bench/scale.py's texts, every cell
readable by its owner's team and by "analyst") into a fresh SQLite file with one server, then
restarts a server on that file `--rounds` times, each time timing from `Popen` on:

- `ready`: `GET /health` answers 200 (the app is built, the store open, the port bound);
- `first_search`: an owner's search answered (the embedder and the store's read path);
- `first_wide_search`: then an analyst's search, across every owner (the store's wide-read state);
- `first_mcp`: then a `tools/list` on `/mcp` (the MCP server loads on its first request).

Each figure is measured from the process start, so they add up. The server's CPU seconds at
`ready` are printed beside them (what does not depend on how busy the machine is). For the
same figures at a million cells see bench/scale.py's restart rows.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from ampkit.tls import tls_context  # one TLS context: httpx builds one per client (~30 ms)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import Server, cell_body, memory_text  # noqa: E402  (the same memories and server helper)

OWNERS = 20


def load(base: str, cells: int) -> None:
    rng = random.Random(7)
    with httpx.Client(base_url=base, timeout=120, verify=tls_context()) as http:
        for start in range(0, cells, 500):
            by_owner: dict[str, list[dict]] = {}
            for i in range(start, min(cells, start + 500)):
                owner = f"user-{i % OWNERS:03d}"
                text = memory_text(rng)
                by_owner.setdefault(owner, []).append(cell_body(owner, text, f"s-{i // 10}", team=i % OWNERS % 10))
            for owner, bodies in by_owner.items():
                r = http.post("/memories/batch", json={"cells": bodies}, headers={"X-AMP-Agent-ID": owner})
                r.raise_for_status()


def one_restart(store_url: str, embedder: str, log: Path) -> dict[str, float]:
    server = Server(store_url, embedder, log)
    try:
        out = {"ready": server.ready - server.started, "cpu_at_ready": server.cpu_s()}
        with httpx.Client(base_url=server.base, timeout=300, verify=tls_context()) as http:
            r = http.post("/memories/search", json={"query": "coffee in Lisbon", "owner_id": "user-003"},
                          headers={"X-AMP-Agent-ID": "user-003"})
            r.raise_for_status()
            out["first_search"] = time.perf_counter() - server.started
            r = http.post("/memories/search", json={"query": "dark roast coffee Osaka"}, headers={"X-AMP-Agent-ID": "analyst"})
            r.raise_for_status()
            out["first_wide_search"] = time.perf_counter() - server.started
            mcp = server.base.removesuffix("/amp/v1") + "/mcp"
            r = http.post(mcp, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                          headers={"X-AMP-Agent-ID": "analyst", "Accept": "application/json, text/event-stream"})
            if r.status_code == 200:  # (404 when the server runs without MCP: `--server-args --no-mcp`)
                out["first_mcp"] = time.perf_counter() - server.started
        out["cpu_total"] = server.cpu_s()
        return out
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cells", type=int, default=2000)
    parser.add_argument("--store", default=None, help="an existing store URL (default: a fresh SQLite file)")
    parser.add_argument("--embedder", default="default")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ampkit-startup-") as tmp:
        log = Path(tmp) / "server.log"
        store_url = args.store or f"sqlite:///{tmp}/startup.db"
        if not args.store:
            server = Server(store_url, args.embedder, log)
            try:
                load(server.base, args.cells)
            finally:
                server.stop()
        load_before = os.getloadavg()[0]
        rounds = [one_restart(store_url, args.embedder, log) for _ in range(args.rounds)]
        load_after = os.getloadavg()[0]

    names = ["ready", "first_search", "first_wide_search", "first_mcp", "cpu_at_ready", "cpu_total"]
    table = {}
    for name in names:
        values = [r[name] for r in rounds if name in r]
        if values:
            table[name] = {"p50_s": round(statistics.median(values), 3), "min_s": round(min(values), 3),
                           "max_s": round(max(values), 3)}
    print(f"ampkit serve start-up, {args.rounds} restarts of {args.store or f'a SQLite file of {args.cells} cells'}"
          f" (load average {load_before:.1f} -> {load_after:.1f})")
    print(f"| {'from process start to':36} | p50 s | min s | max s |")
    print(f"|{'-' * 38}|-------|-------|-------|")
    labels = {"ready": "/health answers", "first_search": "an owner's search answered",
              "first_wide_search": "then an analyst's search answered", "first_mcp": "then /mcp tools/list answered",
              "cpu_at_ready": "(server CPU s at ready)", "cpu_total": "(server CPU s at the end)"}
    for name, row in table.items():
        print(f"| {labels[name]:36} | {row['p50_s']:5.2f} | {row['min_s']:5.2f} | {row['max_s']:5.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "summary": table, "load_average": [load_before, load_after],
                                               "cells": None if args.store else args.cells, "store": args.store}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
