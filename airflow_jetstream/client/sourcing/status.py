"""Whether a durable source works and how far it is: wait until the server shows it healthy, find the
server-managed consumer, wait until messages flow (provisioning); :func:`source_status`, what the caught-up sensor
and trigger poll; :func:`source_progress`, the caught-up rule the JetStream view applies too."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from airflow_jetstream.client import metrics
from airflow_jetstream.client.admin.consumers import config_filters, consumer_filters, find_consumer, list_consumers
from airflow_jetstream.client.admin.streams import api_view, stream_info
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import ConsumerNotFoundError, JetStreamError, StreamConfigError, error_from_api
from airflow_jetstream.client.sourcing.spec import (
    MIRROR_OWNER,
    SOURCE_OWNER,
    USER_MANAGED_HINT,
    DurableSource,
    entry_filters,
    find_entry,
)

_POLL_SECONDS = 0.1


class SourceUnhealthyError(JetStreamError):
    """A source or mirror did not become healthy (no error, ``active >= 0``) within the deadline."""

    default_reason = "source_unhealthy"


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
            "fix the consumer name / domain",
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
                f"than 2.14; use {USER_MANAGED_HINT}",
                reason="server_consumer_missing",
            )
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
    ``error`` is the source's error as a typed
    error dict (``reason``, ``message``, ``err_code``) or None.
    ``origin_left_behind``: once caught up, how many messages a WorkQueue origin still holds for the
    consumer that it will not deliver again (:func:`left_behind`); None before that or for other origins.
    """
    spec = DurableSource(stream=stream, source=source, domain=domain, api_prefix=api_prefix)
    info = await stream_info(conn, stream)
    mirror = info.get("mirror")
    spec = replace(spec, mirror=bool(mirror and spec.is_same_origin(mirror)))
    entry = find_entry(info, spec)
    where = f"stream {stream!r}"
    if entry is None:
        raise StreamConfigError(f"{where} does not source or mirror {source!r}"
                                + spec.where, reason="source_missing")
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
    progress = source_progress(entry, consumer, context=f"source {source!r} of {where}")
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
