"""JetStream advisories: typed parsing, subject builders, filters, the capture stream and readers.

The server publishes advisories as plain core-NATS messages, and only while someone listens.
Anything that must not miss one captures them into a stream (:func:`capture_stream_config`) and
reads that stream from a start time (:func:`find_captured`, :func:`watch_advisories`)::

    await ensure_stream(conn, capture_stream_config("ADVISORIES", max_age="7d"))
    flt = AdvisoryFilter(advisory="batch_abandoned", stream="ORDERS")
    found = await find_captured(conn, "ADVISORIES", since=run_start, advisory_filter=flt)

Unknown advisory types are never an error: they parse into a plain :class:`Advisory` whose
``to_dict()`` is the raw JSON.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, ClassVar

import nats.errors

from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.consumers import delete_consumer, parse_time, to_rfc3339
from airflow_jetstream.client.durations import to_nanos
from airflow_jetstream.client.errors import (
    ConnectionFailedError,
    InvalidRequestError,
    JetStreamError,
    StreamNotFoundError,
)
from airflow_jetstream.client.streams import stream_info
from airflow_jetstream.client.subjects import validate_name, validate_subject

ADVISORY_PREFIX = "$JS.EVENT.ADVISORY"
METRIC_PREFIX = "$JS.EVENT.METRIC"
EVENT_PREFIX = "$JS.EVENT"
TYPE_PREFIX = "io.nats.jetstream.advisory.v1."
METRIC_TYPE_PREFIX = "io.nats.jetstream.metric.v1."
DEFAULT_CAPTURE_STREAM = "ADVISORIES"
DEFAULT_CAPTURE_SUBJECTS = (f"{ADVISORY_PREFIX}.>",)

log = logging.getLogger(__name__)


class AdvisoryPredicateError(InvalidRequestError):
    """A user predicate given by dotted path cannot be imported, is not callable, or raised."""

    default_reason = "invalid_predicate"


# --------------------------------------------------------------------------------------- kinds


@dataclass(frozen=True)
class AdvisoryKind:
    """One advisory the server publishes: its short name, subject template and JSON type."""

    name: str
    subject: str  # relative to the prefix; "{stream}" / "{consumer}" tokens
    type: str
    prefix: str = ADVISORY_PREFIX

    @property
    def has_stream(self) -> bool:
        return "{stream}" in self.subject

    @property
    def has_consumer(self) -> bool:
        return "{consumer}" in self.subject

    def subject_for(self, stream: str | None = None, consumer: str | None = None) -> str:
        """The concrete subject, with ``*`` for a stream/consumer not given."""
        for value, what in ((stream, "stream name"), (consumer, "consumer name")):
            if value is not None:
                validate_name(value, what=what)
        rel = self.subject.replace("{stream}", stream or "*").replace("{consumer}", consumer or "*")
        return f"{self.prefix}.{rel}"


def _kind(name: str, subject: str, type_suffix: str, prefix: str = ADVISORY_PREFIX,
          type_prefix: str = TYPE_PREFIX) -> AdvisoryKind:
    return AdvisoryKind(name, subject, type_prefix + type_suffix, prefix)


#: Every advisory (and the consumer ack metric) of nats-server 2.15, by short name.
KINDS: dict[str, AdvisoryKind] = {k.name: k for k in (
    _kind("stream_created", "STREAM.CREATED.{stream}", "stream_action"),
    _kind("stream_updated", "STREAM.UPDATED.{stream}", "stream_action"),
    _kind("stream_deleted", "STREAM.DELETED.{stream}", "stream_action"),
    _kind("consumer_created", "CONSUMER.CREATED.{stream}.{consumer}", "consumer_action"),
    _kind("consumer_deleted", "CONSUMER.DELETED.{stream}.{consumer}", "consumer_action"),
    _kind("consumer_pause", "CONSUMER.PAUSE.{stream}.{consumer}", "consumer_pause"),
    _kind("consumer_pinned", "CONSUMER.PINNED.{stream}.{consumer}", "consumer_group_pinned"),
    _kind("consumer_unpinned", "CONSUMER.UNPINNED.{stream}.{consumer}", "consumer_group_unpinned"),
    _kind("max_deliveries", "CONSUMER.MAX_DELIVERIES.{stream}.{consumer}", "max_deliver"),
    _kind("msg_naked", "CONSUMER.MSG_NAKED.{stream}.{consumer}", "nak"),
    _kind("msg_terminated", "CONSUMER.MSG_TERMINATED.{stream}.{consumer}", "terminated"),
    _kind("batch_abandoned", "STREAM.BATCH_ABANDONED.{stream}", "stream_batch_abandoned"),
    _kind("api_audit", "API", "api_audit"),
    _kind("api_limit_reached", "API.LIMIT_REACHED", "api_limit_reached"),
    _kind("stream_leader_elected", "STREAM.LEADER_ELECTED.{stream}", "stream_leader_elected"),
    _kind("stream_quorum_lost", "STREAM.QUORUM_LOST.{stream}", "stream_quorum_lost"),
    _kind("consumer_leader_elected", "CONSUMER.LEADER_ELECTED.{stream}.{consumer}", "consumer_leader_elected"),
    _kind("consumer_quorum_lost", "CONSUMER.QUORUM_LOST.{stream}.{consumer}", "consumer_quorum_lost"),
    _kind("domain_leader_elected", "DOMAIN.LEADER_ELECTED", "domain_leader_elected"),
    _kind("snapshot_create", "STREAM.SNAPSHOT_CREATE.{stream}", "snapshot_create"),
    _kind("snapshot_complete", "STREAM.SNAPSHOT_COMPLETE.{stream}", "snapshot_complete"),
    _kind("restore_create", "STREAM.RESTORE_CREATE.{stream}", "restore_create"),
    _kind("restore_complete", "STREAM.RESTORE_COMPLETE.{stream}", "restore_complete"),
    _kind("server_out_of_storage", "SERVER.OUT_OF_STORAGE", "server_out_of_space"),
    _kind("server_removed", "SERVER.REMOVED", "server_removed"),
    _kind("consumer_ack", "CONSUMER.ACK.{stream}.{consumer}", "consumer_ack", METRIC_PREFIX, METRIC_TYPE_PREFIX),
)}
_STREAM_ACTIONS = {"create": "stream_created", "modify": "stream_updated", "delete": "stream_deleted"}
_CONSUMER_ACTIONS = {"create": "consumer_created", "delete": "consumer_deleted"}


def advisory_subject(kind: str, stream: str | None = None, consumer: str | None = None) -> str:
    """The subject of advisory ``kind`` (e.g. ``batch_abandoned``); ``*`` for what is not given."""
    return get_kind(kind).subject_for(stream, consumer)


def get_kind(kind: str) -> AdvisoryKind:
    try:
        return KINDS[kind]
    except KeyError:
        raise InvalidRequestError(
            f"unknown advisory kind {kind!r}; use one of {', '.join(sorted(KINDS))} or a subject "
            f"starting with {EVENT_PREFIX}.",
            reason="unknown_advisory",
        ) from None


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` one token, ``>`` one or more trailing tokens."""
    want, have = pattern.split("."), subject.split(".")
    for index, token in enumerate(want):
        if token == ">":
            return len(have) > index
        if index >= len(have) or (token != "*" and token != have[index]):
            return False
    return len(want) == len(have)


