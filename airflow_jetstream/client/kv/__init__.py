"""JetStream key-value buckets: ensure a bucket, write keys (put, create, update by revision, delete), wait on a key."""

from airflow_jetstream.client.kv.bucket import ensure_bucket, open_bucket
from airflow_jetstream.client.kv.keys import create_key, delete_key, get_key, put_key, update_key
from airflow_jetstream.client.kv.watch import KeyCondition, check_key, wait_for_key

__all__ = ["KeyCondition", "check_key", "create_key", "delete_key", "ensure_bucket", "get_key", "open_bucket",
           "put_key", "update_key", "wait_for_key"]
