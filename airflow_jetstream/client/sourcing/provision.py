"""Durable stream sourcing and mirroring (ADR: durable sourcing), as nats-server 2.15 implements it.

Two modes make a stream ``A`` source (or mirror) an origin ``O`` without losing messages:

- ``server``: a plain source on a WorkQueue or Interest origin. The server creates and manages a
  durable flow-control consumer (``JS_SRC_<hash>`` / ``JS_MIRROR_<hash>``) on ``O``. On a Limits
  origin the server would still use an ephemeral consumer, so that is refused.
- ``user``: this module creates (or updates) a durable push consumer on ``O`` with the settings the
  server requires (ack policy ``flow_control``, flow control, 1 s heartbeat, ``max_deliver -1``,
  ``max_ack_pending > 0``, no ``ack_wait``/``backoff``); filter and start position live on the
  consumer, and the source names it with its deliver subject.

Everything is validated locally first, ``A``'s other sources are kept, re-runs are idempotent, and
success is only reported once the server shows the source healthy (no ``error``, ``active >= 0``).
A plain (ephemeral or server-managed) source of ``O`` is migrated to ``user`` mode without loss or
duplicates: the durable consumer starts right after the last message ``A`` holds from ``O``.
"""

from __future__ import annotations

import asyncio
import base64
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from airflow_jetstream.client import metrics, server_features
from airflow_jetstream.client.admin.consumers import (
    DELIVER_POLICIES,
    REPLAY_POLICIES,
    api_view,
    delete_consumer,
    domain_api_prefix,
    ensure_consumer,
    find_consumer,
    list_consumers,
    to_rfc3339,
)
from airflow_jetstream.client.admin.streams import (
    check_replicas,
    default_replicas,
    ensure_stream,
    find_stream,
    normalize_placement,
    replication_config,
    stream_info,
)
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import (
    ConsumerConfigError,
    ConsumerNotFoundError,
    InvalidRequestError,
    JetStreamError,
    ServerAPIError,
    StreamConfigError,
    StreamNotFoundError,
    error_from_api,
)
from airflow_jetstream.client.subjects import validate_name, validate_subject

SERVER_MANAGED = "server"
USER_MANAGED = "user"
MODES = (SERVER_MANAGED, USER_MANAGED)
#: Header the server puts on every sourced message: ``<origin>[:<suffix>] <origin seq> ...``.
SOURCE_HEADER = "Nats-Stream-Source"
#: What the server requires of a consumer used for durable sourcing.
FLOW_CONTROL_CONSUMER = {
    "ack_policy": "flow_control",
    "flow_control": True,
    "idle_heartbeat": "1s",
    "max_deliver": -1,
}
DEFAULT_MAX_ACK_PENDING = 1000
_POLL_SECONDS = 0.1


class SourceUnhealthyError(JetStreamError):
    """A source or mirror did not become healthy (no error, ``active >= 0``) within the deadline."""

    default_reason = "source_unhealthy"


_RESULT_FIELDS = ("stream", "source", "mode", "mirror", "domain", "api_prefix")