# --------------------------------------------------------------------------------------- parsing

_FRACTION = re.compile(r"\.(\d{6})\d+")


def parse_timestamp(value: Any) -> datetime | None:
    """An RFC 3339 timestamp with up to nanosecond precision, or None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    text = _FRACTION.sub(r".\1", value.strip())
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _as_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _as_dict(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


#: How each known JSON field is coerced; anything unreadable becomes None (never an exception).
_COERCE: dict[str, Callable[[Any], Any]] = {
    "stream_seq": _as_int, "consumer_seq": _as_int, "deliveries": _as_int, "bytes": _as_int,
    "dropped": _as_int, "ack_time": _as_int, "paused": _as_bool, "pause_until": parse_timestamp,
    "start": parse_timestamp, "end": parse_timestamp, "client": _as_dict, "state": _as_dict,
    "replicas": _as_list,
}
_JSON_NAMES = {"api_subject": "subject", "batch": "batch"}


@dataclass(frozen=True, kw_only=True)
class Advisory:
    """An advisory as received. Subclasses add the typed fields of each known type.

    ``subject`` is the NATS subject it was published on; ``capture_seq`` its sequence in the
    capture stream (None when read live); ``raw`` the JSON exactly as sent.
    """

    type: str
    id: str | None = None
    timestamp: datetime | None = None
    subject: str | None = None
    capture_seq: int | None = None
    domain: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    kind_name: ClassVar[str | None] = None
    _base_fields: ClassVar[frozenset[str]] = frozenset({"type", "id", "timestamp", "subject", "capture_seq",
                                                        "domain", "raw"})

    @property
    def kind(self) -> str | None:
        """The short name (``batch_abandoned``, ``max_deliveries`` ...), None for an unknown type."""
        return self.kind_name

    @property
    def stream(self) -> str | None:
        return _as_str(self.raw.get("stream"))

    @property
    def consumer(self) -> str | None:
        return _as_str(self.raw.get("consumer"))

    def to_dict(self) -> dict[str, Any]:
        """The advisory's JSON fields plus ``advisory_kind``, ``advisory_subject``, ``capture_seq``."""
        out = dict(self.raw)
        out["advisory_kind"] = self.kind
        out["advisory_subject"] = self.subject
        out["capture_seq"] = self.capture_seq
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], **common: Any) -> Advisory:
        extra = {}
        for f in fields(cls):
            if f.name in cls._base_fields or not f.init:
                continue
            json_name = _JSON_NAMES.get(f.name, f.name)
            extra[f.name] = _COERCE.get(f.name, _as_str)(data.get(json_name))
        return cls(**common, **extra)


