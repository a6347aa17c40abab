"""A consume job's decisions read the ledger at the stream leader, never from a replica that lags.

Direct gets (what a ledger read uses for speed) are answered by any member of the stream's direct group, and a
replica still applying the latest writes answers from before them. Here that replica is made to lag for good: a
mirror of the ledger stream in the direct group (``mirror_direct``) that stopped at the records' first writes
(``max_msgs`` with ``discard: new``), the only direct responder (the origin's ``allow_direct`` off). Before, a retry
read its run's counts that way: it saw no other attempt's claims and read batches held by one, or saw a run an
earlier attempt had consumed as not consumed and replaced that attempt's output with its own empty read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from airflow_jetstream.client import ConnectionSettings
from airflow_jetstream.client.connection import JetStreamConnection, open_connection
from airflow_jetstream.client.errors import LedgerConflictError
from airflow_jetstream.client.kv.names import stream_of
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.embedded import EmbeddedNatsCluster

BATCHES = 3


async def _lagging_replica(conn: JetStreamConnection, bucket: str) -> None:
    """A direct responder for ``bucket`` on node n2 that keeps the bucket as it is now, and the only one."""
    stream = stream_of(bucket)
    info = await conn.api_request(f"STREAM.INFO.{stream}")
    stored = int(info["state"]["messages"])
    await conn.api_request(f"STREAM.CREATE.{bucket}_LAG", {
        "name": f"{bucket}_LAG", "mirror": {"name": stream}, "mirror_direct": True, "num_replicas": 1,
        "max_msgs": stored, "discard": "new", "placement": {"tags": ["node:n2"]}})
    for _ in range(200):
        mirrored = await conn.api_request(f"STREAM.INFO.{bucket}_LAG")
        if int(mirrored["state"]["messages"]) == stored:
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail(f"the mirror of {stream} did not reach {stored} messages: {mirrored['state']}")
    await conn.api_request(f"STREAM.UPDATE.{stream}", {**info["config"], "allow_direct": False})


def _run(cluster: EmbeddedNatsCluster, bucket: str, before: Callable[[BatchLedger], Awaitable[Any]]) -> Any:
    """Record a run of ``BATCHES`` batches in a bucket on n1, let a replica lag behind that, change the run with
    ``before`` (another attempt), then let a retry on n2 claim the run: its result or its error, and the summaries
    the lagging replica and the leader give afterwards."""

    async def main() -> tuple[Any, dict[str, Any], dict[str, Any]]:
        settings = ConnectionSettings(servers=cluster.node("n1").url, request_timeout=10)
        async with open_connection(settings) as conn:
            ledger = await BatchLedger.open(conn, bucket, replicas=1, placement={"tags": ["node:n1"]},
                                            visibility_timeout="1h")
            for i in range(BATCHES):
                await ledger.record("run", f"b{i}", stream="S", count=10)
            await _lagging_replica(conn, bucket)
            await before(ledger)
        settings = ConnectionSettings(servers=cluster.node("n2").url, request_timeout=10)
        async with open_connection(settings) as conn:
            retry = BatchLedger(conn, bucket, visibility_timeout="1h")
            try:
                outcome: Any = await retry.claim_run("run", owner="retry")
            except LedgerConflictError as exc:
                outcome = exc
            return outcome, await retry.summary("run"), await retry.summary("run", leader=True)

    return asyncio.run(main())


def test_a_retry_sees_the_claims_another_attempt_holds_through_a_lagging_replica(
        nats_cluster_module: EmbeddedNatsCluster) -> None:
    async def zombie_claims_one(ledger: BatchLedger) -> None:
        assert len(await ledger.claim_available("run", owner="zombie", limit=1)) == 1

    outcome, lagging, leader = _run(nats_cluster_module, "stale_held", zombie_claims_one)
    assert lagging["states"] == {"published": BATCHES, "in_progress": 0, "consumed": 0, "failed": 0}, \
        "the replica does not lag: the test tests nothing"
    assert isinstance(outcome, LedgerConflictError), f"the retry claimed the run under the zombie's claim: {outcome}"
    assert "1 batch(es) are claimed by another attempt" in str(outcome)
    assert leader["states"] == {"published": BATCHES - 1, "in_progress": 1, "consumed": 0, "failed": 0}, leader


def test_a_retry_sees_a_run_an_earlier_attempt_consumed_through_a_lagging_replica(
        nats_cluster_module: EmbeddedNatsCluster) -> None:
    async def earlier_attempt_consumes(ledger: BatchLedger) -> None:
        await ledger.settle(await ledger.claim_available("run", owner="earlier"))

    outcome, lagging, leader = _run(nats_cluster_module, "stale_consumed", earlier_attempt_consumes)
    assert lagging["states"]["consumed"] == 0, "the replica does not lag: the test tests nothing"
    assert outcome == ([], True), f"the retry did not see the run consumed: {outcome}"
    assert leader["states"]["consumed"] == BATCHES, leader
