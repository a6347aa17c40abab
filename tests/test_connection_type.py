"""A connection of another type, or an id no connection has, handed to anything ``nats``: a typed error naming the
connection, its type and the fix, from the hook, an operator, a sensor's poke and a trigger alike.

Before, ``spark_default`` (host ``local[2]``) reached the server-list parser and came out as a ``ValueError``
("Invalid IPv6 URL"), and a missing id as Airflow's bare ``AirflowNotFoundException``.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from airflow.providers.common.compat.sdk import AirflowNotFoundException

from airflow_jetstream.client.errors import InvalidSettingsError, JetStreamError
from airflow_jetstream.hooks.jetstream import ConnectionNotFoundError, ConnectionTypeError, JetStreamHook
from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator
from airflow_jetstream.sensors.consumer import JetStreamConsumerDrainedSensor
from airflow_jetstream.triggers.consumer import JetStreamConsumerDrainedTrigger


@pytest.fixture
def spark_default(monkeypatch: pytest.MonkeyPatch) -> str:
    """What `make up` and the Spark provider define: ``spark_default``, type ``spark``, host ``local[2]``."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    return "spark_default"


def _assert_names_the_type(error: JetStreamError) -> None:
    assert isinstance(error, ConnectionTypeError) and isinstance(error, InvalidSettingsError)
    assert error.reason == "wrong_connection_type"
    assert "'spark_default' is of type 'spark', not 'nats'" in error.message
    assert "nats_conn_id=" in error.message


def test_the_hook_refuses_a_connection_of_another_type(spark_default: str) -> None:
    with pytest.raises(ConnectionTypeError) as raised:
        JetStreamHook(spark_default).get_settings()
    _assert_names_the_type(raised.value)
    with pytest.raises(ConnectionTypeError) as raised:
        asyncio.run(JetStreamHook(spark_default).aget_settings())
    _assert_names_the_type(raised.value)
    ok, message = JetStreamHook(spark_default).test_connection()  # the Test button, were it offered
    assert ok is False and "of type 'spark'" in message


def test_a_missing_connection_id_says_how_to_define_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_NATS_NOWHERE", raising=False)
    for resolve in (lambda h: h.get_settings(), lambda h: asyncio.run(h.aget_settings())):
        with pytest.raises(ConnectionNotFoundError) as raised:
            resolve(JetStreamHook("nats_nowhere"))
        error = raised.value
        assert isinstance(error, AirflowNotFoundException), "Airflow's own not-found handlers still apply"
        assert error.reason == "connection_not_found"
        assert "connection 'nats_nowhere' is not defined" in error.message
        assert "AIRFLOW_CONN_NATS_NOWHERE" in error.message and "type 'nats'" in error.message


def test_an_operator_fails_with_the_typed_error(spark_default: str) -> None:
    op = JetStreamEnsureStreamOperator(task_id="ensure", nats_conn_id=spark_default,
                                       config={"name": "WRONG_TYPE", "subjects": ["wrong.type.>"]})
    with pytest.raises(ConnectionTypeError) as raised:
        op.execute(context={})
    _assert_names_the_type(raised.value)


def test_a_sensor_poke_fails_with_the_type_named(spark_default: str) -> None:
    sensor = JetStreamConsumerDrainedSensor(task_id="drained", nats_conn_id=spark_default, stream="S",
                                            consumer="C", deferrable=False)
    with pytest.raises(ConnectionTypeError) as raised:
        sensor.poke(context={})
    _assert_names_the_type(raised.value)


def test_a_trigger_ends_with_a_typed_error_event(spark_default: str) -> None:
    trigger = JetStreamConsumerDrainedTrigger(stream="S", consumer="C", nats_conn_id=spark_default, poll_interval=1)

    async def first_event():
        async for event in trigger.run():
            return event.payload

    payload = asyncio.run(first_event())
    assert payload["status"] == "error", payload
    assert payload["error"]["error"] == "ConnectionTypeError"
    assert payload["error"]["reason"] == "wrong_connection_type"
    assert "of type 'spark'" in payload["error"]["message"]


def test_a_connection_without_a_type_is_still_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bare JSON connection in AIRFLOW_CONN_* (no conn_type) has no other type to refuse."""
    monkeypatch.setenv("AIRFLOW_CONN_NATS_UNTYPED", json.dumps({"host": "nats1.example.com", "port": 4333}))
    assert JetStreamHook("nats_untyped").get_settings().servers == ("nats://nats1.example.com:4333",)
