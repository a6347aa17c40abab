"""A read-only look at an account's JetStream, as rows an operator reads: every stream, consumer and source,
the batch ledger per run, and the last advisories of the capture stream.

Listings are read whole (the server pages them by 256) up to a bound the caller sets; what was left
out is counted (``total``, ``read``), never dropped silently. Sources are built from the stream infos
and joined with the consumers already listed, so they cost no request of their own. The ledger bucket's
stream and the capture stream are read without a consumer
(:func:`~airflow_jetstream.client.reading.stored.read_messages`: direct batches where the stream allows
direct gets, message gets otherwise), newest first. Nothing is created or changed on the server; what
needs a person is decided in :mod:`.problems`. The results are plain dicts (JSON-able).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from airflow_jetstream.client.admin.consumers import consumer_filters
from airflow_jetstream.client.admin.streams import list_pages
from airflow_jetstream.client.advisories.capture import capture_info
from airflow_jetstream.client.advisories.types import ADVISORY_PREFIX, decode_advisory
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import JetStreamError, LedgerNotFoundError, StreamNotFoundError
from airflow_jetstream.client.kv.keys import is_marker
from airflow_jetstream.client.ledger.counts import summarized
from airflow_jetstream.client.ledger.records import FAILED, BatchRecord, key_token
from airflow_jetstream.client.ledger.store import check_bucket_name
from airflow_jetstream.client.reading.stored import direct_allowed, method_of, read_messages
from airflow_jetstream.client.sourcing.spec import SOURCE_OWNER, source_progress
from airflow_jetstream.client.subjects import subject_matches, validate_name

#: Default bounds of one overview (the UI passes its own).
MAX_STREAMS = 1000
MAX_CONSUMERS = 5000
#: Consumer listings in flight at once.
CONCURRENT_LISTINGS = 4


def stream_row(info: dict[str, Any]) -> dict[str, Any]:
    """A stream's info reduced to what an operator looks at; of an R>1 stream its leader and peers, ``healthy`` when
    there is a leader and every peer is current."""
    config, state, cluster = info.get("config") or {}, info.get("state") or {}, info.get("cluster") or {}
    replicas = [
        {"name": peer.get("name"), "current": bool(peer.get("current")), "offline": bool(peer.get("offline")),
         "lag": int(peer.get("lag") or 0), "active_ns": int(peer.get("active") or 0)}
        for peer in cluster.get("replicas") or []
    ]
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
        "sources": [entry.get("name") for entry in info.get("sources") or []],
        "mirror": (info.get("mirror") or {}).get("name"),
        "created": info.get("created"),
        "read_at": info.get("ts"),
        "cluster": cluster.get("name"),
        "leader": cluster.get("leader"),
        "replicas": replicas,
        "healthy": bool(cluster.get("leader")) and all(r["current"] and not r["offline"] for r in replicas),
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


async def consumers_of(conn: JetStreamConnection, streams: Iterable[dict[str, Any]], *,
                       limit: int = MAX_CONSUMERS) -> dict[str, Any]:
    """The consumers of every stream row in ``streams`` that has any, up to ``limit`` in all, each stream's by name.

    A stream whose listing fails is named in ``errors`` with its typed error; the others still count.
    """
    wanted = [row for row in streams if row["consumer_count"]]
    total = sum(row["consumer_count"] for row in wanted)
    gate = asyncio.Semaphore(CONCURRENT_LISTINGS)
    budget = {"left": limit}

    async def one(row: dict[str, Any]) -> dict[str, Any]:
        stream = row["name"]
        part: dict[str, Any] = {"stream": stream, "consumers": [], "missing": []}
        async with gate:
            room = min(row["consumer_count"], budget["left"])
            if room <= 0:
                return part
            budget["left"] -= room
            try:
                validate_name(stream, what="stream name")
                infos, _, missing = await list_pages(conn, f"CONSUMER.LIST.{stream}", "consumers",
                                                     f"list consumers of stream {stream!r}", limit=room)
            except JetStreamError as exc:
                return {**part, "error": exc.to_dict()}
        rows = sorted((consumer_row(info) for info in infos), key=lambda consumer: consumer["name"] or "")
        return {**part, "consumers": rows, "missing": sorted(missing)}

    listed = await asyncio.gather(*(one(row) for row in wanted))
    rows = [consumer for part in listed for consumer in part["consumers"]]
    return {"consumers": rows, "total": max(total, len(rows)), "read": len(rows),
            "missing": [f"{part['stream']} > {name}" for part in listed for name in part["missing"]],
            "errors": {part["stream"]: part["error"] for part in listed if "error" in part}}


def source_rows(stream_infos: Iterable[dict[str, Any]], consumers: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every source and mirror of ``stream_infos``: lag, last activity, error, and the durable consumer on the
    origin when it is among ``consumers`` (a user-managed source's named consumer, or the consumer the server
    made for a server-managed one); lag, activity, error and ``caught_up`` are
    :func:`~airflow_jetstream.client.sourcing.spec.source_progress`, the caught-up sensor's own rule."""
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
            external = entry.get("external") or config_entry.get("external")
            # an external one's origin is in another domain or account: its consumers are not listed here
            consumer = None if external else by_name.get((origin, named)) if named else managed.get((origin, stream))
            kind = "external" if external else "user-managed" if config_entry.get("consumer") \
                else "server-managed" if consumer is not None else "ephemeral"
            progress = source_progress(entry, consumer, context=f"source {origin!r} of stream {stream!r}")
            rows.append({"stream": stream, "source": origin, "mirror": mirror, "kind": kind,
                         "consumer": consumer["name"] if consumer else named, **progress,
                         "active_s": progress["active"] / 1e9 if progress["active"] >= 0 else None,
                         "read_at": info.get("ts")})
    rows.sort(key=lambda row: (row["stream"] or "", row["source"] or ""))
    return rows


