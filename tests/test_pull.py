"""PullSubscription against a real nats-server: messages as they arrive, a clean hand-over on close,
a typed error when the consumer goes away, and cancellation that is never swallowed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_jetstream.client import ConnectionSettings, ensure_stream
from airflow_jetstream.client.admin.consumers import consumer_info, delete_consumer, ensure_consumer
from airflow_jetstream.client.errors import ConsumerConfigError, ConsumerNotFoundError
from airflow_jetstream.client.reading.consume import PullSubscription
from tests.support.nats_calls import call_on_server, with_streams
from tests.support.polling import async_wait_until

STREAM = {"name": "JOBS", "subjects": ["jobs.>"]}


async def _consumer(conn: Any, name: str = "workers") -> None:
    await ensure_consumer(conn, "JOBS", {"durable_name": name, "ack_policy": "explicit", "ack_wait": "10m"})


async def _started(conn: Any, *, batch: int, expires: float) -> PullSubscription:
    pull = PullSubscription(conn, "JOBS", "workers", batch=batch, expires=expires)
    await pull.start()
    return pull


async def _collect(pull: PullSubscription, count: int, timeout: float = 10.0) -> list[Any]:
    """Messages until ``count`` arrived or ``timeout`` passed."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    got: list[Any] = []
    while len(got) < count and loop.time() < end:
        got += await pull.next_messages(end - loop.time())
    return got


async def _publish(conn: Any, count: int) -> None:
    for i in range(count):
        await conn.js.publish("jobs.run", str(i).encode())


def test_messages_arrive_as_published_and_a_quiet_consumer_gives_an_empty_list(settings: ConnectionSettings):
    async def body(conn):
        await _consumer(conn)
        pull = await _started(conn, batch=4, expires=1.0)
        try:
            empty = await pull.next_messages(0.3)
            await _publish(conn, 10)
            got = await _collect(pull, 10)
            for msg in got:
                await msg.ack_sync()
            return empty, [m.data for m in got], await consumer_info(conn, "JOBS", "workers")
        finally:
            await pull.close()

    empty, data, info = with_streams(settings, body, [STREAM])
    assert empty == []
    assert data == [str(i).encode() for i in range(10)]  # in order, none twice, across three pull requests
    assert info["num_ack_pending"] == 0 and info["ack_floor"]["stream_seq"] == 10


def test_close_hands_over_what_the_open_request_still_delivers(settings: ConnectionSettings):
    """Messages delivered for a request nobody reads any more go to ``leftover`` (nak: redelivered at
    once), instead of waiting unseen for the consumer's 10 minute ack_wait."""

    async def body(conn):
        await _consumer(conn)
        pull = await _started(conn, batch=10, expires=2.0)
        assert await pull.next_messages(0.2) == []  # leaves a pull request open on the server
        await _publish(conn, 3)
        handed: list[Any] = []

        async def leftover(msg: Any) -> None:
            handed.append(msg.data)
            await msg.nak()

        await pull.close(leftover=leftover)
        again = await _started(conn, batch=10, expires=1.0)
        try:
            redelivered = await _collect(again, 3)
        finally:
            await again.close(leftover=lambda msg: msg.nak())
        return handed, [(m.data, m.metadata.num_delivered) for m in redelivered]

    handed, redelivered = with_streams(settings, body, [STREAM])
    assert handed == [b"0", b"1", b"2"]
    assert redelivered == [(b"0", 2), (b"1", 2), (b"2", 2)]


def test_a_deleted_consumer_is_a_typed_error(settings: ConnectionSettings):
    async def body(conn):
        await _consumer(conn)
        pull = await _started(conn, batch=10, expires=5.0)
        try:
            assert await pull.next_messages(0.2) == []
            await delete_consumer(conn, "JOBS", "workers")
            with pytest.raises(ConsumerNotFoundError, match="'workers' on stream 'JOBS' was deleted") as err:
                await pull.next_messages(5.0)
            return err.value.reason
        finally:
            await pull.close(leftover=lambda msg: msg.nak())

    assert with_streams(settings, body, [STREAM]) == "consumer_not_found"


