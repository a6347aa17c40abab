"""A stream's stored messages: one message (:func:`get_message`), a sequence range (:func:`read_range`), or the
last message of each subject (:func:`last_per_subject`, :func:`read_latest_per_subject`).

:func:`read_range` reads ``via`` a short-lived read consumer (``"consumer"``: fastest for bulk reads of a Limits
stream; WorkQueue streams refuse it), batched direct gets (``"direct"``: nats-server 2.11+ and ``allow_direct``;
any replica answers, and no API audit advisory is published), message gets (``"get"``: every stream, one message
per request, answered by the leader), or ``None``: direct where allowed, else gets. A consumer, even an ephemeral
one, is created on the server (it counts against ``max_consumers`` and its creation and deletion are advisories a
capture stream stores), so views, pokes and status reads use ``via=None`` (DESIGN.md: observing never writes).

A read is complete up to ``last``: on a cluster a read that ends early is checked against the stream leader (a
replica still catching up sees fewer messages) and goes on (:func:`_resuming`). Nothing here removes anything.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import sys
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from datetime import datetime
from typing import Any

from airflow_jetstream.client import server_features
from airflow_jetstream.client.admin.consumers import filter_config
from airflow_jetstream.client.admin.streams import first_seq_at_or_after, stream_info
from airflow_jetstream.client.batches.types import HEADER_STATUS
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import parse_time, to_rfc3339
from airflow_jetstream.client.errors import (
    InvalidRequestError,
    JetStreamError,
    LeaderUnavailableError,
    StreamNotFoundError,
)
from airflow_jetstream.client.reading.headers import Headers, parse_header_lines, without
from airflow_jetstream.client.reading.messages import Message, Row
from airflow_jetstream.client.subjects import is_fence_subject, validate_name

#: Messages a reader that only looks asks for in one direct batch request (the reply is bounded in memory and time).
BATCH = 256
#: Message gets in flight at once when reading without a subject filter.
CONCURRENT_GETS = 32
#: Headers a direct get adds to the stored message's own (where it came from, what is left to read).
DIRECT_HEADERS = frozenset({"Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Num-Pending",
                            "Nats-Last-Sequence", "Nats-UpTo-Sequence"})
_NO_MESSAGE = 10037
log = logging.getLogger(__name__)


def direct_allowed(conn: JetStreamConnection, info: dict[str, Any], *, batch: bool = False) -> bool:
    """Whether ``info``'s stream answers direct gets (``allow_direct``) on a server that has them (batches: 2.11+)."""
    feature = server_features.DIRECT_GET_BATCH if batch else server_features.DIRECT_GET
    return bool((info.get("config") or {}).get("allow_direct")) and server_features.supports(conn, feature)


def messages_of(stream: str, chunk: Sequence[Row]) -> list[Message]:
    """A chunk of :func:`read_range` as :class:`Message` objects."""
    return [Message.from_stored(stream, row) for row in chunk]


def method_of(conn: JetStreamConnection, info: dict[str, Any]) -> str:
    """How ``via=None`` reads the stream of ``info``: ``direct_batch`` or ``message_get``."""
    return "direct_batch" if direct_allowed(conn, info, batch=True) else "message_get"


async def read_messages(conn: JetStreamConnection, stream: str, first: int, last: int | None, *,
                        limit: int | None = None, subjects: Sequence[str] = (),
                        info: dict[str, Any] | None = None) -> list[Message]:
    """Up to ``limit`` messages of :func:`read_range` without a consumer (``via=None``), as a list."""
    out: list[Message] = []
    async with contextlib.aclosing(read_range(conn, stream, first, last, subjects=subjects, via=None, batch=BATCH,
                                              info=info)) as reader:
        async for chunk in reader:
            out.extend(messages_of(stream, chunk[:None if limit is None else limit - len(out)]))
            if limit is not None and len(out) >= limit:
                break
    return out


