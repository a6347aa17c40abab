"""JetStream advisories as values: one table of kinds (subject, JSON type, typed fields), the parser, and
:class:`AdvisoryFilter`, which advisories a sensor or trigger waits for.

Every advisory (and the consumer ack metric) of nats-server 2.15 is one row of :data:`KINDS`, by
short name (``"batch_abandoned"``). :func:`parse_advisory` turns the server's JSON into an
:class:`Advisory` whose ``kind`` is that name and whose typed fields (``advisory.batch``,
``advisory.stream_seq`` ...) are read from the JSON by the row's field list. Unknown types are never
an error: they parse into an :class:`Advisory` with ``kind`` None whose ``to_dict()`` is the raw JSON.

A filter is plain data (it travels inside a serialized trigger); a predicate is given by the dotted
path of a module-level function so that the triggerer can import it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from functools import lru_cache
from typing import Any, cast

from airflow_jetstream.client.durations import parse_time
from airflow_jetstream.client.errors import InvalidFunctionError, InvalidRequestError
from airflow_jetstream.client.reading.apply_function import function_path, load_function
from airflow_jetstream.client.subjects import subject_matches, validate_name, validate_subject

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

    def subject_for(self, stream: str | None = None, consumer: str | None = None) -> str:
        """The concrete subject, with ``*`` for a stream/consumer not given (ignored when the subject names none)."""
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
            f"starting with {EVENT_PREFIX}.", reason="unknown_advisory") from None


# --------------------------------------------------------------------------------------- parsing

def parse_timestamp(value: Any) -> datetime | None:
    """An RFC 3339 timestamp with up to nanosecond precision (:func:`~airflow_jetstream.client.durations.parse_time`),
    or None when absent or unreadable."""
    with contextlib.suppress(InvalidRequestError):
        return parse_time(value) if isinstance(value, str) and value else None
    return None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


#: How each typed field is read from the JSON (a string unless named here); anything unreadable becomes None
#: (``replicas`` an empty list), never an exception.
_COERCE: dict[str, Callable[[Any], Any]] = {
    **dict.fromkeys(("stream_seq", "consumer_seq", "deliveries", "bytes", "dropped", "ack_time"), _as_int),
    **dict.fromkeys(("pause_until", "start", "end"), parse_timestamp),
    "paused": lambda value: value if isinstance(value, bool) else None,
    **dict.fromkeys(("client", "state"), lambda value: value if isinstance(value, dict) else None),
    "replicas": lambda value: value if isinstance(value, list) else [],
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
        return {**self.raw, "advisory_kind": self.kind, "advisory_subject": self.subject,
                "capture_seq": self.capture_seq}


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


# --------------------------------------------------------------------------------------- filters


class AdvisoryPredicateError(InvalidFunctionError, reason="invalid_predicate"):
    """A user predicate given by dotted path cannot be imported, is not callable, or raised."""


@lru_cache(maxsize=128)
def load_predicate(path: str) -> Callable[[dict[str, Any]], bool]:
    """Import ``"package.module.function"`` (or ``"package.module:function"``) and return it."""
    try:
        return cast(Callable[[dict[str, Any]], bool], load_function(path, what="predicate"))
    except InvalidFunctionError as exc:
        raise AdvisoryPredicateError(exc.message) from None


def predicate_path(func: Callable[..., Any]) -> str:
    """The dotted path of a module-level function, checked to import back to the same object."""
    try:
        return function_path(func, what="predicate")
    except InvalidFunctionError as exc:
        raise AdvisoryPredicateError(exc.message) from None


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
        return kind.subject_for(self.stream, self.consumer) if kind else self.advisory or f"{ADVISORY_PREFIX}.>"

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
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AdvisoryFilter:
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})

    def describe(self) -> str:
        parts = [self.advisory or "any advisory"]
        parts += [f"{k}={v}" for k, v in self.to_dict().items() if k != "advisory" and v is not None]
        return " ".join(parts)
