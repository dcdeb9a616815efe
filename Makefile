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

.PHONY: install run lint test test-fuzz test-llama-cpp llama-server test-slow test-all screenshots train-ar train-model train-ar-v2 train-model-v2 train-model-v2-cf distill-v2 distill-v2-self distill-v2-self2 train-model-v2-kd train-model-v2-sdcf2 train-ar-v2-twin train-draft train-draft-v3 train-draft-levers train-draft-ablation train-draft-more4 train-draft-more5 train-draft-more6 train-draft-more7 train-draft-more8 train-draft-k8 train-draft-k8-2 distill-v3-self train-draft-sd distill-v3-self2 train-draft-sd2 distill-v3-all train-draft-sd3 distill-k82-self train-draft-k82-sd clean

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

# llama.cpp's own OpenAI server (C++), the peer of `bench serve --vs-llama-cpp` and `bench speed
# --vs-llama-cpp`: built from the llama.cpp source vendored in the registry's llama-cpp-python sdist
# (nothing downloaded beyond the package index), ~6 minutes on 2 idle cores.
LLAMA_SERVER := $(VENV)/llama.cpp/bin/llama-server
LLAMA_SDIST  := llama-cpp-python==0.3.36
$(LLAMA_SERVER): | $(STAMP)
	rm -rf $(VENV)/llama.cpp/src && mkdir -p $(VENV)/llama.cpp/src
	$(BIN)/python -m pip download -q --no-deps --no-binary :all: -d $(VENV)/llama.cpp/src "$(LLAMA_SDIST)"
	tar -xzf $(VENV)/llama.cpp/src/llama_cpp_python-*.tar.gz -C $(VENV)/llama.cpp/src
	cmake -S $(VENV)/llama.cpp/src/llama_cpp_python-*/vendor/llama.cpp -B $(VENV)/llama.cpp/build \
	  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON \
	  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF
	cmake --build $(VENV)/llama.cpp/build --target llama-server llama-bench -j 2
	mkdir -p $(VENV)/llama.cpp/bin
	cp $(VENV)/llama.cpp/build/bin/llama-server $(VENV)/llama.cpp/build/bin/llama-bench $(VENV)/llama.cpp/bin/

llama-server: $(LLAMA_SERVER)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

test-all: $(STAMP) $(CHROMIUM)
	$(BIN)/python -m pytest -m ""

# The README's playground screenshots (docs/img/playground-*.png), taken by the browser tests.
screenshots: $(STAMP) $(CHROMIUM)
	QUICKSILVER_SCREENSHOTS=docs/img $(BIN)/python -m pytest tests/test_playground_browser.py -q -k "chat or race"

# Reproduce the shipped models from scratch, in the stages they were trained in (CPU, ~2.5 h each on
# 2 cores; every stage resumes from runs/*/ckpt.pt). The AR baseline: 2000 steps in fp32, then the
# schedule extended to 10000 steps in bf16 autocast and stopped at 7900, where its data tokens
# (20.2M) equal the diffusion model's AR + diffusion tokens (assets/model-ar).
train-ar: $(STAMP)
	$(BIN)/quicksilver train --recipe small-ar --stop-at 2000
	$(BIN)/quicksilver train --recipe small-ar --steps 10000 --cpu-bf16 --stop-at 7900

# The embedded diffusion model: the AR baseline's step-2000 weights adapted to block diffusion
# (assets/model = runs/small-ar2d/final). Its first 1000 steps ran on an 8000-step schedule.
train-model: $(STAMP)
	test -f runs/small-ar/step_2000/config.json || $(BIN)/quicksilver train --recipe small-ar --stop-at 2000
	$(BIN)/quicksilver train --recipe small-ar2d --stop-at 1000
	$(BIN)/quicksilver train --recipe small-ar2d --steps 5000

# v2 (natural phrasings, agent-loop turns, a 1,024-token context), stage by stage; each stage
# resumes from runs/*/ckpt.pt. Stage 1: the v1 AR twin continued on the v2 data (600 steps). The v1
# twin is the assets/model-ar of the commit before v2 shipped (`make train-ar` retrains it).
V1_COMMIT = 145eb20^
runs/small-ar-v1/config.json:
	mkdir -p runs/small-ar-v1
	git archive $(V1_COMMIT) src/quicksilver/assets/model-ar | tar -x --strip-components=4 -C runs/small-ar-v1

