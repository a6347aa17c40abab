"""Fast (non-atomic) batch publish for bulk ingest (nats-server 2.14+, stream ``allow_batched``).

The batch control rides in the reply subject of every message (``<inbox>.<batch id>.<flow>.fail.<batch seq>.<op>.$FI``)
and the server answers there with flow acks, gaps, per-message errors and a final PubAck (docs/batch-publishing.md).
The client keeps at most ``WINDOW_FLOWS`` flow windows unacknowledged.

Messages are stored as they arrive: the batch runs in gap-fail mode, so what is stored is always an in-order prefix.
A lost message ends a run at the last persisted one; the rest goes out as a new run (up to ``max_resumes``). A
leader election interrupts a run: the client flushes and pings the batch past its end, so the server closes it and
says how many it stored, or, when no leader knows the batch any more, counts its messages in the stream after the
sequence noted before the batch; then it resumes for up to ``leader_wait``. Every failure is a
:class:`FastBatchError` whose ``stored`` is that server-derived count (None, saying so, when it is unknown).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import nats.errors

from airflow_jetstream.client import metrics, server_features
from airflow_jetstream.client.admin.streams import stream_info
from airflow_jetstream.client.batches.types import (
    HEADER_STATUS,
    MAX_BATCH_ID_LENGTH,
    BatchMessage,
    BatchResult,
    validate_batch_id,
    validate_messages,
)
from airflow_jetstream.client.batches.wire import (
    CONNECTION_ERRORS,
    capturing_stream,
    connection_lost,
    encode_frame,
    message_header_lines,
    reply_timeout,
    stored_difference,
    stored_sequences,
)
from airflow_jetstream.client.connection import JetStreamConnection
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
from airflow_jetstream.client.natspy_internals import write_raw
from airflow_jetstream.client.reading.stored import read_range
from airflow_jetstream.client.retry import ELECTION

# Messages between flow acks the client asks for. nats-server 2.15 caps the flow it grants at
# 500 / (fast batches open on the stream) and ramps up to it, so beyond 500 this only lets the
# client run further ahead before the first flow ack arrives.
DEFAULT_FLOW = 1000
MAX_FLOW = 65535
# Resumed batches get "-r<k>" appended to the id.
_RESUME_SUFFIX_ROOM = 4
# The op token of a reply subject: what the message does to the batch.
OP_START, OP_APPEND, OP_COMMIT, OP_PING = 0, 1, 2, 4
#: The server's err_code for a message of a batch it does not know (ended, or opened on another leader).
ERR_BATCH_UNKNOWN = 10208
# How many flow windows may be unacknowledged before the client waits for the server.
WINDOW_FLOWS = 4
# Establishing what an interrupted batch stored waits for a leader at least this long (seconds), also
# with a shorter leader_wait: the count is owed to the caller even when the publish is not retried.
_SETTLE_WAIT_MIN = 30.0
log = logging.getLogger(__name__)

Prepared = tuple[bytes, bytes, bytes]  # subject, header lines, payload


class FastBatchRun:
    """Publishes one run of a fast batch (one batch id) and returns the server's final PubAck; what the server told
    about it so far is kept on the run (flow acks, gaps, errors)."""

    def __init__(self, conn: JetStreamConnection, messages: list[Prepared], batch_id: str, flow: int,
                 timeout: float) -> None:
        self.conn = conn
        self.messages = messages
        self.timeout = timeout
        self.prefix = f"{conn.nc.new_inbox()}.{batch_id}"
        self.reply_base = f"{self.prefix}.{flow}.fail.".encode()
        self.context = f"fast batch {batch_id}"
        self.sent = 0
        self.acked = 0
        self.flow = flow
        self.answered = False
        self.unavailable = False
        #: The server's final answer (PubAck or error) once it came.
        self.final: dict[str, Any] | None = None
        self.gaps: list[tuple[int, int]] = []
        self.errors: list[tuple[int, dict[str, Any]]] = []
        self.changed = asyncio.Event()

    def _ping(self, seq: int) -> bytes:
        """A ping as batch message ``seq`` (on the subject of the last message sent): the server answers with its
        flow ack, or sees a gap and commits what it has."""
        reply = b"%b%d.%d.$FI" % (self.reply_base, seq, OP_PING)
        return encode_frame(self.messages[max(self.sent, 1) - 1][0], reply, b"", b"")

    def encode(self, first: int, last: int) -> bytes:
        """Frames for batch sequences ``first..last`` (1-based, inclusive); the final message commits."""
        total = len(self.messages)
        frames = []
        for seq in range(first, last + 1):
            subject, lines, payload = self.messages[seq - 1]
            op = OP_COMMIT if seq == total else (OP_START if seq == 1 else OP_APPEND)
            frames.append(encode_frame(subject, b"%b%d.%d.$FI" % (self.reply_base, seq, op), lines, payload))
        return b"".join(frames)

    async def _on_reply(self, msg: Any) -> None:
        if msg.headers and msg.headers.get(HEADER_STATUS) == "503":
            # no responders: the stream has no leader right now (checked to exist before the batch)
            self.unavailable = True
            self.changed.set()
            return
        try:
            reply = json.loads(msg.data) if msg.data else {}
        except ValueError:
            reply = {"type": "bad"}
        kind = reply.get("type") if isinstance(reply, dict) else "bad"
        first_answer = not self.answered
        self.answered = True
        if kind == "ack":
            self.acked = max(self.acked, int(reply.get("seq", 0)))
            self.flow = max(1, int(reply.get("msgs") or 1))
        elif kind == "gap":
            self.gaps.append((int(reply.get("last_seq", 0)), int(reply.get("seq", 0))))
        elif kind == "err":
            self.errors.append((int(reply.get("seq", 0)), reply.get("error") or {}))
        elif isinstance(reply, dict) and "error" in reply and "batch" not in reply and not first_answer:
            # A message refused before it reached the batch (e.g. over max_msg_size): the batch goes on.
            self.errors.append((0, reply["error"]))
        elif self.final is None:
            self.final = reply if isinstance(reply, dict) else {}
        self.changed.set()

    def ended(self) -> bool:
        """Whether the server gave its final answer or refused a message."""
        return self.final is not None or bool(self.errors)

    async def _wait(self, what: str, ready: Callable[[], bool]) -> None:
        """Wait at most ``timeout`` until ``ready()``: silence is :class:`RequestTimeoutError`, a 503
        :class:`LeaderUnavailableError`."""
        try:
            async with asyncio.timeout(self.timeout):
                while not (self.unavailable or ready()):
                    await self.changed.wait()
                    self.changed.clear()
        except TimeoutError:
            raise RequestTimeoutError(f"{self.context}: no {what} from the server within {self.timeout}s; the "
                                      f"messages up to the last flow ack ({self.acked}) are stored") from None
        if self.unavailable and not ready():
            raise LeaderUnavailableError(f"{self.context}: the stream has no leader (no responders)")

    async def run(self) -> dict[str, Any]:
        """The server's final answer; an interrupted batch raises :class:`Interrupted` with what it stored."""
        nc = self.conn.nc
        try:
            sub = await nc.subscribe(f"{self.prefix}.>", cb=self._on_reply)
        except CONNECTION_ERRORS as exc:
            raise Interrupted(connection_lost(self.context, exc), (0, 0)) from None
        try:
            try:
                ack = await self._send()
            except (LeaderUnavailableError, RequestTimeoutError) as exc:
                raise Interrupted(exc, await self._settle()) from None
            error = ack.get("error") if isinstance(ack.get("error"), dict) else None
            if error and error.get("err_code") == ERR_BATCH_UNKNOWN and self.sent > 1:
                # a new leader does not know the batch: what the old one stored is counted in the stream
                raise Interrupted(error_from_api(error, context=self.context), None)
            return ack
        except (*CONNECTION_ERRORS, ConnectionFailedError) as exc:  # nats-py's, or write_raw's on a closed one
            raise Interrupted(connection_lost(self.context, exc), None) from None
        finally:
            if not nc.is_closed:
                await sub.unsubscribe()

    async def _send(self) -> dict[str, Any]:
        nc = self.conn.nc
        total = len(self.messages)
        self.sent = 1
        await write_raw(nc, self.encode(1, 1))
        # The first answer is the flow ack for seq 0 (batch started) or a PubAck / error.
        await self._wait("start ack", lambda: self.answered)

        def window() -> int:
            return min(total, self.acked + WINDOW_FLOWS * self.flow)

        def window_open() -> bool:
            return window() > self.sent or self.ended()

        while self.sent < total and not self.ended():
            if window() <= self.sent:
                try:
                    await self._wait("flow-control ack", window_open)
                except RequestTimeoutError:  # ping once, so the server resends its flow ack (or reports a gap)
                    await write_raw(nc, self._ping(self.sent))
                    await self._wait("flow-control ack after a ping", window_open)
                continue
            limit = window()
            await write_raw(nc, self.encode(self.sent + 1, limit))
            self.sent = limit
        if self.errors and self.final is None:
            # Stop at the first error; a ping past the last persisted message makes the server
            # see the gap and commit what it has, so the final ack says how much is stored.
            await write_raw(nc, self._ping(self.sent))
        await self._wait("final ack", lambda: self.final is not None)
        return self.final or {}

    async def _settle(self) -> tuple[int, int] | None:
        """Close the interrupted batch on the server and return (count, stream seq of the last one) it stored.

        First a flush, so no frame of this batch is still on its way (nothing can open or extend it later); then a
        ping past the last message sent: a leader that knows the batch sees the gap, commits what it has and
        answers the exact count. None when no leader knows the batch (the caller then counts in the stream) or
        none answered in :func:`settle_wait`.
        """
        nc = self.conn.nc
        ping = self._ping(self.sent + 1)

        async def ask() -> tuple[int, int] | None:
            self.final, self.unavailable, self.answered = None, False, True
            self.errors.clear()
            self.changed.clear()
            try:
                await nc.flush(timeout=self.timeout)  # type: ignore[arg-type]  # float s work
                await write_raw(nc, ping)
                await self._wait("answer to the closing ping", self.ended)
            except (RequestTimeoutError, nats.errors.TimeoutError):
                raise LeaderUnavailableError(f"{self.context}: no leader answered the ping that closes the "
                                             "batch") from None
            ack: dict[str, Any] = {} if self.errors else self.final or {}
            return (int(ack["count"]), int(ack.get("seq") or 0)) if "error" not in ack and "count" in ack else None

        with contextlib.suppress(LeaderUnavailableError):
            return await self.conn.retry_leader(f"{self.context}: closing it", ask, wait=settle_wait(self.conn),
                                                logger=log)
        return None


