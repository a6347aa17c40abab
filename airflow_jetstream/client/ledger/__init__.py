"""The batch ledger (batch state in a KV bucket) and the job records beside it.

The names below are imported on first use, so reading states and records imports no nats-py."""

from typing import TYPE_CHECKING

from airflow_jetstream.client.lazy import lazy_exports

if TYPE_CHECKING:
    from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
    from airflow_jetstream.client.ledger.counts import counts_key, shard_of
    from airflow_jetstream.client.ledger.job_records import get_job_record
    from airflow_jetstream.client.ledger.records import batch_key

__all__ = ["BatchLedger", "batch_key", "counts_key", "get_job_record", "shard_of"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "batch_ledger": ("BatchLedger",),
    "counts": ("counts_key", "shard_of"),
    "job_records": ("get_job_record",),
    "records": ("batch_key",),
})
