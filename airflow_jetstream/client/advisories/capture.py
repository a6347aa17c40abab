"""JetStream advisories that are never missed: the capture stream and its readers.

The server publishes advisories as plain core-NATS messages, and only while someone listens.
Anything that must not miss one captures them into a stream (:func:`capture_stream_config`) and
reads that stream from a start time (:func:`find_captured`, :func:`watch_advisories`)::

    await ensure_stream(conn, capture_stream_config("ADVISORIES", max_age="7d"))
    flt = AdvisoryFilter(advisory="batch_abandoned", stream="ORDERS")
    found = await find_captured(conn, "ADVISORIES", start_time=run_start, advisory_filter=flt)
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable, Mapping
from contextlib import aclosing, asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from airflow_jetstream.client.admin.streams import (
    default_replicas,
    ensure_stream,
    find_stream,
    replication_config,
    stream_info,
)
from airflow_jetstream.client.advisories.types import (
    DEFAULT_CAPTURE_STREAM,
    DEFAULT_CAPTURE_SUBJECTS,
    EVENT_PREFIX,
    Advisory,
    AdvisoryFilter,
    decode_advisory,
    parse_timestamp,
)
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import parse_time, to_nanos
from airflow_jetstream.client.errors import InvalidRequestError, StreamNotFoundError
from airflow_jetstream.client.reading.listener_index import KeyOf
from airflow_jetstream.client.reading.messages import Message
from airflow_jetstream.client.reading.shared_tail import TailListener, follow
from airflow_jetstream.client.reading.stored import BATCH, messages_of, read_range
from airflow_jetstream.client.subjects import subject_matches, validate_name, validate_subjects

#: Consumers a new capture stream allows (the server's own default when unset is 1,000, so the limit is visible).
DEFAULT_CAPTURE_MAX_CONSUMERS = 1000


# --------------------------------------------------------------------------------------- capture stream


def capture_stream_config(name: str = DEFAULT_CAPTURE_STREAM, *, max_age: Any = "7d", max_bytes: int | None = None,
                          subjects: list[str] | tuple[str, ...] = DEFAULT_CAPTURE_SUBJECTS,
                          storage: str = "file", num_replicas: int | None = None,
                          placement: dict[str, Any] | None = None,
                          max_consumers: int = DEFAULT_CAPTURE_MAX_CONSUMERS) -> dict[str, Any]:
    """Stream config that stores advisories, with a retention limit (age and optionally size).

    ``allow_direct`` is on (sensor pokes, waiting triggers and the JetStream view read it without a consumer:
    direct gets create nothing and are not API calls) and ``max_consumers`` is explicit: each triggerer process
    holds one consumer on it however many advisory sensors it runs, plus the durable consumers of event-driven
    DAGs. ``num_replicas``/``placement`` are left out when None (the server's default, or what an existing
    stream has under :func:`ensure_stream`).
    """
    validate_name(name, what="capture stream name")
    if max_age in (None, 0, "0") and not max_bytes:
        raise InvalidRequestError(
            "a capture stream needs a retention limit: set max_age (e.g. '7d') and/or max_bytes",
            reason="missing_retention",
        )
    for subject in validate_subjects(subjects, what="capture subjects"):
        if not subject.startswith(f"{EVENT_PREFIX}."):
            raise InvalidRequestError(f"capture subject {subject!r} is not an advisory subject ({EVENT_PREFIX}.>)")
    if isinstance(max_consumers, bool) or not isinstance(max_consumers, int) or max_consumers < 1:
        raise InvalidRequestError(f"max_consumers must be a positive int, got {max_consumers!r}",
                                  reason="invalid_option")
    config: dict[str, Any] = {
        "name": name, "subjects": list(subjects), "retention": "limits", "storage": storage,
        "discard": "old", "description": "JetStream advisories captured for airflow-jetstream sensors",
        "allow_direct": True, "max_consumers": max_consumers, **replication_config(num_replicas, placement),
    }
    if max_age not in (None, 0, "0"):
        config["max_age"] = to_nanos(max_age, field="max_age")
    if max_bytes:
        config["max_bytes"] = int(max_bytes)
    return config


async def ensure_capture_stream(conn: JetStreamConnection, name: str = DEFAULT_CAPTURE_STREAM, *,
                                max_age: Any = None, max_bytes: int | None = None,
                                subjects: list[str] | tuple[str, ...] | None = None, storage: str | None = None,
                                num_replicas: int | None = None, placement: dict[str, Any] | None = None,
                                max_consumers: int | None = None) -> dict[str, Any]:
    """Create the capture stream, or change only the options given (None = keep what the stream has).

    A new stream gets ``max_age`` 7 days, file storage, every advisory but the API audits
    (:data:`DEFAULT_CAPTURE_SUBJECTS`), ``max_consumers`` ``DEFAULT_CAPTURE_MAX_CONSUMERS`` and, unless told
    otherwise, :func:`default_replicas` (3 on a cluster). A re-run with defaults does not turn an R3 capture
    stream into R1; it changes an existing stream only to allow direct gets (reads without a consumer need them).
    Returns :func:`ensure_stream`'s result.
    """
    validate_name(name, what="capture stream name")
    options = {"max_age": max_age, "max_bytes": max_bytes or None, "subjects": subjects, "storage": storage or None,
               "max_consumers": max_consumers}
    given: dict[str, Any] = {key: value for key, value in options.items() if value is not None}
    current = await find_stream(conn, name)
    if current is None:
        config = capture_stream_config(name, **{"max_age": None if max_bytes else "7d", **given},
                                       num_replicas=num_replicas, placement=placement)
        return await ensure_stream(conn, config, create_defaults={"num_replicas": default_replicas(conn)})
    # checked as a whole (raises when no retention limit would be left), then only what was given is changed
    kept_bytes = int(current["config"].get("max_bytes", -1))
    checked = capture_stream_config(name, **{"max_bytes": kept_bytes if kept_bytes > 0 else None, **given})
    return await ensure_stream(conn, {"name": name, "allow_direct": True, **replication_config(num_replicas, placement),
                                      **{key: checked.get(key, 0) for key in given}})  # max_age 0: none


def capture_gap(info: Mapping[str, Any], since: datetime) -> str | None:
    """Why advisories after ``since`` may be missing from the capture stream, or None."""
    created = parse_timestamp(info.get("created"))
    name = info.get("config", {}).get("name")
    if created and created > since:
        return (f"capture stream {name!r} was created at {created.isoformat()}, after {since.isoformat()}: "
                "advisories published before it existed were never captured")
    state = info.get("state", {})
    first = parse_timestamp(state.get("first_ts"))
    if first and first > since and int(state.get("first_seq") or 1) > 1:
        return (f"capture stream {name!r} holds advisories from {first.isoformat()} only (older ones expired); "
                f"advisories between {since.isoformat()} and then are lost - raise its max_age")
    return None


async def capture_info(conn: JetStreamConnection, capture_stream: str) -> dict[str, Any]:
    """Info of the capture stream, with a hint naming the fix when it does not exist."""
    try:
        return await stream_info(conn, capture_stream)
    except StreamNotFoundError as exc:
        raise _capture_missing(capture_stream, exc) from None


@asynccontextmanager
async def follow_captured(conn: JetStreamConnection, capture_stream: str,
                          advisory_filter: AdvisoryFilter) -> AsyncIterator[tuple[TailListener, dict[str, Any]]]:
    """``async with follow_captured(conn, "ADVISORIES", flt) as (listener, info)``: the messages of the advisories
    matching ``flt`` stored after ``listener.since``, and the capture stream's info (checked to store the filter's
    subject). Through the subscription every reader of this stream on this connection shares
    (:func:`~airflow_jetstream.client.reading.shared_tail.follow`): a thousand waiting advisory triggers are one
    consumer on the capture stream, and each advisory is checked against the filters of its own waiters only."""
    validate_name(capture_stream, what="capture stream name")
    subject = advisory_filter.subject()

    def wanted(message: Message) -> bool:
        advisory = _decoded(message)
        return advisory is not None and advisory_filter.matches(advisory)

    try:
        async with follow(conn, capture_stream, subject, accept=wanted, key=_filed_by(advisory_filter)) as listener:
            info = await listener.tail.info()
            _check_captured(capture_stream, info, subject)
            yield listener, info
    except StreamNotFoundError as exc:
        raise _capture_missing(capture_stream, exc) from None


_last_decoded: tuple[Message | None, Advisory | None] = (None, None)


def _decoded(message: Message) -> Advisory | None:
    """The advisory in ``message``; the last one is kept, since every waiter on its subject asks in turn."""
    global _last_decoded
    if _last_decoded[0] is not message:
        _last_decoded = (message, decode_advisory(message.data, subject=message.subject, capture_seq=message.seq))
    return _last_decoded[1]


#: The advisory fields a waiter is filed by on its subject (those its filter names): a message reaches only the
#: waiters of its own values (listener_index.py), not every waiting sensor's filter in turn.
_KEY_FIELDS = ("stream", "consumer", "batch", "reason")


def _filed_by(advisory_filter: AdvisoryFilter) -> tuple[KeyOf, Hashable] | None:
    """``(key_of, value)`` filing a reader by the fields its filter names; None when it names none of them."""
    named = tuple(name for name in _KEY_FIELDS if getattr(advisory_filter, name) is not None)
    if not named:
        return None
    return _key_of(named), tuple(getattr(advisory_filter, name) for name in named)


@functools.cache
def _key_of(names: tuple[str, ...]) -> KeyOf:
    """One function per set of field names (the readers naming the same fields share it, so they share a group)."""

    def key_of(message: Message) -> Hashable:
        advisory = _decoded(message)
        return None if advisory is None else tuple(advisory.raw.get(name) for name in names)

    return key_of


async def _stored(conn: JetStreamConnection, capture_stream: str, subject: str, last_seq: int, *,
                  start_time: datetime, info: dict[str, Any]) -> AsyncGenerator[Advisory, None]:
    """The advisories on ``subject`` stored from ``start_time`` up to ``last_seq`` (no consumer)."""
    pages = read_range(conn, capture_stream, 1, last_seq, start_time=start_time, subjects=(subject,), via=None,
                       batch=BATCH, info=info)
    async with aclosing(pages):
        async for page in pages:
            for message in messages_of(capture_stream, page):
                advisory = _decoded(message)
                if advisory is not None:
                    yield advisory


def _capture_missing(capture_stream: str, exc: StreamNotFoundError) -> StreamNotFoundError:
    return StreamNotFoundError(
        f"advisory capture stream {capture_stream!r} does not exist; create it with "
        "JetStreamAdvisoryStreamOperator (or ensure_stream(capture_stream_config(...))), or wait on a live "
        "subscription with capture_stream=None",
        reason=exc.reason, code=exc.code, err_code=exc.err_code, description=exc.description,
    )


def _check_captured(capture_stream: str, info: Mapping[str, Any], subject: str) -> None:
    covered = info["config"].get("subjects") or []
    if not any(subject_matches(s, subject) or subject_matches(subject, s) for s in covered):
        raise InvalidRequestError(
            f"capture stream {capture_stream!r} stores {covered}, which does not include {subject!r}; "
            "add the subject to the capture stream", reason="subject_not_captured")


async def find_captured(conn: JetStreamConnection, capture_stream: str, *, start_time: datetime | str,
                        advisory_filter: AdvisoryFilter) -> dict[str, Any]:
    """Look in the capture stream for the first advisory matching ``advisory_filter`` from ``start_time`` on,
    among what is stored now; creates nothing on the server (a sensor's poke, the end of a quiet period).

    Returns ``{"advisory": dict | None, "scanned": n, "gap": warning | None}`` (``scanned``: advisories on the
    filter's subject looked at).
    """
    validate_name(capture_stream, what="capture stream name")
    since = parse_time(start_time, field="start_time")
    info = await capture_info(conn, capture_stream)
    subject = advisory_filter.subject()
    _check_captured(capture_stream, info, subject)
    last_seq = int(info["state"].get("last_seq") or 0)
    scanned = 0
    async for advisory in _stored(conn, capture_stream, subject, last_seq, start_time=since, info=info):
        scanned += 1
        if advisory_filter.matches(advisory):
            return {"advisory": advisory.to_dict(), "scanned": scanned, "gap": capture_gap(info, since)}
    return {"advisory": None, "scanned": scanned, "gap": capture_gap(info, since)}


async def watch_advisories(conn: JetStreamConnection, advisory_filter: AdvisoryFilter, *,
                           capture_stream: str | None, start_time: datetime | str | None = None,
                           fetch_timeout: float = 5.0,
                           on_gap: Callable[[str], None] | None = None) -> AsyncGenerator[Advisory, None]:
    """Yield matching advisories forever: from the capture stream starting at ``start_time``, or live.

    From the capture stream: what was stored since ``start_time`` (no consumer), then what is stored next,
    through the subscription the connection shares for the capture stream (``fetch_timeout``: the longest
    the generator waits between checks that it was not closed). With ``capture_stream=None`` this subscribes
    to the advisory subject and sees only what is published from now on.
    """
    if capture_stream is None:
        async for advisory in _watch_live(conn, advisory_filter):
            yield advisory
        return
    since = parse_time(start_time or datetime.now(UTC), field="start_time")
    async with follow_captured(conn, capture_stream, advisory_filter) as (listener, info):
        gap = capture_gap(info, since)
        if gap and on_gap is not None:
            on_gap(gap)
        async with listener.catching_up():  # what was stored from start_time until the listener joined
            stored = [advisory async for advisory in _stored(conn, capture_stream, listener.subject, listener.since,
                                                             start_time=since, info=info)]
        for advisory in stored:
            if advisory_filter.matches(advisory):
                yield advisory
        while True:
            try:
                async with asyncio.timeout(fetch_timeout):
                    messages = await listener.next_batch()
            except TimeoutError:
                continue
            for new in map(_decoded, messages):
                if new is not None and advisory_filter.matches(new):
                    yield new


async def _watch_live(conn: JetStreamConnection, advisory_filter: AdvisoryFilter) -> AsyncGenerator[Advisory, None]:
    subject = advisory_filter.subject()
    sub = await conn.nc.subscribe(subject)
    try:
        await conn.raise_if_denied(subject)
        async for msg in sub.messages:
            advisory = decode_advisory(msg.data, subject=msg.subject)
            if advisory is not None and advisory_filter.matches(advisory):
                yield advisory
    finally:
        if not conn.nc.is_closed:
            await sub.unsubscribe()


async def listen_live(conn: JetStreamConnection, advisory_filter: AdvisoryFilter, seconds: float) -> Advisory | None:
    """Subscribe live for ``seconds`` and return the first matching advisory, or None."""
    async with aclosing(_watch_live(conn, advisory_filter)) as watcher:
        try:
            async with asyncio.timeout(seconds):
                return await anext(watcher)
        except TimeoutError:
            return None