@dataclass(frozen=True)
class DurableSource:
    """What to provision: stream ``stream`` durably sources (or mirrors) ``source``.

    ``domain`` is the origin's JetStream domain when it lives elsewhere (e.g. a leaf node);
    ``api_prefix`` names the origin's JetStream API prefix directly instead (e.g. an imported one).
    ``consumer``, ``deliver_subject``, ``deliver_policy``, ``replay_policy`` and ``max_ack_pending``
    only apply to ``user`` mode; ``filter_subjects``, ``start_seq`` and ``start_time`` to both.
    ``num_replicas`` and ``placement`` (``{"cluster": ..., "tags": [...]}``) are stream ``stream``'s:
    when None, a new stream gets :func:`default_replicas` (3 on a cluster) and an existing one keeps
    what it has; when given, an existing stream is changed to them.
    ``allow_shared_origin``: let a WorkQueue/Interest origin that already feeds another stream feed this
    one too (each message is then copied into both); refused by default (``origin_already_sourced``).
    """

    stream: str
    source: str
    mode: str = SERVER_MANAGED
    consumer: str | None = None
    deliver_subject: str | None = None
    mirror: bool = False
    filter_subjects: tuple[str, ...] = ()
    start_seq: int | None = None
    start_time: str | None = None
    deliver_policy: str | None = None
    replay_policy: str | None = None
    max_ack_pending: int | None = None
    domain: str | None = None
    api_prefix: str | None = None
    num_replicas: int | None = None
    placement: dict[str, Any] | None = None
    allow_shared_origin: bool = False

    @property
    def user_managed(self) -> bool:
        return self.mode == USER_MANAGED

    @property
    def external_api(self) -> str | None:
        return domain_api_prefix(self.domain) if self.domain else self.api_prefix

    @property
    def where(self) -> str:
        """`` in domain 'x'`` / `` via API prefix 'y'`` / empty: for messages."""
        if self.domain:
            return f" in JetStream domain {self.domain!r}"
        return f" via API prefix {self.api_prefix!r}" if self.api_prefix else ""

    def validated(self) -> DurableSource:
        """A normalized copy, or :class:`InvalidRequestError` / :class:`ConsumerConfigError` (nothing sent)."""
        validate_name(self.stream, what="stream name")
        validate_name(self.source, what="origin stream name")
        if self.stream == self.source and not self.external_api:
            raise InvalidRequestError("a stream cannot source itself", reason="invalid_source")
        if self.mode not in MODES:
            raise InvalidRequestError(f"mode must be 'server' or 'user', got {self.mode!r}", reason="invalid_mode")
        if self.domain is not None:
            validate_name(self.domain, what="JetStream domain")
        if self.domain and self.api_prefix:
            raise InvalidRequestError("give either the origin's JetStream domain or its API prefix, not both",
                                      reason="invalid_source")
        if self.api_prefix is not None:
            validate_subject(self.api_prefix, what="origin API prefix")
        filters = (self.filter_subjects,) if isinstance(self.filter_subjects, str) else self.filter_subjects
        filters = tuple(validate_subject(f, allow_wildcards=True, what="filter subject") for f in filters or ())
        if len(set(filters)) != len(filters):
            raise InvalidRequestError("filter_subjects has duplicates", reason="invalid_filter")
        for i, first in enumerate(filters):
            for second in filters[i + 1:]:
                if subjects_overlap(first, second):
                    raise InvalidRequestError(
                        f"filter subjects {first!r} and {second!r} overlap; the server refuses overlapping filters",
                        reason="invalid_filter",
                    )
        start_seq = self.start_seq
        if start_seq is not None and (isinstance(start_seq, bool) or not isinstance(start_seq, int) or start_seq < 1):
            raise InvalidRequestError(f"start_seq must be a stream sequence >= 1, got {start_seq!r}",
                                      reason="invalid_start")
        start_time = to_rfc3339(self.start_time) if self.start_time is not None else None
        if start_seq is not None and start_time is not None:
            raise InvalidRequestError("give start_seq or start_time, not both", reason="invalid_start")
        spec = replace(self, filter_subjects=filters, start_time=start_time,
                       num_replicas=check_replicas(self.num_replicas), placement=normalize_placement(self.placement))
        if not spec.user_managed:
            given = [k for k in ("consumer", "deliver_subject", "deliver_policy", "replay_policy", "max_ack_pending")
                     if getattr(spec, k) is not None]
            if given:
                raise InvalidRequestError(
                    f"{', '.join(given)} only apply to mode='user' (the server picks its own consumer in "
                    "mode='server'); use mode='user' to control the consumer",
                    reason="invalid_source",
                )
            return spec
        return spec._validated_user()

    def _validated_user(self) -> DurableSource:
        consumer = self.consumer or f"{self.stream}_SRC_{self.source}"
        deliver = self.deliver_subject or f"_SRC.{self.stream}.{self.source}"
        try:
            validate_name(consumer, what="consumer name")
            validate_subject(deliver, what="deliver subject")
        except InvalidRequestError as exc:
            raise ConsumerConfigError(f"{exc.message} (a durable source needs a concrete deliver subject)",
                                      reason="invalid_source_consumer") from None
        policy = self.deliver_policy
        if policy is not None and policy not in DELIVER_POLICIES:
            raise ConsumerConfigError(
                f"deliver_policy {policy!r} is not valid; use one of {', '.join(DELIVER_POLICIES)}",
                reason="invalid_field")
        if policy == "last_per_subject" and not self.filter_subjects:
            raise ConsumerConfigError("deliver_policy last_per_subject needs filter_subjects (the server refuses it "
                                      "without a filter; use '>' for every subject)", reason="invalid_field")
        if self.start_seq is not None:
            if policy not in (None, "by_start_sequence"):
                raise ConsumerConfigError(f"start_seq needs deliver_policy by_start_sequence, not {policy!r}",
                                          reason="invalid_field")
            policy = "by_start_sequence"
        elif self.start_time is not None:
            if policy not in (None, "by_start_time"):
                raise ConsumerConfigError(f"start_time needs deliver_policy by_start_time, not {policy!r}",
                                          reason="invalid_field")
            policy = "by_start_time"
        elif policy in ("by_start_sequence", "by_start_time"):
            raise ConsumerConfigError(f"deliver_policy {policy!r} needs start_seq or start_time",
                                      reason="invalid_field")
        if self.replay_policy is not None and self.replay_policy not in REPLAY_POLICIES:
            raise ConsumerConfigError(f"replay_policy {self.replay_policy!r} is not valid; use instant or original",
                                      reason="invalid_field")
        pending = DEFAULT_MAX_ACK_PENDING if self.max_ack_pending is None else self.max_ack_pending
        if isinstance(pending, bool) or not isinstance(pending, int) or pending < 1:
            raise ConsumerConfigError(
                f"max_ack_pending must be > 0 for a flow-control consumer, got {pending!r}",
                reason="max_ack_pending_required",
            )
        return replace(self, consumer=consumer, deliver_subject=deliver, deliver_policy=policy or "all",
                       max_ack_pending=pending)

    def consumer_config(self) -> dict[str, Any]:
        """The durable push consumer (``user`` mode) the server accepts for sourcing."""
        cfg: dict[str, Any] = {
            "name": self.consumer,
            "durable_name": self.consumer,
            "deliver_subject": self.deliver_subject,
            "deliver_policy": self.deliver_policy,
            "max_ack_pending": self.max_ack_pending,
            **FLOW_CONTROL_CONSUMER,
        }
        if self.replay_policy:
            cfg["replay_policy"] = self.replay_policy
        if self.start_seq is not None:
            cfg["opt_start_seq"] = self.start_seq
        if self.start_time is not None:
            cfg["opt_start_time"] = self.start_time
        if len(self.filter_subjects) == 1:
            cfg["filter_subject"] = self.filter_subjects[0]
        elif self.filter_subjects:
            cfg["filter_subjects"] = list(self.filter_subjects)
        return cfg

    def source_entry(self) -> dict[str, Any]:
        """The ``sources[]`` / ``mirror`` entry of stream ``A``."""
        entry: dict[str, Any] = {"name": self.source}
        if self.external_api:
            entry["external"] = {"api": self.external_api}
        if self.user_managed:
            entry["consumer"] = {"name": self.consumer, "deliver_subject": self.deliver_subject}
            return entry
        if self.start_seq is not None:
            entry["opt_start_seq"] = self.start_seq
        if self.start_time is not None:
            entry["opt_start_time"] = self.start_time
        if len(self.filter_subjects) == 1:
            entry["filter_subject"] = self.filter_subjects[0]
        elif self.filter_subjects:
            entry["subject_transforms"] = [{"src": f, "dest": ""} for f in self.filter_subjects]
        return entry

    def is_same_origin(self, entry: dict[str, Any]) -> bool:
        """True when ``entry`` (of A's sources) reads from this origin in this domain."""
        api = (entry.get("external") or {}).get("api")
        return entry.get("name") == self.source and api == self.external_api


