"""Reads that create nothing on the server: JetStream's message get and direct get, no consumer.

A consumer, even a short-lived ephemeral one, is created on the server: it counts against the
stream's ``max_consumers`` (1,000 when unset), its creation and deletion are advisories a capture
stream stores, and a reader that dies leaves it until its inactive threshold. The view, sensor pokes
and status reads use these instead (DESIGN.md: observing never writes).

Two server APIs, chosen per stream:

- **direct get** ``$JS.API.DIRECT.GET.<stream>``: needs the stream's ``allow_direct`` (nats-server 2.9+);
  any replica answers (one that is still applying the latest writes may not have them yet), and it is not
  a JetStream API call, so no API audit advisory is published for it. Batches (``batch``: up to 256
  messages per request here, ending with an ``EOB`` status that says how many more match) need 2.11+.
- **message get** ``$JS.API.STREAM.MSG.GET.<stream>``: every stream, one message per request, answered
  by the stream leader; an API call (audited like any other).

:func:`get_message` reads one message through nats-py's ``get_msg`` (``direct=`` when the stream allows).
:func:`get_messages` reads up to ``limit`` messages from a sequence or a time, optionally on a subject
filter: direct batches where the server and stream allow, else message gets (concurrent per sequence
without a filter, one after the other with ``next_by_subj``). Nothing here retries beyond
``settings.leader_wait`` (:meth:`JetStreamConnection.retry_leader`): every read is safe to repeat.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import nats.errors
import nats.js.errors

from airflow_jetstream.client import server_features
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import (
    InvalidRequestError,
    JetStreamError,
    LeaderUnavailableError,
    StreamNotFoundError,
    error_from_api,
)
from airflow_jetstream.client.reading.headers import Headers, parse_header_lines, without
from airflow_jetstream.client.reading.messages import Message
from airflow_jetstream.client.subjects import validate_name
from airflow_jetstream.client.times import parse_time, to_rfc3339

#: Messages asked for in one direct batch request (the reply is bounded in memory and time).
BATCH = 256
#: Message gets in flight at once when reading sequences without a subject filter.
CONCURRENT_GETS = 32
_NO_MESSAGE = 10037
T = TypeVar("T")
_STATUS = "Status"
#: Headers a direct get adds to the stored message's own (where it came from, what is left to read).
DIRECT_HEADERS = frozenset({"Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Num-Pending",
                             "Nats-Last-Sequence", "Nats-UpTo-Sequence"})


@dataclass(frozen=True)
class MessagePage:
    """What :func:`get_messages` read: ``messages`` in stream order, ``pending`` matching messages after the
    last one (None when the read method cannot tell), and ``next_seq`` to continue from."""

    messages: list[Message]
    pending: int | None
    next_seq: int
    method: str


def direct_allowed(conn: JetStreamConnection, info: dict[str, Any], *, batch: bool = False) -> bool:
    """Whether ``info``'s stream answers direct gets (``allow_direct``) on a server that has them (batches: 2.11+)."""
    feature = server_features.DIRECT_GET_BATCH if batch else server_features.DIRECT_GET
    return bool((info.get("config") or {}).get("allow_direct")) and server_features.supports(conn, feature)


async def _stream_info(conn: JetStreamConnection, stream: str) -> dict[str, Any]:
    return await conn.api_request(f"STREAM.INFO.{stream}", context=f"stream {stream!r}")


def _typed(conn: JetStreamConnection, exc: BaseException, stream: str, subject: str) -> JetStreamError:
    """A nats-py error of a get as the client's typed error."""
    what = f"read from stream {stream!r}"
    if isinstance(exc, nats.js.errors.APIError):
        error = {"code": exc.code, "err_code": exc.err_code, "description": exc.description}
        return error_from_api(error, context=what)
    if isinstance(exc, nats.errors.NoRespondersError):
        return StreamNotFoundError(
            f"{what}: nothing answers direct gets on {subject!r}: the stream does not exist or does not allow "
            "direct gets (allow_direct)", reason="stream_not_found")
    return conn.permission_error(subject) or conn.unanswered(f"{what}: no reply to {subject!r}")


def _own_headers(headers: Any) -> dict[str, str]:
    if not headers:
        return {}
    kept = without(headers if isinstance(headers, Headers) else Headers(dict(headers)), DIRECT_HEADERS)
    return kept if kept is not None else {}