async def get_message(conn: JetStreamConnection, stream: str, *, seq: int | None = None, subject: str | None = None,
                      next_after: bool = False, direct: bool = False) -> Message | None:
    """One stored message, or None: ``seq`` alone that message, ``subject`` alone the last on it (a KV key), both
    with ``next_after`` the first at or after ``seq`` on ``subject`` (a filter). ``direct``: by direct get, for a
    stream with ``allow_direct`` (:func:`direct_allowed`); else a message get, answered by the stream leader."""
    validate_name(stream, what="stream name")
    if seq is None and subject is None:
        raise InvalidRequestError("get_message needs a seq, a subject or both", reason="invalid_request")
    if next_after and (seq is None or subject is None):
        raise InvalidRequestError("next_after needs both seq and subject", reason="invalid_request")
    if next_after:
        request: dict[str, Any] = {"seq": seq, "next_by_subj": subject}
    else:
        request = {"seq": seq} if subject is None else {"last_by_subj": subject}
    if direct:  # the last on a subject is asked as DIRECT.GET.<stream>.<subject>, which KV permissions grant
        last_on = None if next_after else subject
        got, _ = await conn.retry_leader(f"read from stream {stream!r}", lambda: request_rows(
            conn, stream, {} if last_on else request, one=True, subject=last_on))
        row = got[0] if got else None
    else:
        row = await _msg_get(conn, stream, request)
    return None if row is None else Message.from_stored(stream, row)


def _ts_nanos(rfc3339: str) -> int:
    """Nanoseconds since the epoch from the server's RFC 3339 time with up to 9 fraction digits."""
    text = rfc3339.rstrip("Z")
    base, _, frac = text.partition(".")
    seconds = int(datetime.fromisoformat(base + "+00:00").timestamp())
    return seconds * 1_000_000_000 + int((frac + "000000000")[:9])


def _direct_row(headers: Any, msg: Any) -> Row:
    """A direct get's message as a :data:`Row`: its own headers (repeated names keep every value)."""
    own = without(headers, DIRECT_HEADERS)
    return headers["Nats-Subject"], int(headers["Nats-Sequence"]), _ts_nanos(headers["Nats-Time-Stamp"]), own, msg.data


def _stored_headers(hdrs: str | None) -> Headers | None:
    """The base64 header block of a message get's JSON (``NATS/1.0`` line, then header lines) as headers."""
    if not hdrs:
        return None
    block = base64.b64decode(hdrs).split(b"\r\n", 1)
    return parse_header_lines(block[1]) if len(block) == 2 and block[1].strip() else None


async def _msg_get(conn: JetStreamConnection, stream: str, request: dict[str, Any]) -> Row | None:
    """A message get (``STREAM.MSG.GET``, answered by the stream leader) as a :data:`Row`, or None; with
    ``next_by_subj`` (``>``: any) the first at or after ``seq`` on that subject."""
    try:
        reply = await conn.api_request(f"STREAM.MSG.GET.{stream}", request, context=f"read from stream {stream!r}")
    except JetStreamError as exc:
        if exc.err_code == _NO_MESSAGE:
            return None
        raise
    message = reply["message"]
    return (message["subject"], int(message["seq"]), _ts_nanos(message["time"]), _stored_headers(message.get("hdrs")),
            base64.b64decode(message.get("data") or ""))


async def request_rows(conn: JetStreamConnection, stream: str, request: dict[str, Any], *, election: bool = False,
                       one: bool = False, subject: str | None = None, consumer: str | None = None,
                       last: int = sys.maxsize) -> tuple[list[Row], int | None]:
    """One request answered on an own inbox by a run of messages, as rows, and how many more match (0: none; None:
    not said): a direct batch get (each message's place in its headers, :func:`_direct_row`; the EOB status gives the
    count), or with ``consumer`` a no-wait pull request of that read consumer (the place and the count still pending
    in each delivery's reply subject, no API round trip per message; it ends at its ``batch``). A row at or past seq
    ``last`` ends it too. ``one``: a direct get of one message (no EOB follows it), of the last on ``subject`` when
    given. A 503 is :class:`StreamNotFoundError`; with ``election`` (the stream exists) a 503 or 409 (a leadership
    change) is :class:`LeaderUnavailableError`."""
    if consumer is not None:
        api = f"{conn.api_prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
    else:
        api = f"{conn.api_prefix}.DIRECT.GET.{stream}" + (f".{subject}" if subject else "")
    what = "the read consumer" if consumer else "direct get"
    done: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
    got: list[Row] = []

    async def on_message(msg: Any) -> None:
        if done.done():
            return
        headers = msg.headers or {}
        status = None if msg.reply else headers.get(HEADER_STATUS)
        if status is None:
            pending = None
            if msg.reply:  # a delivery: $JS.ACK.<stream>.<consumer>.<delivered>.<seq>.<cseq>.<time>.<pending>
                tokens = msg.reply.rsplit(".", 5)
                got.append((msg.subject, int(tokens[2]), int(tokens[4]), msg.headers, msg.data))
                pending = int(tokens[5])
            else:
                got.append(_direct_row(headers, msg))
            if one or pending == 0 or got[-1][1] >= last or (msg.reply and len(got) >= request["batch"]):
                done.set_result(pending)
        elif status == "204":  # EOB: the batch ended; how many more match
            done.set_result(_int(headers.get("Nats-Num-Pending")))
        elif status in ("404", "408"):  # nothing (more) at or after the sequence, or the pull request ended
            done.set_result(0)
        elif status in ("503", "409") and election:
            done.set_exception(LeaderUnavailableError(f"read from stream {stream!r}: {what} answered {status} (no "
                                                      "leader / leadership change)"))
        elif status == "503" and consumer is None:
            done.set_exception(StreamNotFoundError(
                f"read from stream {stream!r}: nothing answers direct gets on {api!r}: the stream does not exist or "
                "does not allow direct gets (allow_direct)", reason="stream_not_found"))
        else:
            description = str(headers.get("Description") or "").strip()
            done.set_exception(JetStreamError(
                f"read from stream {stream!r}: {what} answered {status} {description}", code=_int(status),
                reason="read_failed" if consumer else "direct_get_failed", description=description))

    sub = await conn.nc.subscribe(conn.nc.new_inbox(), cb=on_message, pending_bytes_limit=256 * 1024 * 1024)
    timeout = conn.settings.request_timeout
    try:
        await conn.nc.publish(api, json.dumps(request).encode() if request else b"", reply=sub.subject)
        while not done.done():
            seen = len(got)
            await asyncio.wait([done], timeout=timeout)
            if not done.done() and len(got) == seen:  # nothing within the timeout
                await conn.raise_if_denied(api)
                raise conn.unanswered(f"read from stream {stream!r}: no reply to {api!r} within {timeout}s")
        return got, done.result()
    finally:
        if not conn.nc.is_closed:
            await sub.unsubscribe()


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


async def _read_rows(conn: JetStreamConnection, stream: str, first: int, last: int, subjects: Sequence[str],
                     batch: int, *, direct: bool, consumer: str | None = None) -> AsyncGenerator[list[Row], None]:
    """Requests for the messages from ``first`` on, one subject (or all), until the server has no more or one is past
    ``last``: no-wait pulls of read ``consumer`` (which holds the position) or batched direct gets
    (:func:`request_rows`; a 503 or 409 on a cluster is an election: the stream exists, the read was planned on it),
    or message gets, ``CONCURRENT_GETS`` at once without a filter, one by one on a subject (a deleted sequence
    answers with the next stored one)."""
    subject = subjects[0] if subjects else ">"
    seq = first
    while seq <= last:
        if consumer is not None or direct:
            request: dict[str, Any] = {"batch": batch, "no_wait": True}
            if consumer is None:
                request = {"seq": seq, "batch": min(batch, last - seq + 1)}
                if subjects:
                    request["next_by_subj"] = subject
            got, pending = await request_rows(conn, stream, request, election=conn.clustered, consumer=consumer,
                                              last=last)
            more = pending != 0
        else:
            window = range(seq, min(last, seq + (CONCURRENT_GETS if subject == ">" else 1) - 1) + 1)
            found = await asyncio.gather(*(_msg_get(conn, stream, {"seq": at, "next_by_subj": subject})
                                           for at in window))
            got = sorted({row[1]: row for row in found if row is not None}.values(), key=lambda row: row[1])
            more = found[-1] is not None
        chunk = [row for row in got if row[1] <= last]
        if chunk:
            yield chunk
        if not more or not chunk or len(chunk) < len(got):
            return
        seq = got[-1][1] + 1


async def check_current_host(conn: JetStreamConnection, stream: str, name: str, created: dict[str, Any]) -> None:
    """Raise :class:`LeaderUnavailableError` (after deleting consumer ``name``) unless its server is the stream
    leader or a current replica (no lag), per the leader's stream info."""
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


