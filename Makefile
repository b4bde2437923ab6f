# Every target bootstraps what it needs: a fresh machine with Python 3.11+ is enough.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stello-installed
PYTEST_ARGS ?=
NOTEBOOKS_OUT ?= build/notebooks
BENCH_ARGS ?=

.PHONY: install test test-live live-server test-reliability test-server browser test-browser screenshots lint type check demo notebooks bench bench-quick clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# `editable_mode=compat` installs the clone as a plain path entry (a .pth line) instead of
# setuptools' import hook, which type checkers cannot follow: mypy or pyright run on code
# outside the clone then find `stello_graph` and its `py.typed`.
EDITABLE := --config-settings editable_mode=compat

$(STAMP): pyproject.toml Makefile | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv \
	  && $(BIN)/uv pip install --quiet --python $(BIN)/python $(EDITABLE) -e '.[dev]' \
	  || $(BIN)/python -m pip install --quiet --disable-pip-version-check $(EDITABLE) -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The live suite: a real model (SmolLM2-135M-Instruct) behind llama-cpp-python's OpenAI API on
# 127.0.0.1. The first run compiles llama-cpp-python (minutes); its wheel is cached per user.
test-live: live-server
	$(BIN)/python -m pytest -m live tests/live $(PYTEST_ARGS)

live-server: $(STAMP)
	$(BIN)/python -m tests.live.llama_server install

# Crash, concurrency, fault, bad-input and isolation suites, with CI counts
# (RELIABILITY_FULL=1 for the full local counts; see RELIABILITY.md).
test-reliability: $(STAMP)
	$(BIN)/python -m pytest -m reliability tests/reliability $(PYTEST_ARGS)

# The graph served by `langgraph dev` on 127.0.0.1 (offline model, no --allow-blocking),
# driven with langgraph-sdk; the suite starts and stops the server itself.
test-server: $(STAMP)
	$(BIN)/python -m pytest -m server tests/server $(PYTEST_ARGS)

# The inspector page in a real headless Chromium (Debian's, installed by `make browser` where
# it is missing); screenshots land in build/inspector/.
browser:
	bash .ci/browser.sh

test-browser: $(STAMP) browser
	$(BIN)/python -m pytest -m browser tests/browser $(PYTEST_ARGS)

# The README's screenshots of the inspector, as the browser tests take them.
screenshots: test-browser
	mkdir -p docs
	for view in tree session context events large; do cp build/inspector/$$view.png docs/inspector-$$view.png; done

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

type: $(STAMP)
	$(BIN)/mypy stello_graph tests

check: lint type test

demo: $(STAMP)
	$(BIN)/stello-graph demo

# Run every notebook headless; the executed copies, star maps included, land in NOTEBOOKS_OUT.
notebooks: $(STAMP)
	rm -rf $(NOTEBOOKS_OUT) && mkdir -p $(NOTEBOOKS_OUT)
	cp notebooks/*.ipynb $(NOTEBOOKS_OUT)/
	$(BIN)/jupyter execute --inplace $(NOTEBOOKS_OUT)/*.ipynb

# The benchmark suite against plain LangGraph (minutes; not part of `make test`). Pass groups
# or --out FILE in BENCH_ARGS, e.g. `make bench BENCH_ARGS="overhead --out figures.json"`.
bench: $(STAMP)
	$(BIN)/python -m tests.benchmarks $(BENCH_ARGS)

bench-quick: $(STAMP)
	$(BIN)/python -m tests.benchmarks --quick $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-live build dist *.egg-info .mypy_cache .ruff_cache
