"""Write rate over HTTP: single-cell writes from 1 and from N concurrent clients, and batch writes.

    python bench/writes.py [--single 600] [--clients 8] [--batch-cells 20000] [--json out.json]
                           [--store URL] [--embedder default] [--server-args "..."] [--client http.client]

Starts `ampkit serve` on a free loopback port over a fresh SQLite file (or `--store`), then:
single-cell `POST /memories` from one client, then from `--clients` concurrent clients (each
its own agent and owner, in sessions of 10, like bench/scale.py), and `POST /memories/batch`
in batches of 500 cells of one owner (how an import and bench/scale.py load). Prints a table
(writes/s, p50/p95/p99 per request, and the server process's CPU time per write, the figure
that does not depend on how busy the machine is, split into its event loop's and its other
threads'; per cell for batches; the client processes' CPU time per write; how busy the whole
machine was over the phase; and the rate those CPU costs allow with every core busy, since
here the clients share the cores with the server) and checks that every acknowledged write
reads back with its text (`lost_writes` must be 0; the exit status is 1 otherwise).

Each phase ends with one search, timed with it: its writes' keyword windows are all indexed
by then (SQLite indexes a new cell's window after its commit, before any search).

Each client is a process of its own (an httpx client spends ~0.5-1 ms of CPU per request:
eight client threads in one process would be held back by their own GIL, not by the server).
Those processes share the two cores with the server; `--client http.client` sends the same
requests with the standard library's HTTP client (~0.2 ms a request), so the rate says more
about the server and less about its clients.
"""

from __future__ import annotations

import argparse
import http.client as http_client
import json
import multiprocessing
import os
import random
import shlex
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import httpx

from ampkit.tls import tls_context  # one TLS context: httpx builds one per client (~30 ms)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import Server, cell_body, memory_text  # noqa: E402  (the same memories and server helper)
from support import cpu_seconds, proc_stat, process_cpu_seconds, process_tree  # noqa: E402  (scale put tests/ on the path)


def percentiles(seconds: list[float]) -> dict[str, float]:
    if len(seconds) == 1:  # (quantiles needs two points; one batch is its own p50 and p99)
        return {f"p{k}_ms": round(seconds[0] * 1000, 2) for k in (50, 95, 99)}
    q = statistics.quantiles([s * 1000 for s in seconds], n=100, method="inclusive")
    return {"p50_ms": round(q[49], 2), "p95_ms": round(q[94], 2), "p99_ms": round(q[98], 2)}


def server_cpu_seconds(pid: int) -> float:
    """User + system CPU time of the server process and its workers so far (Linux /proc)."""
    return sum(process_cpu_seconds(member) for member in process_tree(pid))


