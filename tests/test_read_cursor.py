"""Bounded reads of a Limits stream with a cursor consumer: advance after success, replay after reset."""

from __future__ import annotations

import asyncio

import pytest

from airflow_jetstream.client import ensure_stream, open_connection
from airflow_jetstream.client.admin.consumers import consumer_info, reset_consumer
from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.reading.read_plan import acknowledge_read, ensure_cursor, plan_read, read_method


def test_cursor_advances_only_when_acknowledged_and_replays_after_reset(settings):
    async def go():
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": "ARCHIVE", "subjects": ["archive.>"]})
            for i in range(10):
                await conn.js.publish(f"archive.{i % 2}", str(i).encode())
            first = await plan_read(conn, "ARCHIVE", consumer="report")
            assert (first.first_seq, first.last_seq) == (1, 10)
            assert read_method(first, consume=True) == "consumer"
            again = await plan_read(conn, "ARCHIVE", consumer="report")
            assert again.first_seq == 1, "an unacknowledged (failed) read must be read again"
            assert await acknowledge_read(conn, first) == 0
            assert (await conn.js.stream_info("ARCHIVE")).state.messages == 10

            for i in range(3):
                await conn.js.publish("archive.0", str(i).encode())
            second = await plan_read(conn, "ARCHIVE", consumer="report")
            assert (second.first_seq, second.last_seq) == (11, 13)
            await acknowledge_read(conn, second)
            assert (await plan_read(conn, "ARCHIVE", consumer="report")).empty

            await reset_consumer(conn, "ARCHIVE", "report", seq=4)
            replay = await plan_read(conn, "ARCHIVE", consumer="report")
            assert (replay.first_seq, replay.last_seq) == (4, 13)
            info = await consumer_info(conn, "ARCHIVE", "report")
            assert info["config"]["deliver_policy"] == "all" and info["config"]["ack_policy"] == "explicit"

    asyncio.run(go())


def test_cursor_keeps_an_existing_consumer_and_its_filter(settings):
    async def go():
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": "ARCHIVE", "subjects": ["archive.>"]})
            created = await ensure_cursor(conn, "ARCHIVE", "eu", subjects=["archive.eu"])
            assert created["action"] == "created"
            kept = await ensure_cursor(conn, "ARCHIVE", "eu")
            assert kept["action"] == "existing"
            await conn.js.publish("archive.us", b"1")
            await conn.js.publish("archive.eu", b"2")
            plan = await plan_read(conn, "ARCHIVE", consumer="eu")
            assert plan.subjects == ("archive.eu",)

    asyncio.run(go())


def test_consuming_a_limits_stream_needs_a_cursor(settings):
    async def go():
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": "ARCHIVE", "subjects": ["archive.>"]})
            plan = await plan_read(conn, "ARCHIVE")
            with pytest.raises(InvalidRequestError) as info:
                read_method(plan, consume=True)
            assert info.value.reason == "consumer_required"

    asyncio.run(go())
