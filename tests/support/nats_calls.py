"""Call client coroutines from sync tests on a fresh connection (closed afterwards)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection, stream_info
from airflow_jetstream.client.batches.atomic import fence_count
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.reading.stored import read_range
from airflow_jetstream.embedded import EmbeddedNatsServer


def call_on_server(settings: ConnectionSettings, func: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
    """``await func(conn, *args, **kwargs)`` on a new connection and event loop."""

    async def call() -> Any:
        async with open_connection(settings) as conn:
            return await func(conn, *args, **kwargs)

    return asyncio.run(call())


def call_on(server: EmbeddedNatsServer, func: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
    """``await func(conn, *args, **kwargs)`` on a new connection to a test's ``server`` (10 s requests)."""
    return call_on_server(ConnectionSettings(servers=server.url, request_timeout=10), func, *args, **kwargs)


def with_streams(settings: ConnectionSettings, body: Callable[[Any], Awaitable[Any]],
                 streams: Iterable[dict[str, Any]]) -> Any:
    """Ensure ``streams`` (configs), then ``await body(conn)``."""

    async def setup_then_body(conn: Any) -> Any:
        for stream in streams:
            await ensure_stream(conn, stream)
        return await body(conn)

    return call_on_server(settings, setup_then_body)


async def stored_rows(conn: Any, stream: str) -> int:
    """Messages in ``stream`` other than the write fences of its atomic batches (one per fenced chunk)."""
    return int((await stream_info(conn, stream))["state"]["messages"]) - await fence_count(conn, stream)


async def publish_until_window_passed(conn: Any, subject: str) -> int:
    """Publish a probe msg id until the stream stops reporting it as a duplicate; returns probes stored."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    stored = 0
    first = await conn.js.publish(subject, b"probe", headers={"Nats-Msg-Id": "window-probe"})
    stored += not first.duplicate
    while loop.time() < deadline:
        ack = await conn.js.publish(subject, b"probe", headers={"Nats-Msg-Id": "window-probe"})
        if not ack.duplicate:
            return stored + 1
        await asyncio.sleep(0.05)
    raise AssertionError("the duplicate window did not pass within 30s")


async def ledger_ranges(conn: Any, bucket: str, run_id: str) -> dict[str, tuple[int, int | None, int | None]]:
    """The ledger's batches of ``run_id``: batch id -> (rows, first and last sequence the server committed)."""
    ledger = await BatchLedger.open(conn, bucket)
    return {r.batch_id: (r.count, r.first_seq, r.last_seq) for r in await ledger.batches(run_id)}


async def all_messages(conn: Any, stream: str) -> list[Any]:
    """Every message of ``stream``, first to last sequence (write fences included)."""
    info = await stream_info(conn, stream)
    out = []
    async for chunk in read_range(conn, stream, info["state"]["first_seq"], info["state"]["last_seq"]):
        out.extend(chunk)
    return out


async def drop_bucket(conn: Any, bucket: str) -> None:
    """Delete a KV bucket (a ledger whose entries were never written)."""
    await conn.js.delete_key_value(bucket)


@contextmanager
def requests_of(conn: Any) -> Iterator[list[str]]:
    """The JetStream/KV subjects ``conn`` sends to while the block runs (requests and publishes)."""
    sent: list[str] = []
    publish, request = conn.nc.publish, conn.nc.request
    inside: list[str] = []  # nats-py's request publishes through nc.publish: that is the same message

    async def counting_publish(subject, *args, **kwargs):
        if not inside:
            sent.append(subject)
        return await publish(subject, *args, **kwargs)

    async def counting_request(subject, *args, **kwargs):
        sent.append(subject)
        inside.append(subject)
        try:
            return await request(subject, *args, **kwargs)
        finally:
            inside.pop()

    conn.nc.publish, conn.nc.request = counting_publish, counting_request
    try:
        yield sent
    finally:
        conn.nc.publish, conn.nc.request = publish, request


@contextmanager
def request_endings(conn: Any) -> Iterator[list[tuple[str, str]]]:
    """(subject, how it ended) of each core request ``conn`` sends while the block runs, in the order they end:
    ``answered``, ``cancelled`` (by the caller, e.g. on the server's refusal) or the exception's type name
    (``TimeoutError`` after waiting the whole timeout)."""
    ended: list[tuple[str, str]] = []
    request = conn.nc.request

    async def watched_request(subject, *args, **kwargs):
        try:
            reply = await request(subject, *args, **kwargs)
        except asyncio.CancelledError:
            ended.append((subject, "cancelled"))
            raise
        except Exception as exc:
            ended.append((subject, type(exc).__name__))
            raise
        ended.append((subject, "answered"))
        return reply

    conn.nc.request = watched_request
    try:
        yield ended
    finally:
        conn.nc.request = request
