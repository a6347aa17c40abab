"""JetStreamBatchLedgerSensor (poke + deferrable) and JetStreamBatchLedgerTrigger against a real server."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout, TaskDeferred

from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.sensors.base import TIMEOUT_BACKSTOP
from airflow_jetstream.sensors.ledger import JetStreamBatchLedgerSensor
from airflow_jetstream.triggers.ledger import JetStreamBatchLedgerTrigger, describe_progress
from tests.support.triggers import first_event_payload

RUN = "scheduled__2026-11-25T00:00:00+00:00"


def ledger_do(scenario, **ledger_kwargs):
    """Run ``await scenario(ledger)`` through the hook (the test's nats_default connection)."""

    async def call(conn):
        return await scenario(await BatchLedger.open(conn, **ledger_kwargs))

    return JetStreamHook().run(call)


def record_batches(n: int, *, consume: int = 0) -> None:
    async def scenario(ledger):
        for i in range(n):
            await ledger.record(RUN, f"b{i}", stream="ORDERS", count=10, first_seq=10 * i + 1, last_seq=10 * i + 10)
        for i in range(consume):
            await ledger.mark_consumed(await ledger.claim(RUN, f"b{i}", owner="test"))

    ledger_do(scenario)


def sensor(**kwargs) -> JetStreamBatchLedgerSensor:
    kwargs.setdefault("run_id", RUN)
    kwargs.setdefault("timeout", 10)
    return JetStreamBatchLedgerSensor(task_id="ledger", poke_interval=0.05, **kwargs)


def test_poke_mode_returns_the_summary_when_all_batches_are_consumed(nats_conn, capsys):
    record_batches(3, consume=3)
    result = sensor(min_batches=3).execute(context={})
    assert result["done"] and result["batches"] == 3 and result["states"]["consumed"] == 3
    assert result["messages"]["consumed"] == 30 and result["awaited"] == "consumed"
    json.dumps(result)
    assert f"run {RUN!r}: 3/3 batch(es) reached consumed (at least 3 expected" in capsys.readouterr().out


def test_poke_mode_waits_for_missing_batches_and_unconsumed_ones(nats_conn):
    with pytest.raises(AirflowSensorTimeout):
        sensor(timeout=0.3).execute(context={})  # no bucket yet: nothing recorded, keep waiting
    record_batches(2, consume=1)
    with pytest.raises(AirflowSensorTimeout) as timeout:
        sensor(timeout=0.3).execute(context={})
    assert f"Last seen: run {RUN!r}: 1/2 batch(es) reached consumed" in str(timeout.value)
    with pytest.raises(AirflowSensorTimeout):
        sensor(state="published", min_batches=3, timeout=0.3).execute(context={})
    assert sensor(state="published", min_batches="2").execute(context={})["reached"] == 2


def test_dead_consumer_is_reaped_by_the_sensor_and_reported_as_failed(nats_conn):
    record_batches(2, consume=1)

    async def dies(ledger):
        return await ledger.claim(RUN, "b1", owner="spark-attempt-1")

    assert ledger_do(dies, visibility_timeout=0.2, max_attempts=1) is not None
    with pytest.raises(AirflowException, match=r"1 batch\(es\) failed .*b1.*reason: batches_failed"):
        sensor(reap_expired=True).execute(context={})

    async def state(ledger):
        return (await ledger.get(RUN, "b1")).state

    assert ledger_do(state) == "failed"
    tolerant = sensor(fail_on_failed=False, timeout=0.3)
    with pytest.raises(AirflowSensorTimeout):
        tolerant.execute(context={})


def test_run_id_is_templated_and_bad_state_is_refused():
    made = JetStreamBatchLedgerSensor(task_id="ledger")
    assert made.run_id == "{{ run_id }}" and "run_id" in made.template_fields
    assert set(made.template_fields) == {"run_id", "state", "ledger_bucket", "min_batches", "nats_conn_id"}
    with pytest.raises(InvalidRequestError):
        JetStreamBatchLedgerSensor(task_id="ledger", state="failed")
    status = {"run_id": "r", "awaited": "consumed", "reached": 1, "batches": 2, "min_batches": 1,
              "states": {"published": 1, "in_progress": 0, "consumed": 1, "failed": 0},
              "reaped": {"returned": ["b1"], "failed": []}}
    assert describe_progress(status) == (
        "run 'r': 1/2 batch(es) reached consumed (at least 1 expected; published 1, in_progress 0, consumed 1, "
        "failed 0); reaped expired claims: returned ['b1'], failed []")


def test_deferrable_defers_with_a_serializable_trigger(nats_conn):
    record_batches(1)
    deferring = sensor(deferrable=True, timeout=600, min_batches=1, reap_expired=True)
    before = datetime.now(UTC)
    with pytest.raises(TaskDeferred) as deferred:
        deferring.execute(context={})
    after = datetime.now(UTC)
    assert deferred.value.method_name == "execute_complete"
    assert deferred.value.timeout == timedelta(seconds=600 + TIMEOUT_BACKSTOP)  # the trigger times out first
    classpath, kwargs = deferred.value.trigger.serialize()
    assert classpath == "airflow_jetstream.triggers.ledger.JetStreamBatchLedgerTrigger"
    json.dumps(kwargs)
    timeout_at = datetime.fromisoformat(kwargs.pop("timeout_at"))
    # the sensor's timeout counted from its deferral (the clock read in between)
    assert before + timedelta(seconds=600) <= timeout_at <= after + timedelta(seconds=600)
    assert kwargs == {"run_id": RUN, "state": "consumed", "ledger_bucket": "batch_ledger", "min_batches": 1,
                      "reap_expired": True, "fail_on_failed": True, "nats_conn_id": "nats_default",
                      "poll_interval": 0.05, "end_from_trigger": False}
    kwargs["timeout_at"] = timeout_at.isoformat()
    assert JetStreamBatchLedgerTrigger(**kwargs).serialize() == (classpath, kwargs)
    record_batches(1, consume=1)
    assert sensor(deferrable=True).execute(context={})["done"]  # already there: no deferral


class ProbedTrigger(JetStreamBatchLedgerTrigger):
    """Signals each completed poll, so the test acts only after the trigger has seen the old state."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.polled = asyncio.Event()

    async def status(self, conn):
        result = await super().status(conn)
        self.polled.set()
        return result




def test_trigger_fires_once_the_last_batch_is_consumed_while_deferred(nats_conn):
    record_batches(2, consume=1)
    trigger = ProbedTrigger(run_id=RUN, min_batches=2, poll_interval=0.05)

    async def consume_after_first_poll(waiting):
        await trigger.polled.wait()
        assert not waiting.done()
        claim = await asyncio.to_thread(ledger_do, lambda ledger: ledger.claim(RUN, "b1"))
        await asyncio.to_thread(ledger_do, lambda ledger: ledger.mark_consumed(claim))

    event = first_event_payload(trigger, while_waiting=consume_after_first_poll)
    assert event["status"] == "success" and event["result"]["states"]["consumed"] == 2
    assert sensor(deferrable=True).execute_complete({}, event)["batches"] == 2


def test_trigger_reports_dead_letters_and_execute_complete_fails_with_them(nats_conn):
    record_batches(1)

    async def fail_it(ledger):
        await ledger.release(await ledger.claim(RUN, "b0"), error="schema mismatch in column price")

    ledger_do(fail_it, max_attempts=1)
    event = first_event_payload(JetStreamBatchLedgerTrigger(run_id=RUN, poll_interval=0.05))
    assert event["status"] == "error" and event["error"]["reason"] == "batches_failed"
    assert event["error"]["failed"][0]["last_error"] == "schema mismatch in column price"
    json.dumps(event)
    with pytest.raises(AirflowException, match=r"b0.*batches_failed"):
        sensor(deferrable=True).execute_complete({}, event)


def test_trigger_timeout_reports_the_last_state(nats_conn):
    """Not Airflow's bare 'Trigger timeout': the trigger times out first and the task says what it last saw."""
    record_batches(2, consume=1)
    trigger = JetStreamBatchLedgerTrigger(run_id=RUN, poll_interval=0.05, timeout_at=datetime.now(UTC).isoformat())
    event = first_event_payload(trigger)
    assert event["status"] == "timeout" and event["description"].startswith(f"run {RUN!r}: 1/2 batch(es)")
    with pytest.raises(AirflowSensorTimeout, match=r"batch ledger not reached within 10 s\. Last seen: run .* 1/2"):
        sensor().execute_complete({}, event)
