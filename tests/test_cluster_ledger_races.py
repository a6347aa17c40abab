"""Writers of one ledger key, and claimers of one claims key, racing on a 3-node cluster. A write whose key
another write is still putting through the stream leader is refused with 10164 ("last sequence by subject
mismatch", no sequence), not 10071: nothing was stored, so it is a lost compare-and-set like the other. It failed
a Spark write's re-run (two partitions recording chunks of one run, whose counts shard both change) with
BatchPublishError(wrong_last_sequence)."""

from __future__ import annotations

import asyncio

from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.kv.keys import claim, open_claims
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.ledger.store import CasConflict, Write, read_last, write
from airflow_jetstream.embedded import EmbeddedNatsCluster
from tests.support.cluster_tools import cluster_settings

ROUNDS = 5
WRITERS = 20


def test_racing_writes_of_one_key_end_in_one_write_and_cas_conflicts(nats_cluster_module: EmbeddedNatsCluster) -> None:
    async def main() -> list[list[object]]:
        async with open_connection(cluster_settings(nats_cluster_module)) as conn:
            await BatchLedger.open(conn, "races", replicas=3)
            outcomes = []
            for _ in range(ROUNDS):
                last = (await read_last(conn, "races", ["run./counts.0"], leader=True)).get("run./counts.0")
                expected = last.seq if last is not None else 0
                attempts = [write(conn, "races", [Write(f"run.b{i}", b"{}", 0), Write("run./counts.0", b"%d" % i,
                                                                                        expected)], context="race")
                            for i in range(WRITERS)]
                outcomes.append(await asyncio.gather(*attempts, return_exceptions=True))
            return outcomes

    for outcomes in asyncio.run(main()):
        assert [o for o in outcomes if not isinstance(o, (int, CasConflict))] == [], "a lost race must be CasConflict"
        assert sum(isinstance(o, int) for o in outcomes) == 1, outcomes


def test_two_processes_recording_one_run_keep_every_record_and_its_counts(
        nats_cluster_module: EmbeddedNatsCluster) -> None:
    """Two connections (a Spark write's two partitions) record 200 batches of one run at once: all recorded,
    and the run's counts equal its records."""

    async def writer(offset: int) -> None:
        async with open_connection(cluster_settings(nats_cluster_module)) as conn:
            ledger = await BatchLedger.open(conn, "races_run", replicas=3)
            await asyncio.gather(*(ledger.record("run", f"b{offset + i}", stream="S", count=1, last_seq=offset + i + 1)
                                   for i in range(100)))

    async def main() -> tuple[dict, dict]:
        async with open_connection(cluster_settings(nats_cluster_module)) as conn:  # as the Spark driver does
            await BatchLedger.open(conn, "races_run", replicas=3)
        await asyncio.gather(writer(0), writer(100))
        async with open_connection(cluster_settings(nats_cluster_module)) as conn:
            ledger = BatchLedger(conn, "races_run")
            return await ledger.summary("run"), await ledger.recount("run")

    summary, recount = asyncio.run(main())
    assert summary["batches"] == 200
    assert recount["drift"] == {} and recount["shards"] == [], recount


def test_racing_claims_of_one_key_make_one_claim_and_no_error(nats_cluster_module: EmbeddedNatsCluster) -> None:
    """process_each_once in several runs at once (a burst's event-driven runs) claim one message: on a cluster a
    loser may be refused with 10164 while the winner's claim is still in flight at the leader, and reads nothing
    yet. Each loser must come back with None (claimed by someone), none with an error."""

    async def main() -> list[list[object]]:
        async with open_connection(cluster_settings(nats_cluster_module)) as conn:
            await open_claims(conn, "race_claims", ttl="1h")
            rounds = []
            for round_no in range(ROUNDS):
                attempts = [claim(conn, "race_claims", f"ORDERS.{round_no}", {"run": i}) for i in range(WRITERS)]
                rounds.append(await asyncio.gather(*attempts, return_exceptions=True))
            return rounds

    for outcomes in asyncio.run(main()):
        assert [o for o in outcomes if not (o is None or isinstance(o, int))] == [], outcomes
        assert sum(isinstance(o, int) for o in outcomes) == 1, outcomes
