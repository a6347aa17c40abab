"""Whether a durable source works: wait until the server shows it healthy, find the server-managed
consumer, wait until messages flow."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from airflow_jetstream.client.admin.consumers import consumer_filters, find_consumer, list_consumers
from airflow_jetstream.client.admin.domains import api_view
from airflow_jetstream.client.admin.streams import stream_info
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import ConsumerNotFoundError, JetStreamError, StreamConfigError, error_from_api
from airflow_jetstream.client.sourcing.spec import (
    MIRROR_OWNER,
    SOURCE_OWNER,
    USER_MANAGED_HINT,
    DurableSource,
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
