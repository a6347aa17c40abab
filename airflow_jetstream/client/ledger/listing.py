"""Listing a run's batch records: O(n) in the run's size, for what needs every record (claiming a whole
run, the reaper once a claim may have expired, a recount, runs recorded before the ledger kept counts).

A run is listed with one short-lived consumer (deliver policy ``last_per_subject`` on ``<run>.*``, read
until nothing is pending; delete and purge markers are skipped). Counts keys (``<run>./counts.<n>``) are
not records and never listed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from airflow_jetstream.client import metrics
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.ledger.counts import is_counts_key
from airflow_jetstream.client.ledger.records import BatchRecord, check_id, key_token
from airflow_jetstream.client.ledger.store import kv_errors, stream_of, subject_of
from airflow_jetstream.client.ledger.summary import RunTally, summarize
from airflow_jetstream.client.reading.range_read import read_latest_per_subject

log = logging.getLogger(__name__)


async def latest(conn: JetStreamConnection, bucket: str,
                 run_id: str | None) -> AsyncGenerator[tuple[int, str, BatchRecord | None], None]:
    """``(seq, key, record)`` of every batch key of ``run_id`` (all runs when None), in stream order; record
    None for a deleted, purged or expired key. A key updated during the read comes again."""
    pattern = f"{key_token(check_id(run_id, 'run_id'))}.*" if run_id is not None else ">"
    prefix = subject_of(bucket, "")
    async with kv_errors(conn, bucket, f"ledger {bucket!r} listing", fail_fast=False):
        async for chunk in read_latest_per_subject(conn, stream_of(bucket), [prefix + pattern]):
            for subject, seq, _, headers, data in chunk:
                key = subject[len(prefix):]
                if is_counts_key(key):
                    continue
                if headers and (headers.get("KV-Operation") in ("DEL", "PURGE") or "Nats-Marker-Reason" in headers):
                    yield seq, key, None
                else:
                    yield seq, key, BatchRecord.decode(data, seq, key)


async def list_batches(conn: JetStreamConnection, bucket: str, run_id: str | None,
                       state: str | None = None) -> list[BatchRecord]:
    """Every batch of ``run_id`` (all runs when None), optionally only those in ``state``, sorted by (run, batch)."""
    records: dict[str, BatchRecord] = {}
    async for _, key, rec in latest(conn, bucket, run_id):
        if rec is None:
            records.pop(key, None)
        else:
            records[key] = rec
    chosen = (r for r in records.values() if state is None or r.state == state)
    return sorted(chosen, key=lambda r: (r.run_id, r.batch_id))


async def iter_batches(conn: JetStreamConnection, bucket: str, run_id: str | None,
                       state: str | None = None) -> AsyncGenerator[BatchRecord, None]:
    """The batches of ``run_id`` (all runs when None) in stream order, holding one read chunk; a batch updated
    while the listing runs can come twice, its newer state last."""
    async with aclosing(latest(conn, bucket, run_id)) as records:
        async for _, _, rec in records:
            if rec is not None and (state is None or rec.state == state):
                yield rec


async def listed_summary(conn: JetStreamConnection, bucket: str, run_id: str, now: float) -> dict[str, Any]:
    """A run's summary from its records, computed while streaming the listing (``counted_by: "listing"``).

    Exact when nothing was written to the bucket since the listing started (every key comes once); else
    computed again from :func:`list_batches` (one record per key held), so no batch is counted twice.
    """
    info = await conn.api_request(f"STREAM.INFO.{stream_of(bucket)}", context=f"ledger {bucket!r}")
    last_seq = int(info["state"].get("last_seq") or 0)
    tally = RunTally(run_id, bucket, now)
    async with aclosing(latest(conn, bucket, run_id)) as records:
        async for seq, _, rec in records:
            if seq > last_seq:
                break
            if rec is not None:
                tally.add(rec)
        else:
            return {**tally.result(), "counted_by": "listing"}
    metrics.incr("ledger.summary_relisted")
    return {**summarize(run_id, bucket, await list_batches(conn, bucket, run_id), now), "counted_by": "listing"}
