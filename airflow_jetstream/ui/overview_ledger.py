"""The batch ledger per run, read without a consumer: what the JetStream view shows in its ledger section.

The ledger bucket's stream (``KV_<bucket>``) is read with :func:`~airflow_jetstream.client.reading.stored.read_messages`
(direct batches when the bucket allows direct gets, message gets otherwise), newest first: the last
``limit`` sequences hold the most recently written ledger entries, so every entry shown was written after
every entry left out. ``before_seq`` reads the window below an earlier one (the older page). One run's
entries (``run_id``) are read whole, wherever they are in the stream.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import JetStreamError, LedgerNotFoundError, StreamNotFoundError
from airflow_jetstream.client.kv.keys import is_marker
from airflow_jetstream.client.ledger.counts import summarized
from airflow_jetstream.client.ledger.records import FAILED, BatchRecord, key_token
from airflow_jetstream.client.ledger.store import check_bucket_name
from airflow_jetstream.client.reading.stored import method_of, read_messages

#: Ledger entries (KV messages) one overview reads unless told otherwise.
MAX_LEDGER_ENTRIES = 5000
#: Failed and overdue batches listed per run (all are counted).
LISTED_PER_RUN = 20


async def _bucket_info(conn: JetStreamConnection, bucket: str) -> dict[str, Any]:
    try:
        return await conn.api_request(f"STREAM.INFO.KV_{bucket}", context=f"ledger bucket {bucket!r}")
    except StreamNotFoundError:
        raise LedgerNotFoundError(
            f"ledger bucket {bucket!r} does not exist (nothing was recorded in it yet, or the view looks at another "
            "bucket than the producers use: set ledger_bucket)", reason="ledger_not_found") from None


async def ledger_runs(conn: JetStreamConnection, bucket: str, *, limit: int = MAX_LEDGER_ENTRIES,
                      before_seq: int | None = None, run_id: str | None = None,
                      now: float | None = None) -> dict[str, Any]:
    """The ledger in ``bucket`` per run: batches by state, attempts, messages, last update, failed batches and
    claims past their visibility deadline (``overdue``), newest run first.

    ``entries`` counts the ledger entries stored, ``read`` those read, ``first_read_seq`` where the read began
    (give it as ``before_seq`` for the older page). With ``run_id`` only that run's entries are read. The
    bucket is only read (never created); a bucket that does not exist is :class:`LedgerNotFoundError`.
    """
    check_bucket_name(bucket)
    info = await _bucket_info(conn, bucket)
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
