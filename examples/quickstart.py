"""ampkit quickstart: the same script runs against a server or a local file.

    AMPKIT_URL=http://127.0.0.1:8765/amp/v1 python examples/quickstart.py   # a running `ampkit serve`
    AMPKIT_URL=sqlite:///memory.db python examples/quickstart.py            # in process, no server

With neither AMPKIT_URL nor a `url` in ~/.config/ampkit/config.toml it uses a fresh SQLite file
in process, and says so on stderr.
"""

import sys
import tempfile

import ampkit


def open_memory() -> ampkit.Client:
    try:
        return ampkit.connect(agent_id="quickstart")  # AMPKIT_URL, else the config file
    except ampkit.ConfigError:
        url = f"sqlite:///{tempfile.mkdtemp(prefix='ampkit-quickstart-')}/memory.db"
        print(f"AMPKIT_URL is not set: using {url} (in process, no server)", file=sys.stderr)
        return ampkit.connect(url, agent_id="quickstart")


with open_memory() as memory:
    tea = memory.remember("Ada prefers green tea", owner_id="ada", importance=0.9)
    memory.remember("Ada's cat is called Tom", owner_id="ada", type="episodic")

    for hit in memory.search("tea", owner_id="ada"):
        print(f"{hit.score:.2f} {hit.cell.content.text}")

    coffee = memory.supersede(tea.id, "Ada switched to black coffee")
    print("superseded:", memory.get(tea.id).lifecycle.superseded_by == coffee.id)

    memory.forget(coffee.id)  # archive, then delete
    print("remaining:", [cell.content.text for cell in memory.list(owner_id="ada")])

    try:
        memory.get(coffee.id)
    except ampkit.AccessDenied as exc:
        print("forgotten:", exc.code)
