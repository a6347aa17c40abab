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

import time
from dataclasses import asdict, replace
from typing import Any

from airflow_jetstream.client import metrics, server_features
from airflow_jetstream.client.admin.consumers import (
    config_filters,
    delete_consumer,
    ensure_consumer,
    filter_config,
    find_consumer,
    list_consumers,
)
from airflow_jetstream.client.admin.streams import (
    api_view,
    default_replicas,
    ensure_stream,
    find_stream,
    replication_config,
    stream_info,
)
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import (
    ConsumerConfigError,
    ConsumerNotFoundError,
    InvalidRequestError,
    StreamConfigError,
    StreamNotFoundError,
)
from airflow_jetstream.client.reading.stored import get_message
from airflow_jetstream.client.sourcing.spec import (
    MIRROR_OWNER,
    SOURCE_OWNER,
    USER_MANAGED_HINT,
    DurableSource,
    SourceUnhealthyError,
    entry_filters,
    find_entry,
    server_managed_consumer,
    wait_messages_flow,
    wait_source_healthy,
)
from airflow_jetstream.client.subjects import is_fence_subject, subjects_overlap

#: Header the server puts on every sourced message.
SOURCE_HEADER = "Nats-Stream-Source"
_RESULT_FIELDS = ("stream", "source", "mode", "mirror", "domain", "api_prefix")


def _same_entry(wanted: dict[str, Any], current: dict[str, Any]) -> bool:
    def essence(entry: dict[str, Any]) -> tuple[Any, ...]:
        return (*(entry.get(k) or None for k in ("name", "consumer", "opt_start_seq", "opt_start_time")),
                (entry.get("external") or {}).get("api"), sorted(entry_filters(entry)))

    return essence(wanted) == essence(current)


def _check_flow_control_consumer(info: dict[str, Any], spec: DurableSource) -> None:
    """Refuse an existing consumer the server would reject for sourcing (10217-10222), naming the fix."""
    cfg = info["config"]
    where = f"consumer {spec.consumer!r} on {spec.source!r}"
    problems = [problem for bad, problem in (
        (cfg.get("ack_policy") != "flow_control", f"ack_policy is {cfg.get('ack_policy')!r}, needs 'flow_control'"),
        (not cfg.get("deliver_subject"), "it is a pull consumer, needs a deliver subject (push)"),
        (not cfg.get("flow_control"), "flow_control is off"),
        (cfg.get("max_deliver", -1) != -1, f"max_deliver is {cfg.get('max_deliver')}, needs -1"),
        (cfg.get("backoff"), "backoff is set"),
    ) if bad]
    if problems:
        raise ConsumerConfigError(
            f"{where} cannot be used for durable sourcing: {'; '.join(problems)}. Let the operator create it "
            "(create_consumer=True) or recreate it as a flow-control push consumer", reason="consumer_not_flow_control")
    if spec.deliver_subject and cfg["deliver_subject"] != spec.deliver_subject:
        raise ConsumerConfigError(
            f"{where} delivers to {cfg['deliver_subject']!r}, not {spec.deliver_subject!r}; "
            "leave deliver_subject unset to use the consumer's own", reason="invalid_source_consumer")


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
    owner = meta.get(MIRROR_OWNER) or meta.get(SOURCE_OWNER)
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
    own = {name for e in entries if spec.is_same_origin(e) and (name := (e.get("consumer") or {}).get("name"))}
    ours = spec.filter_subjects or (">",)
    for info in await list_consumers(origin_conn, spec.source):
        feeding = _feeds_other_stream(info, spec, own)
        theirs = config_filters(info["config"]) or [">"]
        if feeding and any(subjects_overlap(a, b) for a in ours for b in theirs):
            raise StreamConfigError(
                f"origin {spec.source!r}{spec.where} is a {retention} stream already sourced by the {feeding}: a "
                f"second durable source would copy each message into both streams. Source the existing aggregate "
                f"instead, delete that source first, or pass allow_shared_origin=True if every message belongs "
                f"in both", reason="origin_already_sourced")


#: The duplicate window of an aggregate the provider creates: the server's default for streams without
#: sources. Without it a re-send the origin stored again (its dedupe state lost, see docs/sourcing.md) is
#: copied into the aggregate twice; with it the aggregate drops the copy (the msg id travels with it).
AGGREGATE_DUPLICATE_WINDOW = 120  # seconds