def machine_cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine so far, every core (Linux /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def server_thread_cpu_seconds(pid: int) -> tuple[float, float]:
    """(main threads, all other threads) CPU time so far, over the server's processes. A
    process's main thread runs uvicorn's event loop (HTTP parsing, routing, validation, the
    access log); the others run the operations (the service and the store) and the store's
    background work."""
    main = other = 0.0
    for member in process_tree(pid):
        try:
            tasks = list(Path(f"/proc/{member}/task").iterdir())
        except FileNotFoundError:
            continue
        for task in tasks:
            fields = proc_stat(task / "stat")
            if fields is None:  # a thread that just ended
                continue
            seconds = cpu_seconds(fields)
            if task.name == str(member):
                main += seconds
            else:
                other += seconds
    return main, other


class ServerCPU:
    """The server's CPU time over a phase, split as `server_thread_cpu_seconds`, per write."""

    def __init__(self, pid: int):
        self.pid = pid
        self.main, self.other = server_thread_cpu_seconds(pid)

    def per_write(self, writes: int) -> dict[str, float]:
        main, other = server_thread_cpu_seconds(self.pid)
        n = max(1, writes)
        main, other = main - self.main, other - self.other
        # (an ended thread's time is lost to the split: the total is read from the process)
        return {"server_cpu_event_loop_ms_per_write": round(1000 * main / n, 3),
                "server_cpu_other_threads_ms_per_write": round(1000 * other / n, 3)}


@contextmanager
def json_poster(base: str, lean: bool) -> Iterator[Callable[[str, dict, dict], tuple[int, str]]]:
    """`post(path, body, headers) -> (status, text)` over one kept-alive connection, connected
    before it is handed out: httpx (what ampkit's client uses, ~0.5 ms of CPU a request here)
    or, `lean`, the standard library's http.client (~0.2 ms): a load generator that leaves the
    cores to the server, as clients on other machines would."""
    if not lean:
        with httpx.Client(base_url=base, timeout=60, verify=tls_context()) as http:
            http.get("/health")

            def post(path: str, body: dict, headers: dict) -> tuple[int, str]:
                r = http.post(path, json=body, headers=headers)
                return r.status_code, r.text
            yield post
        return
    url = httpx.URL(base)
    conn = http_client.HTTPConnection(url.host, url.port, timeout=60)
    prefix = url.path.rstrip("/")
    try:
        conn.request("GET", f"{prefix}/health")
        conn.getresponse().read()

        def lean_post(path: str, body: dict, headers: dict) -> tuple[int, str]:
            conn.request("POST", prefix + path, json.dumps(body), {"Content-Type": "application/json", **headers})
            r = conn.getresponse()
            return r.status, r.read().decode()
        yield lean_post
    finally:
        conn.close()


def client(base: str, tag: str, c: int, count: int, ready, start: "multiprocessing.synchronize.Event", out,
           lean: bool = False) -> None:
    """One client process: `count` writes in a row over one connection; sends back
    (latencies, acknowledged (id, owner, text), errors, its CPU seconds over the writes)."""
    owner = f"{tag}-owner-{c}"
    rng = random.Random(f"{tag}{c}")
    latencies: list[float] = []
    acked: list[tuple[str, str, str]] = []
    errors: list[str] = []
    with json_poster(base, lean) as post:
        ready.put(c)
        start.wait()
        cpu = time.process_time()
        for k in range(count):
            text = f"{memory_text(rng)} ({tag} {c}.{k})"
            t = time.perf_counter()
            status, answer = post("/memories", cell_body(owner, text, f"{owner}-s{k // 10}"), {"X-AMP-Agent-ID": owner})
            latencies.append(time.perf_counter() - t)
            if status != 201:
                errors.append(f"{status}: {answer[:200]}")
                continue
            acked.append((json.loads(answer)["id"], owner, text))
        cpu = time.process_time() - cpu
    out.put((latencies, acked, errors, cpu))


def searchable(base: str, owner: str) -> None:
    """One search, counted in the phase: a SQLite store indexes the keyword windows of new
    cells after their commit, and before any search (docs/deployment.md#keyword-windows-after-the-commit-sqlite),
    so the phase's time and CPU include every write's indexing."""
    httpx.post(f"{base}/memories/search", json={"query": "note", "owner_id": owner},
               headers={"X-AMP-Agent-ID": owner}, timeout=300, verify=tls_context()).raise_for_status()


def single_writes(server: Server, clients: int, total: int, tag: str, acked: dict[str, tuple[str, str]],
                  lean: bool = False) -> dict:
    """`total` single-cell writes split over `clients` client processes (`lean`: http.client)."""
    ctx = multiprocessing.get_context("spawn")
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=client, args=(server.base, tag, c, total // clients, ready, start, out, lean))
             for c in range(clients)]
    for p in procs:
        p.start()
    for _ in procs:  # every process has imported and connected (8 spawned processes take ~2 s here)
        ready.get(timeout=120)
    cpu = server_cpu_seconds(server.proc.pid)
    split = ServerCPU(server.proc.pid)
    machine = machine_cpu_jiffies()
    started = time.perf_counter()
    start.set()
    latencies: list[float] = []
    errors: list[str] = []
    client_cpu = 0.0
    for _ in procs:
        lat, ok, err, used = out.get()
        client_cpu += used
        latencies.extend(lat)
        errors.extend(err)
        for cid, owner, text in ok:
            acked[cid] = (owner, text)
    searchable(server.base, f"{tag}-owner-0")
    elapsed = time.perf_counter() - started
    cpu = server_cpu_seconds(server.proc.pid) - cpu
    busy, ticks = (now - then for now, then in zip(machine_cpu_jiffies(), machine))
    for p in procs:
        p.join()
    n = max(1, len(latencies))
    return {"clients": clients, "writes": len(latencies), "errors": len(errors), "first_error": errors[:1],
            "writes_per_s": round(len(latencies) / elapsed, 1), **percentiles(latencies),
            "server_cpu_ms_per_write": round(1000 * cpu / n, 2), **split.per_write(len(latencies)),
            "client_cpu_ms_per_write": round(1000 * client_cpu / n, 2),
            # How busy every core was over the phase, and the rate these CPU costs would allow
            # with every core busy on nothing else: the server and its clients share the cores.
            "machine_busy": round(busy / max(1, ticks), 2),
            "cpu_bound_writes_per_s": round((os.cpu_count() or 1) * n / max(1e-9, cpu + client_cpu), 1)}


def batch_writes(server: Server, cells: int, acked: dict[str, tuple[str, str]]) -> dict:
    """Batches of 500 cells of one owner (about 100 cells per owner, sessions of 10)."""
    base = server.base
    cpu = server_cpu_seconds(server.proc.pid)
    split = ServerCPU(server.proc.pid)
    rng = random.Random(42)
    latencies: list[float] = []
    owners = max(1, cells // 100)
    with httpx.Client(base_url=base, timeout=300, verify=tls_context()) as http:
        started = time.perf_counter()
        done = 0
        while done < cells:
            owner = f"batch-owner-{(done // 100) % owners:05d}"
            n = min(500, cells - done)
            texts = [f"{memory_text(rng)} (batch {done + j})" for j in range(n)]
            body = {"cells": [cell_body(owner, t, f"{owner}-s{(done + j) // 10}") for j, t in enumerate(texts)]}
            t = time.perf_counter()
            r = http.post("/memories/batch", json=body, headers={"X-AMP-Agent-ID": owner})
            latencies.append(time.perf_counter() - t)
            r.raise_for_status()
            for cell, text in zip(r.json()["results"], texts):
                acked[cell["id"]] = (owner, text)
            done += n
        searchable(base, f"batch-owner-{(done - 1) // 100 % owners:05d}")
        elapsed = time.perf_counter() - started
    cpu = server_cpu_seconds(server.proc.pid) - cpu
    return {"cells": cells, "batches": len(latencies), "cells_per_s": round(cells / elapsed, 1),
            "cells_per_batch": min(500, cells), **percentiles(latencies),
            "server_cpu_ms_per_cell": round(1000 * cpu / max(1, cells), 3),
            **{k.replace("per_write", "per_cell"): v for k, v in split.per_write(cells).items()}}


def lost_writes(base: str, acked: dict[str, tuple[str, str]]) -> int:
    by_owner: dict[str, dict[str, str]] = {}
    for cid, (owner, text) in acked.items():
        by_owner.setdefault(owner, {})[cid] = text
    lost = 0
    with httpx.Client(base_url=base, timeout=300, verify=tls_context()) as http:
        for owner, cells in by_owner.items():
            r = http.get("/export", params={"owner_id": owner}, headers={"X-AMP-Agent-ID": owner})
            r.raise_for_status()
            found = {c["id"]: c["content"]["text"] for c in r.json()["cells"]}
            lost += sum(1 for cid, text in cells.items() if found.get(cid) != text)
    return lost


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--single", type=int, default=600, help="single-cell writes per phase")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--batch-cells", type=int, default=20000)
    parser.add_argument("--store", default=None, help="store URL [default: a temporary SQLite file]")
    parser.add_argument("--embedder", default="default")
    parser.add_argument("--server-args", default="", help="extra `ampkit serve` arguments")
    parser.add_argument("--client", choices=("httpx", "http.client"), default="httpx",
                        help="the single-write clients' HTTP library: httpx (as ampkit's client) or the "
                             "standard library's, a leaner load generator [default: httpx]")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="ampkit-writes-") as tmp:
        store = args.store or f"sqlite:///{tmp}/writes.db"
        server = Server(store, args.embedder, Path(tmp) / "server.log", extra=shlex.split(args.server_args))
        acked: dict[str, tuple[str, str]] = {}
        try:
            lean = args.client == "http.client"
            single_writes(server, 1, 50, "warmup", acked, lean)
            result: dict = {
                "store": store.split(":")[0], "embedder": args.embedder, "server_args": args.server_args, "client": args.client,
                "single_1_client": single_writes(server, 1, args.single, "one", acked, lean),
                f"single_{args.clients}_clients": single_writes(server, args.clients, args.single, "many", acked, lean),
                "batch": batch_writes(server, args.batch_cells, acked) if args.batch_cells else None,
            }
            result["acked_writes"] = len(acked)
            result["lost_writes"] = lost_writes(server.base, acked)
        finally:
            server.stop()
    result["machine"] = {"cpus": os.cpu_count(), "loadavg_at_start": load_at_start,
                         "loadavg_at_end": [round(x, 2) for x in os.getloadavg()]}
    print(f"writes over HTTP: store {result['store']}, embedder {result['embedder']}, clients {args.client} {args.server_args}")
    print("| phase | clients | writes/s | p50 ms | p95 ms | p99 ms | server CPU ms/write | of which event loop / other threads "
          "| client CPU ms/write | machine busy | CPU-bound writes/s |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for name in ("single_1_client", f"single_{args.clients}_clients"):
        p = result[name]
        print(f"| {name} | {p['clients']} | {p['writes_per_s']} | {p['p50_ms']} | {p['p95_ms']} | {p['p99_ms']} "
              f"| {p['server_cpu_ms_per_write']} | {p['server_cpu_event_loop_ms_per_write']} / "
              f"{p['server_cpu_other_threads_ms_per_write']} | {p['client_cpu_ms_per_write']} "
              f"| {round(100 * p['machine_busy'])}% | {p['cpu_bound_writes_per_s']} |")
    if result["batch"]:
        b = result["batch"]
        print(f"| batches of {b['cells_per_batch']} (cells/s; CPU per cell) | 1 | {b['cells_per_s']} | {b['p50_ms']} "
              f"| {b['p95_ms']} | {b['p99_ms']} | {b['server_cpu_ms_per_cell']} | {b['server_cpu_event_loop_ms_per_cell']} / "
              f"{b['server_cpu_other_threads_ms_per_cell']} | | | |")
    print(f"acked {result['acked_writes']}, lost {result['lost_writes']}; machine {result['machine']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if result["lost_writes"] else 0


if __name__ == "__main__":
    sys.exit(main())
