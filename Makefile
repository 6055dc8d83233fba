# Two commands set a fresh machine up: `make run` (the main job) and `make test` (the tests).
# torch 2.13.0 is installed first, alone: a looser requirement would pull GBs of CUDA wheels. The main
# job needs neither root nor a browser; the tests' browser checks need Chromium (`make browser`, as
# root, from Debian's packages), and are skipped with a hint where it is missing.
PYTHON ?= python3
VENV := .venv

# What the main job needs, and nothing more.
$(VENV)/.run-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e .
	touch $@

# And what the tests need: pytest and friends, ruff, the dashboard extra (tests/test_export.py serves it)
# and the docs site's (CI builds it).
$(VENV)/.installed: $(VENV)/.run-installed
	$(VENV)/bin/pip install -q -e '.[test,dashboard,server,docs]'
	touch $@

install: $(VENV)/.installed

run: $(VENV)/.run-installed
	$(VENV)/bin/orchestrator launch search_spaces/smoke.yaml

test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -q -n 2

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The docs site on http://127.0.0.1:8000, rebuilt on every change; docs-build: as CI builds it.
docs: $(VENV)/.installed
	$(VENV)/bin/mkdocs serve

docs-build: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The generated parts of README.md and docs/ (the reference pages, the tables of commands, exit statuses
# and environment variables), written anew from the code; the docs build and tests/test_docs.py fail
# where they are stale.
reference: $(VENV)/.installed
	$(VENV)/bin/python -m orchestrator.reference

browser:
	command -v chromium > /dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

bench: $(VENV)/.installed
	$(VENV)/bin/python benchmarks/bench_trainables.py
	$(VENV)/bin/python benchmarks/bench_orchestration.py

.PHONY: install run test lint bench browser docs docs-build reference