@dataclass(frozen=True, kw_only=True)
class StreamAction(Advisory):
    """A stream was created, updated or deleted (``action`` create / modify / delete)."""

    action: str | None = None

    @property
    def kind(self) -> str | None:
        return _STREAM_ACTIONS.get(self.action or "")


@dataclass(frozen=True, kw_only=True)
class ConsumerAction(Advisory):
    """A consumer was created or deleted."""

    action: str | None = None

    @property
    def kind(self) -> str | None:
        return _CONSUMER_ACTIONS.get(self.action or "")


@dataclass(frozen=True, kw_only=True)
class ConsumerPause(Advisory):
    kind_name: ClassVar[str | None] = "consumer_pause"
    paused: bool | None = None
    pause_until: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class ConsumerGroupPinned(Advisory):
    kind_name: ClassVar[str | None] = "consumer_pinned"
    group: str | None = None
    pinned_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class ConsumerGroupUnpinned(Advisory):
    kind_name: ClassVar[str | None] = "consumer_unpinned"
    group: str | None = None
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class MaxDeliveries(Advisory):
    """A message hit the consumer's max_deliver: a candidate for dead-letter handling."""

    kind_name: ClassVar[str | None] = "max_deliveries"
    stream_seq: int | None = None
    deliveries: int | None = None


@dataclass(frozen=True, kw_only=True)
class MessageNaked(Advisory):
    kind_name: ClassVar[str | None] = "msg_naked"
    consumer_seq: int | None = None
    stream_seq: int | None = None
    deliveries: int | None = None


@dataclass(frozen=True, kw_only=True)
class MessageTerminated(Advisory):
    kind_name: ClassVar[str | None] = "msg_terminated"
    consumer_seq: int | None = None
    stream_seq: int | None = None
    deliveries: int | None = None
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class ConsumerAckMetric(Advisory):
    """Sampled ack metric (consumers with ``sample_freq``); published under ``$JS.EVENT.METRIC``."""

    kind_name: ClassVar[str | None] = "consumer_ack"
    consumer_seq: int | None = None
    stream_seq: int | None = None
    ack_time: int | None = None
    deliveries: int | None = None


