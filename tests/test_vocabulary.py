"""One name per concept (docs/api.md): the names work, the docs table is what the code takes, conn ids templated."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from airflow.sdk import BaseOperator

import airflow_jetstream.operators
import airflow_jetstream.sensors
import airflow_jetstream.triggers
from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.operators.sourcing import JetStreamDurableSourceOperator
from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator
from airflow_jetstream.spark.options import ReadOptions, WriteOptions
from airflow_jetstream.triggers.advisory import JetStreamAdvisoryTrigger
from airflow_jetstream.triggers.await_message import JetStreamAwaitMessageTrigger
from tests.conftest import set_nats_connection

SINCE = datetime(2026, 1, 1, tzinfo=UTC).isoformat()


def _public_task_classes() -> list[type[BaseOperator]]:
    found = {}
    for package in (airflow_jetstream.operators, airflow_jetstream.sensors):
        for module in pkgutil.iter_modules(package.__path__):
            loaded = importlib.import_module(f"{package.__name__}.{module.name}")
            for name, cls in inspect.getmembers(loaded, inspect.isclass):
                if issubclass(cls, BaseOperator) and cls.__module__ == loaded.__name__ and not name.startswith("_") \
                        and "Base" not in name:
                    found[name] = cls
    return sorted(found.values(), key=lambda cls: cls.__name__)


@pytest.mark.parametrize("cls", _public_task_classes(), ids=lambda cls: cls.__name__)
def test_every_operator_and_sensor_templates_its_conn_id(cls):
    assert "nats_conn_id" in cls.template_fields


def test_a_templated_conn_id_is_rendered_and_used(monkeypatch, nats_server):
    set_nats_connection(monkeypatch, "nats_rendered", nats_server.url)
    op = JetStreamEnsureStreamOperator(task_id="ensure", nats_conn_id="{{ params.conn }}",
                                       config={"name": "RENDERED", "subjects": ["rendered.>"]})
    op.render_template_fields({"params": {"conn": "nats_rendered"}})
    assert op.nats_conn_id == "nats_rendered"
    assert op.execute(context={})["action"] == "created"  # reached the server through the rendered connection


def test_triggers_serialize_the_one_vocabulary():
    kwargs = JetStreamAdvisoryTrigger(advisory="batch_abandoned", advisory_stream="ORDERS", batch_id="b1",
                                      start_time=SINCE, fetch_timeout="2s").serialize()[1]
    assert {k: kwargs[k] for k in ("advisory_stream", "batch_id", "start_time", "fetch_timeout")} == {
        "advisory_stream": "ORDERS", "batch_id": "b1", "start_time": SINCE, "fetch_timeout": 2.0}
    assert JetStreamAdvisoryTrigger(**kwargs).serialize()[1] == kwargs
    _, kwargs = JetStreamAwaitMessageTrigger(stream="S", apply_function="builtins.len", start_seq=1,
                                             fetch_timeout=4.0).serialize()
    assert JetStreamAwaitMessageTrigger(**kwargs).fetch_timeout == 4.0


def test_durable_source_server_managed_takes_no_user_arguments():
    spec = JetStreamDurableSourceOperator(task_id="s", stream="AGG", source="ORIGIN").spec()
    assert spec.mode == "server" and spec.consumer is None
    user = JetStreamDurableSourceOperator(task_id="u", stream="AGG", source="ORIGIN",
                                          user_managed={"consumer": "AGG_IN", "max_ack_pending": 50}).spec()
    assert (user.mode, user.consumer, user.max_ack_pending, user.deliver_subject) == (
        "user", "AGG_IN", 50, "_SRC.AGG.ORIGIN")
    defaults = JetStreamDurableSourceOperator(task_id="d", stream="AGG", source="ORIGIN", user_managed=True)
    assert defaults.user_managed == {} and defaults.spec().consumer == "AGG_SRC_ORIGIN"
    empty = JetStreamDurableSourceOperator(task_id="e", stream="AGG", source="ORIGIN", user_managed={})
    assert empty.spec().mode == "user"
    with pytest.raises(InvalidRequestError, match=r"unknown option.*consumr"):
        JetStreamDurableSourceOperator(task_id="x", stream="AGG", source="ORIGIN", user_managed={"consumr": "X"})


def _public_trigger_classes() -> list[type]:
    found = {}
    for module in pkgutil.iter_modules(airflow_jetstream.triggers.__path__):
        loaded = importlib.import_module(f"airflow_jetstream.triggers.{module.name}")
        for name, cls in inspect.getmembers(loaded, inspect.isclass):
            if name.endswith("Trigger") and cls.__module__ == loaded.__name__ and not name.startswith("_"):
                found[name] = cls
    return sorted(found.values(), key=lambda cls: cls.__name__)


# ------------------------------------------------------------------ docs/api.md holds the vocabulary

API_MD = Path(__file__).resolve().parents[1] / "docs" / "api.md"
_TICKED = re.compile(r"`([^`]+)`")


def _table(heading: str) -> list[list[str]]:
    """The rows (cells) of the first table after ``heading`` in docs/api.md."""
    lines = API_MD.read_text(encoding="utf-8").split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def _public_classes() -> dict[str, type]:
    return {cls.__name__: cls for cls in _public_task_classes() + _public_trigger_classes()}


def _parameters(cls: type) -> set[str]:
    return set(inspect.signature(cls.__init__).parameters)


def _spark_keys(where: str) -> set[str]:
    keys: set[str] = set()
    if "Spark read" in where or "Spark streaming read" in where:
        keys |= set(ReadOptions.KEYS) | (set(ReadOptions.STREAM_KEYS) if "streaming" in where else set())
    if "write option" in where:
        keys |= set(WriteOptions.KEYS)
    return keys


def test_the_table_of_names_in_the_docs_is_what_the_classes_and_options_take():
    classes = _public_classes()
    rows = _table("## One name per concept")
    assert len(rows) >= 10
    for concept, name, where in rows:
        names = {token for token in _TICKED.findall(name) if re.fullmatch(r"[a-z_]+", token)}
        named = [token for token in _TICKED.findall(where) if token in classes]
        assert named or "every" in where, f"{concept}: 'Where' names no class"
        for cls_name in named:
            assert names & _parameters(classes[cls_name]), f"{cls_name} takes none of {names} ({concept})"
        if "Spark" in where:
            assert names & _spark_keys(where), f"Spark options take none of {names} ({concept})"
