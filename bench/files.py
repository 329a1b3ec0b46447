"""Memory files: service time per operation on a SQLite store, p50/p95/p99 and throughput.

    python bench/files.py [--files 200] [--episodes 2000] [--rounds 200] [--json out.json]

Builds one owner's folder of `--files` knowledge files (about 40 lines each), an AGENTS.md,
skills, and `--episodes` episodic cells in sessions of 20 (the read-only sessions/*.md), then
times, in process (the service, no HTTP): list, read (a 100-line page), grep (literal, whole
folder), search (BM25 over sections; `--embedder` adds the dense leg), write in yolo mode,
edit in review mode (a proposal) and approve. Prints a table; writes JSON (default
bench/results/files.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

WORDS = ("deploy rollback runbook invoice vendor glossary latency budget owner review release policy "
         "incident customer travel contract renewal backlog metric dashboard").split()


def text(rng: random.Random, lines: int) -> str:
    out = []
    for i in range(lines):
        if i % 10 == 0:
            out.append(f"# {rng.choice(WORDS).title()} {i // 10}")
        out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))))
    return "\n".join(out) + "\n"


def timed(fn: Callable[[int], Any], rounds: int) -> dict[str, float]:
    samples = []
    for i in range(rounds):
        start = time.perf_counter()
        fn(i)
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    q = statistics.quantiles(samples, n=100)
    return {"p50_ms": round(q[49], 3), "p95_ms": round(q[94], 3), "p99_ms": round(q[98], 3),
            "ops_per_s": round(rounds / (sum(samples) / 1000), 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--embedder", default="none")
    parser.add_argument("--json", default="bench/results/files.json")
    args = parser.parse_args()

    from ampkit.bootstrap import build_service, load_settings
    from ampkit.files import ApprovalMode, FileEdit, FileSearchRequest, FileWrite
    from ampkit.models import CellCreate

    rng = random.Random(7)
    tmp = tempfile.mkdtemp(prefix="ampkit-bench-files-")
    service = build_service(load_settings(store=f"sqlite:///{tmp}/files.db", embedder=args.embedder))
    service.store.open()
    files, owner = service.files, "agent-1"
    files.set_approval_mode("bench", ApprovalMode(owner_id=owner, approval_mode="yolo"))
    files.write(owner, FileWrite(owner_id=owner, path="AGENTS.md", content="# Rules\n- use bullet points\n"))
    for n in range(args.files):
        files.write(owner, FileWrite(owner_id=owner, path=f"kb/{n:04d}.md", content=text(rng, 40)))
    reqs = [CellCreate.model_validate({"type": "episodic", "content": {"text": " ".join(rng.choices(WORDS, k=12))},
                                       "identity": {"owner_id": owner, "session_id": f"s{n // 20}"}, "dedup": "off"})
            for n in range(args.episodes)]
    for i in range(0, len(reqs), 500):
        service.create_many(owner, reqs[i:i + 500])

    r = args.rounds
    results = {
        "list": timed(lambda i: files.list(owner, owner), r),
        "read_100_lines": timed(lambda i: files.read(owner, owner, f"kb/{i % args.files:04d}.md", 0, 100), r),
        "grep": timed(lambda i: files.grep(owner, owner, rng.choice(WORDS)), max(r // 4, 20)),
        "search": timed(lambda i: files.search(owner, FileSearchRequest(owner_id=owner, query=" ".join(rng.choices(WORDS, k=3)))),
                        max(r // 4, 20)),
        "write_yolo": timed(lambda i: files.write(owner, FileWrite(owner_id=owner, path=f"kb/{i % args.files:04d}.md",
                                                                     content=text(rng, 40))), r),
    }
    files.set_approval_mode("bench", ApprovalMode(owner_id=owner, approval_mode="review"))
    proposals: list[str] = []

    def propose(i: int) -> None:
        current = files.read(owner, owner, f"kb/{i:04d}.md").content
        first = current.splitlines()[1]
        proposals.append(files.edit(owner, FileEdit(owner_id=owner, path=f"kb/{i:04d}.md", old=first,
                                                    new=first + " (edited)")).proposal_id or "")
    rounds = min(r, args.files)
    results["edit_review_proposal"] = timed(propose, rounds)
    results["approve"] = timed(lambda i: files.approve("human:bench", proposals[i], may_approve=True), rounds)
    service.store.close()

    print(f"files={args.files} episodes={args.episodes} (sessions={args.episodes // 20}) embedder={args.embedder}")
    print(f"{'operation':<22}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}{'ops/s':>10}")
    for name, row in results.items():
        print(f"{name:<22}{row['p50_ms']:>10}{row['p95_ms']:>10}{row['p99_ms']:>10}{row['ops_per_s']:>10}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"params": vars(args), "machine": {"python": platform.python_version(),
                                                                  "cpus": os.cpu_count()}, "results": results},
                              indent=2))


if __name__ == "__main__":
    main()
