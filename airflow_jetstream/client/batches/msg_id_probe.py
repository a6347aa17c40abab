"""Which msg ids a stream already holds, found without writing anything (probes), for safe re-sends."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

from airflow_jetstream.client.admin.subject_streams import streams_for_subject
from airflow_jetstream.client.batches.replies import request
from airflow_jetstream.client.batches.types import (
    HEADER_EXPECTED_LAST_MSG_ID,
    HEADER_EXPECTED_LAST_SEQ,
    HEADER_MSG_ID,
    BatchMessage,
)
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import (
    BatchPublishError,
    JetStreamError,
    LeaderUnavailableError,
    RequestTimeoutError,
)

#: Probes (and read-backs) in flight at once.
PROBE_WINDOW = 256
#: A last sequence no stream reaches (2^53 - 1): the expectation of a msg-id probe on a replicated stream.
_UNREACHABLE_SEQ = 2**53 - 1
#: The refusals of a probe's expectation (wrong last msg id, wrong last sequence): the id is not stored.
_PROBE_REFUSED = frozenset({10070, 10071})


async def stored_sequences(conn: JetStreamConnection, messages: Sequence[BatchMessage],
                           timeout: float | None = None, *, stream: str | None = None) -> list[int | None]:
    """For each message's msg id, the stream sequence that already holds it, or None. Writes nothing.

    Each probe is a publish carrying the msg id and an expectation that cannot be met, one the
    server checks only after its duplicate check: it answers a duplicate ack (with the stored
    sequence) when the id is within the stream's duplicate window, and otherwise refuses the probe,
    storing nothing. Which expectation depends on the stream (see :func:`probe_expectation`): give
    ``stream`` when every message goes to it, else it is looked up once per subject.
    """
    timeout = timeout or conn.settings.request_timeout
    semaphore = asyncio.Semaphore(PROBE_WINDOW)
    expectations: dict[str, asyncio.Task[dict[str, str]]] = {}

    def expectation(subject: str) -> asyncio.Task[dict[str, str]]:
        """One lookup per stream (or per subject when the stream is not given), shared by its probes."""
        key = stream or subject
        if key not in expectations:
            expectations[key] = asyncio.ensure_future(probe_expectation(conn, subject, stream=stream))
        return expectations[key]

    async def ask(msg: BatchMessage, headers: dict[str, str]) -> dict[str, Any]:
        """One probe; an election (a 503 on a stream that exists, or no reply on a cluster) is
        :class:`LeaderUnavailableError`, which ``retry_leader`` retries (a probe stores nothing)."""
        context = f"msg id probe {msg.msg_id!r}"
        try:
            return await request(conn, msg.subject, b"", headers, timeout, context)
        except BatchPublishError as exc:
            if exc.reason == "no_stream_for_subject" and await streams_for_subject(conn, msg.subject):
                raise LeaderUnavailableError(f"{context}: the stream capturing {msg.subject!r} has no "
                                             "leader (503)") from None
            if exc.reason == "msg_id_in_process":  # 10158: not yet known whether it is stored; ask again
                raise LeaderUnavailableError(exc.message, reason="msg_id_in_process") from None
            raise
        except RequestTimeoutError as exc:
            if conn.nc.is_closed:
                raise
            raise conn.unanswered(exc.message) from None

    async def probe(msg: BatchMessage) -> int | None:
        if not msg.msg_id:
            return None
        async with semaphore:
            headers = {HEADER_MSG_ID: msg.msg_id, **await expectation(msg.subject)}
            try:
                reply = await conn.retry_leader(f"msg id probe {msg.msg_id!r} on {msg.subject!r}",
                                                lambda: ask(msg, headers))
            except JetStreamError as exc:
                if exc.err_code in _PROBE_REFUSED:  # the expectation, checked after the duplicate check
                    return None
                raise
        if reply.get("duplicate") and int(reply.get("seq") or 0) > 0:
            return int(reply["seq"])
        raise BatchPublishError(f"msg id probe {msg.msg_id!r}: the server stored the probe; this server does "
                                "not check msg ids before expectations", reason="probe_unsupported")

    try:
        return list(await asyncio.gather(*(probe(m) for m in messages)))
    finally:
        for lookup in expectations.values():
            lookup.cancel()


async def probe_expectation(conn: JetStreamConnection, subject: str, *, stream: str | None = None) -> dict[str, str]:
    """The header that makes a msg-id probe on ``subject`` (in ``stream``, looked up when not given) fail
    after the server's duplicate check.

    A stream without replicas checks expectations in message order after the duplicate check, so a
    ``Nats-Expected-Last-Msg-Id`` no message has is refused there. A replicated stream checks that
    header only when it applies the message, and on nats-server 2.14/2.15 a mismatch there stops the
    stream from storing anything; it checks ``Nats-Expected-Last-Sequence`` before proposing, after
    the duplicate check, so an unreachable sequence is the probe there.
    """
    streams = [stream] if stream else await streams_for_subject(conn, subject)
    if streams:
        info = await conn.api_request(f"STREAM.INFO.{streams[0]}", context=f"stream {streams[0]!r}")
        if int((info.get("config") or {}).get("num_replicas") or 1) > 1:
            return {HEADER_EXPECTED_LAST_SEQ: str(_UNREACHABLE_SEQ)}
    return {HEADER_EXPECTED_LAST_MSG_ID: f"probe-{uuid.uuid4().hex}"}
