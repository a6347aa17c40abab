"""Helpers for tests on the embedded 3-node cluster: settings, bounded waits, leader moves, bulk publish."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest

from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsCluster
from tests.support.nats_calls import call_on_server
from tests.support.polling import wait_for, wait_until


def cluster_settings(cluster: EmbeddedNatsCluster) -> ConnectionSettings:
    return ConnectionSettings(servers=cluster.servers, connect_timeout=2, request_timeout=3)


def call(cluster: EmbeddedNatsCluster, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``await func(conn, *args, **kwargs)`` on a fresh connection to the cluster."""
    return call_on_server(cluster_settings(cluster), func, *args, **kwargs)


def move_leader_off(cluster: EmbeddedNatsCluster, stream: str, avoid: str) -> str:
    """Step the leader of ``stream`` down until it is not node ``avoid`` (bounded); returns the leader.

    A step-down hands the leadership to a peer that answered a heartbeat in the last 3 s; with none (a peer slow
    on a loaded box) or the hand-over lost, the replicas elect, and the node that stepped down, with the longest
    log, can win again. A leader on ``avoid`` 15 s after a step-down is stepped down again, not a failure."""
    for _ in range(10):
        leader = wait_for(lambda: cluster.stream_leader(stream), f"a leader of {stream}")
        if leader != avoid:
            return leader
        call(cluster, lambda conn: conn.api_request(f"STREAM.LEADER.STEPDOWN.{stream}"))
        with contextlib.suppress(AssertionError):  # still (or again) on avoid: the next round steps it down again
            wait_until(lambda: cluster.stream_leader(stream) not in (None, avoid),
                       f"{stream}'s leader to move off {avoid}", timeout=15, every=0.2)
    pytest.fail(f"the leader of {stream} stayed on {avoid}")


async def publish_numbered(conn: JetStreamConnection, subject: str, first: int, last: int, *,
                           window: int = 500) -> None:
    """Publish messages ``first..last`` (payload and ``Nats-Msg-Id`` = the number), ``window`` in flight."""
    for start in range(first, last + 1, window):
        numbers = range(start, min(start + window, last + 1))
        await asyncio.gather(*(conn.js.publish(subject, str(n).encode(), headers={"Nats-Msg-Id": f"m{n}"},
                                               timeout=30) for n in numbers))
