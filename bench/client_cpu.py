"""The client's own CPU per call, without a server: `ampkit.Client.remember` against a raw
httpx `post` of the same body, both over one `httpx.MockTransport` that answers a canned 201
cell (so neither pays a socket or a server; what differs is ampkit's own work per request:
building the call and its URL, the retry policy, decoding the answer into a MemoryCell).

    .venv/bin/python bench/client_cpu.py [--blocks 7] [--calls 3000] [--json out.json]

Prints microseconds of process CPU per call (median of the blocks, raw and ampkit
alternating) and ampkit's overhead over raw httpx.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import httpx

import ampkit


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with ampkit.connect("memory://", agent_id="ada") as local:
        cell = local.remember("note about tea and cats", owner_id="ada").model_dump(mode="json")

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(201, json=cell)

    raw = httpx.Client(transport=httpx.MockTransport(answer), base_url="http://127.0.0.1:9/amp/v1/")
    client = ampkit.Client("http://127.0.0.1:9/amp/v1", agent_id="ada", http_client=httpx.Client(transport=httpx.MockTransport(answer)))

    def raw_call(i: int) -> None:
        raw.post("memories", json={"type": "semantic", "content": {"text": f"note {i} about tea and cats"},
                                   "identity": {"owner_id": "ada"}}, headers={"X-AMP-Agent-ID": "ada"}).json()

    def ampkit_call(i: int) -> None:
        client.remember(f"note {i} about tea and cats", owner_id="ada")

    samples: dict[str, list[float]] = {"raw_httpx": [], "ampkit": []}
    for _ in range(args.blocks):
        for name, call in (("raw_httpx", raw_call), ("ampkit", ampkit_call)):
            started = time.process_time()
            for i in range(args.calls):
                call(i)
            samples[name].append(1e6 * (time.process_time() - started) / args.calls)
    result = {name: round(statistics.median(v), 1) for name, v in samples.items()}
    result["ampkit_over_raw_us"] = round(result["ampkit"] - result["raw_httpx"], 1)
    result["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    print(f"client CPU per create, us (median of {args.blocks} blocks of {args.calls}): raw httpx {result['raw_httpx']}, "
          f"ampkit {result['ampkit']}, ampkit over raw {result['ampkit_over_raw_us']}; load {result['loadavg']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
