"""Scale benchmark: N short memories across many owners, a real server on loopback.

    python bench/scale.py --n 100000 [--json out.json] [--store URL] [--embedder default]

Loads N generated memories (about 100 per owner, in sessions of 10; each readable by its
owner, its owner's team of a tenth of the owners, and an "analyst") through POST
/memories/batch, then times searches over HTTP, each with a planted target memory and its
hit@10 (the target, or a cell with its exact text, in the top 10) beside the latency: an
owner's search for words of the target (owner_words) or a paraphrased question
(owner_paraphrase); a team member's search across its team's owners (team_words); the
analyst's search across every owner (broad_words, broad_paraphrase: past 200,000 vectors the
approximate index serves these), broad_words once more (broad_words_again: the first pass is
each word's first use by the analyst's admitted set), and the analyst's again right after an import of a tenth as
many cells into the served store (broad_words_after_an_import; its first search, which takes
in what the import changed, timed alone), and the same through a second server on the store
while the import goes through the first (broad_words_after_an_import_through_another_server:
replicas, which learn of each other's writes only from the store). Then single-cell writes from one client and from 8
concurrent clients (bench/writes.py's: each client a process), batch writes, bytes per cell
on disk, the server's resident memory, and after a restart the time from process start to
the first answered search (then the first broad one's, from its request and from process
start), every acknowledged single write read back by the restarted server (`lost_writes`
must be 0; the exit status is 1 otherwise), the longest any request (`/health`, every 20 ms)
waited while the restarted server warmed up, and the reader-wide searches again once the
restarted server is warm (the server that grew by writes beside one that opened the full
store); on SQLite the restart once more without the access snapshot the stop saved beside the
file (what a restart with none to resume costs). The store defaults to a temporary SQLite file; `--store postgresql://...` measures
PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import httpx

from ampkit.tls import tls_context  # one TLS context: httpx builds one per client (~30 ms)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support import free_port, process_cpu_seconds, process_rss_kb  # noqa: E402  (the test helpers: a free loopback port, /proc)

NAMES = ["Alice", "Bruno", "Chen", "Dara", "Emeka", "Farah", "Goran", "Hana", "Ivan", "Jun", "Kemal", "Lena",
         "Mateo", "Noor", "Olga", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Viktor", "Wen", "Yusuf"]
PLACES = ["Lisbon", "Osaka", "Nairobi", "Toronto", "Krakow", "Lima", "Hanoi", "Oslo", "Austin", "Cairo",
          "the office", "the gym", "the lake house", "the airport", "the new flat"]
THINGS = ["window seats", "oat milk", "dark roast coffee", "morning meetings", "vegetarian food", "jazz",
          "printed boarding passes", "standing desks", "quiet hotels", "trail running", "spicy ramen",
          "sci-fi novels", "early flights", "the blue notebook", "async standups", "pour-over coffee"]
EVENTS = ["started piano lessons", "moved to a new team", "adopted a rescue dog", "booked a trip",
          "finished the quarterly report", "signed the lease", "ran a half marathon", "lost the car keys",
          "renewed the passport", "switched to the night shift", "planted tomatoes", "fixed the bike"]
MONTHS = ["January", "March", "April", "June", "August", "October", "November", "December"]
TEMPLATES = [
    "{name} prefers {thing} when travelling to {place}",
    "{name} {event} in {month}",
    "{name} said the meeting about {thing} moved to {place}",
    "Remind {name} that {thing} are available at {place}",
    "{name}'s sister {event} last {month}",
    "{name} dislikes {thing} and avoids {place} on Mondays",
    "The user {event} near {place} with {name}",
    "{name} asked to order {thing} for the team in {month}",
]


def memory_text(rng: random.Random) -> str:
    return memory_fact(rng)[0]


def memory_fact(rng: random.Random) -> tuple[str, str]:
    """A memory and a paraphrased question about it that shares as few words as the
    templates allow (the name and the place stay: they are what a user would ask about)."""
    i = rng.randrange(len(TEMPLATES))
    slots = dict(name=rng.choice(NAMES), place=rng.choice(PLACES), thing=rng.choice(THINGS),
                 event=rng.choice(EVENTS), month=rng.choice(MONTHS))
    return TEMPLATES[i].format(**slots), PARAPHRASES[i].format(**slots)


PARAPHRASES = [
    "what does {name} like on trips to {place}",
    "what happened with {name} during {month}",
    "where is the {thing} discussion for {name} now",
    "where can {name} get {thing}",
    "what did the sibling of {name} do",
    "what does {name} not like",
    "who was with the user at {place}",
    "what should be bought for the group, according to {name}",
]


def query_for(text: str, rng: random.Random) -> str:
    words = [w for w in text.replace("'s", "").split() if len(w) > 3]
    return " ".join(rng.sample(words, min(3, len(words))))


def percentiles(samples: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return {"p50": round(q[49], 2), "p95": round(q[94], 2), "p99": round(q[98], 2)}


def search(http: httpx.Client, item: dict, **fields: Any) -> httpx.Response:
    """One search of a workload item: its agent's, its body with `fields` set."""
    return http.post("/memories/search", json={**item["body"], **fields}, headers={"X-AMP-Agent-ID": item["agent"]})