async def read_with_consumer(conn: JetStreamConnection, stream: str, start: dict[str, Any], last: int,
                              subjects: Sequence[str], batch: int, *,
                              current_host: bool = False) -> AsyncGenerator[list[Row], None]:
    """Read from ``start`` (a deliver policy) up to seq ``last`` or until nothing is pending; with ``current_host`` a
    consumer placed on a lagging replica is refused (:func:`check_current_host`).

    The short-lived read consumer of ``via="consumer"`` and :func:`read_latest_per_subject`: an ephemeral
    ``ack_policy: none`` consumer of one in-memory replica, pulled in large batches with sequence and time read from
    each reply subject (no API round trip per message); deleted after a complete read, else dropped once inactive for
    30 s."""
    config: dict[str, Any] = {"name": f"read-{uuid.uuid4().hex[:16]}", **start, "ack_policy": "none", "num_replicas": 1,
                              "mem_storage": True, "inactive_threshold": 30_000_000_000, **filter_config(subjects)}
    name = config["name"]
    # Not retried here: a create that gets no answer may have been placed on a server that is down;
    # the caller's retry (:func:`_resuming`) creates one under a new name, which may be placed elsewhere.
    created = await conn.api_request(f"CONSUMER.CREATE.{stream}.{name}", {"stream_name": stream, "config": config},
                                     context=f"read consumer on stream {stream!r}", retry=False)
    if current_host:
        await check_current_host(conn, stream, name, created)
    async for chunk in _read_rows(conn, stream, 1, last, subjects, batch, direct=False, consumer=name):
        yield chunk
    # Reached only when the read completed (after an error the server drops it once inactive).
    await conn.api_request(f"CONSUMER.DELETE.{stream}.{name}", context="delete read consumer")


async def read_range(conn: JetStreamConnection, stream: str, first: int, last: int | None, *,
                     subjects: Sequence[str] = (), via: str | None = "consumer", batch: int = 5000,
                     start_time: datetime | str | None = None,
                     info: dict[str, Any] | None = None) -> AsyncGenerator[list[Row], None]:
    """Yield the messages with ``first <= seq <= last`` (matching ``subjects``; none: all but write fences) in
    chunks of up to ``batch``, in order; from ``start_time`` on when given. ``last`` None: up to what the answering
    server holds (a poll: what it misses comes with the next). ``info``: the stream's info when known."""
    validate_name(stream, what="stream name")
    if via is None:
        info = info if info is not None else await stream_info(conn, stream)
        via = "direct" if direct_allowed(conn, info, batch=True) else "get"
    if via not in ("consumer", "direct", "get"):
        raise InvalidRequestError(f"via={via!r}: use 'consumer', 'direct' or 'get'", reason="invalid_option")
    if start_time is not None:
        server_features.require(conn, server_features.MSG_GET_START_TIME,
                                what=f"reading stream {stream!r} from a time")
        since = await _first_at_or_after(conn, stream, parse_time(start_time, field="start_time"), via == "direct")
        if since is None:
            return
        first = max(first, since)
    first = max(first, 1)
    if last is not None and last < first:
        return
    if via != "consumer" and len(subjects) > 1:
        # gets read one subject after the other, each in sequence order: each resumes on its own
        for subject in subjects:
            async for chunk in read_range(conn, stream, first, last, subjects=(subject,), via=via, batch=batch):
                yield chunk
        return
    end = sys.maxsize if last is None else last

    def read_from(start: int) -> AsyncGenerator[list[Row], None]:
        if via == "consumer":
            policy = {"deliver_policy": "by_start_sequence", "opt_start_seq": start}
            return read_with_consumer(conn, stream, policy, end, subjects, batch)
        return _read_rows(conn, stream, start, end, subjects, batch, direct=via == "direct")

    checked = last is not None and conn.clustered and via != "get"  # a single server is its own leader
    async for chunk in _resuming(conn, stream, first, end, subjects, checked, via, read_from):
        if not subjects:
            chunk = [m for m in chunk if not is_fence_subject(m[0])]
        if chunk:
            yield chunk


