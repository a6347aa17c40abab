"""JetStream advisories as values: one table of kinds (subject, JSON type, typed fields) and the parser.

Every advisory (and the consumer ack metric) of nats-server 2.15 is one row of :data:`KINDS`, by
short name (``"batch_abandoned"``). :func:`parse_advisory` turns the server's JSON into an
:class:`Advisory` whose ``kind`` is that name and whose typed fields (``advisory.batch``,
``advisory.stream_seq`` ...) are read from the JSON by the row's field list. Unknown types are never
an error: they parse into an :class:`Advisory` with ``kind`` None whose ``to_dict()`` is the raw JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.subjects import validate_name

ADVISORY_PREFIX = "$JS.EVENT.ADVISORY"
METRIC_PREFIX = "$JS.EVENT.METRIC"
EVENT_PREFIX = "$JS.EVENT"
TYPE_PREFIX = "io.nats.jetstream.advisory.v1."
METRIC_TYPE_PREFIX = "io.nats.jetstream.metric.v1."
#: The stream that captures advisories (capture.py) unless told otherwise, and what it listens to.
DEFAULT_CAPTURE_STREAM = "ADVISORIES"
#: Every advisory but the API audits (``$JS.EVENT.ADVISORY.API``, one per JetStream API call of any client: a flood
#: that would push the advisories that matter out of the stream, and make every status read write into it).
DEFAULT_CAPTURE_SUBJECTS = (f"{ADVISORY_PREFIX}.*.>",)


@dataclass(frozen=True)
class AdvisoryKind:
    """One advisory the server publishes: short name, subject template, JSON type and typed fields.

    ``action`` tells kinds apart that share a JSON type (``stream_action`` with ``create`` /
    ``modify`` / ``delete``).
    """

    name: str
    subject: str  # relative to the prefix; "{stream}" / "{consumer}" tokens
    type: str
    fields: tuple[str, ...] = ()
    action: str | None = None
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


_SEQS = ("consumer_seq", "stream_seq", "deliveries")
_LEADER = ("leader", "cluster", "replicas")
_SNAPSHOT = ("start", "end", "bytes", "client", "state")
_SERVER = ("server", "server_id", "cluster")
_ROWS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    # name, subject after $JS.EVENT.ADVISORY., JSON type after io.nats.jetstream.advisory.v1. (":action"), fields
    ("stream_created", "STREAM.CREATED.{stream}", "stream_action:create", ("action",)),
    ("stream_updated", "STREAM.UPDATED.{stream}", "stream_action:modify", ("action",)),
    ("stream_deleted", "STREAM.DELETED.{stream}", "stream_action:delete", ("action",)),
    ("consumer_created", "CONSUMER.CREATED.{stream}.{consumer}", "consumer_action:create", ("action",)),
    ("consumer_deleted", "CONSUMER.DELETED.{stream}.{consumer}", "consumer_action:delete", ("action",)),
    ("consumer_pause", "CONSUMER.PAUSE.{stream}.{consumer}", "consumer_pause", ("paused", "pause_until")),
    ("consumer_pinned", "CONSUMER.PINNED.{stream}.{consumer}", "consumer_group_pinned", ("group", "pinned_id")),
    ("consumer_unpinned", "CONSUMER.UNPINNED.{stream}.{consumer}", "consumer_group_unpinned", ("group", "reason")),
    ("max_deliveries", "CONSUMER.MAX_DELIVERIES.{stream}.{consumer}", "max_deliver", ("stream_seq", "deliveries")),
    ("msg_naked", "CONSUMER.MSG_NAKED.{stream}.{consumer}", "nak", _SEQS),
    ("msg_terminated", "CONSUMER.MSG_TERMINATED.{stream}.{consumer}", "terminated", (*_SEQS, "reason")),
    ("batch_abandoned", "STREAM.BATCH_ABANDONED.{stream}", "stream_batch_abandoned", ("batch", "reason")),
    ("api_audit", "API", "api_audit", ("server", "client", "api_subject", "request", "response")),
    ("api_limit_reached", "API.LIMIT_REACHED", "api_limit_reached", ("server", "dropped")),
    ("stream_leader_elected", "STREAM.LEADER_ELECTED.{stream}", "stream_leader_elected", _LEADER),
    ("stream_quorum_lost", "STREAM.QUORUM_LOST.{stream}", "stream_quorum_lost", ("replicas",)),
    ("consumer_leader_elected", "CONSUMER.LEADER_ELECTED.{stream}.{consumer}", "consumer_leader_elected", _LEADER),
    ("consumer_quorum_lost", "CONSUMER.QUORUM_LOST.{stream}.{consumer}", "consumer_quorum_lost", ("replicas",)),
    ("domain_leader_elected", "DOMAIN.LEADER_ELECTED", "domain_leader_elected", _LEADER),
    ("snapshot_create", "STREAM.SNAPSHOT_CREATE.{stream}", "snapshot_create", _SNAPSHOT),
    ("snapshot_complete", "STREAM.SNAPSHOT_COMPLETE.{stream}", "snapshot_complete", _SNAPSHOT),
    ("restore_create", "STREAM.RESTORE_CREATE.{stream}", "restore_create", _SNAPSHOT),
    ("restore_complete", "STREAM.RESTORE_COMPLETE.{stream}", "restore_complete", _SNAPSHOT),
    ("server_out_of_storage", "SERVER.OUT_OF_STORAGE", "server_out_of_space", _SERVER),
    ("server_removed", "SERVER.REMOVED", "server_removed", _SERVER),
)


def _row(name: str, subject: str, type_action: str, fields: tuple[str, ...]) -> AdvisoryKind:
    type_suffix, _, action = type_action.partition(":")
    return AdvisoryKind(name, subject, TYPE_PREFIX + type_suffix, fields, action or None)


#: Every advisory (and the consumer ack metric) of nats-server 2.15, by short name.
KINDS: dict[str, AdvisoryKind] = {k.name: k for k in (
    *(_row(*row) for row in _ROWS),
    AdvisoryKind("consumer_ack", "CONSUMER.ACK.{stream}.{consumer}", METRIC_TYPE_PREFIX + "consumer_ack",
                 ("consumer_seq", "stream_seq", "ack_time", "deliveries"), prefix=METRIC_PREFIX),
)}
_BY_TYPE: dict[str, list[AdvisoryKind]] = {}
for _kind in KINDS.values():
    _BY_TYPE.setdefault(_kind.type, []).append(_kind)


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


#: How each typed field is read from the JSON; anything unreadable becomes None (never an exception).
_COERCE: dict[str, Callable[[Any], Any]] = {
    "stream_seq": _as_int, "consumer_seq": _as_int, "deliveries": _as_int, "bytes": _as_int,
    "dropped": _as_int, "ack_time": _as_int, "paused": _as_bool, "pause_until": parse_timestamp,
    "start": parse_timestamp, "end": parse_timestamp, "client": _as_dict, "state": _as_dict,
    "replicas": _as_list,
}
_JSON_NAMES = {"api_subject": "subject"}  # api_audit's "subject" is the API subject, not the advisory's


def _read_field(data: Mapping[str, Any], name: str) -> Any:
    coerce: Callable[[Any], Any] = _COERCE.get(name, _as_str)
    return coerce(data.get(_JSON_NAMES.get(name, name)))


@dataclass(frozen=True, kw_only=True)
class Advisory:
    """An advisory as received.

    ``kind`` is its short name in :data:`KINDS` (None for a type this version does not know);
    ``subject`` the NATS subject it was published on; ``capture_seq`` its sequence in the capture
    stream (None when read live); ``raw`` the JSON exactly as sent; ``fields`` the kind's typed
    fields, also readable as attributes (``advisory.batch``, ``advisory.stream_seq``).
    """

    type: str
    kind: str | None = None
    id: str | None = None
    timestamp: datetime | None = None
    subject: str | None = None
    capture_seq: int | None = None
    domain: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        typed = self.__dict__.get("fields", {})
        if name in typed:
            return typed[name]
        raise AttributeError(f"{self.kind or self.type} advisory has no field {name!r}")

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


def parse_advisory(data: Mapping[str, Any], *, subject: str | None = None,
                   capture_seq: int | None = None) -> Advisory:
    """An :class:`Advisory` from its JSON object; an unknown type gives ``kind`` None and no typed fields."""
    type_name = _as_str(data.get("type")) or ""
    candidates = _BY_TYPE.get(type_name, [])
    kind = next((k for k in candidates if k.action in (None, data.get("action"))), None)
    typed = {name: _read_field(data, name) for name in (candidates[0].fields if candidates else ())}
    return Advisory(
        type=type_name, kind=kind.name if kind else None, id=_as_str(data.get("id")),
        timestamp=parse_timestamp(data.get("timestamp")), subject=subject, capture_seq=capture_seq,
        domain=_as_str(data.get("domain")), raw=dict(data), fields=typed,
    )


def decode_advisory(payload: bytes, *, subject: str | None = None, capture_seq: int | None = None) -> Advisory | None:
    """Parse a message payload; None when it is not a JSON object (never raises)."""
    try:
        data = json.loads(payload or b"null")
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return parse_advisory(data, subject=subject, capture_seq=capture_seq)
