"""The batch ledger (batch state in a KV bucket) and the job records beside it.

The names below are imported on first use, so reading states and records imports no nats-py."""

from typing import TYPE_CHECKING

from airflow_jetstream.client.lazy import lazy_exports

if TYPE_CHECKING:
    from airflow_jetstream.client.ledger.batch_ledger import BatchLedger, ledger_status
    from airflow_jetstream.client.ledger.job_records import get_job_record
    from airflow_jetstream.client.ledger.records import (
        CONSUMED,
        DEFAULT_BUCKET,
        FAILED,
        IN_PROGRESS,
        PUBLISHED,
        BatchRecord,
        batch_key,
    )

__all__ = [
    "CONSUMED",
    "DEFAULT_BUCKET",
    "FAILED",
    "IN_PROGRESS",
    "PUBLISHED",
    "BatchLedger",
    "BatchRecord",
    "batch_key",
    "get_job_record",
    "ledger_status",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    "batch_ledger": ("BatchLedger", "ledger_status"),
    "job_records": ("get_job_record",),
    "records": ("CONSUMED", "DEFAULT_BUCKET", "FAILED", "IN_PROGRESS", "PUBLISHED", "BatchRecord", "batch_key"),
})
