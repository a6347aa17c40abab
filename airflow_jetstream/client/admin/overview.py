"""A bounded, read-only look at an account's JetStream: streams, consumers, sources, ledger, advisories.

Every function here does a fixed amount of work whatever the account holds: one page of the
stream and consumer listings (the server pages by 256), at most ``limit`` ledger keys and captured
advisories. What was left out is counted (``total``, ``truncated``) rather than silently dropped.
Nothing is changed on the server: advisories are read with message gets; the ledger listing uses
the short-lived, no-ack, in-memory consumer every ledger reader in this package uses, deleted when
the read ends.

The results are plain dicts (JSON-able) for the Airflow UI view and for scripts.
"""

from __future__ import annotations

import asyncio
import base64
from collections import Counter
from contextlib import aclosing
from typing import Any

from airflow_jetstream.client.admin.consumers import consumer_filters
from airflow_jetstream.client.admin.streams import stream_info
from airflow_jetstream.client.advisories.types import decode_advisory
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import JetStreamError
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.ledger.records import STATES
from airflow_jetstream.client.sourcing.status import source_status
from airflow_jetstream.client.subjects import validate_name

#: Default bounds of one overview (the UI passes its own).
MAX_STREAMS = 50
MAX_CONSUMERS = 50
MAX_SOURCES = 20
MAX_LEDGER_KEYS = 500
MAX_ADVISORIES = 50
#: Advisory fields shown besides kind, time and capture sequence (no client details, no request bodies).
_ERR_NO_MESSAGE = 10037
_API_AUDIT = "api_audit"
_ADVISORY_FIELDS = ("stream", "consumer", "domain", "reason", "batch_id", "leader", "action", "deliveries")


def _page(reply: dict[str, Any], key: str, limit: int) -> tuple[list[dict[str, Any]], int]:
    items = reply.get(key) or []
    return items[:limit], max(int(reply.get("total") or 0), len(items))


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
        "messages": int(state.get("messages") or 0),
        "bytes": int(state.get("bytes") or 0),
        "first_seq": int(state.get("first_seq") or 0),
        "last_seq": int(state.get("last_seq") or 0),
        "consumer_count": int(state.get("consumer_count") or 0),
        "sources": sources,
        "mirror": mirror,
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
        "filter_subjects": consumer_filters(info),
        "ack_policy": config.get("ack_policy"),
        "num_pending": int(info.get("num_pending") or 0),
        "num_ack_pending": int(info.get("num_ack_pending") or 0),
        "num_redelivered": int(info.get("num_redelivered") or 0),
        "num_waiting": int(info.get("num_waiting") or 0),
        "delivered_stream_seq": int(delivered.get("stream_seq") or 0),
        "ack_floor_stream_seq": int(ack_floor.get("stream_seq") or 0),
        "last_active": delivered.get("last_active"),
        "paused": bool(info.get("paused")),
        "pause_until": config.get("pause_until") if info.get("paused") else None,
        "leader": (info.get("cluster") or {}).get("leader"),
    }


async def list_streams(conn: JetStreamConnection, *, limit: int = MAX_STREAMS) -> dict[str, Any]:
    """The first ``limit`` streams (one listing page); ``total`` counts all of them."""
    reply = await conn.api_request("STREAM.LIST", {"offset": 0}, context="list streams")
    infos, total = _page(reply, "streams", limit)
    rows = sorted((stream_row(info) for info in infos), key=lambda row: row["name"] or "")
    return {"streams": rows, "infos": infos, "total": total, "truncated": total > len(rows)}


async def list_consumer_rows(conn: JetStreamConnection, stream: str, *, limit: int = MAX_CONSUMERS) -> dict[str, Any]:
    """The first ``limit`` consumers of ``stream`` (one listing page); ``total`` counts all of them."""
    validate_name(stream, what="stream name")
    reply = await conn.api_request(f"CONSUMER.LIST.{stream}", {"offset": 0},
                                   context=f"list consumers of stream {stream!r}")
    infos, total = _page(reply, "consumers", limit)
    rows = sorted((consumer_row(info) for info in infos), key=lambda row: row["name"] or "")
    return {"stream": stream, "consumers": rows, "total": total, "truncated": total > len(rows)}


async def source_rows(conn: JetStreamConnection, stream_infos: list[dict[str, Any]], *,
                      limit: int = MAX_SOURCES) -> dict[str, Any]:
    """Status (:func:`source_status`: lag, active, error, consumer pending) of the first ``limit`` sources
    and mirrors of ``stream_infos``; a source whose status cannot be read shows its typed error."""
    wanted: list[tuple[Any, Any]] = []  # (stream name, source entry) from server JSON
    for info in stream_infos:
        name = (info.get("config") or {}).get("name")
        entries = list(info.get("sources") or []) + ([info["mirror"]] if info.get("mirror") else [])
        wanted.extend((name, entry) for entry in entries)
    rows = []
    for stream, entry in wanted[:limit]:
        external = entry.get("external") or {}
        try:
            rows.append(await source_status(conn, stream, entry.get("name"), api_prefix=external.get("api")))
        except JetStreamError as exc:
            rows.append({"stream": stream, "source": entry.get("name"), "lag": int(entry.get("lag") or 0),
                         "active": int(entry.get("active", -1)), "error": exc.to_dict(), "caught_up": False})
    return {"sources": rows, "total": len(wanted), "truncated": len(wanted) > len(rows)}


