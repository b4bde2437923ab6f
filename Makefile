# Every target bootstraps what it needs: a fresh machine with Python 3.11+ is enough.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stello-installed
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: install test lint type check demo bench bench-quick clean

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

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

type: $(STAMP)
	$(BIN)/mypy stello_graph tests

check: lint type test

demo: $(STAMP)
	$(BIN)/python -m stello_graph.demo

# The benchmark suite against plain LangGraph (minutes; not part of `make test`). Pass groups
# or --out FILE in BENCH_ARGS, e.g. `make bench BENCH_ARGS="overhead --out figures.json"`.
bench: $(STAMP)
	$(BIN)/python -m tests.benchmarks $(BENCH_ARGS)

bench-quick: $(STAMP)
	$(BIN)/python -m tests.benchmarks --quick $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache
