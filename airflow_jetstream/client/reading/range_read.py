"""Reads of a stream by sequence range, in order, resumed after a leader election without repeats.

* :func:`read_range` with ``via="consumer"`` uses a short-lived ephemeral pull consumer with
  ``ack_policy: none`` starting at the range's first sequence, pulls in large batches and reads
  sequence/timestamp from the delivery reply subject (no per-message API round trip). It does not
  change the stream. WorkQueue streams refuse such consumers, so they are read with
* ``via="direct"``: batched direct get (``$JS.API.DIRECT.GET.<stream>`` with ``batch``), which
  needs ``allow_direct: true`` on the stream and creates no consumer at all.

Neither way removes anything (planning a read and acknowledging it: :mod:`.read_plan`).
:func:`read_latest_per_subject` lists the last message of each subject (a KV bucket's current values).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from datetime import datetime
from typing import Any

from airflow_jetstream.client.admin.consumers import filter_config
from airflow_jetstream.client.admin.streams import stream_info
from airflow_jetstream.client.batches.fence import is_fence_subject
from airflow_jetstream.client.batches.types import HEADER_STATUS
from airflow_jetstream.client.connection import QUORUM_ADVICE, JetStreamConnection
from airflow_jetstream.client.errors import InvalidRequestError, JetStreamError, LeaderUnavailableError
from airflow_jetstream.client.reading.direct import DIRECT_HEADERS, direct_batch
from airflow_jetstream.client.reading.headers import without
from airflow_jetstream.client.retry import retry

#: One stored message as a row: subject, stream sequence, timestamp (ns since epoch), headers or None, payload. The
#: Spark reader builds its columns from these without an object per message; others read them as
#: :class:`~airflow_jetstream.client.reading.messages.Message` (``Message.from_stored``).
Row = tuple[str, int, int, dict[str, str] | None, bytes]
#: Pull / direct-get statuses that mean "no leader right now": no responders, leadership change.
_LEADER_STATUSES = frozenset({"503", "409"})
_ERR_NO_MESSAGE = 10037
log = logging.getLogger(__name__)


def _ts_nanos(rfc3339: str) -> int:
    """Nanoseconds since the epoch from the server's RFC 3339 time with up to 9 fraction digits."""
    text = rfc3339.rstrip("Z")
    base, _, frac = text.partition(".")
    seconds = int(datetime.fromisoformat(base + "+00:00").timestamp())
    return seconds * 1_000_000_000 + int((frac + "000000000")[:9])


async def _read_via_consumer(conn: JetStreamConnection, stream: str, first: int, last: int,
                             subjects: Sequence[str], batch: int) -> AsyncGenerator[list[Row], None]:
    start = {"deliver_policy": "by_start_sequence", "opt_start_seq": first}
    async for chunk in _read_with_consumer(conn, stream, start, last, subjects, batch):
        yield chunk


async def read_latest_per_subject(conn: JetStreamConnection, stream: str, subjects: Sequence[str], *,
                                  batch: int = 1000) -> AsyncGenerator[list[Row], None]:
    """Yield the last message of every subject matching ``subjects`` (a KV bucket's current values),
    in sequence order; updates stored while reading come after (a later one for a subject replaces
    the earlier). Ends when the consumer reports nothing pending, so it never stops early the way
    a KV watch's "initial values done" marker can (nats-py sends it when a consumer info answer
    overtakes the deliveries).

    On a cluster the read consumer must sit on the stream leader or on a current replica: one placed
    on a replica still catching up (just restarted) would list only the keys it has so far, and a
    short listing cannot be told from a complete one. Such a consumer is dropped and placed again with
    the client's retry rule (:func:`~airflow_jetstream.client.retry.retry`: 0.25 s doubling up to 2 s) for
    up to the connection's ``leader_wait``."""

    async def started() -> tuple[AsyncGenerator[list[Row], None], list[Row] | None]:
        reader = _read_with_consumer(conn, stream, {"deliver_policy": "last_per_subject"}, sys.maxsize, subjects,
                                     batch, current_host=True)
        try:
            return reader, await anext(reader)  # a lagging host is refused before anything is yielded
        except StopAsyncIteration:
            return reader, None

    def not_started(exc: JetStreamError) -> str | None:
        return f"listing not started: {exc.message}" if isinstance(exc, LeaderUnavailableError) else None

    reader, first = await retry(f"stream {stream}", started, transient=not_started,
                                budget=conn.settings.leader_wait, advice=QUORUM_ADVICE, logger=log)
    async with contextlib.aclosing(reader):
        if first is None:
            return
        yield first
        async for chunk in reader:
            yield chunk


