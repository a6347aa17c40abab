"""Bounded reads of a stream by sequence range, and purging what a consume job has read.

A read is planned once (:func:`plan_read` fixes the last sequence at that moment) and split into
sequence ranges that can be read in parallel by separate processes (Spark partitions):

* :func:`read_range` with ``via="consumer"`` uses a short-lived ephemeral pull consumer with
  ``ack_policy: none`` starting at the range's first sequence, pulls in large batches and reads
  sequence/timestamp from the delivery reply subject (no per-message API round trip). It does not
  change the stream. WorkQueue streams refuse such consumers, so they are read with
* ``via="direct"``: batched direct get (``$JS.API.DIRECT.GET.<stream>`` with ``batch``), which
  needs ``allow_direct: true`` on the stream and creates no consumer at all.

Neither way removes anything. :func:`acknowledge_read` removes what a consume job read once its
output is safe: from a WorkQueue stream by a purge of the read's filters up to the planned last
sequence; from an Interest stream by moving the job's durable consumer past the planned last
sequence (a consumer reset), after which the server drops what no consumer still needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import sys
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from airflow_jetstream.client.admin.consumers import (
    ensure_consumer,
    find_consumer,
    first_seq_at_or_after,
    reset_consumer,
)
from airflow_jetstream.client.admin.streams import stream_info
from airflow_jetstream.client.admin.worker_consumers import ensure_worker_consumer
from airflow_jetstream.client.batches.types import HEADER_STATUS
from airflow_jetstream.client.connection import QUORUM_ADVICE, JetStreamConnection
from airflow_jetstream.client.errors import (
    InvalidRequestError,
    JetStreamError,
    LeaderUnavailableError,
)
from airflow_jetstream.client.natspy_internals import install_header_parser
from airflow_jetstream.client.reading.headers import without
from airflow_jetstream.client.retry import retry
from airflow_jetstream.client.subjects import validate_name, validate_subjects

#: Headers the server adds to a direct-get reply; they are metadata, not the message's own headers.
_DIRECT_GET_HEADERS = frozenset({
    "Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Num-Pending", "Nats-Last-Sequence",
})
#: One stored message: subject, stream sequence, timestamp (ns since epoch), headers or None, payload.
StoredMessage = tuple[str, int, int, dict[str, str] | None, bytes]
#: Pull / direct-get statuses that mean "no leader right now": no responders, leadership change.
_LEADER_STATUSES = frozenset({"503", "409"})
_ERR_NO_MESSAGE = 10037
log = logging.getLogger(__name__)


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


def use_fast_header_parser(conn: JetStreamConnection) -> None:
    """Make sure ``conn`` parses headers with the toolkit's parser (nats-py's, keeping repeated names)."""
    install_header_parser(conn.nc)


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
    """Fix the bounds of a read: from the start (or the stream's first message) to ``end_seq``
    (default: the stream's last sequence right now), split into ``partitions`` ranges.

    With ``consumer`` (a durable consumer used as the read's cursor) the read starts after the
    consumer's ack floor and uses the consumer's filter subjects. A missing cursor is created
    (pull, ``deliver_policy`` all, explicit acks, filtered to ``subjects``); nothing pulls from it:
    :func:`acknowledge_read` moves it past what a successful job read.
    """
    validate_name(stream, what="stream name")
    validate_subjects(subjects, what="filter subjects")
    if start_seq is not None and start_time is not None:
        raise InvalidRequestError("give either start_seq or start_time, not both", reason="invalid_option")
    info = await stream_info(conn, stream)
    state, config = info["state"], info["config"]
    first = max(int(state.get("first_seq") or 1), 1)
    if consumer is not None:
        cinfo = (await ensure_cursor(conn, stream, consumer, subjects=subjects))["info"]
        ccfg = cinfo["config"]
        filters = tuple(ccfg.get("filter_subjects") or ([ccfg["filter_subject"]] if ccfg.get("filter_subject") else []))
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
    """The durable consumer that bookmarks a bounded reader's progress; created when missing.

    An existing consumer is left as it is (its filters and position win), so a consumer reset moves
    the cursor for replays. Returns ``ensure_consumer``'s result, or ``{"action": "existing", ...}``.
    """
    existing = await find_consumer(conn, stream, name)
    if existing is not None:
        return {"action": "existing", "info": existing}
    config: dict[str, Any] = {"durable_name": name, "ack_policy": "explicit", "deliver_policy": "all",
                              "description": "read cursor of airflow-jetstream bounded reads"}
    if len(subjects) == 1:
        config["filter_subject"] = subjects[0]
    elif subjects:
        config["filter_subjects"] = list(subjects)
    return await ensure_consumer(conn, stream, config)


async def plan_worker_read(conn: JetStreamConnection, plan: ReadPlan, groups: Sequence[Sequence[str]], *,
                           prefix: str) -> ReadPlan:
    """Partition ``plan`` by subject groups: group ``i`` is read by worker ``i``, whose durable pull
    consumer ``<prefix>-<i>`` (per-worker consumer with FilterSubjects, created or updated only when
    its subjects changed) is the group's cursor: its part starts after the consumer's ack floor and
    :func:`acknowledge_read` moves it past ``plan.last_seq``."""
    workers = []
    for index, group in enumerate(groups):
        result = await ensure_worker_consumer(conn, plan.stream, prefix, index, list(group),
                                              inactive_threshold=None, config={"deliver_policy": "all"})
        floor = int(result["info"].get("ack_floor", {}).get("stream_seq") or 0)
        workers.append((result["consumer"], tuple(result["subjects"]), max(plan.first_seq, floor + 1)))
    subjects = tuple(s for _, group, _ in workers for s in group)
    return dataclasses.replace(plan, workers=tuple(workers), subjects=subjects, ranges=())


def _ts_nanos(rfc3339: str) -> int:
    """Nanoseconds since the epoch from the server's RFC 3339 time with up to 9 fraction digits."""
    text = rfc3339.rstrip("Z")
    base, _, frac = text.partition(".")
    seconds = int(datetime.fromisoformat(base + "+00:00").timestamp())
    return seconds * 1_000_000_000 + int((frac + "000000000")[:9])


async def _read_via_consumer(conn: JetStreamConnection, stream: str, first: int, last: int,
                             subjects: Sequence[str], batch: int) -> AsyncGenerator[list[StoredMessage], None]:
    start = {"deliver_policy": "by_start_sequence", "opt_start_seq": first}
    async for chunk in _read_with_consumer(conn, stream, start, last, subjects, batch):
        yield chunk


async def read_latest_per_subject(conn: JetStreamConnection, stream: str, subjects: Sequence[str], *,
                                  batch: int = 1000) -> AsyncGenerator[list[StoredMessage], None]:
    """Yield the last message of every subject matching ``subjects`` (a KV bucket's current values),
    in sequence order; updates stored while reading come after (a later one for a subject replaces
    the earlier). Ends when the consumer reports nothing pending, so it never stops early the way
    a KV watch's "initial values done" marker can (nats-py sends it when a consumer info answer
    overtakes the deliveries).

    On a cluster the read consumer must sit on the stream leader or on a current replica: one placed
    on a replica still catching up (just restarted) would list only the keys it has so far, and a
    short listing cannot be told from a complete one. Such a consumer is dropped and placed again with
    the client's retry rule (:func:`~airflow_jetstream.client.retry.retry`: 0.25 s doubling up to 2 s) for
    up to the connection's ``leader_wait``."""

    async def started() -> tuple[AsyncGenerator[list[StoredMessage], None], list[StoredMessage] | None]:
        reader = _read_with_consumer(conn, stream, {"deliver_policy": "last_per_subject"}, sys.maxsize, subjects,
                                     batch, current_host=True)
        try:
            return reader, await anext(reader)  # a lagging host is refused before anything is yielded
        except StopAsyncIteration:
            return reader, None

    def not_started(exc: JetStreamError) -> str | None:
        return f"listing not started: {exc.message}" if isinstance(exc, LeaderUnavailableError) else None

    reader, first = await retry(f"stream {stream}", started, transient=not_started,
                                budget=conn.settings.leader_wait, advice=QUORUM_ADVICE, logger=log)
    async with contextlib.aclosing(reader):
        if first is None:
            return
        yield first
        async for chunk in reader:
            yield chunk


async def _check_current_host(conn: JetStreamConnection, stream: str, name: str, created: dict[str, Any]) -> None:
    """Raise :class:`LeaderUnavailableError` (after deleting consumer ``name``) unless the server hosting
    it is the stream leader or a replica that is current (no lag), per the leader's stream info."""
    host = (created.get("cluster") or {}).get("leader")
    if not conn.clustered or not host:
        return
    cluster = (await stream_info(conn, stream)).get("cluster") or {}
    if host == cluster.get("leader"):
        return
    replica: dict[str, Any] = next((r for r in cluster.get("replicas") or [] if r.get("name") == host), {})
    if replica.get("current") and not replica.get("lag"):
        return
    with contextlib.suppress(JetStreamError):
        await conn.api_request(f"CONSUMER.DELETE.{stream}.{name}", context="delete read consumer", retry=False)
    raise LeaderUnavailableError(f"stream {stream!r}: the read consumer was placed on {host}, a replica still "
                                 f"catching up (lag {replica.get('lag', 'unknown')})")


async def _read_with_consumer(conn: JetStreamConnection, stream: str, start: dict[str, Any], last: int,
                              subjects: Sequence[str], batch: int, *,
                              current_host: bool = False) -> AsyncGenerator[list[StoredMessage], None]:
    """Read with an ephemeral ``ack_policy: none`` consumer from ``start`` (its deliver policy) up to
    seq ``last`` or until nothing is pending; the consumer is deleted after a complete read. With
    ``current_host`` a consumer placed on a lagging replica is refused (:func:`_check_current_host`)."""
    config: dict[str, Any] = {
        "name": f"read-{uuid.uuid4().hex[:16]}",
        **start,
        "ack_policy": "none",
        # a short-lived read cursor: one in-memory replica whatever the stream's replicas
        "num_replicas": 1,
        "mem_storage": True,
        "inactive_threshold": 30_000_000_000,
    }
    if len(subjects) == 1:
        config["filter_subject"] = subjects[0]
    elif subjects:
        config["filter_subjects"] = list(subjects)
    name = config["name"]
    # Not retried here: a create that gets no answer may have been placed on a server that is down;
    # the caller's retry (_resuming) creates one under a new name, which may be placed elsewhere.
    created = await conn.api_request(f"CONSUMER.CREATE.{stream}.{name}", {"stream_name": stream, "config": config},
                                     context=f"read consumer on stream {stream!r}", retry=False)
    if current_host:
        await _check_current_host(conn, stream, name, created)
    inbox = conn.nc.new_inbox()
    queue: asyncio.Queue[list[StoredMessage] | int] = asyncio.Queue()
    chunk: list[StoredMessage] = []
    pull = {"want": 0, "delivered": 0}

    def flush() -> None:
        queue.put_nowait(chunk.copy())
        chunk.clear()

    async def on_message(msg: Any) -> None:
        reply = msg.reply
        if not reply:
            status = msg.headers.get(HEADER_STATUS, "") if msg.headers else ""
            flush()
            queue.put_nowait(int(status or 0) or 404)
            return
        tokens = reply.rsplit(".", 5)
        seq, pending = int(tokens[2]), int(tokens[5])
        pull["delivered"] += 1
        if seq <= last:
            chunk.append((msg.subject, seq, int(tokens[4]), msg.headers, msg.data))
        if seq >= last or pending == 0:
            flush()
            queue.put_nowait(0)
        elif pull["delivered"] >= pull["want"] or len(chunk) >= batch:
            flush()

    sub = await conn.nc.subscribe(inbox, cb=on_message, pending_msgs_limit=batch * 4,
                                  pending_bytes_limit=256 * 1024 * 1024)
    next_subject = f"{conn.api_prefix}.CONSUMER.MSG.NEXT.{stream}.{name}"
    try:
        finished = False
        while not finished:
            pull["want"], pull["delivered"] = batch, 0
            await conn.nc.publish(next_subject, json.dumps({"batch": batch, "no_wait": True}).encode(),
                                  reply=inbox)
            while True:
                try:
                    async with asyncio.timeout(conn.settings.request_timeout):
                        item = await queue.get()
                except TimeoutError:
                    await conn.raise_if_denied(next_subject)
                    raise conn.unanswered(f"stream {stream!r}: no messages from the read consumer within "
                                          f"{conn.settings.request_timeout}s") from None
                if isinstance(item, list):
                    if item:
                        yield item
                    if pull["delivered"] >= pull["want"] and queue.empty():
                        break
                    continue
                if item in (0, 404, 408):
                    finished = True
                    break
                if str(item) in _LEADER_STATUSES and conn.clustered:
                    raise LeaderUnavailableError(f"stream {stream!r}: the read consumer answered status {item} "
                                                 "(no leader / leadership change)")
                raise JetStreamError(f"stream {stream!r}: the read consumer answered status {item}",
                                     reason="read_failed")
    finally:
        await sub.unsubscribe()
    # Reached only when the read completed; after an error the server drops the consumer once
    # it has been inactive for inactive_threshold.
    await conn.api_request(f"CONSUMER.DELETE.{stream}.{name}", context="delete read consumer")


async def _read_via_direct(conn: JetStreamConnection, stream: str, first: int, last: int,
                           subjects: Sequence[str], batch: int) -> AsyncGenerator[list[StoredMessage], None]:
    if len(subjects) > 1:
        for subject in subjects:
            async for part in _read_via_direct(conn, stream, first, last, (subject,), batch):
                yield part
        return
    inbox = conn.nc.new_inbox()
    sub = await conn.nc.subscribe(inbox, pending_msgs_limit=batch * 4, pending_bytes_limit=256 * 1024 * 1024)
    subject = f"{conn.api_prefix}.DIRECT.GET.{stream}"
    seq = first
    try:
        while seq <= last:
            request: dict[str, Any] = {"seq": seq, "batch": min(batch, last - seq + 1)}
            if subjects:
                request["next_by_subj"] = subjects[0]
            await conn.nc.publish(subject, json.dumps(request).encode(), reply=inbox)
            chunk: list[StoredMessage] = []
            done = False
            while True:
                try:
                    msg = await sub.next_msg(conn.settings.request_timeout)
                except TimeoutError:
                    await conn.raise_if_denied(subject)
                    raise conn.unanswered(f"stream {stream!r}: direct get got no answer within "
                                          f"{conn.settings.request_timeout}s") from None
                headers = msg.headers or {}
                status = headers.get(HEADER_STATUS)
                if status in _LEADER_STATUSES and conn.clustered:
                    raise LeaderUnavailableError(f"stream {stream!r}: direct get answered status {status} "
                                                 "(no leader)")
                if status:
                    done = status == "404" or not chunk
                    if status not in ("204", "404"):
                        raise JetStreamError(f"stream {stream!r}: direct get answered status {status}",
                                             reason="read_failed")
                    break
                msg_seq = int(headers["Nats-Sequence"])
                if msg_seq > last:
                    done = True
                    continue
                own = without(headers, _DIRECT_GET_HEADERS)  # repeated names keep every value
                chunk.append((headers["Nats-Subject"], msg_seq, _ts_nanos(headers["Nats-Time-Stamp"]), own, msg.data))
                seq = msg_seq + 1
            if chunk:
                yield chunk
            if done:
                return
    finally:
        await sub.unsubscribe()


async def read_range(conn: JetStreamConnection, stream: str, first: int, last: int, *,
                     subjects: Sequence[str] = (), via: str = "consumer",
                     batch: int = 5000) -> AsyncGenerator[list[StoredMessage], None]:
    """Yield the messages with ``first <= seq <= last`` (matching ``subjects``) in chunks, in order."""
    if last < first:
        return
    use_fast_header_parser(conn)
    if via == "direct" and len(subjects) > 1:
        # direct get reads one subject after the other, each in sequence order: each resumes on its own
        for subject in subjects:
            async for chunk in read_range(conn, stream, first, last, subjects=(subject,), via=via, batch=batch):
                yield chunk
        return
    if via == "consumer":
        read_from = _read_via_consumer
    elif via == "direct":
        read_from = _read_via_direct
    else:
        raise InvalidRequestError(f"via={via!r}: use 'consumer' or 'direct'", reason="invalid_option")
    async for chunk in _resuming(conn, stream, first, last, subjects,
                                 lambda start: read_from(conn, stream, start, last, subjects, batch)):
        yield chunk


async def _resuming(conn: JetStreamConnection, stream: str, first: int, last: int, subjects: Sequence[str],
                    read_from: Callable[[int], AsyncGenerator[list[StoredMessage], None]],
                    ) -> AsyncGenerator[list[StoredMessage], None]:
    """Yield ``read_from(first)``; after a :class:`LeaderUnavailableError` (a node restart or leader
    election) read again from the sequence after the last one yielded, with the client's retry rule
    (:func:`~airflow_jetstream.client.retry.retry`: 0.25 s doubling up to 2 s) for up to the connection's
    ``leader_wait`` seconds without progress: each chunk is one call of it. Nothing is yielded twice.

    A read that ends before ``last`` is checked against the stream leader: a read consumer or a direct
    get answered by a replica that is still catching up (just restarted) sees fewer messages, so when
    the leader holds a matching message at or below ``last`` the read resumes instead of ending short."""
    start = first
    reader: AsyncGenerator[list[StoredMessage], None] | None = None

    async def next_chunk() -> list[StoredMessage] | None:
        """The next chunk from ``first`` on (from a new reader after an interruption), or None at the end."""
        nonlocal reader
        if reader is None:
            if first > last:
                return None
            reader = read_from(first)
        try:
            return await anext(reader)
        except StopAsyncIteration:
            reader = None
        except LeaderUnavailableError:
            reader = None
            raise
        if first <= last:
            behind = await _next_stored_seq(conn, stream, first, subjects)
            if behind is not None and behind <= last:
                raise LeaderUnavailableError(
                    f"stream {stream!r}: the read ended before seq {behind}, which the stream leader holds "
                    "(the server that answered is a replica still catching up)")
        return None

    def interrupted(exc: JetStreamError) -> str | None:
        return f"read interrupted at seq {first}" if isinstance(exc, LeaderUnavailableError) else None

    try:
        while True:
            chunk = await retry(f"stream {stream}", next_chunk, transient=interrupted,
                                budget=conn.settings.leader_wait, logger=log,
                                advice=f"the read of seq {start}..{last} stopped at seq {first}; {QUORUM_ADVICE}")
            if chunk is None:
                return
            first = chunk[-1][1] + 1
            yield chunk
    finally:
        if reader is not None:
            await reader.aclose()


async def _next_stored_seq(conn: JetStreamConnection, stream: str, first: int, subjects: Sequence[str]) -> int | None:
    """The first sequence >= ``first`` the stream leader holds on ``subjects`` (any subject when empty)."""
    found = []
    for subject in subjects or (">",):
        try:
            reply = await conn.api_request(f"STREAM.MSG.GET.{stream}", {"seq": first, "next_by_subj": subject},
                                           context=f"stream {stream!r}")
        except JetStreamError as exc:
            if exc.err_code == _ERR_NO_MESSAGE:
                continue
            raise
        found.append(int(reply["message"]["seq"]))
    return min(found, default=None)


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
    """Acknowledge everything ``plan`` covered, once the job that read it succeeded.

    WorkQueue: purge the plan's filters (or the whole stream) below ``last_seq + 1``. Interest and
    Limits: reset the plan's cursor consumer to ``last_seq + 1`` (its ack floor becomes ``last_seq``).
    Messages that arrived after planning (seq > last_seq) stay for the next run. Returns how many
    messages the stream lost (WorkQueue: purged; Interest: dropped once no consumer needs them;
    Limits: none, the cursor only moves).
    """
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