def subjects_overlap(first: str, second: str) -> bool:
    """True when some subject matches both (wildcard) subjects."""
    a, b = first.split("."), second.split(".")
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b):
            return False
        if a[i] == ">" or b[i] == ">":
            return True
        if a[i] != b[i] and "*" not in (a[i], b[i]):
            return False
    return len(a) == len(b)


def _entry_filters(entry: dict[str, Any]) -> tuple[str, ...]:
    if entry.get("filter_subject"):
        return (entry["filter_subject"],)
    return tuple(t["src"] for t in entry.get("subject_transforms") or [] if t.get("src"))


def _same_entry(wanted: dict[str, Any], current: dict[str, Any]) -> bool:
    keys = ("name", "consumer", "opt_start_seq", "opt_start_time")
    if any((wanted.get(k) or None) != (current.get(k) or None) for k in keys):
        return False
    if ((wanted.get("external") or {}).get("api")) != ((current.get("external") or {}).get("api")):
        return False
    return sorted(_entry_filters(wanted)) == sorted(_entry_filters(current))


def _check_flow_control_consumer(info: dict[str, Any], spec: DurableSource) -> None:
    """Refuse an existing consumer the server would reject for sourcing (10217-10222), naming the fix."""
    cfg = info["config"]
    where = f"consumer {spec.consumer!r} on {spec.source!r}"
    problems = []
    if cfg.get("ack_policy") != "flow_control":
        problems.append(f"ack_policy is {cfg.get('ack_policy')!r}, needs 'flow_control'")
    if not cfg.get("deliver_subject"):
        problems.append("it is a pull consumer, needs a deliver subject (push)")
    if not cfg.get("flow_control"):
        problems.append("flow_control is off")
    if cfg.get("max_deliver", -1) != -1:
        problems.append(f"max_deliver is {cfg.get('max_deliver')}, needs -1")
    if cfg.get("backoff"):
        problems.append("backoff is set")
    if problems:
        raise ConsumerConfigError(
            f"{where} cannot be used for durable sourcing: {'; '.join(problems)}. Let the operator create it "
            "(create_consumer=True) or recreate it as a flow-control push consumer",
            reason="consumer_not_flow_control",
        )
    if spec.deliver_subject and cfg["deliver_subject"] != spec.deliver_subject:
        raise ConsumerConfigError(
            f"{where} delivers to {cfg['deliver_subject']!r}, not {spec.deliver_subject!r}; "
            "leave deliver_subject unset to use the consumer's own",
            reason="invalid_source_consumer",
        )