def _time(stamp: str | None) -> datetime | None:
    """A stored message's time from the server's RFC 3339 text (nanoseconds are cut to microseconds)."""
    return datetime.fromisoformat(stamp) if stamp else None


def _from_natspy(stream: str, raw: Any, direct: bool) -> Message:
    headers = raw.headers or {}
    when = _time(headers.get("Nats-Time-Stamp")) or getattr(raw, "time", None)
    return Message(stream=stream, subject=raw.subject, seq=int(raw.seq or 0), data=raw.data or b"",
                   headers=_own_headers(headers) if direct else dict(headers), time=when)


async def get_message(conn: JetStreamConnection, stream: str, *, seq: int | None = None, subject: str | None = None,
                      next_after: bool = False, direct: bool = False) -> Message | None:
    """One stored message, or None when there is none.

    ``seq`` alone: that message. ``subject`` alone: the last message on it (a KV key:
    ``$KV.<bucket>.<key>``). ``seq`` and ``subject`` with ``next_after``: the first message at or after
    ``seq`` on ``subject`` (a wildcard filter works). ``direct`` uses direct get: only for a stream
    whose ``allow_direct`` is set (:func:`direct_allowed`).
    """
    validate_name(stream, what="stream name")
    if seq is None and subject is None:
        raise InvalidRequestError("get_message needs a seq, a subject or both", reason="invalid_request")
    if next_after and (seq is None or subject is None):
        raise InvalidRequestError("next_after needs both seq and subject", reason="invalid_request")
    api = f"{conn.api_prefix}.{'DIRECT.GET' if direct else 'STREAM.MSG.GET'}.{stream}"

    async def attempt() -> Message | None:
        try:
            raw = await conn.js.get_msg(stream, seq=seq, subject=subject, next=next_after, direct=direct)
        except nats.js.errors.NotFoundError as exc:
            if exc.err_code in (None, _NO_MESSAGE):  # a direct get's 404 carries no err_code
                return None
            raise _typed(conn, exc, stream, api) from None
        except (nats.errors.Error, TimeoutError) as exc:
            raise _typed(conn, exc, stream, api) from None
        return _from_natspy(stream, raw, direct)

    return await conn.retry_leader(f"read from stream {stream!r}", attempt)


async def get_messages(conn: JetStreamConnection, stream: str, *, limit: int, start_seq: int | None = None,
                       start_time: datetime | str | None = None, subject: str | None = None,
                       info: dict[str, Any] | None = None) -> MessagePage:
    """Up to ``limit`` messages from ``start_seq`` (or the first stored at or after ``start_time``; else the
    stream's first), only those on ``subject`` (a filter, wildcards allowed) when given.

    ``info`` is the stream's info when the caller has it (else it is read). ``method`` in the result
    says how: ``direct_batch``, or ``message_get`` for a stream without ``allow_direct`` or a server
    before 2.11.
    """
    validate_name(stream, what="stream name")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise InvalidRequestError(f"limit must be an integer >= 0, got {limit!r}", reason="invalid_request")
    if start_seq is not None and start_time is not None:
        raise InvalidRequestError("give start_seq or start_time, not both", reason="invalid_request")
    info = info if info is not None else await _stream_info(conn, stream)
    first = int((info.get("state") or {}).get("first_seq") or 1)
    since = to_rfc3339(parse_time(start_time, field="start_time")) if start_time is not None else None
    if since is not None:
        server_features.require(conn, server_features.MSG_GET_START_TIME,
                                what=f"reading stream {stream!r} from a time without a consumer")
    seq = max(int(start_seq or 1), 1)
    if limit == 0:
        return MessagePage([], None, seq, "none")
    if direct_allowed(conn, info, batch=True):
        return await _direct_batches(conn, stream, seq, since, subject, limit)
    if subject is None and since is None:
        last = int((info.get("state") or {}).get("last_seq") or 0)
        return await _gets_by_seq(conn, stream, max(seq, first), last, limit)
    return await _gets_in_order(conn, stream, seq, since, subject, limit)


