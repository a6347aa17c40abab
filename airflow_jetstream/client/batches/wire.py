"""The wire of the batch publishers: PUB/HPUB frames, replies on one inbox, the server's answers as typed errors.

Whole runs of messages are encoded as NATS protocol frames and handed to the connection in one write: per-message
``nc.publish`` calls cost more Python time than the server needs to store a message.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import nats.errors

from airflow_jetstream.client.admin.streams import streams_for_subject
from airflow_jetstream.client.batches.types import (
    HEADER_EXPECTED_LAST_SUBJECT_SEQ,
    HEADER_MSG_ID,
    HEADER_STATUS,
    BatchMessage,
    header_values,
)
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import (
    BatchPublishError,
    ConnectionFailedError,
    RequestTimeoutError,
    error_from_api,
)

_HEADER_START = b"NATS/1.0\r\n"


def encode_header_lines(headers: Mapping[str, str | list[str]]) -> bytes:
    """``Key: Value\r\n`` lines for ``headers`` (already validated: no line breaks), one per value of a list."""
    return "".join(f"{k}: {v}\r\n" for k, values in headers.items() for v in header_values(values)).encode()


_MSG_ID_PREFIX = f"{HEADER_MSG_ID}: ".encode()
_EXPECTED_SUBJECT_SEQ_PREFIX = f"{HEADER_EXPECTED_LAST_SUBJECT_SEQ}: ".encode()


def message_header_lines(msg: BatchMessage) -> bytes:
    """The user-level header lines of ``msg``: its own headers, then its msg id and per-subject expectation."""
    lines = encode_header_lines(msg.headers) if msg.headers else b""
    if msg.msg_id is not None:
        lines += b"%b%b\r\n" % (_MSG_ID_PREFIX, msg.msg_id.encode())
    if msg.expected_last_subject_seq is not None:
        lines += b"%b%d\r\n" % (_EXPECTED_SUBJECT_SEQ_PREFIX, msg.expected_last_subject_seq)
    return lines


def encode_frame(subject: bytes, reply: bytes, header_lines: bytes, payload: bytes) -> bytes:
    """One ``HPUB`` (or ``PUB`` when there are no headers) protocol frame with a reply subject."""
    if not header_lines:
        return b"PUB %b %b %d\r\n%b\r\n" % (subject, reply, len(payload), payload)
    hdr_len = len(_HEADER_START) + len(header_lines) + 2
    return b"HPUB %b %b %d %d\r\nNATS/1.0\r\n%b\r\n%b\r\n" % (
        subject, reply, hdr_len, hdr_len + len(payload), header_lines, payload)


#: What nats-py raises for a write on a closed, draining or overfull connection.
CONNECTION_ERRORS = (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError,
                     nats.errors.OutboundBufferLimitError)


def connection_lost(context: str, exc: BaseException, then: str = "") -> ConnectionFailedError:
    """``connection_lost``: nats-py refused a write (``exc``, one of :data:`CONNECTION_ERRORS`); ``then`` says what
    that means for what was sent."""
    return ConnectionFailedError(f"{context}: the connection is closed ({type(exc).__name__})"
                                 + (f"; {then}" if then else ""), reason="connection_lost")


def parse_reply(data: bytes, context: str) -> dict[str, Any]:
    """An empty reply is an intermediate ack ({}); otherwise JSON, raising typed errors."""
    if not data:
        return {}
    try:
        reply = json.loads(data)
    except ValueError:
        raise BatchPublishError(f"{context}: the server answered non-JSON data", reason="bad_reply") from None
    if not isinstance(reply, dict):
        raise BatchPublishError(f"{context}: unexpected reply from the server", reason="bad_reply")
    if "error" in reply:
        raise error_from_api(reply["error"], context=context)
    return reply


def no_stream_error(context: str, subject: str) -> BatchPublishError:
    """A no-responders answer: no stream captures ``subject`` (or, on a cluster, its stream has no leader)."""
    return BatchPublishError(
        f"{context + ': ' if context else ''}no stream captures subject {subject!r}; create the stream or fix the "
        "subject", reason="no_stream_for_subject",
    )


async def capturing_stream(conn: JetStreamConnection, subject: str, context: str) -> str:
    """The stream that captures ``subject``, or ``no_stream_for_subject`` before anything is sent."""
    owners = await streams_for_subject(conn, subject)
    if not owners:
        raise no_stream_error(context, subject)
    return owners[0]


def reply_timeout(conn: JetStreamConnection, timeout: float | str | timedelta | None) -> float:
    """Seconds to wait for each reply: ``timeout`` (seconds, "30s", timedelta) or the connection's request timeout."""
    return to_seconds(timeout, field="timeout") if timeout else conn.settings.request_timeout


class BatchReplies:
    """Replies to the requests inside one batch (first message, flow control, commit) on a private inbox."""

    def __init__(self, conn: JetStreamConnection, timeout: float, context: str) -> None:
        self.conn = conn
        self.timeout = timeout
        self.context = context
        self.inbox = conn.nc.new_inbox()
        self.futures: dict[bytes, asyncio.Future[Any]] = {}
        self.sub: Any = None
        self.asked = 0

    async def open(self) -> BatchReplies:
        try:
            self.sub = await self.conn.nc.subscribe(f"{self.inbox}.*", cb=self._on_reply)
        except CONNECTION_ERRORS as exc:
            raise connection_lost(self.context, exc, "nothing was sent") from None
        return self

    async def _on_reply(self, msg: Any) -> None:
        future = self.futures.get(msg.subject.encode())
        if future is not None and not future.done():
            future.set_result(msg)

    def expect(self) -> bytes:
        """Register interest in one more answer; returns its reply subject."""
        self.asked += 1
        reply = f"{self.inbox}.{self.asked}".encode()
        self.futures[reply] = asyncio.get_running_loop().create_future()
        return reply

    def forget(self, reply: bytes) -> None:
        """Stop waiting for ``reply`` (a late answer is then dropped); for inboxes used for many groups."""
        future = self.futures.pop(reply, None)
        if future is not None and not future.done():
            future.cancel()

    async def wait(self, reply: bytes, subject: str, timeout: float | None = None) -> dict[str, Any]:
        """The parsed answer to ``reply``; waits at most ``timeout`` (default: the batch timeout)."""
        try:
            async with asyncio.timeout(self.timeout if timeout is None else timeout):
                msg = await self.futures[reply]
        except TimeoutError:
            await self.conn.raise_if_denied(subject)
            raise RequestTimeoutError(f"{self.context}: no reply within {self.timeout}s; if this was the "
                                      "commit its outcome is unknown: retry with msg ids set") from None
        finally:
            self.futures.pop(reply, None)
        return self.parse(msg, subject)

    def parse(self, msg: Any, subject: str) -> dict[str, Any]:
        """The JSON of a reply message (``{}`` for an empty one), raising typed errors."""
        if msg.headers and msg.headers.get(HEADER_STATUS) == "503":
            raise no_stream_error(self.context, subject)
        return parse_reply(msg.data, self.context)

    async def close(self) -> None:
        for future in self.futures.values():
            future.cancel()
        if self.sub is not None and not self.conn.nc.is_closed:
            await self.sub.unsubscribe()
