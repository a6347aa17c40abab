"""Consumer administration: config checks, info, listing, status, idempotent create-or-update, delete, pause, and
reset (nats-server 2.14+: back to the ack floor, or to a stream sequence or time, for replays).

Every function takes a :class:`JetStreamConnection` (for a stream in another JetStream domain, a view
of it from :func:`~airflow_jetstream.client.admin.streams.api_view`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_jetstream.client import metrics, server_features
from airflow_jetstream.client.admin.streams import (
    changed_fields,
    check_choices,
    first_seq_at_or_after,
    known_fields,
    list_pages,
    restated,
)
from airflow_jetstream.client.durations import parse_time, to_nanos, to_rfc3339
from airflow_jetstream.client.errors import (
    ConsumerConfigError,
    ConsumerNotFoundError,
    ConsumerResetError,
    InvalidRequestError,
    LeaderUnavailableError,
    ServerAPIError,
)
from airflow_jetstream.client.subjects import validate_name, validate_subject, validate_subjects

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection

log = logging.getLogger(__name__)

#: Consumer configuration fields of the JetStream API (nats-server 2.15), by their JSON names.
CONSUMER_CONFIG_FIELDS = frozenset({
    "name", "durable_name", "description", "deliver_policy", "opt_start_seq", "opt_start_time",
    "ack_policy", "ack_wait", "max_deliver", "backoff", "filter_subject", "filter_subjects",
    "replay_policy", "rate_limit_bps", "sample_freq", "max_waiting", "max_ack_pending",
    "flow_control", "idle_heartbeat", "headers_only", "deliver_subject", "deliver_group",
    "inactive_threshold", "num_replicas", "mem_storage", "metadata", "pause_until",
    "max_batch", "max_expires", "max_bytes", "priority_groups", "priority_policy",
    "priority_timeout",
})
DURATION_FIELDS = ("ack_wait", "idle_heartbeat", "inactive_threshold", "max_expires", "priority_timeout")
#: Fields the server refuses to change on an existing consumer.
IMMUTABLE_FIELDS = ("deliver_policy", "opt_start_seq", "opt_start_time", "ack_policy", "replay_policy",
                    "deliver_group", "mem_storage")
DELIVER_POLICIES = ("all", "last", "new", "by_start_sequence", "by_start_time", "last_per_subject")
ACK_POLICIES = ("none", "all", "explicit", "flow_control")
REPLAY_POLICIES = ("instant", "original")
_DEFAULTS: dict[str, Any] = {"deliver_policy": "all", "ack_policy": "explicit", "replay_policy": "instant"}
#: Deliver policies whose consumers cannot be reset to a given sequence (server error 10204).
NO_SEQ_RESET_POLICIES = ("last", "new", "last_per_subject")
#: The reason of a reset the server refused, by its description.
_RESET_REASONS = (("below start seq", "below_start_seq"), ("below start time", "below_start_time"),
                  ("not allowed", "reset_not_allowed"))


def normalize_consumer_config(config: dict[str, Any]) -> dict[str, Any]:
    """Validate a durable consumer config locally; durations to ns, times to RFC 3339.

    Raises :class:`ConsumerConfigError` before anything is sent.
    """
    given = known_fields(config, "consumer", CONSUMER_CONFIG_FIELDS, ConsumerConfigError)
    cfg = {k: v for k, v in given.items() if v is not None}
    name = cfg.get("durable_name") or cfg.get("name")
    try:
        validate_name(name, what="consumer name")
        for key in DURATION_FIELDS:
            if key in cfg:
                cfg[key] = to_nanos(cfg[key], field=key)
        if "backoff" in cfg:
            cfg["backoff"] = [to_nanos(b, field="backoff") for b in cfg["backoff"]]
        if "opt_start_time" in cfg:
            cfg["opt_start_time"] = to_rfc3339(cfg["opt_start_time"])
        if "filter_subject" in cfg:
            validate_subject(cfg["filter_subject"], allow_wildcards=True, what="filter subject")
        validate_subjects(cfg.get("filter_subjects") or [], what="filter subjects")
        if "deliver_subject" in cfg:
            validate_subject(cfg["deliver_subject"], what="deliver subject")
    except InvalidRequestError as exc:
        raise ConsumerConfigError(exc.message, reason=exc.reason) from None
    cfg["name"] = cfg["durable_name"] = name
    check_choices(cfg, {"deliver_policy": DELIVER_POLICIES, "ack_policy": ACK_POLICIES,
                        "replay_policy": REPLAY_POLICIES}, ConsumerConfigError)
    if "filter_subject" in cfg and cfg.get("filter_subjects"):
        raise ConsumerConfigError("set filter_subject or filter_subjects, not both", reason="invalid_field")
    policy = cfg.get("deliver_policy", "all")
    if policy == "by_start_sequence" and not cfg.get("opt_start_seq"):
        raise ConsumerConfigError("deliver_policy by_start_sequence needs opt_start_seq >= 1", reason="invalid_field")
    if policy == "by_start_time" and not cfg.get("opt_start_time"):
        raise ConsumerConfigError("deliver_policy by_start_time needs opt_start_time", reason="invalid_field")
    if cfg.get("opt_start_seq") and policy != "by_start_sequence":
        raise ConsumerConfigError("opt_start_seq needs deliver_policy by_start_sequence", reason="invalid_field")
    if cfg.get("opt_start_time") and policy != "by_start_time":
        raise ConsumerConfigError("opt_start_time needs deliver_policy by_start_time", reason="invalid_field")
    return cfg


async def consumer_info(conn: JetStreamConnection, stream: str, name: str) -> dict[str, Any]:
    """Consumer info (config, delivered, ack_floor, num_pending, ...).

    Raises :class:`StreamNotFoundError` or :class:`ConsumerNotFoundError` naming both.
    """
    validate_name(stream, what="stream name")
    validate_name(name, what="consumer name")
    return await conn.api_request(f"CONSUMER.INFO.{stream}.{name}", context=f"consumer {name!r} on stream {stream!r}")


async def find_consumer(conn: JetStreamConnection, stream: str, name: str) -> dict[str, Any] | None:
    """Consumer info, or None when the consumer does not exist (the stream must exist)."""
    try:
        return await consumer_info(conn, stream, name)
    except ConsumerNotFoundError:
        return None


async def list_consumers(conn: JetStreamConnection, stream: str) -> list[dict[str, Any]]:
    """Info of every consumer on ``stream`` (follows the API's paging)."""
    validate_name(stream, what="stream name")
    infos, _, _ = await list_pages(conn, f"CONSUMER.LIST.{stream}", "consumers", f"list consumers of stream {stream!r}")
    return infos


def filter_config(subjects: Sequence[str]) -> dict[str, Any]:
    """The config fields that make a consumer (or source) filter on ``subjects``; none for every subject."""
    if len(subjects) == 1:
        return {"filter_subject": subjects[0]}
    return {"filter_subjects": list(subjects)} if subjects else {}


def config_filters(config: dict[str, Any]) -> list[str]:
    """The filter subjects of a consumer config (``filter_subjects`` or the single ``filter_subject``), as given."""
    return list(config.get("filter_subjects") or ([config["filter_subject"]] if config.get("filter_subject") else []))


def consumer_filters(info: dict[str, Any]) -> list[str]:
    """A consumer's filter subjects, sorted."""
    return sorted(config_filters(info.get("config") or {}))


async def consumer_status(conn: JetStreamConnection, stream: str, name: str) -> dict[str, Any]:
    """A consumer's progress; ``drained`` when nothing is pending or awaiting an ack."""
    info = await consumer_info(conn, stream, name)
    pending, ack_pending = int(info.get("num_pending", 0)), int(info.get("num_ack_pending", 0))
    return {"stream": stream, "consumer": name, "num_pending": pending, "num_ack_pending": ack_pending,
            "num_redelivered": int(info.get("num_redelivered", 0)), "delivered": info.get("delivered", {}),
            "ack_floor": info.get("ack_floor", {}), "paused": bool(info.get("paused")),
            "drained": pending == 0 and ack_pending == 0}


async def ensure_consumer(conn: JetStreamConnection, stream: str, config: dict[str, Any]) -> dict[str, Any]:
    """Create the durable consumer, update it where it differs from ``config``, or leave it alone.

    Returns ``{"action": "created" | "updated" | "unchanged", "changed": [...], "info": {...}}``.
    Changing a field the server keeps fixed (deliver policy, start, ack policy, ...) raises
    :class:`ConsumerConfigError` naming the fields, before anything is sent.
    """
    validate_name(stream, what="stream name")
    cfg = normalize_consumer_config(config)
    name = cfg["name"]
    current = await find_consumer(conn, stream, name)
    context = f"consumer {name!r} on stream {stream!r}"
    if current is None:
        info = await conn.api_request(f"CONSUMER.CREATE.{stream}.{name}",
                                      {"stream_name": stream, "config": cfg, "action": "create"},
                                      context=f"create {context}")
        return {"action": "created", "changed": sorted(cfg), "info": info}
    have = current["config"]
    changed = changed_fields(cfg, have, defaults=_DEFAULTS,
                             same={"opt_start_time": lambda a, b: parse_time(a) == parse_time(b)})
    if not changed:
        return {"action": "unchanged", "changed": [], "info": current}
    fixed = [key for key in changed if key in IMMUTABLE_FIELDS]
    if bool(cfg.get("deliver_subject")) != bool(have.get("deliver_subject")):
        fixed.append("deliver_subject (push <-> pull)")
    if fixed:
        raise ConsumerConfigError(
            f"{context} exists with a different {', '.join(fixed)} "
            f"({', '.join(f'{k}={have.get(k.split()[0])!r}' for k in fixed)}), which the server cannot change; "
            "delete the consumer (its delivery state is lost) or use another consumer name", reason="immutable_field")
    merged = {**have, **cfg}
    try:
        info = await conn.api_request(f"CONSUMER.CREATE.{stream}.{name}",
                                      {"stream_name": stream, "config": merged, "action": "update"},
                                      context=f"update {context}")
    except ServerAPIError as exc:
        raise restated(exc, f"{exc.message} (changing {', '.join(changed)})", error=ConsumerConfigError) from None
    return {"action": "updated", "changed": changed, "info": info}


async def delete_consumer(conn: JetStreamConnection, stream: str, name: str) -> bool:
    """Delete a consumer; False when it did not exist."""
    validate_name(stream, what="stream name")
    validate_name(name, what="consumer name")
    try:
        reply = await conn.api_request(f"CONSUMER.DELETE.{stream}.{name}",
                                       context=f"delete consumer {name!r} on stream {stream!r}")
    except ConsumerNotFoundError:
        return False
    return bool(reply.get("success"))


async def pause_consumer(conn: JetStreamConnection, stream: str, name: str,
                         until: datetime | str | None) -> dict[str, Any]:
    """Pause a consumer until ``until`` (None resumes it). Returns the pause response."""
    validate_name(stream, what="stream name")
    validate_name(name, what="consumer name")
    body = {"pause_until": to_rfc3339(until)} if until is not None else None
    return await conn.api_request(f"CONSUMER.PAUSE.{stream}.{name}", body,
                                  context=f"pause consumer {name!r} on stream {stream!r}")


async def reset_consumer(conn: JetStreamConnection, stream: str, name: str, *, seq: int | None = None,
                         time: datetime | str | None = None) -> dict[str, Any]:
    """Reset a consumer's delivery state.

    - neither ``seq`` nor ``time``: back to the ack floor (redeliver what is pending);
    - ``seq``: the next message delivered is the first with stream sequence >= ``seq``;
    - ``time``: same, with the first sequence stored at or after ``time``.

    The consumer is looked up first (the server never answers a reset of an unknown consumer),
    and resets the deliver policy forbids are refused locally with :class:`ConsumerResetError`.
    Returns ``{"stream", "consumer", "reset_seq", "delivered", "ack_floor", "num_pending",
    "num_ack_pending", "requested_seq", "requested_time"}``.
    """
    if seq is not None and time is not None:
        raise InvalidRequestError("give either seq or time for a consumer reset, not both", reason="invalid_reset")
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int)):
        raise InvalidRequestError(f"seq must be a positive stream sequence (int), got {seq!r}", reason="invalid_seq")
    if seq is not None and seq < 1:
        raise InvalidRequestError(f"seq must be >= 1, got {seq}; leave it unset to reset to the ack floor",
                                  reason="invalid_seq")
    requested_time = to_rfc3339(time) if time is not None else None
    server_features.require(conn, server_features.CONSUMER_RESET)
    info = await consumer_info(conn, stream, name)
    config = info["config"]
    policy = config.get("deliver_policy", "all")
    where = f"consumer {name!r} on stream {stream!r}"
    if config.get("ack_policy") == "flow_control" and config.get("deliver_subject") and not info.get("paused"):
        log.warning("%s feeds a durable source and is not paused: after a reset while messages arrive, "
                    "nats-server can drop some from the aggregate; pause it first (docs/sourcing.md, "
                    "'A server defect')", where)
    if (seq is not None or time is not None) and policy in NO_SEQ_RESET_POLICIES:
        raise ConsumerResetError(
            f"{where} has deliver_policy {policy!r}: it can only be reset to its ack floor (no seq/time); "
            "use a consumer with deliver_policy all, by_start_sequence or by_start_time for replays",
            reason="reset_not_allowed",
        )
    if time is not None:
        if policy == "by_start_time" and parse_time(time) < parse_time(config["opt_start_time"]):
            raise ConsumerResetError(
                f"{where} starts at {config['opt_start_time']}: cannot reset to {requested_time}, "
                "which is before its start time", reason="below_start_time")
        seq = await first_seq_at_or_after(conn, stream, time)
    if seq is not None and policy == "by_start_sequence" and seq < int(config.get("opt_start_seq") or 0):
        raise ConsumerResetError(
            f"{where} starts at stream sequence {config['opt_start_seq']}: cannot reset below it (to {seq})",
            reason="below_start_seq",
        )
    try:
        reply = await conn.api_request(f"CONSUMER.RESET.{stream}.{name}",
                                       {"seq": seq} if seq is not None else None,
                                       context=f"reset {where}")
    except ConsumerResetError as exc:
        text = (exc.description or "").lower()
        reason = next((reason for words, reason in _RESET_REASONS if words in text), "invalid_reset")
        raise restated(exc, f"{exc.message} ({where}, deliver_policy {policy!r})", reason=reason) from None
    except LeaderUnavailableError:
        # the server never answers a reset of a missing consumer: one deleted since the lookup
        # would otherwise look like an endless election
        if await find_consumer(conn, stream, name) is None:
            raise ConsumerNotFoundError(f"{where} was deleted during the reset; create it again",
                                        reason="consumer_not_found") from None
        raise
    metrics.incr("consumer.reset", tags={"stream": stream, "consumer": name})
    return {"stream": stream, "consumer": name, "reset_seq": reply.get("reset_seq"),
            "delivered": reply.get("delivered", {}), "ack_floor": reply.get("ack_floor", {}),
            "num_pending": reply.get("num_pending", 0), "num_ack_pending": reply.get("num_ack_pending", 0),
            "requested_seq": seq, "requested_time": requested_time}