#: Ledger entries (KV messages) one overview reads unless told otherwise.
MAX_LEDGER_ENTRIES = 5000
#: Failed and overdue batches listed per run (all are counted).
LISTED_PER_RUN = 20


async def ledger_runs(conn: JetStreamConnection, bucket: str, *, limit: int = MAX_LEDGER_ENTRIES,
                      before_seq: int | None = None, run_id: str | None = None,
                      now: float | None = None) -> dict[str, Any]:
    """The ledger in ``bucket`` per run: batches by state, attempts, messages, last update, failed batches and
    claims past their visibility deadline (``overdue``), newest run first.

    The last ``limit`` sequences hold the most recently written entries, so every entry shown was written after
    every entry left out. ``entries`` counts the ledger entries stored, ``read`` those read, ``first_read_seq``
    where the read began (give it as ``before_seq`` for the older page, the window below). With ``run_id`` only
    that run's entries are read, wherever they are. The bucket is only read (never created); a bucket that does
    not exist is :class:`LedgerNotFoundError`.
    """
    check_bucket_name(bucket)
    try:
        info = await conn.api_request(f"STREAM.INFO.KV_{bucket}", context=f"ledger bucket {bucket!r}")
    except StreamNotFoundError:
        raise LedgerNotFoundError(
            f"ledger bucket {bucket!r} does not exist (nothing was recorded in it yet, or the view looks at another "
            "bucket than the producers use: set ledger_bucket)", reason="ledger_not_found") from None
    state = info.get("state") or {}
    first, last = int(state.get("first_seq") or 0), int(state.get("last_seq") or 0)
    stream, prefix = f"KV_{bucket}", f"$KV.{bucket}."
    if run_id is not None:
        messages = await read_messages(conn, stream, first, last, limit=limit, info=info,
                                       subjects=[f"{prefix}{key_token(run_id)}.*"])
        start, method = first, method_of(conn, info) if limit else "none"
    else:
        end = min(last, before_seq - 1) if before_seq else last
        start = max(first, end - limit + 1, 1)
        messages = await read_messages(conn, stream, start, end, info=info)
        method = method_of(conn, info) if end >= start else "none"
    latest: dict[str, BatchRecord | None] = {}
    errors: list[dict[str, Any]] = []
    for msg in messages:
        key = msg.subject[len(prefix):]
        if key.count(".") != 1:  # not a batch record (<run>.<batch>): e.g. a run's counts (<run>./counts.<n>)
            continue
        if is_marker(msg.headers):
            latest[key] = None
            continue
        try:
            latest[key] = BatchRecord.decode(msg.data, msg.seq, key)
        except JetStreamError as exc:
            errors.append({"key": key, "seq": msg.seq, **exc.to_dict()})
    runs = run_rows((rec for rec in latest.values() if rec is not None), bucket=bucket,
                    now=time.time() if now is None else now)
    return {"bucket": bucket, "runs": runs, "entries": int(state.get("messages") or 0), "read": len(messages),
            "first_read_seq": start, "older": start > first and run_id is None, "run_id": run_id,
            "method": method, "unreadable": errors[:LISTED_PER_RUN], "unreadable_count": len(errors),
            "allow_direct": bool((info.get("config") or {}).get("allow_direct"))}


