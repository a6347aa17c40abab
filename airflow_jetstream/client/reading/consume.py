"""Consume messages with a user function (docs/operators/consume.md): a durable pull consumer or an ordered read.

* **Durable** (``consumer`` given; created when missing): each message (or batch, ``per_batch``) is acked only after
  the function returned, the ack confirmed by the server. A failure listed in ``term_on`` terminates it (never
  redelivered) and consuming goes on; any other naks it with a delay from ``nak_delay``, naks the rest delivered at
  once and raises :class:`ApplyFunctionError`: nothing unacknowledged is lost, nothing acknowledged runs twice.
* **Ordered read** (no ``consumer``): ``start_seq`` (or ``start_time``, or the first) up to ``end_seq`` (default:
  the last stored when it starts), with no cursor on the server; a failure raises and a retry reads it all again.

The summary is JSON-able (``mode``, ``processed``, ``acked``, ``terminated``, ``first_seq``/``last_seq``,
``next_seq``, ``stopped``; durable reads add the consumer's ``num_pending`` and ``num_ack_pending``).

Durable reads pull with :class:`PullSubscription` (the message trigger's too). nats-py's ``fetch`` does the same job
with two gaps that matter to long-running readers (triggerer tasks): it waits with ``asyncio.wait_for``, which on
Python 3.11 swallows a cancellation that lands while a message arrives (the task then fetches forever), and messages
of a request still in flight when the caller stops stay unseen until the consumer's ``ack_wait`` passes.
:class:`PullSubscription` waits with ``asyncio.timeout`` and its :meth:`~PullSubscription.close` hands what still
arrives for the open request to ``leftover`` (e.g. ``nak``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from airflow_jetstream.client.admin.consumers import (
    config_filters,
    consumer_info,
    ensure_consumer,
    filter_config,
    find_consumer,
)
from airflow_jetstream.client.batches.types import HEADER_STATUS
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import to_rfc3339
from airflow_jetstream.client.errors import (
    ApplyFunctionError,
    ConsumerConfigError,
    ConsumerNotFoundError,
    InvalidRequestError,
    RequestTimeoutError,
)
from airflow_jetstream.client.reading.apply_function import (
    DEFAULT_ACK_WAIT,
    DEFAULT_NAK_DELAY,
    ConsumeOptions,
    Duration,
    call_function,
)
from airflow_jetstream.client.reading.messages import Message
from airflow_jetstream.client.reading.read_plan import plan_read, read_method
from airflow_jetstream.client.reading.stored import messages_of, read_range
from airflow_jetstream.client.subjects import validate_name, validate_subjects

log = logging.getLogger(__name__)


_DESCRIPTION = "Description"
#: Statuses that end a pull request normally: it expired (408) or found nothing (404).
_REQUEST_ENDED = frozenset({"404", "408"})
#: Share of ``expires`` by which each pull request waits less, drawn at random (spreads the expiries).
EXPIRES_JITTER = 0.1
#: Seconds to wait before the next pull request after the server refused one for a passing reason.
_PAUSE_AFTER_REFUSAL = 1.0


class PullSubscription:
    """Pull requests of ``batch`` messages that wait up to ``expires`` seconds on the server."""

    def __init__(self, conn: JetStreamConnection, stream: str, consumer: str, *, batch: int,
                 expires: float) -> None:
        self.conn = conn
        self.stream = stream
        self.consumer = consumer
        self.batch = max(1, int(batch))
        self.expires = max(float(expires), 0.1)
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._sub: Any = None
        self._inbox = ""
        self._open = False  # a pull request the server may still answer
        self._received = 0  # messages of the open request so far
        self._unreturned: list[Any] = []  # taken by a next_messages() that raised: close() hands them on
        self._request_deadline = 0.0
        self._pause_until = 0.0
        #: When the latest pull request was sent (``time.monotonic()``): no message it brings was delivered
        #: earlier, so a delivery's ``ack_wait`` on the server ends no sooner than this plus ``ack_wait``.
        self.request_sent_at = 0.0

    async def start(self) -> None:
        self._inbox = self.conn.nc.new_inbox()
        self._sub = await self.conn.nc.subscribe(self._inbox, cb=self._on_message)

    async def _on_message(self, msg: Any) -> None:
        self._queue.put_nowait(msg)

    async def _request(self) -> None:
        loop = asyncio.get_running_loop()
        # Open before sending: if the caller is cancelled while sending, close() still waits for the request.
        self._open, self._received = True, 0
        # The server ends the request with a status after `expires`; past this, its answer was lost (reconnect).
        self._request_deadline = loop.time() + self.expires + self.conn.settings.request_timeout
        self.request_sent_at = time.monotonic()
        # each request waits 90-100% of `expires`: readers that started together do not all renew at once
        body = {"batch": self.batch, "expires": int(self.expires * random.uniform(1 - EXPIRES_JITTER, 1) * 1e9)}
        try:
            await self.conn.nc.publish(f"{self.conn.api_prefix}.CONSUMER.MSG.NEXT.{self.stream}.{self.consumer}",
                                       json.dumps(body).encode(), reply=self._inbox)
        except Exception:
            self._open = False
            raise

    def _take(self, msg: Any, out: list[Any]) -> None:
        """File one delivery: a message goes to ``out``; a status may end the open request."""
        status = (msg.headers or {}).get(HEADER_STATUS) if not msg.reply else None
        if status is None:
            out.append(msg)
            self._received += 1
            if self._received >= self.batch:
                self._open = False
            return
        self._open = False
        if status in _REQUEST_ENDED:
            return
        description = (msg.headers or {}).get(_DESCRIPTION, "")
        where = f"consumer {self.consumer!r} on stream {self.stream!r}"
        if status == "409" and description == "Consumer Deleted":
            raise ConsumerNotFoundError(f"{where} was deleted while it was being read; create it again")
        if status == "409" and description == "Consumer is push based":
            raise ConsumerConfigError(f"{where} is a push consumer (it has a deliver_subject); read it with a pull "
                                      "consumer", reason="not_pull_consumer")
        if status == "400" or description.startswith("Exceeded MaxRequest"):
            raise ConsumerConfigError(f"{where} refused a pull request of {self.batch} message(s) waiting "
                                      f"{self.expires}s: {status} {description}; pull fewer messages or wait "
                                      "less, or raise the consumer's max_batch / max_expires",
                                      reason="pull_request_refused")
        # Leadership change, too many waiting requests, ...: pull again, but not at once.
        self._pause_until = asyncio.get_running_loop().time() + _PAUSE_AFTER_REFUSAL

    async def next_messages(self, timeout: float, *, whole_request: bool = False, renew: bool = True) -> list[Any]:
        """Messages delivered within ``timeout`` seconds, as soon as some arrived ([] if none); ``whole_request``:
        and until the open request delivered its ``batch`` or ended (a batch is not cut where its messages arrived
        in separate reads); ``renew=False``: no new request once the open one ended. Messages held when it raises
        (a cancellation, a status) go to :meth:`close`'s ``leftover``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        out: list[Any] = []
        try:
            while True:
                if not self._queue.empty():
                    self._take(self._queue.get_nowait(), out)
                    continue
                if (out and not (whole_request and self._open)) or loop.time() >= end or not (self._open or renew):
                    return out
                if not self._open:
                    if loop.time() < self._pause_until:
                        await asyncio.sleep(min(end, self._pause_until) - loop.time())
                    else:
                        await self._request()
                    continue
                try:
                    async with asyncio.timeout(min(end, self._request_deadline) - loop.time()):
                        self._take(await self._queue.get(), out)
                except TimeoutError:
                    if loop.time() >= self._request_deadline:
                        self._open = False  # it ended without a status (its answer was lost)
        except BaseException:
            self._unreturned.extend(out)
            raise

    async def close(self, leftover: Callable[[Any], Awaitable[Any]] | None = None) -> None:
        """Unsubscribe; with ``leftover``, first wait for the open request to end (a message naked while it is open
        would come straight back to it), then pass it every delivered message not returned."""
        if self._sub is None:
            return
        try:
            if leftover is not None and not self.conn.nc.is_closed:
                # every message queued or still arriving until the open request ends (or the consumer is gone)
                with contextlib.suppress(ConsumerNotFoundError, ConsumerConfigError):
                    wait = self._request_deadline - asyncio.get_running_loop().time()
                    self._unreturned += await self.next_messages(wait, whole_request=True, renew=False)
        finally:
            held, self._unreturned = self._unreturned, []
            sub, self._sub = self._sub, None
            if not self.conn.nc.is_closed:
                await sub.unsubscribe()
        if leftover is not None:
            for msg in held:
                await leftover(msg)


