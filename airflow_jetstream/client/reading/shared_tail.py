"""One subscription per stream per process, fanned out in process: what thousands of waiting tasks share.

A consumer per waiting trigger would count against the stream's ``max_consumers`` (1,000 when unset) and make
every start and end a consumer created and deleted. Here the waiters of one stream on one connection share one
**tail** (docs/performance.md): a push consumer of the new messages (flow control, idle heartbeats, no acks, in
memory, one replica, gone ``TAIL_INACTIVE`` s after its subscriber). Each waiter registers a subject filter and
gets the matching messages after :attr:`TailListener.since`; what it needs up to ``since`` it reads without a
consumer (:mod:`.stored`), so nothing between is lost or seen twice::

    async with follow(conn, "KV_models", "$KV.models.churn") as listener:
        current = await get_message(conn, "KV_models", subject="$KV.models.churn")   # up to listener.since
        while True:
            for message in await listener.next_batch():                            # after listener.since
                ...

A sequence gap, missed heartbeats or a deleted consumer make the tail subscribe again from the next sequence it
has not delivered. A stream that must not get a consumer (WorkQueue, Interest) or refused one for its consumer
limit is polled by direct get every ``POLL_INTERVAL`` s instead. The last waiter to leave deletes the consumer.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from airflow_jetstream.client import metrics
from airflow_jetstream.client.admin.streams import stream_info
from airflow_jetstream.client.batches.types import HEADER_STATUS
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.connection_pool import Shared
from airflow_jetstream.client.errors import (
    ConnectionFailedError,
    JetStreamError,
    LimitReachedError,
    RequestTimeoutError,
)
from airflow_jetstream.client.reading.listener_index import KeyOf, ListenerIndex
from airflow_jetstream.client.reading.messages import Message
from airflow_jetstream.client.reading.stored import BATCH, messages_of, read_range
from airflow_jetstream.client.retry import Backoff, retry
from airflow_jetstream.client.subjects import validate_name, validate_subject

#: Seconds between the server's idle heartbeats on a tail; three missed ones mean it stalled.
TAIL_HEARTBEAT = 2.0
TAIL_STALLED = 3 * TAIL_HEARTBEAT
#: Seconds the server keeps a tail's consumer once nobody subscribes to it (a triggerer that died).
TAIL_INACTIVE = 5.0
#: Seconds the last waiter waits for its tail's consumer to be deleted (else the server drops it after TAIL_INACTIVE).
DELETE_WAIT = 2.0
#: Seconds between reads of a stream that is polled instead (each pause drawn from 0.8-1.2x: polls spread out).
POLL_INTERVAL = 1.0
#: Pauses between attempts to subscribe again after a transient failure.
RESUBSCRIBE_BACKOFF = Backoff(0.5, 10.0, jitter=True)
#: Waiters of one tail that read what was stored before they joined at the same time (the rest queue): thousands of
#: triggers starting together (a triggerer restart) do not put thousands of replies on the event loop at once.
CATCH_UP_AT_ONCE = 32
#: Seconds of dispatching after which a tail lets the event loop run other tasks: a burst of thousands of
#: messages (thousands of sensors firing) is handed out in slices instead of in one blocking stretch.
DISPATCH_SLICE = 0.005
#: How old the stream info a tail hands out may be (its first sequence moves as old messages expire).
INFO_MAX_AGE = 60.0
log = logging.getLogger(__name__)


class TailListener:
    """One waiter's share of a tail: the messages matching ``subject`` with a sequence above ``since`` (and, with
    ``accept``, only those it accepts: checked as they arrive, so a waiter is woken only for what it wants; filed
    by a ``key`` given to :func:`follow`, ``(key_of, value)``, only messages whose ``key_of`` is ``value`` reach it)."""

    __slots__ = ("_error", "_items", "_ready", "accept", "since", "subject", "tail")

    def __init__(self, tail: StreamTail, subject: str, accept: Callable[[Message], bool] | None = None) -> None:
        self.tail = tail
        self.subject = subject
        self.accept = accept
        self.since = tail.delivered
        self._items: list[Message] = []
        self._ready = asyncio.Event()  # set when items or an error came
        self._error: JetStreamError | None = None

    def push(self, message: Message) -> None:
        if self.accept is not None:
            try:
                if not self.accept(message):
                    return
            except Exception:  # the waiter reads the message itself: its own error is raised there
                pass
        self._items.append(message)
        self._ready.set()

    def fail(self, error: JetStreamError) -> None:
        self._error = error
        self._ready.set()

    def catching_up(self) -> asyncio.Semaphore:
        """``async with listener.catching_up():`` around reading what was stored up to ``since``."""
        return self.tail.catch_up_gate

    async def next_batch(self) -> list[Message]:
        """The messages delivered since the last call (waits for at least one); raises the tail's error."""
        while not self._items:
            if self._error is not None:
                raise self._error
            self._ready.clear()
            await self._ready.wait()
        items, self._items = self._items, []
        return items


