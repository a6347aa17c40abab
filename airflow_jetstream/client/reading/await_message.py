"""Find the first message of a stream (or subject) that satisfies a function, from a start point.

Used by the message sensor (scan what is stored now, resume later from ``next_seq``) and its trigger
(keep waiting for new messages)::

    start = await resolve_start(conn, "ORDERS", "new")           # or a sequence, or a time
    found = await find_message(conn, "ORDERS", is_order_42, subject="orders.>", start_seq=start)
    found["message"]   # None, or the matching message as a dict (subject, seq, headers, data, ...)

Nothing on the server changes: a Limits stream is read with a short-lived ephemeral consumer
without acks (deleted afterwards, or dropped by the server after a minute of inactivity); WorkQueue
and Interest streams, where such a consumer would take messages away or be refused, are read by
direct get (they need ``allow_direct: true``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Callable
from contextlib import aclosing
from datetime import datetime
from typing import Any

from airflow_jetstream.client.admin.streams import first_seq_at_or_after, stream_info
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import ApplyFunctionError, InvalidRequestError, JetStreamError
from airflow_jetstream.client.reading.apply_function import call_function
from airflow_jetstream.client.reading.messages import ConsumedMessage
from airflow_jetstream.client.reading.pull import PullSubscription
from airflow_jetstream.client.reading.range_read import read_range
from airflow_jetstream.client.subjects import validate_name, validate_subject
from airflow_jetstream.client.times import parse_time

START_WORDS = ("new", "first")
log = logging.getLogger(__name__)


async def resolve_start(conn: JetStreamConnection, stream: str, start: int | str | datetime) -> int:
    """The first stream sequence to look at: ``"new"`` (after the last stored now), ``"first"``, a
    sequence (int or digits) or a time (datetime or ISO 8601; the first message stored at or after it)."""
    if isinstance(start, bool):
        raise InvalidRequestError(f"start: {start!r} is not a start point", reason="invalid_start")
    if isinstance(start, int):
        if start < 1:
            raise InvalidRequestError(f"start sequence must be >= 1, got {start}", reason="invalid_start")
        return start
    if isinstance(start, str) and start.strip().isdigit():
        return await resolve_start(conn, stream, int(start.strip()))
    if isinstance(start, str) and start.strip().lower() in START_WORDS:
        state = (await stream_info(conn, stream))["state"]
        return 1 if start.strip().lower() == "first" else int(state.get("last_seq") or 0) + 1
    try:
        when = parse_time(start, field="start")
    except InvalidRequestError:
        raise InvalidRequestError(f"start {start!r} is not a start point: use 'new', 'first', a stream sequence "
                                  "or a time (ISO 8601 or datetime)", reason="invalid_start") from None
    return await first_seq_at_or_after(conn, stream, when)


async def _evaluate(match: Callable[[ConsumedMessage], Any], message: ConsumedMessage) -> Any:
    try:
        return await call_function(match, message)
    except Exception as exc:  # the user's function
        raise ApplyFunctionError(f"apply_function failed on message seq {message.seq} ({message.subject!r}) of stream "
                                 f"{message.stream!r}: {type(exc).__name__}: {exc}; fix the function (it must "
                                 "accept every message of the subject)") from exc


def _found(message: ConsumedMessage, result: Any, scanned: int) -> dict[str, Any]:
    payload = message.to_dict()
    if not isinstance(result, bool):
        try:
            json.dumps(result)
        except (TypeError, ValueError):
            result = repr(result)
        payload["result"] = result
    return {"message": payload, "next_seq": message.seq + 1, "scanned": scanned}


async def find_message(conn: JetStreamConnection, stream: str, match: Callable[[ConsumedMessage], Any], *,
                       subject: str | None = None, start_seq: int = 1, follow: bool = False,
                       poll: float = 5.0, batch: int = 256) -> dict[str, Any]:
    """The first message from ``start_seq`` for which ``match(message)`` is truthy.

    ``follow=False``: look only at what is stored now. ``follow=True``: keep waiting for new
    messages until one matches (cancel the task to stop). Returns ``{"message": dict | None,
    "next_seq": where to resume, "scanned": messages looked at}``; a non-bool return value of
    ``match`` is added to the message as ``result``.
    """
    validate_name(stream, what="stream name")
    if subject is not None:
        validate_subject(subject, allow_wildcards=True, what="subject")
    if isinstance(start_seq, bool) or not isinstance(start_seq, int) or start_seq < 1:
        raise InvalidRequestError(f"start_seq must be a stream sequence >= 1, got {start_seq!r}",
                                  reason="invalid_start")
    info = await stream_info(conn, stream)
    retention = info["config"].get("retention", "limits")
    if retention == "limits":
        return await _find_with_consumer(conn, stream, match, subject, start_seq, follow, poll, batch)
    if not info["config"].get("allow_direct"):
        raise InvalidRequestError(
            f"stream {stream!r} has {retention} retention: it is searched by direct get so that nothing is taken "
            "away; set allow_direct: true on the stream (JetStreamEnsureStreamOperator can change it in place)",
            reason="direct_get_disabled",
        )
    return await _find_with_direct_get(conn, stream, match, subject, start_seq, follow, poll, batch)


async def _find_with_consumer(conn: JetStreamConnection, stream: str, match: Callable[[ConsumedMessage], Any],
                              subject: str | None, start_seq: int, follow: bool, poll: float,
                              batch: int) -> dict[str, Any]:
    name = f"await-{uuid.uuid4().hex[:16]}"
    config: dict[str, Any] = {"name": name, "deliver_policy": "by_start_sequence", "opt_start_seq": start_seq,
                              "ack_policy": "none", "mem_storage": True, "num_replicas": 1,
                              "inactive_threshold": 60_000_000_000}
    if subject:
        config["filter_subject"] = subject
    created = await conn.api_request(f"CONSUMER.CREATE.{stream}.{name}", {"stream_name": stream, "config": config},
                                     context=f"search consumer on stream {stream!r}")
    next_seq, scanned = start_seq, 0
    if not follow and not int(created.get("num_pending") or 0):
        await _delete_quietly(conn, stream, name)
        return {"message": None, "next_seq": max(next_seq, _stream_next(created)), "scanned": 0}
    pull = PullSubscription(conn, stream, name, batch=batch, expires=poll)
    await pull.start()
    try:
        while True:
            delivered = await pull.next_messages(timeout=poll)
            for msg in delivered:
                message = ConsumedMessage.from_delivery(msg)
                scanned += 1
                next_seq = message.seq + 1
                result = await _evaluate(match, message)
                if result:
                    return _found(message, result, scanned)
                if not follow and msg.metadata.num_pending == 0:
                    return {"message": None, "next_seq": next_seq, "scanned": scanned}
            if not delivered and not follow:
                return {"message": None, "next_seq": next_seq, "scanned": scanned}
    finally:
        if not conn.nc.is_closed:
            await pull.close()
            await _delete_quietly(conn, stream, name)


def _stream_next(consumer_info: dict[str, Any]) -> int:
    """After an empty search: the consumer's next stream sequence (its delivered stream_seq + 1)."""
    return int((consumer_info.get("delivered") or {}).get("stream_seq") or 0) + 1


