"""A delivery held past its ack_wait is not fired: the stalled-triggerer case, against a real nats-server.

A stall (a stopped triggerer process, a long pause) is reproduced by blocking the event loop with
``time.sleep``: like SIGSTOP, nothing of the producer runs meanwhile, not even its in-progress signals.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection
from airflow_jetstream.client.admin.consumers import consumer_info
from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.reading.messages import DeliveryLease
from airflow_jetstream.triggers.message import JetStreamMessageTrigger
from tests.support.nats_calls import call_on_server

STREAM, CONSUMER = "LEASED", "airflow_leased"
# Long enough that a loaded box hands a message out well within it; the stalls outlast it by 1.5 s.
ACK_WAIT = 3.0
STALL = ACK_WAIT + 1.5


@pytest.fixture
def leased(settings: ConnectionSettings, nats_conn: str) -> ConnectionSettings:
    call_on_server(settings, ensure_stream, {"name": STREAM, "subjects": ["leased.>"]})
    return settings


def make_trigger() -> JetStreamMessageTrigger:
    return JetStreamMessageTrigger(stream=STREAM, consumer=CONSUMER, fetch_timeout=0.5,
                                   consumer_config={"filter_subject": "leased.>", "ack_wait": f"{ACK_WAIT}s"})


async def _publish(settings: ConnectionSettings, count: int) -> None:
    async with open_connection(settings) as conn:
        for i in range(count):
            await conn.js.publish("leased.order", json.dumps({"order": i}).encode())


async def _one(items: list[Any]):
    for item in items:
        yield item


def _stall(seconds: float) -> None:
    """Block the whole event loop, as a stopped process would be (no progress signal goes out)."""
    time.sleep(seconds)  # the fault injected, not a wait for something


def test_messages_held_past_ack_wait_are_not_fired_nor_acked(leased: ConnectionSettings, caplog) -> None:
    trigger = make_trigger()
    producer = JetStreamMessageTrigger.create_shared_stream_producer(trigger.serialize()[1])
    producer.progress_interval = 60.0  # no +WPI before the stall: as if the stall began right after the pull

    async def go() -> tuple[list[dict[str, Any]], dict[str, Any], list[Any]]:
        await _publish(leased, 5)
        stream = producer.open_stream()
        try:
            first, token = await stream.__anext__()  # seq 1 handed out; seqs 2-5 pulled with it, not yet
            assert first.seq == 1 and first.delivered == 1
            _stall(STALL)
            # seq 1 waited in the triggerer past ack_wait: the watcher does not fire it
            fired = [event async for event in trigger.filter_shared_stream(_one([first]))]
            await producer.advance([AdvanceItem(broker_payload=token, outcome=AdvanceOutcome(acked=1, failed=0))])
            # seqs 2-5 expired in the producer; what comes next is the server's redelivery
            after, _ = await stream.__anext__()
            state = await _consumer(leased)
            return fired, after, state
        finally:
            await stream.aclose()
            await producer.aclose()

    with caplog.at_level(logging.WARNING, logger="airflow_jetstream.triggers.message"):
        fired, after, state = asyncio.run(go())
    assert fired == [], "a delivery held past ack_wait must not become an event"
    assert after.delivered == 2, f"a stale delivery was handed out after the stall: {after}"
    assert state["num_ack_pending"] + state["num_pending"] == 5 and state["ack_floor"]["stream_seq"] == 0, \
        "nothing of the stale deliveries was acked"
    lines = [r.getMessage() for r in caplog.records if "past ack_wait" in r.getMessage()]
    assert any("message 1 held" in line for line in lines) and any("message 2 held" in line for line in lines), lines
    assert "the server redelivers it" in lines[0]


async def _consumer(settings: ConnectionSettings) -> dict[str, Any]:
    async with open_connection(settings) as conn:
        return await consumer_info(conn, STREAM, CONSUMER)


def test_lease_extends_only_with_a_confirmed_progress_signal_in_time(leased: ConnectionSettings) -> None:
    async def go() -> tuple[bool, float, bool, int]:
        await _publish(leased, 1)
        async with open_connection(leased) as conn:
            await conn.js.add_consumer(STREAM, durable_name=CONSUMER, ack_policy="explicit", ack_wait=ACK_WAIT)
            sub = await conn.js.pull_subscribe_bind(CONSUMER, STREAM)
            since = time.monotonic()
            msg = (await sub.fetch(1, timeout=5))[0]
            lease = DeliveryLease(msg, ack_wait=ACK_WAIT, since=since)
            first_deadline = lease.deadline
            extended = await lease.extend(conn.nc, timeout=3)
            moved = lease.deadline - first_deadline
            _stall(STALL)
            late = await lease.extend(conn.nc, timeout=3)  # expired: not extended, nothing sent
            again = (await sub.fetch(1, timeout=5))[0]
            return extended, moved, late, again.metadata.num_delivered

    extended, moved, late, delivered = asyncio.run(go())
    assert extended and moved > 0
    assert late is False
    assert delivered == 2, "the server redelivered the expired delivery"


def test_max_unconfirmed_holds_back_messages_until_airflow_confirms(leased: ConnectionSettings) -> None:
    trigger = JetStreamMessageTrigger(stream=STREAM, consumer=CONSUMER, fetch_timeout=0.5, max_unconfirmed=2,
                                      consumer_config={"filter_subject": "leased.>"})
    producer = JetStreamMessageTrigger.create_shared_stream_producer(trigger.serialize()[1])

    async def go() -> tuple[list[int], bool, int]:
        await _publish(leased, 4)
        stream = producer.open_stream()
        try:
            handed = [await stream.__anext__() for _ in range(2)]
            third = asyncio.ensure_future(stream.__anext__())
            done, _ = await asyncio.wait([third], timeout=1.0)  # two unconfirmed: nothing more is handed out
            held_back = not done
            await producer.advance([AdvanceItem(broker_payload=handed[0][1],
                                                outcome=AdvanceOutcome(acked=1, failed=0))])
            payload, _ = await asyncio.wait_for(third, timeout=30)
            return [p.seq for p, _ in handed], held_back, payload.seq
        finally:
            await stream.aclose()
            await producer.aclose()

    first_two, held_back, third = asyncio.run(go())
    assert first_two == [1, 2] and held_back and third == 3
    with pytest.raises(InvalidRequestError, match="max_unconfirmed must be a positive int"):
        JetStreamMessageTrigger(stream=STREAM, consumer=CONSUMER, max_unconfirmed=0)
    # bounded by default: a triggerer stop repeats at most one pull request of events
    default = JetStreamMessageTrigger(stream=STREAM, consumer=CONSUMER, batch_size=16).serialize()[1]
    assert JetStreamMessageTrigger.create_shared_stream_producer(default).max_unconfirmed == 16
