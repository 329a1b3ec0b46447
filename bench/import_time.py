"""How long `import ampkit` takes, and what it loads: a plain HTTP client should pay for the
models, the client and httpx, not for the service, the stores or numpy.

    python bench/import_time.py [--rounds 15] [--json out.json]

Each round is a fresh interpreter that times its own import (interpreter start-up excluded):
wall time and the process's CPU time (on a busy machine the wall time mostly measures the wait
for a core), p50/p95 over the rounds, beside the same for
`import ampkit` followed by `ampkit.connect("memory://")` (the in-process path, which loads the
service). httpx imports its command-line module, and with it click and rich, when those are
installed (the server extra brings click): the table says whether they were.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

SNIPPETS = {
    "import ampkit": "import ampkit",
    "import + in-process connect": "import ampkit; ampkit.connect('memory://', agent_id='a').close()",
}


def timed(code: str) -> tuple[float, float, list[str]]:
    """(wall ms, CPU ms, modules loaded) of `code` in a fresh interpreter."""
    probe = ("import sys, time; wall, cpu = time.perf_counter(), time.process_time()\n" + code
             + "\nprint((time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000)"
             + "\nprint('\\n'.join(sys.modules))")
    lines = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split("\n")
    wall, cpu = map(float, lines[0].split())
    return wall, cpu, lines[1:]


def percentiles(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    return round(statistics.median(values), 1), round(values[min(len(values) - 1, int(0.95 * len(values)))], 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    results = {}
    for label, code in SNIPPETS.items():
        walls, cpus, modules = [], [], []
        for _ in range(args.rounds):
            wall, cpu, modules = timed(code)
            walls.append(wall)
            cpus.append(cpu)
        (wall_p50, wall_p95), (cpu_p50, cpu_p95) = percentiles(walls), percentiles(cpus)
        results[label] = {
            "wall_p50_ms": wall_p50, "wall_p95_ms": wall_p95, "cpu_p50_ms": cpu_p50, "cpu_p95_ms": cpu_p95,
            "ampkit_modules": sum(1 for m in modules if m.startswith("ampkit")),
            "numpy": "numpy" in modules,
            "httpx_cli": "rich" in modules or "click" in modules,
        }
    print(f"{'':30} {'wall p50/p95 ms':>16} {'CPU p50/p95 ms':>16} {'ampkit modules':>15} {'numpy':>6} {'httpx cli':>10}")
    for label, r in results.items():
        wall, cpu = f"{r['wall_p50_ms']} / {r['wall_p95_ms']}", f"{r['cpu_p50_ms']} / {r['cpu_p95_ms']}"
        print(f"{label:30} {wall:>16} {cpu:>16} {r['ampkit_modules']:>15} {str(r['numpy']):>6} {str(r['httpx_cli']):>10}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rounds": args.rounds, "results": results}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
