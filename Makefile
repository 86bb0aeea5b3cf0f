# Two entry points (see README): `make demo` sets up and trains on the embedded default;
# `make test` sets up and runs the tests. Both are idempotent.
PY ?= python3
PIP ?= $(PY) -m pip

.PHONY: setup demo test
setup:
	@command -v bwrap >/dev/null 2>&1 || (command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || sudo apt-get install -y -qq bubblewrap >/dev/null 2>&1) || \
	  echo "warning: bubblewrap not installed; the sandbox falls back to unshare + rlimits")
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'

demo: setup
	envsched train --out runs/demo

test: setup
	$(PY) -m pytest -q -x --timeout=900
