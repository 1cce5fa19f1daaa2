# Two commands for a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LINTED := src tests $(wildcard bench migrations)

.PHONY: demo test lint typecheck imports unit install clean

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
	$(BIN)/mypy --strict src

imports: install
	$(BIN)/lint-imports

test: lint typecheck imports
	$(BIN)/pytest -q

unit: install
	$(BIN)/pytest -q tests/unit

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
