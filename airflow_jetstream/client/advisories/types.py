"""JetStream advisories as typed values: kinds, subjects and parsing of the server's JSON.

Every advisory (and the consumer ack metric) of nats-server 2.15 has a short name in :data:`KINDS`
(``"batch_abandoned"``) with its subject and JSON type. :func:`parse_advisory` turns the JSON into
a typed :class:`Advisory`; unknown types are never an error: they parse into a plain
:class:`Advisory` whose ``to_dict()`` is the raw JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, ClassVar

from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.subjects import validate_name

ADVISORY_PREFIX = "$JS.EVENT.ADVISORY"
METRIC_PREFIX = "$JS.EVENT.METRIC"
EVENT_PREFIX = "$JS.EVENT"
TYPE_PREFIX = "io.nats.jetstream.advisory.v1."
METRIC_TYPE_PREFIX = "io.nats.jetstream.metric.v1."
#: The stream that captures advisories (capture.py) unless told otherwise, and what it listens to.
DEFAULT_CAPTURE_STREAM = "ADVISORIES"
DEFAULT_CAPTURE_SUBJECTS = (f"{ADVISORY_PREFIX}.>",)


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
            coerce: Callable[[Any], Any] = _COERCE.get(f.name, _as_str)
            extra[f.name] = coerce(data.get(json_name))
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
