# Statekeeper: `make demo` and `make test` work on a fresh machine with only Python 3.11+ and Java 17.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
UV     := $(VENV)/bin/uv
UV_VERSION := 0.13.8
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-fast lint bench clean browser flink airflow bytecode

install: $(STAMP)

# Every extra (Spark, Airflow, S3, PostgreSQL) and the test tools: what `make test` needs.
$(STAMP): pyproject.toml setup.py requirements/overrides.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Statekeeper needs Python 3.11+, found " + sys.version.split()[0]'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"
	$(UV) pip install --python $(PY) --override requirements/overrides.txt -e '.[all,dev]'
	$(MAKE) --no-print-directory bytecode BYTECODE_DIRS="$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	@touch $(STAMP)

# Byte-compiled modules, written once. Where PYTHONDONTWRITEBYTECODE is set (as on CI machines)
# Python never caches what it compiles, so every process (each test's CLI, Spark worker and
# Airflow task) would compile Airflow, SQLAlchemy and pyarrow from source again: importing
# airflow.sdk took 4.5 s that way and 1.9 s from bytecode. Python still reads .pyc files it finds,
# and ignores one whose source changed since. Our own packages are compiled before each run.
BYTECODE_DIRS ?= state_engine plugins dags demo
bytecode:
	@# (|| true: a package may ship a template named .py that does not compile; it stays source)
	@$(PY) -m compileall -q -j 0 $(BYTECODE_DIRS) >/dev/null || true

demo: install bytecode
	$(PY) -m demo

# Lint first: ruff and mypy must be clean before the suite runs (CI runs `make test`).
test: install lint browser flink bytecode
	STATEKEEPER_FLINK_HOME="$$(echo $(CURDIR)/$(FLINK_VENV)/lib/python*/site-packages/pyflink)" \
	STATEKEEPER_FLINK_1_20_HOME="$$(echo $(CURDIR)/$(FLINK_1_20_VENV)/lib/python*/site-packages/pyflink)" \
		$(PY) -m pytest -n auto --dist loadgroup --no-loadscope-reorder

# The loop while working (CONTRIBUTING.md): every test that starts no JVM, no Flink cluster, no
# Airflow DAG run and no browser, with the catalog on SQLite only, spread over the cores (one
# module's tests stay on one worker, so a module's fixtures are built once). The markers follow
# from the fixtures a test uses (tests/conftest.py); `make test` above stays the whole suite.
FAST_MARKERS := not slow and not spark and not flink and not cluster and not browser and not dag_run and not postgres
test-fast: install bytecode
	$(PY) -m pytest -n auto --dist loadgroup --no-loadscope-reorder -m "$(FAST_MARKERS)"

# A real Apache Flink for the tests that start a cluster (tests/fixtures/flink_cluster.py): the
# apache-flink package in a venv of its own, as it pins pyarrow and protobuf versions the
# project's own exclude. If it cannot be installed this says so, and those tests skip (under
# CI=true they fail instead). Flink 1.20 too, in another venv, for the proof that it restores
# the savepoints written from its snapshots (tests/flink/test_rewrite_flink_1_20.py).
FLINK_VENV    := .venv-flink
FLINK_VERSION := 2.3.0
FLINK_1_20_VENV    := .venv-flink-1.20
FLINK_1_20_VERSION := 1.20.5
FLINK_STAMPS := $(FLINK_VENV)/.installed-$(FLINK_VERSION) $(FLINK_1_20_VENV)/.installed-$(FLINK_1_20_VERSION)
flink: $(FLINK_STAMPS)

# each stamp: <venv>/.installed-<version>
$(FLINK_STAMPS): | $(STAMP)
	@{ $(UV) venv --quiet --allow-existing --python $(PYTHON) $(@D) \
		&& $(UV) pip install --quiet --python $(@D)/bin/python "apache-flink==$(@F:.installed-%=%)" \
		&& touch $@; } \
		|| echo "warning: could not install apache-flink $(@F:.installed-%=%) into $(@D); the tests of that Flink will skip (fail under CI=true)"

