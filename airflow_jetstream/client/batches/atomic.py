"""Atomic batch publish (nats-server 2.12+): every message of the batch is stored, or none is.

nats-py has no batch API, so the protocol is driven here with core publishes and requests:
the first message is a request (the server answers an empty "batch started" message), the
intermediate messages are plain publishes with no reply, every ``flow_every``-th one is a request
whose (empty) answer bounds how far the client runs ahead, and the last message carries
``Nats-Batch-Commit: 1`` and gets the PubAck. Nothing is visible in the stream before the commit.

Retry-safety: when the server refuses a batch with ``duplicate_msg_id``, the msg ids it carries are
probed without writing (see :func:`stored_sequences`); if every one is stored, at the positions one
earlier commit of this batch gives them, the batch is reported as ``already_committed`` instead of
failing or being written twice. Because a batch is stored whole and in one run of sequences, one msg
id per batch (on its first message, naming the batch) is enough, and keeps the stream's duplicate
window at one entry per batch instead of one per message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

import nats.errors
import nats.js.errors

from airflow_jetstream.client import metrics, server_features
from airflow_jetstream.client.batches.frames import message_header_lines, write_frames
from airflow_jetstream.client.batches.types import (
    DEFAULT_MAX_BATCH_MSGS,
    HEADER_BATCH_COMMIT,
    HEADER_BATCH_ID,
    HEADER_BATCH_SEQUENCE,
    HEADER_EXPECTED_LAST_MSG_ID,
    HEADER_EXPECTED_LAST_SEQ,
    HEADER_EXPECTED_LAST_SUBJECT_SEQ,
    HEADER_MSG_ID,
    HEADER_STATUS,
    MAX_BATCH_ID_LENGTH,
    BatchMessage,
    BatchResult,
    new_batch_id,
    validate_batch_id,
    validate_messages,
)
from airflow_jetstream.client.connection import QUORUM_ADVICE, JetStreamConnection
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import (
    BatchPublishError,
    ConnectionFailedError,
    InvalidRequestError,
    JetStreamError,
    JetStreamNotEnabledError,
    LeaderUnavailableError,
    RequestTimeoutError,
    error_from_api,
)
from airflow_jetstream.client.retry import Deadline, is_leader_unavailable, retry

#: Headers an atomic batch must not carry, with what to use instead.
ATOMIC_REFUSED_HEADERS = {
    HEADER_EXPECTED_LAST_MSG_ID.lower(): "atomic batches refuse it (server err 10177); use expected_last_seq",
    HEADER_EXPECTED_LAST_SEQ.lower(): "pass expected_last_seq to the batch publish instead",
    HEADER_EXPECTED_LAST_SUBJECT_SEQ.lower(): "set BatchMessage.expected_last_subject_seq instead",
    HEADER_MSG_ID.lower(): "set BatchMessage.msg_id instead",
    HEADER_BATCH_ID.lower(): "batch headers are set by the publisher",
    HEADER_BATCH_SEQUENCE.lower(): "batch headers are set by the publisher",
    HEADER_BATCH_COMMIT.lower(): "batch headers are set by the publisher",
}
# Batch id, sequence (up to 7 digits) and commit headers added to each message.
_BATCH_HEADER_BYTES = (
    len(HEADER_BATCH_ID) + MAX_BATCH_ID_LENGTH + len(HEADER_BATCH_SEQUENCE) + 7 + len(HEADER_BATCH_COMMIT) + 1
    + len(HEADER_EXPECTED_LAST_SEQ) + 20 + 4 * 4 + 12
)
DEFAULT_FLOW_EVERY = 200
DEFAULT_RETRIES = 5
_PROBE_WINDOW = 256
#: A last sequence no stream reaches (2^53 - 1): the expectation of a msg-id probe on a replicated stream.
_UNREACHABLE_SEQ = 2**53 - 1
#: The refusals of a probe's expectation (wrong last msg id, wrong last sequence): the id is not stored.
_PROBE_REFUSED = frozenset({10070, 10071})
log = logging.getLogger(__name__)


def encode_atomic_batch(messages: Sequence[BatchMessage], batch_id: str, expected_last_seq: int | None,
                        replies: dict[int, bytes]) -> list[bytes]:
    """The protocol frames of the batch; ``replies`` maps batch sequences to their reply subject.

    Every frame is an ``HPUB`` whose header block is ``NATS/1.0``, the message's own header lines,
    the batch id and sequence (plus the expectation on the first and the commit on the last
    message). The constant parts are encoded once per batch and each subject once per batch.
    """
    batch_lines = b"%b: %b\r\n%b: " % (HEADER_BATCH_ID.encode(), batch_id.encode(), HEADER_BATCH_SEQUENCE.encode())
    first_extra = b"" if expected_last_seq is None else b"%b: %d\r\n" % (HEADER_EXPECTED_LAST_SEQ.encode(),
                                                                         expected_last_seq)
    commit_extra = b"%b: 1\r\n" % HEADER_BATCH_COMMIT.encode()
    subjects: dict[str, bytes] = {}
    frames = []
    last = len(messages)
    for seq, msg in enumerate(messages, start=1):
        prefix = subjects.get(msg.subject)
        if prefix is None:
            prefix = subjects[msg.subject] = b"HPUB %b " % msg.subject.encode()
        user_lines = message_header_lines(msg)
        extra = (first_extra if seq == 1 else b"") + (commit_extra if seq == last else b"")
        header = b"NATS/1.0\r\n%b%b%d\r\n%b\r\n" % (user_lines, batch_lines, seq, extra)
        payload = msg.data
        reply = replies.get(seq)
        size = len(header)
        if reply is None:
            frames.append(b"%b%d %d\r\n%b%b\r\n" % (prefix, size, size + len(payload), header, payload))
        else:
            frames.append(b"%b%b %d %d\r\n%b%b\r\n" % (prefix, reply, size, size + len(payload), header, payload))
    return frames


def _parse_reply(data: bytes, context: str) -> dict[str, Any]:
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


async def _request(conn: JetStreamConnection, subject: str, payload: bytes, headers: dict[str, str],
                   timeout: float, context: str) -> dict[str, Any]:
    try:
        msg = await conn.nc.request(subject, payload, timeout=timeout, headers=headers)
    except nats.errors.NoRespondersError:
        raise _no_stream(context, subject) from None
    except nats.errors.TimeoutError:
        await conn.raise_if_denied(subject)
        raise RequestTimeoutError(f"{context}: no reply within {timeout}s") from None
    except _CONNECTION_ERRORS as exc:
        raise ConnectionFailedError(f"{context}: the connection was lost ({type(exc).__name__})",
                                    reason="connection_lost") from None
    return _parse_reply(msg.data, context)


def _no_stream(context: str, subject: str) -> BatchPublishError:
    return BatchPublishError(
        f"{context}: no stream captures subject {subject!r}; create the stream or fix the subject",
        reason="no_stream_for_subject",
    )


_CONNECTION_ERRORS = (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError,
                      nats.errors.OutboundBufferLimitError)


class BatchReplies:
    """Replies to the requests inside one batch (first message, flow control, commit) on a private inbox."""

    def __init__(self, conn: JetStreamConnection, timeout: float, context: str) -> None:
        self.conn = conn
        self.timeout = timeout
        self.context = context
        self.inbox = conn.nc.new_inbox()
        self.futures: dict[bytes, asyncio.Future[Any]] = {}
        self.sub: Any = None

    async def open(self) -> BatchReplies:
        try:
            self.sub = await self.conn.nc.subscribe(f"{self.inbox}.*", cb=self._on_reply)
        except _CONNECTION_ERRORS as exc:
            raise ConnectionFailedError(f"{self.context}: the connection is closed ({type(exc).__name__}); "
                                        "nothing was sent", reason="connection_lost") from None
        return self

    async def _on_reply(self, msg: Any) -> None:
        future = self.futures.get(msg.subject.encode())
        if future is not None and not future.done():
            future.set_result(msg)

    def expect(self, seq: int) -> bytes:
        """Register interest in the answer to batch message ``seq``; returns its reply subject."""
        reply = f"{self.inbox}.{seq}".encode()
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
            raise _no_stream(self.context, subject)
        return _parse_reply(msg.data, self.context)

    async def close(self) -> None:
        for future in self.futures.values():
            future.cancel()
        if self.sub is not None and not self.conn.nc.is_closed:
            await self.sub.unsubscribe()


async def _send_batch(conn: JetStreamConnection, items: list[BatchMessage], batch_id: str,
                      expected_last_seq: int | None, flow_every: int, timeout: float,
                      progress: dict[str, bool] | None = None) -> dict[str, Any]:
    """Send the batch, return the commit's PubAck; ``progress["commit_written"]`` turns True once the
    commit frame was handed to the connection (before that, a failure cannot have stored the batch)."""
    progress = {} if progress is None else progress
    context = f"atomic batch {batch_id}"
    replies = BatchReplies(conn, timeout, context)
    last = len(items)
    # Requests: the first message, every flow_every-th one, and the commit.
    asks = [1] + ([s for s in range(1 + flow_every, last, flow_every)] if flow_every else []) + [last]
    asks = sorted(set(asks))
    reply_of = {seq: replies.expect(seq) for seq in asks}
    frames = encode_atomic_batch(items, batch_id, expected_last_seq, reply_of)
    nc = conn.nc
    try:
        await replies.open()
        # The answer to a request is awaited only after the next segment is written, so the client
        # stays one segment ahead of the server. If the first message is refused (stream not atomic,
        # too many batches in flight), the server never opens the batch and drops what follows; that
        # refusal is the first answer awaited, so it is the one raised.
        await write_frames(nc, frames[0])
        progress["commit_written"] = last == 1
        outstanding = 1
        sent = 1
        for seq in asks[1:]:
            await write_frames(nc, b"".join(frames[sent:seq]))
            sent = seq
            progress["commit_written"] = seq == last
            await replies.wait(reply_of[outstanding], items[outstanding - 1].subject)
            outstanding = seq
        return await replies.wait(reply_of[outstanding], items[outstanding - 1].subject)
    except _CONNECTION_ERRORS as exc:
        raise ConnectionFailedError(f"{context}: the connection was lost mid-batch ({type(exc).__name__}); the "
                                    "server abandons an uncommitted batch, so re-send it (with msg ids a re-send "
                                    "is safe even if the commit got through)", reason="connection_lost") from None
    finally:
        await replies.close()


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
    semaphore = asyncio.Semaphore(_PROBE_WINDOW)
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
            return await _request(conn, msg.subject, b"", headers, timeout, context)
        except BatchPublishError as exc:
            if exc.reason == "no_stream_for_subject" and await streams_for_subject(conn, msg.subject):
                raise LeaderUnavailableError(f"{context}: the stream capturing {msg.subject!r} has no "
                                             "leader (503)") from None
            if exc.reason == "msg_id_in_process":  # 10158: not yet known whether it is stored; ask again
                raise LeaderUnavailableError(exc.message, reason="msg_id_in_process") from None
            raise
        except LeaderUnavailableError:
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


async def _already_committed(conn: JetStreamConnection, messages: list[BatchMessage], batch_id: str,
                             timeout: float, error: BatchPublishError) -> BatchResult:
    """The earlier commit of this batch, when that is why the server refused it as a duplicate.

    An atomic batch is stored whole, in one run of sequences, so it is already committed when every
    message that carries a msg id is stored at ``first_seq + its position`` for one ``first_seq``.
    """
    with_ids = [(index, msg) for index, msg in enumerate(messages) if msg.msg_id]
    if not with_ids:
        raise error
    streams = await streams_for_subject(conn, messages[0].subject)  # a batch goes to one stream
    seqs = await stored_sequences(conn, [msg for _, msg in with_ids], timeout, stream=streams[0] if streams else None)
    missing = [index for (index, _), seq in zip(with_ids, seqs, strict=True) if seq is None]
    if missing:
        stored = [(msg.msg_id, seq) for (_, msg), seq in zip(with_ids, seqs, strict=True) if seq is not None]
        shown = ", ".join(f"{msg_id!r} (seq {seq})" for msg_id, seq in stored[:5])
        more = f" and {len(stored) - 5} more" if len(stored) > 5 else ""
        raise BatchPublishError(
            f"atomic batch {batch_id}: {len(stored)} of {len(with_ids)} msg ids are already stored: "
            f"{shown}{more}; the batch was refused whole. Remove the stored messages from the batch or give "
            "them fresh msg ids",
            reason="duplicate_msg_id", code=error.code, err_code=error.err_code, description=error.description,
        )
    starts = {seq - index for (index, _), seq in zip(with_ids, seqs, strict=True) if seq is not None}
    if len(starts) != 1:
        raise BatchPublishError(
            f"atomic batch {batch_id}: its msg ids are all stored, but not as one earlier commit of this batch "
            "(not one run of sequences in this order), so they belong to other messages; the batch was refused "
            "whole. Give its messages fresh msg ids",
            reason="duplicate_msg_id", code=error.code, err_code=error.err_code, description=error.description,
        )
    first_seq = starts.pop()
    streams = await streams_for_subject(conn, messages[0].subject)
    stream = streams[0] if streams else ""
    if stream:
        await _check_stored_batch(conn, stream, messages, first_seq, batch_id, timeout, error)
    return BatchResult(stream=stream, batch=batch_id, count=len(messages),
                       first_seq=first_seq, last_seq=first_seq + len(messages) - 1, already_committed=True)


async def _check_stored_batch(conn: JetStreamConnection, stream: str, messages: list[BatchMessage],
                              first_seq: int, batch_id: str, timeout: float, error: BatchPublishError) -> None:
    """Raise ``msg_id_reused`` unless ``first_seq ..`` holds one committed batch with these messages.

    The stored messages are read back (``get_msg``, nothing is written) and must form one whole batch
    (one ``Nats-Batch-Id``, ``Nats-Batch-Sequence`` 1..n, ``Nats-Batch-Commit`` on the n-th) whose
    subjects, payloads, msg ids and headers are this batch's. Messages the stream already removed
    (work-queue or interest retention, limits) cannot be compared and are skipped; when none is left
    the msg ids alone vouch for the earlier commit (logged).
    """
    semaphore = asyncio.Semaphore(_PROBE_WINDOW)

    async def read(seq: int) -> Any:
        try:
            return await conn.js.get_msg(stream, seq)
        except nats.js.errors.NotFoundError:
            return None
        except nats.errors.TimeoutError:  # on a cluster: an election, retried by retry_leader
            raise conn.unanswered(f"atomic batch {batch_id}: reading back stream {stream!r} seq {seq} "
                                  f"timed out after {timeout}s") from None

    async def stored(seq: int) -> Any:
        async with semaphore:
            return await conn.retry_leader(f"atomic batch {batch_id}: read-back of seq {seq}", lambda: read(seq))

    found = await asyncio.gather(*(stored(first_seq + i) for i in range(len(messages))))
    count = len(messages)
    problem = None
    stored_ids = set()
    for index, (msg, raw) in enumerate(zip(messages, found, strict=True)):
        if raw is None:
            continue
        headers = raw.headers or {}
        stored_ids.add(headers.get(HEADER_BATCH_ID))
        if headers.get(HEADER_BATCH_SEQUENCE) != str(index + 1):
            problem = f"seq {first_seq + index} is not message {index + 1} of one atomic batch"
        elif index == count - 1 and headers.get(HEADER_BATCH_COMMIT) != "1":
            problem = f"seq {first_seq + index} is not the last message of a batch of {count}"
        elif raw.subject != msg.subject or bytes(raw.data or b"") != bytes(msg.data):
            problem = f"seq {first_seq + index} holds another subject or payload than message {index}"
        elif msg.msg_id is not None and headers.get(HEADER_MSG_ID) != msg.msg_id:
            problem = f"seq {first_seq + index} has msg id {headers.get(HEADER_MSG_ID)!r}, not {msg.msg_id!r}"
        elif any(headers.get(k) != (v if isinstance(v, str) else v[-1]) for k, v in (msg.headers or {}).items()):
            problem = f"seq {first_seq + index} has other headers than message {index}"
        if problem:
            break
    if problem is None and len(stored_ids) > 1:
        problem = f"seqs {first_seq}..{first_seq + count - 1} belong to {len(stored_ids)} different batches"
    if problem is None and stored_ids == set():
        log.warning("atomic batch %s: its msg ids are stored at %s seq %d..%d, which the stream already removed; "
                    "taken as committed earlier without comparing contents", batch_id, stream, first_seq,
                    first_seq + count - 1)
    if problem:
        raise BatchPublishError(
            f"atomic batch {batch_id}: its msg ids are already used by other messages in stream {stream!r} "
            f"({problem}), so the server refused the batch as a duplicate and nothing of it was written. "
            "Msg ids must name one batch's content for the stream's duplicate_window: give these messages "
            "fresh msg ids",
            reason="msg_id_reused", code=error.code, err_code=error.err_code, description=error.description,
        )


def _timeout(conn: JetStreamConnection, timeout: float | str | timedelta | None) -> float:
    """Seconds to wait for each reply: ``timeout`` (seconds, "30s", timedelta) or the connection's request timeout."""
    return to_seconds(timeout, field="timeout") if timeout else conn.settings.request_timeout


