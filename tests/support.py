"""Test support: real servers on loopback ports the OS picks (port 0, so no two tests race
for one port).

- `ServerProcess`: an `ampkit serve` child process, for tests where the process is the point
  (the CLI, SIGKILL durability, faults, several processes on one database).
- `AppServer`: the same app (`create_app`) served by uvicorn in a thread of the test process:
  real HTTP on a real socket, without paying a process start and a model load per server.
- `run_cli`: an `ampkit` command run in this process by click's CliRunner (the same command
  code, options, output and exit code), for CLI tests where the process is not the point.

Tests talk to both over real HTTP; nothing here mocks the server or the store."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Optional, Sequence

import httpx

from ampkit.tls import tls_context

# httpx builds a TLS context for every client (~30 ms of CPU reading the CA bundle), even for
# plain HTTP: the tests' own short-lived clients share the one ampkit's clients share.
TLS = tls_context()

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A port nothing listens on right now: only for tests that want a refused connection."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_stat(path: Path) -> Optional[list[str]]:
    """The fields after the command name in a /proc `stat` file (a process's or a thread's);
    None when it has just ended."""
    try:
        return path.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(fields: list[str]) -> float:
    """User + system CPU time in `proc_stat` fields."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far; 0 once it has ended."""
    fields = proc_stat(Path(f"/proc/{pid}/stat"))
    return 0.0 if fields is None else cpu_seconds(fields)


def process_rss_kb(pid: int) -> int:
    """A process's resident memory (VmRSS) in kB; 0 once it has ended."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (Linux /proc): `ampkit serve --workers N` serves from child
    processes, whose CPU time is the server's too."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := proc_stat(entry / "stat")) is not None:
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(parents.get(current, []))
    return tree


def examples(named: int) -> int:
    """A property test's example count under the loaded Hypothesis profile (conftest.py):
    `named` under `ci`, half of it under `default`, ten times under `thorough`; at least 1."""
    from hypothesis import settings

    return max(1, round(named * settings.default.max_examples / 100))


def glob_witnesses(pattern: str) -> list[str]:
    """Two agent ids a `readable_by` pattern matches, from the first and the last choice at each
    item (a set's lowest and highest member, a run empty or not): `[ab]` gives `a` and `b`, a
    pattern that names one agent gives that agent twice."""
    from ampkit import glob

    parsed = glob.parse(pattern)
    firsts, lasts = [], []
    for item in parsed.items:
        if isinstance(item, str):
            first = last = item
        elif isinstance(item, glob.AnyRun):
            first, last = "", "xy"
        elif isinstance(item, glob.AnyOne):
            first, last = "x", "é"
        elif not item.negated:
            first, last = item.ranges[0][0], item.ranges[-1][1]
        else:  # (test alphabets stay between "!" and "中": " " and "😀" are outside any set of theirs)
            first = last = next(c for c in "xyaZé中-q 😀" if not any(lo <= c <= hi for lo, hi in item.ranges))
        firsts.append(first)
        lasts.append(last)
    found = ["".join(firsts), "".join(lasts)]
    assert all(parsed.matches(w) for w in found), (pattern, found)
    return found


def run_cli(*args: str, env: Optional[dict[str, str]] = None, input: Optional[str] = None,
            timeout: Optional[float] = None) -> "subprocess.CompletedProcess[str]":
    """`ampkit ARGS` in this process: click's CliRunner calls the same command the console script
    does and answers like `subprocess.run(..., capture_output=True, text=True)` would (returncode,
    stdout, stderr; an uncaught exception's traceback goes to stderr, exit code 1). `env` sets
    variables for the call only. No Python start and no model load per call (the embedder is
    cached per process). Use a real process (`sys.executable -m ampkit.cli`) where the process is
    the point: `serve`, signals, stdio transports, a missing extra. `timeout` is accepted for the
    subprocess helpers' signature and ignored."""
    import traceback

    from click.testing import CliRunner

    from ampkit.cli import main

    result = CliRunner().invoke(main, list(args), input=input, env=env, catch_exceptions=True)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["ampkit", *args], result.exit_code, result.stdout, stderr)


def run_example(script: Path, env: Optional[dict[str, str]] = None,
                cwd: Optional[Path] = None) -> "subprocess.CompletedProcess[str]":
    """`python SCRIPT` in this process: the script runs as `__main__` (runpy) with its output
    captured, `env` set and `cwd` entered for the run only, and answers like `subprocess.run`
    would (an uncaught exception's traceback goes to stderr, exit code 1). What an example test
    checks is the script and what it prints, not a Python start with its imports and model load."""
    import contextlib
    import io
    import runpy
    import traceback

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, saved_path, saved_argv = dict(os.environ), os.getcwd(), list(sys.path), list(sys.argv)
    code = 0
    try:
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        sys.argv = [str(script)]
        sys.path.insert(0, str(Path(script).parent))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.path[:] = saved_path
        sys.argv = saved_argv
    return subprocess.CompletedProcess(["python", str(script)], code, out.getvalue(), err.getvalue())


def _temp_log() -> Path:
    fd, name = tempfile.mkstemp(prefix="ampkit-serve-", suffix=".log")
    os.close(fd)
    return Path(name)


# uvicorn's start-up line names the port it bound (the server is started with --port 0).
_LISTENING = re.compile(rb"Uvicorn running on http://127\.0\.0\.1:(\d+)")


class ServerProcess:
    """One `ampkit serve` child process. `base_url` ends in /amp/v1."""

    def __init__(self, store_url: str, args: Sequence[str] = (), env: Optional[dict[str, str]] = None,
                 log_path: Optional[Path] = None):
        self.store_url = store_url
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.port: Optional[int] = None  # known once started: the server binds port 0 and says which
        self.log_path = log_path or _temp_log()
        self.proc: Optional[subprocess.Popen] = None

    @property
    def base_url(self) -> str:
        assert self.port is not None, "start the server first"
        return f"http://127.0.0.1:{self.port}/amp/v1"

    def start(self, timeout: float = 30.0) -> "ServerProcess":
        cmd = [sys.executable, "-m", "ampkit.cli", "serve", "--port", str(self.port or 0), "--store", self.store_url,
               *self.args]
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ampkit serve exited with {self.proc.returncode}; log: {self.log_path}")
            if self.port is None or not self._answers():
                found = _LISTENING.search(self.log_path.read_bytes()[offset:])
                self.port = int(found.group(1)) if found else self.port
            if self.port is not None and self._answers():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"ampkit serve did not answer /health within {timeout}s; log: {self.log_path}")

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.base_url}/health", timeout=1.0, verify=TLS).status_code == 200
        except httpx.HTTPError:
            return False

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