async def _update_entries(conn: JetStreamConnection, spec: DurableSource, target: dict[str, Any] | None,
                          entry: dict[str, Any] | None) -> None:
    """Create A or put ``entry`` in place of A's entry for this origin (None removes it); others stay."""
    if target is None:
        config = {"name": spec.stream, **replication_config(spec.num_replicas, spec.placement)}
        if spec.mirror:
            config["mirror"] = entry
        else:  # the server gives a stream with sources no duplicate window (a mirror cannot have one)
            config.update(sources=[entry], duplicate_window=AGGREGATE_DUPLICATE_WINDOW)
        await ensure_stream(conn, config, create_defaults={"num_replicas": default_replicas(conn)})
        return
    kept = [e for e in target["config"].get("sources") or [] if not spec.is_same_origin(e)]
    await ensure_stream(conn, {"name": spec.stream, "sources": kept if entry is None else [*kept, entry]})


async def last_sourced_seq(conn: JetStreamConnection, stream: str, origin: str, *, max_scan: int = 1_000_000) -> int:
    """The origin sequence of the newest message in ``stream`` that came from ``origin`` (0 if none).

    Reads the ``Nats-Stream-Source`` header (``<origin>[:<suffix>] <origin seq> ...``) backwards from the stream's
    last message.
    """
    state = (await stream_info(conn, stream))["state"]
    last = int(state.get("last_seq", 0))
    for seq in range(last, max(int(state.get("first_seq", 0)), 1) - 1, -1):
        if last - seq >= max_scan:
            raise SourceUnhealthyError(
                f"no message from {origin!r} among the last {max_scan} of stream {stream!r}; cannot find where "
                "sourcing stopped", reason="migration_scan_limit")
        message = await get_message(conn, stream, seq=seq)
        parts = (message.headers.get(SOURCE_HEADER) or "").split() if message else []
        if len(parts) >= 2 and (parts[0] == origin or parts[0].startswith(origin + ":")):
            return int(parts[1])
    return 0


async def _migrate(conn: JetStreamConnection, origin_conn: JetStreamConnection, spec: DurableSource,
                   target: dict[str, Any], old: dict[str, Any], origin: dict[str, Any]) -> int:
    """Replace a plain source of O by a user-managed durable one, without loss or duplicates; returns the origin
    sequence A held up to (0: none).

    WorkQueue origin (its consumers must deliver all): the old source goes first (its consumer is
    deleted, unacked messages stay in O), then what A already holds is purged from O, and the
    durable consumer is created and the source added. Other origins: the old source goes, the
    durable consumer starts right after A's last message from O. On an Interest origin a plain
    pull consumer holds the interest meanwhile (so nothing published during the switch is dropped)
    and is deleted at the end.
    """
    retention = origin["config"].get("retention")
    if not spec.filter_subjects and entry_filters(old):
        spec = replace(spec, filter_subjects=entry_filters(old))
    consumer_cfg = spec.consumer_config()
    holder = f"{spec.consumer}_MIGRATING"
    if retention == "interest":
        await ensure_consumer(origin_conn, spec.source,
                              {"name": holder, "ack_policy": "explicit", **filter_config(spec.filter_subjects)})
    await _update_entries(conn, spec, target, None)
    last = await last_sourced_seq(conn, spec.stream, spec.source)
    if retention == "workqueue":
        if last:  # its consumer must deliver all: what A already holds leaves O first
            for subject in spec.filter_subjects or (None,):
                body: dict[str, Any] = {"seq": last + 1, **({"filter": subject} if subject else {})}
                await origin_conn.api_request(f"STREAM.PURGE.{spec.source}", body,
                                              context=f"purge what {spec.stream!r} already holds from {spec.source!r}")
    elif last:
        consumer_cfg.update(deliver_policy="by_start_sequence", opt_start_seq=last + 1)
    elif old.get("opt_start_seq"):
        consumer_cfg.update(deliver_policy="by_start_sequence", opt_start_seq=old["opt_start_seq"])
    elif old.get("opt_start_time"):
        consumer_cfg.update(deliver_policy="by_start_time", opt_start_time=old["opt_start_time"])
    await ensure_consumer(origin_conn, spec.source, consumer_cfg)
    await _update_entries(conn, spec, target, spec.source_entry())
    if retention != "workqueue":
        await delete_consumer(origin_conn, spec.source, holder)
    return last