@dataclass(frozen=True, kw_only=True)
class BatchAbandoned(Advisory):
    """An atomic batch was abandoned; ``reason`` is timeout, large, incomplete or unsupported."""

    kind_name: ClassVar[str | None] = "batch_abandoned"
    batch: str | None = None
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class ApiAudit(Advisory):
    """A JetStream API call; ``api_subject`` is the API subject (JSON field ``subject``)."""

    kind_name: ClassVar[str | None] = "api_audit"
    server: str | None = None
    client: dict[str, Any] | None = field(default=None, repr=False)
    api_subject: str | None = None
    request: str | None = field(default=None, repr=False)
    response: str | None = field(default=None, repr=False)


@dataclass(frozen=True, kw_only=True)
class ApiLimitReached(Advisory):
    kind_name: ClassVar[str | None] = "api_limit_reached"
    server: str | None = None
    dropped: int | None = None


@dataclass(frozen=True, kw_only=True)
class LeaderElected(Advisory):
    """A stream, consumer or domain (meta) leader was elected (clustered servers)."""

    leader: str | None = None
    cluster: str | None = None
    replicas: list[Any] = field(default_factory=list, repr=False)

    @property
    def kind(self) -> str | None:
        return _TYPE_TO_KIND.get(self.type)


@dataclass(frozen=True, kw_only=True)
class QuorumLost(Advisory):
    """A clustered stream or consumer lost quorum and is stalled."""

    replicas: list[Any] = field(default_factory=list, repr=False)

    @property
    def kind(self) -> str | None:
        return _TYPE_TO_KIND.get(self.type)


@dataclass(frozen=True, kw_only=True)
class SnapshotOrRestore(Advisory):
    """A stream snapshot or restore started or completed."""

    start: datetime | None = None
    end: datetime | None = None
    bytes: int | None = None
    client: dict[str, Any] | None = field(default=None, repr=False)
    state: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def kind(self) -> str | None:
        return _TYPE_TO_KIND.get(self.type)


@dataclass(frozen=True, kw_only=True)
class ServerEvent(Advisory):
    """A server ran out of storage (JetStream disabled) or was removed from the cluster."""

    server: str | None = None
    server_id: str | None = None
    cluster: str | None = None

    @property
    def kind(self) -> str | None:
        return _TYPE_TO_KIND.get(self.type)


_TYPE_TO_KIND = {k.type: k.name for k in KINDS.values() if k.type.split(".")[-1] not in
                 ("stream_action", "consumer_action")}
_CLASSES: dict[str, type[Advisory]] = {
    "stream_action": StreamAction, "consumer_action": ConsumerAction, "consumer_pause": ConsumerPause,
    "consumer_group_pinned": ConsumerGroupPinned, "consumer_group_unpinned": ConsumerGroupUnpinned,
    "max_deliver": MaxDeliveries, "nak": MessageNaked, "terminated": MessageTerminated,
    "consumer_ack": ConsumerAckMetric, "stream_batch_abandoned": BatchAbandoned, "api_audit": ApiAudit,
    "api_limit_reached": ApiLimitReached, "stream_leader_elected": LeaderElected,
    "consumer_leader_elected": LeaderElected, "domain_leader_elected": LeaderElected,
    "stream_quorum_lost": QuorumLost, "consumer_quorum_lost": QuorumLost,
    "snapshot_create": SnapshotOrRestore, "snapshot_complete": SnapshotOrRestore,
    "restore_create": SnapshotOrRestore, "restore_complete": SnapshotOrRestore,
    "server_out_of_space": ServerEvent, "server_removed": ServerEvent,
}


