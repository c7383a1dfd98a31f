# One gate, the same locally and in CI. Every target sets itself up.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell md5sum pyproject.toml | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: setup setup-system test lint types unit demo bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "installing backchannel and its test tools into $(VENV)..." >&2
	@$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

setup: $(STAMP)

# what the tests drive for real: PostgreSQL, Node.js + proper-lockfile, tmux, Chromium
setup-system: setup
	@bash scripts/setup-system.sh

lint: setup
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

types: setup
	$(VENV)/bin/mypy

unit: setup-system
	$(VENV)/bin/pytest $(PYTEST_ARGS)

test: lint types unit

demo: setup
	$(PY) examples/demo.py

bench: setup-system
	$(PY) -m bench.bench_send all
	$(PY) bench/bench_links.py
	$(PY) bench/bench_timers.py
	$(PY) bench/bench_inbox.py
	$(PY) -m bench.bench_postgres

clean:
	rm -rf $(VENV) .cache .backchannel .mypy_cache .ruff_cache