def wait_until_warm(http: httpx.Client, started: float, limit_s: float = 3600) -> tuple[float, float]:
    """Until the server's /health (asked every 20 ms) says its warm-ups are done (the vector
    index built and drained, the wide keyword arrays not warming); the longest a /health
    answer took meanwhile (how long a request waits while the warm-ups run) and when it was
    asked, in seconds from `started`."""
    t0, longest = time.perf_counter(), (0.0, 0.0)
    while time.perf_counter() - t0 < limit_s:
        t = time.perf_counter()
        index = http.get("/health").json().get("vector_index", {})
        longest = max(longest, (time.perf_counter() - t, t - started))
        # ("none" on PostgreSQL, whose vectors stay in the database: nothing to load)
        if index.get("state") in ("ready", "none") and index.get("approximate") != "building" \
                and not index.get("approximate_backlog") and index.get("keyword_warmup") != "warming":
            break
        time.sleep(0.02)
    return longest


def first_searches(server: "Server", http: httpx.Client, workloads: dict,
                   seen: Optional[set[str]] = None) -> dict[str, float]:
    """A just started server's first owner search, then its first reader-wide one, timed from
    the process start (seconds); their agents added to `seen` (see `timed_searches`)."""
    first, done = {}, {}
    for name in ("owner_words", "broad_words"):
        item = workloads[name][0]
        if seen is not None:
            seen.add(item["agent"])
        t = time.perf_counter()
        search(http, item).raise_for_status()
        done[name] = time.perf_counter()
        first[name] = round(done[name] - (server.started if name == "owner_words" else t), 2)
    return {
        "process_start_to_ready": round(server.ready - server.started, 2),
        "process_start_to_first_owner_search": first["owner_words"],
        "then_first_broad_search": first["broad_words"],  # from its request, sent once the owner's was answered
        "process_start_to_first_broad_search": round(done["broad_words"] - server.started, 2),
    }


class Server:
    def __init__(self, store_url: str, embedder: str, log: Path, extra: Sequence[str] = ()):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}/amp/v1"
        env = {**os.environ, "AMPKIT_EMBEDDER": embedder}
        cmd = [sys.executable, "-m", "ampkit.cli", "serve", "--port", str(self.port), "--store", store_url,
               "--lifecycle-interval", "0", *extra]
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base}/health", timeout=1, verify=tls_context()).status_code == 200:
                    self.ready = time.perf_counter()
                    return
            except httpx.HTTPError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"server did not start; see {log}")

    def rss_mb(self) -> float:
        return round(process_rss_kb(self.proc.pid) / 1024, 1)

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the server process has used so far: beside a rate
        measured on a shared machine, the cost that does not depend on the others' load."""
        return process_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


TEAMS = 10  # every cell is readable by its owner's team ("team-<owner % 10>") and by "analyst"


def cell_body(owner: str, text: str, session: str, team: Optional[int] = None) -> dict:
    body: dict = {"content": {"text": text}, "identity": {"owner_id": owner, "session_id": session}}
    if team is not None:
        body["access_policy"] = {"readable_by": [f"team-{team}", "analyst"]}
    return body


