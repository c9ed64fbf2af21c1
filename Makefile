# Two commands: `make run` (the desk with a working demo) and `make test`.
SHELL := /bin/bash
# Django 6 needs Python 3.12+; take the newest one this machine has
# (pyenv's builds included). Override with `make PYTHON=/path/to/python3.12 ...`.
ifndef PYTHON
PYTHON := $(shell for p in /root/.pyenv/versions/3.13.*/bin/python3 /root/.pyenv/versions/3.12.*/bin/python3 \
	/usr/bin/python3.13 /usr/bin/python3.12 /usr/local/bin/python3.13 /usr/local/bin/python3.12 python3; do \
	[ -x "$$p" ] || p=$$(command -v $$p 2>/dev/null) || continue; \
	"$$p" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { echo "$$p"; break; }; done)
endif
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run local-base-url reset test test-production soak soak-embedded coverage lint bench bench-production install install-dev migrate clean

$(BIN)/python:
	@test -n "$(PYTHON)" || { echo "Python 3.12 or newer is needed (Django 6)."; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: requirements.txt | $(BIN)/python
	$(BIN)/pip install -q -r requirements.txt
	touch $@

$(VENV)/.installed-dev: requirements.txt requirements-dev.txt | $(BIN)/python
	$(BIN)/pip install -q -r requirements-dev.txt
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# DEBUG is off unless set, and with DEBUG off the desk will not start without
# SECRET_KEY and ALLOWED_HOSTS (docs/operators.md "Configuration"). The local desk runs with
# DEBUG on: exported here, so honcho's web, worker and beat processes inherit it, and
# written to var/local.env, which desk/settings.py reads (the environment wins), so
# `manage.py` commands on this desk need no `export DEBUG=1`.
run migrate: export DEBUG = 1
LOCAL_ENV := var/local.env

# `make run PORT=8001` or `PORT=8001 make run`: honcho hands the web process PORT
# (-p is its base port; the worker and beat get PORT+100 and +200, unused).
PORT ?= 8000
run local-base-url: export DESK_BASE_URL ?= http://127.0.0.1:$(PORT)

$(LOCAL_ENV):
	@mkdir -p $(@D)
	@printf '%s\n' \
		"# Written by make run: this checkout is a local demo desk, so its manage.py" \
		"# commands run with DEBUG on without exporting it. The environment wins over" \
		"# this file; make reset removes it. Never copy it to a production machine." \
		"DEBUG=1" > $@

# The local desk's key ring (desk/settings.py reads it with DEBUG on): made once,
# kept by make run, removed by make reset with the databases it opens.
LOCAL_KEYS := var/encryption-keys
$(LOCAL_KEYS): | $(VENV)/.installed
	@mkdir -p $(@D)
	@umask 077 && $(BIN)/python -m core.sealing newkey local1 > $@.tmp && mv $@.tmp $@

# The address this desk answers on (DESK_BASE_URL, for the links in emails and the
# header of an export), rewritten in var/local.env on every `make run`: after
# `make run PORT=8200`, manage.py commands name 8200 as the web process does.
local-base-url: $(LOCAL_ENV)
	@sed -i '/^DESK_BASE_URL=/d' $(LOCAL_ENV)
	@echo "DESK_BASE_URL=$(DESK_BASE_URL)" >> $(LOCAL_ENV)

migrate: install $(LOCAL_ENV) $(LOCAL_KEYS)
	$(BIN)/python manage.py migrate --noinput -v0
	$(BIN)/python manage.py migrate --database world --noinput -v0

run: migrate local-base-url
	$(BIN)/python manage.py seeddemo --demo-run
	$(BIN)/python manage.py seedhistory --calls 400 --once
	@echo
	@echo "  Countersign: http://127.0.0.1:$(PORT)/  (sign in as reviewer or admin; password:" \
		"$$(if [ -n "$$DESK_DEMO_PASSWORD" ]; then echo 'DESK_DEMO_PASSWORD'; \
		else cat var/demo-password.txt 2>/dev/null || echo 'see seeddemo above'; fi))"
	@echo
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/honcho start -p $(PORT)

# A fresh demo: the databases, the broker, the sandbox, the password and var/local.env
# go; the virtualenv stays. The next `make run` seeds everything anew.
reset:
	rm -rf var/
	@echo "The demo is gone; make run starts a fresh one."

# The suite runs in parallel (pytest-xdist): TEST_WORKERS processes, each with its own
# test databases, Redis database and ports (tests/support.py); a worker that is done
# takes tests still waiting in another's share. `make test TEST_WORKERS=0`: one process.
TEST_WORKERS ?= auto
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal

test: install-dev
	$(BIN)/python -m ruff check .
	$(BIN)/python -m ruff format --check .
	$(PYTEST) $(PYTEST_ARGS)

# The suite measured line by line, Celery workers and manage.py subprocesses included.
coverage: install-dev
	rm -rf var/coverage && mkdir -p var/coverage
	$(BIN)/python -m coverage run -m pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)
	$(BIN)/python -m coverage combine -q
	$(BIN)/python -m coverage report

lint: install-dev
	$(BIN)/python -m ruff check .
	$(BIN)/python -m ruff format --check .

# The bench measures with DEBUG off, as in production: a throwaway key, no web.
bench: install
	$(BIN)/python bench/step_overhead.py
	$(BIN)/python bench/sealing.py
	$(BIN)/python bench/gate_aggregates.py
	$(BIN)/python bench/rawsql.py
	$(BIN)/python bench/stuck.py
	$(BIN)/python bench/analytics.py
	$(BIN)/python bench/external_calls.py
	$(BIN)/python bench/record_cost.py

clean:
	rm -rf var/ .pytest_cache

# The production configuration: PostgreSQL for both databases, Redis as the broker
# of the integration tests' workers. Needs the servers of .ci/services running.
# The browser tests ran in `make test` already: what they add is pages and scripts,
# which do not change with the database (the pages' queries run here through the
# test client); leaving them out keeps CI under 40 minutes on 2 cores. So do the
# `newcomer` tests: the docs' sessions on `make run`'s set-up (SQLite, the embedded
# broker) and a generated agent package's own tests (SQLite whatever runs them).
# `make test-production PRODUCTION_MARKS=` runs them here too.
PG_URL ?= postgres://countersign:countersign@127.0.0.1:5432
PRODUCTION_MARKS ?= not e2e and not newcomer
test-production: install-dev
	DATABASE_URL=$(PG_URL)/countersign WORLD_DATABASE_URL=$(PG_URL)/countersign_world \
	DESK_TEST_BROKER_URL=redis://127.0.0.1:6379/15 $(PYTEST) -m "$(PRODUCTION_MARKS)" $(PYTEST_ARGS)

# The random-kill soak (bench/soak.py): real workers SIGKILLed at random moments on
# PostgreSQL + Redis, invariants checked after every trial; exits 1 on a violation.
# CI runs 12 trials; `make soak SOAK_TRIALS=200` for the full proof, in one run.
# `make soak-embedded SOAK_TRIALS=100`: the same on `make run`'s SQLite + embedded broker.
SOAK_TRIALS ?= 20
soak: install
	bash .ci/services
	$(BIN)/python bench/soak.py --trials $(SOAK_TRIALS)

soak-embedded: install
	$(BIN)/python bench/soak.py --trials $(SOAK_TRIALS) --db sqlite --broker filesystem
