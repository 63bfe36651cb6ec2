# bloomcrawl: every target wraps one command; see README.md.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: help venv system-deps test test-lowest lint bench

# the cluster (see README.md "The cluster"); the bloomcrawl command does the work
BLOOMCRAWL := $(VENV)/bin/bloomcrawl
WORKERS ?= 3
SPIDER ?= site
URL ?=
SERVICE ?=
# REDIS=cluster: a six-node Redis Cluster (docker-compose.cluster.yml) instead of one redis-server
REDIS ?=
# REDIS_BIND=addr: Redis also on this address for worker hosts (TLS, an ACL user per role)
REDIS_BIND ?=
# INSECURE=1: allow plain text (redis://, http://) to addresses off this machine
INSECURE ?=
# SWARM=1: a Docker Swarm stack (docker-compose.swarm.yml; the default on a swarm manager);
# SWARM=0: docker-compose even on a manager
SWARM ?=
CLUSTER_KIND = $(if $(filter 1,$(SWARM)),--swarm)$(if $(filter 0,$(SWARM)),--docker)
.PHONY: up down scale deploy crawl demo status logs e2e certs worker-host

help:
	@grep -E '^[a-z0-9-]+:.*## ' Makefile | sed 's/:.*## /\t/'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test,bench,demo,dashboards]'
	touch $@

venv: $(VENV)/.installed ## create .venv with bloomcrawl, its test tools (Grafana SDK included) and the demo site

system-deps: ## install redis-server, prometheus (promtool), docker-compose, openssl (make certs) and iproute2 (the remote-worker tests' network namespace) from Debian when missing
	scripts/ensure-system-packages.sh redis-server=redis-server promtool=prometheus \
		docker-compose=docker-compose openssl=openssl ip=iproute2

# tests at once (pytest-xdist; an idle process takes tests from a busy one); 0: one at a time.
# Twice the CPUs (at most 8): most of a test's time is waiting on the processes it started
TEST_PROCESSES ?= $(shell n=$$(nproc 2>/dev/null || echo 1); n=$$((2 * n)); [ $$n -gt 8 ] && n=8; echo $$n)

test: venv system-deps ## run the test suite (starts its own redis-server, scrapyd, prometheus)
	$(PY) -m pytest -n $(TEST_PROCESSES) --dist worksteal --durations=15 $(PYTEST_ARGS)

# the lowest versions pyproject allows (constraints/lowest.txt): the floors must be true
LOWEST_VENV := .venv-lowest
LOWEST_TESTS := tests/test_scheduler.py tests/test_frontier_protocol.py tests/test_scripts.py \
	tests/test_bloom.py tests/test_dupefilter.py tests/test_frontier_crawl.py tests/faults \
	tests/test_redis_cluster_crawl.py tests/test_politeness.py tests/test_politeness_crawl.py \
	tests/test_politeness_feedback_crawl.py tests/test_codec.py tests/test_scheduler_user_requests.py \
	tests/test_user_project.py tests/test_scheduler_parts.py tests/test_filter_growth.py \
	tests/test_items_window.py tests/test_plaintext.py tests/test_remote_workers.py

$(LOWEST_VENV)/.installed: pyproject.toml constraints/lowest.txt
	$(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_VENV)/bin/pip install -q --upgrade pip
	$(LOWEST_VENV)/bin/pip install -q -c constraints/lowest.txt -e '.[test,demo]'
	touch $@

test-lowest: $(LOWEST_VENV)/.installed system-deps ## the crawl and fault tests on the lowest supported Scrapy, Twisted, redis-py
	$(LOWEST_VENV)/bin/python -m pytest -n $(TEST_PROCESSES) --dist worksteal --durations=15 \
		$(PYTEST_ARGS) $(LOWEST_TESTS)

lint: venv ## ruff and mypy
	$(VENV)/bin/ruff check crawler tests bench
	$(VENV)/bin/mypy

bench: venv system-deps ## benchmarks: side-by-side ratios against the seeds' recipe and RedisBloom
	$(PY) bench/dedup.py
	$(PY) bench/exporter.py
	$(PY) bench/scale.py
	$(PY) bench/politeness.py

up: venv ## start the cluster with WORKERS=N workers (docker-compose; a Swarm stack on a manager; local processes without Docker); REDIS=cluster: on a Redis Cluster; REDIS_BIND=addr: Redis for worker hosts too
	$(BLOOMCRAWL) $(if $(INSECURE),--insecure) up --workers $(WORKERS) $(if $(REDIS),--redis $(REDIS)) \
		$(if $(REDIS_BIND),--redis-bind $(REDIS_BIND)) $(CLUSTER_KIND)

# certificates: the CA (once) and NAME's certificate for HOSTS, in .run/certs (never committed)
CERTS_DIR ?= .run/certs
NAME ?= server
HOSTS ?= 127.0.0.1 ::1 localhost $(REDIS_BIND)

certs: ## a CA and certificates in .run/certs: NAME=server for HOSTS="127.0.0.1 addr" (and a client certificate)
	scripts/make-certs.sh $(CERTS_DIR) $(NAME) $(HOSTS)

# a worker host: NODE_URL=https://this-host-addr:6800, REDIS_URL=rediss://bloomcrawl-worker:...@central:port/0
NODE_URL ?=

worker-host: venv ## on another machine: WORKERS=N scrapyd nodes behind TLS for the cluster at REDIS_URL, reached at NODE_URL
	$(BLOOMCRAWL) $(if $(INSECURE),--insecure) worker-host --node-url "$(NODE_URL)" --workers $(WORKERS)

down: venv ## stop the cluster and delete its data (KEEP_DATA=1 keeps it)
	$(BLOOMCRAWL) down $(if $(KEEP_DATA),--keep-data)

scale: venv ## run WORKERS=N workers; `make deploy` then reaches the new ones
	$(BLOOMCRAWL) scale $(WORKERS)

# PROJECT=path: your own Scrapy project (the directory of its scrapy.cfg) instead of crawler/
PROJECT ?=

deploy: venv ## deploy the Scrapy project (PROJECT=path: yours, with its requirements.txt) to every worker; fails if any one fails
	$(BLOOMCRAWL) deploy $(if $(PROJECT),--project-dir "$(PROJECT)")

crawl: venv ## crawl URL=... with SPIDER=site on every worker (PROJECT=dir or name: your own project; ARGS="-a NAME=VALUE -s NAME=VALUE")
	$(BLOOMCRAWL) crawl --spider $(SPIDER) $(if $(PROJECT),--project "$(PROJECT)") $(if $(MAX_IDLE),--max-idle $(MAX_IDLE)) $(ARGS) $(URL)

demo: venv ## up, deploy, crawl the demo site, print progress until done, then a summary
	$(BLOOMCRAWL) demo --workers $(WORKERS) $(if $(REDIS),--redis $(REDIS)) $(CLUSTER_KIND)

status: venv ## nodes, jobs, queue, leases, filter fill and estimated false-positive rate
	$(BLOOMCRAWL) status

logs: venv ## recent logs of the cluster (SERVICE=worker for one service)
	$(BLOOMCRAWL) logs $(SERVICE)

e2e: venv ## the cluster in real containers: up, deploy, crawls, a killed worker, Prometheus, a Redis Cluster, a Swarm of 3 simulated hosts, a remote worker host over TLS, down (E2E_CASES=single,cluster,swarm,remote)
	tests/e2e/run.sh
