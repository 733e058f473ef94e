# Two entry points (README Quick start): `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
# Installed first when the venv has no torch; empty lets pip choose (a CUDA build on Linux).
HERD_TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Stamp files make re-runs cheap; they are rebuilt when pyproject.toml changes.
$(VENV)/.installed: $(BIN)/python pyproject.toml
	@if [ -n "$(HERD_TORCH)" ] && ! $(BIN)/python -c "import torch" 2>/dev/null; then \
		$(BIN)/python -m pip install --quiet "$(HERD_TORCH)"; fi
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

demo: $(VENV)/.installed
	$(BIN)/herd train ppo --env CartPole-v1

# Two pytest-xdist workers by default (tests/conftest.py says which tests one worker runs one at a time): 725 s for
# 827 tests (1,129 s in one process for 804), quiet, 2 cores (2026-12-07). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2

# Compiled first: every Ray worker and subprocess the suite starts imports herdrl, and where PYTHONDONTWRITEBYTECODE
# is set (or in a fresh clone before the first import writes them) each would compile it again (~0.3 s of CPU each).
test: $(VENV)/.installed-dev
	$(BIN)/python -m compileall -q herdrl tests
	$(BIN)/python -m pytest -q --durations=15 $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check herdrl tests benchmarks examples

bench: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python benchmarks/time_to_solve.py
	$(BIN)/python benchmarks/sampling_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
