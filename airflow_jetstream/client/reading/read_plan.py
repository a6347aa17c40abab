"""Bounded reads planned and acknowledged: which sequences a read covers (fixed once, split into ranges that Spark
partitions read in parallel with :func:`~airflow_jetstream.client.reading.stored.read_range`, or into per-worker
subject groups), how the stream can be read, and what a consume job removes once its output is safe
(:func:`acknowledge_read`: a purge of a WorkQueue stream, or its cursor consumer moved past the plan); where a read
starts (:func:`resolve_start`) and the first message from there a function accepts (:func:`find_message`).

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
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from airflow_jetstream.client.admin.consumers import (
    config_filters,
    ensure_consumer,
    filter_config,
    find_consumer,
    reset_consumer,
)
from airflow_jetstream.client.admin.streams import first_seq_at_or_after, stream_info
from airflow_jetstream.client.admin.worker_consumers import ensure_worker_consumer
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import parse_time
from airflow_jetstream.client.errors import ApplyFunctionError, InvalidRequestError
from airflow_jetstream.client.reading.apply_function import call_function, with_result
from airflow_jetstream.client.reading.messages import Message
from airflow_jetstream.client.reading.shared_tail import follow as tail
from airflow_jetstream.client.reading.stored import BATCH, messages_of, read_range
from airflow_jetstream.client.subjects import is_fence_subject, validate_name, validate_subject, validate_subjects

START_WORDS = ("new", "first")


@dataclass(frozen=True)
class ReadPlan:
    """What a bounded read covers: ``first_seq .. last_seq`` of ``stream`` (inclusive), fixed at planning."""

    stream: str
    retention: str
    first_seq: int
    last_seq: int
    subjects: tuple[str, ...] = ()
    messages: int = 0
    allow_direct: bool = False
    ranges: tuple[tuple[int, int], ...] = field(default=())
    consumer: str | None = None
    #: Subject-partitioned reads: (worker consumer name, its subjects, first seq to read) per partition.
    workers: tuple[tuple[str, tuple[str, ...], int], ...] = field(default=())

    @property
    def empty(self) -> bool:
        return self.last_seq < self.first_seq

    def to_dict(self) -> dict[str, Any]:
        return {
            "stream": self.stream, "retention": self.retention, "first_seq": self.first_seq,
            "last_seq": self.last_seq, "subjects": list(self.subjects), "messages": self.messages,
            "ranges": [list(r) for r in self.ranges], "consumer": self.consumer,
            "workers": [{"consumer": name, "subjects": list(subjects), "first_seq": first}
                        for name, subjects, first in self.workers],
        }

    def partitions(self) -> list[tuple[int, int, tuple[str, ...]]]:
        """(first, last, subjects) per partition: sequence ranges, or one per worker consumer."""
        if self.workers:
            return [(first, self.last_seq, subjects) for _, subjects, first in self.workers]
        return [(first, last, self.subjects) for first, last in self.ranges]


def split_range(first: int, last: int, parts: int) -> tuple[tuple[int, int], ...]:
    """Split ``first..last`` into at most ``parts`` contiguous, non-empty, inclusive ranges."""
    if last < first:
        return ()
    total = last - first + 1
    parts = max(1, min(parts, total))
    size, extra = divmod(total, parts)
    ranges, start = [], first
    for index in range(parts):
        end = start + size - 1 + (1 if index < extra else 0)
        ranges.append((start, end))
        start = end + 1
    return tuple(ranges)


async def plan_read(conn: JetStreamConnection, stream: str, *, subjects: Sequence[str] = (),
                    start_seq: int | None = None, start_time: datetime | str | None = None,
                    end_seq: int | None = None, partitions: int = 1, consumer: str | None = None) -> ReadPlan:
    """Fix the bounds of a read: from the start (or the stream's first message) to ``end_seq`` (default: the last
    sequence right now), split into ``partitions`` ranges. With ``consumer``, a durable cursor (created when
    missing by :func:`ensure_cursor`; nothing pulls from it), the read starts after its ack floor and uses its
    filters; :func:`acknowledge_read` moves it past what a successful job read."""
    validate_name(stream, what="stream name")
    validate_subjects(subjects, what="filter subjects")
    if start_seq is not None and start_time is not None:
        raise InvalidRequestError("give either start_seq or start_time, not both", reason="invalid_option")
    info = await stream_info(conn, stream)
    state, config = info["state"], info["config"]
    first = max(int(state.get("first_seq") or 1), 1)
    if not subjects:  # the stream's own subjects: its write fences are not data
        own = [s for s in config.get("subjects") or [] if not is_fence_subject(s)]
        if len(own) < len(config.get("subjects") or []):
            subjects = own
    if consumer is not None:
        cinfo = (await ensure_cursor(conn, stream, consumer, subjects=subjects))["info"]
        filters = tuple(config_filters(cinfo["config"]))
        if subjects and tuple(subjects) != filters:
            raise InvalidRequestError(
                f"consumer {consumer!r} filters {list(filters) or 'all subjects'}; leave subjects unset "
                "(the consumer's filters are used) or give the same ones",
                reason="invalid_option",
            )
        subjects = filters
        first = max(first, int(cinfo.get("ack_floor", {}).get("stream_seq") or 0) + 1)
    if start_seq is not None:
        first = max(first, int(start_seq))
    elif start_time is not None:
        first = max(first, await first_seq_at_or_after(conn, stream, start_time))
    last = int(state.get("last_seq") or 0)
    if end_seq is not None:
        last = min(last, int(end_seq))
    return ReadPlan(
        stream=stream,
        retention=config.get("retention", "limits"),
        first_seq=first,
        last_seq=last,
        subjects=tuple(subjects),
        messages=int(state.get("messages") or 0),
        allow_direct=bool(config.get("allow_direct")),
        ranges=split_range(first, last, partitions),
        consumer=consumer,
    )


async def ensure_cursor(conn: JetStreamConnection, stream: str, name: str, *,
                        subjects: Sequence[str] = ()) -> dict[str, Any]:
    """The durable consumer that bookmarks a bounded reader's progress, created when missing; an existing one is
    left as it is (a reset moves it for replays): ``ensure_consumer``'s result or ``{"action": "existing"}``."""
    existing = await find_consumer(conn, stream, name)
    if existing is not None:
        return {"action": "existing", "info": existing}
    config: dict[str, Any] = {"durable_name": name, "ack_policy": "explicit", "deliver_policy": "all",
                              "description": "read cursor of airflow-jetstream bounded reads"}
    return await ensure_consumer(conn, stream, {**config, **filter_config(subjects)})


