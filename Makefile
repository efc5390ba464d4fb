# The two set-up commands of the README: `make demo` and `make test`.
# torch is installed first and pinned so that pip takes the local CPU build on CPU-only machines;
# GPU users who install lmpo themselves get their own torch build through the `torch>=` floor.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.lmpo-installed

.PHONY: install demo test lint clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/lmpo demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples

test: lint
	$(VENV)/bin/python -m pytest -q

clean:
	rm -rf $(VENV) runs