async def _check_current_host(conn: JetStreamConnection, stream: str, name: str, created: dict[str, Any]) -> None:
    """Raise :class:`LeaderUnavailableError` (after deleting consumer ``name``) unless the server hosting
    it is the stream leader or a replica that is current (no lag), per the leader's stream info."""
    host = (created.get("cluster") or {}).get("leader")
    if not conn.clustered or not host:
        return
    cluster = (await stream_info(conn, stream)).get("cluster") or {}
    if host == cluster.get("leader"):
        return
    replica: dict[str, Any] = next((r for r in cluster.get("replicas") or [] if r.get("name") == host), {})
    if replica.get("current") and not replica.get("lag"):
        return
    with contextlib.suppress(JetStreamError):
        await conn.api_request(f"CONSUMER.DELETE.{stream}.{name}", context="delete read consumer", retry=False)
    raise LeaderUnavailableError(f"stream {stream!r}: the read consumer was placed on {host}, a replica still "
                                 f"catching up (lag {replica.get('lag', 'unknown')})")


async def _read_with_consumer(conn: JetStreamConnection, stream: str, start: dict[str, Any], last: int,
                              subjects: Sequence[str], batch: int, *,
                              current_host: bool = False) -> AsyncGenerator[list[Row], None]:
    """Read with an ephemeral ``ack_policy: none`` consumer from ``start`` (its deliver policy) up to
    seq ``last`` or until nothing is pending; the consumer is deleted after a complete read. With
    ``current_host`` a consumer placed on a lagging replica is refused (:func:`_check_current_host`)."""
    config: dict[str, Any] = {
        "name": f"read-{uuid.uuid4().hex[:16]}",
        **start,
        "ack_policy": "none",
        # a short-lived read cursor: one in-memory replica whatever the stream's replicas
        "num_replicas": 1,
        "mem_storage": True,
        "inactive_threshold": 30_000_000_000,
    }
    config.update(filter_config(subjects))
    name = config["name"]
    # Not retried here: a create that gets no answer may have been placed on a server that is down;
    # the caller's retry (_resuming) creates one under a new name, which may be placed elsewhere.
    created = await conn.api_request(f"CONSUMER.CREATE.{stream}.{name}", {"stream_name": stream, "config": config},
                                     context=f"read consumer on stream {stream!r}", retry=False)
    if current_host:
        await _check_current_host(conn, stream, name, created)
    inbox = conn.nc.new_inbox()
    queue: asyncio.Queue[list[Row] | int] = asyncio.Queue()
    chunk: list[Row] = []
    pull = {"want": 0, "delivered": 0}

    def flush() -> None:
        queue.put_nowait(chunk.copy())
        chunk.clear()

    async def on_message(msg: Any) -> None:
        reply = msg.reply
        if not reply:
            status = msg.headers.get(HEADER_STATUS, "") if msg.headers else ""
            flush()
            queue.put_nowait(int(status or 0) or 404)
            return
        tokens = reply.rsplit(".", 5)
        seq, pending = int(tokens[2]), int(tokens[5])
        pull["delivered"] += 1
        if seq <= last:
            chunk.append((msg.subject, seq, int(tokens[4]), msg.headers, msg.data))
        if seq >= last or pending == 0:
            flush()
            queue.put_nowait(0)
        elif pull["delivered"] >= pull["want"] or len(chunk) >= batch:
            flush()

    sub = await conn.nc.subscribe(inbox, cb=on_message, pending_msgs_limit=batch * 4,
                                  pending_bytes_limit=256 * 1024 * 1024)
    next_subject = f"{conn.api_prefix}.CONSUMER.MSG.NEXT.{stream}.{name}"
    try:
        finished = False
        while not finished:
            pull["want"], pull["delivered"] = batch, 0
            await conn.nc.publish(next_subject, json.dumps({"batch": batch, "no_wait": True}).encode(),
                                  reply=inbox)
            while True:
                try:
                    async with asyncio.timeout(conn.settings.request_timeout):
                        item = await queue.get()
                except TimeoutError:
                    await conn.raise_if_denied(next_subject)
                    raise conn.unanswered(f"stream {stream!r}: no messages from the read consumer within "
                                          f"{conn.settings.request_timeout}s") from None
                if isinstance(item, list):
                    if item:
                        yield item
                    if pull["delivered"] >= pull["want"] and queue.empty():
                        break
                    continue
                if item in (0, 404, 408):
                    finished = True
                    break
                if str(item) in _LEADER_STATUSES and conn.clustered:
                    raise LeaderUnavailableError(f"stream {stream!r}: the read consumer answered status {item} "
                                                 "(no leader / leadership change)")
                raise JetStreamError(f"stream {stream!r}: the read consumer answered status {item}",
                                     reason="read_failed")
    finally:
        await sub.unsubscribe()
    # Reached only when the read completed; after an error the server drops the consumer once
    # it has been inactive for inactive_threshold.
    await conn.api_request(f"CONSUMER.DELETE.{stream}.{name}", context="delete read consumer")


def _row(headers: Any, msg: Any) -> Row:
    """A direct get's message as a :data:`Row`."""
    own = without(headers, DIRECT_HEADERS)  # repeated names keep every value
    return headers["Nats-Subject"], int(headers["Nats-Sequence"]), _ts_nanos(headers["Nats-Time-Stamp"]), own, msg.data


