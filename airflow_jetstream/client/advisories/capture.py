"""JetStream advisories that are never missed: the capture stream and its readers.

The server publishes advisories as plain core-NATS messages, and only while someone listens.
Anything that must not miss one captures them into a stream (:func:`capture_stream_config`) and
reads that stream from a start time (:func:`find_captured`, :func:`watch_advisories`)::

    await ensure_stream(conn, capture_stream_config("ADVISORIES", max_age="7d"))
    flt = AdvisoryFilter(advisory="batch_abandoned", stream="ORDERS")
    found = await find_captured(conn, "ADVISORIES", start_time=run_start, advisory_filter=flt)

This module is also the public entry point for advisories: it re-exports the typed advisories
(:mod:`~airflow_jetstream.client.advisories.types`) and the filter
(:mod:`~airflow_jetstream.client.advisories.filter`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import nats.errors

from airflow_jetstream.client.admin.consumers import delete_consumer
from airflow_jetstream.client.admin.streams import (
    default_replicas,
    ensure_stream,
    find_stream,
    replication_config,
    stream_info,
)
from airflow_jetstream.client.advisories.filter import (
    AdvisoryFilter,
    AdvisoryPredicateError,
    load_predicate,
    predicate_path,
)
from airflow_jetstream.client.advisories.types import (
    ADVISORY_PREFIX,
    DEFAULT_CAPTURE_STREAM,
    DEFAULT_CAPTURE_SUBJECTS,
    EVENT_PREFIX,
    KINDS,
    METRIC_PREFIX,
    Advisory,
    AdvisoryKind,
    advisory_subject,
    decode_advisory,
    get_kind,
    parse_advisory,
    parse_timestamp,
)
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import to_nanos
from airflow_jetstream.client.errors import (
    ConnectionFailedError,
    InvalidRequestError,
    JetStreamError,
    StreamNotFoundError,
)
from airflow_jetstream.client.reading.pull import PullSubscription
from airflow_jetstream.client.subjects import subject_matches, validate_name, validate_subjects
from airflow_jetstream.client.times import parse_time, to_rfc3339

__all__ = [
    "ADVISORY_PREFIX", "DEFAULT_CAPTURE_STREAM", "DEFAULT_CAPTURE_SUBJECTS", "EVENT_PREFIX", "KINDS", "METRIC_PREFIX",
    "Advisory", "AdvisoryFilter", "AdvisoryKind", "AdvisoryPredicateError", "CaptureReader",
    "advisory_subject", "capture_gap", "capture_info", "capture_stream_config", "decode_advisory",
    "ensure_capture_stream", "find_captured",
    "get_kind", "listen_live", "load_predicate", "parse_advisory", "predicate_path", "subject_matches",
    "watch_advisories",
]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------- capture stream


def capture_stream_config(name: str = DEFAULT_CAPTURE_STREAM, *, max_age: Any = "7d", max_bytes: int | None = None,
                          subjects: list[str] | tuple[str, ...] = DEFAULT_CAPTURE_SUBJECTS,
                          storage: str = "file", num_replicas: int | None = None,
                          placement: dict[str, Any] | None = None) -> dict[str, Any]:
    """Stream config that stores advisories, with a retention limit (age and optionally size).

    ``num_replicas``/``placement`` are left out when None (the server's default, or what an existing
    stream has under :func:`ensure_stream`).
    """
    validate_name(name, what="capture stream name")
    if max_age in (None, 0, "0") and not max_bytes:
        raise InvalidRequestError(
            "a capture stream needs a retention limit: set max_age (e.g. '7d') and/or max_bytes",
            reason="missing_retention",
        )
    config: dict[str, Any] = {
        "name": name, "subjects": _capture_subjects(subjects), "retention": "limits", "storage": storage,
        "discard": "old", "description": "JetStream advisories captured for airflow-jetstream sensors",
        **replication_config(num_replicas, placement),
    }
    if max_age not in (None, 0, "0"):
        config["max_age"] = to_nanos(max_age, field="max_age")
    if max_bytes:
        config["max_bytes"] = int(max_bytes)
    return config


def _capture_subjects(subjects: list[str] | tuple[str, ...]) -> list[str]:
    for subject in validate_subjects(subjects, what="capture subjects"):
        if not subject.startswith(f"{EVENT_PREFIX}."):
            raise InvalidRequestError(f"capture subject {subject!r} is not an advisory subject ({EVENT_PREFIX}.>)")
    return list(subjects)


async def ensure_capture_stream(conn: JetStreamConnection, name: str = DEFAULT_CAPTURE_STREAM, *,
                                max_age: Any = None, max_bytes: int | None = None,
                                subjects: list[str] | tuple[str, ...] | None = None, storage: str | None = None,
                                num_replicas: int | None = None,
                                placement: dict[str, Any] | None = None) -> dict[str, Any]:
    """Create the capture stream, or change only the options given (None = keep what the stream has).

    A new stream gets ``max_age`` 7 days, file storage, all advisories and, unless told otherwise,
    :func:`default_replicas` (3 on a cluster). A re-run with defaults never changes an existing
    stream: it does not turn an R3 capture stream into R1. Returns :func:`ensure_stream`'s result.
    """
    validate_name(name, what="capture stream name")
    current = await find_stream(conn, name)
    if current is None:
        age = "7d" if max_age is None and not max_bytes else max_age
        config = capture_stream_config(
            name, max_age=age, max_bytes=max_bytes, subjects=DEFAULT_CAPTURE_SUBJECTS if subjects is None else subjects,
            storage=storage or "file", num_replicas=num_replicas, placement=placement)
        return await ensure_stream(conn, config, create_defaults={"num_replicas": default_replicas(conn)})
    config = {"name": name, **replication_config(num_replicas, placement)}
    if max_age is not None:
        if max_age in (0, "0") and not (max_bytes or int(current["config"].get("max_bytes", -1)) > 0):
            capture_stream_config(name, max_age=max_age)  # raises: no retention limit would be left
        config["max_age"] = max_age
    if max_bytes:
        config["max_bytes"] = int(max_bytes)
    if subjects is not None:
        config["subjects"] = _capture_subjects(subjects)
    if storage is not None:
        config["storage"] = storage
    return await ensure_stream(conn, config)


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
        raise StreamNotFoundError(
            f"advisory capture stream {capture_stream!r} does not exist; create it with "
            "JetStreamAdvisoryStreamOperator (or ensure_stream(capture_stream_config(...))), or wait on a live "
            "subscription with capture_stream=None",
            reason=exc.reason, code=exc.code, err_code=exc.err_code, description=exc.description,
        ) from None


class CaptureReader:
    """Read advisories from the capture stream, starting at a time, through an ephemeral consumer.

    ``async with CaptureReader(conn, "ADVISORIES", start_time, flt) as reader``: :meth:`read_available`
    returns what is stored now; :meth:`next_batch` waits for more. The consumer filters on the
    narrowest subject for ``flt``, uses no acks and is deleted on exit (and by the server after
    ``inactive_threshold`` if the process dies).
    """

    def __init__(self, conn: JetStreamConnection, capture_stream: str, start_time: datetime | str,
                 advisory_filter: AdvisoryFilter, *, batch: int = 256, inactive_threshold: float = 120.0) -> None:
        validate_name(capture_stream, what="capture stream name")
        self.conn = conn
        self.capture_stream = capture_stream
        self.start_time = parse_time(start_time, field="start_time")
        self.filter = advisory_filter
        self.batch = batch
        self.inactive_threshold = inactive_threshold
        self.name = f"adv_{uuid.uuid4().hex[:16]}"
        self.pending = 0
        self.gap: str | None = None
        self._pull: PullSubscription | None = None

    async def __aenter__(self) -> CaptureReader:
        info = await capture_info(self.conn, self.capture_stream)
        self.gap = capture_gap(info, self.start_time)
        subject = self.filter.subject()
        covered = info["config"].get("subjects") or []
        if not any(subject_matches(s, subject) or subject_matches(subject, s) for s in covered):
            raise InvalidRequestError(
                f"capture stream {self.capture_stream!r} stores {covered}, which does not include {subject!r}; "
                "add the subject to the capture stream",
                reason="subject_not_captured",
            )
        config = {
            "name": self.name, "deliver_policy": "by_start_time", "opt_start_time": to_rfc3339(self.start_time),
            "ack_policy": "none", "replay_policy": "instant", "mem_storage": True, "num_replicas": 1,
            "inactive_threshold": int(self.inactive_threshold * 1e9), "max_waiting": 4,
        }
        if not any(s == subject for s in covered):
            config["filter_subject"] = subject
        reply = await self.conn.api_request(
            f"CONSUMER.CREATE.{self.capture_stream}.{self.name}",
            {"stream_name": self.capture_stream, "config": config, "action": "create"},
            context=f"read advisories from capture stream {self.capture_stream!r}",
        )
        self.pending = int(reply.get("num_pending", 0))
        self._pull = PullSubscription(self.conn, self.capture_stream, self.name, batch=self.batch, expires=5.0)
        await self._pull.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.conn.nc.is_closed:
            return  # the server drops the consumer after inactive_threshold
        if self._pull is not None:
            await self._pull.close()
        if not self.conn.nc.is_closed:
            try:
                await delete_consumer(self.conn, self.capture_stream, self.name)
            except JetStreamError as exc:
                log.warning("could not delete reader consumer %s (the server drops it after %ss idle): %s",
                            self.name, self.inactive_threshold, exc)

    def _require_open(self) -> PullSubscription:
        if self._pull is None:
            raise InvalidRequestError("the capture reader is not open: use it as `async with CaptureReader(...)`",
                                      reason="reader_not_open")
        return self._pull

    async def next_batch(self, timeout: float) -> list[Advisory]:
        """Advisories delivered within ``timeout`` seconds (all of them, matching or not)."""
        return (await self._fetch(timeout))[1]

    async def _fetch(self, timeout: float) -> tuple[int, list[Advisory]]:
        try:
            msgs = await self._require_open().next_messages(timeout)
        except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError) as exc:
            raise ConnectionFailedError(
                f"the NATS connection closed while reading advisories from {self.capture_stream!r} "
                f"({type(exc).__name__}); the wait can be retried"
            ) from None
        out = []
        for msg in msgs:
            meta = msg.metadata
            self.pending = int(meta.num_pending or 0)
            advisory = decode_advisory(msg.data, subject=msg.subject, capture_seq=meta.sequence.stream)
            if advisory is not None:
                out.append(advisory)
        return len(msgs), out

    async def read_available(self, fetch_timeout: float = 2.0) -> AsyncGenerator[Advisory, None]:
        """Yield every advisory stored now (from ``start_time``), then stop."""
        misses = 0
        while self.pending > 0 and misses < 2:
            fetched, advisories = await self._fetch(fetch_timeout)
            misses = 0 if fetched else misses + 1
            for advisory in advisories:
                yield advisory


async def find_captured(conn: JetStreamConnection, capture_stream: str, *, start_time: datetime | str,
                        advisory_filter: AdvisoryFilter) -> dict[str, Any]:
    """Look in the capture stream for the first advisory matching ``advisory_filter`` from ``start_time`` on.

    Returns ``{"advisory": dict | None, "scanned": n, "gap": warning | None}``.
    """
    async with CaptureReader(conn, capture_stream, start_time, advisory_filter) as reader:
        scanned = 0
        async for advisory in reader.read_available():
            scanned += 1
            if advisory_filter.matches(advisory):
                return {"advisory": advisory.to_dict(), "scanned": scanned, "gap": reader.gap}
        return {"advisory": None, "scanned": scanned, "gap": reader.gap}


async def watch_advisories(conn: JetStreamConnection, advisory_filter: AdvisoryFilter, *,
                           capture_stream: str | None, start_time: datetime | str | None = None,
                           fetch_timeout: float = 5.0,
                           on_gap: Callable[[str], None] | None = None) -> AsyncGenerator[Advisory, None]:
    """Yield matching advisories forever: from the capture stream starting at ``start_time``, or live.

    With ``capture_stream=None`` this subscribes to the advisory subject and sees only what is
    published from now on.
    """
    if capture_stream is None:
        async for advisory in _watch_live(conn, advisory_filter):
            yield advisory
        return
    async with CaptureReader(conn, capture_stream, start_time or datetime.now(UTC), advisory_filter) as reader:
        if reader.gap and on_gap is not None:
            on_gap(reader.gap)
        while True:
            for advisory in await reader.next_batch(fetch_timeout):
                if advisory_filter.matches(advisory):
                    yield advisory


async def _watch_live(conn: JetStreamConnection, advisory_filter: AdvisoryFilter) -> AsyncGenerator[Advisory, None]:
    queue: asyncio.Queue[Any] = asyncio.Queue()
    subject = advisory_filter.subject()

    async def on_msg(msg: Any) -> None:
        queue.put_nowait(msg)

    sub = await conn.nc.subscribe(subject, cb=on_msg)
    try:
        await conn.raise_if_denied(subject)
        while True:
            msg = await queue.get()
            advisory = decode_advisory(msg.data, subject=msg.subject)
            if advisory is not None and advisory_filter.matches(advisory):
                yield advisory
    finally:
        if not conn.nc.is_closed:
            await sub.unsubscribe()


async def listen_live(conn: JetStreamConnection, advisory_filter: AdvisoryFilter, seconds: float) -> Advisory | None:
    """Subscribe live for ``seconds`` and return the first matching advisory, or None."""
    watcher = _watch_live(conn, advisory_filter)
    try:
        async with asyncio.timeout(seconds):
            return await anext(watcher)
    except TimeoutError:
        return None
    finally:
        await watcher.aclose()
