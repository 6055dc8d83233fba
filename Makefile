# Two commands set a fresh machine up: `make run` (the main job) and `make test` (the tests).
# torch 2.13.0 is installed first, alone: a looser requirement would pull GBs of CUDA wheels. Chromium
# (for the report's browser test) comes from Debian's packages where it is missing.
PYTHON ?= python3
VENV := .venv

$(VENV)/.installed: pyproject.toml
	@# Headless Chromium (Debian's package) checks the HTML report in tests/test_report.py.
	command -v chromium > /dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

run: $(VENV)/.installed
	$(VENV)/bin/orchestrator launch search_spaces/smoke.yaml

test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -q

bench: $(VENV)/.installed
	$(VENV)/bin/python benchmarks/bench_trainables.py
	$(VENV)/bin/python benchmarks/bench_orchestration.py

.PHONY: install run test bench
