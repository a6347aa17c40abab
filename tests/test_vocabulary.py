"""One name per concept (docs/api.md): the names work, names never released are refused, conn ids are templated."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from datetime import UTC, datetime

import pytest
from airflow.sdk import BaseOperator

import airflow_jetstream.operators
import airflow_jetstream.sensors
from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.operators.advisory import JetStreamAdvisoryStreamOperator
from airflow_jetstream.operators.consumer import JetStreamConsumerResetOperator
from airflow_jetstream.operators.sourcing import JetStreamDurableSourceOperator
from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator
from airflow_jetstream.sensors.advisory import JetStreamAdvisorySensor
from airflow_jetstream.sensors.message import JetStreamMessageSensor
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


# 0.1.0 is the first release: names that were never released are refused, not translated.
@pytest.mark.parametrize(("make", "old"), [
    (lambda: JetStreamAdvisorySensor(task_id="w", advisory="batch_abandoned", stream="ORDERS"), "stream"),
    (lambda: JetStreamAdvisorySensor(task_id="w", advisory="batch_abandoned", batch="b1"), "batch"),
    (lambda: JetStreamAdvisorySensor(task_id="w", advisory="batch_abandoned", since=SINCE), "since"),
    (lambda: JetStreamMessageSensor(task_id="m", stream="S", apply_function=len, poll_timeout=3), "poll_timeout"),
    (lambda: JetStreamConsumerResetOperator(task_id="r", stream="S", consumer="C", seq=5), "seq"),
    (lambda: JetStreamConsumerResetOperator(task_id="r", stream="S", consumer="C", time=SINCE), "time"),
    (lambda: JetStreamAdvisoryStreamOperator(task_id="c", stream="CAPTURED"), "stream"),
    (lambda: JetStreamDurableSourceOperator(task_id="o", stream="A", source="O", mode="user"), "mode"),
    (lambda: JetStreamDurableSourceOperator(task_id="o", stream="A", source="O", consumer="IN"), "consumer"),
    (lambda: JetStreamAdvisoryTrigger(advisory="batch_abandoned", poll_timeout=2.0), "poll_timeout"),
    (lambda: JetStreamAdvisoryTrigger(advisory="batch_abandoned", since=SINCE), "since"),
    (lambda: JetStreamAwaitMessageTrigger(stream="S", apply_function="builtins.len", start_seq=1, poll_timeout=4),
     "poll_timeout"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_names_that_were_never_released_are_refused(make, old):
    with pytest.raises(TypeError, match=old):
        make()


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
