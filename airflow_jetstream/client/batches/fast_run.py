"""One run of the fast batch protocol (one batch id): frames sent in flow windows, the server's flow acks,
gaps and errors, and, when a run is interrupted, closing it on the server to learn what it stored."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import nats.errors

from airflow_jetstream.client.batches.types import HEADER_STATUS
from airflow_jetstream.client.batches.wire import CONNECTION_ERRORS, connection_lost, encode_frame, write_frames
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import (
    JetStreamError,
    LeaderUnavailableError,
    RequestTimeoutError,
    error_from_api,
)
from airflow_jetstream.client.retry import Deadline, is_leader_unavailable, retry

# The op token of a reply subject: what the message does to the batch.
OP_START, OP_APPEND, OP_COMMIT, OP_PING = 0, 1, 2, 4
#: The server's err_code for a message of a batch it does not know (ended, or opened on another leader).
ERR_BATCH_UNKNOWN = 10208
# How many flow windows may be unacknowledged before the client waits for the server.
WINDOW_FLOWS = 4
# Every reply subject ends in this token: it marks a message as part of a fast batch.
_SUFFIX = b"$FI"
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


Prepared = tuple[bytes, bytes, bytes]  # subject, header lines, payload


class FastBatchRun:
    """Publishes one fast batch (one batch id) and returns the server's final PubAck."""

    def __init__(self, conn: JetStreamConnection, messages: list[Prepared], batch_id: str, flow: int,
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

    def _ping(self, seq: int) -> bytes:
        """A ping as batch message ``seq`` (on the subject of the last message sent): the server answers with its
        flow ack, or sees a gap and commits what it has."""
        return encode_frame(self.messages[max(self.sent, 1) - 1][0], self.reply_subject(seq, OP_PING), b"", b"")

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

    async def _wait_for_window(self) -> None:
        """Wait for a flow ack; after a silent timeout, ping once so the server resends it (or reports a gap)."""
        try:
            await self._wait_change("flow-control ack")
        except RequestTimeoutError:
            await write_frames(self.conn.nc, self._ping(self.sent))
            await self._wait_change("flow-control ack after a ping")

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
        except CONNECTION_ERRORS as exc:
            raise Interrupted(connection_lost(self.context, exc), None) from None
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
                await self._wait_for_window()
                continue
            await write_frames(nc, self.encode(self.sent + 1, limit))
            self.sent = limit
        if state.errors and not state.done.done():
            # Stop at the first error; a ping past the last persisted message makes the server
            # see the gap and commit what it has, so the final ack says how much is stored.
            await write_frames(nc, self._ping(self.sent))
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
        :func:`settle_wait`. Returns (count, stream seq of the last one stored).
        """
        nc = self.conn.nc
        state = self.state
        ping = self._ping(self.sent + 1)

        async def ask() -> tuple[int, int] | None:
            state.done = asyncio.get_running_loop().create_future()
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
            raise LeaderUnavailableError(f"{self.context}: no leader answered the ping that closes the batch")

        with contextlib.suppress(LeaderUnavailableError):
            return await retry(f"{self.context}: closing it", ask, transient=is_leader_unavailable, budget=None,
                               deadline=Deadline(settle_wait(self.conn)), logger=log)
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