@dataclass
class _Tally:
    processed: int = 0
    acked: int = 0
    terminated: int = 0
    batches: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    stopped: str = "no_messages"

    def saw(self, messages: Sequence[Message]) -> None:
        seqs = [m.seq for m in messages]
        self.first_seq = min(seqs) if self.first_seq is None else min(self.first_seq, *seqs)
        self.last_seq = max(seqs) if self.last_seq is None else max(self.last_seq, *seqs)


def _describe(messages: Sequence[Message]) -> str:
    first, last = messages[0], messages[-1]
    where = f"message seq {first.seq} ({first.subject!r})" if len(messages) == 1 else \
        f"batch of {len(messages)} messages, seq {first.seq}..{last.seq}"
    return f"{where}, delivery {max(m.delivered for m in messages)}"


async def consume(conn: JetStreamConnection, stream: str, apply: Callable[[Any], Any], *,
                  consumer: str | None = None, subjects: Sequence[str] = (), start_seq: int | None = None,
                  start_time: datetime | str | None = None, end_seq: int | None = None, create: bool = True,
                  ack_wait: Duration = DEFAULT_ACK_WAIT, max_deliver: int | None = None,
                  options: ConsumeOptions | None = None) -> dict[str, Any]:
    """Read ``stream`` and call ``apply`` with each :class:`Message` (a list with ``per_batch``); see the module
    docs. ``ack_wait`` (longer than the function takes per batch) and ``max_deliver`` go to a created consumer."""
    options = options or ConsumeOptions()
    validate_name(stream, what="stream name")
    subjects = validate_subjects(subjects, what="filter subjects")
    if start_seq is not None and start_time is not None:
        raise InvalidRequestError("give either start_seq or start_time, not both", reason="invalid_option")
    if start_seq is not None and (isinstance(start_seq, bool) or not isinstance(start_seq, int) or start_seq < 1):
        raise InvalidRequestError(f"start_seq must be a stream sequence >= 1, got {start_seq!r}",
                                  reason="invalid_seq")
    if consumer is None:
        plan = await plan_read(conn, stream, subjects=subjects, start_seq=start_seq, start_time=start_time,
                               end_seq=end_seq)
        log.info("Ordered read of stream %s, seq %d..%d (%s)", stream, plan.first_seq, plan.last_seq,
                 list(plan.subjects) or "all subjects")
        tally = _Tally(stopped="end_of_range")
        reader = read_range(conn, stream, plan.first_seq, plan.last_seq, subjects=plan.subjects,
                            via=read_method(plan, consume=False), batch=options.batch_size)
        await _apply_all(conn, stream, reader, apply, options, tally, f" (ordered read of seq {plan.first_seq}.."
                         f"{plan.last_seq})")
        next_seq = (tally.last_seq + 1) if tally.last_seq is not None else plan.first_seq
        return {"mode": "ordered", "stream": stream, "consumer": None, **asdict(tally), "next_seq": next_seq,
                "range": [plan.first_seq, plan.last_seq]}
    if end_seq is not None:
        raise InvalidRequestError("end_seq bounds an ordered read; a durable consumer reads up to max_messages "
                                  "or until nothing arrives within fetch_timeout", reason="invalid_option")
    await _bind_consumer(conn, stream, consumer, subjects, start_seq, start_time, create, ack_wait, max_deliver)
    tally = _Tally()
    await _apply_all(conn, stream, _deliveries(conn, stream, consumer, options, tally), apply, options, tally, "")
    info = await consumer_info(conn, stream, consumer)
    return {"mode": "durable", "stream": stream, "consumer": consumer, **asdict(tally),
            "num_pending": int(info.get("num_pending", 0)), "num_ack_pending": int(info.get("num_ack_pending", 0))}


