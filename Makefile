# quicksilver — set-up, run, test. Every target installs what it needs first (idempotent).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TORCH   := torch==2.13.0
HOST    ?= 127.0.0.1
PORT    ?= 8000

.PHONY: install run test test-slow test-all clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# The OpenAI-compatible server on the embedded model (MODEL=path to serve another checkpoint;
# ARGS for more flags, e.g. ARGS="--api-key KEY").
run: $(STAMP)
	$(BIN)/quicksilver serve --host $(HOST) --port $(PORT) $(if $(MODEL),--model $(MODEL)) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

test-all: $(STAMP)
	$(BIN)/python -m pytest -m ""

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
