"""JetStreamConsumerResetOperator and client reset_consumer against a real nats-server."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest

from airflow_jetstream.client import ensure_stream
from airflow_jetstream.client.admin.consumers import consumer_info, ensure_consumer, reset_consumer
from airflow_jetstream.client.errors import (
    ConsumerNotFoundError,
    ConsumerResetError,
    InvalidRequestError,
    StreamNotFoundError,
)
from airflow_jetstream.operators.consumer import JetStreamConsumerResetOperator
from tests.test_sourcing import run


def _reset(**kwargs) -> dict:
    return JetStreamConsumerResetOperator(task_id="reset", stream="ORDERS", **kwargs).execute(context={})


async def _seed(conn, consumers: dict[str, dict]) -> datetime:
    """ORDERS with 10 messages; returns the time between message 5 and 6."""
    await ensure_stream(conn, {"name": "ORDERS", "subjects": ["orders.>"]})
    for i in range(1, 6):
        await conn.js.publish(f"orders.{i}", str(i).encode())
    await asyncio.sleep(0.01)  # distinct store timestamps on both sides of `middle`, not synchronisation
    middle = datetime.now(UTC)
    await asyncio.sleep(0.01)
    for i in range(6, 11):
        await conn.js.publish(f"orders.{i}", str(i).encode())
    for name, cfg in consumers.items():
        await ensure_consumer(conn, "ORDERS", {"name": name, **cfg})
    return middle


@pytest.fixture
def middle(nats_conn, settings) -> datetime:
    return run(settings, _seed, {
        "ALL": {"ack_policy": "explicit"},
        "NEW": {"deliver_policy": "new", "ack_policy": "explicit"},
        "LPS": {"deliver_policy": "last_per_subject", "filter_subject": "orders.>"},
        "FROM4": {"deliver_policy": "by_start_sequence", "opt_start_seq": 4},
    })


def test_reset_to_ack_floor_redelivers_what_was_pending(middle, settings):
    async def consume_without_ack(conn) -> dict:
        sub = await conn.js.pull_subscribe_bind("ALL", stream="ORDERS")
        msgs = await sub.fetch(4, timeout=2)
        await msgs[0].ack_sync()
        await msgs[1].ack_sync()
        return await consumer_info(conn, "ORDERS", "ALL")

    before = run(settings, consume_without_ack)
    assert before["num_ack_pending"] == 2 and before["ack_floor"]["stream_seq"] == 2
    result = _reset(consumer="ALL")
    json.dumps(result)
    assert result["reset_seq"] == 3
    assert result["num_ack_pending"] == 0 and result["num_pending"] == 8
    assert result["ack_floor"]["stream_seq"] == 2 and result["delivered"]["consumer_seq"] == 0


def test_reset_to_sequence_backward_and_forward_with_templated_value(middle, settings):
    forward = _reset(consumer="ALL", start_seq="8")
    assert forward["reset_seq"] == 8 and forward["num_pending"] == 3
    op = JetStreamConsumerResetOperator(task_id="reset", stream="ORDERS", consumer="ALL", start_seq="{{ params.seq }}")
    op.render_template_fields({"params": {"seq": 2}})
    backward = op.execute(context={})
    assert backward["reset_seq"] == 2 and backward["num_pending"] == 9


def test_reset_to_time_resolves_the_first_sequence_at_or_after_it(middle, settings):
    result = _reset(consumer="ALL", start_time=middle.isoformat())
    assert result["reset_seq"] == 6 and result["num_pending"] == 5
    assert result["requested_seq"] == 6 and result["requested_time"].startswith(middle.strftime("%Y-%m-%dT%H:%M"))
    later = _reset(consumer="ALL", start_time=datetime(2100, 1, 1, tzinfo=UTC))
    assert later["reset_seq"] == 11 and later["num_pending"] == 0


def test_unknown_stream_or_consumer_fails_with_a_clear_error(middle, settings):
    # The server never answers these resets; a RequestTimeoutError would mean the check was skipped.
    with pytest.raises(ConsumerNotFoundError) as info:
        _reset(consumer="NOPE", start_seq=1)
    assert "consumer 'NOPE' on stream 'ORDERS'" in str(info.value)
    with pytest.raises(StreamNotFoundError):
        JetStreamConsumerResetOperator(task_id="r", stream="MISSING", consumer="ALL").execute(context={})


@pytest.mark.parametrize("consumer", ["NEW", "LPS"])
def test_seq_reset_refused_for_last_new_last_per_subject(consumer, middle, settings):
    with pytest.raises(ConsumerResetError) as info:
        _reset(consumer=consumer, start_seq=3)
    assert info.value.reason == "reset_not_allowed"
    assert "can only be reset to its ack floor" in str(info.value)
    assert _reset(consumer=consumer)["reset_seq"] >= 1


def test_reset_below_start_is_refused(middle, settings):
    with pytest.raises(ConsumerResetError) as info:
        _reset(consumer="FROM4", start_seq=2)
    assert info.value.reason == "below_start_seq"
    assert _reset(consumer="FROM4", start_seq=4)["reset_seq"] == 4

    async def by_time(conn) -> ConsumerResetError:
        await ensure_consumer(conn, "ORDERS", {"name": "SINCE", "deliver_policy": "by_start_time",
                                               "opt_start_time": middle})
        with pytest.raises(ConsumerResetError) as server_side:
            await reset_consumer(conn, "ORDERS", "SINCE", seq=2)
        with pytest.raises(ConsumerResetError) as local:
            await reset_consumer(conn, "ORDERS", "SINCE", time="2000-01-01T00:00:00Z")
        assert local.value.reason == "below_start_time"
        assert (await reset_consumer(conn, "ORDERS", "SINCE", seq=7))["reset_seq"] == 7
        return server_side.value

    err = run(settings, by_time)
    assert err.err_code == 10204 and err.reason == "below_start_time"


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"start_seq": 3, "start_time": "2026-01-01T00:00:00Z"}, "invalid_reset"),
    ({"start_seq": "abc"}, "invalid_seq"),
    ({"start_seq": 0}, "invalid_seq"),
    ({"start_time": "not a time"}, "invalid_request"),
])
def test_bad_reset_input_is_refused(kwargs, reason, middle, settings):
    async def deliver_three(conn) -> None:
        sub = await conn.js.pull_subscribe_bind("ALL", stream="ORDERS")
        assert len(await sub.fetch(3, timeout=2)) == 3

    run(settings, deliver_three)
    with pytest.raises(InvalidRequestError) as info:
        _reset(consumer="ALL", **kwargs)
    assert info.value.reason == reason
    assert run(settings, consumer_info, "ORDERS", "ALL")["delivered"]["consumer_seq"] == 3  # not reset
