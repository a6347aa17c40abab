"""What a durable source is and how it is doing: :class:`DurableSource` (validated locally, nothing sent), its
consumer config and source entry; waits until the server shows it healthy, finds the server-managed consumer and
waits until messages flow (provisioning); :func:`source_status`, what the caught-up sensor and trigger poll;
:func:`source_progress`, the caught-up rule the JetStream view applies too."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from airflow_jetstream.client import metrics
from airflow_jetstream.client.admin.consumers import (
    config_filters,
    consumer_filters,
    filter_config,
    find_consumer,
    list_consumers,
    normalize_consumer_config,
)
from airflow_jetstream.client.admin.streams import (
    api_view,
    check_replicas,
    domain_api_prefix,
    normalize_placement,
    stream_info,
)
from airflow_jetstream.client.durations import to_rfc3339
from airflow_jetstream.client.errors import (
    ConsumerConfigError,
    ConsumerNotFoundError,
    InvalidRequestError,
    JetStreamError,
    StreamConfigError,
    error_from_api,
)
from airflow_jetstream.client.subjects import subjects_overlap, validate_name, validate_subject

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection

SERVER_MANAGED = "server"
USER_MANAGED = "user"
MODES = (SERVER_MANAGED, USER_MANAGED)
#: What the server requires of a consumer used for durable sourcing.
FLOW_CONTROL_CONSUMER = {
    "ack_policy": "flow_control",
    "flow_control": True,
    "idle_heartbeat": "1s",
    "max_deliver": -1,
}
DEFAULT_MAX_ACK_PENDING = 1000
#: Metadata naming the stream fed by the consumer the server makes on the origin (server-managed source or mirror).
SOURCE_OWNER, MIRROR_OWNER = "_nats.src.stream", "_nats.mirror.stream"

#: How error messages name a user-managed durable source, in the client's and the operator's terms.
USER_MANAGED_HINT = "a user-managed source (mode='user'; user_managed={...} on JetStreamDurableSourceOperator)"


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
    num_replicas: int | str | None = None  # a rendered template is a string: validated() makes it an int
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
                    f"{', '.join(given)} only apply to {USER_MANAGED_HINT} (the server picks its own consumer "
                    "in mode='server'); use one to control the consumer", reason="invalid_source")
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
        if self.deliver_policy == "last_per_subject" and not self.filter_subjects:
            raise ConsumerConfigError("deliver_policy last_per_subject needs filter_subjects (the server refuses it "
                                      "without a filter; use '>' for every subject)", reason="invalid_field")
        # a start implies its policy; a start with another policy is refused by the consumer's own rules below
        policy = self.deliver_policy or ("by_start_sequence" if self.start_seq is not None else
                                         "by_start_time" if self.start_time is not None else "all")
        pending = DEFAULT_MAX_ACK_PENDING if self.max_ack_pending is None else self.max_ack_pending
        if isinstance(pending, bool) or not isinstance(pending, int) or pending < 1:
            raise ConsumerConfigError(
                f"max_ack_pending must be > 0 for a flow-control consumer, got {pending!r}",
                reason="max_ack_pending_required",
            )
        spec = replace(self, consumer=consumer, deliver_subject=deliver, deliver_policy=policy,
                       max_ack_pending=pending)
        normalize_consumer_config(spec.consumer_config())  # the consumer's own rules: policies, a start for by_start_*
        return spec

    def consumer_config(self) -> dict[str, Any]:
        """The durable push consumer (``user`` mode) the server accepts for sourcing; fields left unset are None,
        which :func:`~airflow_jetstream.client.admin.consumers.normalize_consumer_config` leaves out."""
        return {"name": self.consumer, "deliver_subject": self.deliver_subject, "deliver_policy": self.deliver_policy,
                "max_ack_pending": self.max_ack_pending, "replay_policy": self.replay_policy or None,
                "opt_start_seq": self.start_seq, "opt_start_time": self.start_time, **FLOW_CONTROL_CONSUMER,
                **filter_config(self.filter_subjects)}

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


def entry_filters(entry: dict[str, Any]) -> tuple[str, ...]:
    if entry.get("filter_subject"):
        return (entry["filter_subject"],)
    return tuple(t["src"] for t in entry.get("subject_transforms") or [] if t.get("src"))


def find_entry(info: dict[str, Any], spec: DurableSource) -> dict[str, Any] | None:
    """The source state (``lag``, ``active``, ``error``, ...) of this origin in A's stream info."""
    entries = [info.get("mirror")] if spec.mirror else info.get("sources") or []
    return next((entry for entry in entries if entry and spec.is_same_origin(entry)), None)


_POLL_SECONDS = 0.1


class SourceUnhealthyError(JetStreamError, reason="source_unhealthy"):
    """A source or mirror did not become healthy (no error, ``active >= 0``) within the deadline."""


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
        state = find_entry(info, spec)
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
            f"server only shows active -1). Create it ({USER_MANAGED_HINT} with create_consumer=True does) or "
            "fix the consumer name / domain", reason="source_consumer_missing")
    raise SourceUnhealthyError(
        f"{where} did not become active within {timeout}s (active -1, no error): check that the origin "
        f"stream{spec.where} is reachable (leaf node connected, domain right) and the consumer is not paused",
    )


