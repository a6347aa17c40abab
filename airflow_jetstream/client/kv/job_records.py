"""Job records: one JSON document per job id in a KV bucket, written by whoever finishes the job.

The Spark data source's driver-side ``commit()``/``abort()`` run in a separate worker process, so
what a write job stored (per partition) is kept here, where the Airflow task, a sensor or the next
run can read it: ``await get_job_record(conn, job_id)``.
"""

from __future__ import annotations

import json
from typing import Any

import nats.errors
import nats.js.errors

from airflow_jetstream.client.admin.streams import ensure_stream, replication_config
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.kv.bucket import create_bucket, kv_errors
from airflow_jetstream.client.subjects import validate_name

DEFAULT_JOB_BUCKET = "jetstream_jobs"
#: A missing key is the caller's (None), not an error; no answer, a refusal and API errors are typed (kv_errors).
_KEEP = (nats.js.errors.KeyNotFoundError,)


async def _bucket(conn: JetStreamConnection, bucket: str, *, create: bool,
                  replication: dict[str, Any] | None = None) -> Any:
    validate_name(bucket, what="job bucket")
    try:
        kv = await conn.js.key_value(bucket)
    except nats.js.errors.BucketNotFoundError:
        if not create:
            return None
        return await create_bucket(conn, replication or {}, bucket=bucket, history=5,
                                   description="airflow-jetstream job records")
    if replication:  # given: an existing bucket is changed to it
        await ensure_stream(conn, {"name": f"KV_{bucket}", **replication})
    return kv


async def put_job_record(conn: JetStreamConnection, job_id: str, record: dict[str, Any], *,
                         bucket: str = DEFAULT_JOB_BUCKET, replicas: int | None = None,
                         placement: dict[str, Any] | None = None) -> int:
    """Store ``record`` (JSON-able) under ``job_id``, creating the bucket when missing; returns the revision.

    ``replicas``/``placement``: as for :meth:`BatchLedger.open <airflow_jetstream.client.ledger.BatchLedger.open>`
    (None: 3 on a cluster for a new bucket, an existing one keeps its own). No answer (a leader election)
    is retried for the connection's ``leader_wait``: writing the same record again is harmless.
    """
    validate_name(job_id, what="job id")
    replication = replication_config(replicas, placement)
    payload = json.dumps(record, separators=(",", ":"), default=str).encode()

    async def attempt() -> int:
        async with kv_errors(conn, bucket, f"job record {job_id!r} in bucket {bucket!r}", keep=_KEEP):
            kv = await _bucket(conn, bucket, create=True, replication=replication)
            return int(await kv.put(job_id, payload))

    return await conn.retry_leader(f"job record {job_id!r}", attempt)


async def get_job_record(conn: JetStreamConnection, job_id: str, *,
                         bucket: str = DEFAULT_JOB_BUCKET) -> dict[str, Any] | None:
    """The record of ``job_id``, or None when the job (or the bucket) has none."""
    validate_name(job_id, what="job id")

    async def attempt() -> Any:
        async with kv_errors(conn, bucket, f"job record {job_id!r} in bucket {bucket!r}", keep=_KEEP):
            kv = await _bucket(conn, bucket, create=False)
            return None if kv is None else await kv.get(job_id)

    try:
        entry = await conn.retry_leader(f"job record {job_id!r}", attempt)
    except nats.js.errors.KeyNotFoundError:
        return None
    return None if entry is None else json.loads(entry.value or b"{}")