async def streams_for_subject(conn: JetStreamConnection, subject: str, *,
                              deadline: Deadline | None = None) -> list[str]:
    """The stream that captures ``subject`` as a list (empty when none; streams cannot overlap).

    nats-py's ``find_stream_name_by_subject``, with the toolkit's errors: the server's API errors typed,
    no responder as :class:`JetStreamNotEnabledError`, no reply as a permission error or a leader election
    (retried for ``leader_wait`` on a cluster, or until ``deadline``).
    """
    context = f"streams for {subject!r}"

    async def once() -> list[str]:
        try:
            return [await conn.js.find_stream_name_by_subject(subject)]
        except nats.js.errors.NotFoundError:
            return []
        except nats.js.errors.ServiceUnavailableError as exc:
            if exc.code is None and exc.err_code is None:  # nats-py's stand-in for "no responders"
                raise JetStreamNotEnabledError(f"{context}: no responder: JetStream is not enabled for this "
                                               "account, or the domain / API prefix is wrong") from None
            raise error_from_api(vars(exc), context=context) from None
        except nats.js.errors.APIError as exc:
            raise error_from_api(vars(exc), context=context) from None
        except nats.errors.TimeoutError:
            denied = conn.permission_error(f"{conn.api_prefix}.STREAM.NAMES")
            raise denied or conn.unanswered(f"{context}: no reply within {conn.settings.request_timeout:g}s") from None

    return await retry(context, once, transient=is_leader_unavailable, budget=conn.settings.leader_wait,
                       deadline=deadline, advice=QUORUM_ADVICE, logger=log)