async def _read_via_direct(conn: JetStreamConnection, stream: str, first: int, last: int,
                           subjects: Sequence[str], batch: int) -> AsyncGenerator[list[Row], None]:
    """Batched direct gets (:func:`~airflow_jetstream.client.reading.direct.direct_batch`) of one subject (or all);
    a 503 on a cluster is an election (the stream exists: the read was planned on it)."""
    seq = first
    while seq <= last:
        request: dict[str, Any] = {"seq": seq, "batch": min(batch, last - seq + 1)}
        if subjects:
            request["next_by_subj"] = subjects[0]
        got, pending = await direct_batch(conn, stream, request, _row, election=conn.clustered)
        chunk = [message for message in got if message[1] <= last]
        if chunk:
            yield chunk
        if not got or len(chunk) < len(got) or pending == 0:
            return
        seq = got[-1][1] + 1


async def read_range(conn: JetStreamConnection, stream: str, first: int, last: int, *,
                     subjects: Sequence[str] = (), via: str = "consumer",
                     batch: int = 5000) -> AsyncGenerator[list[Row], None]:
    """Yield the messages with ``first <= seq <= last`` (matching ``subjects``) in chunks, in order.

    Without ``subjects`` every message but the write fences (:mod:`~airflow_jetstream.client.batches.fence`)."""
    if last < first:
        return
    if via == "direct" and len(subjects) > 1:
        # direct get reads one subject after the other, each in sequence order: each resumes on its own
        for subject in subjects:
            async for chunk in read_range(conn, stream, first, last, subjects=(subject,), via=via, batch=batch):
                yield chunk
        return
    if via == "consumer":
        read_from = _read_via_consumer
    elif via == "direct":
        read_from = _read_via_direct
    else:
        raise InvalidRequestError(f"via={via!r}: use 'consumer' or 'direct'", reason="invalid_option")
    async for chunk in _resuming(conn, stream, first, last, subjects,
                                 lambda start: read_from(conn, stream, start, last, subjects, batch)):
        if not subjects:
            chunk = [m for m in chunk if not is_fence_subject(m[0])]
        if chunk:
            yield chunk


async def _resuming(conn: JetStreamConnection, stream: str, first: int, last: int, subjects: Sequence[str],
                    read_from: Callable[[int], AsyncGenerator[list[Row], None]],
                    ) -> AsyncGenerator[list[Row], None]:
    """Yield ``read_from(first)``; after a :class:`LeaderUnavailableError` (a node restart or leader
    election) read again from the sequence after the last one yielded, with the client's retry rule
    (:func:`~airflow_jetstream.client.retry.retry`: 0.25 s doubling up to 2 s) for up to the connection's
    ``leader_wait`` seconds without progress: each chunk is one call of it. Nothing is yielded twice.

    A read that ends before ``last`` is checked against the stream leader: a read consumer or a direct
    get answered by a replica that is still catching up (just restarted) sees fewer messages, so when
    the leader holds a matching message at or below ``last`` the read resumes instead of ending short."""
    start = first
    reader: AsyncGenerator[list[Row], None] | None = None

    async def next_chunk() -> list[Row] | None:
        """The next chunk from ``first`` on (from a new reader after an interruption), or None at the end."""
        nonlocal reader
        if reader is None:
            if first > last:
                return None
            reader = read_from(first)
        try:
            return await anext(reader)
        except StopAsyncIteration:
            reader = None
        except LeaderUnavailableError:
            reader = None
            raise
        if first <= last:
            behind = await _next_stored_seq(conn, stream, first, subjects)
            if behind is not None and behind <= last:
                raise LeaderUnavailableError(
                    f"stream {stream!r}: the read ended before seq {behind}, which the stream leader holds "
                    "(the server that answered is a replica still catching up)")
        return None

    def interrupted(exc: JetStreamError) -> str | None:
        return f"read interrupted at seq {first}" if isinstance(exc, LeaderUnavailableError) else None

    try:
        while True:
            chunk = await retry(f"stream {stream}", next_chunk, transient=interrupted,
                                budget=conn.settings.leader_wait, logger=log,
                                advice=f"the read of seq {start}..{last} stopped at seq {first}; {QUORUM_ADVICE}")
            if chunk is None:
                return
            first = chunk[-1][1] + 1
            yield chunk
    finally:
        if reader is not None:
            await reader.aclose()


async def _next_stored_seq(conn: JetStreamConnection, stream: str, first: int, subjects: Sequence[str]) -> int | None:
    """The first sequence >= ``first`` the stream leader holds on ``subjects`` (any subject when empty)."""
    found = []
    for subject in subjects or (">",):
        try:
            reply = await conn.api_request(f"STREAM.MSG.GET.{stream}", {"seq": first, "next_by_subj": subject},
                                           context=f"stream {stream!r}")
        except JetStreamError as exc:
            if exc.err_code == _ERR_NO_MESSAGE:
                continue
            raise
        found.append(int(reply["message"]["seq"]))
    return min(found, default=None)

