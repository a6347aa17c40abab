"""Fast (non-atomic) batch publish for bulk ingest (nats-server 2.14+, stream ``allow_batched``).

The batch control rides in the reply subject of every message::

    <inbox>.<batch id>.<flow>.fail.<batch seq>.<op>.$FI     op: 0 start, 1 append, 2 commit, 4 ping

and the server answers on those reply subjects: flow acks ``{"type":"ack","seq":S,"msgs":F}``
("persisted up to S, next ack after F more"), gaps ``{"type":"gap","last_seq":L,"seq":S}``,
per-message errors ``{"type":"err","seq":S,"error":{...}}`` and, at the end, a PubAck with
``batch`` and ``count``. The client keeps at most ``WINDOW_FLOWS`` flow windows unacknowledged.

Messages are stored as they arrive (no all-or-nothing): the batch runs in gap-fail mode, so a lost
message ends the batch at the last persisted one and the server commits what it has. A gap is
then healed by publishing the rest as a new batch (up to ``max_resumes`` times); a server error on
a message ends the batch and is raised with how many messages were stored before it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import nats.errors

from airflow_jetstream.client import metrics
from airflow_jetstream.client.batches.types import (
    HEADER_BATCH_COMMIT,
    HEADER_BATCH_ID,
    HEADER_BATCH_SEQUENCE,
    MAX_BATCH_ID_LENGTH,
    BatchMessage,
    BatchResult,
    encode_frame,
    message_header_lines,
    validate_batch_id,
    validate_messages,
    write_frames,
)
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import (
    BatchPublishError,
    ConnectionFailedError,
    InvalidRequestError,
    RequestTimeoutError,
    error_from_api,
)

FAST_REFUSED_HEADERS = {
    HEADER_BATCH_ID.lower(): "batch headers belong to atomic batches; the fast batch protocol uses reply subjects",
    HEADER_BATCH_SEQUENCE.lower(): "batch headers belong to atomic batches",
    HEADER_BATCH_COMMIT.lower(): "batch headers belong to atomic batches",
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


@dataclass
class _BatchState:
    """What the server has told us about one fast batch."""

    acked: int = 0
    flow: int = 1
    answered: bool = False
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
        try:
            async with asyncio.timeout(self.timeout):
                await state.changed.wait()
        except TimeoutError:
            raise RequestTimeoutError(f"{self.context}: no {what} from the server within {self.timeout}s; the "
                                      f"messages up to the last flow ack ({state.acked}) are stored") from None
        state.changed.clear()

    async def _wait_for_window(self, sent: int) -> None:
        """Wait for a flow ack; after a silent timeout, ping once so the server resends it (or reports a gap)."""
        try:
            await self._wait_change("flow-control ack")
        except RequestTimeoutError:
            subject = self.messages[sent - 1][0]
            await write_frames(self.conn.nc, encode_frame(subject, self.reply_subject(sent, OP_PING), b"", b""))
            await self._wait_change("flow-control ack after a ping")

    async def run(self) -> dict[str, Any]:
        nc = self.conn.nc
        state = self.state
        state.done = asyncio.get_running_loop().create_future()
        sub = await nc.subscribe(f"{self.prefix}.>", cb=self._on_reply)
        try:
            total = len(self.messages)
            await write_frames(nc, self.encode(1, 1))
            # The first answer is the flow ack for seq 0 (batch started) or a PubAck / error.
            while not state.answered:
                await self._wait_change("start ack")
            sent = 1
            while sent < total and not state.done.done() and not state.errors:
                limit = min(total, state.acked + WINDOW_FLOWS * state.flow)
                if limit <= sent:
                    await self._wait_for_window(sent)
                    continue
                await write_frames(nc, self.encode(sent + 1, limit))
                sent = limit
            if state.errors and not state.done.done():
                # Stop at the first error; a ping past the last persisted message makes the server
                # see the gap and commit what it has, so the final ack says how much is stored.
                await write_frames(nc, encode_frame(self.messages[sent - 1][0],
                                                    self.reply_subject(sent, OP_PING), b"", b""))
            try:
                async with asyncio.timeout(self.timeout):
                    return await asyncio.shield(state.done)
            except TimeoutError:
                raise RequestTimeoutError(f"{self.context}: no final ack within {self.timeout}s; the messages "
                                          f"up to the last flow ack ({state.acked}) are stored") from None
        except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError,
                nats.errors.OutboundBufferLimitError) as exc:
            raise ConnectionFailedError(f"{self.context}: the connection was lost ({type(exc).__name__}); "
                                        f"about {state.acked} messages are stored", reason="connection_lost") from None
        finally:
            if not nc.is_closed:
                await sub.unsubscribe()


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
    (``count`` is the number of messages the server accepted into the batch). The stream needs
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
    timeout = timeout or conn.settings.request_timeout
    frames = _prepare(items)
    started = time.monotonic()
    stored = 0
    resumes = 0
    stream = ""
    last_seq = 0
    current_id = batch_id
    while True:
        run = _FastBatchRun(conn, frames[stored:], current_id, flow, timeout)
        ack = await run.run()
        if "error" in ack:
            raise _with_progress(error_from_api(ack["error"], context=run.context), stored)
        stream = str(ack.get("stream", stream))
        last_seq = int(ack.get("seq") or last_seq)
        accepted = int(ack.get("count") or 0)
        stored += accepted
        errors = run.state.errors
        if run.state.gaps:
            # Messages sent after the gap ended the batch are answered "unknown batch": expected.
            errors = [e for e in errors if e[1].get("err_code") != _ERR_BATCH_UNKNOWN]
        if errors and stored < len(frames):
            _seq, error = min(errors, key=lambda e: e[0])
            raise _with_progress(error_from_api(error, context=f"{run.context}: message {stored + 1}"), stored)
        if stored >= len(frames):
            break
        if resumes >= max_resumes:
            raise BatchPublishError(
                f"{run.context}: the server saw gaps {run.state.gaps} and committed {stored} of {len(frames)} "
                f"messages; gave up after {resumes} resumes. Re-send messages {stored + 1}..{len(frames)}",
                reason="batch_gap",
            )
        resumes += 1
        metrics.incr("fast_batch.resumed")
        current_id = f"{batch_id}-r{resumes}"
    metrics.incr("fast_batch.committed")
    metrics.incr("fast_batch.messages", stored)
    metrics.timing("fast_batch.commit_ms", (time.monotonic() - started) * 1000.0)
    return BatchResult(stream=stream, batch=batch_id, count=stored, first_seq=None, last_seq=last_seq)


def _with_progress(error: Any, stored: int) -> BatchPublishError:
    """The server's error, saying how many messages of this (non-atomic) batch were stored before it."""
    return BatchPublishError(
        f"{error.message}; {stored} message(s) of the fast batch were stored before the failure "
        f"(fast batches are not atomic)",
        reason=error.reason, code=error.code, err_code=error.err_code, description=error.description,
    )
