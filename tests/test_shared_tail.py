"""One subscription per stream per connection, fanned out in process (client/reading/shared_tail.py): one consumer
for many waiters, each getting exactly its subject's messages after it joined; recovery from a lost consumer; no
consumer on WorkQueue streams or when the consumer limit is reached; nothing left when the last waiter leaves."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from contextlib import AsyncExitStack

import pytest

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection
from airflow_jetstream.client.reading.listener_index import ListenerIndex, SubjectIndex
from airflow_jetstream.client.reading.messages import Message
from airflow_jetstream.client.reading.shared_tail import follow, tail_stats
from tests.support.polling import async_wait_until


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


async def consumers(conn, stream: str) -> list[str]:
    listing = await conn.api_request(f"CONSUMER.NAMES.{stream}")
    return listing.get("consumers") or []


async def gather_until(listener, count: int, what: str) -> list:
    got: list = []

    async def more() -> bool:
        got.extend(await listener.next_batch())
        return len(got) >= count

    await asyncio.wait_for(_until(more), 30)
    assert len(got) == count, f"{what}: {[m.seq for m in got]}"
    return got


async def _until(step) -> None:
    while not await step():
        pass


def test_subject_index_matches_literals_and_wildcards():
    index: SubjectIndex[str] = SubjectIndex()
    for pattern in ("a.b.c", "a.*.c", "a.>", ">", "a.b", "x.*"):
        index.add(pattern, pattern)
    assert index.match("a.b.c") == {"a.b.c", "a.*.c", "a.>", ">"}
    assert index.match("a.b") == {"a.b", "a.>", ">"}
    assert index.match("a") == {">"}
    assert index.match("x.y") == {"x.*", ">"}
    assert index.match("x.y.z") == {">"}
    index.remove("a.>", "a.>")
    index.remove(">", ">")
    index.remove("a.b.c", "nobody")  # not filed there: nothing changes
    assert index.match("a.b.c") == {"a.b.c", "a.*.c"}
    assert len(index) == 4 and index.items() == {"a.b.c", "a.*.c", "a.b", "x.*"}


def test_many_waiters_share_one_consumer_and_get_only_theirs(settings: ConnectionSettings):
    stream = _name("TAIL")

    async def main():
        stack = AsyncExitStack()
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": stream, "subjects": [f"{stream}.>"]})
            await conn.js.publish(f"{stream}.k0", b"before")  # stored before anyone joined: not delivered
            async with follow(conn, stream, f"{stream}.k0") as first:
                assert first.since == 1
                listeners = [first]
                for i in range(1, 40):
                    listeners.append(await stack.enter_async_context(follow(conn, stream, f"{stream}.k{i % 10}")))
                wildcard = await stack.enter_async_context(follow(conn, stream, f"{stream}.*"))
                assert await consumers(conn, stream) == [tail_stats(conn)[0].consumer]
                for i in range(20):
                    await conn.js.publish(f"{stream}.k{i % 10}", f"m{i}".encode())
                for i, listener in enumerate(listeners):
                    got = await gather_until(listener, 2, f"listener {i}")
                    assert [m.subject for m in got] == [f"{stream}.k{i % 10}"] * 2
                    assert [m.data for m in got] == [f"m{i % 10}".encode(), f"m{i % 10 + 10}".encode()]
                all_of_them = await gather_until(wildcard, 20, "the wildcard listener")
                assert [m.seq for m in all_of_them] == list(range(2, 22))
                await stack.aclose()
                assert len(tail_stats(conn)) == 1 and tail_stats(conn)[0].listeners == 1
            assert tail_stats(conn) == []
            assert await consumers(conn, stream) == []  # deleted by the last waiter, not left to expire

    asyncio.run(main())


def test_a_lost_consumer_is_replaced_without_gap_or_repeat(settings: ConnectionSettings):
    stream = _name("TAIL_LOST")

    async def main():
        async with open_connection(settings) as conn, open_connection(settings) as other:
            await ensure_stream(conn, {"name": stream, "subjects": [f"{stream}.>"]})
            async with follow(conn, stream) as listener:
                await conn.js.publish(f"{stream}.a", b"1")
                assert [m.data for m in await gather_until(listener, 1, "first")] == [b"1"]
                lost = tail_stats(conn)[0].consumer
                await other.api_request(f"CONSUMER.DELETE.{stream}.{lost}")  # e.g. its server died
                for i in range(2, 6):
                    await other.js.publish(f"{stream}.a", str(i).encode())
                got = await gather_until(listener, 4, "the messages stored while the consumer was gone")
                assert [m.data for m in got] == [b"2", b"3", b"4", b"5"]
                assert tail_stats(conn)[0].resubscribed >= 1 and tail_stats(conn)[0].consumer != lost
                await async_wait_until(lambda: consumers(conn, stream), "the replacement consumer")
                assert await consumers(conn, stream) == [tail_stats(conn)[0].consumer]

    asyncio.run(main())


def test_workqueue_stream_is_polled_without_a_consumer(settings: ConnectionSettings):
    stream = _name("TAIL_WQ")

    async def main():
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": stream, "subjects": [f"{stream}.>"], "retention": "workqueue",
                                       "allow_direct": True})
            async with follow(conn, stream, f"{stream}.x") as listener:
                assert tail_stats(conn)[0].mode == "poll"
                for i in range(3):
                    await conn.js.publish(f"{stream}.{'xy'[i % 2]}", str(i).encode())
                got = await gather_until(listener, 2, "the x messages")
                assert [m.data for m in got] == [b"0", b"2"]
                assert await consumers(conn, stream) == []
                info = await conn.api_request(f"STREAM.INFO.{stream}")
                assert info["state"]["messages"] == 3  # read, not taken away

    asyncio.run(main())


def test_consumer_limit_reached_polls_and_names_the_limit(settings: ConnectionSettings, caplog):
    stream = _name("TAIL_FULL")

    async def main():
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": stream, "subjects": [f"{stream}.>"], "max_consumers": 1})
            await conn.api_request(f"CONSUMER.CREATE.{stream}.someone",
                                   {"stream_name": stream, "config": {"durable_name": "someone", "ack_policy": "none"}})
            async with follow(conn, stream) as listener:
                stats = tail_stats(conn)[0]
                assert stats.mode == "poll" and "max_consumers" in stats.degraded and "allows 1" in stats.degraded
                await conn.js.publish(f"{stream}.a", b"still seen")
                assert [m.data for m in await gather_until(listener, 1, "the message")] == [b"still seen"]
            assert await consumers(conn, stream) == ["someone"]

    with caplog.at_level(logging.WARNING, logger="airflow_jetstream.client.reading.shared_tail"):
        asyncio.run(main())
    assert any("max_consumers" in r.getMessage() and "consumer_limit" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("subject", [None, "x.>"])
def test_a_missing_stream_reaches_every_waiter(settings: ConnectionSettings, subject):
    from airflow_jetstream.client.errors import StreamNotFoundError

    async def main():
        async with open_connection(settings) as conn:
            results = await asyncio.gather(*(follow(conn, "NO_SUCH_STREAM", tail_filter=subject).__aenter__()
                                             for _ in range(3)), return_exceptions=True)
            assert all(isinstance(r, StreamNotFoundError) for r in results)
            assert tail_stats(conn) == []

    asyncio.run(main())


@pytest.mark.parametrize("direct", [True, False], ids=["direct_get", "message_get"])
def test_read_range_stops_at_the_last_sequence_even_with_old_stream_info(settings: ConnectionSettings, direct):
    """What a waiter reads from before it joined: up to ``since`` exactly, whatever its cached stream info says."""
    from airflow_jetstream.client.reading.stored import read_range

    stream = _name("UNTIL")

    async def main():
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": stream, "subjects": [f"{stream}.>"], "allow_direct": direct})
            stale = await conn.api_request(f"STREAM.INFO.{stream}")  # last_seq 0
            for i in range(1, 31):
                await conn.js.publish(f"{stream}.{'ab'[i % 2]}", str(i).encode())

            async def seqs(last, first=1, subjects=()):
                reader = read_range(conn, stream, first, last, subjects=subjects, via=None, info=stale)
                return [m[1] async for chunk in reader for m in chunk]

            assert await seqs(25) == list(range(1, 26))
            assert await seqs(25, 20, (f"{stream}.a",)) == [20, 22, 24]
            assert await seqs(3, subjects=(f"{stream}.b",)) == [1, 3]
            assert await seqs(0) == []

    asyncio.run(main())


def test_waiters_on_one_subject_get_only_what_they_accept(settings: ConnectionSettings):
    stream = _name("TAIL_ACCEPT")

    async def main():
        async with open_connection(settings) as conn, AsyncExitStack() as stack:
            await ensure_stream(conn, {"name": stream, "subjects": [f"{stream}.>"]})
            listeners = [await stack.enter_async_context(
                follow(conn, stream, f"{stream}.batch", accept=lambda m, i=i: m.data == f"b{i}".encode()))
                for i in range(5)]
            broken = await stack.enter_async_context(
                follow(conn, stream, f"{stream}.batch", accept=lambda m: 1 / 0))  # its own reading raises
            for i in reversed(range(5)):
                await conn.js.publish(f"{stream}.batch", f"b{i}".encode())
            for i, listener in enumerate(listeners):
                got = await gather_until(listener, 1, f"listener {i}")
                assert [m.data for m in got] == [f"b{i}".encode()]
                assert listener._items == []  # nothing else was queued for it
            assert len(await gather_until(broken, 5, "the listener whose accept raised")) == 5

    asyncio.run(main())


class _Recorder:
    def __init__(self) -> None:
        self.got: list = []

    def push(self, message) -> None:
        self.got.append(message)

    def fail(self, error) -> None:
        self.got.append(error)


def test_listener_index_hands_a_keyed_message_to_the_waiters_of_its_value_only():
    looked = []

    def key_of(message):
        looked.append(message)
        return message.data

    index = ListenerIndex()
    b1, b2, unkeyed = _Recorder(), _Recorder(), _Recorder()
    index.add("ADV.abandoned", b1, key=(key_of, b"b1"))
    index.add("ADV.abandoned", b2, key=(key_of, b"b2"))
    index.add("ADV.*", unkeyed)
    first = Message("S", "ADV.abandoned", 1, b"b1")
    index.dispatch(first)
    assert (b1.got, b2.got, unkeyed.got, looked) == ([first], [], [first], [first])  # key_of once per message

    unreadable = Message("S", "ADV.abandoned", 2, b"")
    odd = _Recorder()
    index.add("ADV.abandoned", odd, key=(lambda m: {}, "x"))  # a value that cannot be looked up: its members decide
    index.dispatch(unreadable)
    assert (b1.got, b2.got, odd.got, unkeyed.got) == ([first], [], [unreadable], [first, unreadable])

    assert len(index) == 4
    index.remove("ADV.abandoned", b1, key=(key_of, b"b1"))
    index.remove("ADV.abandoned", b2, key=(key_of, b"b2"))
    assert len(index) == 2
    index.dispatch(Message("S", "ADV.abandoned", 3, b"b1"))
    assert b1.got == [first] and len(looked) == 2  # the emptied group is gone from the subject


def test_thousands_of_advisory_waiters_check_each_advisory_once_not_once_per_waiter(settings, monkeypatch):
    """300 readers of one capture stream, each for its own batch, and 300 advisories: each advisory is checked
    against its own reader's filter only (9,900 advisories reaching 10,000 sensors took 16-21 s when every
    advisory was checked against every waiting filter: 99 million checks)."""
    from airflow_jetstream.client.advisories.capture import capture_stream_config, follow_captured
    from airflow_jetstream.client.advisories.types import AdvisoryFilter, decode_advisory

    checks = 0
    matches = AdvisoryFilter.matches

    def counted(self, advisory):
        nonlocal checks
        checks += 1
        return matches(self, advisory)

    monkeypatch.setattr(AdvisoryFilter, "matches", counted)
    capture, stream, count = _name("CAPTURE"), _name("ORDERS"), 300

    async def main():
        async with open_connection(settings) as conn, AsyncExitStack() as stack:
            await ensure_stream(conn, capture_stream_config(capture, max_age="1h"))
            readers = [await stack.enter_async_context(follow_captured(
                conn, capture, AdvisoryFilter(advisory="batch_abandoned", stream=stream, batch=f"b{i}")))
                for i in range(count)]
            for i in reversed(range(count)):
                await conn.js.publish(f"$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED.{stream}", json.dumps(
                    {"type": "io.nats.jetstream.advisory.v1.stream_batch_abandoned", "id": f"a{i}",
                     "timestamp": "2026-11-27T12:00:00Z", "stream": stream, "batch": f"b{i}"}).encode())
            for i, (listener, _info) in enumerate(readers):
                got = [decode_advisory(message.data) for message in await asyncio.wait_for(listener.next_batch(), 35)]
                assert [advisory.raw["batch"] for advisory in got] == [f"b{i}"]

    asyncio.run(main())
    assert checks == count, f"{checks} filter checks for {count} advisories and {count} waiters"