@dataclass
class TailStats:
    """What a tail is doing, for logs, tests and benchmarks."""

    stream: str
    filter: str | None
    mode: str
    consumer: str | None
    listeners: int
    delivered: int
    resubscribed: int = 0
    degraded: str | None = field(default=None)


class StreamTail:
    """New messages of ``stream`` (on ``filter_subject``) for every listener on one connection."""

    def __init__(self, conn: JetStreamConnection, stream: str, filter_subject: str | None) -> None:
        self.conn = conn
        self.stream = stream
        self.filter = filter_subject
        self.listeners = ListenerIndex()
        self.delivered = 0
        self.mode = "consumer"
        self.degraded: str | None = None
        self.resubscribed = 0
        self._info: dict[str, Any] = {}
        self._info_at = 0.0
        self._generation = 0
        self._sub: Any = None
        self._consumer: str | None = None
        self._expected = 1
        self._last_activity = 0.0
        self._task: asyncio.Task[None] | None = None
        self._resubscribing: asyncio.Task[None] | None = None
        self._closed = False
        self.catch_up_gate = asyncio.Semaphore(CATCH_UP_AT_ONCE)
        self._slice_start = 0.0

    # ------------------------------------------------------------------------------------------- life cycle

    async def start(self) -> None:
        info = await self.info(max_age=0)
        self.delivered = int(info["state"].get("last_seq") or 0)
        if info["config"].get("retention", "limits") != "limits":
            self.mode = "poll"  # a consumer would take messages away (WorkQueue) or keep them (Interest)
            self._task = asyncio.create_task(self._poll())
            return
        try:
            await self._subscribe(self.delivered + 1)
        except LimitReachedError as exc:
            await self._degrade(exc)
        else:
            self._task = asyncio.create_task(self._watch())

    async def _degrade(self, exc: JetStreamError) -> None:
        """Poll instead of a consumer the stream refused for its consumer limit, saying which limit (the heartbeat
        watch of the consumer the polls replace stops)."""
        try:
            info = await self.info(max_age=0)
            limit = int(info["config"].get("max_consumers", -1))
            exc.message = (f"stream {self.stream!r} holds {info['state'].get('consumer_count')} consumers and allows "
                           f"{limit if limit > 0 else 'the server default (1,000)'} (max_consumers): {exc.message}")
        except JetStreamError:
            pass  # the refusal says enough
        exc.args = (exc.message,)
        self.mode, self.degraded = "poll", exc.message
        log.warning("Consumer refused (%s); the waiters on stream %r read it by direct get every %.0f s instead",
                    exc, self.stream, POLL_INTERVAL)
        metrics.incr("tail.degraded", tags={"stream": self.stream})
        watch, self._task = self._task, asyncio.create_task(self._poll())
        if watch is not None:
            watch.cancel()

    async def close(self) -> None:
        """Stop: no more deliveries, the consumer deleted (else the server drops it after ``TAIL_INACTIVE``)."""
        self._closed = True
        self._generation += 1
        for task in (self._task, self._resubscribing):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self._drop_subscription()

    async def info(self, max_age: float = INFO_MAX_AGE) -> dict[str, Any]:
        """The stream's info, read again when older than ``max_age`` seconds."""
        now = asyncio.get_running_loop().time()
        if not self._info or now - self._info_at > max_age:
            self._info = await stream_info(self.conn, self.stream)
            self._info_at = now
        return self._info

    def stats(self) -> TailStats:
        return TailStats(self.stream, self.filter, self.mode, self._consumer, len(self.listeners), self.delivered,
                         self.resubscribed, self.degraded)

    def _fail(self, error: JetStreamError) -> None:
        log.error("Shared subscription on stream %r failed: %s", self.stream, error)
        self._closed = True
        self.listeners.fail(error)

    def _dispatch(self, message: Message) -> None:
        self.delivered = message.seq
        self.listeners.dispatch(message)

    # ------------------------------------------------------------------------------------------- consumer mode

    async def _subscribe(self, from_seq: int) -> None:
        generation = self._generation
        inbox = self.conn.nc.new_inbox()

        async def on_message(msg: Any) -> None:
            if generation == self._generation:
                await self._on_message(msg)

        self._sub = await self.conn.nc.subscribe(inbox, cb=on_message)
        name = f"ajs_tail_{uuid.uuid4().hex[:12]}"
        config: dict[str, Any] = {
            "name": name, "deliver_subject": inbox, "deliver_policy": "by_start_sequence", "opt_start_seq": from_seq,
            "ack_policy": "none", "flow_control": True, "idle_heartbeat": int(TAIL_HEARTBEAT * 1e9),
            "mem_storage": True, "num_replicas": 1, "inactive_threshold": int(TAIL_INACTIVE * 1e9),
            "description": "airflow-jetstream: new messages for the waiting tasks of one process",
        }
        if self.filter:
            config["filter_subject"] = self.filter
        self._expected = 1
        self._last_activity = asyncio.get_running_loop().time()
        try:
            await self.conn.api_request(f"CONSUMER.CREATE.{self.stream}.{name}",
                                        {"stream_name": self.stream, "config": config, "action": "create"},
                                        context=f"shared subscription on stream {self.stream!r}")
        except JetStreamError:
            await self._drop_subscription()  # the subscription only: no consumer was made
            raise
        self._consumer = name
        metrics.incr("tail.subscribed", tags={"stream": self.stream})

    async def _drop_subscription(self) -> None:
        sub, name, self._sub, self._consumer = self._sub, self._consumer, None, None
        if self.conn.nc.is_closed:
            return
        if sub is not None:
            await sub.unsubscribe()
        if name is not None:
            try:
                await self.conn.api_request(f"CONSUMER.DELETE.{self.stream}.{name}", retry=False,
                                            timeout=min(self.conn.settings.request_timeout, DELETE_WAIT),
                                            context=f"delete shared subscription {name!r}")
            except JetStreamError as exc:  # the server drops it TAIL_INACTIVE seconds after the unsubscribe
                log.info("Shared subscription %s on %s not deleted (%s): the server drops it within %.0f s",
                         name, self.stream, exc, TAIL_INACTIVE)

    async def _on_message(self, msg: Any) -> None:
        self._last_activity = asyncio.get_running_loop().time()
        headers = msg.headers or {}
        status = headers.get(HEADER_STATUS) if not msg.reply or not msg.reply.startswith("$JS.ACK.") else None
        if status is not None:
            await self._on_status(msg, status, headers)
            return
        meta = msg.metadata
        seq, consumer_seq = meta.sequence.stream, meta.sequence.consumer
        if consumer_seq != self._expected:
            self._resubscribe(f"consumer sequence {consumer_seq} where {self._expected} was due")
            return
        self._expected += 1
        if seq <= self.delivered:
            return
        self._dispatch(Message(stream=self.stream, subject=msg.subject, seq=seq, data=msg.data or b"", headers=headers,
                               time=meta.timestamp))
        await self._let_others_run()

    async def _let_others_run(self) -> None:
        """nats-py hands a subscription's queued messages over without returning to the event loop in between:
        after ``DISPATCH_SLICE`` seconds of them, give the loop a turn (the waiters just woken run then)."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._slice_start > DISPATCH_SLICE:
            await asyncio.sleep(0)
            self._slice_start = loop.time()

    async def _on_status(self, msg: Any, status: str, headers: dict[str, str]) -> None:
        if status == "100":  # idle heartbeat or flow control request
            if msg.reply:
                await self.conn.nc.publish(msg.reply)  # every message before it was handled: ask for more
            stalled = headers.get("Nats-Consumer-Stalled")
            if stalled:
                await self.conn.nc.publish(stalled)
            last = headers.get("Nats-Last-Consumer")
            if last is not None and int(last) != self._expected - 1:
                self._resubscribe(f"heartbeat says consumer sequence {last}, {self._expected - 1} were delivered")
        elif status == "409":
            self._resubscribe(f"the server ended the subscription ({headers.get('Description', status)})")

    async def _watch(self) -> None:
        """Subscribe again when the tail went quiet for longer than three heartbeats."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(TAIL_HEARTBEAT * random.uniform(0.9, 1.1))
            if self.conn.nc.is_closed:
                self._fail(ConnectionFailedError(f"the NATS connection closed while waiting on stream "
                                                 f"{self.stream!r}; the wait can be retried"))
                return
            if not self.conn.nc.is_connected:
                self._last_activity = loop.time()  # reconnecting: nats-py subscribes again by itself
                continue
            if self._resubscribing is None and loop.time() - self._last_activity > TAIL_STALLED:
                self._resubscribe(f"no heartbeat for {TAIL_STALLED:.0f} s")

    def _resubscribe(self, why: str) -> None:
        if self._resubscribing is None and not self._closed:
            self._resubscribing = asyncio.create_task(self._subscribe_again(why))

    async def _subscribe_again(self, why: str) -> None:
        self._generation += 1  # deliveries of the old subscription are ignored from now on
        self.resubscribed += 1
        metrics.incr("tail.resubscribed", tags={"stream": self.stream})
        log.info("Shared subscription on stream %r: %s; subscribing again from seq %d", self.stream, why,
                 self.delivered + 1)

        def transient(exc: JetStreamError) -> str | None:
            retried = isinstance(exc, (RequestTimeoutError, ConnectionFailedError)) and not self._closed
            return exc.message if retried else None

        try:
            await self._drop_subscription()
            if not self._closed:
                await retry(f"Shared subscription on stream {self.stream!r}", lambda: self._subscribe(
                    self.delivered + 1), transient=transient, budget=None, backoff=RESUBSCRIBE_BACKOFF, logger=log)
        except LimitReachedError as exc:
            await self._degrade(exc)
        except JetStreamError as exc:
            if not self._closed:
                self._fail(exc)
        finally:
            self._resubscribing = None

    # ------------------------------------------------------------------------------------------- poll mode

    async def _poll(self) -> None:
        attempt = 0
        while not self._closed:
            await asyncio.sleep(POLL_INTERVAL * random.uniform(0.8, 1.2))
            try:
                # every message on the filter (">": write fences too, as the consumer of a tail hands them on)
                reader = read_range(self.conn, self.stream, self.delivered + 1, None, via=None, batch=BATCH,
                                    subjects=(self.filter or ">",), info=await self.info())
                async with aclosing(reader):
                    async for chunk in reader:
                        for message in messages_of(self.stream, chunk):
                            if message.seq > self.delivered:
                                self._dispatch(message)
                                await self._let_others_run()
                attempt = 0
            except (RequestTimeoutError, ConnectionFailedError) as exc:
                attempt += 1
                if self.conn.nc.is_closed:
                    self._fail(ConnectionFailedError(f"the NATS connection closed while polling stream "
                                                     f"{self.stream!r}; the wait can be retried"))
                    return
                if attempt == 1 or attempt % 30 == 0:
                    log.warning("Polling stream %r: %s (%d failed reads in a row)", self.stream, exc, attempt)
            except JetStreamError as exc:
                self._fail(exc)
                return


