"""The wire of the batch publishers: PUB/HPUB frames, replies on one inbox, the server's answers as typed errors;
and safe re-sends: which msg ids a stream already holds, found without writing (probes); which failed sends of an
atomic batch are re-sent; whether a batch refused as a duplicate was committed earlier (read back and compared).

Whole runs of messages are encoded as NATS protocol frames and handed to the connection in one write: per-message
``nc.publish`` calls cost more Python time than the server needs to store a message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import nats.errors

from airflow_jetstream.client import metrics
from airflow_jetstream.client.admin.streams import stream_info, streams_for_subject
from airflow_jetstream.client.batches.types import (
    HEADER_BATCH_COMMIT,
    HEADER_BATCH_ID,
    HEADER_BATCH_SEQUENCE,
    HEADER_EXPECTED_LAST_MSG_ID,
    HEADER_EXPECTED_LAST_SEQ,
    HEADER_EXPECTED_LAST_SUBJECT_SEQ,
    HEADER_MSG_ID,
    HEADER_STATUS,
    BatchItemResult,
    BatchMessage,
    BatchResult,
    header_values,
)
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import (
    BatchPublishError,
    ConnectionFailedError,
    JetStreamError,
    LeaderUnavailableError,
    RequestTimeoutError,
    error_from_api,
)
from airflow_jetstream.client.natspy_internals import write_raw
from airflow_jetstream.client.reading.headers import header_values as stored_header_values
from airflow_jetstream.client.reading.messages import Message
from airflow_jetstream.client.reading.stored import get_message
from airflow_jetstream.client.retry import Deadline

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
    """One ``HPUB`` (or ``PUB`` when there are no headers) protocol frame; without a reply subject when ``reply`` is
    empty."""
    reply += b" " if reply else b""
    if not header_lines:
        return b"PUB %b %b%d\r\n%b\r\n" % (subject, reply, len(payload), payload)
    hdr_len = len(_HEADER_START) + len(header_lines) + 2
    return b"HPUB %b %b%d %d\r\nNATS/1.0\r\n%b\r\n%b\r\n" % (
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

    async def wait(self, reply: bytes, subject: str) -> dict[str, Any]:
        """The parsed answer to ``reply``; waits at most the batch timeout."""
        try:
            async with asyncio.timeout(self.timeout):
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


#: Probes (and read-backs) in flight at once.
PROBE_WINDOW = 256
#: A last sequence no stream reaches (2^53 - 1): the expectation of a msg-id probe on a replicated stream.
_UNREACHABLE_SEQ = 2**53 - 1
#: The refusals of a probe's expectation (wrong last msg id, wrong last sequence): the id is not stored.
_PROBE_REFUSED = frozenset({10070, 10071})
log = logging.getLogger(__name__)


async def stored_sequences(conn: JetStreamConnection, messages: Sequence[BatchMessage],
                           timeout: float | None = None, *, stream: str | None = None) -> list[int | None]:
    """For each message's msg id, the stream sequence that already holds it, or None. Writes nothing.

    Each probe is a publish carrying the msg id and an expectation that cannot be met, which the server checks
    only after its duplicate check (:func:`probe_expectation`): a stored id within the duplicate window is
    answered as a duplicate with its sequence, any other probe refused. Probes are sent like the Batcher's
    items (:func:`publish_acked`, :data:`PROBE_WINDOW` at a time), so an election is ridden out the same way (a
    probe stores nothing, and carries a msg id). Give ``stream`` when every message goes to it, else it is looked
    up once per subject.
    """
    timeout = timeout or conn.settings.request_timeout
    expectations: dict[str, dict[str, str]] = {}
    probes = []
    for msg in messages:
        if msg.msg_id:
            key = stream or msg.subject
            if key not in expectations:
                expectations[key] = await probe_expectation(conn, msg.subject, stream=stream)
            probes.append(BatchMessage(msg.subject, b"", expectations[key], msg.msg_id))
    seqs: list[int | None] = []
    for start in range(0, len(probes), PROBE_WINDOW):
        for result in await publish_acked(conn, probes[start:start + PROBE_WINDOW], timeout, what="msg id probes",
                                          metric=None):
            if result.err_code in _PROBE_REFUSED:  # the expectation, checked after the duplicate check
                seqs.append(None)
            elif not result.raise_for_error().duplicate or not result.seq:
                raise BatchPublishError("msg id probe: the server stored the probe; this server does not check "
                                        "msg ids before expectations", reason="probe_unsupported")
            else:
                seqs.append(result.seq)
    found = iter(seqs)
    return [next(found) if msg.msg_id else None for msg in messages]


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
        info = await stream_info(conn, streams[0])
        if int((info.get("config") or {}).get("num_replicas") or 1) > 1:
            return {HEADER_EXPECTED_LAST_SEQ: str(_UNREACHABLE_SEQ)}
    return {HEADER_EXPECTED_LAST_MSG_ID: f"probe-{uuid.uuid4().hex}"}


async def already_committed(conn: JetStreamConnection, messages: list[BatchMessage], batch_id: str,
                            timeout: float, error: BatchPublishError) -> BatchResult:
    """The earlier commit of this batch, when that is why the server refused it as a duplicate: every message
    with a msg id is stored at ``first_seq + its position`` for one ``first_seq`` (a batch is stored whole).

    ``msg_id_reused`` unless ``first_seq ..`` holds one committed batch (one ``Nats-Batch-Id``, sequences 1..n, the
    commit on the n-th) with these subjects, payloads, msg ids and headers, read back by message gets. Messages the
    stream already removed cannot be compared and are skipped; when none is left the msg ids alone vouch for the
    earlier commit (logged)."""

    def refused(why: str, reason: str = "duplicate_msg_id") -> BatchPublishError:
        return BatchPublishError(f"atomic batch {batch_id}: {why}", reason=reason, code=error.code,
                                 err_code=error.err_code, description=error.description)

    with_ids = [(index, msg) for index, msg in enumerate(messages) if msg.msg_id]
    if not with_ids:
        raise error
    streams = await streams_for_subject(conn, messages[0].subject)  # a batch goes to one stream
    stream = streams[0] if streams else ""
    seqs = await stored_sequences(conn, [msg for _, msg in with_ids], timeout, stream=stream or None)
    stored = [(msg.msg_id, seq) for (_, msg), seq in zip(with_ids, seqs, strict=True) if seq is not None]
    if len(stored) < len(with_ids):
        shown = ", ".join(f"{msg_id!r} (seq {seq})" for msg_id, seq in stored[:5])
        more = f" and {len(stored) - 5} more" if len(stored) > 5 else ""
        raise refused(f"{len(stored)} of {len(with_ids)} msg ids are already stored: {shown}{more}; the batch was "
                      "refused whole. Remove the stored messages from the batch or give them fresh msg ids")
    starts = {seq - index for (index, _), seq in zip(with_ids, seqs, strict=True) if seq is not None}
    if len(starts) != 1:
        raise refused("its msg ids are all stored, but not as one earlier commit of this batch (not one run of "
                      "sequences in this order), so they belong to other messages; the batch was refused whole. "
                      "Give its messages fresh msg ids")
    first_seq, count = starts.pop(), len(messages)
    semaphore = asyncio.Semaphore(PROBE_WINDOW)

    async def read(seq: int) -> Message | None:
        async with semaphore:
            return await get_message(conn, stream, seq=seq)

    found = await asyncio.gather(*(read(first_seq + i) for i in range(count))) if stream else [None] * count
    problem = None
    batch_ids = set()
    for index, (msg, raw) in enumerate(zip(messages, found, strict=True)):
        if raw is None:
            continue
        headers = raw.headers
        batch_ids.add(headers.get(HEADER_BATCH_ID))
        if headers.get(HEADER_BATCH_SEQUENCE) != str(index + 1):
            problem = f"seq {first_seq + index} is not message {index + 1} of one atomic batch"
        elif index == count - 1 and headers.get(HEADER_BATCH_COMMIT) != "1":
            problem = f"seq {first_seq + index} is not the last message of a batch of {count}"
        elif (differs := stored_difference(msg, raw.subject, raw.data, headers, index)) is not None:
            problem = f"seq {first_seq + index} {differs}"
        if problem:
            break
    if problem is None and len(batch_ids) > 1:
        problem = f"seqs {first_seq}..{first_seq + count - 1} belong to {len(batch_ids)} different batches"
    if problem:
        raise refused(f"its msg ids are already used by other messages in stream {stream!r} ({problem}), so the "
                      "server refused the batch as a duplicate and nothing of it was written. Msg ids must name "
                      "one batch's content for the stream's duplicate_window: give these messages fresh msg ids",
                      "msg_id_reused")
    if stream and not batch_ids:
        log.warning("atomic batch %s: its msg ids are stored at %s seq %d..%d, which the stream already removed; "
                    "taken as committed earlier without comparing contents", batch_id, stream, first_seq,
                    first_seq + count - 1)
    return BatchResult(stream=stream, batch=batch_id, count=count, first_seq=first_seq,
                       last_seq=first_seq + count - 1, already_committed=True)


def stored_difference(msg: BatchMessage, subject: str, data: bytes | None, headers: Mapping[str, str] | None,
                      index: int) -> str | None:
    """How a stored message (subject, payload, headers) differs from message ``index`` of a batch, ``msg``; None
    when it is that message: the same subject and payload, msg id, and every value of each of its headers."""
    headers = headers or {}
    if subject != msg.subject or bytes(data or b"") != bytes(msg.data):
        return f"holds another subject or payload than message {index}"
    if msg.msg_id is not None and headers.get(HEADER_MSG_ID) != msg.msg_id:
        return f"has msg id {headers.get(HEADER_MSG_ID)!r}, not {msg.msg_id!r}"
    stored = stored_header_values(headers)
    if any(stored.get(k) != header_values(v) for k, v in (msg.headers or {}).items()):
        return f"has other headers than message {index}"
    return None


async def publish_acked(conn: JetStreamConnection, messages: list[BatchMessage], timeout: float, *,
                        deadline: Deadline | None = None, replies: BatchReplies | None = None,
                        what: str = "batcher", metric: str | None = "batcher.retried") -> list[BatchItemResult]:
    """Pipelined acknowledged publishes (all frames in one write, then one result per message, in order); the items
    that failed because their stream was electing a leader are re-sent until ``deadline`` (default: ``leader_wait``
    from the first failure).

    Only where a re-send cannot store an item twice: a 503 / no responders on a stream that exists
    (no leader received the message, so nothing was stored), and on a cluster an unacknowledged item
    with a msg id (the server answers a re-send of a stored one as a duplicate, with its sequence),
    or one the server refused with 10158 because the same msg id was still being stored.
    Still failing at the deadline (for the Batcher ``leader_wait`` after the group's oldest item was submitted, so
    one group's retries never make the items queued behind it wait past their own): those items fail with
    ``leader_unavailable``. ``replies`` is an open reply inbox to reuse (one is opened and closed for this call
    without it); ``what`` names the items in the log, ``metric`` counts each re-sent one.
    """
    own_replies = replies is None
    inbox = replies or await BatchReplies(conn, timeout, "publish").open()
    results = [BatchItemResult()] * len(messages)
    known: dict[str, bool] = {}

    async def send(indexes: list[int]) -> None:
        reply_of = [inbox.expect() for _ in indexes]
        try:
            await write_raw(conn.nc, b"".join(
                encode_frame(messages[i].subject.encode(), reply, message_header_lines(messages[i]),
                             bytes(messages[i].data)) for i, reply in zip(indexes, reply_of, strict=True)))
            futures = [inbox.futures[reply] for reply in reply_of]
            await asyncio.wait(futures, timeout=timeout)
            for index, future in zip(indexes, futures, strict=True):
                subject = messages[index].subject
                try:
                    if not future.done():
                        await conn.raise_if_denied(subject)
                        raise RequestTimeoutError(f"publish to {subject!r}: no acknowledgement within {timeout}s; "
                                                  "the message may or may not be stored")
                    ack = inbox.parse(future.result(), subject)
                    if "seq" not in ack:
                        raise BatchPublishError(f"unexpected publish reply {json.dumps(ack)[:200]}",
                                                reason="bad_reply")
                    results[index] = BatchItemResult(stream=str(ack.get("stream", "")), seq=int(ack["seq"]),
                                                     duplicate=bool(ack.get("duplicate")))
                except JetStreamError as exc:
                    results[index] = BatchItemResult.failed(exc)
        finally:
            for reply in reply_of:
                inbox.forget(reply)

    async def retryable(index: int) -> bool:
        result, msg = results[index], messages[index]
        if result.error == "no_stream_for_subject":
            if msg.subject not in known:
                try:
                    known[msg.subject] = bool(await streams_for_subject(conn, msg.subject, deadline=deadline))
                except JetStreamError as exc:  # the stream lookup itself found no leader in time
                    results[index] = BatchItemResult.failed(exc)
                    return False
            return known[msg.subject]
        if result.error == "msg_id_in_process":  # 10158: the same msg id is being stored right now
            return bool(msg.msg_id) and not conn.nc.is_closed
        return (result.error in ("timeout", "leader_unavailable") and bool(msg.msg_id)
                and conn.clustered and not conn.nc.is_closed)

    try:
        await send(list(range(len(messages))))
        pending = [i for i in range(len(messages)) if results[i].error and await retryable(i)]
        if not pending:
            return results
        started = False

        async def attempt() -> None:
            nonlocal pending, started
            if started:
                await send(pending)
                pending = [i for i in pending if results[i].error and await retryable(i)]
            started = True
            if pending:
                if metric:
                    metrics.incr(metric, len(pending), tags={"reason": "leader_unavailable"})
                raise LeaderUnavailableError(
                    f"publish to {messages[pending[0]].subject!r}: its stream has no leader (503 or no "
                    "acknowledgement), nothing of the item was stored unless it carries a msg id")

        try:
            await conn.retry_leader(f"{what}: {len(pending)} of {len(messages)} items (first to "
                                    f"{messages[pending[0]].subject!r})", attempt, deadline=deadline, logger=log)
        except LeaderUnavailableError as exc:
            for index in pending:
                results[index] = BatchItemResult.failed(exc)
        return results
    finally:
        if own_replies:
            await inbox.close()
