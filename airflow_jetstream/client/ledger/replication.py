"""Replicas and placement of the provider's KV buckets (the batch ledger and the job records).

A bucket is the stream ``KV_<bucket>``. Unset options give a new bucket
:func:`~airflow_jetstream.client.admin.streams.default_replicas` (3 on a cluster) and leave an
existing one as it is; given options change an existing bucket's stream to them.
"""

from __future__ import annotations

from typing import Any

from nats.js.api import Placement

from airflow_jetstream.client.admin.streams import default_replicas, ensure_stream
from airflow_jetstream.client.connection import JetStreamConnection


def kv_replication(conn: JetStreamConnection, replication: dict[str, Any]) -> dict[str, Any]:
    """``replicas``/``placement`` keyword arguments for nats-py's ``create_key_value``.

    ``replication`` is :func:`~airflow_jetstream.client.admin.streams.replication_config`'s output.
    """
    placement = replication.get("placement")
    return {"replicas": replication.get("num_replicas") or default_replicas(conn),
            "placement": Placement(**placement) if placement else None}


async def ensure_bucket_replication(conn: JetStreamConnection, bucket: str, replication: dict[str, Any]) -> bool:
    """Change an existing bucket's replicas/placement to the given ones; True when it changed."""
    if not replication:
        return False
    result = await ensure_stream(conn, {"name": f"KV_{bucket}", **replication})
    return result["action"] == "updated"