def _check_against_streams(spec: DurableSource, target: dict[str, Any] | None, origin: dict[str, Any]) -> None:
    """Checks needing the streams' configs, mirroring the server's 10213/10215/10216 rules."""
    if spec.user_managed:
        for owner in filter(None, (target, origin)):
            for subject in owner["config"].get("subjects") or []:
                if subjects_overlap(subject, spec.deliver_subject or ""):
                    raise ConsumerConfigError(
                        f"deliver subject {spec.deliver_subject!r} overlaps subject {subject!r} of stream "
                        f"{owner['config']['name']!r}; pick a deliver subject no stream captures",
                        reason="invalid_source_consumer",
                    )
    if target is None:
        return
    cfg = target["config"]
    if spec.mirror and cfg.get("sources"):
        raise StreamConfigError(f"stream {spec.stream!r} has sources: it cannot become a mirror",
                                reason="invalid_mirror")
    if not spec.mirror and cfg.get("mirror"):
        raise StreamConfigError(
            f"stream {spec.stream!r} is a mirror of {cfg['mirror'].get('name')!r}: it cannot take sources; "
            "use mirror=True or another stream", reason="invalid_source")
    if not spec.user_managed:
        return
    for entry in cfg.get("sources") or []:
        if spec.is_same_origin(entry):
            continue
        used = entry.get("consumer") or {}
        if used.get("name") == spec.consumer and entry.get("name") == spec.source:
            raise StreamConfigError(f"consumer {spec.consumer!r} already feeds another source of {spec.stream!r}; "
                                    "use one consumer per source", reason="duplicate_source_consumer")
        if used.get("deliver_subject") == spec.deliver_subject:
            raise StreamConfigError(
                f"deliver subject {spec.deliver_subject!r} is already used by the source {entry['name']!r} of "
                f"{spec.stream!r}; use one deliver subject per source", reason="duplicate_source_consumer")


def _feeds_other_stream(info: dict[str, Any], spec: DurableSource, own: set[str]) -> str | None:
    """A description of what ``info`` (a consumer on the origin) feeds, if it is another durable source
    (``own``: the consumers stream ``spec.stream`` already sources through)."""
    cfg = info["config"]
    meta = cfg.get("metadata") or {}
    owner = meta.get("_nats.mirror.stream") or meta.get("_nats.src.stream")
    if cfg.get("sourcing") and owner:
        return None if owner == spec.stream else f"server-managed consumer {info['name']!r} feeding stream {owner!r}"
    if cfg.get("ack_policy") == "flow_control" and cfg.get("deliver_subject"):
        if info["name"] in own or (spec.user_managed and info["name"] == spec.consumer):
            return None
        return f"user-managed consumer {info['name']!r} (deliver subject {cfg['deliver_subject']!r})"
    return None


async def _check_shared_origin(origin_conn: JetStreamConnection, spec: DurableSource, retention: str,
                               target: dict[str, Any] | None) -> None:
    """Refuse a second durable source on a WorkQueue/Interest origin: both would get every message."""
    if retention not in ("workqueue", "interest") or spec.allow_shared_origin:
        return
    cfg = (target or {}).get("config") or {}
    entries = [*(cfg.get("sources") or []), *([cfg["mirror"]] if cfg.get("mirror") else [])]
    own = {(e.get("consumer") or {}).get("name") for e in entries if spec.is_same_origin(e)} - {None}
    ours = spec.filter_subjects or (">",)
    for info in await list_consumers(origin_conn, spec.source):
        feeding = _feeds_other_stream(info, spec, own)
        cfg = info["config"]
        theirs = tuple(cfg.get("filter_subjects") or ()) or ((cfg["filter_subject"],) if cfg.get("filter_subject")
                                                             else (">",))
        if feeding and any(subjects_overlap(a, b) for a in ours for b in theirs):
            raise StreamConfigError(
                f"origin {spec.source!r}{spec.where} is a {retention} stream already sourced by the {feeding}: a "
                f"second durable source would copy each message into both streams. Source the existing aggregate "
                f"instead, delete that source first, or pass allow_shared_origin=True if every message belongs "
                f"in both", reason="origin_already_sourced")


async def _update_entries(conn: JetStreamConnection, spec: DurableSource, target: dict[str, Any] | None,
                          entry: dict[str, Any] | None) -> dict[str, Any]:
    """Create A or put ``entry`` in place of A's entry for this origin (None removes it); others stay."""
    if target is None:
        key = "mirror" if spec.mirror else "sources"
        body = {"name": spec.stream, key: entry if spec.mirror else [entry], "num_replicas": default_replicas(conn),
                **replication_config(spec.num_replicas, spec.placement)}
        return await conn.api_request(f"STREAM.CREATE.{spec.stream}", body, context=f"create stream {spec.stream!r}")
    cfg = dict(target["config"])
    sources = [e for e in cfg.get("sources") or [] if not spec.is_same_origin(e)]
    if entry is not None:
        sources.append(entry)
    cfg["sources"] = sources
    return await conn.api_request(f"STREAM.UPDATE.{spec.stream}", cfg, context=f"update stream {spec.stream!r}")


