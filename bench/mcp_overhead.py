"""MCP overhead: the same operations through REST, MCP over streamable HTTP (`/mcp` of the
same server) and MCP over stdio (`ampkit mcp` on the same store file), on loopback.

    python bench/mcp_overhead.py [--cells 2000] [--n 200] [--json out.json]

Loads `--cells` memories through the REST batch route, then times `--n` sequential calls per
operation and transport from one client: create (remember), get (get_memory), search
(recall, limit 10). `mcp_http_raw` POSTs the JSON-RPC messages with plain httpx (what the
server costs); `mcp_http` and `mcp_stdio` go through the SDK's ClientSession, which also
validates every structured result against the tool's output schema. Prints p50/p95/p99 in milliseconds and calls/s; writes JSON to
bench/results/mcp_overhead.json unless --json says otherwise. Keyword-only retrieval (embedder none),
so the numbers are the transports' and not the embedding model's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import httpx
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from ampkit.tls import tls_context  # one TLS context: httpx builds one per client (~30 ms)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support import free_port  # noqa: E402  (the test helper: a free loopback port)

WORDS = ["tea", "coffee", "Lisbon", "Osaka", "jazz", "piano", "dog", "report", "lease", "marathon", "passport",
         "tomatoes", "bike", "ramen", "novels", "flights", "notebook", "standup", "hotel", "desk"]
AGENT = "bench-agent"
# mcp_http_raw: JSON-RPC POSTed with httpx, no SDK client: what the server costs. The SDK's
# ClientSession also validates every structured result against the tool's output schema.
TRANSPORTS = ("rest", "mcp_http_raw", "mcp_http", "mcp_stdio")


def text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(8))


def summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    q = statistics.quantiles(ms, n=100)
    return {"p50_ms": round(q[49], 2), "p95_ms": round(q[94], 2), "p99_ms": round(q[98], 2),
            "calls_per_s": round(len(ms) / (sum(ms) / 1000), 1)}


async def timed(n: int, call: Callable[[int], Awaitable[Any]]) -> list[float]:
    await call(-1)  # warm-up
    samples = []
    for i in range(n):
        start = time.perf_counter()
        await call(i)
        samples.append(time.perf_counter() - start)
    return samples


async def mcp_ops(session: ClientSession, ids: list[str], n: int, rng: random.Random) -> dict[str, list[float]]:
    async def tool(name: str, args: dict[str, Any]) -> Any:
        result = await session.call_tool(name, args)
        if result.isError:
            raise RuntimeError(result.content[0].text)
        return result

    return {
        "create": await timed(n, lambda i: tool("remember", {"text": text(rng)})),
        "get": await timed(n, lambda i: tool("get_memory", {"id": rng.choice(ids)})),
        "search": await timed(n, lambda i: tool("recall", {"query": " ".join(rng.sample(WORDS, 2)), "limit": 10})),
    }


async def run(cells: int, n: int) -> dict[str, Any]:
    rng = random.Random(7)
    tmp = tempfile.mkdtemp(prefix="ampkit-bench-mcp-")
    store = f"sqlite:///{tmp}/bench.db"
    port = free_port()
    env = {**os.environ, "AMPKIT_EMBEDDER": "none"}
    server = subprocess.Popen([sys.executable, "-m", "ampkit.cli", "serve", "--port", str(port), "--store", store,
                               "--lifecycle-interval", "0"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    results: dict[str, Any] = {"cells": cells, "n": n}
    try:
        async with httpx.AsyncClient(base_url=f"{base}/amp/v1", headers={"X-AMP-Agent-ID": AGENT}, timeout=60, verify=tls_context()) as rest:
            for _ in range(300):
                try:
                    if (await rest.get("/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
            ids: list[str] = []
            for start in range(0, cells, 500):
                batch = [{"content": {"text": text(rng)}, "identity": {"owner_id": AGENT}}
                         for _ in range(min(500, cells - start))]
                answer = await rest.post("/memories/batch", json={"cells": batch})
                ids += [c["id"] for c in answer.json()["results"]]

            async def rest_call(method: str, path: str, body: Any = None) -> Any:
                answer = await rest.request(method, path, json=body)
                answer.raise_for_status()
                return answer

            results["rest"] = {
                "create": await timed(n, lambda i: rest_call("POST", "/memories", {"content": {"text": text(rng)},
                                                                                  "identity": {"owner_id": AGENT}})),
                "get": await timed(n, lambda i: rest_call("GET", f"/memories/{rng.choice(ids)}")),
                "search": await timed(n, lambda i: rest_call("POST", "/memories/search",
                                                             {"query": " ".join(rng.sample(WORDS, 2)), "limit": 10})),
            }

        async with httpx.AsyncClient(headers={"X-AMP-Agent-ID": AGENT, "Accept": "application/json, text/event-stream"},
                                     timeout=60, verify=tls_context()) as raw:
            async def rpc(name: str, args: dict[str, Any]) -> Any:
                answer = await raw.post(f"{base}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                                            "params": {"name": name, "arguments": args}})
                answer.raise_for_status()
                if answer.json()["result"].get("isError"):
                    raise RuntimeError(answer.text)
                return answer

            results["mcp_http_raw"] = {
                "create": await timed(n, lambda i: rpc("remember", {"text": text(rng)})),
                "get": await timed(n, lambda i: rpc("get_memory", {"id": rng.choice(ids)})),
                "search": await timed(n, lambda i: rpc("recall", {"query": " ".join(rng.sample(WORDS, 2)), "limit": 10})),
            }

        async with httpx.AsyncClient(headers={"X-AMP-Agent-ID": AGENT}, timeout=60, verify=tls_context()) as http:
            async with streamable_http_client(f"{base}/mcp", http_client=http) as (read, write, _):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    results["mcp_http"] = await mcp_ops(session, ids, n, rng)

        params = StdioServerParameters(command=sys.executable, args=["-m", "ampkit.cli", "mcp", "--store", store,
                                                                     "--agent-id", AGENT], env=env)
        async with stdio_client(params, errlog=open(os.devnull, "w")) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                results["mcp_stdio"] = await mcp_ops(session, ids, n, rng)
    finally:
        server.terminate()
        server.wait(10)
    for transport in TRANSPORTS:
        results[transport] = {op: summary(samples) for op, samples in results[transport].items()}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=2000)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--json", default=str(Path(__file__).resolve().parent / "results" / "mcp_overhead.json"))
    args = parser.parse_args()
    results = asyncio.run(run(args.cells, args.n))
    print(f"{args.n} sequential calls per row, {args.cells} cells preloaded, one client, loopback")
    print(f"{'transport':<13} {'op':<7} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'calls/s':>8}")
    for transport in TRANSPORTS:
        for op, row in results[transport].items():
            print(f"{transport:<13} {op:<7} {row['p50_ms']:>8} {row['p95_ms']:>8} {row['p99_ms']:>8} {row['calls_per_s']:>8}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
