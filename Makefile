# One gate, the same locally and in CI. Every target sets itself up.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
HASH := $(shell md5sum pyproject.toml | cut -c1-12)
STAMP := $(VENV)/.installed-$(HASH)
# what the demo needs: the package and its runtime dependencies, no test tools
RUNTIME_STAMP := $(VENV)/.runtime-$(HASH)
PYTEST_ARGS ?=
# `make install`: a virtual environment of its own, the command linked into BIN_DIR
INSTALL_DIR ?= $(HOME)/.local/share/backchannel
BIN_DIR ?= $(HOME)/.local/bin
EXTRAS ?=
PACKAGE ?= .

.PHONY: setup setup-system test lint types unit a2a-tck demo install uninstall bench bench-quick clean test-latest-clis

$(RUNTIME_STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "installing backchannel (without the test tools) into $(VENV)..." >&2
	@# uv resolves and installs in a fraction of pip's time; pip fetches it when it is missing
	@UV=$$(command -v uv || echo $(VENV)/bin/uv); \
	if [ ! -x "$$UV" ]; then $(PY) -m pip install -q --disable-pip-version-check uv; fi; \
	"$$UV" pip install -q --python $(PY) -e . || \
	$(PY) -m pip install -q --disable-pip-version-check --no-compile -e .
	@rm -f $(VENV)/.runtime-*
	@touch $(RUNTIME_STAMP)

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

# the suite's workers: one per core, at most 4 (PYTEST_WORKERS=0 runs it in this process);
# each worker has its own PostgreSQL, hubs and temporary files (tests/conftest.py groups them)
PYTEST_WORKERS ?= auto
unit: setup-system
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadfile $(PYTEST_ARGS)

test: lint types unit a2a-tck

# the A2A conformance kit, with its own dependencies in its own venv
A2A_TCK ?= ../shared/a2a-tck
TCK_VENV := .cache/a2a-tck-venv
TCK_STAMP := $(TCK_VENV)/.installed-1

$(TCK_STAMP):
	@rm -rf $(TCK_VENV) && python3 -m venv $(TCK_VENV)
	@echo "installing the A2A conformance kit's dependencies into $(TCK_VENV)..." >&2
	@$(TCK_VENV)/bin/pip install -q --disable-pip-version-check "pytest>=8.0" \
		"pytest-asyncio>=0.23" "httpx>=0.27" "grpcio>=1.60" "protobuf>=4.25" \
		"googleapis-common-protos>=1.62" "jsonschema>=4.21" "pytest-html>=4.1" \
		"gherkin-official>=29.0" "Jinja2>=3.1"
	@touch $(TCK_STAMP)

a2a-tck: setup $(TCK_STAMP)
	bash scripts/a2a-tck.sh $(A2A_TCK) $(TCK_VENV)/bin/python

# the real agent CLIs at their newest published versions (the suite pins them)
test-latest-clis: setup
	LATEST=1 bash scripts/setup-clis.sh
	BACKCHANNEL_CLI_DIR=$(CURDIR)/.cache/clis-latest $(VENV)/bin/pytest -m realcli $(PYTEST_ARGS)

# the development install includes everything the demo needs
demo: $(if $(wildcard $(STAMP)),$(STAMP),$(RUNTIME_STAMP))
	@$(PY) examples/demo.py

# puts `backchannel` on PATH (pipx-style): a built wheel in its own venv, linked into BIN_DIR
# (PACKAGE=path/to/backchannel-*.whl installs a wheel built beforehand)
install:
	@python3 -m venv --clear $(INSTALL_DIR)
	@echo "installing backchannel$(if $(EXTRAS),[$(EXTRAS)]) into $(INSTALL_DIR)..." >&2
	@$(INSTALL_DIR)/bin/python -m pip install -q --disable-pip-version-check '$(PACKAGE)$(if $(EXTRAS),[$(EXTRAS)])'
	@mkdir -p $(BIN_DIR)
	@ln -sf $(INSTALL_DIR)/bin/backchannel $(BIN_DIR)/backchannel
	@echo "installed $(BIN_DIR)/backchannel ($$($(BIN_DIR)/backchannel --version))" >&2
	@case ":$$PATH:" in *":$(BIN_DIR):"*) ;; *) echo "$(BIN_DIR) is not on your PATH; run: export PATH=\"$(BIN_DIR):\$$PATH\"" >&2 ;; esac

uninstall:
	rm -f $(BIN_DIR)/backchannel
	rm -rf $(INSTALL_DIR)

# every benchmark at its default size, then one table of the figures (bench/README.md)
bench: setup-system
	$(PY) bench/all.py

# the same at small sizes: checks the harness, not the hub
bench-quick: setup-system
	$(PY) bench/all.py --quick

clean:
	rm -rf $(VENV) .cache .backchannel .mypy_cache .ruff_cache