def _find_entry(info: dict[str, Any], spec: DurableSource) -> dict[str, Any] | None:
    """The source state (``lag``, ``active``, ``error``, ...) of this origin in A's stream info."""
    if spec.mirror:
        mirror = info.get("mirror")
        return mirror if mirror and spec.is_same_origin(mirror) else None
    matches = [e for e in info.get("sources") or [] if spec.is_same_origin(e)]
    return matches[0] if matches else None


async def wait_source_healthy(conn: JetStreamConnection, spec: DurableSource, *, timeout: float = 30.0,
                              origin_conn: JetStreamConnection | None = None) -> dict[str, Any]:
    """Poll A's stream info until the source of ``spec.source`` has no error and ``active >= 0``.

    A source ``error`` (e.g. 10217: the consumer is not a flow-control consumer) fails at once; a
    missing consumer, which the server only reports as ``active: -1``, fails at the deadline with
    :class:`ConsumerNotFoundError`; anything else at the deadline is :class:`SourceUnhealthyError`.
    Returns the source state.
    """
    origin_conn = origin_conn or api_view(conn, api_prefix=spec.external_api)
    deadline = time.monotonic() + timeout
    where = f"{'mirror' if spec.mirror else 'source'} {spec.source!r} of stream {spec.stream!r}"
    state: dict[str, Any] | None = None
    while True:
        info = await stream_info(conn, spec.stream)
        state = _find_entry(info, spec)
        if state is None:
            raise StreamConfigError(f"stream {spec.stream!r} has no {where}", reason="source_missing")
        if state.get("error"):
            err = error_from_api(state["error"], context=where)
            if err.err_code == 10217:
                err.message += (f": consumer {spec.consumer!r} must be a flow-control push consumer "
                                "(ack_policy flow_control, flow_control true, 1s heartbeat, max_deliver -1)")
            raise err
        if int(state.get("active", -1)) >= 0:
            return state
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(_POLL_SECONDS)
    if spec.consumer and await find_consumer(origin_conn, spec.source, spec.consumer) is None:
        raise ConsumerNotFoundError(
            f"{where} uses consumer {spec.consumer!r}, which does not exist on {spec.source!r}{spec.where} (the "
            "server only shows active -1). Create it (mode='user' with create_consumer=True does) or fix the "
            "consumer name / domain",
            reason="source_consumer_missing",
        )
    raise SourceUnhealthyError(
        f"{where} did not become active within {timeout}s (active -1, no error): check that the origin "
        f"stream{spec.where} is reachable (leaf node connected, domain right) and the consumer is not paused",
    )


async def server_managed_consumer(origin_conn: JetStreamConnection, spec: DurableSource,
                                  timeout: float = 10.0) -> dict[str, Any]:
    """The ``JS_SRC_``/``JS_MIRROR_`` consumer the server made on the origin for stream A."""
    deadline = time.monotonic() + timeout
    prefix = "JS_MIRROR_" if spec.mirror else "JS_SRC_"
    owner_key = "_nats.mirror.stream" if spec.mirror else "_nats.src.stream"
    while True:
        for info in await list_consumers(origin_conn, spec.source):
            cfg = info["config"]
            meta = cfg.get("metadata") or {}
            ours = meta.get(owner_key) == spec.stream and cfg.get("sourcing")
            if not (ours and info["name"].startswith(prefix)):
                continue
            filters = tuple(cfg.get("filter_subjects") or ())
            filters = filters or ((cfg["filter_subject"],) if cfg.get("filter_subject") else ())
            if sorted(filters) == sorted(spec.filter_subjects):
                return info
        if time.monotonic() >= deadline:
            raise SourceUnhealthyError(
                f"the server made no durable {prefix}* consumer on {spec.source!r} for stream {spec.stream!r} "
                f"within {timeout}s: the origin may not be a WorkQueue/Interest stream, or the server is older "
                "than 2.14; use mode='user'",
                reason="server_consumer_missing",
            )
        await asyncio.sleep(_POLL_SECONDS)


async def last_sourced_seq(conn: JetStreamConnection, stream: str, origin: str, *, max_scan: int = 1_000_000) -> int:
    """The origin sequence of the newest message in ``stream`` that came from ``origin`` (0 if none).

    Reads the ``Nats-Stream-Source`` header backwards from the stream's last message.
    """
    state = (await stream_info(conn, stream))["state"]
    first, seq = int(state.get("first_seq", 0)), int(state.get("last_seq", 0))
    scanned = 0
    while seq >= max(first, 1):
        if scanned >= max_scan:
            raise SourceUnhealthyError(
                f"no message from {origin!r} among the last {max_scan} of stream {stream!r}; cannot find where "
                "sourcing stopped", reason="migration_scan_limit")
        scanned += 1
        try:
            reply = await conn.api_request(f"STREAM.MSG.GET.{stream}", {"seq": seq}, context=f"stream {stream!r}")
        except ServerAPIError as exc:
            if exc.err_code != 10037:
                raise
            seq -= 1
            continue
        origin_seq = _origin_seq(reply["message"].get("hdrs"), origin)
        if origin_seq is not None:
            return origin_seq
        seq -= 1
    return 0


