"""Atomic batch publish (nats-server 2.12+): every message of the batch is stored, or none is.

nats-py has no batch API, so the protocol is driven here with core publishes and requests (docs/batch-publishing.md,
"How it is sent"): the first message and every ``flow_every``-th one are requests whose empty answers bound how far
the client runs ahead, the rest plain publishes, and the last one carries ``Nats-Batch-Commit: 1`` and gets the
PubAck. Because a batch is stored whole and in one run of sequences, one msg id per batch is enough to make a
re-send safe (:mod:`~airflow_jetstream.client.batches.wire`), and keeps the stream's duplicate window at one
entry per batch instead of one per message.

Write fences: an atomic batch with a fence id commits at most once, at any time later, checked by the server. A
fenced batch ends with its *fence*, a message on ``_FENCE.<stream>.<fence id>`` with
``Nats-Expected-Last-Subject-Sequence: 0``, which nats-server (2.12+) checks at commit under the stream's lock:
every later commit of the same fence id (a retry, a re-run, a writer frozen and resumed) is refused whole and
stores nothing. No duplicate window, no clock and no look before the write decide it. The stored fence (one
message get) then names the sequences the earlier commit occupies, so the caller records what the server committed
even when the attempt that committed it died first (docs/batch-publishing.md, fences).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import struct
import time
from collections.abc import Sequence
from typing import Any

from airflow_jetstream.client import metrics, server_features
from airflow_jetstream.client.admin.streams import stream_info, streams_for_subject
from airflow_jetstream.client.batches.types import (
    DEFAULT_MAX_BATCH_MSGS,
    HEADER_BATCH_COMMIT,
    HEADER_BATCH_ID,
    HEADER_BATCH_SEQUENCE,
    HEADER_EXPECTED_LAST_SEQ,
    BatchMessage,
    BatchResult,
    new_batch_id,
    validate_batch_id,
    validate_messages,
)
from airflow_jetstream.client.batches.wire import (
    CONNECTION_ERRORS,
    BatchReplies,
    already_committed,
    capturing_stream,
    connection_lost,
    encode_frame,
    message_header_lines,
    reply_timeout,
)
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import (
    BatchPublishError,
    InvalidRequestError,
    JetStreamError,
    LeaderUnavailableError,
    RequestTimeoutError,
)
from airflow_jetstream.client.natspy_internals import write_raw
from airflow_jetstream.client.reading.stored import get_message
from airflow_jetstream.client.retry import Deadline
from airflow_jetstream.client.subjects import FENCE_PREFIX, fence_namespace, fence_subject, subject_matches

DEFAULT_FLOW_EVERY = 200
DEFAULT_RETRIES = 5
#: ``retention`` values under which a stored fence stays until the stream's limits remove it.
_KEEPING_RETENTION = ("limits", "workqueue")
log = logging.getLogger(__name__)


async def _send_batch(conn: JetStreamConnection, items: list[BatchMessage], batch_id: str,
                      expected_last_seq: int | None, flow_every: int, timeout: float,
                      progress: dict[str, bool]) -> dict[str, Any]:
    """Send the batch, return the commit's PubAck; ``progress["commit_written"]`` turns True once the
    commit frame was handed to the connection (before that, a failure cannot have stored the batch)."""
    context = f"atomic batch {batch_id}"
    replies = BatchReplies(conn, timeout, context)
    last = len(items)
    # Requests: the first message, every flow_every-th one, and the commit.
    asks = sorted({1, *(range(1 + flow_every, last, flow_every) if flow_every else ()), last})
    reply_of = {seq: replies.expect() for seq in asks}
    # the constant header parts are encoded once per batch
    batch_lines = b"%b: %b\r\n%b: " % (HEADER_BATCH_ID.encode(), batch_id.encode(), HEADER_BATCH_SEQUENCE.encode())
    first_extra = b"" if expected_last_seq is None else b"%b: %d\r\n" % (HEADER_EXPECTED_LAST_SEQ.encode(),
                                                                         expected_last_seq)
    commit_extra = b"%b: 1\r\n" % HEADER_BATCH_COMMIT.encode()
    frames = []
    for seq, msg in enumerate(items, start=1):
        extra = (first_extra if seq == 1 else b"") + (commit_extra if seq == last else b"")
        lines = b"%b%b%d\r\n%b" % (message_header_lines(msg), batch_lines, seq, extra)
        frames.append(encode_frame(msg.subject.encode(), reply_of.get(seq, b""), lines, msg.data))
    nc = conn.nc
    try:
        await replies.open()
        # The answer to a request is awaited only after the next segment is written, so the client
        # stays one segment ahead of the server. If the first message is refused (stream not atomic,
        # too many batches in flight), the server never opens the batch and drops what follows; that
        # refusal is the first answer awaited, so it is the one raised.
        await write_raw(nc, frames[0])
        progress["commit_written"] = last == 1
        outstanding = 1
        sent = 1
        for seq in asks[1:]:
            await write_raw(nc, b"".join(frames[sent:seq]))
            sent = seq
            progress["commit_written"] = seq == last
            await replies.wait(reply_of[outstanding], items[outstanding - 1].subject)
            outstanding = seq
        return await replies.wait(reply_of[outstanding], items[outstanding - 1].subject)
    except CONNECTION_ERRORS as exc:
        raise connection_lost(context, exc, "the server abandons an uncommitted batch, so re-send it (with msg ids "
                              "a re-send is safe even if the commit got through)") from None
    finally:
        await replies.close()


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
    fence: str | None = None,
    stream: str | None = None,
) -> BatchResult:
    """Publish ``messages`` as one atomic batch and return where it was stored.

    With ``fence`` (an id naming this batch's content, e.g. ``"<job>-<part>-<chunk>"``) the batch commits at most
    once, ever: a later commit of the same fence id is refused by the server and reported ``already_committed``
    with the earlier commit's sequences (:mod:`~airflow_jetstream.client.batches.atomic`). The stream (``stream``,
    or the one capturing the first subject) must carry ``_FENCE.<stream>.>`` (``stream_not_fenced`` otherwise).

    Everything is validated before the first byte is sent (each problem an :class:`InvalidRequestError` with a
    ``reason``); server refusals are :class:`BatchPublishError`; ``too_many_inflight`` is retried up to
    ``retries`` times with jittered exponential backoff.

    :param expected_last_seq: the stream's last sequence must be this when the batch commits.
    :param max_msgs: the server's per-batch limit (``jetstream.limits.batch.max_msgs``).
    :param flow_every: every N-th message is a request, bounding how far the client runs ahead (0: never).
    :param timeout: seconds to wait for each server reply (default: the connection's request timeout).
    :param deadline: retry until then (default: for ``leader_wait`` from the first failure).
    """
    items = validate_messages(messages, mode="atomic", max_msgs=max_msgs, max_payload=conn.nc.max_payload)
    batch_id = validate_batch_id(batch_id)
    if expected_last_seq is not None and (not isinstance(expected_last_seq, int) or expected_last_seq < 0):
        raise InvalidRequestError(f"expected_last_seq must be an int >= 0, got {expected_last_seq!r}",
                                  reason="invalid_request")
    if not isinstance(flow_every, int) or flow_every < 0:
        raise InvalidRequestError(f"flow_every must be an int >= 0, got {flow_every!r}", reason="invalid_request")
    fenced = None
    if fence is not None:
        _check_fenced_size(items, max_msgs)
        stream = stream or await capturing_stream(conn, items[0].subject, f"atomic batch {batch_id}")
        check_fence_config(stream, (await stream_info(conn, stream))["config"])
        fenced = (stream, fence)
    return await _publish_validated(conn, items, batch_id, expected_last_seq, flow_every,
                                    reply_timeout(conn, timeout), retries, deadline, fenced)


def _check_fenced_size(messages: Sequence[BatchMessage], max_msgs: int) -> None:
    """A fenced batch is its messages and the fence: refuse, before sending, one the server's limit cannot hold."""
    if len(messages) >= max_msgs:
        raise InvalidRequestError(
            f"the batch has {len(messages)} messages; a fenced batch holds at most {max_msgs - 1} (its fence is "
            f"one more, and the server's jetstream.limits.batch.max_msgs is {max_msgs}); use smaller chunks",
            reason="batch_too_large")


async def publish_fenced_batch(conn: JetStreamConnection, messages: Sequence[BatchMessage], *, stream: str,
                               fence_id: str, batch_id: str | None = None, expected_last_seq: int | None = None,
                               max_msgs: int = DEFAULT_MAX_BATCH_MSGS, timeout: float | None = None,
                               deadline: Deadline | None = None) -> BatchResult:
    """:func:`publish_atomic_batch` with ``fence=fence_id`` to ``stream``, which the caller already checked for
    fences (:func:`~airflow_jetstream.client.batches.publish_chunks.check_target_stream` with ``fence=True``)."""
    items = validate_messages(messages, mode="atomic", max_msgs=max_msgs, max_payload=conn.nc.max_payload)
    _check_fenced_size(items, max_msgs)
    return await _publish_validated(conn, items, validate_batch_id(batch_id), expected_last_seq, DEFAULT_FLOW_EVERY,
                                    reply_timeout(conn, timeout), DEFAULT_RETRIES, deadline, (stream, fence_id))


async def _publish_validated(conn: JetStreamConnection, items: list[BatchMessage], batch_id: str,
                             expected_last_seq: int | None, flow_every: int, timeout: float,
                             retries: int, deadline: Deadline | None = None,
                             fence: tuple[str, str] | None = None) -> BatchResult:
    """Send an already validated batch (:func:`publish_atomic_batch`), re-sent for the connection's ``leader_wait``
    where a re-send cannot store it twice (``why`` says why each is safe). A batch still failing for one of those
    reasons at the deadline ends in one :class:`LeaderUnavailableError` saying whether it may have been stored.

    ``fence`` is ``(stream, fence id)`` of a stream already checked for fences: the batch then ends with the fence
    and a refusal that its fence explains returns the earlier commit (``already_committed``)."""
    server_features.require(conn, server_features.ATOMIC_BATCH)
    started = time.monotonic()
    context = f"atomic batch {batch_id}"
    if fence is not None:
        items = [*items, fence_message(fence[0], fence[1], items)]
    # msg ids (or a fence) make the server refuse a second commit of the batch, so a re-send is safe
    resend_safe = fence is not None or any(m.msg_id for m in items)
    progress: dict[str, bool] = {}
    inflight_left, maybe_stored, retried = retries, False, set()

    async def send() -> dict[str, Any]:
        """One attempt; a 503 when every subject of the batch has a stream is :class:`LeaderUnavailableError`."""
        progress.clear()
        try:
            return await _send_batch(conn, items, batch_id, expected_last_seq, flow_every, timeout, progress)
        except BatchPublishError as exc:
            if exc.reason != "no_stream_for_subject":
                raise
            # every subject is checked, not only the first: a 503 on a later message is no election
            uncaptured: list[str] = []
            for subject in dict.fromkeys(m.subject for m in items):
                if not await streams_for_subject(conn, subject, deadline=deadline):
                    uncaptured.append(subject)
                    if len(uncaptured) == 5:
                        break
            if uncaptured:
                raise BatchPublishError(
                    f"{context}: no stream captures {', '.join(map(repr, uncaptured))}, so the batch was refused "
                    "whole and nothing of it was stored; create a stream for these subjects "
                    "(JetStreamEnsureStreamOperator) or correct them", reason="no_stream_for_subject",
                    code=exc.code, err_code=exc.err_code, description=exc.description) from None
            raise LeaderUnavailableError(f"{context}: the stream capturing {items[0].subject!r} has no leader "
                                         "(503)") from None

    def why(exc: JetStreamError) -> str | None:
        nonlocal inflight_left, maybe_stored
        cluster = conn.clustered and not conn.nc.is_closed
        if isinstance(exc, LeaderUnavailableError):  # a 503 on a stream that exists: no leader received the batch
            return "no stream leader answered; re-sending it"
        if exc.reason == "too_many_inflight":
            if inflight_left <= 0:
                return None
            inflight_left -= 1
            return "the stream has too many batches in flight; re-sending it"
        if exc.reason == "msg_id_in_process":  # 10158: asking again gives a duplicate, or stores it once
            return "its msg id is still being stored by an earlier attempt; asking again"
        if exc.reason == "batch_incomplete" and cluster:
            return "the stream leader lost part of the batch (nothing stored); re-sending it"
        # the server abandons an uncommitted batch; after the commit only msg ids (or a fence) make a re-send safe
        if (isinstance(exc, RequestTimeoutError) or exc.reason == "connection_lost") and cluster:
            if not progress.get("commit_written", False):
                return "no reply before the commit (the server abandons an uncommitted batch); re-sending it"
            if resend_safe:
                maybe_stored = True
                return "no reply to the commit (msg ids make a re-send safe); re-sending it"
        return None

    def transient(exc: JetStreamError) -> str | None:
        reason = why(exc)
        if reason is not None:
            retried.add(id(exc))
            metrics.incr("batch.retried", tags={"reason": exc.reason})
        return reason

    try:
        ack = await conn.retry_leader(context, send, transient=transient, deadline=deadline, logger=log,
                                      before_retry=conn.round_trip)
    except JetStreamError as exc:
        earlier = await _fenced_refusal(conn, fence, exc, items[-1])
        if earlier is not None:
            return earlier
        try:
            if isinstance(exc, BatchPublishError) and exc.reason == "duplicate_msg_id":
                return await already_committed(conn, items, batch_id, timeout, exc)
            if id(exc) not in retried or exc.reason == "too_many_inflight":
                raise
            # still retryable at the deadline: say what may be stored
            stored = ("it may have been stored once: re-sending it with the same msg ids is safe"
                      if maybe_stored else "nothing of the batch was stored")
            raise LeaderUnavailableError(f"{exc.message}; {stored}", code=exc.code, err_code=exc.err_code,
                                         description=exc.description) from None
        except JetStreamError as final:
            metrics.incr("batch.failed", tags={"reason": final.reason})
            raise
    count, last_seq = _checked_commit_ack(ack, batch_id, len(items))
    if fence is not None:  # the fence is the provider's, not one of the caller's messages
        count, last_seq = count - 1, last_seq - 1
    metrics.incr("batch.committed")
    metrics.incr("batch.messages", count)
    metrics.timing("batch.commit_ms", (time.monotonic() - started) * 1000.0)
    return BatchResult(stream=str(ack.get("stream", "")), batch=batch_id, count=count,
                       first_seq=last_seq - count + 1, last_seq=last_seq)


async def _fenced_refusal(conn: JetStreamConnection, fence: tuple[str, str] | None, exc: JetStreamError,
                          sent_fence: BatchMessage) -> BatchResult | None:
    """The earlier commit of a fenced batch the server refused because of it (its fence is stored), else None.

    Only a refusal that a stored fence explains counts: a wrong last sequence (the fence's own expectation, or the
    caller's ``expected_last_seq`` after the earlier commit) or a duplicate msg id (within the duplicate window
    the server checks msg ids first). The fence, once stored, never changes, so reading it (one message get) after
    the refusal decides nothing the server did not. A fence follows the messages it covers (its whole batch, or in
    a Batcher's group its one item): its count n names the n sequences before its own, which its
    ``Nats-Batch-Sequence`` k must allow (1 <= n < k)."""
    if fence is None or exc.reason not in ("wrong_last_sequence", "duplicate_msg_id"):
        return None
    stream, fence_id = fence
    subject = fence_subject(stream, fence_id)
    raw = await get_message(conn, stream, subject=subject)
    if raw is None:
        return None
    try:
        position = int(raw.headers.get(HEADER_BATCH_SEQUENCE, "0"))
        body = json.loads(raw.data or b"{}")
        count, digest = int(body.get("count", -1)), str(body.get("digest", ""))
    except (TypeError, ValueError, AttributeError):
        position, count, digest = 0, -1, ""
    if not 1 <= count < position:
        raise BatchPublishError(
            f"stream {stream!r} seq {raw.seq} on fence subject {subject!r} is not a fence this provider wrote "
            f"(batch position {position}, count {count}); nothing was published. Leave the {FENCE_PREFIX} "
            "subjects to the provider", reason="fence_invalid")
    earlier = BatchResult(stream=stream, batch=str(raw.headers.get(HEADER_BATCH_ID, "")), count=count,
                          first_seq=raw.seq - count, last_seq=raw.seq - 1, already_committed=True)
    if json.loads(sent_fence.data)["digest"] != digest:
        raise BatchPublishError(
            f"fence {fence_id!r} of stream {stream!r} was committed earlier (batch {earlier.batch}, seq "
            f"{earlier.first_seq}..{earlier.last_seq}) with other messages than this attempt's; nothing was stored "
            "again. The fence id must name one content: the input or the chunking (batch_size) changed between "
            "attempts; use a new id (job_id, dedupe_key) for new content", reason="fence_conflict")
    metrics.incr("batch.already_committed", tags={"via": "fence"})
    log.info("atomic batch with fence %r: committed earlier as batch %s at %s seq %d..%d; nothing stored again",
             fence_id, earlier.batch, stream, earlier.first_seq, earlier.last_seq)
    return earlier


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
    chunks = [validate_messages(chunk, mode="atomic", max_msgs=batch_size, max_payload=conn.nc.max_payload)
              for chunk in chunks]
    request_timeout = reply_timeout(conn, timeout)
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


def check_fence_config(stream: str, config: dict[str, Any]) -> None:
    """Refuse, before anything is published, a stream whose config cannot keep fences (reason ``stream_not_fenced``)."""
    retention = config.get("retention", "limits")
    if retention not in _KEEPING_RETENTION:
        raise BatchPublishError(
            f"stream {stream!r} has retention {retention!r}, which removes a fence as soon as it is stored (no "
            "consumer is interested in it), so it could not refuse a second commit; write to a limits or workqueue "
            "stream, or opt out with fence=False (duplicates then bounded only by the duplicate_window)",
            reason="stream_not_fenced")
    subject = fence_subject(stream, "check")
    if not any(subject_matches(pattern, subject) for pattern in config.get("subjects") or []):
        raise BatchPublishError(
            f"stream {stream!r} has no fence subjects, which exactly-once atomic writes need (a retry or re-run "
            f"after the duplicate window would store the batches again); add {fence_namespace(stream)!r} to its "
            "subjects (JetStreamEnsureStreamOperator / ensure_stream add it to every allow_atomic stream), or opt "
            "out with fence=False, which leaves duplicates bounded only by the stream's duplicate_window",
            reason="stream_not_fenced")


def content_digest(messages: Sequence[BatchMessage]) -> str:
    """A digest of the messages' subjects and payloads: what a fence says its batch held. Every fenced chunk pays
    for it on every attempt, so it hashes three joined parts (the lengths, then the subjects, then the payloads:
    unambiguous together) instead of one update per message, which cost three times as much (docs/performance.md)."""
    subjects = [msg.subject for msg in messages]
    payloads = [msg.data for msg in messages]
    digest = hashlib.sha256(struct.pack(f"<{2 * len(subjects)}Q", *map(len, subjects), *map(len, payloads)))
    digest.update("".join(subjects).encode())
    digest.update(b"".join(payloads))
    return digest.hexdigest()[:32]


def fence_message(stream: str, fence_id: str, messages: Sequence[BatchMessage]) -> BatchMessage:
    """The fence a batch of ``messages`` ends with (the same bytes for every attempt of the batch)."""
    payload = json.dumps({"fence": fence_id, "count": len(messages), "digest": content_digest(messages)},
                         separators=(",", ":")).encode()
    return BatchMessage(fence_subject(stream, fence_id), payload, expected_last_subject_seq=0)


async def fence_count(conn: JetStreamConnection, stream: str) -> int:
    """How many write fences ``stream`` holds (one per fenced batch, up to the server's 100,000 subjects per
    answer): its message count less this is its data."""
    info = await conn.api_request(f"STREAM.INFO.{stream}", {"subjects_filter": f"{FENCE_PREFIX}.{stream}.>"},
                                  context=f"stream {stream!r}")
    return len((info.get("state") or {}).get("subjects") or {})
