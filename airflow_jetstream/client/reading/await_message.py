"""Find the first message of a stream (or subject) that satisfies a function, from a start point.

Used by the message sensor (scan what is stored now, resume later from ``next_seq``) and its trigger
(keep waiting for new messages)::

    start = await resolve_start(conn, "ORDERS", "new")           # or a sequence, or a time
    found = await find_message(conn, "ORDERS", is_order_42, subject="orders.>", start_seq=start)
    found["message"]   # None, or the matching message as a dict (subject, seq, headers, data, ...)

No consumer is created: what is stored is read by direct get (or message get without ``allow_direct``), so
WorkQueue and Interest streams keep their messages; new messages come through the connection's one subscription
to the stream (:mod:`~airflow_jetstream.client.reading.shared_tail`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import aclosing
from datetime import datetime
from typing import Any

from airflow_jetstream.client.admin.streams import first_seq_at_or_after, stream_info
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import ApplyFunctionError, InvalidRequestError
from airflow_jetstream.client.reading.apply_function import call_function, with_result
from airflow_jetstream.client.reading.messages import Message
from airflow_jetstream.client.reading.shared_tail import follow as tail
from airflow_jetstream.client.reading.stored import BATCH, messages_of, read_range
from airflow_jetstream.client.subjects import validate_name, validate_subject
from airflow_jetstream.client.times import parse_time

START_WORDS = ("new", "first")


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


async def find_message(conn: JetStreamConnection, stream: str, match: Callable[[Message], Any], *,
                       subject: str | None = None, start_seq: int = 1, follow: bool = False) -> dict[str, Any]:
    """The first message from ``start_seq`` for which ``match(message)`` is truthy: among what is stored now, or
    with ``follow`` also among new messages until one matches (cancel the task to stop). Returns ``{"message":
    dict | None, "next_seq": where to resume, "scanned": messages looked at}``; a non-bool return value of
    ``match`` is added to the message as ``result``."""
    validate_name(stream, what="stream name")
    if subject is not None:
        validate_subject(subject, allow_wildcards=True, what="subject")
    if isinstance(start_seq, bool) or not isinstance(start_seq, int) or start_seq < 1:
        raise InvalidRequestError(f"start_seq must be a stream sequence >= 1, got {start_seq!r}",
                                  reason="invalid_start")
    state = {"next_seq": start_seq, "scanned": 0}

    async def look(messages: list[Message]) -> dict[str, Any] | None:
        for message in messages:
            if message.seq < state["next_seq"]:
                continue  # read before (the stored part and the followed part meet at one sequence)
            state["scanned"] += 1
            state["next_seq"] = message.seq + 1
            try:
                result = await call_function(match, message)
            except Exception as exc:  # the user's function
                raise ApplyFunctionError(
                    f"apply_function failed on message seq {message.seq} ({message.subject!r}) of stream {stream!r}: "
                    f"{type(exc).__name__}: {exc}; fix the function (it must accept every message of the subject)"
                ) from exc
            if result:
                return {"message": with_result(message.to_dict(), result), **state}
        return None

    async def look_through(last: int, info: dict[str, Any]) -> dict[str, Any] | None:
        """What is stored from ``next_seq`` up to ``last``, read without a consumer."""
        pages = read_range(conn, stream, state["next_seq"], last, subjects=(subject or ">",), via=None, batch=BATCH,
                           info=info)
        async with aclosing(pages):
            async for page in pages:
                if (found := await look(messages_of(stream, page))) is not None:
                    return found
        return None

    if not follow:
        info = await stream_info(conn, stream)
        last = int(info["state"].get("last_seq") or 0)
        found = await look_through(last, info)
        return found or {"message": None, "next_seq": max(state["next_seq"], last + 1), "scanned": state["scanned"]}
    async with tail(conn, stream, subject or ">") as listener:
        async with listener.catching_up():
            found = await look_through(listener.since, await listener.tail.info())
        state["next_seq"] = max(state["next_seq"], listener.since + 1)
        while found is None:
            found = await look(await listener.next_batch())
        return found


__all__ = ["START_WORDS", "find_message", "resolve_start"]
