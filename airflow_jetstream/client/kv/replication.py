"""Replicas and placement of KV buckets (the user's, the batch ledger's and the job records').

A bucket is the stream ``KV_<bucket>``. Unset options give a new bucket
:func:`~airflow_jetstream.client.admin.streams.default_replicas` (3 on a cluster) and leave an
existing one as it is; given options change an existing bucket's stream to them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nats.js.api import Placement, StreamConfig, StreamInfo
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from airflow_jetstream.client.admin.streams import default_replicas, ensure_stream
from airflow_jetstream.client.connection import JetStreamConnection


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


async def ensure_bucket_replication(conn: JetStreamConnection, bucket: str, replication: dict[str, Any]) -> bool:
    """Change an existing bucket's replicas/placement to the given ones; True when it changed."""
    if not replication:
        return False
    result = await ensure_stream(conn, {"name": f"KV_{bucket}", **replication})
    return bool(result["action"] == "updated")
