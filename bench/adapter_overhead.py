"""What each framework adapter costs on top of the raw client call it makes.

For every adapter, the read and the write its framework runs on each turn are timed against
the raw `ampkit` client call underneath (search, remember), on the same store, p50/p95 per
call. Runs over HTTP against its own `ampkit serve` on a temp SQLite file, and in process on
another temp SQLite file. Async adapters are compared with the async client.

    .venv/bin/python bench/adapter_overhead.py [--n 200] [--warmup 20] [--json results.json]

Some adapter operations make more than one request by design (`reqs` column): the LangGraph
store's put looks its key up first; LlamaIndex's `AmpkitLlamaIndexMemory.aget` reads the session
history (here SESSION_TURNS messages; its cost grows with the session) and searches shared
memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
_HOME = Path(tempfile.mkdtemp(prefix="ampkit-bench-home-"))
for _var in ("HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "CREWAI_STORAGE_DIR"):
    os.environ[_var] = str(_HOME)  # CrewAI writes under HOME on import
os.environ.update(CREWAI_DISABLE_TELEMETRY="true", CREWAI_TRACING_ENABLED="false", OTEL_SDK_DISABLED="true")

from autogen_core.memory import MemoryContent  # noqa: E402
from langchain_core.messages import HumanMessage  # noqa: E402
from llama_index.core.base.llms.types import ChatMessage  # noqa: E402

import ampkit  # noqa: E402
from ampkit.adapters import autogen as ag, crewai as crew, langchain as lc, llamaindex as li  # noqa: E402
from support import ServerProcess  # noqa: E402

OWNER = "ada"
QUERY = "which tea does Ada like for the budget meeting"
CORPUS = 200
SESSION_TURNS = 20
WORDS = "tea coffee cat dog garden deploy runbook wiki budget travel paris berlin piano chess".split()


def sentence(i: int) -> str:
    return f"note {i}: Ada mentioned " + " and ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(4))


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def paired(raw: Callable[[int], object], adapter: Callable[[int], object], n: int, warmup: int,
           loop: asyncio.AbstractEventLoop) -> tuple[list[float], list[float]]:
    """Time the raw call and the adapter call alternately, so that load on the machine and the
    store growing during the run weigh on both alike. Coroutine results are awaited on `loop`."""

    def once(fn: Callable[[int], object], i: int) -> float:
        start = time.perf_counter()
        result = fn(i)
        if asyncio.iscoroutine(result):
            loop.run_until_complete(result)
        return (time.perf_counter() - start) * 1000.0

    for i in range(warmup):
        once(raw, i), once(adapter, i)
    raw_ms, adapter_ms = [], []
    for i in range(warmup, warmup + n):
        raw_ms.append(once(raw, i))
        adapter_ms.append(once(adapter, i))
    return raw_ms, adapter_ms


def measure(url: str, n: int, warmup: int) -> list[dict]:
    # One event loop for every async call: an async HTTP client stays bound to its loop.
    loop = asyncio.new_event_loop()
    client = ampkit.connect(url, agent_id="bench-agent")
    aclient = ampkit.aconnect(url, agent_id="bench-agent")
    store = lc.AmpkitStore(client, owner_id=OWNER)
    # The corpus is written as LangGraph items, so the store's search (which keeps to its
    # namespace) and the raw search rank the same cells.
    for i in range(CORPUS):
        store.put(("bench",), f"seed{i}", {"text": sentence(i)})
    history = lc.AmpkitChatMessageHistory(client, session_id="bench", owner_id=OWNER)
    crew_memory = crew.AmpkitCrewMemory(client=client, owner_id=OWNER, recall_types=None)
    li_memory = li.AmpkitLlamaIndexMemory(client=aclient, owner_id=OWNER, session_id="bench")
    li_block = li.AmpkitMemoryBlock(client=aclient, owner_id=OWNER)
    ag_memory = ag.AmpkitAutoGenMemory(aclient, owner_id=OWNER, types=None)
    # A session of SESSION_TURNS messages: aget reads the whole session on every call.
    loop.run_until_complete(li_memory.aput_messages(
        [ChatMessage(role="user" if i % 2 else "assistant", content=sentence(i)) for i in range(SESSION_TURNS - 1)]
        + [ChatMessage(role="user", content=QUERY)]))
    message = [ChatMessage(role="user", content=QUERY)]

    def search(i: int):
        return client.search(QUERY, owner_id=OWNER, limit=5)

    def remember(i: int):
        return client.remember(sentence(i), owner_id=OWNER)

    def asearch(i: int):
        return aclient.search(QUERY, owner_id=OWNER, limit=5)

    def aremember(i: int):
        return aclient.remember(sentence(i), owner_id=OWNER)

    # (adapter op, requests it makes, raw call, adapter call, iterations)
    cases = [
        ("langgraph BaseStore.search", 1, search, lambda i: store.search(("bench",), query=QUERY, limit=5), n),
        ("langgraph BaseStore.put (new key)", 2, remember, lambda i: store.put(("bench",), f"k{i}", {"text": sentence(i)}), n),
        ("langchain history.add_messages", 1, remember, lambda i: history.add_messages([HumanMessage(sentence(i))]), n),
        ("crewai Memory.recall", 1, search, lambda i: crew_memory.recall(QUERY, limit=5), n),
        ("crewai Memory.remember", 1, remember, lambda i: crew_memory.remember(sentence(i)), n),
        ("llamaindex block.aget", 1, asearch, lambda i: li_block.aget(message), n),
        ("llamaindex memory.aget", 2, asearch, lambda i: li_memory.aget(), n),
        ("llamaindex memory.aput", 1, aremember, lambda i: li_memory.aput(ChatMessage(role="assistant", content=sentence(i))), n),
        ("autogen Memory.query", 1, asearch, lambda i: ag_memory.query(QUERY), n),
        ("autogen Memory.add", 1, aremember,
         lambda i: ag_memory.add(MemoryContent(content=sentence(i), mime_type="text/plain")), n),
    ]
    rows = []
    for name, calls, raw, adapter, rounds in cases:
        raw_ms, adapter_ms = paired(raw, adapter, rounds, min(warmup, rounds), loop)
        p = {k: round(percentile(v, q), 3) for k, v, q in (
            ("p50_ms", adapter_ms, 0.5), ("p95_ms", adapter_ms, 0.95), ("raw_p50_ms", raw_ms, 0.5), ("raw_p95_ms", raw_ms, 0.95))}
        rows.append({"adapter_op": name, "raw_op": raw.__name__, "calls": calls, "n": rounds, **p,
                     "overhead_p50_ms": round(p["p50_ms"] - p["raw_p50_ms"], 3),
                     "overhead_p95_ms": round(p["p95_ms"] - p["raw_p95_ms"], 3)})
    client.close()
    loop.run_until_complete(aclient.aclose())
    loop.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        with ServerProcess(f"sqlite:///{tmp}/server.db", log_path=Path(tmp) / "server.log") as server:
            results["http"] = measure(server.base_url, args.n, args.warmup)
        results["in_process"] = measure(f"sqlite:///{tmp}/local.db", args.n, args.warmup)

    header = f"{'transport':<11}{'adapter op':<36}{'reqs':>5}{'p50':>9}{'p95':>9}{'raw p50':>9}{'raw p95':>9}{'+p50':>9}{'+p95':>9}"
    print(header + "   (ms)")
    for transport, rows in results.items():
        for r in rows:
            print(f"{transport:<11}{r['adapter_op']:<36}{r['calls']:>5}{r['p50_ms']:>9.2f}{r['p95_ms']:>9.2f}"
                  f"{r['raw_p50_ms']:>9.2f}{r['raw_p95_ms']:>9.2f}{r['overhead_p50_ms']:>9.2f}{r['overhead_p95_ms']:>9.2f}")
    if args.json:
        meta = {"n": args.n, "warmup": args.warmup, "python": platform.python_version(), "machine": platform.machine(),
                "cpus": os.cpu_count()}
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
