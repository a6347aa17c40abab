"""Helpers for tests on the embedded 3-node cluster: settings, bounded waits, leader moves, bulk publish."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from airflow_jetstream.client.connection import JetStreamConnection, open_connection
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsCluster

T = TypeVar("T")


def cluster_settings(cluster: EmbeddedNatsCluster) -> ConnectionSettings:
    return ConnectionSettings(servers=cluster.servers, connect_timeout=2, request_timeout=3)


def call(cluster: EmbeddedNatsCluster, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``await func(conn, *args, **kwargs)`` on a fresh connection to the cluster."""
    async def main() -> Any:
        async with open_connection(cluster_settings(cluster)) as conn:
            return await func(conn, *args, **kwargs)

    return asyncio.run(main())


def wait_for(predicate: Callable[[], T], what: str, limit: float = 60.0) -> T:
    """Poll ``predicate`` (bounded) until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {limit}s waiting for {what}")


def move_leader_off(cluster: EmbeddedNatsCluster, stream: str, avoid: str) -> str:
    """Step the leader of ``stream`` down until it is not node ``avoid`` (bounded); returns the leader."""
    for _ in range(10):
        leader = wait_for(lambda: cluster.stream_leader(stream), f"a leader of {stream}")
        if leader != avoid:
            return leader
        call(cluster, lambda conn: conn.api_request(f"STREAM.LEADER.STEPDOWN.{stream}"))
        wait_for(lambda: cluster.stream_leader(stream) not in (None, avoid), f"{stream}'s leader to move off {avoid}",
                 limit=15)
    pytest.fail(f"the leader of {stream} stayed on {avoid}")


async def publish_numbered(conn: JetStreamConnection, subject: str, first: int, last: int, *,
                           window: int = 500) -> None:
    """Publish messages ``first..last`` (payload and ``Nats-Msg-Id`` = the number), ``window`` in flight."""
    for start in range(first, last + 1, window):
        numbers = range(start, min(start + window, last + 1))
        await asyncio.gather(*(conn.js.publish(subject, str(n).encode(), headers={"Nats-Msg-Id": f"m{n}"},
                                               timeout=30) for n in numbers))