async def _resuming(conn: JetStreamConnection, stream: str, first: int, last: int, subjects: Sequence[str],
                    checked: bool, via: str, read_from: Callable[[int], AsyncGenerator[list[Row], None]],
                    ) -> AsyncGenerator[list[Row], None]:
    """Yield ``read_from(first)``; after a :class:`LeaderUnavailableError` (a restart or election) read again from
    the sequence after the last one yielded, with the client's retry rule for up to ``leader_wait`` seconds without
    progress (each chunk is one call of it). Nothing is yielded twice.

    With ``checked``, a read that ends before ``last`` while the leader holds a matching message at or below ``last``
    (the replica that answered is catching up) goes on: from the leader by message gets, or with a new consumer."""
    start = first
    reader: AsyncGenerator[list[Row], None] | None = None

    def from_leader(at: int) -> AsyncGenerator[list[Row], None]:
        return _read_rows(conn, stream, at, last, subjects, BATCH, direct=False)

    async def next_chunk() -> list[Row] | None:
        """The next chunk from ``first`` on (from a new reader after an interruption), or None at the end."""
        nonlocal reader, read_from, checked
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
        behind = await _next_stored_seq(conn, stream, first, subjects) if checked and first <= last else None
        if behind is None or behind > last:
            return None
        if via != "consumer":  # the leader reads on (one get when the replica was current)
            checked, read_from = False, from_leader
            return await next_chunk()
        raise LeaderUnavailableError(
            f"stream {stream!r}: the read ended before seq {behind}, which the stream leader holds "
            "(the server that answered is a replica still catching up)")

    def interrupted(exc: JetStreamError) -> str | None:
        return f"read interrupted at seq {first}" if isinstance(exc, LeaderUnavailableError) else None

    try:
        while True:
            chunk = await conn.retry_leader(f"stream {stream}", next_chunk, transient=interrupted, logger=log,
                                            advice=f"the read of seq {start}..{last} stopped at seq {first}")
            if chunk is None:
                return
            first = chunk[-1][1] + 1
            yield chunk
    finally:
        if reader is not None:
            await reader.aclose()


async def _first_at_or_after(conn: JetStreamConnection, stream: str, since: datetime, direct: bool) -> int | None:
    """The sequence of the first message stored at or after ``since`` (None: none): by direct get where allowed (no
    API call to audit), else (or when a replica has none yet) from the leader."""
    if direct:
        request = {"start_time": to_rfc3339(since), "batch": 1}
        got, _ = await conn.retry_leader(f"read from stream {stream!r}", lambda: request_rows(
            conn, stream, request, election=conn.clustered))
        if got or not conn.clustered:
            return got[0][1] if got else None
    return await first_seq_at_or_after(conn, stream, since)  # none: the sequence after the last


async def _next_stored_seq(conn: JetStreamConnection, stream: str, first: int, subjects: Sequence[str]) -> int | None:
    """The first sequence >= ``first`` the stream leader holds on ``subjects`` (any subject when empty)."""
    found = [await _msg_get(conn, stream, {"seq": first, "next_by_subj": subject})
             for subject in subjects or (">",)]
    return min((row[1] for row in found if row is not None), default=None)


async def last_per_subject(conn: JetStreamConnection, stream: str,
                           subjects: Sequence[str]) -> dict[str, Message]:
    """The last message of each subject matching ``subjects`` (literals and filters), by subject: one consistent
    snapshot by one direct get (``multi_last``; nats-server 2.11+, ``allow_direct``, else :class:`StreamNotFoundError`);
    a KV key's delete marker comes as its last message."""
    validate_name(stream, what="stream name")
    if not subjects:
        return {}
    server_features.require(conn, server_features.DIRECT_GET_BATCH, what=f"reading the last messages of {stream!r}")
    request = {"multi_last": list(subjects)}  # no "batch": a batch below the number of matches is refused (413)
    got, _ = await conn.retry_leader(f"read from stream {stream!r}",
                                     lambda: request_rows(conn, stream, request))
    return {row[0]: Message.from_stored(stream, row) for row in got}


async def read_latest_per_subject(conn: JetStreamConnection, stream: str, subjects: Sequence[str], *,
                                  batch: int = 1000) -> AsyncGenerator[list[Row], None]:
    """Yield the last message of every subject matching ``subjects`` (a KV bucket's current values), however many,
    in sequence order; updates stored meanwhile come after. Ends when the consumer reports nothing pending, so it
    never stops early the way a KV watch's "initial values done" marker can (nats-py sends it when a consumer info
    answer overtakes the deliveries). A consumer placed on a replica still catching up would list only the keys it
    has (a short listing looks complete), so it is dropped and placed again for up to ``leader_wait``."""

    async def started() -> tuple[AsyncGenerator[list[Row], None], list[Row] | None]:
        reader = read_with_consumer(conn, stream, {"deliver_policy": "last_per_subject"}, sys.maxsize, subjects,
                                     batch, current_host=True)
        try:
            return reader, await anext(reader)  # a lagging host is refused before anything is yielded
        except StopAsyncIteration:
            return reader, None

    def not_started(exc: JetStreamError) -> str | None:
        return f"listing not started: {exc.message}" if isinstance(exc, LeaderUnavailableError) else None

    reader, first = await conn.retry_leader(f"stream {stream}", started, transient=not_started, logger=log)
    async with contextlib.aclosing(reader):
        if first is None:
            return
        yield first
        async for chunk in reader:
            yield chunk
