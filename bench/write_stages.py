"""Where a single-cell create's CPU time goes in the service and the SQLite store (no HTTP).

    python bench/write_stages.py [--creates 2000] [--preload 300] [--embedder default] [--json out.json]

Builds the service as the server does (`ampkit.bootstrap`) over a fresh SQLite file, writes
`--preload` single-cell creates (8 owners, sessions of 10 turns, like bench/writes.py), then
times `--creates` more, one at a time, and prints the CPU time of the calling thread per create
in each stage (each stage's method wrapped with `time.thread_time`), the rest (BEGIN, COMMIT
with its WAL writes, savepoints, group commit) by difference, and the pages each commit writes
to the WAL. A single create's keyword windows are indexed after its commit by the store's
windows thread (`index_pending_windows`, 50 ms later, many creates in one pass), and so is its
vector (one embedding call a pass): that thread's CPU time is its own table, per create. bench/writes.py measures the same creates over HTTP
(the event loop's share is there); this script says what the store's threads spend theirs on.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import sqlite3
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import cell_body, memory_text  # noqa: E402  (the same memories)

from ampkit import service as service_module  # noqa: E402
from ampkit.bootstrap import build_service, load_settings  # noqa: E402
from ampkit.models import CellCreate  # noqa: E402
from ampkit.retrieval import Retriever  # noqa: E402
from ampkit.store import sqlite as sqlite_module  # noqa: E402
from ampkit.store.sqlite_changes import ChangeFeed  # noqa: E402

# (label, owner object, attribute, nested in): nested stages are part of their parent's time.
STAGES: list[tuple[str, Any, str, Optional[str]]] = [
    ("build the cell (models, id, size check)", service_module.MemoryService, "_build", None),
    ("embed the text (only for a near-duplicate check; else the windows pass embeds it)", Retriever, "vectors_for", None),
    ("exact-duplicate check (one reader query)", service_module.MemoryService, "_duplicates", None),
    ("store the cell (row, readers, history)", service_module.MemoryService, "_store_created", None),
    ("  of which: INSERT of the row and its readers", sqlite_module._SQLiteWriteTx, "insert", "store"),
    ("  of which: history row", sqlite_module._SQLiteWriteTx, "add_history", "store"),
    ("before COMMIT: list the new row for the windows pass (flush)", sqlite_module._SQLiteWriteTx, "flush", None),
    ("changes for the in-memory caches", ChangeFeed, "collect", None),
]
# The windows thread's pass (after the commit; the calling thread does not wait for it).
WINDOWS_STAGES: list[tuple[str, Any, str, Optional[str]]] = [
    ("keyword windows pass (BEGIN to COMMIT)", sqlite_module.SQLiteStore, "index_pending_windows", None),
    ("  of which: take the pending rows, find the windows they change", sqlite_module._SQLiteWriteTx, "take_pending", "pass"),
    ("    of which: embed the new rows' texts (one call a pass)", sqlite_module._SQLiteWriteTx, "_embed_new", "take"),
    ("  of which: rewrite the windows (flush)", sqlite_module._SQLiteWriteTx, "flush", "pass"),
    ("    of which: read the windows' texts", sqlite_module._SQLiteWriteTx, "_windows", "flush"),
    ("    of which: tokenize new texts (FTS5 temp index)", sqlite_module, "tokenize", "flush"),
]
WINDOWS_THREAD = "ampkit-sqlite.windows"  # (the scheduler names its threads ampkit-<loop>)


def wrap(owner: Any, name: str, spent: Counter, labels: dict[bool, str]) -> Callable[[], None]:
    """Time `owner.name` with the CPU clock of the thread running it, under the label of that
    thread (labels[True] in the windows thread, labels[False] in any other)."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent[labels[threading.current_thread().name == WINDOWS_THREAD]] += time.thread_time() - started

    setattr(owner, name, timed)
    return lambda: setattr(owner, name, original)