train-ar-v2: $(STAMP) runs/small-ar-v1/config.json
	$(BIN)/quicksilver train --recipe small-ar-v2

# Stage 2: that finished AR model adapted to block diffusion (lr 2e-4; its first 200 steps ran on a
# 2000-step schedule, then the schedule was cut to 1200 to fit the sitting, then continued from
# step 1200 on a 5000-step schedule: the parent's accuracy was far from reached).
train-model-v2: $(STAMP)
	test -f runs/small-ar-v2/final/config.json || $(BIN)/quicksilver train --recipe small-ar-v2
	$(BIN)/quicksilver train --recipe small-ar2d-v2 --steps 2000 --stop-at 200
	$(BIN)/quicksilver train --recipe small-ar2d-v2
	$(BIN)/quicksilver train --recipe small-ar2d-v2 --steps 5000 --eval-every 1000

# Stage 3: stage 2 continued with certainty forcing (weight 2: the pilot's best TPF at equal accuracy).
train-model-v2-cf: $(STAMP)
	test -f runs/small-ar2d-v2/final/config.json || $(MAKE) train-model-v2
	$(BIN)/quicksilver train --recipe small-ar2d-v2-cf

# Stage 3 (distillation): the AR twin's verified greedy replies to 6000 fresh training prompts
# (its step-3000 weights: the teacher of record), then stage 2 continued on half of them; and the
# self-distillation run, on stage 2's own verified replies under certainty forcing.
# (`quicksilver distill` draws prompts from the v2 mixture by default: recipes.V2_MIX)
DISTILL = $(BIN)/quicksilver distill --batch-size 32
distill-v2: $(STAMP)
	test -f runs/small-ar-v2-twin/step_3000/config.json || $(BIN)/quicksilver train --recipe small-ar-v2-twin --steps 5000 --eval-every 1000 --stop-at 3000
	$(DISTILL) --teacher runs/small-ar-v2-twin/step_3000 --out runs/distill2/twin3000.jsonl --n 6000 --seed 7

distill-v2-self: $(STAMP)
	test -f runs/small-ar2d-v2/final/config.json || $(MAKE) train-model-v2
	$(DISTILL) --teacher runs/small-ar2d-v2/final --out runs/distill2/self5000.jsonl --n 3000 --seed 8

distill-v2-self2: $(STAMP)
	test -f runs/small-ar2d-v2-sdcf/final/config.json || $(MAKE) train-model-v2-kd
	$(DISTILL) --teacher runs/small-ar2d-v2-sdcf/final --out runs/distill2/self_sdcf.jsonl --n 3000 --seed 9

train-model-v2-sdcf2: $(STAMP) distill-v2-self2
	$(BIN)/quicksilver train --recipe small-ar2d-v2-sdcf2

train-model-v2-kd: $(STAMP)
	test -f runs/small-ar2d-v2/final/config.json || $(MAKE) train-model-v2
	test -f runs/distill2/twin3000.jsonl || $(MAKE) distill-v2
	$(BIN)/quicksilver train --recipe small-ar2d-v2-kd
	test -f runs/distill2/self5000.jsonl || $(MAKE) distill-v2-self
	$(BIN)/quicksilver train --recipe small-ar2d-v2-sdcf

# The v2 AR twin: stage 1 continued on stage 2's data stream for as many steps (equal tokens).
train-ar-v2-twin: $(STAMP)
	test -f runs/small-ar-v2/final/config.json || $(BIN)/quicksilver train --recipe small-ar-v2
	$(BIN)/quicksilver train --recipe small-ar-v2-twin --steps 5000 --eval-every 1000
	$(BIN)/quicksilver train --recipe small-ar-v2-twin6k

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache

# v3, the joint network: the AR twin of v2 (assets/model-ar at V2_COMMIT) trained to draft its own
# next tokens by diffusion (objective ar_draft), and the ablations of the draft loss weight and k.
V2_COMMIT = 62ed4a9
runs/small-ar-v2-twin6k/final/config.json:
	mkdir -p runs/small-ar-v2-twin6k/final
	git archive $(V2_COMMIT) src/quicksilver/assets/model-ar | tar -x --strip-components=4 -C runs/small-ar-v2-twin6k/final

