"""JetStream key-value buckets: ensure a bucket (``bucket``), write, read and wait for keys, once-only claims
(``keys``), job records (``job_records``).

The names below are imported on first use, so checking a bucket name, a key or a condition (``names``) imports
no nats-py."""

from typing import TYPE_CHECKING

from airflow_jetstream.client import lazy_exports

if TYPE_CHECKING:
    from airflow_jetstream.client.kv.bucket import ensure_bucket
    from airflow_jetstream.client.kv.job_records import get_job_record
    from airflow_jetstream.client.kv.keys import create_key, get_key, update_key

__all__ = ["create_key", "ensure_bucket", "get_job_record", "get_key", "update_key"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "bucket": ("ensure_bucket",),
    "job_records": ("get_job_record",),
    "keys": ("create_key", "get_key", "update_key"),
})
