# Two commands for a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LINTED := src tests examples $(wildcard bench migrations)

.PHONY: demo test test-server test-pooler lint typecheck imports unit install clean bench depth faults servers

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/.installed

# The demo on an embedded PostgreSQL (no server needed); DEMO_ARGS=--memory for the memory adapters.
demo: install
	$(BIN)/agentruns demo $(DEMO_ARGS)

lint: install
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

typecheck: install
	$(BIN)/mypy --strict src examples

imports: install
	$(BIN)/lint-imports

# The browser tier (tests/browser) drives Debian's headless Chromium through its chromium-driver.
BROWSER := $(wildcard /usr/bin/chromium)
DRIVER := $(wildcard /usr/bin/chromedriver)

test: lint typecheck imports
ifneq ($(and $(BROWSER),$(DRIVER)),)
	$(BIN)/pytest -q
else
	@echo "make test: no Chromium, so no browser tier (tests/browser); install it with: apt-get install -y chromium chromium-driver"
	$(BIN)/pytest -q --ignore=tests/browser
endif

unit: install
	$(BIN)/pytest -q tests/unit

# The server matrix (.ci/servers runs both): the PostgreSQL tiers on the server that
# AGENTRUNS_TEST_DATABASE_URL names (a non-superuser role with CREATEDB and CREATEROLE), and the
# contract suite's PostgreSQL half through a transaction-mode pooler (its URL with
# ?agentruns_pooler=transaction, and AGENTRUNS_TEST_ADMIN_URL the direct one to clone databases).
PG_TIERS := tests/postgres tests/contract tests/e2e tests/examples

test-server: install
	@test -n "$$AGENTRUNS_TEST_DATABASE_URL" || { echo "make test-server: set AGENTRUNS_TEST_DATABASE_URL" >&2; exit 2; }
	$(BIN)/pytest -q $(PG_TIERS)

test-pooler: install
	@test -n "$$AGENTRUNS_TEST_DATABASE_URL" || { echo "make test-pooler: set AGENTRUNS_TEST_DATABASE_URL" >&2; exit 2; }
	$(BIN)/pytest -q tests/contract -k postgres

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache

# Benchmarks and the fault run (bench/README.md). Figures land in bench/RESULTS.md.
# `make bench BENCH_ARGS="--jobs 10000"` for a shorter run; `make depth DEPTH_ARGS=--quick`.
$(BIN)/.bench-installed: $(BIN)/.installed
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $@

bench: $(BIN)/.bench-installed
	$(BIN)/python -m bench.throughput $(BENCH_ARGS)

depth: install
	$(BIN)/python -m bench.depth $(DEPTH_ARGS)

faults: install
	$(BIN)/python -m bench.faults $(FAULTS_ARGS)

# The embedded server against another (SERVERS_ARGS="--url postgresql://..."): bench/servers.py.
servers: install
	$(BIN)/python -m bench.servers $(SERVERS_ARGS)
