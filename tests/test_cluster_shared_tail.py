"""The shared subscription of waiting triggers on a 3-node cluster: when the node holding its consumer dies, it
subscribes again on the others and every message stored meanwhile reaches its waiters once, in order."""

from __future__ import annotations

import asyncio
import uuid

import nats.errors
import nats.js.errors

from airflow_jetstream.client import ensure_stream, open_connection
from airflow_jetstream.client.reading.shared_tail import follow, tail_stats
from airflow_jetstream.embedded import EmbeddedNatsCluster
from tests.support.cluster_tools import cluster_settings
from tests.support.polling import async_wait_until, wait_for


def test_waiters_get_every_message_once_when_the_consumers_node_dies(
        nats_cluster_module: EmbeddedNatsCluster) -> None:
    cluster = nats_cluster_module
    stream = f"TAILC_{uuid.uuid4().hex[:6]}"
    settings = cluster_settings(cluster).with_overrides(request_timeout=5, leader_wait=30)

    async def stored(publisher, subject: str, n: int) -> bool:
        try:
            await publisher.js.publish(subject, str(n).encode(), timeout=5, headers={"Nats-Msg-Id": f"{stream}-{n}"})
        except (nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError,
                nats.js.errors.ServiceUnavailableError, nats.errors.TimeoutError, TimeoutError):
            return False
        return True

    async def collect(listener, count: int) -> list[bytes]:
        got: list[bytes] = []
        while len(got) < count:
            got.extend(m.data for m in await listener.next_batch())
        return got

    async def main() -> tuple[list[bytes], int, str, str]:
        async with open_connection(settings) as conn, open_connection(settings) as publisher:
            await ensure_stream(conn, {"name": stream, "subjects": [f"{stream}.>"], "num_replicas": 3})
            async with follow(conn, stream, f"{stream}.a") as first, follow(conn, stream, f"{stream}.*") as every:
                await publisher.js.publish(f"{stream}.a", b"0")
                assert await asyncio.wait_for(collect(first, 1), 30) == [b"0"]
                consumer = tail_stats(conn)[0].consumer
                node = await asyncio.to_thread(wait_for, lambda: cluster.consumer_leader(stream, consumer),
                                               "the node holding the shared consumer")
                await asyncio.to_thread(cluster.kill, node)
                try:
                    for n in range(1, 21):  # rides out the stream's election if its leader was there too
                        await async_wait_until(lambda n=n: stored(publisher, f"{stream}.{'ab'[n % 2]}", n),
                                               f"message {n} stored", timeout=60, every=0.25)
                    seen = await asyncio.wait_for(collect(every, 21), 60)
                    firsts = await asyncio.wait_for(collect(first, 10), 30)
                finally:
                    await asyncio.to_thread(cluster.restart, node)
                return seen, firsts, tail_stats(conn)[0].resubscribed, node

    seen, firsts, resubscribed, node = asyncio.run(main())
    assert seen == [str(n).encode() for n in range(21)], f"after killing {node}: {seen}"
    assert firsts == [str(n).encode() for n in range(2, 21, 2)]
    assert resubscribed >= 1
