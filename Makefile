# The two commands: `make serve` and `make test`. Both create .venv if missing and install the
# project with the CPU build of torch (pinned in the same pip command, see shared cpu-stack notes),
# and the `ray` extra so the scale-out tests (tests/integration/cluster) run rather than skip.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: serve test lint install dev-models clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0 -e ".[dev,ray]"
	touch $(STAMP)

install: $(STAMP)

dev-models: $(STAMP)
	$(BIN)/worldserve dev-models build

serve: dev-models
	$(BIN)/worldserve serve --host $(HOST) --port $(PORT)

lint: $(STAMP)
	$(BIN)/ruff check worldserve tests benchmarks

test: $(STAMP) lint
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) outputs .pytest_cache
