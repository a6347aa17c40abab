"""Range reads (behind the Spark reader) on a 3-node cluster across a SIGKILL and restart mid-read: of the
node holding the R1 read consumer, or (direct get) of the server the client is connected to."""

from __future__ import annotations

import asyncio

import pytest

from airflow_jetstream.client.admin.streams import ensure_stream
from airflow_jetstream.client.batches.fast import publish_fast_batch
from airflow_jetstream.client.batches.types import BatchMessage
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.reading.stored import read_range
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsCluster

TOTAL = 10_000


def cluster_settings(cluster: EmbeddedNatsCluster, **kwargs) -> ConnectionSettings:
    return ConnectionSettings(servers=cluster.servers, connect_timeout=2, request_timeout=2, **kwargs)


@pytest.mark.parametrize("via", ["consumer", "direct"])
def test_read_range_continues_across_a_leader_kill_and_restart(
    nats_cluster_module: EmbeddedNatsCluster, via: str
) -> None:
    cluster = nats_cluster_module
    name = f"READ{via.upper()}"
    sent = [b"m-%05d" % i for i in range(TOTAL)]

    async def main() -> tuple[list[int], list[bytes], list[dict]]:
        async with open_connection(cluster_settings(cluster)) as conn:
            await ensure_stream(conn, {"name": name, "subjects": [f"{name.lower()}.>"], "num_replicas": 3,
                                       "allow_batched": True, "allow_direct": True})
            await publish_fast_batch(conn, [BatchMessage(f"{name.lower()}.x", data) for data in sent])
            seqs: list[int] = []
            data: list[bytes] = []
            read_consumers: list[dict] = []
            killed = None
            try:
                async for chunk in read_range(conn, name, 1, TOTAL, via=via, batch=1000):
                    seqs.extend(m[1] for m in chunk)
                    data.extend(bytes(m[4]) for m in chunk)
                    if killed is None:
                        listing = await conn.api_request(f"CONSUMER.LIST.{name}", {"offset": 0})
                        read_consumers = [c["config"] for c in listing.get("consumers") or []]
                        if via == "consumer":  # the node holding the R1 read consumer
                            killed = cluster.consumer_leader(name, read_consumers[0]["name"])
                        else:  # direct gets are answered by any replica: kill the client's own server
                            port = conn.nc.connected_url.port
                            killed = next(n.name for n in cluster.nodes if n.port == port)
                        await asyncio.to_thread(cluster.kill, killed)
            finally:
                if killed:
                    await asyncio.to_thread(cluster.restart, killed)
            return seqs, data, read_consumers

    seqs, data, read_consumers = asyncio.run(main())
    assert seqs == list(range(1, TOTAL + 1))
    assert data == sent
    if via == "consumer":
        assert read_consumers, "the read consumer was expected to exist while reading"
        assert all(c.get("num_replicas") == 1 and c.get("mem_storage") is True for c in read_consumers)
    else:
        assert read_consumers == []


def test_reads_right_after_a_restart_are_complete(nats_cluster_module: EmbeddedNatsCluster) -> None:
    """A node that was down misses messages and catches up after its restart; reads served by it in that
    time (an R1 read consumer placed on it, a direct get it answers) must still return everything."""
    cluster = nats_cluster_module
    name = "READRESTART"

    async def main() -> list[tuple[str, int]]:
        async with open_connection(cluster_settings(cluster)) as conn:
            await ensure_stream(conn, {"name": name, "subjects": [f"{name.lower()}.>"], "num_replicas": 3,
                                       "allow_batched": True, "allow_direct": True})
            leader = cluster.stream_leader(name)
            down = next(n.name for n in cluster.nodes if n.name != leader and n.port != conn.nc.connected_url.port)
            await asyncio.to_thread(cluster.kill, down)
            try:
                await publish_fast_batch(conn, [BatchMessage(f"{name.lower()}.x", b"%d" % i) for i in range(TOTAL)])
            finally:
                await asyncio.to_thread(cluster.restart, down)
            counts = []
            for via in ("consumer", "direct", "consumer", "direct"):
                seqs = [m[1] async for chunk in read_range(conn, name, 1, TOTAL, via=via) for m in chunk]
                counts.append((via, len(seqs) if seqs == list(range(1, len(seqs) + 1)) else -1))
            return counts

    counts = asyncio.run(main())
    assert counts == [(via, TOTAL) for via in ("consumer", "direct", "consumer", "direct")]


def test_direct_read_of_several_subjects_returns_each_message_once(settings: ConnectionSettings) -> None:
    """Direct get reads one subject after the other; the end-of-read check against the leader must not
    take the other subjects' later sequences for a short read (single server)."""

    async def main() -> list[int]:
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": "MULTI", "subjects": ["multi.>"], "allow_batched": True,
                                       "allow_direct": True})
            await publish_fast_batch(conn, [BatchMessage(f"multi.{'ab'[i % 2]}", b"%d" % i) for i in range(200)])
            return [m[1] async for chunk in read_range(conn, "MULTI", 1, 200, subjects=("multi.b", "multi.a"),
                                                        via="direct", batch=30) for m in chunk]

    seqs = asyncio.run(main())
    assert sorted(seqs) == list(range(1, 201))
    assert seqs == list(range(2, 201, 2)) + list(range(1, 201, 2))