def timed_searches(http: httpx.Client, workload: list[dict], seen: set[str]) -> tuple[dict, float, Optional[dict]]:
    """Each search timed over HTTP; (latency percentiles, share of searches whose planted
    target, or a cell with its exact text, is in the top 10, and the latency of each reader's
    first search on this server). A reader not in `seen` (the agents this server has
    answered; updated) first searches once, timed apart: a wide reader's first search reads
    which cells it may read (once per reader and server; on PostgreSQL at 1M ~0.4-0.5 s, which
    had been the team rows' p99 when a few teams' first searches fell among the timed ones)."""
    first_ms = []
    for item in workload:
        if item["agent"] not in seen:
            seen.add(item["agent"])
            t = time.perf_counter()
            search(http, item).raise_for_status()
            first_ms.append((time.perf_counter() - t) * 1000)
    for item in workload[:10]:  # warm-up
        search(http, item)
    ms, hits = [], 0
    for item in workload:
        t = time.perf_counter()
        r = search(http, item, limit=10)
        ms.append((time.perf_counter() - t) * 1000)
        r.raise_for_status()
        results = r.json()["results"]
        hits += any(h["id"] == item["target"] or h["content"]["text"] == item["text"] for h in results)
    first = None
    if first_ms:  # (one reader: its one time, and no spread)
        spread = percentiles(first_ms) if len(first_ms) > 1 else {"p50": round(first_ms[0], 2), "p95": None, "p99": None}
        first = {**spread, "max": round(max(first_ms), 2), "readers": len(first_ms)}
    return percentiles(ms), round(hits / len(workload), 3), first


