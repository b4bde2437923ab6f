# Every target bootstraps what it needs: a fresh machine with Python 3.11+ is enough.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stello-installed
PYTEST_ARGS ?=

.PHONY: install test test-reliability lint type check demo clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv \
	  && $(BIN)/uv pip install --quiet --python $(BIN)/python -e '.[dev]' \
	  || $(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Crash, concurrency, fault, bad-input and isolation suites, with CI counts
# (RELIABILITY_FULL=1 for the full local counts; see RELIABILITY.md).
test-reliability: $(STAMP)
	$(BIN)/python -m pytest -m reliability tests/reliability $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

type: $(STAMP)
	$(BIN)/mypy stello_graph tests

check: lint type test

demo: $(STAMP)
	$(BIN)/python -m stello_graph.demo

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache
