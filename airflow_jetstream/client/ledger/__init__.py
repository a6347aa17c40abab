"""The batch ledger (batch state in a KV bucket) and the job records beside it."""

from airflow_jetstream.client.ledger.batch_ledger import (
    CONSUMED,
    DEFAULT_BUCKET,
    FAILED,
    IN_PROGRESS,
    PUBLISHED,
    BatchLedger,
    BatchRecord,
    ledger_status,
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
