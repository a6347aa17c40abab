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
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import nats.errors

from airflow_jetstream.client import metrics, server_features
from airflow_jetstream.client.batches.atomic import stored_sequences, streams_for_subject
from airflow_jetstream.client.batches.frames import encode_frame, message_header_lines, write_frames
from airflow_jetstream.client.batches.types import (
    HEADER_BATCH_COMMIT,
    HEADER_BATCH_ID,
    HEADER_BATCH_SEQUENCE,
    HEADER_EXPECTED_LAST_MSG_ID,
    HEADER_MSG_ID,
    HEADER_STATUS,
    MAX_BATCH_ID_LENGTH,
    BatchMessage,
    BatchResult,
    validate_batch_id,
    validate_messages,
)
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import (
    BatchPublishError,
    ConnectionFailedError,
    FastBatchError,
    InvalidRequestError,
    JetStreamError,
    LeaderUnavailableError,
    RequestTimeoutError,
    error_from_api,
)
from airflow_jetstream.client.reading.range_read import read_range

FAST_REFUSED_HEADERS = {
    HEADER_BATCH_ID.lower(): "batch headers belong to atomic batches; the fast batch protocol uses reply subjects",
    HEADER_BATCH_SEQUENCE.lower(): "batch headers belong to atomic batches",
    HEADER_BATCH_COMMIT.lower(): "batch headers belong to atomic batches",
    HEADER_EXPECTED_LAST_MSG_ID.lower(): "nats-server 2.14/2.15 stop storing into a replicated stream after a "
    "mismatched one (see docs/cluster.md); use expected_last_subject_seq",
}
OP_START, OP_APPEND, OP_COMMIT, OP_PING = 0, 1, 2, 4
_ERR_BATCH_UNKNOWN = 10208
# Messages between flow acks the client asks for. nats-server 2.15 caps the flow it grants at
# 500 / (fast batches open on the stream) and ramps up to it, so beyond 500 this only lets the
# client run further ahead before the first flow ack arrives.
DEFAULT_FLOW = 1000
# How many flow windows may be unacknowledged before the client waits for the server.
WINDOW_FLOWS = 4
MAX_FLOW = 65535
# Every reply subject ends in this token: it marks a message as part of a fast batch.
_SUFFIX = b"$FI"
# Resumed batches get "-r<k>" appended to the id.
_RESUME_SUFFIX_ROOM = 4
# Pause before a resume: doubles from the first to the last value (seconds).
_RESUME_PAUSE_FIRST, _RESUME_PAUSE_MAX = 0.25, 2.0
# Establishing what an interrupted batch stored waits for a leader at least this long (seconds), also
# with a shorter leader_wait: the count is owed to the caller even when the publish is not retried.
_SETTLE_WAIT_MIN = 30.0
log = logging.getLogger(__name__)


@dataclass
class _BatchState:
    """What the server has told us about one fast batch."""

    acked: int = 0
    flow: int = 1
    answered: bool = False
    unavailable: bool = False
    done: asyncio.Future[dict[str, Any]] | None = None
    gaps: list[tuple[int, int]] = field(default_factory=list)
    errors: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


_Prepared = tuple[bytes, bytes, bytes]  # subject, header lines, payload


