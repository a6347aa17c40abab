"""Open a KV bucket, or ensure it exists with the given config (created, updated in place, or left alone); the
replicas and placement of every bucket the provider creates (the user's, the batch ledger's, the job records').

A bucket ``B`` is the stream ``KV_B`` holding subjects ``$KV.B.<key>``; its ``history`` is the
stream's ``max_msgs_per_subject`` and its ``ttl`` the stream's ``max_age``. Fields not given keep
their current values on an existing bucket (a re-run never changes replicas it was not told to). Unset
replication gives a new bucket :func:`~airflow_jetstream.client.admin.streams.default_replicas` (3 on a cluster).
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import nats.errors
import nats.js.errors
from nats.js.api import Placement, StorageType, StreamConfig, StreamInfo
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from airflow_jetstream.client.admin.streams import default_replicas, ensure_stream, replication_config
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.kv.errors import kv_errors
from airflow_jetstream.client.kv.names import check_bucket, stream_of

MAX_HISTORY = 64


async def open_bucket(conn: JetStreamConnection, bucket: str) -> KeyValue:
    """nats-py's ``KeyValue`` of an existing bucket, or :class:`BucketNotFoundError`."""
    check_bucket(bucket)
    async with kv_errors(conn, bucket, f"KV bucket {bucket!r}"):
        return await conn.js.key_value(bucket)


def _check_history(history: Any) -> int | None:
    if history is None:
        return None
    if isinstance(history, bool) or not isinstance(history, int) or not 1 <= history <= MAX_HISTORY:
        raise InvalidRequestError(f"history must be a whole number from 1 to {MAX_HISTORY}, got {history!r}",
                                  reason="invalid_option")
    return history


async def ensure_bucket(conn: JetStreamConnection, bucket: str, *, history: int | None = None,
                        ttl: float | str | timedelta | None = None, num_replicas: int | None = None,
                        max_value_size: int | None = None, max_bytes: int | None = None, storage: str | None = None,
                        description: str | None = None, placement: dict[str, Any] | None = None) -> dict[str, Any]:
    """Create the bucket, update the given fields where they differ, or leave it alone.

    ``ttl`` is seconds (or a timedelta, or a string like ``"7d"``) after which values expire. A new
    bucket without ``num_replicas`` gets 3 replicas on a cluster, else 1 (``default_replicas``).
    ``placement`` (``{"cluster": ..., "tags": [...]}``) puts its replicas on matching servers; one
    the cluster cannot meet is :class:`~airflow_jetstream.client.errors.PlacementError`, nothing created.
    Returns ``{"bucket", "action": "created" | "updated" | "unchanged", "changed", "history", "ttl",
    "num_replicas", "placement", "storage", "values"}``.
    """
    check_bucket(bucket)
    history = _check_history(history)
    replication = replication_config(num_replicas, placement)
    if storage is not None and storage not in ("file", "memory"):
        raise InvalidRequestError(f"storage must be 'file' or 'memory', got {storage!r}", reason="invalid_option")
    ttl_seconds = None if ttl is None else to_seconds(ttl, field="ttl")
    wanted = {"max_msgs_per_subject": history, "max_age": ttl_seconds, "max_msg_size": max_value_size,
              "max_bytes": max_bytes, "storage": storage, "description": description, **replication}
    wanted = {k: v for k, v in wanted.items() if v is not None}
    context = f"KV bucket {bucket!r}"
    async with kv_errors(conn, bucket, context):
        try:
            await conn.js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            await create_bucket(
                conn, replication, bucket=bucket, history=history or 1, ttl=ttl_seconds or None,
                max_value_size=max_value_size, max_bytes=max_bytes, description=description,
                storage=StorageType(storage) if storage else None,
            )
            action, changed = "created", sorted(wanted)
        else:
            result = await ensure_stream(conn, {"name": stream_of(bucket), **wanted})
            action, changed = result["action"], result["changed"]
        status = await conn.js.stream_info(stream_of(bucket))
    cfg = status.config
    return {"bucket": bucket, "action": action, "changed": changed, "history": cfg.max_msgs_per_subject,
            "ttl": cfg.max_age or None, "num_replicas": cfg.num_replicas,
            "placement": _placement_dict(cfg.placement),
            "storage": str(getattr(cfg.storage, "value", cfg.storage)), "values": status.state.messages}


def _placement_dict(placement: Any) -> dict[str, Any] | None:
    """The bucket stream's placement as JSON-able ``{"cluster", "tags"}`` (set keys only), or None."""
    if placement is None:
        return None
    out = {"cluster": placement.cluster, "tags": list(placement.tags or [])}
    return {k: v for k, v in out.items() if v} or None


def bucket_replicas(conn: JetStreamConnection, replication: dict[str, Any]) -> int:
    """The replicas a new bucket gets: the given ones, else :func:`default_replicas`."""
    return replication.get("num_replicas") or default_replicas(conn)


async def create_bucket(conn: JetStreamConnection, replication: dict[str, Any], **kwargs: Any) -> KeyValue:
    """nats-py's ``create_key_value(**kwargs)`` with ``replication``'s replicas and placement.

    ``replication`` is :func:`~airflow_jetstream.client.admin.streams.replication_config`'s output.
    nats-py (2.16) builds the bucket's stream config without the placement it is given, so a placed
    bucket is created through :class:`_PlacingContext`, a JetStream context of the same connection.
    """
    placement = replication.get("placement")
    js = _PlacingContext(conn, Placement(**placement)) if placement else conn.js
    return await js.create_key_value(replicas=bucket_replicas(conn, replication), **kwargs)


class _PlacingContext(JetStreamContext):
    """nats-py's JetStream context whose ``add_stream`` gives each stream it creates one placement."""

    def __init__(self, conn: JetStreamConnection, placement: Placement) -> None:
        super().__init__(conn.nc, prefix=conn.api_prefix, timeout=conn.settings.request_timeout)
        self.placement = placement

    async def add_stream(self, config: StreamConfig | None = None, **params: Any) -> StreamInfo:
        placed = dataclasses.replace(config or StreamConfig(), placement=self.placement)
        return await super().add_stream(placed, **params)