async def publish_atomic_batch(
    conn: JetStreamConnection,
    messages: Sequence[BatchMessage],
    *,
    batch_id: str | None = None,
    expected_last_seq: int | None = None,
    max_msgs: int = DEFAULT_MAX_BATCH_MSGS,
    flow_every: int = DEFAULT_FLOW_EVERY,
    timeout: float | None = None,
    retries: int = DEFAULT_RETRIES,
    deadline: Deadline | None = None,
) -> BatchResult:
    """Publish ``messages`` as one atomic batch and return where it was stored.

    Everything is validated before the first byte is sent (empty batch, more than ``max_msgs``,
    batch id, subjects, payload sizes against ``conn.max_payload``, refused headers): each problem
    is an :class:`InvalidRequestError` with a ``reason``. Server refusals are
    :class:`BatchPublishError` (``stream_not_atomic``, ``batch_incomplete``, ``batch_too_large``,
    ``wrong_last_sequence``, ``duplicate_msg_id``, ...); ``too_many_inflight`` is retried up to
    ``retries`` times with jittered exponential backoff.

    :param expected_last_seq: the stream's last sequence must be this when the batch commits.
    :param max_msgs: the server's per-batch limit (``jetstream.limits.batch.max_msgs``).
    :param flow_every: every N-th message is a request, bounding how far the client runs ahead (0: never).
    :param timeout: seconds to wait for each server reply (default: the connection's request timeout).
    :param deadline: retry until then (default: for ``leader_wait`` from the first failure).
    """
    items = validate_messages(messages, max_msgs=max_msgs, max_payload=conn.max_payload,
                              refused_headers=ATOMIC_REFUSED_HEADERS, reserved_header_bytes=_BATCH_HEADER_BYTES)
    batch_id = validate_batch_id(batch_id)
    if expected_last_seq is not None and (not isinstance(expected_last_seq, int) or expected_last_seq < 0):
        raise InvalidRequestError(f"expected_last_seq must be an int >= 0, got {expected_last_seq!r}",
                                  reason="invalid_request")
    if not isinstance(flow_every, int) or flow_every < 0:
        raise InvalidRequestError(f"flow_every must be an int >= 0, got {flow_every!r}", reason="invalid_request")
    return await _publish_validated(conn, items, batch_id, expected_last_seq, flow_every,
                                    _timeout(conn, timeout), retries, deadline)