class ManualClock:
    """Time a test moves by hand (`advance(seconds)`) instead of sleeping. Called, it is a
    monotonic clock (frozen between advances); `now()` is the wall clock plus what was advanced,
    so keys made by the real CLI expire on it as they would later in real time."""

    def __init__(self) -> None:
        self._start = time.monotonic()
        self.offset = 0.0

    def __call__(self) -> float:
        return self._start + self.offset

    def now(self) -> datetime:
        return datetime.now(timezone.utc) + timedelta(seconds=self.offset)

    def advance(self, seconds: float) -> None:
        self.offset += seconds


def _serve_overrides(args: Sequence[str], env: Optional[dict[str, str]]) -> dict[str, Any]:
    """`ampkit serve` flags and AMPKIT_* variables -> Settings fields, parsed by the CLI's own options."""
    from ampkit.cli import serve

    with serve.make_context("serve", list(args)) as ctx:
        flags = ctx.params
    overrides = {name[len("AMPKIT_"):].lower(): value for name, value in (env or {}).items() if name.startswith("AMPKIT_")}
    given = {"host": flags["host"], "auth": flags["auth"], "rate_limit": flags["rate_limit"],
             "lifecycle_interval_seconds": flags["lifecycle_interval"],
             "allow_clock_override": flags["allow_clock_override"], "mcp_http": False if flags["no_mcp"] else None,
             "ui": flags["ui"], "access_log": flags["access_log"], "allowed_hosts": flags["allowed_hosts"]}
    overrides.update({name: value for name, value in given.items() if value is not None})  # flags beat variables
    return overrides


class AppServer:
    """`create_app` under uvicorn in a thread of this process, on a loopback port it binds
    itself. The same face as ServerProcess (`base_url`, `start`, `stop`, a context manager),
    the same settings (flags and AMPKIT_* variables are read as `ampkit serve` reads them),
    the same app; only the process boundary is missing, so `kill()` is not offered."""

    def __init__(self, store_url: str, args: Sequence[str] = (), env: Optional[dict[str, str]] = None,
                 log_path: Optional[Path] = None, clock: Optional["ManualClock"] = None):
        from ampkit.bootstrap import build_service, load_settings

        self.store_url = store_url
        self.settings = load_settings(env=False, store=store_url, port=0, **_serve_overrides(args, env))
        # With a ManualClock, the service (key expiry, lifecycle) and the rate limiter read it.
        self.clock = clock
        self.service = build_service(self.settings, clock=clock.now) if clock else None
        self.log_path = log_path
        self.port: Optional[int] = None
        self._server: Any = None
        self._thread: Optional[threading.Thread] = None

    @property
    def base_url(self) -> str:
        assert self.port is not None, "start the server first"
        return f"http://127.0.0.1:{self.port}/amp/v1"

    def start(self, timeout: float = 30.0) -> "AppServer":
        import uvicorn

        from ampkit.server.app import create_app
        from ampkit.server.http import uvicorn_options

        app = create_app(self.settings, self.service, monotonic=self.clock or time.monotonic)
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                **uvicorn_options(self.settings.max_header_bytes))
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=f"AppServer {self.store_url}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the app did not start on {self.store_url}")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._server.should_exit = True
            self._thread.join(15)

    def __enter__(self) -> "AppServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
