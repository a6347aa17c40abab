"""Batcher: coalesce many single publishes into batches, each caller getting its own result (docs/batch-publishing.md).

Concurrent ``await batcher.publish(subject, data, msg_id=...)`` calls are grouped by size (``max_batch``) and time
(``flush_interval``; by default a group goes out as soon as the previous one is answered, so groups grow with the
load), each group in one write: far cheaper than one round trip per message. Items have no cross-item atomicity;
each gets its own result and machine-readable error, in submission order.

Fenced by default: every item needs a msg id and is stored at most once however late it is published again. Each
group is one atomic batch in which every item is followed by its write fence (:mod:`~airflow_jetstream.client.
batches.atomic`, fence id = msg id), checked by the server at commit; a refused group is resolved item by item, an
item stored before answered ``duplicate`` with its seq. ``fence=False`` is the explicit opt-out: pipelined
acknowledged publishes (or, with ``atomic=True``, one atomic batch per group, re-sent item by item when refused),
msg ids then de-duplicating only within the stream's ``duplicate_window``.

Individual publishes ride out a leader election for ``leader_wait``, re-sent only where that cannot store an item
twice (see :func:`~airflow_jetstream.client.batches.wire.publish_acked`). Every item has its own deadline,
``leader_wait`` after it was submitted: retries of a group end at its oldest item's, however long the groups before
it kept failing. An item whose caller was cancelled after submitting is still published, so cancellation never
loses an accepted item.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from airflow_jetstream.client import metrics, server_features
from airflow_jetstream.client.batches.atomic import fence_message, publish_atomic_batch, publish_fenced_batch
from airflow_jetstream.client.batches.publish_chunks import check_target_stream
from airflow_jetstream.client.batches.types import (
    DEFAULT_MAX_BATCH_MSGS,
    BatchItemResult,
    BatchMessage,
    validate_messages,
)
from airflow_jetstream.client.batches.wire import (
    BatchReplies,
    capturing_stream,
    publish_acked,
    reply_timeout,
)
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import (
    ConnectionFailedError,
    InvalidRequestError,
    JetStreamError,
    LeaderUnavailableError,
    RequestTimeoutError,
)
from airflow_jetstream.client.retry import Deadline

log = logging.getLogger(__name__)
DEFAULT_MAX_BATCH = 256
DEFAULT_FLUSH_INTERVAL = 0.0
DEFAULT_MAX_PENDING = 10_000
#: Most items of one fenced atomic batch: each item and its fence fill the server's default max_msgs (1000).
FENCED_GROUP = DEFAULT_MAX_BATCH_MSGS // 2
# Errors after which the outcome of a group is unknown: re-sending could store items twice.
_OUTCOME_UNKNOWN = (RequestTimeoutError, ConnectionFailedError)


@dataclass
class _Item:
    message: BatchMessage
    future: asyncio.Future[BatchItemResult]
    #: Retries of this item end by then (``leader_wait`` after it was submitted), however long it queued.
    deadline: Deadline


class Batcher:
    """Coalesces single publishes into batches (see the module docstring).

    :param max_batch: most items per batch (at most the server's atomic ``max_msgs``, 1000 by default).
    :param flush_interval: seconds to wait for more items once the first one of a batch arrived. With 0 (the
        default) a group goes out as soon as the previous one is answered; one group is in flight at a time.
    :param max_pending: items accepted but not yet answered; ``publish`` waits beyond this (back-pressure).
    :param atomic: with ``fence=False``, send groups as atomic batches (needs ``allow_atomic``; falls back to
        individual publishes by itself when the stream refuses). Default: pipelined individual publishes.
    :param timeout: seconds to wait for each server reply (default: the connection's request timeout).
    :param fence: True (the default): every item needs a msg id and is fenced by it; False: the explicit opt-out.
    """

    def __init__(
        self,
        conn: JetStreamConnection,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        max_pending: int = DEFAULT_MAX_PENDING,
        atomic: bool = False,
        timeout: float | None = None,
        fence: bool = True,
    ) -> None:
        if not isinstance(max_batch, int) or max_batch < 1:
            raise InvalidRequestError(f"max_batch must be an int >= 1, got {max_batch!r}", reason="invalid_request")
        flush_interval = to_seconds(flush_interval, field="flush_interval")
        if not isinstance(max_pending, int) or max_pending < max_batch:
            raise InvalidRequestError("max_pending must be an int >= max_batch", reason="invalid_request")
        if atomic or fence:
            server_features.require(conn, server_features.ATOMIC_BATCH,
                                    what="Batcher(atomic=True)" if atomic else "Batcher (fenced by default)")
        self.fence = fence
        #: Whether the opt-out's warning was logged (once per batcher, at the first item with a msg id).
        self._warned_unfenced = False
        #: The checked stream of each subject a fenced item went to.
        self._fence_streams: dict[str, str] = {}
        self.conn = conn
        self.max_batch = max_batch
        self.flush_interval = flush_interval
        self.atomic = atomic
        self.timeout = reply_timeout(conn, timeout)
        self._queue: list[_Item] = []
        self._has_items = asyncio.Event()
        self._batch_full = asyncio.Event()
        self._slots = asyncio.Semaphore(max_pending)
        self._closing = False
        self._runner: asyncio.Task[None] | None = None
        # One reply inbox for every group: a subscription per group would cost a SUB/UNSUB and a
        # nats-py reader task each time, which dominates small groups.
        self._replies: BatchReplies | None = None
        #: Set while the last group gave up on a leaderless stream: what queued items past their deadline get.
        self._leaderless: LeaderUnavailableError | None = None

    async def __aenter__(self) -> Batcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def publish(
        self,
        subject: str,
        data: bytes,
        *,
        headers: dict[str, str] | dict[str, str | list[str]] | None = None,
        msg_id: str | None = None,
        expected_last_subject_seq: int | None = None,
    ) -> BatchItemResult:
        """Queue one message and wait for its own result (never raises for item-level failures)."""
        message = BatchMessage(subject, data, headers, msg_id, expected_last_subject_seq)
        try:
            self._check(message)
        except JetStreamError as exc:
            return BatchItemResult.failed(exc)
        return await (await self._enqueue(message))

    async def submit(self, message: BatchMessage) -> asyncio.Future[BatchItemResult]:
        """Queue ``message`` and return the future of its result (for callers that gather themselves).

        Raises the typed validation error at once instead of queueing an invalid message.
        """
        self._check(message)
        return await self._enqueue(message)

    async def _enqueue(self, message: BatchMessage) -> asyncio.Future[BatchItemResult]:
        if self._closing:
            raise InvalidRequestError("the batcher is closed; open a new one", reason="batcher_closed")
        await self._slots.acquire()
        future: asyncio.Future[BatchItemResult] = asyncio.get_running_loop().create_future()
        self._queue.append(_Item(message, future, Deadline(self.conn.settings.leader_wait)))
        self._has_items.set()
        if len(self._queue) >= self.max_batch:
            self._batch_full.set()
        if self._runner is None:
            self._runner = asyncio.ensure_future(self._run())
        return future

    def _check(self, message: BatchMessage) -> None:
        validate_messages([message], mode="atomic" if self.atomic or self.fence else "fast",
                          max_msgs=None, max_payload=self.conn.nc.max_payload, reserved_header_bytes=256)
        if self.fence and not message.msg_id:
            raise InvalidRequestError(
                f"publish to {message.subject!r} has no msg_id: the Batcher fences each item by its msg id, so that "
                "a retry or re-run stores it at most once; give every item a msg_id, or open the Batcher with "
                "fence=False to publish without ids (nothing then keeps a re-published item from being stored "
                "twice)", reason="invalid_msg_id")
        if not self.fence and message.msg_id and not self._warned_unfenced:
            self._warned_unfenced = True
            log.warning("Batcher(fence=False): msg ids such as %r de-duplicate only within the stream's "
                        "duplicate_window; a retry or re-run after it stores the item again (the default fence=True "
                        "stores it once at any later time)", message.msg_id)

    async def close(self) -> None:
        """Publish everything still pending, then stop. Idempotent."""
        self._closing = True
        self._has_items.set()
        self._batch_full.set()
        if self._runner is not None:
            await asyncio.shield(self._runner)
        if self._replies is not None:
            await self._replies.close()
            self._replies = None

    async def _run(self) -> None:
        while True:
            await self._has_items.wait()
            if not self._queue:
                if self._closing:
                    return
                self._has_items.clear()
                continue
            if len(self._queue) < self.max_batch and not self._closing and self.flush_interval:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.flush_interval):
                        await self._batch_full.wait()
            group = self._queue[: self.max_batch]
            del self._queue[: self.max_batch]
            if len(self._queue) < self.max_batch and not self._closing:
                self._batch_full.clear()
            await self._publish_group(group)

    async def _publish_group(self, group: list[_Item]) -> None:
        metrics.gauge("batcher.batch_size", len(group))
        if self._leaderless is not None:  # the group before gave up: items already past their deadline are not sent
            expired = [item for item in group if item.deadline.left() <= 0]
            if expired:
                self._answer(expired, [BatchItemResult.failed(self._leaderless)] * len(expired))
                group = [item for item in group if item.deadline.left() > 0]
                if not group:
                    return
        try:
            results = await self._send(group, min((item.deadline for item in group), key=lambda d: d.at))
        except JetStreamError as exc:
            results = [BatchItemResult.failed(exc)] * len(group)
        gave_up = next((r for r in results if r.error == "leader_unavailable"), None)
        self._leaderless = None if gave_up is None or any(r.ok for r in results) else LeaderUnavailableError(
            f"not sent: its stream had no leader for the item's whole leader_wait "
            f"({self.conn.settings.leader_wait:g}s since it was submitted; the items before it failed with: "
            f"{gave_up.message}); nothing of it was stored")
        self._answer(group, results)

    def _answer(self, group: list[_Item], results: list[BatchItemResult]) -> None:
        for item, result in zip(group, results, strict=True):
            # A caller cancelled while waiting has a cancelled future: its item was still published.
            if not item.future.done():
                item.future.set_result(result)
            self._slots.release()

    async def _send(self, group: list[_Item], deadline: Deadline) -> list[BatchItemResult]:
        """Publish ``group``, retrying until ``deadline`` (its oldest item's), so no item waits past its own."""
        messages = [item.message for item in group]
        if self.fence:
            return await self._send_fenced(messages, deadline)
        if self.atomic and len(messages) > 1:
            results = await self._as_one_batch(messages, deadline)
            if results is not None:
                return results
        if self._replies is None:
            self._replies = await BatchReplies(self.conn, self.timeout, "publish").open()
        return await publish_acked(self.conn, messages, self.timeout, deadline=deadline, replies=self._replies)

    async def _as_one_batch(self, messages: list[BatchMessage], deadline: Deadline,
                            fenced: bool = False) -> list[BatchItemResult] | None:
        """The group as one atomic batch (``fenced``: each item followed by its fence), or None when the server
        refused it or found it committed earlier, so that its items go out one by one and errors stay per item.
        An unknown outcome of an unfenced group with items without msg ids is raised: a re-send could store them
        twice."""
        try:
            batch = await publish_atomic_batch(self.conn, messages, max_msgs=len(messages), timeout=self.timeout,
                                               deadline=deadline)
        except JetStreamError as exc:
            unknown = isinstance(exc, _OUTCOME_UNKNOWN) and not fenced
            if unknown and not all(m.msg_id for m in messages):
                raise
            if exc.reason == "stream_not_atomic":
                self.atomic = False
            metrics.incr("batcher.resent_individually", tags={"reason": "outcome_unknown" if unknown else exc.reason})
            return None
        if batch.already_committed or batch.first_seq is None:
            return None
        step = 2 if fenced else 1
        return [BatchItemResult(stream=batch.stream, seq=batch.first_seq + step * i)
                for i in range(len(messages) // step)]

    async def _fence_stream(self, subject: str) -> str:
        """The stream of ``subject``, checked once for fenced atomic batches (``no_stream_for_subject``,
        ``stream_not_atomic``, ``stream_not_fenced``)."""
        if subject not in self._fence_streams:
            stream = await capturing_stream(self.conn, subject, "")
            await check_target_stream(self.conn, stream, [subject], mode="atomic", fence=True)
            self._fence_streams[subject] = stream
        return self._fence_streams[subject]

    async def _send_fenced(self, messages: list[BatchMessage], deadline: Deadline) -> list[BatchItemResult]:
        """Each stream's items as atomic batches of up to :data:`FENCED_GROUP` items, each followed by its fence.

        An item whose stream cannot take fenced batches fails alone, before anything of it is sent."""
        results: dict[int, BatchItemResult] = {}
        by_stream: dict[str, list[int]] = {}
        for index, msg in enumerate(messages):
            try:
                by_stream.setdefault(await self._fence_stream(msg.subject), []).append(index)
            except JetStreamError as exc:
                results[index] = BatchItemResult.failed(exc)
        for stream, indexes in by_stream.items():
            for start in range(0, len(indexes), FENCED_GROUP):
                part = indexes[start:start + FENCED_GROUP]
                sent = await self._send_fenced_group(stream, [messages[i] for i in part], deadline)
                for index, result in zip(part, sent, strict=True):
                    results[index] = result
        return [results[index] for index in range(len(messages))]

    async def _send_fenced_group(self, stream: str, messages: list[BatchMessage],
                                 deadline: Deadline) -> list[BatchItemResult]:
        """``messages`` (all to ``stream``) as one atomic batch, each followed by its fence; when the server refuses
        it (an item was stored before, or an item is bad) or its outcome is unknown, item by item, each its own
        fenced batch, which answers an item stored before as a ``duplicate`` with its seq."""
        if len(messages) > 1:
            fenced = [part for m in messages for part in (m, fence_message(stream, str(m.msg_id), [m]))]
            results = await self._as_one_batch(fenced, deadline, fenced=True)
            if results is not None:
                return results

        async def one(msg: BatchMessage) -> BatchItemResult:
            try:
                # its stream was checked for fences (_fence_stream): not again per item
                result = await publish_fenced_batch(self.conn, [msg], stream=stream, fence_id=str(msg.msg_id),
                                                    timeout=self.timeout, deadline=deadline)
            except JetStreamError as exc:
                return BatchItemResult.failed(exc)
            return BatchItemResult(stream=result.stream, seq=result.last_seq, duplicate=result.already_committed)

        return list(await asyncio.gather(*(one(m) for m in messages)))