async def _publish_validated(conn: JetStreamConnection, items: list[BatchMessage], batch_id: str,
                             expected_last_seq: int | None, flow_every: int, timeout: float,
                             retries: int, deadline: Deadline | None = None) -> BatchResult:
    """Send an already validated batch with the retries of :class:`_BatchRetry`; see :func:`publish_atomic_batch`."""
    server_features.require(conn, server_features.ATOMIC_BATCH)
    started = time.monotonic()
    rule = _BatchRetry(conn, batch_id, items, retries, deadline,
                       lambda progress: _send_batch(conn, items, batch_id, expected_last_seq, flow_every, timeout,
                                                    progress))
    try:
        ack = await retry(f"atomic batch {batch_id}", rule.send, transient=rule.transient,
                          budget=conn.settings.leader_wait, deadline=deadline, advice=rule.advice, logger=log,
                          before_retry=conn.round_trip)
    except JetStreamError as exc:
        if isinstance(exc, BatchPublishError) and exc.reason == "duplicate_msg_id":
            try:
                return await _already_committed(conn, items, batch_id, timeout, exc)
            except JetStreamError as final:
                metrics.incr("batch.failed", tags={"reason": final.reason})
                raise
        ended = rule.final_error(exc)
        metrics.incr("batch.failed", tags={"reason": ended.reason})
        raise ended from None
    count, last_seq = _checked_commit_ack(ack, batch_id, len(items))
    metrics.incr("batch.committed")
    metrics.incr("batch.messages", count)
    metrics.timing("batch.commit_ms", (time.monotonic() - started) * 1000.0)
    return BatchResult(stream=str(ack.get("stream", "")), batch=batch_id, count=count,
                       first_seq=last_seq - count + 1, last_seq=last_seq)