# v3.2 (assets/model since 2026-12-02, seventh sitting): draft weight 0.3, 1,200 + 600 + 900 + 1,500
# steps (~2.5 h, one thread); v3.1 was the chain up to small-ar-draft-more2
train-draft: $(STAMP) runs/small-ar-v2-twin6k/final/config.json
	for r in small-ar-draft-w03-full small-ar-draft-more small-ar-draft-more2 small-ar-draft-more3; do $(BIN)/quicksilver train --recipe $$r || exit 1; done

# v3.3 (eighth sitting): 1,500 more steps on v3.2; v3.4 (assets/model since the ninth sitting):
# 2,400 more on v3.3 (~1.5 h more, one thread; resumable)
train-draft-more4: train-draft
	$(BIN)/quicksilver train --recipe small-ar-draft-more4

train-draft-more5: train-draft-more4
	$(BIN)/quicksilver train --recipe small-ar-draft-more5

# the next lever (started in the ninth sitting; resumable): 2,400 more on v3.4
train-draft-more6: train-draft-more5
	$(BIN)/quicksilver train --recipe small-ar-draft-more6

# the eleventh sitting's lever (resumable): 1,200 more on v3.5, then 1,200 more on that
train-draft-more7: train-draft-more6
	$(BIN)/quicksilver train --recipe small-ar-draft-more7

train-draft-more8: train-draft-more7
	$(BIN)/quicksilver train --recipe small-ar-draft-more8

# The twelfth sitting's lever: blocks sized for the decode k (7-9 positions, 8 a sequence) on v3.6
train-draft-k8: train-draft-more8
	$(BIN)/quicksilver train --recipe small-ar-draft-k8

train-draft-k8-2: train-draft-k8
	$(BIN)/quicksilver train --recipe small-ar-draft-k8-2

# The thirteenth sitting's lever: the drafts self-distilled — v3.7's own verified greedy replies to
# 6,000 fresh training prompts (~20 min at one thread), then v3.7 trained on half fresh data, half those
distill-v3-self: train-draft-k8
	$(DISTILL) --teacher runs/small-ar-draft-k8/final --out runs/distill3/self_v37.jsonl --n 6000 --seed 21

train-draft-sd: distill-v3-self
	$(BIN)/quicksilver train --recipe small-ar-draft-sd

# ... and a second round on v3.8's own replies
distill-v3-self2: train-draft-sd
	$(DISTILL) --teacher runs/small-ar-draft-sd/final --out runs/distill3/self_v38.jsonl --n 6000 --seed 22

train-draft-sd2: distill-v3-self2
	$(BIN)/quicksilver train --recipe small-ar-draft-sd2

distill-v3-all: train-draft-sd
	$(DISTILL) --teacher runs/small-ar-draft-sd/final --out runs/distill3/all_v38.jsonl --n 6000 --seed 23 --keep all

train-draft-sd3: distill-v3-all
	$(BIN)/quicksilver train --recipe small-ar-draft-sd3

distill-k82-self: train-draft-k8-2
	$(DISTILL) --teacher runs/small-ar-draft-k8-2/final --out runs/distill3/self_k82.jsonl --n 6000 --seed 24

train-draft-k82-sd: distill-k82-self
	$(BIN)/quicksilver train --recipe small-ar-draft-k82-sd

# v3 (the fifth sitting's shipped run, draft weight 1) and the levers measured against v3.1
train-draft-v3: $(STAMP) runs/small-ar-v2-twin6k/final/config.json
	$(BIN)/quicksilver train --recipe small-ar-draft --steps 1500 --eval-every 500 --stop-at 600
	$(BIN)/quicksilver train --recipe small-ar-draft

train-draft-levers: $(STAMP) runs/small-ar-v2-twin6k/final/config.json
	$(BIN)/quicksilver train --recipe small-ar-draft-w03-full
	for r in small-ar-draft-w03-lr1 small-ar-draft-more small-ar-draft-self; do $(BIN)/quicksilver train --recipe $$r || exit 1; done
	$(BIN)/quicksilver train --recipe small-ar-draft-more-w1

train-draft-ablation: $(STAMP) runs/small-ar-v2-twin6k/final/config.json
	for r in small-ar-draft-w1s small-ar-draft-w03 small-ar-draft-k4; do $(BIN)/quicksilver train --recipe $$r || exit 1; done
