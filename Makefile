# The two set-up commands of the README: `make demo` and `make test`.
# torch is installed first and pinned so that pip takes the local CPU build on CPU-only machines (uv does not
# look there; once torch 2.13.0 is in the venv, the rest's `torch>=` floor installs nothing more);
# GPU users who install lmpo themselves get their own torch build through the `torch>=` floor.
# The rest is installed by uv (parallel downloads and installs); --compile-bytecode writes the .pyc files of what
# uv installs, so the tests' many Python processes import from .pyc files
# (PYTHONDONTWRITEBYTECODE=1 on these machines). uv compiles only what it installs, so torch and its dependencies
# (installed by pip) are compiled by compileall on every core (-j 0): 26 s instead of pip's serial 32 s on 2 cores;
# a file that does not compile only loses its .pyc, so compileall's status is ignored.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.lmpo-installed

.PHONY: install demo test lint docs clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --no-compile torch==2.13.0
	$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null || true
	$(PIP) install -q uv
	$(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/lmpo demo

# every generated block of README.md and docs/*.md (lmpo.generated_docs), then docs/errors.md from the bad-input cases
docs: $(STAMP)
	$(PY) -m lmpo.generated_docs
	$(PY) tests/cli/test_bad_inputs.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples

# pytest-xdist: one worker per core (-n auto), idle workers steal queued tests (--dist worksteal: the long
# kill/resume shards do not leave a core idle at the end); --durations shows where the time goes.
# The suite starts hundreds of Python processes (xdist workers, CLI runs, lab and rollout workers): with
# PYTHONDONTWRITEBYTECODE=1 (set on these machines) each of them compiled lmpo's sources again and each xdist
# worker re-rewrote every test module's asserts (~15 CPU-s per worker). The tests write bytecode caches
# (__pycache__/, git-ignored); lmpo's sources are compiled once up front, on every core.
test: lint
	$(PY) -m compileall -q -j 0 src > /dev/null
	env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/python -m pytest -q -n auto --dist worksteal --durations=15

clean:
	rm -rf $(VENV) runs