def _checked_commit_ack(ack: dict[str, Any], batch_id: str, sent: int) -> tuple[int, int]:
    """``(count, seq)`` of a commit's PubAck, which must name this batch and every message sent.

    Anything else (another batch's ack, a count that differs, no sequence) is not proof that this
    batch is stored: ``invalid_batch_ack``, and the result is not reported.
    """
    count, seq = ack.get("count"), ack.get("seq")
    if ack.get("batch") != batch_id or count != sent or not isinstance(seq, int) or seq < sent:
        metrics.incr("batch.failed", tags={"reason": "invalid_batch_ack"})
        raise BatchPublishError(
            f"atomic batch {batch_id}: the commit was answered with an ack for batch {ack.get('batch')!r} with "
            f"count {count!r} and seq {seq!r}, not for this batch of {sent} messages; whether it is stored is "
            "unknown: read the stream (or re-send with msg ids, which makes a re-send safe)",
            reason="invalid_batch_ack")
    return count, seq


class _BatchRetry:
    """Which failed sends of one atomic batch are re-sent (for the connection's ``leader_wait``), and how it ends.

    Re-sent only when that cannot store the batch twice:

    - a 503 / no responders on a stream that exists: no leader received the batch, so it cannot commit;
    - on a cluster, no reply or a lost (reconnecting) connection before the commit frame was written
      (the server abandons an uncommitted batch); after it only when the batch carries msg ids (the
      server then refuses a stored batch as a duplicate and it is reported ``already_committed``);
    - ``msg_id_in_process`` (10158): a re-send met its own earlier attempt still being stored; asking
      again gives a duplicate (stored) or stores it once (the earlier attempt failed);
    - ``batch_incomplete`` (10176) on a cluster: the leader lost part of the batch (it changed during
      the send); nothing of it was stored;
    - ``too_many_inflight``: refused before anything was staged, up to ``retries`` times.

    A batch still failing for one of these reasons at the deadline ends in one error,
    :class:`LeaderUnavailableError` (``leader_unavailable``), saying whether it may have been stored.
    """

    def __init__(self, conn: JetStreamConnection, batch_id: str, items: list[BatchMessage], retries: int,
                 deadline: Deadline | None, send_batch: Callable[[dict[str, bool]], Awaitable[dict[str, Any]]]) -> None:
        self.conn = conn
        self.batch_id = batch_id
        self.subjects = list(dict.fromkeys(m.subject for m in items))
        self.has_msg_ids = any(m.msg_id for m in items)
        self.inflight_left = retries
        self.deadline = deadline
        self.send_batch = send_batch
        self.progress: dict[str, bool] = {}
        self.maybe_stored = False  # an attempt wrote the commit and got no answer
        self.retried: set[int] = set()
        self.advice = QUORUM_ADVICE

    async def send(self) -> dict[str, Any]:
        """One attempt; a 503 when every subject of the batch has a stream is :class:`LeaderUnavailableError`."""
        self.progress = {}
        try:
            return await self.send_batch(self.progress)
        except BatchPublishError as exc:
            if exc.reason != "no_stream_for_subject":
                raise
            uncaptured = await self._uncaptured_subjects()
            if uncaptured:
                raise BatchPublishError(
                    f"atomic batch {self.batch_id}: no stream captures {', '.join(map(repr, uncaptured))}, so the "
                    "batch was refused whole and nothing of it was stored; create a stream for these subjects "
                    "(JetStreamEnsureStreamOperator) or correct them", reason="no_stream_for_subject",
                    code=exc.code, err_code=exc.err_code, description=exc.description) from None
            raise LeaderUnavailableError(
                f"atomic batch {self.batch_id}: the stream capturing {self.subjects[0]!r} has no leader (503)"
            ) from None

    async def _uncaptured_subjects(self, most: int = 5) -> list[str]:
        """Up to ``most`` subjects of the batch that no stream captures (every subject is checked, not only
        the first: a 503 on a later message is no election)."""
        uncaptured: list[str] = []
        for subject in self.subjects:
            if not await streams_for_subject(self.conn, subject, deadline=self.deadline):
                uncaptured.append(subject)
                if len(uncaptured) == most:
                    break
        return uncaptured

    def transient(self, exc: JetStreamError) -> str | None:
        why = self._why(exc)
        if why is not None:
            self.retried.add(id(exc))
            metrics.incr("batch.retried", tags={"reason": exc.reason})
        return why

    def _why(self, exc: JetStreamError) -> str | None:
        cluster = self.conn.clustered and not self.conn.nc.is_closed
        if isinstance(exc, LeaderUnavailableError):
            return "no stream leader answered; re-sending it"
        if exc.reason == "too_many_inflight":
            if self.inflight_left <= 0:
                return None
            self.inflight_left -= 1
            return "the stream has too many batches in flight; re-sending it"
        if exc.reason == "msg_id_in_process":
            return "its msg id is still being stored by an earlier attempt; asking again"
        if exc.reason == "batch_incomplete" and cluster:
            return "the stream leader lost part of the batch (nothing stored); re-sending it"
        if (isinstance(exc, RequestTimeoutError) or exc.reason == "connection_lost") and cluster:
            if not self.progress.get("commit_written", False):
                return "no reply before the commit (the server abandons an uncommitted batch); re-sending it"
            if self.has_msg_ids:
                self.maybe_stored = True
                return "no reply to the commit (msg ids make a re-send safe); re-sending it"
        return None

    def final_error(self, exc: JetStreamError) -> JetStreamError:
        """The error to raise: ``exc``, or, when it was still retryable at the deadline, one
        :class:`LeaderUnavailableError` saying what may be stored."""
        if id(exc) not in self.retried or exc.reason == "too_many_inflight":
            return exc
        stored = ("it may have been stored once: re-sending it with the same msg ids is safe"
                  if self.maybe_stored else "nothing of the batch was stored")
        return LeaderUnavailableError(f"{exc.message}; {stored}", code=exc.code, err_code=exc.err_code,
                                      description=exc.description)


