"""A user function over a stream's messages: :func:`consume` (docs/operators/consume.md), a durable pull consumer or an
ordered read, and :func:`find_message`, the first message a function accepts.

* **Durable** (``consumer`` given; created when missing): each message (or batch, ``per_batch``) is acked only after
  the function returned, the ack confirmed by the server. A failure listed in ``term_on`` terminates it (never
  redelivered) and consuming goes on; any other naks it with a delay from ``nak_delay``, naks the rest delivered at
  once and raises :class:`ApplyFunctionError`: nothing unacknowledged is lost, nothing acknowledged runs twice.
* **Ordered read** (no ``consumer``): ``start_seq`` (or ``start_time``, or the first) up to ``end_seq`` (default:
  the last stored when it starts), with no cursor on the server; a failure raises and a retry reads it all again.

The summary is JSON-able (``mode``, ``processed``, ``acked``, ``terminated``, ``first_seq``/``last_seq``,
``next_seq``, ``stopped``; durable reads add the consumer's ``num_pending`` and ``num_ack_pending``).

:func:`find_message` serves the message sensor (scan what is stored now, resume later from ``next_seq``) and its
trigger (keep waiting for new messages)::

    start = await resolve_start(conn, "ORDERS", "new")           # or a sequence, or a time
    found = await find_message(conn, "ORDERS", is_order_42, subject="orders.>", start_seq=start)
    found["message"]   # None, or the matching message as a dict (subject, seq, headers, data, ...)

It creates no consumer: what is stored is read by direct get (or message get without ``allow_direct``), so
WorkQueue and Interest streams keep their messages; new messages come through the connection's one subscription
to the stream (:mod:`~airflow_jetstream.client.reading.shared_tail`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import nats.errors

from airflow_jetstream.client.admin.consumers import (
    config_filters,
    consumer_info,
    ensure_consumer,
    filter_config,
    find_consumer,
)
from airflow_jetstream.client.admin.streams import first_seq_at_or_after, stream_info
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import parse_time, to_rfc3339
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
    with_result,
)
from airflow_jetstream.client.reading.messages import Message
from airflow_jetstream.client.reading.pull import PullSubscription
from airflow_jetstream.client.reading.read_plan import plan_read, read_method
from airflow_jetstream.client.reading.shared_tail import follow as tail
from airflow_jetstream.client.reading.stored import BATCH, messages_of, read_range
from airflow_jetstream.client.subjects import validate_name, validate_subject, validate_subjects

START_WORDS = ("new", "first")
log = logging.getLogger(__name__)


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
        summary = await _consume_ordered(conn, stream, apply, subjects, start_seq, start_time, end_seq, options)
        return {"mode": "ordered", "stream": stream, "consumer": None, **summary}
    if end_seq is not None:
        raise InvalidRequestError("end_seq bounds an ordered read; a durable consumer reads up to max_messages "
                                  "or until nothing arrives within fetch_timeout", reason="invalid_option")
    await _bind_consumer(conn, stream, consumer, subjects, start_seq, start_time, create, ack_wait, max_deliver)
    summary = await _consume_durable(conn, stream, consumer, apply, options)
    info = await consumer_info(conn, stream, consumer)
    return {"mode": "durable", "stream": stream, "consumer": consumer, **summary,
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


async def _consume_durable(conn: JetStreamConnection, stream: str, consumer: str, apply: Callable[[Any], Any],
                           options: ConsumeOptions) -> dict[str, Any]:
    tally = _Tally()
    limit = options.max_messages
    pull = PullSubscription(conn, stream, consumer, batch=options.batch_size, expires=options.fetch_timeout_seconds)
    await pull.start()
    try:
        while limit is None or tally.processed + tally.terminated < limit:
            want = options.batch_size if limit is None else min(options.batch_size,
                                                                 limit - tally.processed - tally.terminated)
            if want != pull.batch:  # never pull more than the limit leaves to process
                await pull.close(leftover=lambda msg: msg.nak())
                pull = PullSubscription(conn, stream, consumer, batch=want, expires=options.fetch_timeout_seconds)
                await pull.start()
            delivered = await pull.next_messages(timeout=options.fetch_timeout_seconds, whole_request=options.per_batch)
            if not delivered:
                log.info("No message from consumer %s within %.1f s: done", consumer, options.fetch_timeout_seconds)
                break
            room = len(delivered) if limit is None else limit - tally.processed - tally.terminated
            take, extra = delivered[:room], delivered[room:]
            for msg in extra:  # over the limit: back to the consumer at once, not processed
                await msg.nak()
            groups = [take] if options.per_batch else [[msg] for msg in take]
            for index, group in enumerate(groups):
                try:
                    await _process(conn, group, apply, options, tally)
                except BaseException:
                    await _release([msg for rest in groups[index + 1:] for msg in rest], conn)
                    raise
        else:
            tally.stopped = "max_messages"
    finally:
        if not conn.nc.is_closed:
            await pull.close(leftover=lambda msg: msg.nak())
    return asdict(tally)


async def _release(messages: list[Any], conn: JetStreamConnection) -> None:
    """Nak delivered messages not processed, so they come again at once (else after ``ack_wait``)."""
    with contextlib.suppress(Exception):
        for msg in messages:
            await msg.nak()
        await conn.nc.flush(timeout=conn.settings.request_timeout)  # type: ignore[arg-type]  # float s work


async def _process(conn: JetStreamConnection, group: list[Any], apply: Callable[[Any], Any],
                   options: ConsumeOptions, tally: _Tally) -> None:
    messages = [Message.from_delivery(msg) for msg in group]
    try:
        await call_function(apply, messages if options.per_batch else messages[0])
    except options.term_on as exc:
        for msg in group:
            await msg.term()
        tally.terminated += len(group)
        tally.saw(messages)
        log.warning("Terminated %s (never redelivered): apply_function raised %s: %s", _describe(messages),
                    type(exc).__name__, exc)
        return
    except Exception as exc:  # the user's function: any error leaves the messages unacknowledged
        delay = options.delay_for(max(m.delivered for m in messages))
        for msg in group:
            await msg.nak(delay=delay)
        raise ApplyFunctionError(
            f"apply_function failed on {_describe(messages)} of stream {messages[0].stream!r}: "
            f"{type(exc).__name__}: {exc}; nothing of it was acknowledged: it is redelivered after {delay:g} s "
            "to the next read (a task retry). Fix the function or the data, or list the exception in term_on "
            "to drop such messages"
        ) from exc
    for msg in group:
        try:
            await msg.ack_sync(timeout=conn.settings.request_timeout)
        except nats.errors.TimeoutError:
            raise RequestTimeoutError(
                f"the server did not confirm the ack of message seq {msg.metadata.sequence.stream} within "
                f"{conn.settings.request_timeout}s; it may be delivered (and processed) again"
            ) from None
    tally.processed += len(group)
    tally.acked += len(group)
    tally.batches += 1
    tally.saw(messages)


async def _consume_ordered(conn: JetStreamConnection, stream: str, apply: Callable[[Any], Any],
                           subjects: Sequence[str], start_seq: int | None, start_time: datetime | str | None,
                           end_seq: int | None, options: ConsumeOptions) -> dict[str, Any]:
    plan = await plan_read(conn, stream, subjects=subjects, start_seq=start_seq, start_time=start_time,
                           end_seq=end_seq)
    tally = _Tally(stopped="end_of_range")
    log.info("Ordered read of stream %s, seq %d..%d (%s)", stream, plan.first_seq, plan.last_seq,
             list(plan.subjects) or "all subjects")
    limit = options.max_messages
    reader = read_range(conn, stream, plan.first_seq, plan.last_seq, subjects=plan.subjects,
                        via=read_method(plan, consume=False), batch=options.batch_size)
    async with contextlib.aclosing(reader):
        async for chunk in reader:
            messages = messages_of(stream, chunk)
            if limit is not None:
                messages = messages[:limit - tally.processed]
            groups = [messages] if options.per_batch else [[m] for m in messages]
            for group in groups:
                try:
                    await call_function(apply, group if options.per_batch else group[0])
                except Exception as exc:  # the user's function
                    raise ApplyFunctionError(
                        f"apply_function failed on {_describe(group)} of stream {stream!r} (ordered read of "
                        f"seq {plan.first_seq}..{plan.last_seq}): {type(exc).__name__}: {exc}; a retry reads "
                        "the range again from its start"
                    ) from exc
                tally.processed += len(group)
                tally.batches += 1
                tally.saw(group)
            if limit is not None and tally.processed >= limit:
                tally.stopped = "max_messages"
                break
    summary = asdict(tally)
    summary["next_seq"] = (tally.last_seq + 1) if tally.last_seq is not None else plan.first_seq
    summary["range"] = [plan.first_seq, plan.last_seq]
    return summary


async def resolve_start(conn: JetStreamConnection, stream: str, start: int | str | datetime) -> int:
    """The first stream sequence to look at: ``"new"`` (after the last stored now), ``"first"``, a
    sequence (int or digits) or a time (datetime or ISO 8601; the first message stored at or after it)."""
    if isinstance(start, bool):
        raise InvalidRequestError(f"start: {start!r} is not a start point", reason="invalid_start")
    if isinstance(start, int):
        if start < 1:
            raise InvalidRequestError(f"start sequence must be >= 1, got {start}", reason="invalid_start")
        return start
    if isinstance(start, str) and start.strip().isdigit():
        return await resolve_start(conn, stream, int(start.strip()))
    if isinstance(start, str) and start.strip().lower() in START_WORDS:
        state = (await stream_info(conn, stream))["state"]
        return 1 if start.strip().lower() == "first" else int(state.get("last_seq") or 0) + 1
    try:
        when = parse_time(start, field="start")
    except InvalidRequestError:
        raise InvalidRequestError(f"start {start!r} is not a start point: use 'new', 'first', a stream sequence "
                                  "or a time (ISO 8601 or datetime)", reason="invalid_start") from None
    return await first_seq_at_or_after(conn, stream, when)


async def find_message(conn: JetStreamConnection, stream: str, match: Callable[[Message], Any], *,
                       subject: str | None = None, start_seq: int = 1, follow: bool = False) -> dict[str, Any]:
    """The first message from ``start_seq`` for which ``match(message)`` is truthy: among what is stored now, or
    with ``follow`` also among new messages until one matches (cancel the task to stop). Returns ``{"message":
    dict | None, "next_seq": where to resume, "scanned": messages looked at}``; a non-bool return value of
    ``match`` is added to the message as ``result``."""
    validate_name(stream, what="stream name")
    if subject is not None:
        validate_subject(subject, allow_wildcards=True, what="subject")
    if isinstance(start_seq, bool) or not isinstance(start_seq, int) or start_seq < 1:
        raise InvalidRequestError(f"start_seq must be a stream sequence >= 1, got {start_seq!r}",
                                  reason="invalid_start")
    state = {"next_seq": start_seq, "scanned": 0}

    async def look(messages: list[Message]) -> dict[str, Any] | None:
        for message in messages:
            if message.seq < state["next_seq"]:
                continue  # read before (the stored part and the followed part meet at one sequence)
            state["scanned"] += 1
            state["next_seq"] = message.seq + 1
            try:
                result = await call_function(match, message)
            except Exception as exc:  # the user's function
                raise ApplyFunctionError(
                    f"apply_function failed on message seq {message.seq} ({message.subject!r}) of stream {stream!r}: "
                    f"{type(exc).__name__}: {exc}; fix the function (it must accept every message of the subject)"
                ) from exc
            if result:
                return {"message": with_result(message.to_dict(), result), **state}
        return None

    async def look_through(last: int, info: dict[str, Any]) -> dict[str, Any] | None:
        """What is stored from ``next_seq`` up to ``last``, read without a consumer."""
        pages = read_range(conn, stream, state["next_seq"], last, subjects=(subject or ">",), via=None, batch=BATCH,
                           info=info)
        async with contextlib.aclosing(pages):
            async for page in pages:
                if (found := await look(messages_of(stream, page))) is not None:
                    return found
        return None

    if not follow:
        info = await stream_info(conn, stream)
        last = int(info["state"].get("last_seq") or 0)
        found = await look_through(last, info)
        return found or {"message": None, "next_seq": max(state["next_seq"], last + 1), "scanned": state["scanned"]}
    async with tail(conn, stream, subject or ">") as listener:
        async with listener.catching_up():
            found = await look_through(listener.since, await listener.tail.info())
        state["next_seq"] = max(state["next_seq"], listener.since + 1)
        while found is None:
            found = await look(await listener.next_batch())
        return found


__all__ = ["DEFAULT_NAK_DELAY", "START_WORDS", "ConsumeOptions", "consume", "find_message", "resolve_start"]
