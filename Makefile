# quicksilver — set-up, run, test. Every target installs what it needs first (idempotent).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TORCH   := torch==2.13.0
HOST    ?= 127.0.0.1
PORT    ?= 8000
CHROMIUM := /usr/bin/chromium
SUDO    := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: install run test lint test-slow test-fuzz test-all train train-edit llama-server test-llama-cpp screenshots clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# Debian's Chromium for the playground's browser tests (Playwright drives it; no browser download).
$(CHROMIUM):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

# The OpenAI-compatible server on the embedded model (MODEL=path to serve another checkpoint;
# ARGS for more flags, e.g. ARGS="--api-key KEY").
run: $(STAMP)
	$(BIN)/quicksilver serve --host $(HOST) --port $(PORT) $(if $(MODEL),--model $(MODEL)) $(ARGS)

# Formatter, linter and types (mypy on the whole package), then the default suite.
lint: $(STAMP)
	$(BIN)/ruff format --check src tests
	$(BIN)/ruff check src tests
	$(BIN)/python -m mypy src/quicksilver

# The default suite on two pytest-xdist workers, one torch thread each (tests/conftest.py):
# its time is mostly single-threaded start-ups and small steps, so two workers on two cores halve
# it; a file stays on one worker, in its order (XDIST="-n 0" runs it all in one process).
XDIST ?= -n 2 --dist loadfile
test: lint $(CHROMIUM)
	$(BIN)/python -m pytest $(XDIST)

# The bounded schemathesis run (fails on any 5xx; FUZZ_EXAMPLES per operation and mode, ~2 min).
test-fuzz: $(STAMP)
	$(BIN)/python -m pytest tests/test_fuzz.py -m fuzz -s -p no:cacheprovider

# Optional: llama.cpp's Python binding (compiled from the registry's source package, ~6 minutes on
# 2 idle cores with llama.cpp's own programs left out) and the GGUF export checked against its logits.
LLAMA_CMAKE = -DGGML_NATIVE=ON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
test-llama-cpp: $(STAMP)
	$(BIN)/python -c "import llama_cpp" 2>/dev/null || CMAKE_ARGS="$(LLAMA_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=2 $(BIN)/python -m pip install -q llama-cpp-python
	$(BIN)/python -m pytest tests/test_gguf.py tests/test_bench.py -q -k "gguf or llama"

# llama.cpp's own programs (C++): its OpenAI server, the peer of `bench serve --vs-llama-cpp` and
# `bench speed --vs-llama-cpp`; llama-bench, llama-quantize and llama-diffusion-cli, the peers of
# `bench shapes --vs-llama-cpp`. Built from the llama.cpp source vendored in the registry's llama-cpp-python sdist
# (nothing downloaded beyond the package index), ~6 minutes on 2 idle cores. llama-diffusion-cli
# builds its model parameters by hand and drops --no-repack; one line passes it through (repacked
# Q4_0 / Q8_0 weights crash on AMX CPUs: docs/LOG.md, 2026-12-07), another flushes its log before
# exit (its logger is leaked by design and loses the timing line now and then: llama.cpp #22142).
LLAMA_SERVER := $(VENV)/llama.cpp/bin/llama-server
LLAMA_SDIST  := llama-cpp-python==0.3.36
LLAMA_TOOLS  := llama-server llama-bench llama-quantize llama-diffusion-cli
$(LLAMA_SERVER): | $(STAMP)
	rm -rf $(VENV)/llama.cpp/src && mkdir -p $(VENV)/llama.cpp/src
	$(BIN)/python -m pip download -q --no-deps --no-binary :all: -d $(VENV)/llama.cpp/src "$(LLAMA_SDIST)"
	tar -xzf $(VENV)/llama.cpp/src/llama_cpp_python-*.tar.gz -C $(VENV)/llama.cpp/src
	sed -i -e 's/^\(\s*\)model_params.check_tensors *= params.check_tensors;/&\n\1model_params.use_extra_bufts = !params.no_extra_bufts;/' \
	  -e 's/^\(\s*\)llama_backend_free();/\1common_log_flush(common_log_main());\n&/' \
	  $(VENV)/llama.cpp/src/llama_cpp_python-*/vendor/llama.cpp/examples/diffusion/diffusion-cli.cpp
	cmake -S $(VENV)/llama.cpp/src/llama_cpp_python-*/vendor/llama.cpp -B $(VENV)/llama.cpp/build \
	  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON \
	  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF
	cmake --build $(VENV)/llama.cpp/build --target $(LLAMA_TOOLS) -j 2
	mkdir -p $(VENV)/llama.cpp/bin
	cp $(addprefix $(VENV)/llama.cpp/build/bin/,$(LLAMA_TOOLS)) $(VENV)/llama.cpp/bin/

llama-server: $(LLAMA_SERVER)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

test-all: $(STAMP) $(CHROMIUM)
	$(BIN)/python -m pytest -m ""

# The README's playground screenshots (docs/img/playground-*.png), taken by the browser tests.
screenshots: $(STAMP) $(CHROMIUM)
	QUICKSILVER_SCREENSHOTS=docs/img $(BIN)/python -m pytest tests/test_playground_browser.py -q -k "chat or race"

# The shipped models (assets/model, model-ar, model-diffusion, then the edit model) trained from
# scratch: the stages of src/quicksilver/train/reproduce.py in order (CPU, about a day at one thread
# a run: ARGS="--threads 1"). Resumable stage by stage: a finished stage is skipped, an interrupted
# one resumes from its runs/*/ckpt.pt. STAGE=name stops after that stage;
# `$(BIN)/python -m quicksilver.train.reproduce --list` prints them.
train: $(STAMP)
	$(BIN)/python -m quicksilver.train.reproduce $(if $(STAGE),--stage $(STAGE)) $(ARGS)

# The edit model's stages only, from the shipped chat model's weights (about 5 hours at one thread).
train-edit: $(STAMP)
	$(BIN)/python -m quicksilver.train.reproduce --from-assets $(if $(STAGE),--stage $(STAGE)) $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
