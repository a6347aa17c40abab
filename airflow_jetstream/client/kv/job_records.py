"""Job records: one JSON document per job id in a KV bucket, written by whoever finishes the job.

The Spark data source's driver-side ``commit()``/``abort()`` run in a separate worker process, so
what a write job stored (per partition) is kept here, where the Airflow task, a sensor or the next
run can read it: ``await get_job_record(conn, job_id)``.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_jetstream.client.admin.streams import find_stream, replication_config
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import StreamNotFoundError
from airflow_jetstream.client.kv.bucket import ensure_kv_stream
from airflow_jetstream.client.kv.keys import Write, is_marker, write
from airflow_jetstream.client.kv.names import stream_of
from airflow_jetstream.client.reading.stored import get_message
from airflow_jetstream.client.subjects import validate_name

DEFAULT_JOB_BUCKET = "jetstream_jobs"


async def put_job_record(conn: JetStreamConnection, job_id: str, record: dict[str, Any], *,
                         bucket: str = DEFAULT_JOB_BUCKET, replicas: int | None = None,
                         placement: dict[str, Any] | None = None) -> int:
    """Store ``record`` (JSON-able) under ``job_id``, creating the bucket when missing; returns the revision.

    ``replicas``/``placement``: as for :meth:`BatchLedger.open <airflow_jetstream.client.ledger.BatchLedger.open>`
    (None: 3 on a cluster for a new bucket, an existing one keeps its own). No answer (a leader election)
    is retried for the connection's ``leader_wait``: writing the same record again is harmless.
    """
    validate_name(job_id, what="job id")
    validate_name(bucket, what="job bucket")
    replication = replication_config(replicas, placement)
    payload = json.dumps(record, separators=(",", ":"), default=str).encode()
    context = f"job record {job_id!r} in bucket {bucket!r}"

    async def attempt() -> int:
        if replication or await find_stream(conn, stream_of(bucket)) is None:  # given: an existing bucket gets it
            await ensure_kv_stream(conn, bucket, replication, context=context, history=5,
                                   description="airflow-jetstream job records")
        return await write(conn, bucket, [Write(job_id, payload, None)], context=context)

    return await conn.retry_leader(f"job record {job_id!r}", attempt)


async def get_job_record(conn: JetStreamConnection, job_id: str, *,
                         bucket: str = DEFAULT_JOB_BUCKET) -> dict[str, Any] | None:
    """The record of ``job_id``, or None when the job (or the bucket) has none."""
    validate_name(job_id, what="job id")
    validate_name(bucket, what="job bucket")
    try:  # a message get: the stream leader answers (retried through an election)
        stored = await get_message(conn, f"KV_{bucket}", subject=f"$KV.{bucket}.{job_id}")
    except StreamNotFoundError:
        return None
    return None if stored is None or is_marker(stored.headers) else json.loads(stored.data or b"{}")
