"""Fast (non-atomic) batch publish for bulk ingest (nats-server 2.14+, stream ``allow_batched``).

The batch control rides in the reply subject of every message::

    <inbox>.<batch id>.<flow>.fail.<batch seq>.<op>.$FI     op: 0 start, 1 append, 2 commit, 4 ping

and the server answers on those reply subjects: flow acks ``{"type":"ack","seq":S,"msgs":F}``
("persisted up to S, next ack after F more"), gaps ``{"type":"gap","last_seq":L,"seq":S}``,
per-message errors ``{"type":"err","seq":S,"error":{...}}`` and, at the end, a PubAck with
``batch`` and ``count``. The client keeps at most ``WINDOW_FLOWS`` flow windows unacknowledged.

Messages are stored as they arrive (no all-or-nothing): the batch runs in gap-fail mode, so what
is stored is always an in-order prefix of the batch. A lost message ends the batch at the last
persisted one and the server commits what it has; the rest is then published as a new batch (up to
``max_resumes`` times, with back-off). A leader election (503 / no answer) interrupts a batch: the
client flushes, pings the batch past its end so the server closes it and says how many it stored,
or, when no leader knows the batch any more, reads the stream back from the sequence noted before
the batch to count its messages there; then it resumes with the rest for up to the connection's
``leader_wait``. Every failure is a :class:`FastBatchError` whose ``stored`` is that server-derived
count (or None, saying so, when it could not be established).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from airflow_jetstream.client import metrics, server_features
from airflow_jetstream.client.admin.streams import stream_info
from airflow_jetstream.client.batches.fast_run import (
    ERR_BATCH_UNKNOWN,
    FastBatchRun,
    Interrupted,
    Prepared,
    settle_wait,
)
from airflow_jetstream.client.batches.resend import stored_sequences
from airflow_jetstream.client.batches.types import (
    HEADER_BATCH_COMMIT,
    HEADER_BATCH_ID,
    HEADER_BATCH_SEQUENCE,
    HEADER_EXPECTED_LAST_MSG_ID,
    HEADER_MSG_ID,
    MAX_BATCH_ID_LENGTH,
    BatchMessage,
    BatchResult,
    validate_batch_id,
    validate_messages,
)
from airflow_jetstream.client.batches.wire import capturing_stream, message_header_lines, reply_timeout
from airflow_jetstream.client.connection import QUORUM_ADVICE, JetStreamConnection
from airflow_jetstream.client.errors import (
    BatchPublishError,
    ConnectionFailedError,
    FastBatchError,
    InvalidRequestError,
    JetStreamError,
    error_from_api,
)
from airflow_jetstream.client.reading.stored import read_range
from airflow_jetstream.client.retry import ELECTION, Deadline, is_leader_unavailable, retry

FAST_REFUSED_HEADERS = {
    HEADER_BATCH_ID.lower(): "batch headers belong to atomic batches; the fast batch protocol uses reply subjects",
    HEADER_BATCH_SEQUENCE.lower(): "batch headers belong to atomic batches",
    HEADER_BATCH_COMMIT.lower(): "batch headers belong to atomic batches",
    HEADER_EXPECTED_LAST_MSG_ID.lower(): "nats-server 2.14/2.15 stop storing into a replicated stream after a "
    "mismatched one (see docs/cluster.md); use expected_last_subject_seq",
}
# Messages between flow acks the client asks for. nats-server 2.15 caps the flow it grants at
# 500 / (fast batches open on the stream) and ramps up to it, so beyond 500 this only lets the
# client run further ahead before the first flow ack arrives.
DEFAULT_FLOW = 1000
MAX_FLOW = 65535
# Resumed batches get "-r<k>" appended to the id.
_RESUME_SUFFIX_ROOM = 4
log = logging.getLogger(__name__)


def _prepare(messages: list[BatchMessage]) -> list[Prepared]:
    subjects: dict[str, bytes] = {}
    prepared = []
    for m in messages:
        subject = subjects.get(m.subject)
        if subject is None:
            subject = subjects[m.subject] = m.subject.encode()
        lines = message_header_lines(m)
        prepared.append((subject, lines, bytes(m.data)))
    return prepared


async def publish_fast_batch(
    conn: JetStreamConnection,
    messages: Sequence[BatchMessage],
    *,
    batch_id: str | None = None,
    flow: int = DEFAULT_FLOW,
    timeout: float | None = None,
    max_resumes: int = 3,
) -> BatchResult:
    """Publish ``messages`` through the fast batch protocol; returns the count and last stream sequence.

    Not atomic: messages are stored as they arrive, other publishers may interleave (so
    ``first_seq`` is None), and duplicates by msg id are skipped by the server but counted
    (``count`` is the number of messages the server accepted into the batch). ``last_seq`` is where
    the stream holds the batch's last message. ``duplicates`` says how many were stored before: the
    msg ids are probed without writing when the last message was such a duplicate (the server acks
    seq 0) or when the stream grew by fewer messages than ``count``; so it can only miss duplicates
    when other publishers wrote to the stream during the batch. The stream needs
    ``allow_batched: true``. Validation happens before anything is sent.

    :param flow: how many messages the server may persist between flow acks (it starts at
        min(500, flow) and adapts when other fast batches run).
    :param timeout: seconds to wait for each server answer (default: the connection's request timeout).
    :param max_resumes: how often a gap (lost message) is healed by resending the rest as a new batch.
    """
    items = validate_messages(messages, max_msgs=None, max_payload=conn.max_payload,
                              refused_headers=FAST_REFUSED_HEADERS)
    batch_id = validate_batch_id(batch_id)
    if len(batch_id) > MAX_BATCH_ID_LENGTH - _RESUME_SUFFIX_ROOM:
        raise InvalidRequestError(
            f"batch_id is {len(batch_id)} characters; fast batches accept at most "
            f"{MAX_BATCH_ID_LENGTH - _RESUME_SUFFIX_ROOM} (room is kept for resumes)", reason="batch_id_invalid")
    if not isinstance(flow, int) or not 1 <= flow <= MAX_FLOW:
        raise InvalidRequestError(f"flow must be an int between 1 and {MAX_FLOW}, got {flow!r}",
                                  reason="invalid_request")
    server_features.require(conn, server_features.FAST_BATCH)
    timeout = reply_timeout(conn, timeout)
    frames = _prepare(items)
    started = time.monotonic()
    # the stream capturing the batch and its last sequence before it (where counting starts)
    stream = await capturing_stream(conn, items[0].subject, f"fast batch {batch_id}")
    mark = int((await stream_info(conn, stream))["state"]["last_seq"])
    total = len(frames)
    stored = 0
    resumes = gap_resumes = 0
    own_last: int | None = None  # stream seq of the last of these messages known stored
    duplicates = 0
    current_id = batch_id
    loop = asyncio.get_running_loop()
    interrupted_since: float | None = None
    while True:
        run = FastBatchRun(conn, frames[stored:], current_id, flow, timeout)
        try:
            ack = await run.run()
        except Interrupted as stop:
            how = "the server's count"
            if stop.settled is not None:
                accepted, last = stop.settled
                mark = max(mark, last)
                own_last = last if accepted and last else own_last
            elif isinstance(stop.cause, ConnectionFailedError):
                raise _failed(stop.cause, stream, stored, total, unknown_after=mark) from None
            else:
                how = "counted in the stream"
                try:
                    accepted, found_last, mark = await _count_in_stream(conn, stream, mark, items[stored:])
                except JetStreamError as exc:
                    raise _failed(exc, stream, stored, total, unknown_after=mark) from None
                own_last = found_last or own_last
            stored += accepted
            now = loop.time()
            interrupted_since = now if accepted or interrupted_since is None else interrupted_since
            if stored >= total:
                break
            if now - interrupted_since >= conn.settings.leader_wait:
                raise _failed(stop.cause, stream, stored, total) from None
            log.warning("%s interrupted (%s): %d of %d messages stored (%s); resuming the rest in %.2f s",
                        run.context, stop.cause.reason, stored, total, how, ELECTION.pause(resumes + 1))
        else:
            if "error" in ack:
                raise _failed(error_from_api(ack["error"], context=run.context), stream, stored, total)
            stream = str(ack.get("stream", stream))
            count = int(ack.get("count") or 0)
            if int(ack.get("seq") or 0):
                own_last = int(ack["seq"])
                run_items = items[stored:stored + count]
                if count > own_last - mark and any(m.msg_id for m in run_items):
                    # the stream grew by fewer messages than the server accepted: some were duplicates
                    run_dups, _ = await _count_duplicates(conn, stream, run_items, mark)
                    duplicates += run_dups
            elif count:
                # the last message was a duplicate (the ack's seq is 0): find where the stream holds them
                run_dups, own_last = await _count_duplicates(conn, stream, items[stored:stored + count], mark)
                duplicates += run_dups
            mark = max(mark, own_last or 0)
            stored += count
            interrupted_since = None
            errors = run.state.errors
            if run.state.gaps:
                # Messages sent after the gap ended the batch are answered "unknown batch": expected.
                errors = [e for e in errors if e[1].get("err_code") != ERR_BATCH_UNKNOWN]
            if errors and stored < total:
                _seq, error = min(errors, key=lambda e: e[0])
                raise _failed(error_from_api(error, context=f"{run.context}: message {stored + 1}"), stream,
                              stored, total)
            if stored >= total:
                break
            gap_resumes += 1
            if gap_resumes > max_resumes:
                raise _failed(BatchPublishError(
                    f"{run.context}: the server saw gaps {run.state.gaps}; gave up after {max_resumes} resumes",
                    reason="batch_gap"), stream, stored, total)
            log.warning("%s: the server saw gaps %s; %d of %d messages stored, resuming the rest in %.2f s",
                        run.context, run.state.gaps, stored, total, ELECTION.pause(resumes + 1))
        resumes += 1
        metrics.incr("fast_batch.resumed")
        await asyncio.sleep(ELECTION.pause(resumes))
        current_id = f"{batch_id}-r{resumes % 100}"  # ids of closed batches may be reused
    metrics.incr("fast_batch.committed")
    metrics.incr("fast_batch.messages", stored)
    metrics.timing("fast_batch.commit_ms", (time.monotonic() - started) * 1000.0)
    if own_last is None:
        raise _failed(JetStreamError(f"fast batch {batch_id}: the server did not say where its messages are stored",
                                     reason="stored_unknown"), stream, stored, total, unknown_after=mark)
    return BatchResult(stream=stream, batch=batch_id, count=stored, first_seq=None, last_seq=own_last,
                       duplicates=duplicates)


def _failed(error: JetStreamError, stream: str, stored: int, total: int, *,
            unknown_after: int | None = None) -> FastBatchError:
    """The error raised for a failed fast batch: the cause, and how many of its messages are stored."""
    if unknown_after is not None:
        how_many = (f"{stored} message(s) of the fast batch are known to be stored, and how many more could not be "
                    f"established: read stream {stream!r} after seq {unknown_after} before re-sending (or re-send "
                    "with msg ids set, which the stream de-duplicates)")
    else:
        how_many = (f"the first {stored} of its {total} messages are stored in stream {stream!r} (fast batches are "
                    f"not atomic): re-send messages {stored + 1}..{total}")
    return FastBatchError(f"{error.message}; {how_many}", stored=None if unknown_after is not None else stored,
                          total=total, stream=stream, reason=error.reason, code=error.code, err_code=error.err_code,
                          description=error.description)


def _matches(item: BatchMessage, stored: tuple[str, int, int, Any, bytes]) -> bool:
    subject, _seq, _ts, headers, data = stored
    if subject != item.subject or bytes(data or b"") != bytes(item.data):
        return False
    headers = headers or {}
    if item.msg_id is not None and headers.get(HEADER_MSG_ID) != item.msg_id:
        return False
    return all(headers.get(k) == v for k, v in (item.headers or {}).items())


async def _count_in_stream(conn: JetStreamConnection, stream: str, after: int,
                           items: Sequence[BatchMessage]) -> tuple[int, int | None, int]:
    """What a fast batch stored when the server cannot say, counted by reading the stream back: how many of
    ``items`` (an in-order prefix) the stream holds after seq ``after``, the sequence of the last of them (None
    when none), and the stream's last sequence read. Messages of other publishers in between are skipped.
    Waits for a leader (:func:`~airflow_jetstream.client.batches.fast_run.settle_wait`)."""

    async def count() -> tuple[int, int | None, int]:
        info = await stream_info(conn, stream)
        retention = info["config"].get("retention", "limits")
        if retention != "limits":
            raise JetStreamError(f"stream {stream!r} has {retention} retention: its messages may be consumed "
                                 "before they can be counted", reason="stored_unknown")
        last = int(info["state"]["last_seq"])
        found = 0
        found_last: int | None = None
        via = "direct" if info["config"].get("allow_direct") else "consumer"
        async for chunk in read_range(conn, stream, after + 1, last, via=via):
            for stored in chunk:
                if found < len(items) and _matches(items[found], stored):
                    found += 1
                    found_last = stored[1]
        return found, found_last, last

    return await retry(f"counting a fast batch in stream {stream!r}", count, transient=is_leader_unavailable,
                       budget=None, deadline=Deadline(settle_wait(conn)), advice=QUORUM_ADVICE, logger=log)


async def _count_duplicates(conn: JetStreamConnection, stream: str, run: Sequence[BatchMessage],
                            mark: int) -> tuple[int, int | None]:
    """For a run the server skipped some messages of as duplicates: how many of its messages were
    stored at or before seq ``mark`` (by msg id, probed without writing) and the sequence of its last
    one (None when its msg id is not in the duplicate window any more)."""
    seqs = await stored_sequences(conn, run, stream=stream)
    earlier = sum(1 for seq in seqs if seq is not None and seq <= mark)
    log.info("fast batch on stream %s: %d of %d message(s) were already stored (msg ids), the last at seq %s",
             stream, earlier, len(run), seqs[-1] if seqs else None)
    return earlier, seqs[-1] if seqs else None
