"""Source caught-up / consumer drained sensors (poke, deferrable) and their triggers on a real server."""

from __future__ import annotations

import asyncio

import pytest
from airflow.sdk.exceptions import AirflowException, TaskDeferred

from airflow_jetstream.client import ensure_stream
from airflow_jetstream.client.admin.consumers import ensure_consumer, pause_consumer
from airflow_jetstream.client.sourcing.provision import DurableSource, provision_durable_source
from airflow_jetstream.client.sourcing.spec import source_status
from airflow_jetstream.sensors.consumer import JetStreamConsumerDrainedSensor, JetStreamSourceCaughtUpSensor
from airflow_jetstream.triggers.consumer import JetStreamConsumerDrainedTrigger, JetStreamSourceCaughtUpTrigger
from tests.test_sourcing import publish, run, wait_for

SOURCE_CONSUMER = "AGG_SRC_ORIGIN"


async def _paused_source_with_backlog(conn) -> None:
    await ensure_stream(conn, {"name": "ORIGIN", "subjects": ["o.>"], "retention": "workqueue"})
    await provision_durable_source(conn, DurableSource("AGG", "ORIGIN", mode="user"))
    await pause_consumer(conn, "ORIGIN", SOURCE_CONSUMER, "2999-01-01T00:00:00Z")
    await publish(conn, "o", 50)


async def _work_queue_with_pending(conn) -> None:
    await ensure_stream(conn, {"name": "JOBS", "subjects": ["jobs.>"]})
    await ensure_consumer(conn, "JOBS", {"name": "WORKER", "ack_policy": "explicit"})
    await publish(conn, "jobs", 20)


async def _drain(conn) -> None:
    sub = await conn.js.pull_subscribe_bind("WORKER", stream="JOBS")
    for msg in await sub.fetch(20, timeout=2):
        await msg.ack_sync()


async def _run_trigger_until(trigger, action) -> dict:
    """Start the trigger, check it has not fired, do ``action``, then return its event payload."""
    events = trigger.run()
    first = asyncio.ensure_future(anext(events))
    done, _ = await asyncio.wait({first}, timeout=1.0)
    assert not done, f"trigger fired before the condition held: {first.result().payload if done else ''}"
    await action()
    event = await asyncio.wait_for(first, timeout=30)
    await events.aclose()
    return event.payload


def test_triggers_serialize_round_trip():
    for trigger in (JetStreamSourceCaughtUpTrigger(stream="AGG", source="O", domain="edge", nats_conn_id="c",
                                                   poll_interval=2),
                    JetStreamConsumerDrainedTrigger(stream="S", consumer="C", poll_interval=3)):
        path, kwargs = trigger.serialize()
        module, name = path.rsplit(".", 1)
        cls = getattr(__import__(module, fromlist=[name]), name)
        assert cls is type(trigger)
        assert cls(**kwargs).serialize() == (path, kwargs)


def test_drained_trigger_fires_once_the_consumer_is_drained(nats_conn, settings):
    run(settings, _work_queue_with_pending)
    trigger = JetStreamConsumerDrainedTrigger(stream="JOBS", consumer="WORKER", poll_interval=0.2)

    async def go() -> dict:
        from airflow_jetstream.client import open_connection

        async with open_connection(settings) as conn:
            return await _run_trigger_until(trigger, lambda: _drain(conn))

    payload = asyncio.run(go())
    assert payload["status"] == "success"
    assert payload["result"]["drained"] and payload["result"]["ack_floor"]["stream_seq"] == 20


def test_caught_up_trigger_fires_once_the_source_catches_up(nats_conn, settings):
    run(settings, _paused_source_with_backlog)
    trigger = JetStreamSourceCaughtUpTrigger(stream="AGG", source="ORIGIN", poll_interval=0.2)

    async def go() -> dict:
        from airflow_jetstream.client import open_connection

        async with open_connection(settings) as conn:
            return await _run_trigger_until(trigger, lambda: pause_consumer(conn, "ORIGIN", SOURCE_CONSUMER, None))

    payload = asyncio.run(go())
    assert payload["status"] == "success"
    result = payload["result"]
    assert result["caught_up"] and result["lag"] == 0 and result["consumer"] == SOURCE_CONSUMER
    assert result["consumer_num_pending"] == 0


