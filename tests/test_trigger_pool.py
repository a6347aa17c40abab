"""Shared triggerer connections: reference counting, and 200 deferred advisory triggers on <= 2 connections and
one consumer."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection
from airflow_jetstream.client.connection_pool import ConnectionPool, shared_connection
from airflow_jetstream.client.errors import ConnectionFailedError
from airflow_jetstream.client.reading.shared_tail import tail_stats
from airflow_jetstream.embedded.server import free_port
from airflow_jetstream.operators.advisory import JetStreamAdvisoryStreamOperator
from airflow_jetstream.triggers.advisory import JetStreamAdvisoryTrigger
from tests.conftest import set_nats_connection
from tests.support.polling import async_wait_until


def client_connections(server, name: str = "airflow-jetstream") -> int:
    return sum(1 for c in server.monitor("connz").get("connections") or [] if c.get("name") == name)


async def poll(predicate, what: str, deadline: float = 20.0, every: float = 0.05):
    await async_wait_until(lambda: asyncio.to_thread(predicate), what, deadline, every)


def test_users_share_one_connection_closed_by_the_last(nats_server, settings):
    pool = ConnectionPool()

    async def scenario():
        conns = await asyncio.gather(*(pool.acquire(settings) for _ in range(20)))
        assert len({id(c) for c in conns}) == 1
        assert pool.users(settings) == 20 and pool.open_connections() == 1
        await poll(lambda: client_connections(nats_server) == 1, "one server connection")
        for _ in range(19):
            await pool.release(conns[0])
        assert not conns[0].nc.is_closed
        await pool.release(conns[0])
        assert conns[0].nc.is_closed and pool.open_connections() == 0
        async with shared_connection(settings, pool) as again:
            assert again is not conns[0] and again.nc.is_connected
        assert again.nc.is_closed
        # the server drops a closed client's connection once it reads the close: not at once
        await poll(lambda: client_connections(nats_server) == 0, "no server connection left")

    asyncio.run(scenario())


def test_other_settings_and_other_loops_get_their_own_connection(settings):
    pool = ConnectionPool()
    other = settings.with_overrides(client_name="other")

    async def two_settings():
        async with shared_connection(settings, pool) as a, shared_connection(other, pool) as b:
            return a is not b, pool.open_connections()

    assert asyncio.run(two_settings()) == (True, 2)
    loops = [asyncio.new_event_loop() for _ in range(2)]
    try:
        conns = [loop.run_until_complete(pool.acquire(settings)) for loop in loops]
        assert conns[0] is not conns[1]
        for loop, conn in zip(loops, conns, strict=True):
            loop.run_until_complete(pool.release(conn))
        assert all(c.nc.is_closed for c in conns)
    finally:
        for loop in loops:
            loop.close()


def test_failed_connect_reaches_every_waiter_and_leaves_nothing():
    pool = ConnectionPool()
    dead = ConnectionSettings(servers=f"127.0.0.1:{free_port()}", connect_timeout=0.5)

    async def scenario():
        results = await asyncio.gather(*(pool.acquire(dead) for _ in range(5)), return_exceptions=True)
        return results, pool.open_connections()

    results, left = asyncio.run(scenario())
    assert all(isinstance(r, ConnectionFailedError) for r in results)
    assert left == 0


def test_a_closed_connection_is_replaced(settings):
    pool = ConnectionPool()

    async def scenario():
        first = await pool.acquire(settings)
        await first.nc.close()  # e.g. the server dropped it for good
        second = await pool.acquire(settings)
        assert second is not first and second.nc.is_connected
        await pool.release(second)
        assert second.nc.is_closed

    asyncio.run(scenario())


def test_users_of_a_closed_connection_give_back_that_one_not_its_replacement(settings):
    pool = ConnectionPool()

    async def scenario():
        first = await pool.acquire(settings)
        assert await pool.acquire(settings) is first
        await first.nc.close()
        second = await pool.acquire(settings)
        for _ in range(2):
            await pool.release(first)  # its users leave after the replacement was made
        assert second.nc.is_connected and pool.users(settings) == 1
        await pool.release(second)
        assert second.nc.is_closed and pool.open_connections() == 0

    asyncio.run(scenario())


def test_200_deferred_advisory_triggers_share_one_connection_and_one_consumer(nats_server, monkeypatch):
    set_nats_connection(monkeypatch, "nats_default", nats_server.url, extra={"request_timeout": 30})
    JetStreamAdvisoryStreamOperator(task_id="capture", max_age="1h").execute(context={})
    since = datetime.now(UTC).isoformat()
    count = 200
    triggers = [JetStreamAdvisoryTrigger(advisory="stream_created", advisory_stream=f"S{i}", start_time=since)
                for i in range(count)]
    settings = ConnectionSettings(servers=nats_server.url, client_name="test-admin")

    def consumers_on_capture() -> int:
        return nats_server.monitor("jsz?consumers=true&accounts=true")["consumers"]

    async def scenario():
        runs = [asyncio.ensure_future(anext(t.run())) for t in triggers]
        await poll(lambda: sum(t.listeners for t in tail_stats()) == count, f"{count} waiting triggers", deadline=60)
        during = client_connections(nats_server), consumers_on_capture()
        async with open_connection(settings) as admin:
            for i in range(count):
                await ensure_stream(admin, {"name": f"S{i}", "subjects": [f"s{i}.>"]})
        events = await asyncio.wait_for(asyncio.gather(*runs), 60)
        await poll(lambda: client_connections(nats_server) == 0, "the shared connection to close")
        return during, events

    (connections, consumers), events = asyncio.run(scenario())
    assert connections <= 2, f"{connections} connections for {count} triggers"
    assert consumers == 1, f"{consumers} consumers on the capture stream for {count} triggers"
    assert sorted(e.payload["advisory"]["stream"] for e in events) == sorted(f"S{i}" for i in range(count))
    assert all(e.payload["status"] == "matched" for e in events)
    assert consumers_on_capture() == 0  # the shared consumer was deleted by the last trigger


@pytest.mark.parametrize("users", [1, 3])
def test_cancelled_trigger_releases_its_share(nats_server, nats_conn, users):
    JetStreamAdvisoryStreamOperator(task_id="capture", max_age="1h").execute(context={})
    triggers = [JetStreamAdvisoryTrigger(advisory="stream_deleted", start_time=datetime.now(UTC).isoformat())
                for _ in range(users)]

    async def scenario():
        runs = [asyncio.ensure_future(anext(t.run())) for t in triggers]
        await poll(lambda: client_connections(nats_server) == 1, "the shared connection")
        for run in runs:
            run.cancel()  # what the triggerer does on timeout or when the task is cleared
        await asyncio.gather(*runs, return_exceptions=True)
        await poll(lambda: client_connections(nats_server) == 0, "the connection to close")

    asyncio.run(scenario())
