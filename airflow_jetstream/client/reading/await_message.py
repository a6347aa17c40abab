"""Find the first message of a stream (or subject) that satisfies a function, from a start point.

Used by the message sensor (scan what is stored now, resume later from ``next_seq``) and its trigger
(keep waiting for new messages)::

    start = await resolve_start(conn, "ORDERS", "new")           # or a sequence, or a time
    found = await find_message(conn, "ORDERS", is_order_42, subject="orders.>", start_seq=start)
    found["message"]   # None, or the matching message as a dict (subject, seq, headers, data, ...)

Nothing on the server changes and no consumer is created: what is stored is read by direct get (or message get
on a stream without ``allow_direct``), so WorkQueue and Interest streams keep their messages. Waiting for new
messages (``follow=True``) shares the one subscription the connection holds for the stream
(:mod:`~airflow_jetstream.client.reading.shared_tail`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import aclosing
from datetime import datetime
from typing import Any

from airflow_jetstream.client.admin.streams import first_seq_at_or_after, stream_info
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import ApplyFunctionError, InvalidRequestError
from airflow_jetstream.client.reading.apply_function import call_function, with_result
from airflow_jetstream.client.reading.messages import Message
from airflow_jetstream.client.reading.shared_tail import follow
from airflow_jetstream.client.reading.stored import BATCH, messages_of, read_range
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


async def _evaluate(match: Callable[[Message], Any], message: Message) -> Any:
    try:
        return await call_function(match, message)
    except Exception as exc:  # the user's function
        raise ApplyFunctionError(f"apply_function failed on message seq {message.seq} ({message.subject!r}) of stream "
                                 f"{message.stream!r}: {type(exc).__name__}: {exc}; fix the function (it must "
                                 "accept every message of the subject)") from exc


def _found(message: Message, result: Any, scanned: int) -> dict[str, Any]:
    return {"message": with_result(message.to_dict(), result), "next_seq": message.seq + 1, "scanned": scanned}


class _Search:
    """The messages looked at so far, and the first that satisfies ``match``."""

    def __init__(self, match: Callable[[Message], Any], start_seq: int) -> None:
        self.match = match
        self.next_seq = start_seq
        self.scanned = 0

    async def look(self, stored: list[Message]) -> dict[str, Any] | None:
        for each in stored:
            if each.seq < self.next_seq:
                continue  # read before (the stored part and the followed part meet at one sequence)
            message = each
            self.scanned += 1
            self.next_seq = message.seq + 1
            result = await _evaluate(self.match, message)
            if result:
                return _found(message, result, self.scanned)
        return None

    async def look_through(self, conn: JetStreamConnection, stream: str, subject: str | None, last: int,
                           info: dict[str, Any]) -> dict[str, Any] | None:
        """Look at what is stored from ``next_seq`` up to ``last``, without a consumer."""
        pages = read_range(conn, stream, self.next_seq, last, subjects=(subject or ">",), via=None, batch=BATCH,
                           info=info)
        async with aclosing(pages):
            async for page in pages:
                found = await self.look(messages_of(stream, page))
                if found is not None:
                    return found
        return None


async def find_message(conn: JetStreamConnection, stream: str, match: Callable[[Message], Any], *,
                       subject: str | None = None, start_seq: int = 1, follow: bool = False) -> dict[str, Any]:
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
    search = _Search(match, start_seq)
    if not follow:
        info = await stream_info(conn, stream)
        last = int(info["state"].get("last_seq") or 0)
        found = await search.look_through(conn, stream, subject, last, info)
        return found or {"message": None, "next_seq": max(search.next_seq, last + 1), "scanned": search.scanned}
    return await _follow(conn, stream, subject, search)


async def _follow(conn: JetStreamConnection, stream: str, subject: str | None, search: _Search) -> dict[str, Any]:
    async with follow(conn, stream, subject or ">") as listener:
        async with listener.catching_up():
            found = await search.look_through(conn, stream, subject, listener.since, await listener.tail.info())
        search.next_seq = max(search.next_seq, listener.since + 1)
        while found is None:
            found = await search.look(await listener.next_batch())
        return found


__all__ = ["START_WORDS", "find_message", "resolve_start"]
