"""``end_from_trigger=True`` on the state and KV sensors, on a real server: the trigger ends its task itself with
``TaskSuccessEvent`` carrying the XCom that ``execute_complete`` returns for the plain event, and logs the sensor's
``Done: ...`` line; an error or a timeout stays the plain event (a worker fails the task as before). The deployment
test (tests/test_airflow_deployment.py) runs such sensors through a real scheduler and triggerer."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout, TaskDeferred
from airflow.serialization.serialized_objects import BaseSerialization, DagSerialization
from airflow.triggers.base import TaskSuccessEvent, TriggerEvent

from airflow_jetstream.client import ensure_stream
from airflow_jetstream.client.admin.consumers import ensure_consumer
from airflow_jetstream.client.kv.keys import put_key
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.sensors.consumer import JetStreamConsumerDrainedSensor
from airflow_jetstream.sensors.kv import JetStreamKeyValueSensor
from airflow_jetstream.sensors.ledger import JetStreamBatchLedgerSensor
from airflow_jetstream.triggers.base import JetStreamResultTrigger
from tests.test_sourcing import publish, run

TASK = SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=-1)  # what the triggerer sets


class Supervisor:
    """Stands in for the triggerer's supervisor (a separate process in Airflow): records what the trigger sends it.
    The deployment test has the real one store the XCom."""

    def __init__(self) -> None:
        self.sent: list[Any] = []  # the XComs (a connection is read from the environment: it asks nothing)

    async def asend(self, msg: Any) -> None:
        self.record(msg)

    def send(self, msg: Any) -> None:
        self.record(msg)

    def record(self, msg: Any) -> None:
        if type(msg).__name__ == "SetXCom":
            self.sent.append(msg)


@pytest.fixture
def supervisor(monkeypatch) -> Supervisor:
    from airflow.sdk.execution_time import task_runner

    comms = Supervisor()
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", comms, raising=False)
    return comms


async def _drained_queue(conn) -> None:
    await ensure_stream(conn, {"name": "JOBS", "subjects": ["jobs.>"]})
    await ensure_consumer(conn, "JOBS", {"name": "WORKER", "ack_policy": "explicit"})
    await publish(conn, "jobs", 3)
    sub = await conn.js.pull_subscribe_bind("WORKER", stream="JOBS")
    for msg in await sub.fetch(3, timeout=2):
        await msg.ack_sync()


def _first_event(trigger: JetStreamResultTrigger, task_instance: Any = TASK) -> TriggerEvent:
    trigger.task_instance = task_instance

    async def first() -> TriggerEvent:
        events = trigger.run()
        event = await asyncio.wait_for(anext(events), timeout=20)
        await events.aclose()
        return event

    return asyncio.run(first())


def test_each_sensors_trigger_ends_its_task_with_the_xcom_execute_complete_returns(nats_conn, settings, capsys,
                                                                                  supervisor):
    async def conditions(conn) -> None:
        await _drained_queue(conn)
        await conn.js.create_key_value(bucket="MODELS")
        await put_key(conn, "MODELS", "model", b"ready")
        ledger = await BatchLedger.open(conn)
        await ledger.record("run-1", "b1", stream="JOBS", count=2, first_seq=1, last_seq=2)

    run(settings, conditions)
    sensors = [
        JetStreamConsumerDrainedSensor(task_id="drained", stream="JOBS", consumer="WORKER", end_from_trigger=True),
        JetStreamKeyValueSensor(task_id="kv", bucket="MODELS", key="model", value="ready", end_from_trigger=True),
        JetStreamBatchLedgerSensor(task_id="ledger", run_id="run-1", state="published", end_from_trigger=True),
    ]
    for sensor in sensors:
        trigger = sensor.make_trigger({})
        assert trigger.serialize()[1]["end_from_trigger"] is True
        capsys.readouterr()
        ended = _first_event(trigger)
        logged = capsys.readouterr().out  # Airflow's logging writes the trigger's log lines there
        assert isinstance(ended, TaskSuccessEvent) and ended.xcoms is None, (sensor.task_id, ended)
        (stored,) = supervisor.sent  # the XCom, sent before the event, as a worker's task sends its result
        supervisor.sent.clear()
        plain = _first_event(type(trigger)(**{**trigger.serialize()[1], "end_from_trigger": False}))
        assert type(plain) is TriggerEvent and supervisor.sent == []
        expected = sensor.execute_complete({}, plain.payload)
        assert type(stored).__name__ == "SetXCom" and stored.key == "return_value"
        assert (stored.dag_id, stored.run_id, stored.task_id, stored.map_index) == ("d", "r", "t", -1)
        assert stored.value == expected  # JSON as it is (the task SDK's serialization of a plain dict)
        done = [line for line in logged.splitlines() if "Done: " in line]
        assert len(done) == 1 and trigger.done_line(expected) in done[0], (sensor.task_id, logged[-2000:])


def test_the_done_lines_say_what_was_reached_with_units(nats_conn, settings, supervisor):
    run(settings, _drained_queue)
    drained = JetStreamConsumerDrainedSensor(task_id="d", stream="JOBS", consumer="WORKER", end_from_trigger=True)
    assert isinstance(_first_event(drained.make_trigger({})), TaskSuccessEvent)
    line = drained.make_trigger({}).done_line(supervisor.sent[0].value)
    assert line == ("Done: JOBS/WORKER: drained (0 pending, 0 awaiting ack, 0 redelivered, acked up to stream "
                    "seq 3)")
    kv = JetStreamKeyValueSensor(task_id="kv", bucket="B", key="k", end_from_trigger=True).make_trigger({})
    assert kv.done_line({"revision": 7}) == "Done: KV B/k matched at revision 7"


def test_errors_and_timeouts_stay_plain_events_that_a_worker_turns_into_the_failure(nats_conn, settings,
                                                                                   supervisor):
    run(settings, _drained_queue)
    sensor = JetStreamConsumerDrainedSensor(task_id="drained", stream="NOPE", consumer="C", end_from_trigger=True,
                                            timeout=5)
    error = _first_event(sensor.make_trigger({}))
    assert type(error) is TriggerEvent and error.payload["status"] == "error"
    with pytest.raises(AirflowException, match="stream_not_found"):
        sensor.execute_complete({}, error.payload)

    waiting = JetStreamConsumerDrainedSensor(task_id="w", stream="JOBS", consumer="LATER", end_from_trigger=True,
                                             timeout=5)
    run(settings, lambda conn: ensure_consumer(conn, "JOBS", {"name": "LATER", "ack_policy": "explicit"}))
    trigger = waiting.make_trigger({})
    trigger.timeout_at = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    timeout = _first_event(trigger)
    assert type(timeout) is TriggerEvent and timeout.payload["status"] == "timeout"
    with pytest.raises(AirflowSensorTimeout, match=r"consumer drained not reached within 5 s\. Last seen: "
                                                   r"JOBS/LATER: not drained \(3 pending"):
        waiting.execute_complete({}, timeout.payload)

    kv = JetStreamKeyValueSensor(task_id="kv", bucket="NO_BUCKET", key="k", end_from_trigger=True)
    kv_trigger = kv.make_trigger({})
    kv_trigger.timeout_at = (datetime.now(UTC) + timedelta(seconds=0.5)).isoformat()
    missing = _first_event(kv_trigger)
    assert type(missing) is TriggerEvent and missing.payload["status"] in ("error", "timeout")
    assert supervisor.sent == []  # no XCom stored


def test_on_airflow_3_2_the_xcom_is_sent_by_the_sync_call_from_a_thread(nats_conn, settings, monkeypatch):
    """Airflow 3.2's task SDK has no ``XCom.aset``, and its triggerer's comms answer a sync ``send`` with
    ``async_to_sync`` (which refuses to run on the event loop's thread): the trigger calls ``XCom.set`` through
    ``sync_to_async``."""
    from airflow.sdk.bases.xcom import BaseXCom
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.xcom import XCom
    from asgiref.sync import async_to_sync

    class Comms32(Supervisor):
        def send(self, msg: Any) -> None:  # as Airflow 3.2's TriggerCommsDecoder.send
            async_to_sync(self.asend)(msg)

    monkeypatch.delattr(BaseXCom, "aset")
    assert not hasattr(XCom, "aset")
    comms = Comms32()
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", comms, raising=False)
    run(settings, _drained_queue)
    sensor = JetStreamConsumerDrainedSensor(task_id="drained", stream="JOBS", consumer="WORKER", end_from_trigger=True)
    assert isinstance(_first_event(sensor.make_trigger({})), TaskSuccessEvent)
    (stored,) = comms.sent
    assert stored.key == "return_value" and stored.value["drained"] is True


def test_a_trigger_whose_xcom_cannot_be_stored_yields_the_plain_event(nats_conn, settings, monkeypatch):
    """Storing the XCom failed (here: no supervisor to send it to): the task resumes on a worker, whose
    ``execute_complete`` returns (stores) the result, instead of ending as success without its XCom."""
    from airflow.sdk.execution_time import task_runner

    monkeypatch.delattr(task_runner, "SUPERVISOR_COMMS", raising=False)
    run(settings, _drained_queue)
    sensor = JetStreamConsumerDrainedSensor(task_id="drained", stream="JOBS", consumer="WORKER", end_from_trigger=True)
    event = _first_event(sensor.make_trigger({}))
    assert type(event) is TriggerEvent and event.payload["status"] == "success"
    assert sensor.execute_complete({}, event.payload)["drained"] is True


def test_a_trigger_run_for_no_task_instance_yields_the_plain_event(nats_conn, settings, supervisor):
    """``airflow dags test`` runs a deferred task's trigger inline, without a task instance, and hands the task only
    the event's payload (a task-end event's is its state): the sensor then gets the event it knows."""
    run(settings, _drained_queue)
    sensor = JetStreamConsumerDrainedSensor(task_id="drained", stream="JOBS", consumer="WORKER", end_from_trigger=True)
    event = _first_event(sensor.make_trigger({}), task_instance=None)
    assert type(event) is TriggerEvent and event.payload["status"] == "success" and supervisor.sent == []
    assert sensor.execute_complete({}, event.payload)["drained"] is True


def test_the_flag_reaches_the_trigger_deferred_from_a_worker_and_started_from_the_triggerer(nats_conn, settings):
    run(settings, lambda conn: ensure_stream(conn, {"name": "JOBS", "subjects": ["jobs.>"]}))
    run(settings, lambda conn: ensure_consumer(conn, "JOBS", {"name": "WORKER", "ack_policy": "explicit"}))
    run(settings, lambda conn: publish(conn, "jobs", 1))
    deferrable = JetStreamConsumerDrainedSensor(task_id="drained", stream="JOBS", consumer="WORKER", deferrable=True,
                                                end_from_trigger=True, timeout=60)
    with pytest.raises(TaskDeferred) as deferred:
        deferrable.execute({})
    assert deferred.value.trigger.serialize()[1]["end_from_trigger"] is True

    with DAG("end_from_trigger_unit", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), schedule=None) as dag:
        JetStreamConsumerDrainedSensor(task_id="drained", stream="{{ params.s }}", consumer="c",
                                       start_from_trigger=True, end_from_trigger=True)
        JetStreamKeyValueSensor(task_id="kv", bucket="b", key="k", start_from_trigger=True, end_from_trigger=True)
        JetStreamBatchLedgerSensor(task_id="ledger", start_from_trigger=True)
    decoded = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    flags = {task_id: BaseSerialization.deserialize(decoded.get_task(task_id).start_trigger_args.trigger_kwargs)
             ["end_from_trigger"] for task_id in ("drained", "kv", "ledger")}
    assert flags == {"drained": True, "kv": True, "ledger": False}