async def _bind_consumer(conn: JetStreamConnection, stream: str, name: str, subjects: Sequence[str],
                         start_seq: int | None, start_time: datetime | str | None, create: bool,
                         ack_wait: Duration, max_deliver: int | None) -> None:
    where = f"consumer {name!r} on stream {stream!r}"
    info = await find_consumer(conn, stream, name)
    if info is None:
        if not create:
            raise ConsumerNotFoundError(f"{where} does not exist; create it or let the read create it (create=True)")
        config: dict[str, Any] = {"durable_name": name, "ack_policy": "explicit", "ack_wait": ack_wait,
                                  "description": "airflow-jetstream consume"}
        if start_seq is not None:
            config.update(deliver_policy="by_start_sequence", opt_start_seq=start_seq)
        elif start_time is not None:
            config.update(deliver_policy="by_start_time", opt_start_time=to_rfc3339(start_time))
        config.update(filter_config(subjects))
        if max_deliver is not None:
            config["max_deliver"] = max_deliver
        await ensure_consumer(conn, stream, config)
        log.info("Created durable consumer %s on stream %s (filters %s)", name, stream, list(subjects) or "all")
        return
    cfg = info["config"]
    if cfg.get("deliver_subject"):
        raise ConsumerConfigError(f"{where} is a push consumer (it has a deliver_subject); consume with a pull "
                                  "consumer: another name, or delete this one", reason="not_pull_consumer")
    if cfg.get("ack_policy") != "explicit":
        raise ConsumerConfigError(f"{where} has ack_policy {cfg.get('ack_policy')!r}: acks after success need "
                                  "'explicit'; use another consumer name", reason="ack_policy_not_explicit")
    filters = config_filters(cfg)
    if subjects and sorted(subjects) != sorted(filters):
        raise InvalidRequestError(f"{where} filters {filters or 'all subjects'}, not {list(subjects)}; leave "
                                  "subjects unset to read it as it is, or use another consumer name",
                                  reason="filter_mismatch")
    log.info("Bound durable consumer %s on stream %s: %s message(s) pending", name, stream, info.get("num_pending"))


