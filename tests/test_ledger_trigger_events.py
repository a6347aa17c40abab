"""The ledger trigger waits for the run's counts messages (one shared subscription per process), not by polling:
with a poll interval of an hour, triggers still fire when their runs finish, and wake for an expiring claim."""

from __future__ import annotations

import asyncio
import uuid

from airflow_jetstream.client.connection_pool import shared_connection
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.triggers.ledger import JetStreamBatchLedgerTrigger
from tests.support.catch_up_gate import held_at_the_gate
from tests.support.polling import async_wait_until
from tests.support.triggers import first_event_payload

HOUR = 3600.0


def test_many_triggers_fire_from_events_through_one_consumer_on_the_bucket(nats_conn):
    bucket = f"events_{uuid.uuid4().hex[:8]}"
    runs = [f"run-{n}" for n in range(50)]
    triggers = [JetStreamBatchLedgerTrigger(run_id=run_id, ledger_bucket=bucket, min_batches=2, poll_interval=HOUR)
                for run_id in runs for _ in range(4)]  # 200 triggers, four per run

    async def scenario():
        settings = await JetStreamHook().aget_settings()
        async with shared_connection(settings) as conn:
            ledger = await BatchLedger.open(conn, bucket)
            for run_id in runs:
                await ledger.record(run_id, "b0", stream="ORDERS", count=1)
            waiting = [asyncio.ensure_future(anext(t.run())) for t in triggers]

            async def consumers() -> int:
                info = await conn.api_request(f"STREAM.INFO.KV_{bucket}")
                return int(info["state"]["consumer_count"])

            await async_wait_until(lambda: consumers(), "the shared consumer on the ledger bucket")
            shared = await consumers()
            for run_id in runs:  # the second batch of every run, recorded and consumed
                await ledger.record(run_id, "b1", stream="ORDERS", count=1)
                await ledger.settle(await ledger.claim_available(run_id, owner="consumer"))
            events = await asyncio.wait_for(asyncio.gather(*waiting), 60)
            return shared, [event.payload for event in events]

    shared, events = asyncio.run(scenario())
    assert shared == 1
    assert all(e["status"] == "success" and e["result"]["states"]["consumed"] == 2 for e in events)
    assert sorted({e["result"]["run_id"] for e in events}) == sorted(runs)


def test_a_trigger_started_before_the_bucket_exists_fires_once_the_run_is_done(nats_conn):
    bucket = f"later_{uuid.uuid4().hex[:8]}"
    trigger = JetStreamBatchLedgerTrigger(run_id="late-run", ledger_bucket=bucket, poll_interval=0.2)

    async def produce_and_consume(waiting):
        async def work(conn):
            ledger = await BatchLedger.open(conn, bucket)
            await ledger.record("late-run", "b0", stream="ORDERS", count=3)
            await ledger.settle(await ledger.claim_available("late-run"))

        await asyncio.to_thread(JetStreamHook().run, work)

    event = first_event_payload(trigger, while_waiting=produce_and_consume)
    assert event["status"] == "success" and event["result"]["messages"]["consumed"] == 3


def test_a_reaping_trigger_wakes_when_the_earliest_claim_expires(nats_conn):
    """No message comes when a consumer dies: the trigger wakes at the run's next_deadline and reaps."""
    bucket = f"reap_{uuid.uuid4().hex[:8]}"

    def setup(conn):
        async def work():
            ledger = await BatchLedger.open(conn, bucket, visibility_timeout=1, max_attempts=1)
            await ledger.record("dies", "b0", stream="ORDERS", count=1)
            return await ledger.claim("dies", "b0", owner="a worker that is killed")
        return work()

    assert JetStreamHook().run(setup) is not None
    trigger = JetStreamBatchLedgerTrigger(run_id="dies", ledger_bucket=bucket, reap_expired=True, poll_interval=HOUR)
    event = first_event_payload(trigger, timeout=30)
    assert event["status"] == "error" and event["error"]["reason"] == "batches_failed"
    assert event["error"]["failed"][0]["batch_id"] == "b0"


def test_the_first_look_waits_for_its_turn_to_catch_up_on_the_shared_tail(nats_conn):
    """As every follower of a shared tail, a trigger reads what was stored before it joined inside
    ``listener.catching_up()``: triggers starting together (a triggerer restart) read their runs CATCH_UP_AT_ONCE
    at a time. A run already done fires only once a turn is free."""
    bucket = f"gate_{uuid.uuid4().hex[:8]}"
    trigger = JetStreamBatchLedgerTrigger(run_id="done", ledger_bucket=bucket, poll_interval=HOUR)
    wait = trigger.condition

    async def scenario():
        settings = await JetStreamHook().aget_settings()
        async with shared_connection(settings) as conn:
            ledger = await BatchLedger.open(conn, bucket)
            await ledger.record("done", "b0", stream="ORDERS", count=1)
            await ledger.settle(await ledger.claim_available("done"))
            events = trigger.run()
            fired_while_held, event = await held_at_the_gate(conn, wait.stream, anext(events),
                                                             tail_filter=wait.all_counts_subjects)
            await events.aclose()
            return fired_while_held, event.payload

    fired_while_held, event = asyncio.run(scenario())
    assert not fired_while_held
    assert event["status"] == "success" and event["result"]["states"]["consumed"] == 1