async def _delete_quietly(conn: JetStreamConnection, stream: str, name: str) -> None:
    with contextlib.suppress(JetStreamError):  # the server drops it after inactive_threshold anyway
        await conn.api_request(f"CONSUMER.DELETE.{stream}.{name}", context="delete search consumer")


async def _find_with_direct_get(conn: JetStreamConnection, stream: str, match: Callable[[ConsumedMessage], Any],
                                subject: str | None, start_seq: int, follow: bool, poll: float,
                                batch: int) -> dict[str, Any]:
    next_seq, scanned = start_seq, 0
    while True:
        last = int((await stream_info(conn, stream))["state"].get("last_seq") or 0)
        reader = read_range(conn, stream, next_seq, last, subjects=[subject] if subject else [], via="direct",
                            batch=batch)
        async with aclosing(reader):
            async for chunk in reader:
                for stored in chunk:
                    message = ConsumedMessage.from_stored(stream, stored)
                    scanned += 1
                    result = await _evaluate(match, message)
                    if result:
                        return _found(message, result, scanned)
        next_seq = max(next_seq, last + 1)
        if not follow:
            return {"message": None, "next_seq": next_seq, "scanned": scanned}
        await asyncio.sleep(poll)


__all__ = ["START_WORDS", "find_message", "resolve_start"]
