"""JetStreamKeyValueOperator: put, create, update (at a revision) or delete a key of a KV bucket."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_jetstream.assets.jetstream import report_stream_output
from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.kv.names import check_bucket, stream_of, validate_key
from airflow_jetstream.operators.base import JetStreamBaseOperator

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection

OPERATIONS = ("put", "create", "update", "delete", "purge")
#: Bucket settings the operator passes to ``ensure_bucket``.
BUCKET_CONFIG_KEYS = ("history", "ttl", "num_replicas", "placement", "max_value_size", "max_bytes", "storage",
                      "description")


async def write_key(conn: JetStreamConnection, bucket: str, key: str, operation: str, value: Any,
                    revision: int | None, bucket_config: dict[str, Any] | None) -> dict[str, Any]:
    """Ensure the bucket (when ``bucket_config`` is not None), then apply ``operation`` to ``key``."""
    from airflow_jetstream.client.kv import create_key, ensure_bucket, update_key
    from airflow_jetstream.client.kv.keys import delete_key, put_key

    ensured = await ensure_bucket(conn, bucket, **bucket_config) if bucket_config is not None else None
    if operation == "put":
        result = await put_key(conn, bucket, key, value)
    elif operation == "create":
        result = await create_key(conn, bucket, key, value)
    elif operation == "update":
        result = await update_key(conn, bucket, key, value, revision)  # type: ignore[arg-type]
    else:
        result = await delete_key(conn, bucket, key, revision=revision, purge=operation == "purge")
    return {**result, "bucket_action": ensured["action"] if ensured else None}


class JetStreamKeyValueOperator(JetStreamBaseOperator):
    """Write a key of a JetStream KV bucket (``put``, ``create``, ``update`` at ``revision``, ``delete``,
    ``purge``), ensuring the bucket first (``bucket_config=None``: it must exist).

    ``create`` fails with ``key_exists`` and ``update`` with ``wrong_revision`` (compare-and-set). Returns
    ``{"bucket", "key", "operation", "revision", "bucket_action"}``; the key is added to the task's outlets as
    an asset (:func:`airflow_jetstream.assets.kv_asset`), so DAGs scheduled on it run after a write. See
    docs/operators/kv.md.
    """

    template_fields: Sequence[str] = ("bucket", "key", "value", "revision")

    def __init__(self, *, bucket: str, key: str, value: Any = None, operation: str = "put",
                 revision: int | str | None = None, bucket_config: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if operation not in OPERATIONS:
            raise InvalidRequestError(f"operation must be one of {', '.join(OPERATIONS)}, got {operation!r}",
                                      reason="invalid_option")
        if bucket_config is not None and (not isinstance(bucket_config, dict)
                                          or set(bucket_config) - set(BUCKET_CONFIG_KEYS)):
            raise InvalidRequestError(f"bucket_config takes {', '.join(BUCKET_CONFIG_KEYS)}; got {bucket_config!r}",
                                      reason="invalid_option")
        if operation == "update" and revision is None:
            raise InvalidRequestError("operation 'update' needs revision (the key's current revision); use 'put' "
                                      "to write without a check", reason="invalid_revision")
        if operation in ("put", "create", "update") and value is None:
            raise InvalidRequestError(f"operation {operation!r} needs a value", reason="missing_value")
        if "{{" not in str(bucket):
            check_bucket(bucket)
        if "{{" not in str(key):
            validate_key(key)
        self.bucket = bucket
        self.key = key
        self.value = value
        self.operation = operation
        self.revision = revision
        self.bucket_config = bucket_config

    def execute(self, context: Any) -> dict[str, Any]:
        revision = None if self.revision in (None, "") else self.revision
        self.log.info("KV %s of key %s in bucket %s%s", self.operation, self.key, self.bucket,
                      f" at revision {revision}" if revision is not None else "")
        result = self.hook.run(write_key, self.bucket, self.key, self.operation, self.value,
                               int(revision) if isinstance(revision, str) and revision.isdigit() else revision,
                               self.bucket_config)
        self.log.info("KV %s done: bucket %s (%s), key %s, revision %s", self.operation, self.bucket,
                      result["bucket_action"] or "existing", self.key, result["revision"])
        asset = report_stream_output(self, self.hook.settings.servers, stream_of(self.bucket),
                                     f"$KV.{self.bucket}.{self.key}", lineage_context=self.hook)
        self.log.info("Reported asset %s", asset.uri)
        return result
