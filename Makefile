# bloomcrawl: every target wraps one command; see README.md.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: help venv system-deps test lint bench

help:
	@grep -E '^[a-z-]+:.*## ' Makefile | sed 's/:.*## /\t/'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test,bench]'
	touch $@

venv: $(VENV)/.installed ## create .venv with bloomcrawl and its test tools

system-deps: ## install redis-server and prometheus (promtool) from Debian when missing
	scripts/ensure-system-packages.sh redis-server=redis-server promtool=prometheus

test: venv system-deps ## run the test suite (starts its own redis-server, scrapyd, prometheus)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: venv ## ruff and mypy
	$(VENV)/bin/ruff check crawler tests bench
	$(VENV)/bin/mypy

bench: venv system-deps ## benchmarks: side-by-side ratios against the seeds' recipe and RedisBloom
	$(PY) bench/dedup.py