def _origin_seq(hdrs: str | None, origin: str) -> int | None:
    if not hdrs:
        return None
    for line in base64.b64decode(hdrs).decode(errors="replace").split("\r\n"):
        name, _, value = line.partition(":")
        if name.strip().lower() != SOURCE_HEADER.lower():
            continue
        parts = value.split()
        if len(parts) >= 2 and (parts[0] == origin or parts[0].startswith(origin + ":")):
            return int(parts[1])
    return None


async def _migrate(conn: JetStreamConnection, origin_conn: JetStreamConnection, spec: DurableSource,
                   target: dict[str, Any], old: dict[str, Any], origin: dict[str, Any]) -> dict[str, Any]:
    """Replace a plain source of O by a user-managed durable one, without loss or duplicates.

    WorkQueue origin (its consumers must deliver all): the old source goes first (its consumer is
    deleted, unacked messages stay in O), then what A already holds is purged from O, and the
    durable consumer is created and the source added. Other origins: the old source goes, the
    durable consumer starts right after A's last message from O. On an Interest origin a plain
    pull consumer holds the interest meanwhile (so nothing published during the switch is dropped)
    and is deleted at the end.
    """
    workqueue = origin["config"].get("retention") == "workqueue"
    consumer_cfg = spec.consumer_config()
    if not spec.filter_subjects and _entry_filters(old):
        spec = replace(spec, filter_subjects=_entry_filters(old))
        consumer_cfg = spec.consumer_config()
    if workqueue:
        target_after = await _update_entries(conn, spec, target, None)
        last = await last_sourced_seq(conn, spec.stream, spec.source)
        if last:
            for subject in spec.filter_subjects or (None,):
                body: dict[str, Any] = {"seq": last + 1}
                if subject:
                    body["filter"] = subject
                await origin_conn.api_request(f"STREAM.PURGE.{spec.source}", body,
                                              context=f"purge what {spec.stream!r} already holds from {spec.source!r}")
        await ensure_consumer(origin_conn, spec.source, consumer_cfg)
        await _update_entries(conn, spec, target_after, spec.source_entry())
        return {"migrated_after_seq": last}
    holder = f"{spec.consumer}_MIGRATING"
    if origin["config"].get("retention") == "interest":
        holder_cfg: dict[str, Any] = {"name": holder, "ack_policy": "explicit"}
        holder_cfg.update({k: v for k, v in consumer_cfg.items() if k in ("filter_subject", "filter_subjects")})
        await ensure_consumer(origin_conn, spec.source, holder_cfg)
    target_after = await _update_entries(conn, spec, target, None)
    last = await last_sourced_seq(conn, spec.stream, spec.source)
    if last:
        consumer_cfg.update(deliver_policy="by_start_sequence", opt_start_seq=last + 1)
    elif old.get("opt_start_seq"):
        consumer_cfg.update(deliver_policy="by_start_sequence", opt_start_seq=old["opt_start_seq"])
    elif old.get("opt_start_time"):
        consumer_cfg.update(deliver_policy="by_start_time", opt_start_time=old["opt_start_time"])
    await ensure_consumer(origin_conn, spec.source, consumer_cfg)
    await _update_entries(conn, spec, target_after, spec.source_entry())
    await delete_consumer(origin_conn, spec.source, holder)
    return {"migrated_after_seq": last}


