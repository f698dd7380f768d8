# Loki — the two commands: `make up` runs Loki, `make test` runs the tests.
# Both install what is missing first (scripts/install.sh; fast when nothing changed).
VENV ?= .venv
export LOKI_VENV := $(abspath $(VENV))

.PHONY: up test lint bench bench-quick mutation install install-test compose-check

up: install
	$(VENV)/bin/loki up

# LOKI_TEST_WORKERS > 0 runs the suite on that many pytest-xdist workers (each with its own
# NATS, Redis and llama-server), handed out a file at a time (tests/conftest.py says which
# folders share one worker). Default 0, one process: on 2 cores the tests that bound a time
# (a stop within LOKI_STOP_TIMEOUT_S, a reply before a deadline) miss it under the load of
# three workers, so the parallel run is for a bigger machine.
LOKI_TEST_WORKERS ?= 0
test: install-test
	$(VENV)/bin/python -m pytest -n $(LOKI_TEST_WORKERS)

# Lint and types (configuration in pyproject.toml): ruff's rules and formatting over the whole
# tree; mypy strict for the shared package, at its default level for the services and the CLI.
lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --strict -p loki_shared
	$(VENV)/bin/mypy -p loki_chat -p loki_gateway -p loki_recall -p loki_memory -p loki_supervisor -p loki_perf -p loki_workspace -p loki_cli

# The stack on a real Docker engine (issue 36): images built from the Dockerfiles, `docker
# compose up` with the CPU engine, checked while it runs (tests/compose; part of `make test`).
compose-check: install-test
	$(VENV)/bin/python -m pytest tests/compose -x

bench: install-test
	$(VENV)/bin/python -m bench

bench-quick: install-test
	$(VENV)/bin/python -m bench --quick

# Mutation testing of the rule modules (bench/mutation_bench.py; cosmic-ray): re-tests the
# modules whose code or tests changed since the cached run, then rewrites BENCHMARKS.md.
mutation: install-test
	$(VENV)/bin/python -m bench --only mutation

install:
	scripts/install.sh

install-test:
	scripts/install.sh --test