async def read_until(conn: JetStreamConnection, stream: str, last_seq: int, *, start_seq: int = 1,
                     start_time: datetime | str | None = None, subject: str | None = None,
                     info: dict[str, Any] | None = None) -> AsyncGenerator[list[Message], None]:
    """Every message from ``start_seq`` (or the first stored at or after ``start_time``) up to ``last_seq``
    (inclusive), only those on ``subject`` when given, page by page.

    Complete up to ``last_seq``: a direct read is answered by any replica, and one still applying the latest
    writes may end early; then the stream leader is asked (one message get) whether anything up to
    ``last_seq`` is left, and the rest is read from it.
    """
    info = info if info is not None else await _stream_info(conn, stream)
    state = info.get("state") or {}  # a cached info may predate last_seq: message gets read up to it
    info = {**info, "state": {**state, "last_seq": max(int(state.get("last_seq") or 0), last_seq)}}
    # a single server is its own leader: only a cluster's replicas can lag behind it
    leader_only = not direct_allowed(conn, info, batch=True) or not conn.clustered
    seq, since, limit = max(start_seq, 1), start_time, BATCH
    while seq <= last_seq:
        page = await get_messages(conn, stream, limit=limit, start_seq=None if since is not None else seq,
                                  start_time=since, subject=subject, info=info)
        kept = [message for message in page.messages if message.seq <= last_seq]
        if page.messages:
            since, seq = None, page.messages[-1].seq + 1
        if kept:
            yield kept
        if len(kept) < len(page.messages) or (page.messages and page.pending != 0):
            continue
        if leader_only:
            return
        # the read ended below last_seq: the leader reads on (one get if the replica was current)
        leader_only, limit = True, 16
        info = {**info, "config": {**info.get("config", {}), "allow_direct": False}}


async def _direct_batches(conn: JetStreamConnection, stream: str, seq: int, since: str | None, subject: str | None,
                          limit: int) -> MessagePage:
    out: list[Message] = []
    pending: int | None = None
    while len(out) < limit:
        request: dict[str, Any] = {"batch": min(BATCH, limit - len(out))}
        if since is not None and not out:
            request["start_time"] = since
        else:
            request["seq"] = seq
        if subject is not None:
            request["next_by_subj"] = subject
        got, pending = await conn.retry_leader(f"read from stream {stream!r}",
                                               partial(direct_batch, conn, stream, request, partial(_stored, stream)))
        out.extend(got)
        if got:
            seq = got[-1].seq + 1
        if not got or not pending:
            break
    return MessagePage(out, pending if out else 0, seq, "direct_batch")


def _stored(stream: str, headers: Any, msg: Any) -> Message:
    return Message(stream=stream, subject=headers.get("Nats-Subject", ""), seq=int(headers.get("Nats-Sequence") or 0),
                   data=msg.data or b"", headers=_own_headers(headers), time=_time(headers.get("Nats-Time-Stamp")))


async def direct_batch(conn: JetStreamConnection, stream: str, request: dict[str, Any],
                       row: Callable[[Any, Any], T], *, election: bool = False) -> tuple[list[T], int | None]:
    """One direct batch request: its messages, each as ``row(headers, msg)``, and how many more match after
    them (the EOB's count). A 503 (nothing answers direct gets on the stream) is :class:`StreamNotFoundError`;
    with ``election`` (a stream known to exist, on a cluster) it is :class:`LeaderUnavailableError`."""
    subject = f"{conn.api_prefix}.DIRECT.GET.{stream}"
    inbox = conn.nc.new_inbox()
    sub = await conn.nc.subscribe(inbox, pending_bytes_limit=256 * 1024 * 1024)
    got: list[T] = []
    timeout = conn.settings.request_timeout
    try:
        await conn.nc.publish(subject, json.dumps(request).encode(), reply=inbox)
        while True:
            try:
                msg = await sub.next_msg(timeout=timeout)
            except (nats.errors.TimeoutError, TimeoutError):
                raise conn.permission_error(subject) or conn.unanswered(
                    f"read from stream {stream!r}: no reply to {subject!r} within {timeout}s") from None
            headers = msg.headers or {}
            status = headers.get(_STATUS)
            if status is None:
                got.append(row(headers, msg))
                continue
            if status == "204":  # EOB: the batch ended; how many more match
                return got, _int(headers.get("Nats-Num-Pending"))
            if status == "404":  # nothing (more) at or after the sequence
                return got, 0
            if status == "503" and election:
                raise LeaderUnavailableError(f"read from stream {stream!r}: direct get answered 503 (no replica "
                                             "answers right now)")
            if status == "503":
                raise StreamNotFoundError(
                    f"read from stream {stream!r}: nothing answers direct gets on {subject!r}: the stream does "
                    "not exist or does not allow direct gets (allow_direct)", reason="stream_not_found")
            description = str(headers.get("Description") or "").strip()
            raise JetStreamError(f"read from stream {stream!r}: the server answered {status} {description}",
                                 reason="direct_get_failed", code=_int(status), description=description)
    finally:
        if not conn.nc.is_closed:
            await sub.unsubscribe()


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


