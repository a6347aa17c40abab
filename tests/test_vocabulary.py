"""One name per concept (docs/api.md): new names work, old ones warn and still work, conn ids are templated."""

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


def test_advisory_sensor_old_names_warn_and_map_to_the_new_ones():
    with pytest.warns(DeprecationWarning) as warned:
        sensor = JetStreamAdvisorySensor(task_id="w", advisory="batch_abandoned", stream="ORDERS", batch="b1",
                                         since=SINCE)
    said = " | ".join(str(w.message) for w in warned)
    for old, new in (("stream", "advisory_stream"), ("batch", "batch_id"), ("since", "start_time")):
        assert f"{old}= is deprecated and will be removed in 2.0; use {new}=" in said
    assert (sensor.advisory_stream, sensor.batch_id, sensor.start_time) == ("ORDERS", "b1", SINCE)
    assert {w.filename for w in warned} == {__file__}  # points at the DAG's line, not at Airflow's internals
    flt = sensor.advisory_filter()
    assert (flt.stream, flt.batch) == ("ORDERS", "b1")
    with pytest.raises(TypeError, match="give advisory_stream= only"):
        JetStreamAdvisorySensor(task_id="w", advisory="batch_abandoned", stream="A", advisory_stream="B")


def test_advisory_trigger_loads_old_serialized_kwargs_and_writes_new_ones():
    old = {"advisory": "batch_abandoned", "stream": "ORDERS", "consumer": None, "batch": "b1", "reason": None,
           "match": None, "since": SINCE, "expect": "present", "capture_stream": "ADVISORIES", "quiet_until": None,
           "nats_conn_id": "nats_default", "poll_timeout": 2.0, "timeout_at": None, "report_gap": True}
    with pytest.warns(DeprecationWarning) as warned:
        trigger = JetStreamAdvisoryTrigger(**old)
    said = " | ".join(str(w.message) for w in warned)
    for name in ("poll_timeout", "stream", "batch", "since"):
        assert f"{name}= is deprecated" in said
    _, kwargs = trigger.serialize()
    assert {k: kwargs[k] for k in ("advisory_stream", "batch_id", "start_time", "fetch_timeout")} == {
        "advisory_stream": "ORDERS", "batch_id": "b1", "start_time": SINCE, "fetch_timeout": 2.0}
    assert not {"stream", "batch", "since", "poll_timeout"} & set(kwargs)
    assert JetStreamAdvisoryTrigger(**kwargs).serialize()[1] == kwargs
    with pytest.raises(TypeError, match="unexpected arguments"):
        JetStreamAdvisoryTrigger(advisory="batch_abandoned", polltimeout=1)


def test_message_sensor_and_trigger_fetch_timeout():
    with pytest.warns(DeprecationWarning, match="poll_timeout= is deprecated"):
        sensor = JetStreamMessageSensor(task_id="m", stream="S", apply_function=len, poll_timeout="3s")
    assert sensor.fetch_timeout == 3.0
    old = {"stream": "S", "apply_function": "builtins.len", "start_seq": 1, "poll_timeout": 4.0}
    with pytest.warns(DeprecationWarning):
        _, kwargs = JetStreamAwaitMessageTrigger(**old).serialize()
    assert kwargs["fetch_timeout"] == 4.0 and "poll_timeout" not in kwargs
    assert JetStreamAwaitMessageTrigger(**kwargs).fetch_timeout == 4.0


def test_consumer_reset_and_capture_stream_old_names():
    with pytest.warns(DeprecationWarning, match="seq= is deprecated"):
        reset = JetStreamConsumerResetOperator(task_id="r", stream="S", consumer="C", seq=5)
    assert reset.start_seq == 5 and "start_seq" in reset.template_fields
    with pytest.warns(DeprecationWarning, match="time= is deprecated"):
        assert JetStreamConsumerResetOperator(task_id="r", stream="S", consumer="C", time=SINCE).start_time == SINCE
    with pytest.warns(DeprecationWarning, match="use capture_stream="):
        capture = JetStreamAdvisoryStreamOperator(task_id="c", stream="CAPTURED")
    assert capture.capture_stream == "CAPTURED"
    assert JetStreamAdvisoryStreamOperator(task_id="c").capture_stream == "ADVISORIES"


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


def test_durable_source_old_signature_warns_and_still_works():
    with pytest.warns(DeprecationWarning, match="mode=, consumer= are deprecated"):
        op = JetStreamDurableSourceOperator(task_id="o", stream="AGG", source="ORIGIN", mode="user", consumer="IN")
    assert op.user_managed == {"consumer": "IN"} and op.spec().consumer == "IN"
    with pytest.warns(DeprecationWarning):
        stray = JetStreamDurableSourceOperator(task_id="o", stream="AGG", source="ORIGIN", consumer="IN")
    with pytest.raises(InvalidRequestError) as info:  # as before: user arguments on a server-managed source
        stray.spec()
    assert info.value.reason == "invalid_source"
    with pytest.raises(TypeError, match="give user_managed= only"):
        JetStreamDurableSourceOperator(task_id="o", stream="AGG", source="ORIGIN", user_managed={}, mode="user")
