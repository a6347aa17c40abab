"""Event-driven scheduling from a JetStream durable consumer, on Airflow 3.3 shared streams.

Every :class:`JetStreamMessageTrigger` on the same durable consumer shares one pull subscription in the
triggerer. :class:`JetStreamSharedStreamProducer` acks a message only after every ``TriggerEvent`` derived
from it was persisted (the shared-stream ack channel), so a triggerer crash loses nothing (unacked messages
are redelivered after ``ack_wait``); meanwhile it keeps the message "in progress" (``+WPI``, confirmed) so the
server does not hand it to another triggerer. A delivery held past its ``ack_wait`` (a stalled triggerer) is
not fired. Outcomes: accepted by every watcher -> ``ack``; refused (``reject_shared_stream_event``) ->
``term``; a watcher failed -> ``nak``; nobody listening (the group is stopping) -> ``nak`` at close.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Hashable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_jetstream.airflow_compat import SHARED_STREAMS, require_airflow

try:
    from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer
except ImportError:
    require_airflow(SHARED_STREAMS)  # Airflow < 3.3: a typed error naming the version needed
    raise

from airflow_jetstream.client import metrics
from airflow_jetstream.client.admin.consumers import consumer_info, ensure_consumer
from airflow_jetstream.client.advisories.types import parse_advisory
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import (
    AuthenticationError,
    ConnectionFailedError,
    ConsumerConfigError,
    ConsumerNotFoundError,
    InvalidRequestError,
    JetStreamError,
    RequestTimeoutError,
    StreamNotFoundError,
)
from airflow_jetstream.client.reading.messages import DeliveryLease, Message, body_fields
from airflow_jetstream.client.retry import Backoff, retry
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.client.subjects import subject_matches, validate_name, validate_subject
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.triggers.advisory import FILTER_ARGS, filter_of

if TYPE_CHECKING:  # the modules that use nats-py are imported when the trigger runs, not when a DAG file is parsed
    from airflow_jetstream.client.connection import JetStreamConnection
    from airflow_jetstream.client.reading.consume import PullSubscription

#: Longer than Airflow's shared-stream ack timeout (300 s), so a message is not redelivered while it waits.
DEFAULT_ACK_WAIT = "10m"
log = logging.getLogger(__name__)
#: Waited out when a watcher starts (one log line per try), seconds between tries doubling up to BACKOFF_MAX.
WAITED_OUT_ERRORS = (StreamNotFoundError, ConsumerNotFoundError, RequestTimeoutError, ConnectionFailedError)
BACKOFF_FIRST, BACKOFF_MAX = 2.0, 30.0
#: The message trigger's arguments, as ``serialize`` stores them.
_SERIALIZED = ("stream", "consumer", "nats_conn_id", "filter_subject", *FILTER_ARGS, "consumer_config", "batch_size",
               "fetch_timeout", "max_unconfirmed", "body_in_event")


#: What an asset event keeps of a message by default: where it is and how it was delivered, not what it says.
EVENT_REFERENCE = ("stream", "consumer", "subject", "stream_seq", "consumer_seq", "delivered", "published", "size")


def message_payload(message: Message) -> dict[str, Any]:
    """A delivered message as a JSON-able dict: what an asset event carries with ``body_in_event`` (else only its
    :data:`EVENT_REFERENCE` fields), and what ``asset_messages`` gives the task."""
    from airflow_jetstream.client.reading.headers import headers_json

    return {
        "stream": message.stream,
        "consumer": message.consumer,
        "subject": message.subject,
        "stream_seq": message.seq,
        "consumer_seq": message.consumer_seq,
        "delivered": message.delivered,
        "published": message.time.isoformat() if message.time else None,
        "headers": headers_json(message.headers),  # a list of strings for a repeated name
        # the body once: "json" when it is JSON, else "data"; cut at EVENT_BODY_LIMIT with a "truncated" note
        **body_fields(message.data, where=f"stream {message.stream!r} at sequence {message.seq}"),
    }


class EachCauseOnce(logging.LoggerAdapter[logging.Logger]):
    """A watcher waits for its stream or consumer without a time limit (it may not exist for hours): each cause is
    logged once, at WARNING, and its retries at DEBUG; a new cause (the stream came, the consumer is missing) is
    logged again. Keys on :func:`~airflow_jetstream.client.retry.retry`'s line: (what, why, reason, retry, ...)."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logger, {})
        self.said: set[tuple[Any, ...]] = set()

    def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
        cause = args[:3]
        self.log(logging.DEBUG if cause in self.said else logging.WARNING, msg, *args, **kwargs)
        self.said.add(cause)


