"""Reads without a consumer (client/reading/stored.py) against a real nats-server: direct get and message get
read the same messages, and neither creates anything on the server (no consumer, no advisory from a direct get)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest

from airflow_jetstream.client.admin.streams import ensure_stream
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import StreamNotFoundError
from airflow_jetstream.client.reading.stored import direct_allowed, get_message, method_of, read_messages, read_range
from airflow_jetstream.client.settings import ConnectionSettings
from tests.support.polling import async_wait_until

MESSAGES = 12


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


async def _stream(conn, *, direct: bool) -> tuple[str, str]:
    """A stream of MESSAGES messages on ``<prefix>.0/1/2`` (round robin), message 5 deleted, headers on each."""
    stream = _name("DIRECT" if direct else "MSGGET")
    prefix = stream.lower()
    await ensure_stream(conn, {"name": stream, "subjects": [f"{prefix}.>"], "allow_direct": direct})
    for i in range(MESSAGES):
        await conn.js.publish(f"{prefix}.{i % 3}", b"m%d" % i, headers={"X-Index": str(i)})
    await conn.api_request(f"STREAM.MSG.DELETE.{stream}", {"seq": 5})
    return stream, prefix


@pytest.mark.parametrize("direct", [True, False], ids=["direct_get", "message_get"])
def test_one_message_by_seq_by_subject_and_next(settings: ConnectionSettings, direct: bool) -> None:
    async def main() -> None:
        async with open_connection(settings) as conn:
            stream, prefix = await _stream(conn, direct=direct)
            first = await get_message(conn, stream, seq=1, direct=direct)
            assert (first.seq, first.subject, first.data, first.headers) == (1, f"{prefix}.0", b"m0", {"X-Index": "0"})
            assert first.time and first.time.year == datetime.now(UTC).year
            last = await get_message(conn, stream, subject=f"{prefix}.1", direct=direct)
            assert (last.seq, last.data) == (11, b"m10")  # 1, 4, 7, 10 -> seqs 2, 5 (deleted), 8, 11
            after = await get_message(conn, stream, seq=5, subject=f"{prefix}.1", next_after=True, direct=direct)
            assert after.seq == 8
            assert await get_message(conn, stream, seq=5, direct=direct) is None  # deleted
            assert await get_message(conn, stream, seq=500, direct=direct) is None
            with pytest.raises(StreamNotFoundError):
                await get_message(conn, _name("NOPE"), seq=1, direct=direct)

    asyncio.run(main())


@pytest.mark.parametrize("direct", [True, False], ids=["direct_batch", "message_get"])
def test_many_messages_from_a_sequence_a_time_and_on_a_subject(settings: ConnectionSettings, direct: bool) -> None:
    async def main() -> None:
        async with open_connection(settings) as conn:
            stream, prefix = await _stream(conn, direct=direct)
            info = await conn.api_request(f"STREAM.INFO.{stream}")
            assert direct_allowed(conn, info, batch=True) is direct
            method = "direct_batch" if direct else "message_get"

            assert method_of(conn, info) == method
            window = await read_messages(conn, stream, 3, 8, info=info)
            assert [m.seq for m in window] == [3, 4, 6, 7, 8]  # 5 is deleted
            assert window[0].headers == {"X-Index": "2"}
            assert [m.seq for m in await read_messages(conn, stream, 3, None, limit=4)] == [3, 4, 6, 7]

            everything = await read_messages(conn, stream, 1, None)
            assert [m.seq for m in everything] == [s for s in range(1, MESSAGES + 1) if s != 5]

            on_two = await read_messages(conn, stream, 1, None, subjects=[f"{prefix}.2"], limit=3)
            assert [(m.seq, m.data) for m in on_two] == [(3, b"m2"), (6, b"m5"), (9, b"m8")]

            later = read_range(conn, stream, 1, None, via=None, start_time=everything[-2].time)
            assert [m[1] async for chunk in later for m in chunk] == [MESSAGES - 1, MESSAGES]
            assert [m async for m in read_range(conn, stream, 1, None, via=None, start_time=datetime.now(UTC))] == []

    asyncio.run(main())


def test_reads_create_nothing_on_the_server(settings: ConnectionSettings) -> None:
    """No consumer on the streams read, and a stream capturing every advisory but the API audits (the provider's
    capture stream) stores nothing for either method; creating a consumer is captured (the control)."""

    async def main() -> None:
        async with open_connection(settings) as conn:
            direct_stream, _ = await _stream(conn, direct=True)
            plain_stream, _ = await _stream(conn, direct=False)
            capture = _name("CAPTURE")
            await ensure_stream(conn, {"name": capture, "subjects": ["$JS.EVENT.ADVISORY.*.>"]})
            marker = f"$JS.EVENT.ADVISORY.TEST.{capture}"

            async def stored_after_marker() -> list[str]:
                """Subjects stored after a marker published now (what the reads before it made the server store)."""
                ack = await conn.js.publish(marker, b"{}")
                await conn.js.publish(marker, b"{}")
                return [m.subject for m in await read_messages(conn, capture, ack.seq, None)]

            await stored_after_marker()
            for _ in range(3):
                await read_messages(conn, direct_stream, 1, None)
                await get_message(conn, direct_stream, seq=2, direct=True)
                await read_messages(conn, plain_stream, 1, None)
                await read_messages(conn, plain_stream, 1, None, subjects=[f"{plain_stream.lower()}.1"])
                await get_message(conn, plain_stream, seq=2)
            assert (await stored_after_marker()) == [marker, marker]
            for stream in (direct_stream, plain_stream):
                assert (await conn.api_request(f"STREAM.INFO.{stream}"))["state"]["consumer_count"] == 0

            await conn.js.pull_subscribe(f"{plain_stream.lower()}.0", stream=plain_stream)  # the control

            async def consumer_created() -> bool:
                return any(".CONSUMER.CREATED." in m.subject for m in await read_messages(conn, capture, 1, None))

            await async_wait_until(consumer_created, "the control consumer's CONSUMER.CREATED advisory")

    asyncio.run(main())