def test_triggers_report_errors_as_events(nats_conn, settings):
    async def broken_source(conn) -> None:
        await ensure_stream(conn, {"name": "ORIGIN", "subjects": ["o.>"]})
        await ensure_consumer(conn, "ORIGIN", {"name": "PLAIN", "ack_policy": "explicit", "deliver_subject": "d.p"})
        await conn.api_request("STREAM.CREATE.BROKEN", {"name": "BROKEN", "sources": [
            {"name": "ORIGIN", "consumer": {"name": "PLAIN", "deliver_subject": "d.p"}}]})

    run(settings, broken_source)

    async def first_event(trigger) -> dict:
        events = trigger.run()
        event = await asyncio.wait_for(anext(events), timeout=20)
        await events.aclose()
        return event.payload

    missing = asyncio.run(first_event(JetStreamConsumerDrainedTrigger(stream="NOPE", consumer="C")))
    assert missing["status"] == "error" and missing["error"]["reason"] == "stream_not_found"
    broken = asyncio.run(first_event(JetStreamSourceCaughtUpTrigger(stream="BROKEN", source="ORIGIN",
                                                                    poll_interval=0.2)))
    assert broken["status"] == "error" and broken["error"]["err_code"] == 10217
    assert broken["error"]["reason"] == "consumer_not_flow_control"


def test_drained_sensor_poke_and_deferral(nats_conn, settings):
    run(settings, _work_queue_with_pending)
    sensor = JetStreamConsumerDrainedSensor(task_id="drained", stream="JOBS", consumer="WORKER", poke_interval=1,
                                            timeout=60, deferrable=True)
    assert not sensor.poke({}).is_done
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, JetStreamConsumerDrainedTrigger)
    assert trigger.serialize()[1]["consumer"] == "WORKER"
    assert deferred.value.method_name == "execute_complete"
    run(settings, _drain)
    done = sensor.poke({})
    assert done.is_done and done.xcom_value["num_pending"] == 0 and done.xcom_value["num_ack_pending"] == 0
    assert sensor.execute({})["drained"] is True  # already drained: no deferral


def test_caught_up_sensor_poke_and_execute_complete(nats_conn, settings):
    run(settings, _paused_source_with_backlog)
    sensor = JetStreamSourceCaughtUpSensor(task_id="caught_up", stream="AGG", source="ORIGIN", poke_interval=0.2,
                                           timeout=30)
    assert not sensor.poke({}).is_done
    run(settings, pause_consumer, "ORIGIN", SOURCE_CONSUMER, None)
    result = sensor.execute({})  # poke mode until caught up
    assert result["caught_up"] and result["lag"] == 0
    assert sensor.execute_complete({}, {"status": "success", "result": result}) == result
    with pytest.raises(AirflowException) as info:
        sensor.execute_complete({}, {"status": "error", "error": {"message": "stream 'AGG': stream not found",
                                                                  "reason": "stream_not_found"}})
    assert "stream not found" in str(info.value) and "stream_not_found" in str(info.value)


def test_caught_up_sensor_fails_on_a_source_error(nats_conn, settings):
    async def broken(conn) -> None:
        await ensure_stream(conn, {"name": "ORIGIN", "subjects": ["o.>"]})
        await ensure_consumer(conn, "ORIGIN", {"name": "PLAIN", "ack_policy": "explicit", "deliver_subject": "d.p"})
        await conn.api_request("STREAM.CREATE.AGG", {"name": "AGG", "sources": [
            {"name": "ORIGIN", "consumer": {"name": "PLAIN", "deliver_subject": "d.p"}}]})

    run(settings, broken)
    asyncio.run(wait_for(lambda: _has_source_error(settings), 10, "the source error"))
    sensor = JetStreamSourceCaughtUpSensor(task_id="caught_up", stream="AGG", source="ORIGIN", timeout=10)
    with pytest.raises(AirflowException) as info:
        sensor.poke({})
    assert "consumer_not_flow_control" in str(info.value) and "flow-control push consumer" in str(info.value)


async def _has_source_error(settings) -> bool:
    from airflow_jetstream.client import open_connection

    async with open_connection(settings) as conn:
        return (await source_status(conn, "AGG", "ORIGIN"))["error"] is not None


def test_polling_triggers_asking_for_one_state_share_one_request(nats_conn, settings):
    """100 deferred sensors waiting on one consumer in one triggerer: one CONSUMER.INFO per look, not 100; a failed
    look is not reused."""
    run(settings, _work_queue_with_pending)
    calls: list[str] = []

    class Counting(JetStreamConsumerDrainedTrigger):
        async def status(self, conn):
            calls.append(self.consumer)
            return await super().status(conn)

    async def scenario():
        from airflow_jetstream.client import open_connection

        async with open_connection(settings) as conn:
            same = [Counting(stream="JOBS", consumer="WORKER") for _ in range(100)]
            looks = await asyncio.gather(*(t.check(conn) for t in same))
            missing = [Counting(stream="JOBS", consumer="NOPE") for _ in range(2)]
            failures = [await asyncio.gather(t.check(conn), return_exceptions=True) for t in missing]
            return looks, failures, [t.last_seen for t in same]

    looks, failures, seen = asyncio.run(scenario())
    assert looks == [None] * 100 and len(set(seen)) == 1 and "20 pending" in seen[0]
    assert all(type(f[0]).__name__ == "ConsumerNotFoundError" for f in failures)
    assert calls == ["WORKER", "NOPE", "NOPE"]  # one request for the hundred; each failed look asked again