def parse_advisory(data: Mapping[str, Any], *, subject: str | None = None,
                   capture_seq: int | None = None) -> Advisory:
    """Typed advisory from its JSON object. Unknown types give a plain :class:`Advisory`."""
    type_name = _as_str(data.get("type")) or ""
    cls: type[Advisory] = Advisory
    for prefix in (TYPE_PREFIX, METRIC_TYPE_PREFIX):
        if type_name.startswith(prefix):
            cls = _CLASSES.get(type_name[len(prefix):], Advisory)
    common = {
        "type": type_name, "id": _as_str(data.get("id")), "timestamp": parse_timestamp(data.get("timestamp")),
        "subject": subject, "capture_seq": capture_seq, "domain": _as_str(data.get("domain")), "raw": dict(data),
    }
    return cls.from_json(data, **common)


def decode_advisory(payload: bytes, *, subject: str | None = None, capture_seq: int | None = None) -> Advisory | None:
    """Parse a message payload; None when it is not a JSON object (never raises)."""
    try:
        data = json.loads(payload or b"null")
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return parse_advisory(data, subject=subject, capture_seq=capture_seq)


# --------------------------------------------------------------------------------------- filters


@lru_cache(maxsize=128)
def load_predicate(path: str) -> Callable[[dict[str, Any]], bool]:
    """Import ``"package.module.function"`` (or ``"package.module:function"``) and return it."""
    module_name, _, attr = path.replace(":", ".").rpartition(".")
    if not module_name or not attr:
        raise AdvisoryPredicateError(
            f"predicate {path!r} is not a dotted path; use 'package.module.function' so that a trigger can "
            "serialize it"
        )
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise AdvisoryPredicateError(f"cannot import the module of predicate {path!r}: {exc}") from None
    for part in attr.split("."):
        target = getattr(target, part, None)
    if not callable(target):
        raise AdvisoryPredicateError(f"predicate {path!r} does not name a callable in module {module_name!r}")
    return target


def predicate_path(func: Callable[..., Any]) -> str:
    """The dotted path of a module-level function, checked to import back to the same object."""
    path = f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', '')}"
    if "<" in path or load_predicate(path) is not func:
        raise AdvisoryPredicateError(
            f"{func!r} is not importable by dotted path (a lambda, closure or __main__ function); define it "
            "at module level in an importable module, or pass its dotted path as a string"
        )
    return path


@dataclass(frozen=True)
class AdvisoryFilter:
    """Which advisories match. Every field given must match; ``None`` means any.

    :param advisory: a kind (``"batch_abandoned"``), a subject (``"$JS.EVENT.ADVISORY.STREAM.>"``,
        wildcards allowed) or None for every advisory.
    :param stream, consumer, batch, reason: compared with the advisory's JSON fields.
    :param match: a dict of further JSON field values, or the dotted path of a predicate taking the
        advisory dict (:meth:`Advisory.to_dict`) and returning a bool.
    """

    advisory: str | None = None
    stream: str | None = None
    consumer: str | None = None
    batch: str | None = None
    reason: str | None = None
    match: dict[str, Any] | str | None = None

    def __post_init__(self) -> None:
        if self.advisory is not None:
            if not isinstance(self.advisory, str) or not self.advisory:
                raise InvalidRequestError(f"advisory must be a kind or a subject, got {self.advisory!r}",
                                          reason="unknown_advisory")
            if self.advisory.startswith(f"{EVENT_PREFIX}."):
                validate_subject(self.advisory, allow_wildcards=True, what="advisory subject")
            else:
                get_kind(self.advisory)
        if self.stream is not None:
            validate_name(self.stream, what="stream name")
        if self.consumer is not None:
            validate_name(self.consumer, what="consumer name")
        if isinstance(self.match, str):
            load_predicate(self.match)
        elif self.match is not None and not isinstance(self.match, dict):
            raise AdvisoryPredicateError(
                f"match must be a dict of field values or a predicate's dotted path, got {type(self.match).__name__}"
            )

    @property
    def kind(self) -> AdvisoryKind | None:
        if self.advisory and not self.advisory.startswith(f"{EVENT_PREFIX}."):
            return KINDS[self.advisory]
        return None

    def subject(self) -> str:
        """The narrowest subject covering every matching advisory (for a consumer filter or a subscription)."""
        kind = self.kind
        if kind is not None:
            stream = self.stream if kind.has_stream else None
            consumer = self.consumer if kind.has_consumer else None
            return kind.subject_for(stream, consumer)
        return self.advisory or f"{ADVISORY_PREFIX}.>"

    def matches(self, advisory: Advisory) -> bool:
        kind = self.kind
        if kind is not None and advisory.kind != kind.name:
            return False
        if kind is None and self.advisory and not (advisory.subject and subject_matches(self.advisory,
                                                                                        advisory.subject)):
            return False
        raw = advisory.raw
        for key in ("stream", "consumer", "batch", "reason"):
            wanted = getattr(self, key)
            if wanted is not None and raw.get(key) != wanted:
                return False
        if isinstance(self.match, dict):
            return all(raw.get(k) == v for k, v in self.match.items())
        if isinstance(self.match, str):
            return self._call_predicate(advisory)
        return True

    def _call_predicate(self, advisory: Advisory) -> bool:
        predicate = load_predicate(str(self.match))
        try:
            return bool(predicate(advisory.to_dict()))
        except Exception as exc:
            raise AdvisoryPredicateError(
                f"predicate {self.match!r} raised {type(exc).__name__}: {exc}", reason="predicate_failed"
            ) from exc

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AdvisoryFilter:
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})

    def describe(self) -> str:
        parts = [self.advisory or "any advisory"]
        parts += [f"{k}={v}" for k, v in self.to_dict().items() if k != "advisory" and v is not None]
        return " ".join(parts)


