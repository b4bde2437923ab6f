# Every target bootstraps what it needs: a fresh machine with Python 3.11+ is enough.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
NOTEBOOKS_OUT ?= build/notebooks
BENCH_ARGS ?=

# What each target installs into .venv, once (a stamp per set, each on top of the first):
# the package and its runtime dependencies (`make demo`), the docs tools (`make docs`), the
# development toolchain (tests, lint, type checks, notebooks, benchmarks), the tools that build
# and check the distributions (`make dist`).
RUNTIME := $(VENV)/.stello-runtime
DOCS := $(VENV)/.stello-docs
DEV := $(VENV)/.stello-dev
DIST_TOOLS := $(VENV)/.stello-dist-tools

.PHONY: install test test-live live-server test-reliability test-server browser test-browser screenshots lint type check demo docs dist notebooks bench bench-quick clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# `editable_mode=compat` installs the clone as a plain path entry (a .pth line) instead of
# setuptools' import hook, which type checkers cannot follow: mypy or pyright run on code
# outside the clone then find `stello_graph` and its `py.typed`.
EDITABLE := --config-settings editable_mode=compat

# `$(call pip_install,ARGS)`: with uv where it installs (much faster), else with pip.
define pip_install
$(BIN)/python -m pip install --quiet --disable-pip-version-check uv \
  && $(BIN)/uv pip install --quiet --python $(BIN)/python $(1) \
  || $(BIN)/python -m pip install --quiet --disable-pip-version-check $(1)
endef

$(RUNTIME): pyproject.toml Makefile | $(BIN)/python
	$(call pip_install,$(EDITABLE) -e .)
	touch $@

$(DOCS): $(RUNTIME)
	$(call pip_install,$(EDITABLE) -e '.[docs]')
	touch $@

$(DEV): $(RUNTIME)
	$(call pip_install,$(EDITABLE) -e '.[dev]')
	touch $@

$(DIST_TOOLS): | $(BIN)/python
	$(call pip_install,build twine)
	touch $@

install: $(DEV)

test: $(DEV)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The live suite: a real model (SmolLM2-135M-Instruct) behind llama-cpp-python's OpenAI API on
# 127.0.0.1. The first run compiles llama-cpp-python (minutes); its wheel is cached per user.
test-live: live-server
	$(BIN)/python -m pytest -m live tests/live $(PYTEST_ARGS)

live-server: $(DEV)
	$(BIN)/python -m tests.live.llama_server install

# Crash, concurrency, fault, bad-input and isolation suites, with CI counts
# (RELIABILITY_FULL=1 for the full local counts; see RELIABILITY.md).
test-reliability: $(DEV)
	$(BIN)/python -m pytest -m reliability tests/reliability $(PYTEST_ARGS)

# The graph served by `langgraph dev` on 127.0.0.1 (offline model, no --allow-blocking),
# driven with langgraph-sdk; the suite starts and stops the server itself.
test-server: $(DEV)
	$(BIN)/python -m pytest -m server tests/server $(PYTEST_ARGS)

# The inspector page in a real headless Chromium (Debian's, installed by `make browser` where
# it is missing); screenshots land in build/inspector/.
browser:
	bash .ci/browser.sh

test-browser: $(DEV) browser
	$(BIN)/python -m pytest -m browser tests/browser $(PYTEST_ARGS)

# The README's screenshots of the inspector, as the browser tests take them.
screenshots: test-browser
	mkdir -p docs
	for view in tree session context events large; do cp build/inspector/$$view.png docs/inspector-$$view.png; done

lint: $(DEV)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

type: $(DEV)
	$(BIN)/mypy stello_graph tests

check: lint type test

demo: $(RUNTIME)
	$(BIN)/stello-graph demo

# The documentation site (MkDocs, Material theme, the API pages made from the docstrings) in
# build/site. --strict: a broken link, a page left out or a reference that cannot be resolved
# fails the build. `mkdocs serve` (in .venv/bin) serves it while you edit. (The variable
# silences Material's banner about MkDocs 2.0, printed on every build.)
docs: $(DOCS)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The sdist and the wheel in dist/, built as a publisher builds them (an isolated build, the
# wheel made from the sdist), then checked with twine. Any warning of the build fails the target.
# setuptools warns that it skips byte-compiling where PYTHONDONTWRITEBYTECODE is set: the wheel
# holds no bytecode either way, so the build runs without it.
dist: $(DIST_TOOLS)
	rm -rf dist && mkdir -p build
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m build --outdir dist . >build/dist.log 2>&1 \
	  || { cat build/dist.log; exit 1; }
	! grep -i 'warn' build/dist.log || { echo 'the build warned: see build/dist.log'; exit 1; }
	$(BIN)/twine check --strict dist/*

# Run every notebook headless; the executed copies, star maps included, land in NOTEBOOKS_OUT.
notebooks: $(DEV)
	rm -rf $(NOTEBOOKS_OUT) && mkdir -p $(NOTEBOOKS_OUT)
	cp notebooks/*.ipynb $(NOTEBOOKS_OUT)/
	$(BIN)/jupyter execute --inplace $(NOTEBOOKS_OUT)/*.ipynb

# The benchmark suite against plain LangGraph (minutes; not part of `make test`). Pass groups
# or --out FILE in BENCH_ARGS, e.g. `make bench BENCH_ARGS="overhead --out figures.json"`.
bench: $(DEV)
	$(BIN)/python -m tests.benchmarks $(BENCH_ARGS)

bench-quick: $(DEV)
	$(BIN)/python -m tests.benchmarks --quick $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-live build dist *.egg-info .mypy_cache .ruff_cache
