"""The batch ledger (batch state in a KV bucket) and the job records beside it.

The names below are imported on first use, so reading states and records imports no nats-py."""

from typing import TYPE_CHECKING

from airflow_jetstream.client.lazy import lazy_exports

if TYPE_CHECKING:
    from airflow_jetstream.client.ledger.batch_ledger import BatchLedger, ledger_status
    from airflow_jetstream.client.ledger.records import (
        CONSUMED,
        DEFAULT_BUCKET,
        FAILED,
        IN_PROGRESS,
        PUBLISHED,
        BatchRecord,
    )

__all__ = [
    "CONSUMED",
    "DEFAULT_BUCKET",
    "FAILED",
    "IN_PROGRESS",
    "PUBLISHED",
    "BatchLedger",
    "BatchRecord",
    "ledger_status",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    "batch_ledger": ("BatchLedger", "ledger_status"),
    "records": ("CONSUMED", "DEFAULT_BUCKET", "FAILED", "IN_PROGRESS", "PUBLISHED", "BatchRecord"),
})
