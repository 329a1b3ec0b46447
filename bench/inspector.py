"""Inspector page timings on a large store: server time per page, p50/p95/p99.

    python bench/inspector.py [--n 100000] [--rounds 40] [--embedder none] [--json out.json]

Builds a SQLite store of N cells (about 100 per owner, sessions of 10, a mix of types, a
`topic` metadata key; written with the service's batch create, 500 cells a transaction),
then renders each inspector page in process (the real /ui app of `create_app`, through
Starlette's TestClient: routing, session check, service calls, templates; no network) for two
callers: `importer`, who wrote every cell and so may read all N (the worst case for the
owners counts and the filters), and `user-00042`, who reads only its own ~100. Each page is
asked `--rounds` times with varied owners, cells and queries. Prints a table and writes JSON
(default bench/results/inspector.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import memory_text, query_for  # noqa: E402  (the scale benchmark's text generator)

TYPES = ["semantic", "semantic", "episodic", "procedural"]
TOPICS = ["travel", "food", "work", "family", "health"]


def build(service: Any, n: int, rng: random.Random) -> tuple[list[str], dict[str, list[str]]]:
    from ampkit.models import CellCreate

    owners = [f"user-{i:05d}" for i in range(max(1, n // 100))]
    ids: dict[str, list[str]] = {o: [] for o in owners}
    texts: dict[str, str] = {}
    batch: list[CellCreate] = []

    def flush() -> None:
        for cell in service.create_many("importer", batch):
            ids[cell.identity.owner_id].append(cell.id)
            texts[cell.id] = cell.content.text
        batch.clear()

    for i in range(n):
        owner = owners[i % len(owners)]
        batch.append(CellCreate.model_validate({
            "type": rng.choice(TYPES),
            "content": {"text": memory_text(rng), "metadata": {"topic": rng.choice(TOPICS)}},
            "identity": {"owner_id": owner, "session_id": f"{owner}-s{(i // len(owners)) // 10}"},
            "access_policy": {"readable_by": [owner]},  # each user reads its own memory
            "dedup": "off",
        }))
        if len(batch) == 500:
            flush()
    if batch:
        flush()
    return owners, {"texts": texts, **ids}  # type: ignore[dict-item]


def reload(service: Any) -> tuple[list[str], dict[str, list[str]]]:
    """owners and ids of a store built by an earlier run (`--workdir`)."""
    from ampkit.store.base import ALL_STATUSES, CellFilter

    ids: dict[str, Any] = {"texts": {}}
    for cell in service.store.scan(CellFilter(statuses=ALL_STATUSES, include_superseded=True)):
        ids.setdefault(cell.identity.owner_id, []).append(cell.id)
        ids["texts"][cell.id] = cell.content.text
    return sorted(k for k in ids if k != "texts"), ids


def percentiles(samples: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples, n=100, method="inclusive") if len(samples) > 1 else [samples[0]] * 99
    return {"p50": round(q[49], 2), "p95": round(q[94], 2), "p99": round(q[98], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--embedder", default="none", help="none (keyword search only) | default | ...")
    parser.add_argument("--workdir", default=None,
                        help="keep the store here; a store already there is reused (not rebuilt)")
    parser.add_argument("--json", default=str(Path(__file__).resolve().parent / "results" / "inspector.json"))
    args = parser.parse_args()

    from fastapi.testclient import TestClient

    from ampkit.bootstrap import build_service, load_settings
    from ampkit.server.app import create_app

    rng = random.Random(14)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="ampkit-bench-ui-"))
    workdir.mkdir(parents=True, exist_ok=True)
    reuse = (workdir / "memory.db").exists()
    settings = load_settings(env=False, store=f"sqlite:///{workdir}/memory.db", embedder=args.embedder,
                             mcp_http=False, lifecycle_interval_seconds=0, allowed_hosts="testserver")
    service = build_service(settings)
    app = create_app(settings, service)
    results: dict[str, Any] = {"n": args.n, "rounds": args.rounds, "embedder": args.embedder,
                               "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                           "load_before": os.getloadavg()}, "pages": {}}
    with TestClient(app):  # (runs the app's start-up and shutdown around the timing)
        t0 = time.perf_counter()
        owners, built = reload(service) if reuse else build(service, args.n, rng)
        texts = built.pop("texts")
        args.n = len(texts)
        results["n"] = args.n
        results["build_seconds"] = None if reuse else round(time.perf_counter() - t0, 1)
        results["db_bytes"] = sum(p.stat().st_size for p in workdir.glob("memory.db*"))
        print(f"{'reused' if reuse else 'built'} {args.n} cells for {len(owners)} owners in {time.perf_counter() - t0:.0f} s "
              f"({results['db_bytes'] / 1e6:.0f} MB)", file=sys.stderr)

        def sign_in(agent: str) -> TestClient:
            c = TestClient(app)
            token = re.search(r'name="csrf" value="([^"]+)"', c.get("/ui/signin").text)
            assert token is not None
            r = c.post("/ui/signin", data={"csrf": token.group(1), "credential": agent}, follow_redirects=False)
            assert r.status_code == 303
            return c

        def cell_of(owner: str) -> str:
            return rng.choice(built[owner])

        def pages(owner_pick: Callable[[], str]) -> dict[str, Callable[[], str]]:
            return {
                "owners": lambda: "/ui/owners",
                "owners, page 5": lambda: "/ui/owners?cursor=" + _owner_cursor(owners, 4 * 25),
                "cells": lambda: "/ui/cells",
                "cells ?owner": lambda: f"/ui/cells?owner={owner_pick()}",
                "cells ?owner&type&status": lambda: f"/ui/cells?owner={owner_pick()}&type=semantic&status=active&status=archived",
                "cells ?metadata": lambda: '/ui/cells?metadata={"topic":"' + rng.choice(TOPICS) + '"}',
                "search": lambda: "/ui/search?q=" + query_for(texts[cell_of(owner_pick())], rng),
                "search ?owner": lambda: f"/ui/search?owner={(o := owner_pick())}&q=" + query_for(texts[cell_of(o)], rng),
                "cell": lambda: f"/ui/cells/{cell_of(owner_pick())}",
                "cell edit form": lambda: f"/ui/cells/{cell_of(owner_pick())}/edit",
            }

        user = owners[min(42, len(owners) - 1)]
        callers = {"importer (reads all)": ("importer", lambda: rng.choice(owners)),
                   f"{user} (reads ~100)": (user, lambda: user)}
        for label, (agent, pick) in callers.items():
            client_for = sign_in(agent)
            for name, path_of in pages(pick).items():
                client_for.get(path_of())  # warm
                samples = []
                for _ in range(args.rounds):
                    path = path_of()
                    t = time.perf_counter()
                    r = client_for.get(path)
                    samples.append((time.perf_counter() - t) * 1000)
                    assert r.status_code == 200, (path, r.status_code, r.text[:300])
                results["pages"].setdefault(label, {})[name] = percentiles(samples)
    results["machine"]["load_after"] = os.getloadavg()
    print(f"\ninspector pages, {args.n} cells, SQLite, embedder {args.embedder}, {args.rounds} requests each "
          f"(server time in process, ms)\n")
    print(f"{'caller':26} {'page':28} {'p50':>8} {'p95':>8} {'p99':>8}")
    for label, by_page in results["pages"].items():
        for name, p in by_page.items():
            print(f"{label:26} {name:28} {p['p50']:8.1f} {p['p95']:8.1f} {p['p99']:8.1f}")
    print(f"\nload average before {results['machine']['load_before']}, after {results['machine']['load_after']}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")


def _owner_cursor(owners: list[str], index: int) -> str:
    import base64

    owner = sorted(owners)[min(index, len(owners) - 1) - 1] if index else owners[0]
    return base64.urlsafe_b64encode(owner.encode()).decode().rstrip("=")


if __name__ == "__main__":
    main()
