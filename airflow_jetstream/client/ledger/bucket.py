"""The ledger's KV bucket: created or brought to what the ledger needs, with a retention a user can see.

The ledger writes a record and its run's counts as one atomic batch and reads them with direct gets, so
its bucket's stream (``KV_<bucket>``) has ``allow_atomic`` and ``allow_direct`` (nats-server 2.12+). A
writer's :meth:`BatchLedger.open <airflow_jetstream.client.ledger.batch_ledger.BatchLedger.open>` sets
them on a bucket an older version created; readers (sensors, triggers, the view) never change it.

Retention: a new bucket keeps every key :data:`DEFAULT_TTL` after its last change (``ttl``); a size bound
(``max_bytes``) is optional. An existing bucket keeps its own unless told otherwise.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from airflow_jetstream.client.admin.streams import ensure_stream, find_stream
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import InvalidRequestError, LedgerNotFoundError
from airflow_jetstream.client.kv.replication import bucket_replicas, create_bucket
from airflow_jetstream.client.ledger.records import KEY_SAFE
from airflow_jetstream.client.ledger.store import kv_errors, stream_of

log = logging.getLogger(__name__)

#: How long a new ledger bucket keeps a key after its last change: 30 days.
DEFAULT_TTL = 30 * 24 * 3600.0
#: A create met a stream of that name with another config (another writer created and prepared it meanwhile).
_NAME_IN_USE = 10058
_UNBOUNDED_WARNED: set[str] = set()


def check_bucket_name(bucket: object) -> str:
    if not isinstance(bucket, str) or not bucket or set(bucket) - KEY_SAFE:
        raise InvalidRequestError(
            f"ledger bucket {bucket!r} is not a valid KV bucket name (letters, digits, '_' and '-' only)",
            reason="invalid_name",
        )
    return bucket


def retention_of(config: dict[str, Any]) -> dict[str, Any]:
    """``{"ttl": seconds or None, "max_bytes": bytes or None}`` of a bucket's stream config (None: no bound)."""
    max_age = int(config.get("max_age") or 0)
    max_bytes = int(config.get("max_bytes") or -1)
    return {"ttl": max_age / 1e9 if max_age > 0 else None, "max_bytes": max_bytes if max_bytes > 0 else None}


def _retention_fields(ttl: float | str | timedelta | None, max_bytes: int | None) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if ttl is not None:
        seconds = to_seconds(ttl, field="ttl")
        if seconds < 0:
            raise InvalidRequestError(f"ttl must be >= 0 (0: keep keys forever), got {ttl!r}", reason="invalid_option")
        fields["max_age"] = seconds
    if max_bytes is not None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes == 0 or max_bytes < -1:
            raise InvalidRequestError(f"max_bytes must be a positive integer (or -1: no size bound), got {max_bytes!r}",
                                      reason="invalid_option")
        fields["max_bytes"] = max_bytes
    return fields


async def ensure_ledger_bucket(conn: JetStreamConnection, bucket: str, *, create: bool, history: int,
                               ttl: float | str | timedelta | None, max_bytes: int | None,
                               replication: dict[str, Any]) -> dict[str, Any]:
    """Create the bucket (``create``) or bring it to what the ledger needs; returns its stream config.

    ``ttl``/``max_bytes``/``replication`` given: an existing bucket is changed to them; None: a new bucket
    gets the defaults (``ttl`` :data:`DEFAULT_TTL`) and an existing one keeps its own.
    """
    check_bucket_name(bucket)
    retention = _retention_fields(ttl, max_bytes)
    stream = stream_of(bucket)
    async with kv_errors(conn, bucket, f"ledger bucket {bucket!r}"):
        info = await find_stream(conn, stream)
        if info is None:
            if not create:
                raise LedgerNotFoundError(f"ledger bucket {bucket!r} does not exist; open it with create=True")
            age = retention.get("max_age", DEFAULT_TTL)
            try:
                await create_bucket(conn, replication, bucket=bucket, history=history, ttl=age or None,
                                    max_bytes=retention.get("max_bytes"), description="airflow-jetstream batch ledger")
            except Exception as exc:  # nats-py's error here; kv_errors maps what is raised on
                if getattr(exc, "err_code", None) != _NAME_IN_USE:
                    raise
                # another writer (a Spark write's other partition) created it meanwhile and set what it needs:
                # brought to what the ledger needs below like any existing bucket
            else:
                log.info("Created batch ledger bucket %s with %d replica(s); keys kept %s after their last change",
                         bucket, bucket_replicas(conn, replication), f"{age / 86400:g} d" if age else "forever")
        result = await ensure_stream(conn, {"name": stream, "allow_atomic": True, "allow_direct": True,
                                            **retention, **replication})
    config: dict[str, Any] = result["info"]["config"]
    if info is not None and result["action"] == "updated":
        log.info("Ledger bucket %s updated: %s", bucket, ", ".join(result["changed"]))
    if retention_of(config) == {"ttl": None, "max_bytes": None} and bucket not in _UNBOUNDED_WARNED:
        _UNBOUNDED_WARNED.add(bucket)
        log.warning("Ledger bucket %s keeps every key forever (no ttl, no max_bytes): open it once with "
                    "BatchLedger.open(conn, %r, ttl='30d') to bound it (docs/ledger.md, Retention)", bucket, bucket)
    return config