async def server_managed_consumer(origin_conn: JetStreamConnection, spec: DurableSource,
                                  timeout: float = 10.0) -> dict[str, Any]:
    """The ``JS_SRC_``/``JS_MIRROR_`` consumer the server made on the origin for stream A."""
    deadline = time.monotonic() + timeout
    prefix = "JS_MIRROR_" if spec.mirror else "JS_SRC_"
    owner_key = MIRROR_OWNER if spec.mirror else SOURCE_OWNER
    while True:
        for info in await list_consumers(origin_conn, spec.source):
            cfg = info["config"]
            meta = cfg.get("metadata") or {}
            ours = meta.get(owner_key) == spec.stream and cfg.get("sourcing")
            if not (ours and info["name"].startswith(prefix)):
                continue
            if consumer_filters(info) == sorted(spec.filter_subjects):
                return info
        if time.monotonic() >= deadline:
            raise SourceUnhealthyError(
                f"the server made no durable {prefix}* consumer on {spec.source!r} for stream {spec.stream!r} "
                f"within {timeout}s: the origin may not be a WorkQueue/Interest stream, or the server is older "
                f"than 2.14; use {USER_MANAGED_HINT}", reason="server_consumer_missing")
        await asyncio.sleep(_POLL_SECONDS)


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
    ``error`` is the source's error as a typed error dict (``reason``, ``message``, ``err_code``) or None.
    ``origin_left_behind``: once caught up, how many messages a WorkQueue origin still holds for the
    consumer that it will not deliver again (:func:`left_behind`); None before that or for other origins.
    """
    spec = DurableSource(stream=stream, source=source, domain=domain, api_prefix=api_prefix)
    info = await stream_info(conn, stream)
    spec = replace(spec, mirror=bool(info.get("mirror") and spec.is_same_origin(info["mirror"])))
    entry = find_entry(info, spec)
    if entry is None:
        raise StreamConfigError(f"stream {stream!r} does not source or mirror {source!r}{spec.where}",
                                reason="source_missing")
    config_entry = find_entry(info["config"], spec) or {}
    origin_conn = api_view(conn, api_prefix=spec.external_api)
    consumer_name = (config_entry.get("consumer") or {}).get("name")
    consumer: dict[str, Any] | None = None
    if consumer_name:
        consumer = await find_consumer(origin_conn, source, consumer_name)
    else:
        spec = replace(spec, filter_subjects=entry_filters(config_entry))
        try:
            consumer = await server_managed_consumer(origin_conn, spec, timeout=0)
        except SourceUnhealthyError:
            consumer = None
    progress = source_progress(entry, consumer, context=f"source {source!r} of stream {stream!r}")
    metrics.gauge("sourcing.lag", progress["lag"] + (progress["consumer_num_pending"] or 0),
                  tags={"stream": stream, "source": source})
    caught_up = progress["caught_up"]
    return {"stream": stream, "source": source, "domain": domain, "mirror": spec.mirror, **progress,
            "consumer": consumer["name"] if consumer else consumer_name,
            "origin_left_behind": await left_behind(origin_conn, source, consumer) if caught_up and consumer else None}


def source_progress(entry: Mapping[str, Any], consumer: Mapping[str, Any] | None, *, context: str) -> dict[str, Any]:
    """How far one source or mirror entry of a stream info is, with the durable consumer on its origin when known:
    ``lag``, ``active``, ``error`` (typed, or None), what is pending and in flight on the consumer, and
    ``caught_up``. The one rule :func:`source_status` (the caught-up sensor and trigger) and the JetStream view's
    sources apply."""
    active = int(entry.get("active", -1))
    lag = int(entry.get("lag") or 0)
    error = error_from_api(entry["error"], context=context).to_dict() if entry.get("error") else None
    pending = int(consumer.get("num_pending", 0)) if consumer else None
    in_flight = int(consumer.get("num_ack_pending", 0)) if consumer else None
    return {"lag": lag, "active": active, "error": error, "consumer_num_pending": pending,
            "consumer_num_ack_pending": in_flight,
            "caught_up": not error and active >= 0 and lag == 0 and not pending and not in_flight}


async def left_behind(origin_conn: JetStreamConnection, source: str, consumer: dict[str, Any]) -> int | None:
    """How many messages WorkQueue stream ``source`` holds on ``consumer``'s subjects; None for other retention.

    Meant for a caught-up consumer (nothing pending, nothing in flight): it will not deliver those again, and
    nothing else removes them. A forward reset leaves such messages; so can an acknowledgement during a restart
    of the origin's server (nats-server 2.15.1, docs/sourcing.md "Messages left in a WorkQueue origin").
    """
    info = await stream_info(origin_conn, source)
    if info["config"].get("retention") != "workqueue":
        return None
    if not int(info["state"].get("messages", 0)):
        return 0
    filters = config_filters(consumer.get("config") or {})
    if not filters:
        return int(info["state"]["messages"])
    held = 0
    for subject in filters:  # a WorkQueue consumer's filters do not overlap
        reply = await origin_conn.api_request(f"STREAM.INFO.{source}", {"subjects_filter": subject},
                                              context=f"stream {source!r}")
        held += sum((reply["state"].get("subjects") or {}).values())
    return held