async def provision_durable_source(conn: JetStreamConnection, spec: DurableSource, *, health_timeout: float = 30.0,
                                   create_consumer: bool = True) -> dict[str, Any]:
    """Make ``spec.stream`` durably source (or mirror) ``spec.source``; idempotent.

    Creates the stream if missing (with only this source), keeps its other sources, migrates a
    plain source of the same origin to ``user`` mode, then waits until the server reports the
    source healthy. Returns a JSON-able description: ``stream``, ``source``, ``mode``, ``mirror``,
    ``action`` (created/updated/unchanged/migrated), ``consumer``, ``deliver_subject``, ``domain``, ``num_replicas``,
    ``source_state`` (lag, active, ...), ``consumer_state`` and ``migrated_after_seq``.
    """
    spec = spec.validated()
    server_features.require(conn, server_features.DURABLE_SOURCING)
    origin_conn = api_view(conn, api_prefix=spec.external_api)
    try:
        origin = await stream_info(origin_conn, spec.source)
    except StreamNotFoundError:
        raise StreamNotFoundError(f"origin stream {spec.source!r} does not exist{spec.where}; create it first",
                                  reason="stream_not_found") from None
    retention = origin["config"].get("retention", "limits")
    if not spec.user_managed and retention == "limits":
        raise StreamConfigError(
            f"origin {spec.source!r} is a Limits stream: for it the server still sources through an ephemeral "
            "consumer, so mode='server' would not be durable. Use mode='user' (a durable consumer created on the "
            "origin), or plain sourcing if the origin keeps its messages anyway",
            reason="origin_not_durable_capable",
        )
    if spec.user_managed and retention == "workqueue" and spec.deliver_policy != "all":
        raise ConsumerConfigError(
            f"origin {spec.source!r} is a WorkQueue stream, whose consumers must deliver all: drop "
            "start_seq/start_time/deliver_policy (a WorkQueue only holds messages nobody consumed yet)",
            reason="workqueue_needs_deliver_all",
        )
    target = await find_stream(conn, spec.stream)
    _check_against_streams(spec, target, origin)
    await _check_shared_origin(origin_conn, spec, retention, target)
    replicas_changed = False
    replication = replication_config(spec.num_replicas, spec.placement)
    if target is not None and replication:
        updated = await ensure_stream(conn, {"name": spec.stream, **replication})
        replicas_changed, target = updated["action"] == "updated", updated["info"]
    current = _find_entry(target["config"], spec) if target else None
    if current is None and target is not None and spec.mirror:
        raise StreamConfigError(
            f"stream {spec.stream!r} mirrors {target['config']['mirror'].get('name')!r}"
            " and a mirror cannot be changed; create a new mirror stream", reason="immutable_field")
    wanted = spec.source_entry()
    result: dict[str, Any] = {"migrated_after_seq": None}
    if spec.user_managed:
        if current is not None and not current.get("consumer"):
            if spec.mirror:
                raise StreamConfigError(
                    f"stream {spec.stream!r} mirrors {spec.source!r} without a durable consumer and a mirror "
                    "cannot be changed; create a new mirror stream in mode='user' and move readers to it",
                    reason="immutable_field")
            if spec.start_seq is not None or spec.start_time is not None or spec.deliver_policy != "all":
                raise InvalidRequestError(
                    "migrating an existing source picks the start itself (just after what the stream already "
                    "holds): leave start_seq, start_time and deliver_policy unset", reason="invalid_start")
            if not create_consumer:
                raise InvalidRequestError("migration creates the durable consumer: set create_consumer=True",
                                          reason="invalid_source")
            result.update(await _migrate(conn, origin_conn, spec, target or {}, current, origin))
            action = "migrated"
        else:
            if current is not None and (current.get("consumer") or {}).get("name") != spec.consumer:
                raise StreamConfigError(
                    f"stream {spec.stream!r} already sources {spec.source!r} through consumer "
                    f"{current['consumer'].get('name')!r}; pass consumer={current['consumer'].get('name')!r} or remove "
                    "that source first", reason="duplicate_source_consumer")
            consumer_action = "unchanged"
            if create_consumer:
                consumer_action = (await ensure_consumer(origin_conn, spec.source, spec.consumer_config()))["action"]
            else:
                info = await find_consumer(origin_conn, spec.source, spec.consumer or "")
                if info is None:
                    raise ConsumerNotFoundError(
                        f"consumer {spec.consumer!r} does not exist on {spec.source!r}{spec.where}; create it or "
                        "set create_consumer=True", reason="source_consumer_missing")
                _check_flow_control_consumer(info, spec)
                spec = replace(spec, deliver_subject=info["config"]["deliver_subject"])
                wanted = spec.source_entry()
            action = await _apply_entry(conn, spec, target, current, wanted)
            if action == "unchanged" and consumer_action != "unchanged":
                action = "updated"
    else:
        if current is not None and current.get("consumer"):
            raise StreamConfigError(
                f"stream {spec.stream!r} sources {spec.source!r} through the user-managed consumer "
                f"{current['consumer'].get('name')!r}; switching to mode='server' would deliver messages twice. "
                "Keep mode='user'", reason="invalid_source")
        action = await _apply_entry(conn, spec, target, current, wanted)
    if action == "unchanged" and replicas_changed:
        action = "updated"
    started = time.monotonic()
    state = await wait_source_healthy(conn, spec, timeout=health_timeout, origin_conn=origin_conn)
    if spec.user_managed:
        name = spec.consumer or ""
    else:
        name = (await server_managed_consumer(origin_conn, spec, timeout=health_timeout))["name"]
    consumer = await wait_messages_flow(origin_conn, spec.source, name,
                                        timeout=max(health_timeout - (time.monotonic() - started), 1.0))
    metrics.incr("sourcing.provisioned", tags={"mode": spec.mode, "action": action})
    cfg = consumer["config"]
    return {
        **{k: v for k, v in asdict(spec).items() if k in _RESULT_FIELDS},
        "filter_subjects": list(spec.filter_subjects),
        "action": action,
        "consumer": consumer["name"],
        "deliver_subject": cfg.get("deliver_subject"),
        "retention": retention,
        "num_replicas": (await stream_info(conn, spec.stream))["config"].get("num_replicas", 1),
        "source_state": {k: state.get(k) for k in ("lag", "active", "seq", "error") if k in state},
        "consumer_state": {k: consumer.get(k) for k in ("num_pending", "num_ack_pending", "delivered", "ack_floor",
                                                        "paused")},
        **result,
    }