def _log_expired(where: str, lease: DeliveryLease) -> None:
    log.warning("%s: message %d held %.1f s, past ack_wait %.0f s (the triggerer was stalled): not fired; the "
                "server redelivers it", where, lease.msg.metadata.sequence.stream, lease.held_for(), lease.ack_wait)


class JetStreamSharedStreamProducer(SharedStreamProducer):
    """Broker side of a shared JetStream stream: one pull subscription, acks gated on persistence.

    ``consumer_config`` creates or updates the consumer first (else it must exist). ``max_unconfirmed``
    (default ``batch_size``) stops handing out messages while that many wait for Airflow's confirmation: it
    bounds the repeats after a stopped, killed or stalled triggerer. ``progress_interval`` (default a third of
    the consumer's ``ack_wait``) spaces the "in progress" signals for messages awaiting persistence.
    """

    def __init__(self, *, nats_conn_id: str, stream: str, consumer: str, consumer_config: dict[str, Any] | None = None,
                 batch_size: int = 64, fetch_timeout: float | str | timedelta = 5.0, max_unconfirmed: int | None = None,
                 progress_interval: float | str | timedelta | None = None) -> None:
        self.nats_conn_id = nats_conn_id
        self.stream = stream
        self.consumer = consumer
        self.consumer_config = consumer_config
        self.batch_size = batch_size
        self.fetch_timeout = to_seconds(fetch_timeout, field="fetch_timeout")
        self.max_unconfirmed = batch_size if max_unconfirmed is None else max_unconfirmed
        self._confirmed = asyncio.Event()  # set by advance: maybe room for another unconfirmed message
        self.progress_interval = None if progress_interval is None else to_seconds(
            progress_interval, field="progress_interval")
        self._settings: ConnectionSettings | None = None
        self._conn: JetStreamConnection | None = None
        self._pull: PullSubscription | None = None
        self._outstanding: dict[int, DeliveryLease] = {}
        self._tokens = itertools.count()
        self._progress_task: asyncio.Task[None] | None = None
        self._yielded: set[int] = set()  # handed to the watchers, not advanced yet
        self._unwatched: list[DeliveryLease] = []  # advanced while no watcher listened: given back by aclose

    async def _check_consumer(self, conn: JetStreamConnection) -> dict[str, Any]:
        info: dict[str, Any]
        if self.consumer_config is not None:
            info = (await ensure_consumer(conn, self.stream, {**self.consumer_config, "durable_name": self.consumer}))[
                "info"]
        else:
            info = await consumer_info(conn, self.stream, self.consumer)
        config = info["config"]
        if config.get("deliver_subject") or config.get("ack_policy") != "explicit":
            raise ConsumerConfigError(
                f"consumer {self.consumer!r} on stream {self.stream!r} must be a pull consumer with ack_policy "
                f"'explicit' (has deliver_subject={config.get('deliver_subject')!r}, "
                f"ack_policy={config.get('ack_policy')!r}); acks are how no event is lost",
                reason="not_explicit_pull_consumer",
            )
        return info

    async def _open_consumer(self, settings: ConnectionSettings) -> tuple[JetStreamConnection, dict[str, Any]]:
        """Connect and check the consumer; a missing stream/consumer or an unreachable server is waited out
        with the client's retry rule and no time limit (a growing back-off, one log line each), not raised
        (Airflow would restart the watcher every 2 s)."""

        from airflow_jetstream.client.connection_pool import POOL

        async def attempt() -> tuple[JetStreamConnection, dict[str, Any]]:
            self._conn = conn = self._conn or await POOL.acquire(settings)
            return conn, await self._check_consumer(conn)

        def why(exc: JetStreamError) -> str | None:
            waited_out = isinstance(exc, WAITED_OUT_ERRORS) and not isinstance(exc, AuthenticationError)
            return exc.message if waited_out else None

        return await retry(f"Watcher on {self.stream}/{self.consumer} not started", attempt, transient=why,
                           budget=None, backoff=Backoff(BACKOFF_FIRST, BACKOFF_MAX), logger=EachCauseOnce(log))

    async def open_stream(self) -> AsyncIterator[tuple[Message, int]]:
        from airflow_jetstream.client.reading.consume import PullSubscription

        self._settings = await JetStreamHook(nats_conn_id=self.nats_conn_id).aget_settings()
        conn, info = await self._open_consumer(self._settings)
        ack_wait = float(info["config"].get("ack_wait") or 30_000_000_000) / 1e9
        interval = self.progress_interval or max(ack_wait / 3, 0.05)
        self._pull = PullSubscription(conn, self.stream, self.consumer, batch=self.batch_size,
                                      expires=self.fetch_timeout)
        await self._pull.start()
        self._progress_task = asyncio.create_task(self._keep_in_progress(interval))
        while True:
            msgs = await self._pull.next_messages(self.fetch_timeout)
            since = self._pull.request_sent_at
            # All of them outstanding before the first yield: if the caller stops in between, aclose naks the rest.
            tokens = [next(self._tokens) for _ in msgs]
            for token, msg in zip(tokens, msgs, strict=True):
                self._outstanding[token] = DeliveryLease(msg, ack_wait=ack_wait, since=since)
            for token in tokens:
                while len(self._yielded) >= self.max_unconfirmed:
                    self._confirmed.clear()
                    await self._confirmed.wait()
                lease = self._outstanding[token]
                if lease.expired():  # stalled since the pull: the server gave it to another reader or will
                    del self._outstanding[token]
                    _log_expired(f"Watcher on {self.stream}/{self.consumer}", lease)
                    metrics.incr("queue.expired", tags={"stream": self.stream, "consumer": self.consumer})
                    continue
                metrics.incr("queue.delivered", tags={"stream": self.stream, "consumer": self.consumer})
                self._yielded.add(token)
                yield Message.from_delivery(lease.msg, lease), token

    async def _keep_in_progress(self, interval: float) -> None:
        """Tell the server we still work on every message awaiting persistence (+WPI, each one confirmed)."""
        while True:
            await asyncio.sleep(interval)
            leases = [lease for lease in self._outstanding.values() if not lease.expired()]
            if not leases or self._conn is None:
                continue
            timeout = self._settings.request_timeout if self._settings else 5.0
            extended = await asyncio.gather(*(lease.extend(self._conn.nc, timeout) for lease in leases))
            if not all(extended):
                log.warning("could not extend the ack deadline of %d of %d message(s) on %s/%s; they may be "
                            "redelivered after ack_wait", extended.count(False), len(leases), self.stream,
                            self.consumer)

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        acks = []
        for item in batch:
            lease = self._outstanding.pop(item.broker_payload, None)
            if lease is None:
                raise RuntimeError(f"no outstanding message for token {item.broker_payload}; cannot ack it")
            msg, outcome = lease.msg, item.outcome
            nobody_listened = outcome.acked == outcome.failed == outcome.rejected == 0
            if lease.dropped or (lease.expired() and (outcome.failed or outcome.rejected)):
                # Not fired, or not to be given back: another reader may hold it now, and a nak or term would
                # act on its delivery. (One fired past ack_wait is still acked: no later reader fires it then.)
                metrics.incr("queue.expired", tags={"stream": self.stream, "consumer": self.consumer})
            elif nobody_listened:
                # No watcher was subscribed: Airflow broadcasts to nobody only while its watchers leave (the last
                # one left or failed, the poll is not cancelled yet), so the group is stopping. Not naked now:
                # every nak raises a MSG_NAKED advisory, which on a watched advisory capture stream would come
                # back as a new message, be naked again, and so on without end while nobody listens. Given back
                # once by aclose instead, or it would wait out ack_wait (10 minutes by default) on a rolling restart.
                self._unwatched = [kept for kept in self._unwatched if not kept.expired()]
                self._unwatched.append(lease)
                metrics.incr("queue.redelivered", tags={"stream": self.stream, "consumer": self.consumer})
            elif outcome.failed:
                await msg.nak()  # redeliver to the healthy watchers now
                metrics.incr("queue.redelivered", tags={"stream": self.stream, "consumer": self.consumer})
            elif outcome.rejected:
                await msg.term()
                metrics.incr("queue.terminated", tags={"stream": self.stream, "consumer": self.consumer})
            else:
                acks.append(msg.ack_sync(timeout=self._settings.request_timeout if self._settings else 5.0))
        if acks:
            await asyncio.gather(*acks)
            metrics.incr("queue.acked", len(acks), tags={"stream": self.stream, "consumer": self.consumer})
        # settled only now (acks confirmed): max_unconfirmed then also counts the acks still on their way
        self._yielded.difference_update(item.broker_payload for item in batch)
        self._confirmed.set()

    async def aclose(self) -> None:
        """Give back what was not advanced or was advanced while nobody listened (nak: redelivered now, not after
        ack_wait), including what the open pull request still delivers (waiting up to ``fetch_timeout`` for its
        end), and release the connection."""
        from airflow_jetstream.client.connection_pool import POOL

        if self._progress_task is not None:
            self._progress_task.cancel()
            await asyncio.gather(self._progress_task, return_exceptions=True)
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if not conn.nc.is_closed:
                if self._pull is not None:  # first: what is naked while its pull request is open comes back to it
                    await self._pull.close(leftover=lambda msg: msg.nak())
                for lease in [*self._outstanding.values(), *self._unwatched]:
                    if not lease.expired():  # an expired delivery may be another reader's now
                        await lease.msg.nak()
        finally:
            self._outstanding.clear()
            self._unwatched.clear()
            await POOL.release(conn)