async def _gets_by_seq(conn: JetStreamConnection, stream: str, seq: int, last: int, limit: int) -> MessagePage:
    """Message gets of ``seq .. last`` (at most ``limit`` sequences), ``CONCURRENT_GETS`` at a time; deleted
    sequences are skipped (they count towards ``limit``: the read is bounded by sequences asked)."""
    end = min(last, seq + limit - 1)
    gate = asyncio.Semaphore(CONCURRENT_GETS)

    async def one(at: int) -> Message | None:
        async with gate:
            return await get_message(conn, stream, seq=at)

    found = await asyncio.gather(*(one(at) for at in range(seq, end + 1)))
    messages = [msg for msg in found if msg is not None]
    return MessagePage(messages, max(last - end, 0), end + 1, "message_get")


async def _gets_in_order(conn: JetStreamConnection, stream: str, seq: int, since: str | None, subject: str | None,
                         limit: int) -> MessagePage:
    """Message gets one after the other: the first at/after a time, then ``next_by_subj`` from each next sequence."""
    out: list[Message] = []
    if since is not None:
        first = await _get_from_time(conn, stream, since, subject)
        if first is None:
            return MessagePage([], 0, seq, "message_get")
        out.append(first)
        seq = first.seq + 1
    while len(out) < limit:
        msg = await get_message(conn, stream, seq=seq, subject=subject or ">", next_after=True)
        if msg is None:
            return MessagePage(out, 0, seq, "message_get")
        out.append(msg)
        seq = msg.seq + 1
    return MessagePage(out, None, seq, "message_get")


async def _get_from_time(conn: JetStreamConnection, stream: str, since: str,
                         subject: str | None) -> Message | None:
    """The first message stored at or after ``since`` (on ``subject``): nats-py's ``get_msg`` has no time."""
    body: dict[str, Any] = {"start_time": since}
    if subject is not None:
        body["next_by_subj"] = subject
    try:
        reply = await conn.api_request(f"STREAM.MSG.GET.{stream}", body, context=f"read from stream {stream!r}")
    except JetStreamError as exc:
        if exc.err_code == _NO_MESSAGE:
            return None
        raise
    message = reply["message"]
    return Message(stream=stream, subject=message["subject"], seq=int(message["seq"]),
                   data=base64.b64decode(message.get("data") or ""), headers=_stored_headers(message.get("hdrs")),
                   time=_time(message.get("time")))


def _stored_headers(hdrs: str | None) -> dict[str, str]:
    """The base64 header block of a message get's JSON (``NATS/1.0`` line, then header lines) as headers."""
    if not hdrs:
        return {}
    block = base64.b64decode(hdrs).split(b"\r\n", 1)
    return parse_header_lines(block[1]) if len(block) == 2 and block[1].strip() else {}


async def last_per_subject(conn: JetStreamConnection, stream: str,
                           subjects: Sequence[str]) -> dict[str, Message]:
    """The last message of each subject matching ``subjects`` (literal subjects and wildcard filters mixed), by
    subject, in one direct get (``multi_last``; nats-server 2.11+ and the stream's ``allow_direct``): a KV
    key's delete marker comes as its last message. A stream without ``allow_direct`` (or none at all) is
    :class:`StreamNotFoundError`. The answer is one consistent snapshot of the stream."""
    validate_name(stream, what="stream name")
    if not subjects:
        return {}
    server_features.require(conn, server_features.DIRECT_GET_BATCH, what=f"reading the last messages of {stream!r}")
    request = {"multi_last": list(subjects)}  # no "batch": a batch below the number of matches is refused (413)
    got, _ = await conn.retry_leader(f"read from stream {stream!r}",
                                     partial(direct_batch, conn, stream, request, partial(_stored, stream)))
    return {msg.subject: msg for msg in got}