async def ledger_runs(conn: JetStreamConnection, bucket: str, *, limit: int = MAX_LEDGER_KEYS) -> dict[str, Any]:
    """The batch ledger in ``bucket`` per run: batches by state, attempts, messages, last update.

    Reads at most ``limit`` keys (in stream order: oldest first); ``truncated`` says when more exist.
    The bucket is only read (never created).
    """
    ledger = await BatchLedger.open(conn, bucket, create=False)
    latest: dict[tuple[str, str], Any] = {}
    truncated = False
    async with aclosing(ledger.iter_batches()) as records:
        async for rec in records:
            if (rec.run_id, rec.batch_id) not in latest and len(latest) >= limit:
                truncated = True
                break
            latest[(rec.run_id, rec.batch_id)] = rec  # a batch updated during the read comes again, newer
    runs: dict[str, dict[str, Any]] = {}
    for rec in latest.values():
        run = runs.setdefault(rec.run_id, {"run_id": rec.run_id, "batches": 0, "states": Counter(), "messages": 0,
                                           "attempts": 0, "max_attempts": 0, "streams": set(), "updated_at": "",
                                           "failed": []})
        run["batches"] += 1
        run["states"][rec.state] += 1
        run["messages"] += rec.count
        run["attempts"] += rec.attempts
        run["max_attempts"] = max(run["max_attempts"], rec.attempts)
        run["streams"].add(rec.stream)
        run["updated_at"] = max(run["updated_at"], rec.updated_at or "")
        if rec.state == "failed":
            run["failed"].append({"batch_id": rec.batch_id, "attempts": rec.attempts, "last_error": rec.last_error})
    rows = [{**run, "states": {state: run["states"].get(state, 0) for state in STATES},
             "streams": sorted(run["streams"])} for run in runs.values()]
    rows.sort(key=lambda run: run["updated_at"], reverse=True)
    return {"bucket": bucket, "runs": rows, "keys_read": len(latest), "truncated": truncated}


def _advisory_row(data: bytes, subject: str, seq: int) -> dict[str, Any] | None:
    advisory = decode_advisory(data, subject=subject, capture_seq=seq)
    if advisory is None:
        return None
    raw = advisory.raw
    row = {"capture_seq": seq, "kind": advisory.kind, "type": advisory.type,
           "timestamp": advisory.timestamp.isoformat() if advisory.timestamp else None}
    row.update({name: raw[name] for name in _ADVISORY_FIELDS if isinstance(raw.get(name), (str, int, float))})
    return row


async def _message(conn: JetStreamConnection, stream: str, seq: int) -> dict[str, Any] | None:
    try:
        reply = await conn.api_request(f"STREAM.MSG.GET.{stream}", {"seq": seq}, context=f"stream {stream!r}")
    except JetStreamError as exc:
        if exc.err_code == _ERR_NO_MESSAGE:  # deleted, or expired since the stream info
            return None
        raise
    message: dict[str, Any] = reply["message"]
    return message


async def recent_advisories(conn: JetStreamConnection, capture_stream: str, *,
                            limit: int = MAX_ADVISORIES) -> dict[str, Any]:
    """The advisories among the last ``limit`` messages of the capture stream, newest first, with a
    few fields each; API audit advisories (one per JetStream API call) are counted in
    ``api_audit_skipped``, not listed. Read with one message get per sequence: no consumer is created."""
    info = await stream_info(conn, capture_stream)
    state = info.get("state") or {}
    last, first = int(state.get("last_seq") or 0), int(state.get("first_seq") or 0)
    seqs = range(last, max(first, last - limit + 1, 1) - 1, -1)
    messages = await asyncio.gather(*(_message(conn, capture_stream, seq) for seq in seqs))
    rows = [row for msg in messages if msg is not None
            and (row := _advisory_row(base64.b64decode(msg.get("data") or ""), msg["subject"], int(msg["seq"])))]
    audits = sum(row["kind"] == _API_AUDIT for row in rows)
    stored = int(state.get("messages") or 0)
    return {"capture_stream": capture_stream, "advisories": [row for row in rows if row["kind"] != _API_AUDIT],
            "api_audit_skipped": audits, "limit": len(seqs), "messages": stored, "truncated": stored > len(seqs)}
