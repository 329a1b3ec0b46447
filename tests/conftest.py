"""Shared fixtures. The environment is isolated first, before any framework is imported:
crewai writes under $HOME at import time, so HOME and the XDG dirs point into a temp dir."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from pg import scratch_dir  # noqa: E402  (stdlib and psycopg only: no framework yet)

# Test files (pytest's tmp_path, tempfile's directories, the servers' SQLite files) live in
# memory (/dev/shm) when it has room: every SQLite commit fsyncs, ~2 ms on this disk, and no
# test is about power loss (what SIGKILL may not lose is still in the page cache, tested so).
# Children (`ampkit serve`, the CLI) inherit TMPDIR. All of it goes under one directory per
# test process, removed at its end: a server a test kills (SIGKILL on purpose) leaves its
# temporary store behind, which in /dev/shm is memory the machine does not get back.
_TEMP_ROOT = tempfile.mkdtemp(prefix="ampkit-tests-", dir=scratch_dir())
tempfile.tempdir = os.environ["TMPDIR"] = _TEMP_ROOT
_SANDBOX = Path(tempfile.mkdtemp(prefix="sandbox-"))
for _var, _sub in (("HOME", "home"), ("XDG_DATA_HOME", "data"), ("XDG_CONFIG_HOME", "config"),
                   ("XDG_CACHE_HOME", "cache"), ("CREWAI_STORAGE_DIR", "crewai")):
    (_SANDBOX / _sub).mkdir(parents=True, exist_ok=True)
    os.environ[_var] = str(_SANDBOX / _sub)
os.environ.update({
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "OTEL_SDK_DISABLED": "true",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
})
# A developer's AMPKIT_* server settings must not reach the tests' servers; the two variables
# that steer the tests themselves stay (read below and in tests/test_fuzz.py).
TEST_CONTROLS = ("AMPKIT_HYPOTHESIS_PROFILE", "AMPKIT_FUZZ_EXAMPLES")
for _var in [v for v in os.environ if v.startswith("AMPKIT_") and v not in TEST_CONTROLS]:
    del os.environ[_var]
# Starlette's in-process TestClient sends `Host: testserver`, which a loopback server refuses
# otherwise (the Host allow-list, ampkit.server.hosts). AppServer ignores the environment.
os.environ["AMPKIT_ALLOWED_HOSTS"] = "testserver"

import pytest  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402

# Hypothesis profiles. The property tests name their example counts through
# `support.examples(n)`, which scales n by the loaded profile's max_examples / 100:
# - default (`make test`, a developer's loop): half the counts the tests name;
# - ci (`.ci/run`): the counts the tests name;
# - thorough (before a release, or hunting a bug): ten times the counts.
# Choose with `pytest --hypothesis-profile=NAME` or AMPKIT_HYPOTHESIS_PROFILE=NAME.
for _name, _examples in (("default", 50), ("ci", 100), ("thorough", 1000)):
    hypothesis_settings.register_profile(_name, max_examples=_examples, deadline=None)
hypothesis_settings.load_profile(os.environ.get("AMPKIT_HYPOTHESIS_PROFILE", "default"))

from support import AppServer, ServerProcess  # noqa: E402
from pg import pg_server, pg_url  # noqa: E402,F401  (embedded PostgreSQL fixtures)


def pytest_unconfigure(config):
    shutil.rmtree(_TEMP_ROOT, ignore_errors=True)  # the sandbox and every test's and server's temporary files


def pytest_addoption(parser):
    parser.addoption("--allow-root-changes", action="store_true",
                     help="run tests that change the machine as root (mount file systems, create the "
                          "embedded_postgres system user); `make test` and CI pass it")


def pytest_collection_modifyitems(config, items):
    # pyproject's per-test timeout is for the counts of `make test` and CI; a profile asking
    # for more examples (thorough: ten times CI's) gets as many times more (the PostgreSQL
    # case of the non-interference property took 344 s of thorough's examples).
    scale = hypothesis_settings.default.max_examples / 100
    timeout = float(config.getini("timeout") or 0)
    if scale > 1 and timeout:
        for item in items:
            item.add_marker(pytest.mark.timeout(timeout * scale))
    if not config.getoption("--allow-root-changes"):
        skip = pytest.mark.skip(reason="changes the machine (mounts); run with --allow-root-changes")
        for item in items:
            if "root" in item.keywords:
                item.add_marker(skip)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: see pytest_xdist_make_scheduler
        slow: dict[str, int] = {}
        size: dict[str, int] = {}
        for item in items:
            unit = _unit(item.nodeid)
            slow[unit] = slow.get(unit, 0) + ("slow" in item.keywords)
            size[unit] = size.get(unit, 0) + 1
        items.sort(key=lambda item: (-slow[_unit(item.nodeid)], -size[_unit(item.nodeid)]))  # stable


# Tests each of whose cases is long enough to be a unit of work of its own under `make test`.
OWN_UNITS = ("tests/test_noninterference.py::test_no_read_path_depends_on_cells_the_caller_cannot_read[",)


# Test files that use CrewAI or LlamaIndex (imported when first used, adapter_support.Deferred):
# one unit of work, so that one worker pays for importing those frameworks, not every worker.
SLOW_IMPORT_UNIT = "tests/(crewai and llamaindex)"
SLOW_IMPORT_FILES = frozenset(f"tests/{name}.py" for name in (
    "test_adapter_crewai", "test_adapter_llamaindex", "test_adapter_shared", "test_files_frameworks",
    "test_adapter_langmem"))


def _unit(nodeid: str) -> str:
    if nodeid.startswith(OWN_UNITS):
        return nodeid
    path = nodeid.split("::", 1)[0]
    return SLOW_IMPORT_UNIT if path in SLOW_IMPORT_FILES else path


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_make_scheduler(config, log):
    """`make test` (pytest-xdist, --dist loadfile): a test file is one unit of work (its module
    fixtures start once), except the cases of OWN_UNITS; the workers sort their collection so
    that units with `slow` tests come first (the most slow tests first), then by number of
    tests, and the units are handed out in that order: no long unit starts last while the
    other worker has nothing left to do."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    config.option.loadscopereorder = False  # keep the workers' order
    return Units(config, log)


@pytest.fixture(scope="session")
def sandbox() -> Path:
    return _SANDBOX


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> AppServer:
    """One server (the real app over real HTTP, in this process) on a temp SQLite file, shared
    by the session."""
    tmp = tmp_path_factory.mktemp("server")
    with AppServer(f"sqlite:///{tmp}/memory.db") as srv:
        yield srv


@pytest.fixture
def server_factory(tmp_path):
    """Start extra servers with custom stores, flags (as `ampkit serve` takes them) or AMPKIT_*
    variables; all stopped at the end of the test. In this process unless `process=True`: use
    a real `ampkit serve` process where the process is what the test is about."""
    started: list = []

    def start(store_url: str | None = None, args=(), env=None, process: bool = False, clock=None):
        url = store_url or f"sqlite:///{tmp_path}/memory-{len(started)}.db"
        log_path = tmp_path / f"server-{len(started)}.log"
        if process:
            srv = ServerProcess(url, args=args, env=env, log_path=log_path)
        else:
            srv = AppServer(url, args=args, env=env, log_path=log_path, clock=clock)
        started.append(srv)
        return srv.start()

    yield start
    for proc in started:
        proc.stop()