class _FastBatchRun:
    """Publishes one fast batch (one batch id) and returns the server's final PubAck."""

    def __init__(self, conn: JetStreamConnection, messages: list[_Prepared], batch_id: str, flow: int,
                 timeout: float) -> None:
        self.conn = conn
        self.messages = messages
        self.batch_id = batch_id
        self.flow = flow
        self.timeout = timeout
        self.prefix = f"{conn.nc.new_inbox()}.{batch_id}"
        self.reply_base = f"{self.prefix}.{flow}.fail.".encode()
        self.state = _BatchState(flow=flow)
        self.context = f"fast batch {batch_id}"
        self.sent = 0

    def reply_subject(self, seq: int, op: int) -> bytes:
        return b"%b%d.%d.%b" % (self.reply_base, seq, op, _SUFFIX)

    def encode(self, first: int, last: int) -> bytes:
        """Frames for batch sequences ``first..last`` (1-based, inclusive); the final message commits."""
        total = len(self.messages)
        base = self.reply_base
        frames = []
        for seq in range(first, last + 1):
            subject, lines, payload = self.messages[seq - 1]
            op = OP_COMMIT if seq == total else (OP_START if seq == 1 else OP_APPEND)
            frames.append(encode_frame(subject, b"%b%d.%d.%b" % (base, seq, op, _SUFFIX), lines, payload))
        return b"".join(frames)

    async def _on_reply(self, msg: Any) -> None:
        state = self.state
        if msg.headers and msg.headers.get(HEADER_STATUS) == "503":
            # no responders: the stream has no leader right now (checked to exist before the batch)
            state.unavailable = True
            state.changed.set()
            return
        try:
            reply = json.loads(msg.data) if msg.data else {}
        except ValueError:
            reply = {"type": "bad"}
        kind = reply.get("type") if isinstance(reply, dict) else "bad"
        first_answer = not state.answered
        state.answered = True
        if kind == "ack":
            state.acked = max(state.acked, int(reply.get("seq", 0)))
            state.flow = max(1, int(reply.get("msgs") or 1))
        elif kind == "gap":
            state.gaps.append((int(reply.get("last_seq", 0)), int(reply.get("seq", 0))))
        elif kind == "err":
            state.errors.append((int(reply.get("seq", 0)), reply.get("error") or {}))
        elif isinstance(reply, dict) and "error" in reply and "batch" not in reply and not first_answer:
            # A message refused before it reached the batch (e.g. over max_msg_size): the batch goes on.
            state.errors.append((0, reply["error"]))
        elif state.done is not None and not state.done.done():
            state.done.set_result(reply if isinstance(reply, dict) else {})
        state.changed.set()

    async def _wait_change(self, what: str) -> None:
        state = self.state
        if state.unavailable:
            raise LeaderUnavailableError(f"{self.context}: the stream has no leader (no responders)")
        try:
            async with asyncio.timeout(self.timeout):
                await state.changed.wait()
        except TimeoutError:
            raise RequestTimeoutError(f"{self.context}: no {what} from the server within {self.timeout}s; the "
                                      f"messages up to the last flow ack ({state.acked}) are stored") from None
        state.changed.clear()
        if state.unavailable:
            raise LeaderUnavailableError(f"{self.context}: the stream has no leader (no responders)")

    async def _wait_for_window(self, sent: int) -> None:
        """Wait for a flow ack; after a silent timeout, ping once so the server resends it (or reports a gap)."""
        try:
            await self._wait_change("flow-control ack")
        except RequestTimeoutError:
            subject = self.messages[sent - 1][0]
            await write_frames(self.conn.nc, encode_frame(subject, self.reply_subject(sent, OP_PING), b"", b""))
            await self._wait_change("flow-control ack after a ping")

    async def run(self) -> dict[str, Any]:
        """The server's final answer; an interrupted batch raises :class:`_Interrupted` with what it stored."""
        nc = self.conn.nc
        try:
            sub = await nc.subscribe(f"{self.prefix}.>", cb=self._on_reply)
        except _CONNECTION_ERRORS as exc:
            raise _Interrupted(_connection_lost(self.context, exc), (0, 0)) from None
        try:
            try:
                ack = await self._send()
            except (LeaderUnavailableError, RequestTimeoutError) as exc:
                raise _Interrupted(exc, await self._settle()) from None
            error = ack.get("error") if isinstance(ack.get("error"), dict) else None
            if error and error.get("err_code") == _ERR_BATCH_UNKNOWN and self.sent > 1:
                # a new leader does not know the batch: what the old one stored is counted in the stream
                raise _Interrupted(error_from_api(error, context=self.context), None)
            return ack
        except _CONNECTION_ERRORS as exc:
            raise _Interrupted(_connection_lost(self.context, exc), None) from None
        finally:
            if not nc.is_closed:
                await sub.unsubscribe()

    async def _send(self) -> dict[str, Any]:
        nc = self.conn.nc
        state = self.state
        state.done = asyncio.get_running_loop().create_future()
        total = len(self.messages)
        self.sent = 1
        await write_frames(nc, self.encode(1, 1))
        # The first answer is the flow ack for seq 0 (batch started) or a PubAck / error.
        while not state.answered:
            await self._wait_change("start ack")
        while self.sent < total and not state.done.done() and not state.errors:
            limit = min(total, state.acked + WINDOW_FLOWS * state.flow)
            if limit <= self.sent:
                await self._wait_for_window(self.sent)
                continue
            await write_frames(nc, self.encode(self.sent + 1, limit))
            self.sent = limit
        if state.errors and not state.done.done():
            # Stop at the first error; a ping past the last persisted message makes the server
            # see the gap and commit what it has, so the final ack says how much is stored.
            await write_frames(nc, encode_frame(self.messages[self.sent - 1][0],
                                                self.reply_subject(self.sent, OP_PING), b"", b""))
        try:
            async with asyncio.timeout(self.timeout):
                while not state.done.done():
                    await state.changed.wait()
                    state.changed.clear()
                    if state.unavailable:
                        raise LeaderUnavailableError(f"{self.context}: the stream has no leader (no responders)")
                return state.done.result()
        except TimeoutError:
            raise RequestTimeoutError(f"{self.context}: no final ack within {self.timeout}s") from None

    async def _settle(self) -> tuple[int, int] | None:
        """Close the interrupted batch on the server and return how many of its messages it stored.

        First a flush, so no frame of this batch is still on its way (nothing can open or extend it
        later); then a ping past the last message sent: a leader that knows the batch sees the gap,
        commits what it has and answers the exact count. None when no leader knows the batch (the
        leader changed: the caller then counts by reading the stream) or none answered in
        :func:`_settle_wait`. Returns (count, stream seq of the last one stored).
        """
        nc = self.conn.nc
        state = self.state
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _settle_wait(self.conn)
        subject = self.messages[max(self.sent, 1) - 1][0]
        ping = encode_frame(subject, self.reply_subject(self.sent + 1, OP_PING), b"", b"")
        pause = _RESUME_PAUSE_FIRST
        while True:
            state.done = loop.create_future()
            state.unavailable, state.answered = False, True
            state.errors.clear()
            state.changed.clear()
            try:
                await nc.flush(timeout=self.timeout)  # type: ignore[arg-type]  # float s work
                await write_frames(nc, ping)
                async with asyncio.timeout(self.timeout):
                    while not (state.done.done() or state.unavailable or state.errors):
                        await state.changed.wait()
                        state.changed.clear()
            except (TimeoutError, nats.errors.TimeoutError):
                pass
            if state.done.done():
                ack = state.done.result()
                if "error" not in ack and "count" in ack:
                    return int(ack["count"]), int(ack.get("seq") or 0)
                return None
            if state.errors:
                return None
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(pause)
            pause = min(pause * 2, _RESUME_PAUSE_MAX)


