"""Batches on a 3-node cluster with R3 streams while the stream leader is SIGKILLed and restarted.

Atomic batches go through JetStreamAtomicBatchPublishOperator with the retries an Airflow task makes
(every batch whole, exactly once); a fast batch cut by an election reports exactly what the stream
holds and a resume stores no duplicate.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest

from airflow_jetstream.client.admin.streams import ensure_stream, stream_info
from airflow_jetstream.client.batches.fast import publish_fast_batch
from airflow_jetstream.client.batches.types import BatchMessage
from airflow_jetstream.client.connection import JetStreamConnection, open_connection
from airflow_jetstream.client.errors import FastBatchError
from airflow_jetstream.client.reading.range_read import read_range
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsCluster

FAST_TOTAL = 20_000


def cluster_settings(cluster: EmbeddedNatsCluster, **kwargs) -> ConnectionSettings:
    kwargs.setdefault("request_timeout", 2)
    return ConnectionSettings(servers=cluster.servers, connect_timeout=2, **kwargs)


async def payloads(conn: JetStreamConnection, stream: str) -> list[bytes]:
    info = await stream_info(conn, stream)
    out: list[bytes] = []
    async for chunk in read_range(conn, stream, 1, int(info["state"]["last_seq"])):
        out.extend(bytes(m[4]) for m in chunk)
    return out


async def kill_leader_when(cluster: EmbeddedNatsCluster, conn: JetStreamConnection, stream: str,
                           ready: Callable[[dict], bool], publisher: Awaitable) -> str:
    """Wait (bounded) until the stream's state satisfies ``ready`` while ``publisher`` runs, then
    SIGKILL the stream leader; returns its name."""
    task = asyncio.ensure_future(publisher)
    for _ in range(2000):
        if task.done() or ready((await stream_info(conn, stream))["state"]):
            break
        await asyncio.sleep(0.01)
    leader = cluster.stream_leader(stream)
    assert leader is not None
    await asyncio.to_thread(cluster.kill, leader)
    return leader


def fast_messages(tag: str, total: int = FAST_TOTAL) -> list[BatchMessage]:
    return [BatchMessage(f"{tag.lower()}.x", b"%s-%06d" % (tag.encode(), i)) for i in range(total)]


def test_fast_batch_rides_out_an_election_without_duplicates(nats_cluster_module: EmbeddedNatsCluster) -> None:
    cluster = nats_cluster_module
    msgs = fast_messages("FASTR")

    async def main():
        async with open_connection(cluster_settings(cluster)) as conn, \
                open_connection(cluster_settings(cluster)) as watcher:
            await ensure_stream(conn, {"name": "FASTR", "subjects": ["fastr.>"], "num_replicas": 3,
                                       "allow_batched": True})
            publisher = publish_fast_batch(conn, msgs)
            task = asyncio.ensure_future(publisher)
            leader = await kill_leader_when(cluster, watcher, "FASTR", lambda s: s["messages"] >= 2000,
                                            asyncio.shield(task))
            try:
                result = await task
            finally:
                await asyncio.to_thread(cluster.restart, leader)
            return result, await payloads(watcher, "FASTR")

    result, stored = asyncio.run(main())
    assert result.count == FAST_TOTAL
    assert stored == [m.data for m in msgs]


def test_fast_batch_cut_by_an_election_reports_what_is_stored(nats_cluster_module: EmbeddedNatsCluster) -> None:
    """With no time to wait for a new leader (leader_wait=0) the batch fails; ``stored`` is the stream's count
    of its messages, they are its first ones, and re-sending the rest leaves the stream exact."""
    cluster = nats_cluster_module
    msgs = fast_messages("FASTC")

    async def main():
        async with open_connection(cluster_settings(cluster, leader_wait=0)) as conn, \
                open_connection(cluster_settings(cluster)) as watcher:
            await ensure_stream(watcher, {"name": "FASTC", "subjects": ["fastc.>"], "num_replicas": 3,
                                          "allow_batched": True})
            task = asyncio.ensure_future(publish_fast_batch(conn, msgs))
            leader = await kill_leader_when(cluster, watcher, "FASTC", lambda s: s["messages"] >= 2000,
                                            asyncio.shield(task))
            try:
                with pytest.raises(FastBatchError) as caught:
                    await task
                in_stream = await payloads(watcher, "FASTC")
                err = caught.value
                resumed = await publish_fast_batch(watcher, msgs[err.stored:])
            finally:
                await asyncio.to_thread(cluster.restart, leader)
            return err, in_stream, resumed, await payloads(watcher, "FASTC")

    err, in_stream, resumed, final = asyncio.run(main())
    assert err.stored is not None and 0 < err.stored < FAST_TOTAL
    assert err.stored == len(in_stream)
    assert in_stream == [m.data for m in msgs[:err.stored]]
    assert err.to_dict()["stored"] == err.stored
    assert resumed.count == FAST_TOTAL - err.stored
    assert final == [m.data for m in msgs]
    assert max(Counter(final).values()) == 1
