"""The public API users can pin: ``airflow_jetstream.client.__all__`` against docs/api.md and the package's
error classes, ``py.typed``, and input checks every entry point shares (a string where subjects go)."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import airflow_jetstream
import airflow_jetstream.client as client
from airflow_jetstream.client.admin.consumers import normalize_consumer_config
from airflow_jetstream.client.admin.streams import normalize_stream_config
from airflow_jetstream.client.admin.worker_consumers import normalize_subjects
from airflow_jetstream.client.advisories.capture import capture_stream_config
from airflow_jetstream.client.errors import ConsumerConfigError, InvalidSubjectError, JetStreamError, StreamConfigError
from airflow_jetstream.client.reading.consume import consume
from airflow_jetstream.client.reading.read_plan import plan_read
from airflow_jetstream.client.subjects import validate_subjects

REPO = Path(__file__).resolve().parents[1]


def _documented_names() -> set[str]:
    text = (REPO / "docs" / "api.md").read_text()
    section = text.split("### What `airflow_jetstream.client` exports", 1)[1].split("\n#", 1)[0]
    listed = section.split("\n- ", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"`(\w+)`", listed))


def _client_error_classes() -> set[type[JetStreamError]]:
    classes = set()
    for module in pkgutil.walk_packages(client.__path__, "airflow_jetstream.client."):
        for _, obj in inspect.getmembers(importlib.import_module(module.name), inspect.isclass):
            if issubclass(obj, JetStreamError) and obj.__module__.startswith("airflow_jetstream.client"):
                classes.add(obj)
    return classes


def test_all_is_what_docs_api_lists() -> None:
    assert len(client.__all__) == len(set(client.__all__))
    documented = _documented_names()
    assert set(client.__all__) - documented == set(), "exported but not in docs/api.md"
    assert documented - set(client.__all__) == set(), "in docs/api.md but not exported"


def test_all_exports_every_error_class_and_no_internals() -> None:
    errors = _client_error_classes()
    assert {"LeaderUnavailableError", "FastBatchError", "KeyNotFoundError", "SourceUnhealthyError"} <= {
        cls.__name__ for cls in errors}
    missing = sorted(cls.__name__ for cls in errors if cls.__name__ not in client.__all__)
    assert not missing, f"error classes missing from airflow_jetstream.client.__all__: {missing}"
    for name in client.__all__:
        assert not name.startswith("_") and getattr(client, name) is not None
    assert "stored_sequences" not in client.__all__


_LAZY_PROBE = """
import json, sys
from airflow_jetstream.client.settings import ConnectionSettings
before = sorted(m for m in ("nats", "airflow_jetstream.client.batches.batcher") if m in sys.modules)
from airflow_jetstream.client import Batcher, open_connection
import airflow_jetstream.client as client
hidden = sorted(set(client.__all__) - set(dir(client)))
print(json.dumps({"before": before, "after": "nats" in sys.modules, "dir": hidden}))
"""


def test_the_client_package_imports_a_name_only_when_it_is_used() -> None:
    """A Spark worker unpickling the data source, or a DAG file needing ``ConnectionSettings``, does not pay
    for every client module; ``from airflow_jetstream.client import X`` still works for every name."""
    probe = subprocess.run([sys.executable, "-c", _LAZY_PROBE], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(probe.stdout) == {"before": [], "after": True, "dir": []}
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        _ = client.not_a_name


@pytest.mark.parametrize("package", ["advisories", "kv", "ledger", "sourcing"])
def test_client_subpackages_resolve_every_exported_name_on_first_use(package: str) -> None:
    """``from airflow_jetstream.client.kv import put_key`` works for every name of ``__all__``, though importing
    the subpackage imports none of its modules (so its nats-free modules stay cheap to import)."""
    module = importlib.import_module(f"airflow_jetstream.client.{package}")
    assert set(module.__all__) <= set(dir(module))
    for name in module.__all__:
        value = getattr(module, name)
        assert value is not None and getattr(module, name) is value
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        _ = module.not_a_name


def test_the_package_is_marked_typed() -> None:
    assert (Path(airflow_jetstream.__file__).parent / "py.typed").is_file()
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'\[tool\.setuptools\.package-data\]\s*airflow_jetstream = \["py\.typed"\]', pyproject)


@pytest.mark.parametrize("check", [
    lambda s: validate_subjects(s),
    lambda s: normalize_stream_config({"name": "ORDERS", "subjects": s}),
    lambda s: normalize_consumer_config({"durable_name": "c", "filter_subjects": s}),
    lambda s: normalize_subjects(s),
    lambda s: capture_stream_config(subjects=s),
], ids=["validate_subjects", "stream", "consumer", "worker_consumer", "capture_stream"])
def test_a_string_where_subjects_go_says_it_must_be_a_list(check) -> None:
    with pytest.raises((InvalidSubjectError, StreamConfigError, ConsumerConfigError)) as info:
        check("orders.>")
    assert "must be a list" in str(info.value) and "['orders.>']" in str(info.value)
    assert "empty token" not in str(info.value)


@pytest.mark.parametrize("call", [
    lambda s: plan_read(None, "ORDERS", subjects=s),  # type: ignore[arg-type]
    lambda s: consume(None, "ORDERS", print, subjects=s),  # type: ignore[arg-type]
], ids=["plan_read", "consume"])
def test_readers_refuse_a_string_of_subjects_before_using_the_connection(call) -> None:
    with pytest.raises(InvalidSubjectError, match="must be a list"):
        asyncio.run(call("orders.>"))


def test_lists_of_subjects_still_pass() -> None:
    assert validate_subjects(("orders.>", "audit.*")) == ["orders.>", "audit.*"]
    assert normalize_stream_config({"name": "ORDERS", "subjects": ["orders.>"]})["subjects"] == ["orders.>"]
