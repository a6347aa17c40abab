"""JetStream key-value buckets: ensure a bucket, write keys (put, create, update by revision, delete), wait on a key.

The names below are imported on first use, so checking a bucket name or key (``names``) or a condition
(``condition``) imports no nats-py."""

from typing import TYPE_CHECKING

from airflow_jetstream.client.lazy import lazy_exports

if TYPE_CHECKING:
    from airflow_jetstream.client.kv.bucket import ensure_bucket, open_bucket
    from airflow_jetstream.client.kv.condition import KeyCondition
    from airflow_jetstream.client.kv.keys import create_key, delete_key, get_key, put_key, update_key
    from airflow_jetstream.client.kv.watch import check_key, wait_for_key

__all__ = ["KeyCondition", "check_key", "create_key", "delete_key", "ensure_bucket", "get_key", "open_bucket",
           "put_key", "update_key", "wait_for_key"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "bucket": ("ensure_bucket", "open_bucket"),
    "keys": ("create_key", "delete_key", "get_key", "put_key", "update_key"),
    "condition": ("KeyCondition",),
    "watch": ("check_key", "wait_for_key"),
})