def searches_after_writes(http: httpx.Client, workload: list[dict], owners: list[str]) -> tuple[dict, float]:
    """`timed_searches` of team readers, each right after a single write by an owner of the
    searching team, readable by it (the write not timed)."""
    ms, hits = [], 0
    for i, item in enumerate(workload):
        team = int(item["agent"].rsplit("-", 1)[1])
        owner = owners[team + TEAMS * (i % max(1, len(owners) // TEAMS))]
        http.post("/memories", json=cell_body(owner, f"Noted {i}: the shuttle leaves at {i % 12 + 1} pm", f"{owner}-live", team=team),
                  headers={"X-AMP-Agent-ID": owner}).raise_for_status()
        t = time.perf_counter()
        r = search(http, item, limit=10)
        ms.append((time.perf_counter() - t) * 1000)
        r.raise_for_status()
        hits += any(h["id"] == item["target"] or h["content"]["text"] == item["text"] for h in r.json()["results"])
    return percentiles(ms), round(hits / len(workload), 3)


def searches_after_an_import(http: httpx.Client, workload: list[dict], cells: int, rng: random.Random,
                              searcher: Optional[httpx.Client] = None, prefix: str = "import") -> dict:
    """`cells` more memories imported into the served store (new owners, in batches of 500 as
    the load), then the reader-wide searches of `workload` (its readers' first searches done):
    the first one timed alone from the import's end (it takes in what the import changed: the
    new vectors and the cached words' rows), then all of them as `timed_searches` does.
    `searcher`: the searches through another server on the same store (the import through `http`)."""
    owners = [f"{prefix}-{i:05d}" for i in range(max(1, cells // 100))]
    searcher = searcher or http
    t0 = time.perf_counter()
    for _, by_owner in plan_batches(fact_plan(cells, owners, rng), owners):
        post_batches(http, by_owner)
    import_s = time.perf_counter() - t0
    t = time.perf_counter()
    search(searcher, workload[0], limit=10).raise_for_status()
    first_ms = (time.perf_counter() - t) * 1000
    lat, hit, _ = timed_searches(searcher, workload, {item["agent"] for item in workload})
    return {"cells": cells, "cells_per_s": round(cells / import_s, 1), "first_search_ms": round(first_ms, 1),
            **lat, "hit@10": hit, "queries": len(workload)}


def post_batches(http: httpx.Client, by_owner: dict[str, list[tuple[dict, str, str]]]) -> list[tuple[str, list, list[dict]]]:
    """One chunk of a `plan_batches` load: each owner's cells in one POST /memories/batch, as
    that owner; per owner, (owner, its rows, the created cells)."""
    created = []
    for owner, rows in by_owner.items():
        r = http.post("/memories/batch", json={"cells": [b for b, _, _ in rows]}, headers={"X-AMP-Agent-ID": owner})
        r.raise_for_status()
        created.append((owner, rows, r.json()["results"]))
    return created


def fact_plan(n: int, owners: list[str], rng: random.Random) -> list[tuple[int, str, str]]:
    """n templated memories spread over `owners`: (owner index, text, paraphrase), by owner."""
    plan = [(i % len(owners), *memory_fact(rng)) for i in range(n)]
    plan.sort(key=lambda p: p[0])
    return plan


def plan_batches(plan: list[tuple[int, str, str]], owners: list[str]) -> Iterator[tuple[int, dict[str, list[tuple[dict, str, str]]]]]:
    """The bulk load of a `fact_plan`, in chunks of 500 cells (how an import runs): per chunk,
    the cells loaded once it is done and, per owner, its (request body, text, paraphrase):
    one batch request each. Sessions of 10 cells; each owner's team may read its cells."""
    for i in range(0, len(plan), 500):
        chunk = plan[i : i + 500]
        by_owner: dict[str, list[tuple[dict, str, str]]] = {}
        for j, (o, text, para) in enumerate(chunk):
            owner = owners[o]
            body = cell_body(owner, text, f"{owner}-s{(i + j) // 10}", team=o % TEAMS)
            by_owner.setdefault(owner, []).append((body, text, para))
        yield i + len(chunk), by_owner


def run(n: int, store_url: str, embedder: str, queries: int, workdir: Path) -> dict:
    rng = random.Random(42)
    owners = [f"user-{i:05d}" for i in range(max(1, n // 100))]
    server = Server(store_url, embedder, workdir / "server.log")
    facts: dict[str, list[tuple[str, str, str]]] = {o: [] for o in owners}  # owner -> (id, text, paraphrase)
    result: dict = {"n": n, "owners": len(owners), "embedder": embedder}
    try:
        http = httpx.Client(base_url=server.base, timeout=300, verify=tls_context())
        # ---- bulk load, in batches of 500 cells of one owner each (how an import runs)
        plan = fact_plan(n, owners, rng)
        cpu0 = server.cpu_s()
        t0 = time.perf_counter()
        for batch, (done, by_owner) in enumerate(plan_batches(plan, owners)):
            for owner, rows, created in post_batches(http, by_owner):
                for cell, (_, text, para) in zip(created, rows):
                    facts[owner].append((cell["id"], text, para))
            if batch % 200 == 0:
                print(f"  {done} cells, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        batch_s = time.perf_counter() - t0
        result["batch_writes_per_s"] = round(n / batch_s, 1)
        result["batch_server_cpu_ms_per_cell"] = round(1000 * (server.cpu_s() - cpu0) / n, 3)
        result["loadavg_after_load"] = [round(x, 2) for x in os.getloadavg()]
        print(f"loaded {n} cells in {batch_s:.1f} s ({n / batch_s:.0f} cells/s, server CPU "
              f"{result['batch_server_cpu_ms_per_cell']} ms/cell, load {result['loadavg_after_load']})", file=sys.stderr)

        # ---- the approximate index: past its threshold the first wide search starts building
        # it in the background (wide searches are keyword-only meanwhile, `dense_warming` in
        # explain), and in a store grown past its threshold by writes, the keyword warm-up (the
        # common words' term rows, `keyword_warmup` in /health). The timed searches below
        # measure the built index and the warmed words, and both times are reported beside them.
        result["health_after_load"] = http.get("/health").json()
        t0 = time.perf_counter()
        http.post("/memories/search", json={"query": "window seats"}, headers={"X-AMP-Agent-ID": "analyst"}).raise_for_status()
        ready: dict[str, Optional[float]] = {"approximate": None, "keyword_warmup": None}
        while time.perf_counter() - t0 < 3600:
            index = http.get("/health").json().get("vector_index", {})
            for key, busy in (("approximate", "building"), ("keyword_warmup", "warming")):
                if ready[key] is None and index.get(key) != busy:
                    ready[key] = round(time.perf_counter() - t0, 1)
            if None not in ready.values():
                break
            time.sleep(1)
        result["ann_ready_after_load_s"] = ready["approximate"]
        result["keyword_warmup_after_load_s"] = ready["keyword_warmup"]
        print(f"  approximate index ready {ready['approximate']} s, keyword warm-up done {ready['keyword_warmup']} s "
              "after the load", file=sys.stderr, flush=True)

        # ---- workloads: each search has a planted target (a memory it asks about)
        def pick() -> tuple[int, str, tuple[str, str, str]]:
            o = rng.randrange(len(owners))
            return o, owners[o], rng.choice(facts[owners[o]])

        workloads: dict[str, list[dict]] = {"owner_words": [], "owner_paraphrase": [], "team_words": [],
                                            "broad_words": [], "broad_paraphrase": []}
        for _ in range(queries):
            o, owner, (cid, text, para) = pick()
            workloads["owner_words"].append({"agent": owner, "target": cid, "text": text,
                                             "body": {"query": query_for(text, rng), "owner_id": owner}})
            workloads["owner_paraphrase"].append({"agent": owner, "target": cid, "text": text,
                                                  "body": {"query": para, "owner_id": owner}})
        for _ in range(max(20, queries // 5)):  # reader-wide searches: fewer, they cost more
            o, owner, (cid, text, para) = pick()
            workloads["team_words"].append({"agent": f"team-{o % TEAMS}", "target": cid, "text": text,
                                            "body": {"query": query_for(text, rng)}})
            workloads["broad_words"].append({"agent": "analyst", "target": cid, "text": text,
                                             "body": {"query": query_for(text, rng)}})
            workloads["broad_paraphrase"].append({"agent": "analyst", "target": cid, "text": text,
                                                  "body": {"query": para}})
        result["health_before"] = http.get("/health").json()
        result["search_http"] = {}
        seen: set[str] = {"analyst"}  # (the analyst's first search came after the load, above)
        for name, work in workloads.items():
            lat, hit, first = timed_searches(http, work, seen)
            result["search_http"][name] = {**lat, "hit@10": hit, "queries": len(work), "first_per_reader": first}
            print(f"  {name}: {lat} hit@10 {hit}; each new reader's first search {first}", file=sys.stderr, flush=True)
        # The analyst's words asked again: the pass above is each word's first use by the
        # analyst's admitted set, which then computes the word's positions and BM25 scores
        # over every row it admits (10-30 ms for a word in a fifth of a million windows) and
        # keeps them; this pass reuses them, as a reader asking about the same things does.
        lat, hit, _ = timed_searches(http, workloads["broad_words"], seen)
        result["search_http"]["broad_words_again"] = {**lat, "hit@10": hit, "queries": len(workloads["broad_words"])}
        print(f"  broad_words_again: {lat} hit@10 {hit}", file=sys.stderr, flush=True)
        result["health_after"] = http.get("/health").json()

        # ---- reader-wide searches while writes arrive: each team search follows a write that
        # team may read (a new cell in a session of one of its owners), so every one of them
        # sees a store changed since the one before (caches patched or reloaded, not reused)
        lat, hit = searches_after_writes(http, workloads["team_words"], owners)
        result["search_http"]["team_words_after_a_write"] = {**lat, "hit@10": hit, "queries": len(workloads["team_words"])}
        print(f"  team_words_after_a_write: {lat} hit@10 {hit}", file=sys.stderr, flush=True)

        # ---- reader-wide searches right after an import of a tenth as many cells again into
        # the served store: the first one takes in what the import changed
        imported = searches_after_an_import(http, workloads["broad_words"], max(500, n // 10), rng)
        result["search_http"]["broad_words_after_an_import"] = imported
        print(f"  broad_words_after_an_import: {imported}", file=sys.stderr, flush=True)

        # ---- the same with two servers on the store (replicas; on SQLite, two processes on
        # one file): the import through this one, the searches through a second one, which
        # learns of the import only from the store
        replica = Server(store_url, embedder, workdir / "replica.log")
        try:
            with httpx.Client(base_url=replica.base, timeout=300, verify=tls_context()) as other:
                timed_searches(other, workloads["broad_words"], set())  # its readers' first searches
                wait_until_warm(other, replica.started)
                imported = searches_after_an_import(http, workloads["broad_words"], max(500, n // 10), rng,
                                                    searcher=other, prefix="replica-import")
        finally:
            replica.stop()
        result["search_http"]["broad_words_after_an_import_through_another_server"] = imported
        print(f"  broad_words_after_an_import_through_another_server: {imported}", file=sys.stderr, flush=True)

        # ---- single-cell writes: one client, then 8 concurrent clients, each client a process
        # of its own and the clock started once all have connected (bench/writes.py: eight
        # client threads in one process are held back by their own GIL)
        from writes import lost_writes, single_writes  # (writes imports this module: not at the top)

        acked: dict[str, tuple[str, str]] = {}
        result["single_writes"] = {"1_client": single_writes(server, 1, 500, "single", acked),
                                   "8_clients": single_writes(server, 8, 800, "conc", acked)}
        result["writes_per_s"] = result["single_writes"]["1_client"]["writes_per_s"]
        result["writes_per_s_8_clients"] = result["single_writes"]["8_clients"]["writes_per_s"]
        result["rss_mb"] = server.rss_mb()
        http.close()
    finally:
        server.stop()

    # ---- restart: time to the first search (owner-scoped, then reader-wide)
    restarted = Server(store_url, embedder, workdir / "server.log")
    try:
        with httpx.Client(base_url=restarted.base, timeout=300, verify=tls_context()) as http:
            seen = set()
            result["first_search_after_restart_s"] = first_searches(restarted, http, workloads, seen)
            result["health_after_restart"] = http.get("/health").json()
            # Every single write the first server acknowledged, read back by the restarted one.
            result["acked_writes"], result["lost_writes"] = len(acked), lost_writes(restarted.base, acked)
            # The reader-wide searches again once this restarted server has loaded its graph
            # (and added to it the rows changed since it was saved: the import's, when the
            # first server stopped before its backlog was drained) and read its common words
            # ahead (open() does that past 100,000 cells): beside
            # the grown server's figures above, on the same file and machine minutes apart.
            # Asked every 20 ms meanwhile, /health says how long a request waits while the
            # warm-ups run: hnswlib loads a saved graph holding the interpreter lock (~1.3 s at 1M).
            longest = wait_until_warm(http, restarted.started)
            result["restarted_ready_s"] = round(time.perf_counter() - restarted.started, 1)
            result["restart_warmup_longest_wait_s"] = {"waited": round(longest[0], 3), "at": round(longest[1], 1)}
            result["search_http_restarted"] = {}
            for name in ("team_words", "broad_words", "broad_paraphrase"):
                lat, hit, first = timed_searches(http, workloads[name], seen)
                result["search_http_restarted"][name] = {**lat, "hit@10": hit, "queries": len(workloads[name]),
                                                         "first_per_reader": first}
                print(f"  restarted {name}: {lat} hit@10 {hit}; each new reader's first search {first}",
                      file=sys.stderr, flush=True)
    finally:
        restarted.stop()

    # ---- the same restart without the access snapshot the stop saved beside the file (SQLite):
    # what a restart costs when there is none to resume (a crash with no recent save, more
    # rows changed since than it is brought forward by, a copied file): loaded from the table
    saved_snapshot = Path(store_url.removeprefix("sqlite:///") + ".access-snapshot")
    if store_url.startswith("sqlite:///") and saved_snapshot.exists():
        saved_snapshot.unlink()
        cold = Server(store_url, embedder, workdir / "server.log")
        try:
            with httpx.Client(base_url=cold.base, timeout=300, verify=tls_context()) as http:
                result["first_search_after_restart_without_saved_snapshot_s"] = first_searches(cold, http, workloads)
        finally:
            cold.stop()

    # ---- in process: the same service code the server runs, on the same store
    from ampkit.bootstrap import build_service, load_settings
    from ampkit.models import SearchRequest

    service = build_service(load_settings(store=store_url, embedder=embedder))
    service.store.open()
    try:
        # Timed once the background warm-ups this open started are done (vector matrix and
        # graph, term rows): timed during them, the searches measured the warm-ups' share of
        # the two cores (14.6 / 36.5 / 64.3 ms at 1M, against 7.9 / 8.7 / 9.2 over HTTP).
        if service.store.backend == "sqlite":  # (PostgreSQL keeps its vectors in the database)
            service.store.wait_for_vector_index()
            service.store.wait_for_term_warmup()
        work = workloads["owner_words"]
        for item in work[:20]:
            service.search(item["agent"], SearchRequest(**item["body"]))
        inproc_ms = []
        for item in work:
            t = time.perf_counter()
            service.search(item["agent"], SearchRequest(**item["body"], limit=10))
            inproc_ms.append((time.perf_counter() - t) * 1000)
        stats = service.store.stats()
    finally:
        service.store.close()
    imported = sum(result["search_http"][name]["cells"] for name in (
        "broad_words_after_an_import", "broad_words_after_an_import_through_another_server"))
    written = n + len(workloads["team_words"]) + imported + 500 + 800  # bulk load + writes between searches + imports + single writes
    result.update({
        "store": stats.get("backend", store_url.split(":")[0]),
        "search_inproc_ms": percentiles(inproc_ms),
        "bytes_per_cell": round(stats["bytes"] / written) if stats.get("bytes") else None,
        "machine": {"cpus": os.cpu_count(), "loadavg_at_end": [round(x, 2) for x in os.getloadavg()]},
    })
    return result


def print_table(res: dict) -> None:
    print(f"scale: {res['n']} cells, {res['owners']} owners, store {res['store']}, embedder {res['embedder']}")
    print("| search over HTTP | queries | p50 ms | p95 ms | p99 ms | hit@10 |\n|---|---|---|---|---|---|")
    for name, p in res["search_http"].items():
        print(f"| {name} | {p['queries']} | {p['p50']} | {p['p95']} | {p['p99']} | {p['hit@10']} |")
    for name, p in res.get("search_http_restarted", {}).items():
        print(f"| {name}, restarted server | {p['queries']} | {p['p50']} | {p['p95']} | {p['p99']} | {p['hit@10']} |")
    p = res["search_inproc_ms"]
    print(f"| owner_words in process | - | {p['p50']} | {p['p95']} | {p['p99']} | - |")
    for name, through in (("broad_words_after_an_import", "the same server"),
                          ("broad_words_after_an_import_through_another_server", "another server")):
        imported = res["search_http"].get(name)
        if imported:
            print(f"\nafter importing {imported['cells']} more cells ({imported['cells_per_s']} cells/s): "
                  f"the first reader-wide search through {through} {imported['first_search_ms']} ms")
    print("\n| each reader's first search on the server, before the timed ones | readers | p50 ms | p95 ms | max ms |"
          "\n|---|---|---|---|---|")
    for label, rows in (("", res["search_http"]), (", restarted server", res.get("search_http_restarted", {}))):
        for name, p in rows.items():
            first = p.get("first_per_reader")
            if first:
                print(f"| {name}{label} | {first['readers']} | {first['p50']} | {first['p95']} | {first['max']} |")
    print("\n| measure | value |\n|---|---|")
    for key in ("writes_per_s", "writes_per_s_8_clients", "acked_writes", "lost_writes", "batch_writes_per_s",
                "batch_server_cpu_ms_per_cell", "loadavg_after_load", "ann_ready_after_load_s",
                "keyword_warmup_after_load_s", "bytes_per_cell", "rss_mb"):
        print(f"| {key} | {res.get(key)} |")
    for key, value in res["first_search_after_restart_s"].items():
        print(f"| restart: {key} (s) | {value} |")
    for key, value in res.get("first_search_after_restart_without_saved_snapshot_s", {}).items():
        print(f"| restart without the saved access snapshot: {key} (s) | {value} |")
    if "restarted_ready_s" in res:
        print(f"| restart: process start to graph and keyword warm-up ready (s) | {res['restarted_ready_s']} |")
        wait = res["restart_warmup_longest_wait_s"]
        print(f"| restart: the longest wait of a request meanwhile (s; at s from the process start) | {wait['waited']}; {wait['at']} |")
    print(f"\nvector index after restart: {res['health_after_restart'].get('vector_index')}")
    print(f"machine: {res['machine']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, required=True, help="memories to load")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--store", default=None, help="store URL [default: a temporary SQLite file]")
    parser.add_argument("--embedder", default="default", help="AMPKIT_EMBEDDER for the server and in-process runs")
    parser.add_argument("--queries", type=int, default=500, help="searches to time")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ampkit-scale-") as tmp:
        store_url = args.store or f"sqlite:///{tmp}/scale.db"
        result = run(args.n, store_url, args.embedder, args.queries, Path(tmp))
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if result["lost_writes"] else 0


if __name__ == "__main__":
    sys.exit(main())
