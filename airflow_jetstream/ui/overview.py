"""A read-only look at an account's JetStream: every stream, consumer and source, as rows an operator reads.

Listings are read whole (the server pages them by 256) up to a bound the caller sets; what was left
out is counted (``total``, ``read``), never dropped silently. Sources are built from the stream infos
and joined with the consumers already listed, so they cost no request of their own. Nothing is
created or changed on the server: only ``STREAM.LIST`` and ``CONSUMER.LIST`` requests are sent.
The ledger and advisory sections are in :mod:`.overview_ledger` and :mod:`.overview_advisories`;
what needs a person is decided in :mod:`.problems`. The results are plain dicts (JSON-able).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from airflow_jetstream.client.admin.consumers import consumer_filters
from airflow_jetstream.client.admin.streams import list_pages
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import JetStreamError
from airflow_jetstream.client.sourcing.spec import SOURCE_OWNER
from airflow_jetstream.client.sourcing.status import source_progress
from airflow_jetstream.client.subjects import validate_name

#: Default bounds of one overview (the UI passes its own).
MAX_STREAMS = 1000
MAX_CONSUMERS = 5000
#: Consumer listings in flight at once.
CONCURRENT_LISTINGS = 4


def _replica_health(cluster: dict[str, Any] | None) -> dict[str, Any]:
    """Leader and peers of an R>1 asset; ``healthy`` when there is a leader and every peer is current."""
    cluster = cluster or {}
    replicas = [
        {"name": peer.get("name"), "current": bool(peer.get("current")), "offline": bool(peer.get("offline")),
         "lag": int(peer.get("lag") or 0), "active_ns": int(peer.get("active") or 0)}
        for peer in cluster.get("replicas") or []
    ]
    leader = cluster.get("leader")
    return {
        "cluster": cluster.get("name"),
        "leader": leader,
        "replicas": replicas,
        "healthy": bool(leader) and all(r["current"] and not r["offline"] for r in replicas),
    }


def stream_row(info: dict[str, Any]) -> dict[str, Any]:
    """A stream's info reduced to what an operator looks at."""
    config, state = info.get("config") or {}, info.get("state") or {}
    sources = [entry.get("name") for entry in info.get("sources") or []]
    mirror = (info.get("mirror") or {}).get("name")
    return {
        "name": config.get("name"),
        "subjects": list(config.get("subjects") or []),
        "retention": config.get("retention"),
        "storage": config.get("storage"),
        "num_replicas": int(config.get("num_replicas") or 1),
        "allow_direct": bool(config.get("allow_direct")),
        "messages": int(state.get("messages") or 0),
        "bytes": int(state.get("bytes") or 0),
        "first_seq": int(state.get("first_seq") or 0),
        "last_seq": int(state.get("last_seq") or 0),
        "last_ts": state.get("last_ts"),
        "consumer_count": int(state.get("consumer_count") or 0),
        "sources": sources,
        "mirror": mirror,
        "created": info.get("created"),
        "read_at": info.get("ts"),
        **_replica_health(info.get("cluster")),
    }


def consumer_row(info: dict[str, Any]) -> dict[str, Any]:
    """A consumer's info reduced to its progress: pending, in flight, redelivered, last active, paused."""
    config = info.get("config") or {}
    delivered, ack_floor = info.get("delivered") or {}, info.get("ack_floor") or {}
    return {
        "stream": info.get("stream_name"),
        "name": info.get("name"),
        "durable": bool(config.get("durable_name")),
        "pull": not config.get("deliver_subject"),
        "filter_subjects": consumer_filters(info),
        "ack_policy": config.get("ack_policy"),
        "ack_wait_ns": int(config.get("ack_wait") or 0),
        "max_deliver": int(config.get("max_deliver") or -1),
        "num_pending": int(info.get("num_pending") or 0),
        "num_ack_pending": int(info.get("num_ack_pending") or 0),
        "num_redelivered": int(info.get("num_redelivered") or 0),
        "num_waiting": int(info.get("num_waiting") or 0),
        "delivered_stream_seq": int(delivered.get("stream_seq") or 0),
        "delivered_count": int(delivered.get("consumer_seq") or 0),  # deliveries: 0 while the start is only a cursor
        "ack_floor_stream_seq": int(ack_floor.get("stream_seq") or 0),
        "last_active": delivered.get("last_active"),
        "last_ack": ack_floor.get("last_active"),
        "created": info.get("created"),
        "read_at": info.get("ts"),
        "paused": bool(info.get("paused")),
        "pause_until": config.get("pause_until") if info.get("paused") else None,
        "source_for": (config.get("metadata") or {}).get(SOURCE_OWNER),
        "leader": (info.get("cluster") or {}).get("leader"),
    }


