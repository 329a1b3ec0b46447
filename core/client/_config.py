"""Where a client connects, and as whom: explicit arguments, then environment, then a file.

    url      : argument > AMPKIT_URL      > config file `url`      > error
    agent_id : argument > AMPKIT_AGENT_ID > config file `agent_id` > none (calls answer MissingAgentId)
    api_key  : argument > AMPKIT_API_KEY  > config file `api_key`  > none

The config file is `$AMPKIT_CONFIG` if set, else `config.toml` in the user config directory
(`$XDG_CONFIG_HOME/ampkit/config.toml`, by default `~/.config/ampkit/config.toml` on Linux;
platformdirs' `user_config_dir("ampkit")` elsewhere).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit, urlunsplit

from platformdirs import user_config_path

from ..errors import AmpkitError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HTTP_SCHEMES = ("http", "https")
LOCAL_SCHEMES = ("sqlite", "memory", "postgresql", "postgres", "postgresql+psycopg")


class ConfigError(AmpkitError, ValueError):
    """No usable URL (or an unreadable config file): raised by `connect()` before any I/O."""


@dataclass(frozen=True)
class ClientConfig:
    url: str
    agent_id: Optional[str] = None
    api_key: Optional[str] = None

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme.lower()

    @property
    def is_http(self) -> bool:
        return self.scheme in HTTP_SCHEMES

    @property
    def display_url(self) -> str:
        """The URL without a password, for repr and logs."""
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))


def config_path() -> Path:
    explicit = os.environ.get("AMPKIT_CONFIG")
    return Path(explicit) if explicit else user_config_path("ampkit", appauthor=False) / "config.toml"


def _read_file() -> dict[str, Any]:
    path = config_path()
    if not path.is_file():
        return {}
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read ampkit config file {path}: {exc}") from exc
    return data.get("ampkit", data) if isinstance(data, dict) else {}


def resolve(url: Optional[str] = None, *, agent_id: Optional[str] = None, api_key: Optional[str] = None) -> ClientConfig:
    from ..config import ClientDefaults  # pydantic-settings loads on the first connect, not on import

    file: Optional[dict[str, Any]] = None
    env = ClientDefaults()  # AMPKIT_URL, AMPKIT_AGENT_ID, AMPKIT_API_KEY
    env_key = env.api_key.get_secret_value() if env.api_key else None

    def pick(value: Optional[str], from_env: Optional[str], key: str) -> Optional[str]:
        nonlocal file
        if value:
            return value
        if from_env:
            return from_env
        if file is None:
            file = _read_file()
        found = file.get(key)
        return str(found) if found else None

    url = pick(url, env.url, "url")
    if not url:
        raise ConfigError(
            "no ampkit URL: pass connect(url), set AMPKIT_URL, or put `url = \"...\"` in "
            f"{config_path()}; URL forms: http(s)://host:port/amp/v1, sqlite:///path.db, memory://, postgresql://..."
        )
    scheme = urlsplit(url).scheme.lower()
    if scheme not in HTTP_SCHEMES + LOCAL_SCHEMES:
        raise ConfigError(f"unknown ampkit URL scheme {scheme!r} in {url!r}; use http(s)://, sqlite:///, memory:// or postgresql://")
    return ClientConfig(
        url=url,
        agent_id=pick(agent_id, env.agent_id, "agent_id"),
        api_key=pick(api_key, env_key, "api_key"),
    )