async def plan_worker_read(conn: JetStreamConnection, plan: ReadPlan, groups: Sequence[Sequence[str]], *,
                           prefix: str) -> ReadPlan:
    """Partition ``plan`` by subject groups: group ``i``'s cursor is worker consumer ``<prefix>-<i>`` (updated only
    when its subjects changed); its part starts after its ack floor, :func:`acknowledge_read` moves it past."""
    workers = []
    for index, group in enumerate(groups):
        result = await ensure_worker_consumer(conn, plan.stream, prefix, index, list(group),
                                              inactive_threshold=None, config={"deliver_policy": "all"})
        floor = int(result["info"].get("ack_floor", {}).get("stream_seq") or 0)
        workers.append((result["consumer"], tuple(result["subjects"]), max(plan.first_seq, floor + 1)))
    subjects = tuple(s for _, group, _ in workers for s in group)
    return dataclasses.replace(plan, workers=tuple(workers), subjects=subjects, ranges=())


def read_method(plan: ReadPlan, *, consume: bool) -> str:
    """How to read the plan's stream, or a clear error when the stream cannot be read that way."""
    if consume and plan.retention in ("limits", "interest") and not (plan.consumer or plan.workers):
        raise InvalidRequestError(
            f"stream {plan.stream!r} has {plan.retention} retention: consuming it means advancing a durable "
            "consumer as a cursor; give the consumer option (a consumer name used only by this job; it is "
            "created when missing)",
            reason="consumer_required",
        )
    if plan.retention == "limits":
        return "consumer"
    if not plan.allow_direct:
        raise InvalidRequestError(
            f"stream {plan.stream!r} ({plan.retention} retention) is read without a consumer, by direct "
            "get, so that nothing is consumed before the job succeeded; set allow_direct: true on the "
            "stream (JetStreamEnsureStreamOperator / ensure_stream can change it in place)",
            reason="direct_get_disabled",
        )
    return "direct"


async def acknowledge_read(conn: JetStreamConnection, plan: ReadPlan) -> int:
    """Acknowledge everything ``plan`` covered once the job that read it succeeded: WorkQueue purges the plan's
    filters below ``last_seq + 1``; Interest and Limits reset the cursor consumer(s) to ``last_seq + 1``. Later
    messages stay for the next run. Returns how many messages the stream lost (Limits: none)."""
    if plan.empty:
        return 0
    if plan.retention == "workqueue":
        purged = 0
        for subject in plan.subjects or (None,):
            body: dict[str, Any] = {"seq": plan.last_seq + 1}
            if subject:
                body["filter"] = subject
            reply = await conn.api_request(f"STREAM.PURGE.{plan.stream}", body,
                                           context=f"acknowledge read of stream {plan.stream!r}")
            purged += int(reply.get("purged", 0))
        return purged
    if plan.workers:
        cursors = [name for name, _, first in plan.workers if first <= plan.last_seq]
    elif plan.retention in ("interest", "limits") and plan.consumer:
        cursors = [plan.consumer]
    else:
        cursors = None
    if cursors is not None:
        before = int((await stream_info(conn, plan.stream))["state"].get("messages") or 0)
        for name in cursors:
            await reset_consumer(conn, plan.stream, name, seq=plan.last_seq + 1)
        after = int((await stream_info(conn, plan.stream))["state"].get("messages") or 0)
        return max(0, before - after)
    raise InvalidRequestError(f"stream {plan.stream!r} ({plan.retention} retention) has nothing to acknowledge",
                              reason="consume_not_supported")


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