class Interrupted(Exception):
    """A run stopped without a final ack: ``cause`` and the server's (count, last seq) of what it stored
    (None: no leader knows the batch any more, count its messages in the stream)."""

    def __init__(self, cause: JetStreamError, settled: tuple[int, int] | None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.settled = settled


def settle_wait(conn: JetStreamConnection) -> float:
    """Seconds to wait for a leader while establishing what an interrupted batch stored."""
    return max(conn.settings.leader_wait, _SETTLE_WAIT_MIN)


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

    Not atomic: messages are stored as they arrive, other publishers may interleave (so ``first_seq`` is None),
    and duplicates by msg id are skipped by the server but counted in ``count``. ``duplicates`` says how many were
    stored before: the msg ids are probed without writing when the last message was such a duplicate (the server
    acks seq 0) or when the stream grew by fewer messages than ``count``; so it can only miss duplicates when other
    publishers wrote to the stream during the batch. Validation happens before anything is sent.

    :param flow: how many messages the server may persist between flow acks (it starts at
        min(500, flow) and adapts when other fast batches run).
    :param timeout: seconds to wait for each server answer (default: the connection's request timeout).
    :param max_resumes: how often a gap (lost message) is healed by resending the rest as a new batch.
    """
    items = validate_messages(messages, mode="fast", max_msgs=None, max_payload=conn.nc.max_payload)
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
    frames = [(m.subject.encode(), message_header_lines(m), bytes(m.data)) for m in items]
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
            cause, how = stop.cause, "the server's count"
            if stop.settled is not None:
                accepted, last = stop.settled
                mark = max(mark, last)
                own_last = last if accepted and last else own_last
            elif isinstance(cause, ConnectionFailedError):
                raise _failed(cause, stream, stored, total, unknown_after=mark) from None
            else:
                how = "counted in the stream"
                try:
                    accepted, found_last, mark = await _count_in_stream(conn, stream, mark, items[stored:])
                except JetStreamError as exc:
                    raise _failed(exc, stream, stored, total, unknown_after=mark) from None
                own_last = found_last or own_last
            now = loop.time()
            interrupted_since = now if accepted or interrupted_since is None else interrupted_since
            gave_up = now - interrupted_since >= conn.settings.leader_wait
        else:
            if "error" in ack:
                raise _failed(error_from_api(ack["error"], context=run.context), stream, stored, total)
            stream = str(ack.get("stream", stream))
            accepted = int(ack.get("count") or 0)
            seq = int(ack.get("seq") or 0)
            run_items = items[stored:stored + accepted]
            # The last message was a duplicate (the ack's seq is 0), or the stream grew by fewer messages than the
            # server accepted: some were stored before, found by their msg ids (and, for seq 0, where the last is).
            if accepted and (not seq or accepted > seq - mark) and any(m.msg_id for m in run_items):
                # probed without writing (None: not stored, or no longer in the duplicate window); the messages are
                # stored, so a failed probe leaves only the count of duplicates unknown
                probes = f"{run.context}: the msg id probes counting its duplicates failed after the server stored it: "
                try:
                    seqs = await stored_sequences(conn, run_items, stream=stream)
                except CONNECTION_ERRORS as exc:
                    raise _failed(connection_lost("msg id probes", exc), stream, stored + accepted, total,
                                  what=probes) from exc
                except JetStreamError as exc:
                    raise _failed(exc, stream, stored + accepted, total, what=probes) from exc
                run_dups = sum(1 for s in seqs if s is not None and s <= mark)
                log.info("fast batch on stream %s: %d of %d message(s) were already stored (msg ids), the last at "
                         "seq %s", stream, run_dups, len(run_items), seqs[-1])
                duplicates += run_dups
                own_last = seq or seqs[-1]
            elif seq:
                own_last = seq
            mark = max(mark, own_last or 0)
            interrupted_since = None
            errors = run.errors
            if run.gaps:
                # Messages sent after the gap ended the batch are answered "unknown batch": expected.
                errors = [e for e in errors if e[1].get("err_code") != ERR_BATCH_UNKNOWN]
            if errors and stored + accepted < total:
                _seq, error = min(errors, key=lambda e: e[0])
                raise _failed(error_from_api(error, context=f"{run.context}: message {stored + accepted + 1}"),
                              stream, stored + accepted, total)
            how = f"the server saw gaps {run.gaps}"
            cause = BatchPublishError(f"{run.context}: {how}; gave up after {max_resumes} resumes", reason="batch_gap")
            gap_resumes += 1
            gave_up = gap_resumes > max_resumes
        stored += accepted
        if stored >= total:
            break
        if gave_up:
            raise _failed(cause, stream, stored, total) from None
        resumes += 1
        log.warning("%s interrupted (%s): %d of %d messages stored (%s); resuming the rest in %.2f s",
                    run.context, cause.reason, stored, total, how, ELECTION.pause(resumes))
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
            unknown_after: int | None = None, what: str = "") -> FastBatchError:
    """The error raised for a failed fast batch: the cause (``what`` failed, when not the publish itself: ``error``),
    and how many of its messages are stored."""
    if unknown_after is not None:
        how_many = (f"{stored} message(s) of the fast batch are known to be stored, and how many more could not be "
                    f"established: read stream {stream!r} after seq {unknown_after} before re-sending (or re-send "
                    "with msg ids set, which the stream de-duplicates)")
    else:
        how_many = (f"the first {stored} of its {total} messages are stored in stream {stream!r} (fast batches are "
                    "not atomic)" + (f": re-send messages {stored + 1}..{total}" if stored < total else ""))
    return FastBatchError(f"{what}{error.message}; {how_many}", stored=None if unknown_after is not None else stored,
                          total=total, stream=stream, reason=error.reason, code=error.code, err_code=error.err_code,
                          description=error.description)


async def _count_in_stream(conn: JetStreamConnection, stream: str, after: int,
                           items: Sequence[BatchMessage]) -> tuple[int, int | None, int]:
    """What a fast batch stored when the server cannot say, counted by reading the stream back: how many of
    ``items`` (an in-order prefix) the stream holds after seq ``after``, the sequence of the last of them (None
    when none), and the stream's last sequence read. Messages of other publishers in between are skipped.
    Waits for a leader (:func:`settle_wait`)."""

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
            for subject, seq, _, headers, data in chunk:
                if found < len(items) and stored_difference(items[found], subject, data, headers, found) is None:
                    found += 1
                    found_last = seq
        return found, found_last, last

    return await conn.retry_leader(f"counting a fast batch in stream {stream!r}", count, wait=settle_wait(conn),
                                   logger=log)