async def publish_atomic_batches(
    conn: JetStreamConnection,
    messages: Sequence[BatchMessage],
    *,
    batch_size: int = DEFAULT_MAX_BATCH_MSGS,
    concurrency: int = 1,
    timeout: float | None = None,
    retries: int = DEFAULT_RETRIES,
) -> list[BatchResult]:
    """Publish many messages as consecutive atomic batches of ``batch_size``, ``concurrency`` in flight.

    Each batch is all-or-nothing on its own (not the whole sequence). With ``concurrency`` > 1 the
    next batch is sent while the previous one commits; batches may then commit in any order.
    All batches are validated before the first is sent. On the first failure no new batch is
    started, the ones in flight finish, and the error is raised (earlier batches stay committed).
    Results are returned in input order.
    """
    if not isinstance(batch_size, int) or batch_size < 1 or not isinstance(concurrency, int) or concurrency < 1:
        raise InvalidRequestError("batch_size and concurrency must be ints >= 1", reason="invalid_request")
    chunks = [list(messages[i:i + batch_size]) for i in range(0, len(messages), batch_size)]
    if not chunks:
        raise InvalidRequestError("there are no messages to publish", reason="empty_batch")
    chunks = [validate_messages(chunk, max_msgs=batch_size, max_payload=conn.max_payload,
                                refused_headers=ATOMIC_REFUSED_HEADERS, reserved_header_bytes=_BATCH_HEADER_BYTES)
              for chunk in chunks]
    request_timeout = _timeout(conn, timeout)
    results: list[BatchResult | None] = [None] * len(chunks)
    pending = iter(range(len(chunks)))
    failed: list[JetStreamError] = []

    async def worker() -> None:
        for index in pending:
            if failed:
                return
            try:
                results[index] = await _publish_validated(conn, chunks[index], new_batch_id(), None,
                                                           DEFAULT_FLOW_EVERY, request_timeout, retries)
            except JetStreamError as exc:
                failed.append(exc)
                return

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(chunks)))))
    if failed:
        raise failed[0]
    return [r for r in results if r is not None]