class JetStreamMessageTrigger(BaseEventTrigger):
    """Fire an asset event for each message on a JetStream durable consumer (event-driven scheduling).

    Used through common-messaging (``MessageQueueTrigger(scheme="jetstream", stream=..., consumer=...)``) or
    directly in an ``AssetWatcher``. Triggers with the same ``nats_conn_id``, ``stream`` and ``consumer`` share
    one subscription; each applies its own ``filter_subject`` / advisory filter (an advisory watcher's event
    carries the parsed advisory under ``"advisory"``). A message is acked only once every derived event is
    stored, so a triggerer restart loses nothing; ``max_unconfirmed`` bounds the repeats after one. The event
    carries only where the message is (:data:`EVENT_REFERENCE`), since Airflow's triggerer logs every event and
    stores it for every reader; :func:`~airflow_jetstream.message_events.asset_messages` reads the body back in
    the task, and ``body_in_event=True`` carries it instead. Parameters: docs/event-driven.md.
    """


    def __init__(self, *, stream: str, consumer: str, nats_conn_id: str = JetStreamHook.default_conn_name,
                 filter_subject: str | None = None, advisory: str | None = None, advisory_stream: str | None = None,
                 advisory_consumer: str | None = None, batch_id: str | None = None, reason: str | None = None,
                 match: dict[str, Any] | str | None = None, consumer_config: dict[str, Any] | None = None,
                 batch_size: int = 64, fetch_timeout: float | str | timedelta = 5.0, max_unconfirmed: int | None = None,
                 body_in_event: bool = False) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Airflow's BaseEventTrigger is not annotated
        self.stream = validate_name(stream, what="stream name")
        self.consumer = validate_name(consumer, what="consumer name")
        self.nats_conn_id = nats_conn_id
        self.filter_subject = (validate_subject(filter_subject, allow_wildcards=True, what="filter_subject")
                               if filter_subject else None)
        self.advisory = advisory
        self.advisory_stream = advisory_stream
        self.advisory_consumer = advisory_consumer
        self.batch_id = batch_id
        self.reason = reason
        self.match = match
        self.advisory_filter = None if all(getattr(self, arg) is None for arg in FILTER_ARGS) else filter_of(self)
        self.consumer_config = consumer_config
        self.batch_size = batch_size
        self.fetch_timeout = to_seconds(fetch_timeout, field="fetch_timeout")
        if max_unconfirmed is not None and (isinstance(max_unconfirmed, bool) or not isinstance(max_unconfirmed, int)
                                            or max_unconfirmed < 1):
            raise InvalidRequestError(f"max_unconfirmed must be a positive int or None, got {max_unconfirmed!r}",
                                      reason="invalid_option")
        self.max_unconfirmed = max_unconfirmed
        self.body_in_event = body_in_event

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", {key: getattr(self, key) for key in _SERIALIZED}

    def shared_stream_key(self) -> Hashable:
        """Triggers on the same connection id, stream and durable consumer share one subscription."""
        return "jetstream", self.nats_conn_id, self.stream, self.consumer

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> JetStreamSharedStreamProducer:
        config = kwargs.get("consumer_config")
        if config is not None:
            config = {"ack_policy": "explicit", "ack_wait": DEFAULT_ACK_WAIT, **config}
        return JetStreamSharedStreamProducer(
            nats_conn_id=kwargs.get("nats_conn_id") or JetStreamHook.default_conn_name,
            stream=kwargs["stream"],
            consumer=kwargs["consumer"],
            consumer_config=config,
            batch_size=int(kwargs.get("batch_size") or 64),
            fetch_timeout=kwargs.get("fetch_timeout") or 5.0,
            max_unconfirmed=kwargs.get("max_unconfirmed"),
        )

    def event_for(self, message: Message) -> TriggerEvent | None:
        """This trigger's event for one message, or None when its filters skip it."""
        if self.filter_subject and not subject_matches(self.filter_subject, message.subject):
            return None
        payload = message_payload(message)
        if self.advisory_filter is not None:
            body = payload.get("json")
            advisory = parse_advisory(body, subject=message.subject, capture_seq=message.seq) \
                if isinstance(body, dict) else None
            if advisory is None or not self.advisory_filter.matches(advisory):
                return None
            payload["advisory"] = advisory.to_dict()  # the body's fields and more: it replaces "json"
            payload.pop("json", None)
        if not self.body_in_event:  # Airflow's triggerer logs the event, and keeps an asset event's for every reader
            payload = {key: payload[key] for key in (*EVENT_REFERENCE, "advisory") if key in payload}
        return TriggerEvent(payload)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for message in shared_stream:
            lease = message.lease
            if lease is not None and lease.expired():  # waited past ack_wait in the triggerer: not ours any more
                lease.dropped = True
                _log_expired(f"Watcher on {self.stream}/{self.consumer}", lease)
                continue
            event = self.event_for(message)
            if event is not None:
                yield event

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Not supported: acks must wait for persistence, which only the triggerer's shared-stream manager tracks."""
        raise NotImplementedError(
            "JetStreamMessageTrigger runs only through the triggerer's shared-stream manager "
            "(filter_shared_stream); Airflow 3.3+ calls it that way for asset watchers"
        )
        yield  # pragma: no cover - makes this an async generator