async def _deliveries(conn: JetStreamConnection, stream: str, consumer: str, options: ConsumeOptions,
                      tally: _Tally) -> AsyncGenerator[list[Any], None]:
    """The durable consumer's deliveries, a pull request at a time, until none arrives within ``fetch_timeout``."""
    pull = PullSubscription(conn, stream, consumer, batch=options.batch_size, expires=options.fetch_timeout_seconds)
    await pull.start()
    try:
        while True:
            want = min(options.batch_size, _room(options, tally, options.batch_size))
            if want != pull.batch:  # never pull more than the limit leaves to process
                await pull.close(leftover=lambda msg: msg.nak())
                pull = PullSubscription(conn, stream, consumer, batch=want, expires=options.fetch_timeout_seconds)
                await pull.start()
            delivered = await pull.next_messages(timeout=options.fetch_timeout_seconds, whole_request=options.per_batch)
            if not delivered:
                log.info("No message from consumer %s within %.1f s: done", consumer, options.fetch_timeout_seconds)
                return
            yield delivered
    finally:
        if not conn.nc.is_closed:
            await pull.close(leftover=lambda msg: msg.nak())


def _room(options: ConsumeOptions, tally: _Tally, delivered: int) -> int:
    """How many of ``delivered`` messages ``max_messages`` leaves to process."""
    if options.max_messages is None:
        return delivered
    return options.max_messages - tally.processed - tally.terminated


