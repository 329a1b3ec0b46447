"""Test support: real `ampkit serve` processes on free loopback ports.

Tests talk to these over real HTTP; nothing here mocks the server or the store."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One `ampkit serve` child process. `base_url` ends in /amp/v1."""

    def __init__(self, store_url: str, args: Sequence[str] = (), env: Optional[dict[str, str]] = None,
                 log_path: Optional[Path] = None):
        self.store_url = store_url
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/amp/v1"
        self.log_path = log_path
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 30.0) -> "ServerProcess":
        cmd = [sys.executable, "-m", "ampkit.cli", "serve", "--port", str(self.port), "--store", self.store_url, *self.args]
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ampkit serve exited with {self.proc.returncode}; log: {self.log_path}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"ampkit serve did not answer /health within {timeout}s; log: {self.log_path}")

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no flush. For durability tests."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