# ----------------------------------------------------------------------------------------------- sharing


async def _start(conn: JetStreamConnection, key: tuple[str, str | None]) -> StreamTail:
    tail = StreamTail(conn, *key)
    await tail.start()
    return tail


#: The tails of each connection, by (stream, filter): shared by their waiters, the last one closes it.
_TAILS: Shared[tuple[str, str | None], StreamTail] = Shared(_start, StreamTail.close, lambda tail: tail._closed)


@asynccontextmanager
async def follow(conn: JetStreamConnection, stream: str, subject: str = ">", *, tail_filter: str | None = None,
                 accept: Callable[[Message], bool] | None = None,
                 key: tuple[KeyOf, Hashable] | None = None) -> AsyncIterator[TailListener]:
    """``async with follow(conn, stream, subject) as listener``: the messages of ``stream`` on ``subject``
    (wildcards allowed) stored after ``listener.since``, through the tail this connection shares for ``stream``
    and ``tail_filter`` (its consumer's filter; None: every subject).

    ``accept(message)`` (quick, on the event loop, once per waiter) keeps only what the listener wants, so many
    waiters on one subject are woken only by their own message. ``key``, ``(key_of, value)``, files the listener
    by the value it waits for: ``key_of`` (one function shared by the subject's waiters) runs once per message
    and only the listeners of its value see it, one lookup however many wait on the subject."""
    validate_name(stream, what="stream name")
    validate_subject(subject, allow_wildcards=True, what="subject")
    if tail_filter is not None:
        validate_subject(tail_filter, allow_wildcards=True, what="tail filter")
    async with _TAILS.use((stream, tail_filter), conn) as tail:
        listener = TailListener(tail, subject, accept)
        tail.listeners.add(subject, listener, key)
        try:
            yield listener
        finally:
            tail.listeners.remove(subject, listener, key)


def tail_stats(conn: JetStreamConnection | None = None) -> list[TailStats]:
    """What every tail (of ``conn``, or of every connection) is doing."""
    return [tail.stats() for tail in _TAILS.values(conn)]


__all__ = ["POLL_INTERVAL", "TAIL_HEARTBEAT", "TAIL_INACTIVE", "StreamTail", "TailListener", "TailStats", "follow",
           "tail_stats"]
