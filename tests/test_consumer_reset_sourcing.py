"""Resetting the durable consumer of a user-managed source, as the durable sourcing ADR describes."""

from __future__ import annotations

import logging

import pytest

from airflow_jetstream.client import ensure_stream
from airflow_jetstream.client.admin.consumers import pause_consumer
from airflow_jetstream.client.sourcing.provision import DurableSource, provision_durable_source
from airflow_jetstream.client.sourcing.spec import source_status
from airflow_jetstream.operators.consumer import JetStreamConsumerResetOperator
from airflow_jetstream.triggers.consumer import describe_source
from tests.test_sourcing import assert_exactly_once, messages, payloads, publish, run, wait_for

CONSUMER = "AGG_SRC_ORIGIN"


async def _setup(conn) -> None:
    await ensure_stream(conn, {"name": "ORIGIN", "subjects": ["o.>"]})
    await provision_durable_source(conn, DurableSource("AGG", "ORIGIN", mode="user"))
    await publish(conn, "o", 100)
    await wait_for(lambda: _has(conn, "AGG", 100), 30, "first 100 messages in AGG")


async def _has(conn, stream: str, count: int) -> bool:
    return await messages(conn, stream) >= count


def _reset(**kwargs) -> dict:
    return JetStreamConsumerResetOperator(task_id="reset", stream="ORIGIN", consumer=CONSUMER,
                                          **kwargs).execute(context={})


UNPAUSED_WARNING = "feeds a durable source and is not paused"


def test_backward_reset_while_sourcing_duplicates_nothing(nats_conn, settings, caplog: pytest.LogCaptureFixture):
    run(settings, _setup)
    with caplog.at_level(logging.WARNING, logger="airflow_jetstream.client.admin.consumers"):
        result = _reset(start_seq=40)
    assert result["reset_seq"] == 40 and result["num_pending"] >= 1
    assert UNPAUSED_WARNING in caplog.text, "an unpaused source consumer's reset is not warned about"

    async def after(conn):
        await publish(conn, "o", 20, start=100)
        await wait_for(lambda: _has(conn, "AGG", 120), 30, "the next 20 messages")
        await wait_for(lambda: _delivered_past(conn, 120), 30, "redelivery to reach the end")
        return await payloads(conn, "AGG")

    seen = run(settings, after)
    assert_exactly_once(seen, "o", 120)


async def _delivered_past(conn, seq: int) -> bool:
    info = await conn.api_request(f"CONSUMER.INFO.ORIGIN.{CONSUMER}")
    return info["delivered"]["stream_seq"] >= seq and info["num_pending"] == 0


def test_forward_reset_skips_the_range(nats_conn, settings, caplog: pytest.LogCaptureFixture):
    run(settings, _setup)

    async def paused_publish(conn) -> None:
        await pause_consumer(conn, "ORIGIN", CONSUMER, "2999-01-01T00:00:00Z")
        await publish(conn, "o", 100, start=100)  # origin seqs 101..200, not sourced while paused

    run(settings, paused_publish)
    with caplog.at_level(logging.WARNING, logger="airflow_jetstream.client.admin.consumers"):
        result = _reset(start_seq=151)
    assert UNPAUSED_WARNING not in caplog.text, "a paused source consumer's reset is warned about"
    assert result["reset_seq"] == 151 and result["num_pending"] == 50

    async def resume(conn):
        await pause_consumer(conn, "ORIGIN", CONSUMER, None)
        await wait_for(lambda: _has(conn, "AGG", 150), 30, "messages after the skipped range")
        await publish(conn, "o", 10, start=200)
        await wait_for(lambda: _has(conn, "AGG", 160), 30, "messages published after the reset")
        return await payloads(conn, "AGG")

    seen = run(settings, resume)
    expected = {f"o-{i}" for i in [*range(100), *range(150, 210)]}
    assert set(seen) == expected, f"skipped range sourced: {sorted(set(seen) - expected)[:5]}"
    assert max(seen.values()) == 1 and sum(seen.values()) == 160


async def _caught_up(conn, at_least: int) -> bool:
    return await _has(conn, "AGG", at_least) and (await source_status(conn, "AGG", "ORIGIN"))["caught_up"]


def test_forward_reset_on_a_workqueue_origin_reports_what_it_left_behind(nats_conn, settings):
    """A WorkQueue origin keeps the messages a forward reset skipped: the source is caught up, and its status
    counts them as left behind (what nats-server 2.15.1 can also leave after a restart, docs/sourcing.md)."""

    async def setup(conn) -> dict:
        await ensure_stream(conn, {"name": "ORIGIN", "subjects": ["o.>"], "retention": "workqueue"})
        await provision_durable_source(conn, DurableSource("AGG", "ORIGIN", mode="user"))
        await publish(conn, "o", 10)
        await wait_for(lambda: _caught_up(conn, 10), 30, "the first 10 messages in AGG and the source caught up")
        return await source_status(conn, "AGG", "ORIGIN")

    before = run(settings, setup)
    assert before["origin_left_behind"] == 0 and "still holds" not in describe_source(before)
    run(settings, lambda conn: pause_consumer(conn, "ORIGIN", CONSUMER, "2999-01-01T00:00:00Z"))
    run(settings, lambda conn: publish(conn, "o", 10, start=10))  # origin seqs 11..20
    assert _reset(start_seq=16)["reset_seq"] == 16  # 11..15 are skipped, and a WorkQueue keeps them

    async def resume(conn) -> dict:
        await pause_consumer(conn, "ORIGIN", CONSUMER, None)
        await wait_for(lambda: _caught_up(conn, 15), 30, "the messages after the skipped range in AGG")
        return await source_status(conn, "AGG", "ORIGIN")

    after = run(settings, resume)
    assert after["caught_up"] and after["origin_left_behind"] == 5, after
    assert "ORIGIN still holds 5 message(s) its consumer will not deliver again" in describe_source(after)
    assert run(settings, messages, "ORIGIN") == 5


def test_left_behind_is_not_counted_on_a_limits_origin(nats_conn, settings):
    run(settings, _setup)  # a Limits origin keeps every message by design

    async def caught_up(conn) -> dict:
        await wait_for(lambda: _caught_up(conn, 100), 30, "the source to be caught up")
        return await source_status(conn, "AGG", "ORIGIN")

    status = run(settings, caught_up)
    assert status["caught_up"] and status["origin_left_behind"] is None