async def list_streams(conn: JetStreamConnection, *, limit: int = MAX_STREAMS) -> dict[str, Any]:
    """Every stream's info (up to ``limit``), by name; ``total`` counts all of them, ``missing`` names the
    streams a clustered server listed without info (no answer from their leader)."""
    infos, total, missing = await list_pages(conn, "STREAM.LIST", "streams", "list streams", limit=limit)
    infos.sort(key=lambda info: (info.get("config") or {}).get("name") or "")
    return {"streams": [stream_row(info) for info in infos], "infos": infos, "total": total, "read": len(infos),
            "missing": sorted(missing)}


async def list_consumers(conn: JetStreamConnection, stream: str, *, limit: int = MAX_CONSUMERS) -> dict[str, Any]:
    """Every consumer of ``stream`` (up to ``limit``), by name; ``total`` counts all of them."""
    validate_name(stream, what="stream name")
    infos, total, missing = await list_pages(conn, f"CONSUMER.LIST.{stream}", "consumers",
                                             f"list consumers of stream {stream!r}", limit=limit)
    rows = sorted((consumer_row(info) for info in infos), key=lambda row: row["name"] or "")
    return {"stream": stream, "consumers": rows, "total": total, "read": len(rows), "missing": sorted(missing)}


async def consumers_of(conn: JetStreamConnection, streams: Iterable[dict[str, Any]], *,
                       limit: int = MAX_CONSUMERS) -> dict[str, Any]:
    """The consumers of every stream row in ``streams`` that has any, up to ``limit`` in all.

    A stream whose listing fails is named in ``errors`` with its typed error; the others still count.
    """
    wanted = [row for row in streams if row["consumer_count"]]
    total = sum(row["consumer_count"] for row in wanted)
    gate = asyncio.Semaphore(CONCURRENT_LISTINGS)
    budget = {"left": limit}

    async def one(row: dict[str, Any]) -> dict[str, Any]:
        async with gate:
            room = min(row["consumer_count"], budget["left"])
            if room <= 0:
                return {"stream": row["name"], "consumers": [], "total": row["consumer_count"], "missing": []}
            budget["left"] -= room
            try:
                return await list_consumers(conn, row["name"], limit=room)
            except JetStreamError as exc:
                return {"stream": row["name"], "consumers": [], "total": row["consumer_count"], "missing": [],
                        "error": exc.to_dict()}

    listed = await asyncio.gather(*(one(row) for row in wanted))
    rows = [consumer for part in listed for consumer in part["consumers"]]
    return {"consumers": rows, "total": max(total, len(rows)), "read": len(rows),
            "missing": [f"{part['stream']} > {name}" for part in listed for name in part["missing"]],
            "errors": {part["stream"]: part["error"] for part in listed if "error" in part}}


def _source_kind(entry: dict[str, Any], config_entry: dict[str, Any], consumer: dict[str, Any] | None) -> str:
    if entry.get("external") or config_entry.get("external"):
        return "external"
    if config_entry.get("consumer"):
        return "user-managed"
    return "server-managed" if consumer is not None else "ephemeral"


def source_rows(stream_infos: Iterable[dict[str, Any]], consumers: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every source and mirror of ``stream_infos``: lag, last activity, error, and the durable consumer on the
    origin when it is among ``consumers`` (a user-managed source's named consumer, or the consumer the server
    made for a server-managed one); lag, activity, error and ``caught_up`` are
    :func:`~airflow_jetstream.client.sourcing.status.source_progress`, the caught-up sensor's own rule."""
    by_name = {(row["stream"], row["name"]): row for row in consumers}
    managed = {(row["stream"], row["source_for"]): row for row in consumers if row.get("source_for")}
    rows: list[dict[str, Any]] = []
    for info in stream_infos:
        config = info.get("config") or {}
        stream = config.get("name")
        entries = [(entry, False) for entry in info.get("sources") or []]
        if info.get("mirror"):
            entries.append((info["mirror"], True))
        configured = {(c.get("name"), False): c for c in config.get("sources") or []}
        if config.get("mirror"):
            configured[(config["mirror"].get("name"), True)] = config["mirror"]
        for entry, mirror in entries:
            origin = entry.get("name")
            config_entry = configured.get((origin, mirror), {})
            named = (config_entry.get("consumer") or {}).get("name")
            consumer = by_name.get((origin, named)) if named else managed.get((origin, stream))
            if entry.get("external") or config_entry.get("external"):
                consumer = None  # another domain or account: its consumers are not listed here
            progress = source_progress(entry, consumer, context=f"source {origin!r} of stream {stream!r}")
            rows.append({"stream": stream, "source": origin, "mirror": mirror,
                         "kind": _source_kind(entry, config_entry, consumer),
                         "consumer": consumer["name"] if consumer else named, **progress,
                         "active_s": progress["active"] / 1e9 if progress["active"] >= 0 else None,
                         "read_at": info.get("ts")})
    rows.sort(key=lambda row: (row["stream"] or "", row["source"] or ""))
    return rows
