"""How far a source or mirror is: :func:`source_status` (what the caught-up sensor and trigger poll)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from airflow_jetstream.client import metrics
from airflow_jetstream.client.admin.consumers import config_filters, find_consumer
from airflow_jetstream.client.admin.domains import api_view
from airflow_jetstream.client.admin.streams import stream_info
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import StreamConfigError, error_from_api
from airflow_jetstream.client.sourcing.health import SourceUnhealthyError, server_managed_consumer
from airflow_jetstream.client.sourcing.spec import DurableSource, entry_filters, find_entry


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