def run_rows(records: Iterable[BatchRecord], *, bucket: str, now: float) -> list[dict[str, Any]]:
    """One row per run, newest update first: the ledger's own summary of the run's records
    (:func:`~airflow_jetstream.client.ledger.counts.summarized`, what sensors and ``BatchLedger.summary`` count),
    with what only the view shows: messages in all, the most attempts of one batch, first and last update, and the
    failed and overdue batches with their times (``failed_count``, ``overdue_count``: all of them)."""
    by_run: dict[str, list[BatchRecord]] = {}
    for rec in records:
        by_run.setdefault(rec.run_id, []).append(rec)
    rows = []
    for run_id, held in by_run.items():
        summary = summarized(run_id, bucket, held, now)
        failed = [{"batch_id": rec.batch_id, "attempts": rec.attempts, "last_error": rec.last_error,
                   "failed_at": rec.failed_at} for rec in held if rec.state == FAILED]
        overdue = [{"batch_id": rec.batch_id, "owner": rec.owner, "deadline": rec.deadline, "attempts": rec.attempts}
                   for rec in held if rec.expired(now)]
        rows.append({**summary, "messages": sum(summary["messages"].values()),
                     "max_attempts": max(rec.attempts for rec in held),
                     "created_at": min((rec.created_at for rec in held if rec.created_at), default=None),
                     "updated_at": max(rec.updated_at or "" for rec in held),
                     "failed": failed[:LISTED_PER_RUN], "failed_count": summary["states"][FAILED],
                     "overdue": overdue[:LISTED_PER_RUN], "overdue_count": summary["expired_claims"]})
    rows.sort(key=lambda run: run["updated_at"], reverse=True)
    return rows


#: Captured messages one overview reads unless told otherwise.
MAX_ADVISORIES = 1000
#: The API audit advisory's subject (one per JetStream API call of any client).
API_AUDIT_SUBJECT = f"{ADVISORY_PREFIX}.API"
#: Advisory fields shown besides kind, time and capture sequence (no client details, no request bodies).
FIELDS = ("stream", "consumer", "domain", "batch", "reason", "stream_seq", "deliveries", "action", "leader",
          "paused", "pause_until")


def advisory_row(data: bytes, subject: str, seq: int) -> dict[str, Any] | None:
    """A captured message as a row (None when it is not an advisory's JSON)."""
    advisory = decode_advisory(data, subject=subject, capture_seq=seq)
    if advisory is None:
        return None
    raw = advisory.raw
    row: dict[str, Any] = {"capture_seq": seq, "kind": advisory.kind, "type": advisory.type, "subject": subject,
                           "timestamp": advisory.timestamp.isoformat() if advisory.timestamp else None}
    row.update({name: raw[name] for name in FIELDS if isinstance(raw.get(name), (str, int, float, bool))})
    return row


def capture_facts(conn: JetStreamConnection, info: dict[str, Any]) -> dict[str, Any]:
    """What a reader needs to know of the capture stream: whether it answers direct gets and captures API audits
    (then every JetStream API call, this view's message gets included, adds a message to it)."""
    config, state = info.get("config") or {}, info.get("state") or {}
    subjects = list(config.get("subjects") or [])
    return {
        "subjects": subjects,
        "allow_direct": bool(config.get("allow_direct")),
        "direct_reads": direct_allowed(conn, info, batch=True),
        "captures_api_audits": any(subject_matches(s, API_AUDIT_SUBJECT) for s in subjects),
        "messages": int(state.get("messages") or 0),
        "first_seq": int(state.get("first_seq") or 0),
        "last_seq": int(state.get("last_seq") or 0),
        "first_ts": state.get("first_ts"),
        "max_age_s": int(config.get("max_age") or 0) / 1e9 or None,
    }


async def recent_advisories(conn: JetStreamConnection, capture_stream: str, *,
                            limit: int = MAX_ADVISORIES) -> dict[str, Any]:
    """The advisories among the last ``limit`` messages of the capture stream, newest first.

    Reading writes nothing into a capture stream that is the provider's (``allow_direct``, no API audits):
    ``capture`` says when it is not. API audit advisories (when captured) are counted in ``api_audit_skipped``.
    ``read`` counts the messages read, ``messages`` those stored. A missing capture stream is
    :class:`~airflow_jetstream.client.errors.StreamNotFoundError` naming the fix.
    """
    validate_name(capture_stream, what="capture stream")
    info = await capture_info(conn, capture_stream)
    facts = capture_facts(conn, info)
    first, last = max(facts["first_seq"], 1), facts["last_seq"]
    start = max(first, last - limit + 1)
    messages = await read_messages(conn, capture_stream, start, last, info=info)
    rows = [row for msg in reversed(messages) if (row := advisory_row(msg.data, msg.subject, msg.seq))]
    audits = sum(row["kind"] == "api_audit" for row in rows)
    return {"capture_stream": capture_stream, "advisories": [row for row in rows if row["kind"] != "api_audit"],
            "api_audit_skipped": audits, "read": len(messages), "messages": facts["messages"],
            "window_start_seq": start, "method": method_of(conn, info) if last >= start else "none", "capture": facts}