def test_a_cancelled_reader_stops_even_while_messages_keep_arriving(settings: ConnectionSettings):
    async def body(conn):
        await _consumer(conn)
        pull = await _started(conn, batch=1, expires=1.0)
        rounds = 0

        async def read_forever() -> None:
            nonlocal rounds
            while True:
                for msg in await pull.next_messages(1.0):
                    await msg.ack()
                rounds += 1

        reader = asyncio.create_task(read_forever())
        publisher = asyncio.create_task(_publish(conn, 2000))
        await async_wait_until(lambda: rounds >= 50, "50 rounds of reading")
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(reader, 10)
        await publisher
        await pull.close(leftover=lambda msg: msg.nak())
        return reader.cancelled()

    assert with_streams(settings, body, [STREAM]) is True


def test_pulling_a_push_consumer_is_a_typed_error(settings: ConnectionSettings):
    async def body(conn):
        await ensure_consumer(conn, "JOBS", {"durable_name": "pushed", "ack_policy": "explicit",
                                             "deliver_subject": "deliver.jobs"})
        pull = PullSubscription(conn, "JOBS", "pushed", batch=10, expires=1.0)
        await pull.start()
        try:
            with pytest.raises(ConsumerConfigError, match="'pushed' on stream 'JOBS' is a push consumer") as err:
                await pull.next_messages(5.0)
            return err.value.reason
        finally:
            await pull.close()

    assert with_streams(settings, body, [STREAM]) == "not_pull_consumer"


def test_a_request_lost_to_a_server_restart_is_replaced(nats_server, settings: ConnectionSettings):
    """A server killed and restarted has forgotten the open pull request without a word: once the
    request's deadline has passed the reader sends a new one, and a message published after the
    restart arrives."""

    async def body(conn):
        await ensure_stream(conn, {**STREAM, "storage": "file"})
        await _consumer(conn)
        pull = await _started(conn, batch=10, expires=1.0)
        try:
            assert await pull.next_messages(0.2) == []
            await asyncio.to_thread(nats_server.stop, kill=True)  # no status for the open request
            await asyncio.to_thread(nats_server.start)
            await async_wait_until(lambda: conn.nc.is_connected, "the reconnect", timeout=30)
            await _publish(conn, 1)
            got = await _collect(pull, 1, timeout=30)
            return [m.data for m in got]
        finally:
            await pull.close()

    assert call_on_server(settings, body) == [b"0"]

def test_a_request_over_the_consumers_limits_is_a_typed_error_naming_the_fix(settings: ConnectionSettings):
    async def body(conn):
        await ensure_consumer(conn, "JOBS", {"durable_name": "small", "ack_policy": "explicit", "max_batch": 5})
        pull = PullSubscription(conn, "JOBS", "small", batch=10, expires=1.0)
        await pull.start()
        try:
            with pytest.raises(ConsumerConfigError, match="max_batch") as err:
                await pull.next_messages(5.0)
            return err.value
        finally:
            await pull.close()

    err = with_streams(settings, body, [STREAM])
    assert err.reason == "pull_request_refused" and "Exceeded MaxRequestBatch of 5" in str(err)


class CountingPull(PullSubscription):
    """Counts the pull requests it sends."""

    requests = 0

    async def _request(self) -> None:
        self.requests += 1
        await super()._request()


def test_a_full_waiting_queue_pauses_pulls_instead_of_a_request_storm(settings: ConnectionSettings):
    """With max_waiting 1 taken by another reader, every request is refused (409 Exceeded MaxWaiting);
    the reader retries once a second instead of at once."""

    async def body(conn):
        await ensure_consumer(conn, "JOBS", {"durable_name": "narrow", "ack_policy": "explicit", "max_waiting": 1})
        holder = PullSubscription(conn, "JOBS", "narrow", batch=1, expires=10.0)
        refused = CountingPull(conn, "JOBS", "narrow", batch=1, expires=10.0)
        await holder.start()
        await refused.start()
        try:
            assert await holder.next_messages(0.1) == []  # holds the only waiting slot
            got = await refused.next_messages(2.5)
            return got, refused.requests
        finally:
            await refused.close()
            await holder.close()

    got, requests = with_streams(settings, body, [STREAM])
    assert got == [] and 2 <= requests <= 4