# The browser test (tests/airflow/test_plugin_browser.py) drives Debian's headless Chromium. As
# root with apt-get, a missing chromium is installed; otherwise this only says how, and the test
# skips (under CI=true it fails instead).
browser:
	@if command -v chromium >/dev/null 2>&1 || [ -n "$$CHROMIUM" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium (apt) for the browser test"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
			|| echo "warning: could not install chromium; the browser test will skip (fail under CI=true)"; \
	else \
		echo "note: chromium is missing and installing it needs root: sudo apt-get install -y chromium;"; \
		echo "      until then the browser test skips (and fails under CI=true)"; \
	fi

# Airflow on the embedded defaults: one process tree (`airflow standalone`: scheduler, DAG
# processor, triggerer, API server) on SQLite under $STATEKEEPER_HOME/airflow (default
# .statekeeper/airflow). Ctrl-C stops the whole tree within seconds: tools/run_group.py runs it as
# a process group of its own and terminates (after 5 s kills) every process in it.
# PATH: standalone starts its components as `airflow ...` subprocesses.
# Loopback only by default: the simple auth manager keeps its password in a plain file, so the UI
# is not offered to the network unless asked (`make airflow AIRFLOW_HOST=0.0.0.0`). Task slots
# follow the machine's cores (Airflow's default is 32 on any machine); one API server worker.
# The DAGs come up unpaused here, so the hourly maintenance and daily TTL cleanup really run.
AIRFLOW_PORT ?= 8080
AIRFLOW_HOST ?= 127.0.0.1
AIRFLOW_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 8 ] && n=8; echo $$n)
# STATEKEEPER_HOME from the environment (or the command line) wins; relative to this directory
SK_HOME      := $(abspath $(or $(STATEKEEPER_HOME),$(CURDIR)/.statekeeper))
AIRFLOW_ENV  := STATEKEEPER_HOME=$(SK_HOME) AIRFLOW_HOME=$(SK_HOME)/airflow \
	AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/dags AIRFLOW__CORE__PLUGINS_FOLDER=$(CURDIR)/plugins \
	AIRFLOW__CORE__LOAD_EXAMPLES=False AIRFLOW__API__PORT=$(AIRFLOW_PORT) \
	AIRFLOW__API__HOST=$(AIRFLOW_HOST) AIRFLOW__API__WORKERS=1 \
	AIRFLOW__CORE__PARALLELISM=$(AIRFLOW_WORKERS) \
	AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES=1 \
	AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=False \
	AIRFLOW__API__BASE_URL=http://localhost:$(AIRFLOW_PORT) PATH="$(CURDIR)/$(VENV)/bin:$$PATH"

airflow: install
	@mkdir -p $(SK_HOME)/airflow
	STATEKEEPER_HOME=$(SK_HOME) $(VENV)/bin/statectl catalog upgrade
	@echo ""
	@echo "Airflow UI:  http://localhost:$(AIRFLOW_PORT)/  (Statekeeper pages: Browse > Statekeeper,"
	@echo "             or http://localhost:$(AIRFLOW_PORT)/statekeeper/)"
	@echo "Listening:   $(AIRFLOW_HOST):$(AIRFLOW_PORT) only (another: make airflow AIRFLOW_HOST=0.0.0.0)"
	@echo "Tasks:       $(AIRFLOW_WORKERS) at a time (make airflow AIRFLOW_WORKERS=N)"
	@echo "Login:       user admin; the password is generated on first start into"
	@echo "             $(SK_HOME)/airflow/simple_auth_manager_passwords.json.generated"
	@echo "Schedules:   new DAGs start unpaused (maintenance hourly, TTL cleanup daily, health);"
	@echo "             one paused earlier: $(VENV)/bin/airflow dags unpause statekeeper_maintenance"
	@echo "             (with AIRFLOW_HOME=$(SK_HOME)/airflow), or its toggle in the UI"
	@echo "Stop:        Ctrl-C"
	@echo ""
	$(AIRFLOW_ENV) exec $(PY) tools/run_group.py $(VENV)/bin/airflow standalone

# ruff (lint and format) over the repository; mypy over what [tool.mypy] in pyproject.toml names
# (state_engine/ strict; plugins/, dags/ and tests/ with mypy's default checks).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: install
	@set -e; for script in bench/*.py; do echo "== $$script"; $(PY) $$script; done

clean:
	rm -rf $(VENV) $(FLINK_VENV) $(FLINK_1_20_VENV) .statekeeper .pytest_cache .ruff_cache .mypy_cache .hypothesis