# --------------------------------------------------------------------------------------- capture stream


def capture_stream_config(name: str = DEFAULT_CAPTURE_STREAM, *, max_age: Any = "7d", max_bytes: int | None = None,
                          subjects: list[str] | tuple[str, ...] = DEFAULT_CAPTURE_SUBJECTS,
                          storage: str = "file", num_replicas: int = 1) -> dict[str, Any]:
    """Stream config that stores advisories, with a retention limit (age and optionally size)."""
    validate_name(name, what="capture stream name")
    if max_age in (None, 0, "0") and not max_bytes:
        raise InvalidRequestError(
            "a capture stream needs a retention limit: set max_age (e.g. '7d') and/or max_bytes",
            reason="missing_retention",
        )
    for subject in subjects:
        validate_subject(subject, allow_wildcards=True, what="capture subject")
        if not subject.startswith(f"{EVENT_PREFIX}."):
            raise InvalidRequestError(f"capture subject {subject!r} is not an advisory subject ({EVENT_PREFIX}.>)")
    config: dict[str, Any] = {
        "name": name, "subjects": list(subjects), "retention": "limits", "storage": storage,
        "discard": "old", "num_replicas": num_replicas,
        "description": "JetStream advisories captured for airflow-jetstream sensors",
    }
    if max_age not in (None, 0, "0"):
        config["max_age"] = to_nanos(max_age, field="max_age")
    if max_bytes:
        config["max_bytes"] = int(max_bytes)
    return config


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

    ``async with CaptureReader(conn, "ADVISORIES", since, flt) as reader``: :meth:`read_available`
    returns what is stored now; :meth:`next_batch` waits for more. The consumer filters on the
    narrowest subject for ``flt``, uses no acks and is deleted on exit (and by the server after
    ``inactive_threshold`` if the process dies).
    """

    def __init__(self, conn: JetStreamConnection, capture_stream: str, since: datetime | str,
                 advisory_filter: AdvisoryFilter, *, batch: int = 256, inactive_threshold: float = 120.0) -> None:
        validate_name(capture_stream, what="capture stream name")
        self.conn = conn
        self.capture_stream = capture_stream
        self.since = parse_time(since, field="since")
        self.filter = advisory_filter
        self.batch = batch
        self.inactive_threshold = inactive_threshold
        self.name = f"adv_{uuid.uuid4().hex[:16]}"
        self.pending = 0
        self.gap: str | None = None
        self._sub: Any = None

    async def __aenter__(self) -> CaptureReader:
        info = await capture_info(self.conn, self.capture_stream)
        self.gap = capture_gap(info, self.since)
        subject = self.filter.subject()
        covered = info["config"].get("subjects") or []
        if not any(subject_matches(s, subject) or subject_matches(subject, s) for s in covered):
            raise InvalidRequestError(
                f"capture stream {self.capture_stream!r} stores {covered}, which does not include {subject!r}; "
                "add the subject to the capture stream",
                reason="subject_not_captured",
            )
        config = {
            "name": self.name, "deliver_policy": "by_start_time", "opt_start_time": to_rfc3339(self.since),
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
        self._sub = await self.conn.js.pull_subscribe_bind(consumer=self.name, stream=self.capture_stream)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.conn.nc.is_closed:
            return  # the server drops the consumer after inactive_threshold
        if self._sub is not None:
            await self._sub.unsubscribe()
        if not self.conn.nc.is_closed:
            try:
                await delete_consumer(self.conn, self.capture_stream, self.name)
            except JetStreamError as exc:
                log.warning("could not delete reader consumer %s (the server drops it after %ss idle): %s",
                            self.name, self.inactive_threshold, exc)

    async def next_batch(self, timeout: float) -> list[Advisory]:
        """Advisories delivered within ``timeout`` seconds (all of them, matching or not)."""
        return (await self._fetch(timeout))[1]

    async def _fetch(self, timeout: float) -> tuple[int, list[Advisory]]:
        try:
            msgs = await self._sub.fetch(self.batch, timeout=timeout)
        except (nats.errors.TimeoutError, TimeoutError):
            return 0, []
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

    async def read_available(self, fetch_timeout: float = 2.0) -> AsyncIterator[Advisory]:
        """Yield every advisory stored now (from ``since``), then stop."""
        misses = 0
        while self.pending > 0 and misses < 2:
            fetched, advisories = await self._fetch(fetch_timeout)
            misses = 0 if fetched else misses + 1
            for advisory in advisories:
                yield advisory


async def find_captured(conn: JetStreamConnection, capture_stream: str, *, since: datetime | str,
                        advisory_filter: AdvisoryFilter) -> dict[str, Any]:
    """Look in the capture stream for the first advisory matching ``advisory_filter`` since ``since``.

    Returns ``{"advisory": dict | None, "scanned": n, "gap": warning | None}``.
    """
    async with CaptureReader(conn, capture_stream, since, advisory_filter) as reader:
        scanned = 0
        async for advisory in reader.read_available():
            scanned += 1
            if advisory_filter.matches(advisory):
                return {"advisory": advisory.to_dict(), "scanned": scanned, "gap": reader.gap}
        return {"advisory": None, "scanned": scanned, "gap": reader.gap}


async def watch_advisories(conn: JetStreamConnection, advisory_filter: AdvisoryFilter, *,
                           capture_stream: str | None, since: datetime | str | None = None,
                           poll_timeout: float = 5.0,
                           on_gap: Callable[[str], None] | None = None) -> AsyncIterator[Advisory]:
    """Yield matching advisories forever: from the capture stream starting at ``since``, or live.

    With ``capture_stream=None`` this subscribes to the advisory subject and sees only what is
    published from now on.
    """
    if capture_stream is None:
        async for advisory in _watch_live(conn, advisory_filter):
            yield advisory
        return
    async with CaptureReader(conn, capture_stream, since or datetime.now(UTC), advisory_filter) as reader:
        if reader.gap and on_gap is not None:
            on_gap(reader.gap)
        while True:
            for advisory in await reader.next_batch(poll_timeout):
                if advisory_filter.matches(advisory):
                    yield advisory


async def _watch_live(conn: JetStreamConnection, advisory_filter: AdvisoryFilter) -> AsyncIterator[Advisory]:
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
        return await asyncio.wait_for(anext(watcher), timeout=seconds)
    except TimeoutError:
        return None
    finally:
        await watcher.aclose()
