"""The batch ledger's listing on a 3-node cluster right after a node restart: the restarted node catches up
for a while, and a listing served by it (its R1 read consumer placed there) returned only the records it had
so far, so a Spark writer's re-run published chunks again that the ledger held (LedgerConflictError)."""

from __future__ import annotations

import asyncio

from airflow_jetstream.client.admin.streams import ensure_stream
from airflow_jetstream.client.batches.fast import publish_fast_batch
from airflow_jetstream.client.batches.types import BatchMessage
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.embedded import EmbeddedNatsCluster
from tests.support.cluster_tools import cluster_settings

RECORDS = 40
LISTINGS = 10  # each read consumer lands on one of 3 nodes: 10 listings all miss the lagging one in 1.7%


def test_listings_right_after_a_restart_hold_every_record(nats_cluster_module: EmbeddedNatsCluster) -> None:
    cluster = nats_cluster_module

    async def main() -> list[int]:
        async with open_connection(cluster_settings(cluster)) as conn:
            ledger = await BatchLedger.open(conn, "listing", replicas=3)
            await ensure_stream(conn, {"name": "LISTDATA", "subjects": ["listdata.>"], "num_replicas": 3,
                                       "allow_batched": True})
            down = cluster.stream_leader("LISTDATA")
            await asyncio.to_thread(cluster.kill, down)
            try:  # as in a Spark write: data chunks, each recorded in the ledger, while the node is down
                for index in range(RECORDS):
                    result = await publish_fast_batch(conn, [BatchMessage("listdata.x", b"%d" % i)
                                                             for i in range(500)])
                    await ledger.record("run", f"chunk-{index}", stream=result.stream, count=result.count,
                                        last_seq=result.last_seq)
            finally:
                await asyncio.to_thread(cluster.restart, down)
            return [len([rec async for rec in ledger.iter_batches("run")]) for _ in range(LISTINGS)]

    assert asyncio.run(main()) == [RECORDS] * LISTINGS


def test_a_write_tasks_lookups_right_after_a_restart_see_every_recorded_chunk(
        nats_cluster_module: EmbeddedNatsCluster) -> None:
    """A Spark write task asks the ledger only about its own chunks; on a cluster it asks the stream leader, so a
    replica still catching up after a restart cannot make it publish a recorded chunk again."""
    from airflow_jetstream.spark.writer import PartitionLedger, chunk_id

    cluster = nats_cluster_module

    async def main() -> list[int]:
        async with open_connection(cluster_settings(cluster)) as conn:
            ledger = await BatchLedger.open(conn, "lookups", replicas=3)
            down = next(node.name for node in cluster.nodes if node.name != cluster.stream_leader("KV_lookups"))
            await asyncio.to_thread(cluster.kill, down)
            try:
                for index in range(RECORDS):
                    await ledger.record("job", chunk_id("job", 0, index), stream="LISTDATA", count=1)
            finally:
                await asyncio.to_thread(cluster.restart, down)
            seen = []
            for _ in range(LISTINGS):
                task = PartitionLedger(ledger, "job", "job", 0)
                seen.append(len([c for c in range(RECORDS) if await task.recorded(c)]))
            return seen

    assert asyncio.run(main()) == [RECORDS] * LISTINGS
