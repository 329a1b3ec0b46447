"""Clients: one API over HTTP or in process, chosen by a URL.

    ampkit.connect("http://127.0.0.1:8765/amp/v1", agent_id="planner")   # a server
    ampkit.connect("sqlite:///memory.db", agent_id="planner")            # a local file, no server
    ampkit.connect(agent_id="planner")                                    # AMPKIT_URL, then the config file

See docs/clients.md.
"""

from ._calls import SearchResult
from ._client import AsyncClient, Client, aconnect, connect
from ._config import ClientConfig, ConfigError, config_path, resolve
from ._http import DEFAULT_RETRIES, DEFAULT_TIMEOUT

__all__ = [
    "AsyncClient",
    "Client",
    "ClientConfig",
    "ConfigError",
    "DEFAULT_RETRIES",
    "DEFAULT_TIMEOUT",
    "SearchResult",
    "aconnect",
    "config_path",
    "connect",
    "resolve",
]