_CONNECTION_ERRORS = (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError,
                      nats.errors.OutboundBufferLimitError)


class _Interrupted(Exception):
    """A run stopped without a final ack: ``cause`` and the server's (count, last seq) of what it stored
    (None: no leader knows the batch any more, count its messages in the stream)."""

    def __init__(self, cause: JetStreamError, settled: tuple[int, int] | None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.settled = settled


def _connection_lost(context: str, exc: BaseException) -> ConnectionFailedError:
    return ConnectionFailedError(f"{context}: the connection is closed ({type(exc).__name__})",
                                 reason="connection_lost")


def _settle_wait(conn: JetStreamConnection) -> float:
    """Seconds to wait for a leader while establishing what an interrupted batch stored."""
    return max(conn.settings.leader_wait, _SETTLE_WAIT_MIN)


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
    """How many of ``items`` (an in-order prefix) the stream holds after seq ``after``, the sequence of
    the last of them (None when none), and the stream's last sequence read. Messages of other
    publishers in between are skipped. Waits for a leader (:func:`_settle_wait`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _settle_wait(conn)
    pause = _RESUME_PAUSE_FIRST
    while True:
        try:
            return await _read_and_count(conn, stream, after, items)
        except LeaderUnavailableError:
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, _RESUME_PAUSE_MAX)


async def _read_and_count(conn: JetStreamConnection, stream: str, after: int,
                          items: Sequence[BatchMessage]) -> tuple[int, int | None, int]:
    info = await conn.api_request(f"STREAM.INFO.{stream}", context=f"stream {stream!r}")
    retention = info["config"].get("retention", "limits")
    if retention != "limits":
        raise JetStreamError(f"stream {stream!r} has {retention} retention: its messages may be consumed before "
                             "they can be counted", reason="stored_unknown")
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


def _prepare(messages: list[BatchMessage]) -> list[_Prepared]:
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
    timeout = to_seconds(timeout, field="timeout") if timeout else conn.settings.request_timeout
    frames = _prepare(items)
    started = time.monotonic()
    stream, mark = await _stream_and_last_seq(conn, items[0].subject, batch_id)
    total = len(frames)
    stored = 0
    resumes = gap_resumes = 0
    pause = _RESUME_PAUSE_FIRST
    own_last: int | None = None  # stream seq of the last of these messages known stored
    duplicates = 0
    current_id = batch_id
    loop = asyncio.get_running_loop()
    interrupted_since: float | None = None
    while True:
        run = _FastBatchRun(conn, frames[stored:], current_id, flow, timeout)
        try:
            ack = await run.run()
        except _Interrupted as stop:
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
                        run.context, stop.cause.reason, stored, total, how, pause)
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
                    run_dups, _ = await _duplicates(conn, stream, run_items, mark)
                    duplicates += run_dups
            elif count:
                # the last message was a duplicate (the ack's seq is 0): find where the stream holds them
                run_dups, own_last = await _duplicates(conn, stream, items[stored:stored + count], mark)
                duplicates += run_dups
            mark = max(mark, own_last or 0)
            stored += count
            interrupted_since = None
            errors = run.state.errors
            if run.state.gaps:
                # Messages sent after the gap ended the batch are answered "unknown batch": expected.
                errors = [e for e in errors if e[1].get("err_code") != _ERR_BATCH_UNKNOWN]
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
                        run.context, run.state.gaps, stored, total, pause)
        resumes += 1
        metrics.incr("fast_batch.resumed")
        await asyncio.sleep(pause)
        pause = min(pause * 2, _RESUME_PAUSE_MAX)
        current_id = f"{batch_id}-r{resumes % 100}"  # ids of closed batches may be reused
    metrics.incr("fast_batch.committed")
    metrics.incr("fast_batch.messages", stored)
    metrics.timing("fast_batch.commit_ms", (time.monotonic() - started) * 1000.0)
    if own_last is None:
        raise _failed(JetStreamError(f"fast batch {batch_id}: the server did not say where its messages are stored",
                                     reason="stored_unknown"), stream, stored, total, unknown_after=mark)
    return BatchResult(stream=stream, batch=batch_id, count=stored, first_seq=None, last_seq=own_last,
                       duplicates=duplicates)


async def _duplicates(conn: JetStreamConnection, stream: str, run: Sequence[BatchMessage],
                      mark: int) -> tuple[int, int | None]:
    """For a run the server skipped some messages of as duplicates: how many of its messages were
    stored at or before seq ``mark`` (by msg id, probed without writing) and the sequence of its last
    one (None when its msg id is not in the duplicate window any more)."""
    seqs = await stored_sequences(conn, run, stream=stream)
    earlier = sum(1 for seq in seqs if seq is not None and seq <= mark)
    log.info("fast batch on stream %s: %d of %d message(s) were already stored (msg ids), the last at seq %s",
             stream, earlier, len(run), seqs[-1] if seqs else None)
    return earlier, seqs[-1] if seqs else None


async def _stream_and_last_seq(conn: JetStreamConnection, subject: str, batch_id: str) -> tuple[str, int]:
    """The stream capturing ``subject`` and its last sequence before the batch (where counting starts)."""
    streams = await streams_for_subject(conn, subject)
    if not streams:
        raise BatchPublishError(f"fast batch {batch_id}: no stream captures subject {subject!r}; create the "
                                "stream or fix the subject", reason="no_stream_for_subject")
    info = await conn.api_request(f"STREAM.INFO.{streams[0]}", context=f"stream {streams[0]!r}")
    return streams[0], int(info["state"]["last_seq"])


def _failed(error: JetStreamError, stream: str, stored: int, total: int, *,
            unknown_after: int | None = None) -> FastBatchError:
    """The error raised for a failed fast batch: the cause, and how many of its messages are stored."""
    if unknown_after is not None:
        return FastBatchError(
            f"{error.message}; {stored} message(s) of the fast batch are known to be stored, and how many more "
            f"could not be established: read stream {stream!r} after seq {unknown_after} before re-sending "
            "(or re-send with msg ids set, which the stream de-duplicates)",
            stored=None, total=total, stream=stream, reason=error.reason, code=error.code,
            err_code=error.err_code, description=error.description)
    return FastBatchError(
        f"{error.message}; the first {stored} of its {total} messages are stored in stream {stream!r} (fast "
        f"batches are not atomic): re-send messages {stored + 1}..{total}",
        stored=stored, total=total, stream=stream, reason=error.reason, code=error.code,
        err_code=error.err_code, description=error.description)
