"""Wait until a KV key exists, equals a value, or satisfies a function (a KV watch: no polling)."""

from __future__ import annotations

import json
import logging
from typing import Any

from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.kv.bucket import open_bucket
from airflow_jetstream.client.kv.condition import KeyCondition
from airflow_jetstream.client.kv.errors import kv_errors
from airflow_jetstream.client.kv.keys import entry_dict, get_key
from airflow_jetstream.client.kv.names import validate_key

_REMOVED = ("DEL", "PURGE")
log = logging.getLogger(__name__)


def _matched(entry: dict[str, Any], result: Any) -> dict[str, Any]:
    if isinstance(result, bool) or result is None:
        return entry
    try:
        json.dumps(result)
    except (TypeError, ValueError):
        result = repr(result)
    return {**entry, "result": result}


async def check_key(conn: JetStreamConnection, bucket: str, key: str, condition: KeyCondition) -> dict[str, Any] | None:
    """The key's entry when it satisfies ``condition`` now, else None."""
    entry = await get_key(conn, bucket, key)
    if entry is None:
        return None
    result = await condition.holds(entry)
    return _matched(entry, result) if result else None


async def wait_for_key(conn: JetStreamConnection, bucket: str, key: str, condition: KeyCondition) -> dict[str, Any]:
    """Watch ``key`` (its current value first, then every change) until ``condition`` holds; return the entry.

    A deleted or purged key does not exist. Cancel the task to stop waiting.
    """
    validate_key(key)
    kv = await open_bucket(conn, bucket)
    async with kv_errors(conn, bucket, f"KV bucket {bucket!r} key {key!r}"):
        watcher = await kv.watch(key)
    try:
        async for update in watcher:
            if update is None or update.operation in _REMOVED:
                continue  # "initial values done" marker, or the key was removed
            entry = entry_dict(bucket, update.key, update.revision, update.value, operation=update.operation,
                               created=update.created)
            result = await condition.holds(entry)
            if result:
                return _matched(entry, result)
            log.info("KV %s/%s at revision %d does not %s yet", bucket, key, update.revision, condition.describe())
    finally:
        if not conn.nc.is_closed:
            await watcher.stop()  # type: ignore[no-untyped-call]  # nats-py leaves it unannotated
    raise AssertionError("unreachable: a KV watch ends only when stopped")