def wal_pages(path: str) -> list[int]:
    """Page numbers of the frames in a WAL file, in order."""
    data = Path(path).read_bytes()
    page_size = struct.unpack(">I", data[8:12])[0] if len(data) >= 32 else 4096
    pages, offset = [], 32
    while offset + 24 + page_size <= len(data):
        pages.append(struct.unpack(">I", data[offset : offset + 4])[0])
        offset += 24 + page_size
    return pages


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=2000)
    parser.add_argument("--preload", type=int, default=300)
    parser.add_argument("--embedder", default="default")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rng = random.Random(1)
    total = args.preload + args.creates
    reqs = [CellCreate.model_validate(cell_body(f"owner-{k % 8}", f"{memory_text(rng)} ({k})", f"owner-{k % 8}-s{k // 80}"))
            for k in range(total)]
    with tempfile.TemporaryDirectory(prefix="ampkit-stages-") as tmp:
        path = os.path.join(tmp, "stages.db")
        service = build_service(load_settings(env=False, store=f"sqlite:///{path}", embedder=args.embedder))
        store = service.store
        store.open()
        try:
            for req in reqs[: args.preload]:
                service.create_many_detailed(req.identity.owner_id, [req])
            # The WAL of the timed creates alone: no checkpoint copies it back meanwhile.
            store._stop_checkpointer()  # type: ignore[attr-defined]
            writer = store._writer  # type: ignore[attr-defined]
            writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            writer.execute("PRAGMA wal_autocheckpoint = 0")
            spent: Counter = Counter()
            labels: dict[tuple[Any, str], dict[bool, str]] = {}
            for label, owner, name, _ in STAGES:
                labels.setdefault((owner, name), {})[False] = label
            for label, owner, name, _ in WINDOWS_STAGES:
                labels.setdefault((owner, name), {})[True] = label
            undo = [wrap(owner, name, spent, {False: "", True: "", **by}) for (owner, name), by in labels.items()]
            try:
                started_cpu, started = time.thread_time(), time.perf_counter()
                for req in reqs[args.preload :]:
                    service.create_many_detailed(req.identity.owner_id, [req])
                cpu, wall = time.thread_time() - started_cpu, time.perf_counter() - started
                # The windows thread's last pass, PENDING_WINDOWS_DELAY_S after the last commit.
                deadline = time.monotonic() + 30
                while store._query("SELECT EXISTS (SELECT 1 FROM pending_windows)")[0][0]:  # type: ignore[attr-defined]
                    if time.monotonic() > deadline:
                        raise RuntimeError("the windows thread did not index the new cells within 30 s")
                    time.sleep(0.01)
                store._stop_windows_thread()  # type: ignore[attr-defined]  # waits for a pass under way
            finally:
                for restore in undo:
                    restore()
            pages = wal_pages(path + "-wal")
            reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                owner_of = dict(reader.execute("SELECT pageno, name FROM dbstat"))
            except sqlite3.Error:  # no dbstat in this SQLite build
                owner_of = {}
            reader.close()
        finally:
            store.close()
    n = args.creates
    per = {label: 1000 * spent[label] / n for label, *_ in STAGES}
    top = sum(per[label] for label, _, _, nested in STAGES if nested is None)
    cpu_ms = 1000 * cpu / n
    rows = [(label, per[label]) for label, *_ in STAGES]
    rows.append(("rest: BEGIN, COMMIT (WAL writes), savepoint, group commit", cpu_ms - top))
    windows_rows = [(label, 1000 * spent[label] / n) for label, *_ in WINDOWS_STAGES]
    by_table = Counter(owner_of.get(p, "?") for p in pages)
    result = {
        "creates": n, "preload": args.preload, "embedder": args.embedder,
        "cpu_ms_per_create": round(cpu_ms, 3), "wall_ms_per_create": round(1000 * wall / n, 3),
        "stages_ms_per_create": {label.strip(): round(ms, 3) for label, ms in rows},
        "windows_thread_ms_per_create": {label.strip(): round(ms, 3) for label, ms in windows_rows},
        "wal_pages_per_create": round(len(pages) / n, 2),
        "wal_pages_per_create_by_table": {k: round(v / n, 2) for k, v in by_table.most_common()},
        "machine": {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]},
    }
    print(f"single-cell creates in process (no HTTP), SQLite, embedder {args.embedder}, after {args.preload}")
    print(f"CPU {result['cpu_ms_per_create']} ms per create (wall {result['wall_ms_per_create']} ms); "
          f"{result['wal_pages_per_create']} WAL pages per commit")
    print("| stage | CPU ms per create | share |\n|---|---|---|")
    for label, ms in rows:
        print(f"| {label} | {ms:.3f} | {100 * ms / cpu_ms:.0f}% |")
    print("and in the windows thread, after the commits (CPU ms per create):\n| stage | CPU ms per create |\n|---|---|")
    for label, ms in windows_rows:
        print(f"| {label} | {ms:.3f} |")
    if by_table:
        print("WAL pages per commit by table/index: " + ", ".join(f"{k} {v}" for k, v in result["wal_pages_per_create_by_table"].items()))
    print(f"machine {result['machine']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