async def _apply_all(conn: JetStreamConnection, stream: str, chunks: AsyncGenerator[list[Any], None],
                     apply: Callable[[Any], Any], options: ConsumeOptions, tally: _Tally, read: str) -> None:
    """Call ``apply`` on the messages of ``chunks`` (a consumer's deliveries, or the stored rows of an ordered
    ``read``) up to ``max_messages``, per message or per batch."""
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            room = _room(options, tally, len(chunk))
            take, extra = chunk[:room], chunk[room:]
            for msg in [] if read else extra:  # over the limit: back to the consumer at once, not processed
                await msg.nak()
            groups = [take] if options.per_batch else [[msg] for msg in take]
            for index, group in enumerate(groups):
                try:
                    await _process(conn, stream, group, apply, options, tally, read)
                except BaseException:
                    if not read:
                        await _release([msg for rest in groups[index + 1:] for msg in rest], conn)
                    raise
            if _room(options, tally, 1) <= 0:
                tally.stopped = "max_messages"
                return


async def _release(messages: list[Any], conn: JetStreamConnection) -> None:
    """Nak delivered messages not processed, so they come again at once (else after ``ack_wait``)."""
    with contextlib.suppress(Exception):
        for msg in messages:
            await msg.nak()
        await conn.nc.flush(timeout=conn.settings.request_timeout)  # type: ignore[arg-type]  # float s work


async def _process(conn: JetStreamConnection, stream: str, group: list[Any], apply: Callable[[Any], Any],
                   options: ConsumeOptions, tally: _Tally, read: str) -> None:
    """Apply the function to a group: deliveries are then acked, terminated (``term_on``) or naked; the messages
    of an ordered ``read`` (stored rows) are only counted."""
    deliveries, term_on = ([], ()) if read else (group, options.term_on)
    messages = messages_of(stream, group) if read else [Message.from_delivery(msg) for msg in group]
    try:
        await call_function(apply, messages if options.per_batch else messages[0])
    except term_on as exc:
        for msg in deliveries:
            await msg.term()
        tally.terminated += len(group)
        tally.saw(messages)
        log.warning("Terminated %s (never redelivered): apply_function raised %s: %s", _describe(messages),
                    type(exc).__name__, exc)
        return
    except Exception as exc:  # the user's function: any error leaves the messages unacknowledged
        then = "a retry reads the range again from its start"
        if not read:
            delay = options.delay_for(max(m.delivered for m in messages))
            for msg in deliveries:
                await msg.nak(delay=delay)
            then = (f"nothing of it was acknowledged: it is redelivered after {delay:g} s to the next read (a task "
                    "retry). Fix the function or the data, or list the exception in term_on to drop such messages")
        raise ApplyFunctionError(f"apply_function failed on {_describe(messages)} of stream {stream!r}{read}: "
                                 f"{type(exc).__name__}: {exc}; {then}") from exc
    for msg in deliveries:
        try:
            await msg.ack_sync(timeout=conn.settings.request_timeout)
        except TimeoutError:  # nats-py's is one too
            raise RequestTimeoutError(
                f"the server did not confirm the ack of message seq {msg.metadata.sequence.stream} within "
                f"{conn.settings.request_timeout}s; it may be delivered (and processed) again"
            ) from None
    tally.processed += len(group)
    tally.acked += len(deliveries)
    tally.batches += 1
    tally.saw(messages)


__all__ = ["DEFAULT_NAK_DELAY", "ConsumeOptions", "PullSubscription", "consume"]