def _without_fences(spec: DurableSource, origin_config: dict[str, Any]) -> DurableSource:
    """``spec`` filtered to the origin's own subjects when it names none and the origin keeps write fences: the
    fences stay in the origin (a WorkQueue origin would otherwise hand them to the source and lose them) and the
    aggregate holds only data (:mod:`~airflow_jetstream.client.batches.atomic`)."""
    subjects = origin_config.get("subjects") or []
    own = tuple(s for s in subjects if not is_fence_subject(s))
    if spec.filter_subjects or len(own) == len(subjects) or not own:
        return spec
    return replace(spec, filter_subjects=own)


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
    spec = _without_fences(spec, origin["config"])
    retention = origin["config"].get("retention", "limits")
    if not spec.user_managed and retention == "limits":
        raise StreamConfigError(
            f"origin {spec.source!r} is a Limits stream: for it the server still sources through an ephemeral "
            "consumer, so mode='server' would not be durable. Use mode='user' (a durable consumer created on the "
            "origin; user_managed={...} on JetStreamDurableSourceOperator), or plain sourcing if the origin keeps "
            "its messages anyway", reason="origin_not_durable_capable")
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
    current = find_entry(target["config"], spec) if target else None
    if current is None and target is not None and spec.mirror:
        raise StreamConfigError(
            f"stream {spec.stream!r} mirrors {target['config']['mirror'].get('name')!r}"
            " and a mirror cannot be changed; create a new mirror stream", reason="immutable_field")
    migrated_after: int | None = None
    if spec.user_managed:
        if current is not None and not current.get("consumer"):
            if spec.mirror:
                raise StreamConfigError(
                    f"stream {spec.stream!r} mirrors {spec.source!r} without a durable consumer and a mirror "
                    f"cannot be changed; create a new mirror stream as {USER_MANAGED_HINT} and move readers to it",
                    reason="immutable_field")
            if spec.start_seq is not None or spec.start_time is not None or spec.deliver_policy != "all":
                raise InvalidRequestError(
                    "migrating an existing source picks the start itself (just after what the stream already "
                    "holds): leave start_seq, start_time and deliver_policy unset", reason="invalid_start")
            if not create_consumer:
                raise InvalidRequestError("migration creates the durable consumer: set create_consumer=True",
                                          reason="invalid_source")
            migrated_after = await _migrate(conn, origin_conn, spec, target or {}, current, origin)
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
            action = await _apply_entry(conn, spec, target, current)
            if action == "unchanged" and consumer_action != "unchanged":
                action = "updated"
    else:
        if current is not None and current.get("consumer"):
            raise StreamConfigError(
                f"stream {spec.stream!r} sources {spec.source!r} through the user-managed consumer "
                f"{current['consumer'].get('name')!r}; switching to a server-managed source (mode='server'; no "
                "user_managed on the operator) would deliver messages twice. Keep it user-managed",
                reason="invalid_source")
        action = await _apply_entry(conn, spec, target, current)
    if action == "unchanged" and replicas_changed:
        action = "updated"
    deadline = time.monotonic() + health_timeout  # one budget for the three waits
    state = await wait_source_healthy(conn, spec, timeout=health_timeout, origin_conn=origin_conn)
    if spec.user_managed:
        name = spec.consumer or ""
    else:
        name = (await server_managed_consumer(origin_conn, spec, timeout=max(deadline - time.monotonic(), 1.0)))["name"]
    consumer = await wait_messages_flow(origin_conn, spec.source, name, timeout=max(deadline - time.monotonic(), 1.0))
    metrics.incr("sourcing.provisioned", tags={"mode": spec.mode, "action": action})
    cfg = consumer["config"]
    return {
        **{k: v for k, v in asdict(spec).items() if k in _RESULT_FIELDS}, "filter_subjects": list(spec.filter_subjects),
        "action": action, "consumer": consumer["name"], "deliver_subject": cfg.get("deliver_subject"),
        "retention": retention, "num_replicas": (await stream_info(conn, spec.stream))["config"].get("num_replicas", 1),
        "source_state": {k: state.get(k) for k in ("lag", "active", "seq", "error") if k in state},
        "consumer_state": {k: consumer.get(k) for k in ("num_pending", "num_ack_pending", "delivered", "ack_floor",
                                                        "paused")},
        "migrated_after_seq": migrated_after,
    }


async def _apply_entry(conn: JetStreamConnection, spec: DurableSource, target: dict[str, Any] | None,
                       current: dict[str, Any] | None) -> str:
    wanted = spec.source_entry()
    if current is not None and _same_entry(wanted, current):  # an entry is only found in an existing stream
        return "unchanged"
    if target is not None and spec.mirror:
        raise StreamConfigError(
            f"stream {spec.stream!r} already mirrors {spec.source!r} with another configuration and a mirror "
            "cannot be changed; create a new mirror stream", reason="immutable_field")
    await _update_entries(conn, spec, target, wanted)
    return "created" if target is None else "updated"

