# One-command entry points (see README.md). Everything lives in .venv at the repo root.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Tests run in TEST_WORKERS processes (pytest-xdist), a file to a worker: a test's subprocesses leave a core idle
# about half the time. Session fixtures are still made once per run (tests/helpers/shared.py). TEST_WORKERS=0: one.
TEST_WORKERS ?= 2
WORKERS := $(if $(filter 0,$(TEST_WORKERS)),-n 0,-n $(TEST_WORKERS) --dist loadfile)

.PHONY: setup demo test test-all test-fast clean-demo lock

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), f"levanter-mars needs Python 3.11, found {sys.version.split()[0]} at {sys.executable}"'
	$(PYTHON) -m venv $(VENV)
	# uv (pinned in constraints.txt) installs the same pins as pip, in about half the time (docs/testing.md).
	$(PY) -m pip install --quiet -c constraints.txt uv
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) -c constraints.txt -e '.[test,tpu]'
	touch $(STAMP)

## Create .venv with every pinned dependency.
setup: $(STAMP)

## Set up, then train the embedded default: a nano GPT-2 with MARS on Python's own docs (no network).
demo: setup
	$(PY) -m levanter_mars.main.train_lm --config_path config/gpt2_nano_mars.yaml $(ARGS)

## Set up, then run the test suite but the `extended` tests (this is what .ci/run calls).
test: setup
	$(PY) -m pytest $(WORKERS) -m "not extended" $(ARGS)

## Set up, then run every test, the `extended` ones too (slow duplicates of CI coverage).
test-all: setup
	$(PY) -m pytest $(WORKERS) $(ARGS)

## Set up, then run the tests that are not marked slow: no training run, corpus build, storage emulator or
## simulated-device subprocess (tests/conftest.py marks those), nor a test that spends seconds compiling a model or
## starting a Python subprocess (marked where it is defined). The suite to run while editing: under 3 minutes.
test-fast: setup
	$(PY) -m pytest $(WORKERS) -m "not slow" $(ARGS)

## Regenerate constraints.txt from the current .venv (after changing pins in pyproject.toml).
lock: setup
	$(VENV)/bin/uv pip freeze --python $(PY) --exclude-editable | grep -v -E '^(levanter-mars|pip|setuptools)==' > constraints.txt