async def _apply_entry(conn: JetStreamConnection, spec: DurableSource, target: dict[str, Any] | None,
                       current: dict[str, Any] | None, wanted: dict[str, Any]) -> str:
    if target is None:
        await _update_entries(conn, spec, None, wanted)
        return "created"
    if current is not None and _same_entry(wanted, current):
        return "unchanged"
    if spec.mirror:
        raise StreamConfigError(
            f"stream {spec.stream!r} already mirrors {spec.source!r} with another configuration and a mirror "
            "cannot be changed; create a new mirror stream", reason="immutable_field")
    await _update_entries(conn, spec, target, wanted)
    return "updated"


async def wait_messages_flow(origin_conn: JetStreamConnection, stream: str, consumer: str, *,
                             timeout: float) -> dict[str, Any]:
    """Consumer info once messages flow: nothing pending, or delivery moved on (or it is paused)."""
    info = await find_consumer(origin_conn, stream, consumer)
    if info is None:
        raise ConsumerNotFoundError(f"consumer {consumer!r} vanished from {stream!r}", reason="source_consumer_missing")
    first = int(info["delivered"].get("stream_seq", 0))
    deadline = time.monotonic() + timeout
    while int(info.get("num_pending", 0)) > 0 and not info.get("paused"):
        if int(info["delivered"].get("stream_seq", 0)) > first:
            return info
        if time.monotonic() >= deadline:
            raise SourceUnhealthyError(
                f"consumer {consumer!r} on {stream!r} has {info['num_pending']} messages pending but delivered "
                f"nothing within {timeout}s; check the consumer (max_ack_pending, rate limit) and the connection",
                reason="messages_not_flowing")
        await asyncio.sleep(_POLL_SECONDS)
        info = await find_consumer(origin_conn, stream, consumer) or info
    return info


async def source_status(conn: JetStreamConnection, stream: str, source: str, *,
                        domain: str | None = None, api_prefix: str | None = None) -> dict[str, Any]:
    """Whether ``stream`` has caught up with its source (or mirror) ``source``.

    ``caught_up`` means: no source ``error``, ``active >= 0``, ``lag`` 0 and, when the durable
    consumer on the origin is known, nothing pending on it and nothing in flight (``num_ack_pending``
    0: every delivered message confirmed stored by ``stream``, so a WorkQueue origin has let it go).
    ``error`` is the source's error as a typed
    error dict (``reason``, ``message``, ``err_code``) or None.
    """
    spec = DurableSource(stream=stream, source=source, domain=domain, api_prefix=api_prefix)
    info = await stream_info(conn, stream)
    mirror = info.get("mirror")
    spec = replace(spec, mirror=bool(mirror and spec.is_same_origin(mirror)))
    entry = _find_entry(info, spec)
    where = f"stream {stream!r}"
    if entry is None:
        raise StreamConfigError(f"{where} does not source or mirror {source!r}"
                                + spec.where, reason="source_missing")
    config_entry = _find_entry(info["config"], spec) or {}
    origin_conn = api_view(conn, api_prefix=spec.external_api)
    consumer_name = (config_entry.get("consumer") or {}).get("name")
    consumer: dict[str, Any] | None = None
    if consumer_name:
        consumer = await find_consumer(origin_conn, source, consumer_name)
    else:
        spec = replace(spec, filter_subjects=_entry_filters(config_entry))
        try:
            consumer = await server_managed_consumer(origin_conn, spec, timeout=0)
        except SourceUnhealthyError:
            consumer = None
    active = int(entry.get("active", -1))
    lag = int(entry.get("lag", 0))
    pending = int(consumer.get("num_pending", 0)) if consumer else None
    in_flight = int(consumer.get("num_ack_pending", 0)) if consumer else None
    error = error_from_api(entry["error"], context=f"source {source!r} of {where}").to_dict() if entry.get("error") \
        else None
    metrics.gauge("sourcing.lag", lag + (pending or 0), tags={"stream": stream, "source": source})
    return {
        "stream": stream,
        "source": source,
        "domain": domain,
        "mirror": spec.mirror,
        "lag": lag,
        "active": active,
        "error": error,
        "consumer": consumer["name"] if consumer else consumer_name,
        "consumer_num_pending": pending,
        "consumer_num_ack_pending": in_flight,
        "caught_up": not error and active >= 0 and lag == 0 and not pending and not in_flight,
    }
