# Loki — the two commands: `make up` runs Loki, `make test` runs the tests.
# Both install what is missing first (scripts/install.sh; fast when nothing changed).
VENV ?= .venv
export LOKI_VENV := $(abspath $(VENV))

.PHONY: up test bench bench-quick install install-test

up: install
	$(VENV)/bin/loki up

test: install-test
	$(VENV)/bin/python -m pytest

bench: install-test
	$(VENV)/bin/python -m bench

bench-quick: install-test
	$(VENV)/bin/python -m bench --quick

install:
	scripts/install.sh

install-test:
	scripts/install.sh --test
