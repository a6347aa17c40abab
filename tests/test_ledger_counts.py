"""The batch ledger's per-run counts against a real nats-server: one request per look whatever the run's size,
true under concurrent writers, runs recorded without counts, dead claims and a Spark task's own lookups."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from airflow_jetstream.client import ConnectionSettings, open_connection
from airflow_jetstream.client.connection import connect
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.ledger.records import SHARDS, batch_key, counts_key, shard_of
from airflow_jetstream.client.ledger.wait import LedgerWait
from tests.support.kv_keys import kv_keys
from tests.support.nats_calls import requests_of

RUN = "manual__2026-11-27T10:00:00+00:00"


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def bucket_name() -> str:
    return f"counts_{uuid.uuid4().hex[:10]}"


def run(settings: ConnectionSettings, scenario):
    async def go():
        async with open_connection(dataclass_timeout(settings)) as conn:
            return await scenario(conn)

    return asyncio.run(go())


def dataclass_timeout(settings: ConnectionSettings) -> ConnectionSettings:
    import dataclasses

    return dataclasses.replace(settings, request_timeout=20)


async def record_many(ledger: BatchLedger, run_id: str, count: int, prefix: str = "b") -> None:
    await asyncio.gather(*(ledger.record(run_id, f"{prefix}{i:05d}", stream="ORDERS", count=10)
                           for i in range(count)))


def test_a_look_at_a_run_is_one_request_whatever_its_size(settings):
    """The poke reads the run's counts: one direct get for 5 batches and for 3,000, reaping or not while no claim
    can have expired (today's listing read every key through a consumer of its own: a STREAM.INFO, a consumer
    create, pulls growing with the run; the reaper listed the run again)."""
    bucket = bucket_name()

    async def scenario(conn):
        ledger = await BatchLedger.open(conn, bucket)
        await record_many(ledger, "small", 5)
        await record_many(ledger, "large", 3000)
        await ledger.claim("large", "b00007", owner="alive")  # a claim in progress, its deadline ahead
        looks = {}
        for run_id in ("small", "large"):
            for reap in (False, True):
                with requests_of(conn) as sent:
                    status = await LedgerWait(run_id, "published", bucket, reap=reap).check(conn)
                looks[run_id, reap] = (sent, status)
        return looks

    looks = run(settings, scenario)
    for (run_id, reap), (sent, status) in looks.items():
        batches = 5 if run_id == "small" else 3000
        assert sent == [f"$JS.API.DIRECT.GET.KV_{bucket}"], (run_id, reap)
        assert status["done"] and status["batches"] == batches and status["counted_by"] == "counts"
        assert status["messages"]["published"] + status["messages"]["in_progress"] == batches * 10


def test_counts_stay_true_under_writers_of_several_processes(settings):
    """Four connections (four processes' worth of lanes) record, claim, release and consume the same run at
    once: every counts shard equals a count of its records, and the summary is the recount."""
    bucket = bucket_name()
    writers = 4

    async def scenario(conn):
        await BatchLedger.open(conn, bucket)
        conns = [await connect(dataclass_timeout(settings)) for _ in range(writers)]
        try:
            ledgers = [BatchLedger(c, bucket, max_attempts=2) for c in conns]

            async def worker(n: int) -> None:
                ledger = ledgers[n]
                await record_many(ledger, RUN, 150, prefix=f"w{n}-")
                for i in range(0, 150, 3):
                    claim = await ledgers[(n + 1) % writers].claim(RUN, f"w{n}-{i:05d}", owner=f"c{n}")
                    if i % 2:
                        await ledger.release(claim, error="boom")
                    else:
                        await ledger.mark_consumed(claim)

            await asyncio.gather(*(worker(n) for n in range(writers)))
        finally:
            for c in conns:
                await c.close()
        ledger = BatchLedger(conn, bucket)
        return await ledger.summary(RUN), await ledger.recount(RUN)

    summary, recount = run(settings, scenario)
    assert recount["drift"] == {} and recount["shards"] == []
    assert summary["batches"] == writers * 150
    assert summary["states"] == {"published": writers * (100 + 25), "in_progress": 0, "consumed": writers * 25,
                                 "failed": 0}
    assert summary["attempts"] == writers * 50


def test_a_run_recorded_without_counts_is_listed_then_counted_on_its_first_change(settings):
    """Runs an older version recorded (records alone) are summarised by a listing (``counted_by: listing``);
    the first change through this version counts the run, and from then on a look reads the counts."""
    bucket = bucket_name()

    async def scenario(conn):
        ledger = await BatchLedger.open(conn, bucket)
        kv = await conn.js.key_value(bucket)
        for i in range(40):  # what an older version wrote: the record alone
            await kv.create(batch_key(RUN, f"old{i:02d}"), json.dumps({
                "run_id": RUN, "batch_id": f"old{i:02d}", "stream": "ORDERS", "count": 2, "state": "published",
                "attempts": 0, "created_at": "2026-01-01T00:00:00+00:00",
                "updated_at": "2026-01-01T00:00:00+00:00"}).encode())
        listed = await ledger.summary(RUN)
        claim = await ledger.claim(RUN, "old07", owner="new-version")
        await ledger.record(RUN, "new00", stream="ORDERS", count=5)
        return listed, claim, await ledger.summary(RUN), await ledger.recount(RUN)

    listed, claim, counted, recount = run(settings, scenario)
    assert listed["counted_by"] == "listing" and listed["batches"] == 40
    assert claim is not None and claim.attempts == 1
    assert counted["counted_by"] == "counts" and counted["batches"] == 41
    assert counted["states"] == {"published": 40, "in_progress": 1, "consumed": 0, "failed": 0}
    assert recount["drift"] == {}


def test_the_reaper_reads_only_the_counts_until_a_claim_may_have_expired(settings):
    clock = Clock()
    bucket = bucket_name()

    async def scenario(conn):
        ledger = await BatchLedger.open(conn, bucket, visibility_timeout=60, max_attempts=1, clock=clock)
        await record_many(ledger, RUN, 300)
        claims = await ledger.claim_available(RUN, owner="worker", limit=5)
        with requests_of(conn) as early:
            nothing = await ledger.reap(RUN)
        clock.now += 61  # every claim expired: max_attempts 1 makes each a dead letter
        reaped = await ledger.reap(RUN)
        with requests_of(conn) as after:
            again = await ledger.reap(RUN)
        return claims, early, nothing, reaped, after, again, await ledger.summary(RUN)

    claims, early, nothing, reaped, after, again, summary = run(settings, scenario)
    assert len(claims) == 5
    assert early == [f"$JS.API.DIRECT.GET.KV_{bucket}"] and nothing["returned_count"] == nothing["failed_count"] == 0
    assert reaped["failed_count"] == 5 and sorted(r["batch_id"] for r in reaped["failed"]) == sorted(
        c.batch_id for c in claims)
    assert after == [f"$JS.API.DIRECT.GET.KV_{bucket}"] and again["failed_count"] == 0  # nothing left in progress
    assert summary["states"]["failed"] == 5 and summary["expired_claims"] == 0
    assert sorted(item["batch_id"] for item in summary["failed"]) == sorted(c.batch_id for c in claims)


def test_an_expired_claim_among_live_ones_is_reaped_and_the_bound_moves_to_the_next_deadline(settings):
    clock = Clock()
    bucket = bucket_name()

    async def scenario(conn):
        short = await BatchLedger.open(conn, bucket, visibility_timeout=10, clock=clock)
        long = BatchLedger(conn, bucket, visibility_timeout=1000, clock=clock)
        await record_many(short, RUN, 2)
        # both batches in one shard, so one bound covers both claims
        a, b = next((x, y) for x in range(500) for y in range(x + 1, 500)
                    if shard_of(f"s{x}") == shard_of(f"s{y}"))
        for i in (a, b):
            await short.record(RUN, f"s{i}", stream="ORDERS", count=1)
        await short.claim(RUN, f"s{a}", owner="dies")
        await long.claim(RUN, f"s{b}", owner="slow")
        clock.now += 11
        before = await short.summary(RUN)
        reaped = await short.reap(RUN)
        return before, reaped, await short.summary(RUN)

    before, reaped, after = run(settings, scenario)
    assert before["expired_claims"] is None  # a claim may have expired: only a listing can tell which
    assert reaped["returned_count"] == 1
    assert after["expired_claims"] == 0 and after["states"]["in_progress"] == 1
    assert after["next_deadline"] is not None


def test_dead_letters_are_listed_from_the_counts_and_leave_them_when_requeued(settings):
    bucket = bucket_name()

    async def scenario(conn):
        ledger = await BatchLedger.open(conn, bucket, max_attempts=1)
        await record_many(ledger, RUN, 30)
        for i in (3, 4, 5):
            await ledger.release(await ledger.claim(RUN, f"b{i:05d}"), error=f"bad row {i}")
        failed = await LedgerWait(RUN, bucket=bucket).check(conn)
        requeued = await ledger.requeue(RUN)
        return failed, requeued, await ledger.summary(RUN)

    failed, requeued, after = run(settings, scenario)
    assert failed["error"]["reason"] == "batches_failed" and failed["states"]["failed"] == 3
    assert [f["batch_id"] for f in failed["failed"]] == ["b00003", "b00004", "b00005"]
    assert failed["failed"][0]["last_error"] == "bad row 3"
    assert len(requeued) == 3 and after["states"]["failed"] == 0 and after["failed"] == []


def test_a_write_task_looks_up_only_its_own_chunks(settings):
    """A Spark write task asks the ledger about its own chunk ids, 64 per request, never listing the run that
    every other task writes too (today each task listed the whole run)."""
    pytest.importorskip("pyspark")
    from airflow_jetstream.spark.writer import PartitionLedger, chunk_id

    bucket = bucket_name()

    async def scenario(conn):
        ledger = await BatchLedger.open(conn, bucket)
        await record_many(ledger, "job-1", 2000, prefix="other-")
        for chunk in (0, 1, 70):
            await ledger.record("job-1", chunk_id("job-1", 3, chunk), stream="ORDERS", count=1)
        mine = PartitionLedger(ledger, "job-1", "job-1", 3)
        with requests_of(conn) as sent:
            found = [chunk for chunk in range(80) if await mine.recorded(chunk)]
        return found, sent

    found, sent = run(settings, scenario)
    assert found == [0, 1, 70]
    assert sent == [f"$JS.API.DIRECT.GET.KV_{bucket}"] * 2  # chunks 0-63, then 64-127


def test_the_counts_of_a_run_are_sixteen_keys_beside_the_records_and_never_listed_as_batches(settings):
    bucket = bucket_name()

    async def scenario(conn):
        ledger = await BatchLedger.open(conn, bucket)
        await record_many(ledger, RUN, 100)
        keys = await kv_keys(conn.js, bucket)
        return keys, await ledger.batches(RUN), [r async for r in BatchLedger(conn, bucket).iter_batches()]

    keys, batches, every_run = run(settings, scenario)
    counts = sorted(k for k in keys if "/counts" in k)
    assert counts == sorted(counts_key(RUN, n) for n in range(SHARDS))
    assert len(batches) == len(every_run) == 100


def test_a_batch_removed_by_hand_with_its_counts_can_be_recorded_again(settings):
    """The record and its counts shard deleted by hand (delete markers left): recording the batch again finds no
    record without counts (the marker is not one), so it writes a fresh shard instead of recounting forever."""
    bucket = bucket_name()

    async def scenario(conn):
        ledger = await BatchLedger.open(conn, bucket)
        await ledger.record(RUN, "only", stream="ORDERS", count=4)
        kv = await conn.js.key_value(bucket)
        await kv.delete(batch_key(RUN, "only"))
        await kv.purge(counts_key(RUN, shard_of("only")))
        again = await ledger.record(RUN, "only", stream="ORDERS", count=4)
        return again, await ledger.summary(RUN), await ledger.recount(RUN)

    again, summary, recount = run(settings, scenario)
    assert again.state == "published" and summary["batches"] == 1 and recount["drift"] == {}


def test_a_reaping_look_before_the_bucket_exists_is_a_run_without_batches_and_creates_nothing(settings):
    bucket = bucket_name()

    async def scenario(conn):
        status = await LedgerWait(RUN, bucket=bucket, reap=True).check(conn)
        streams = (await conn.api_request("STREAM.NAMES"))["streams"] or []
        return status, streams

    status, streams = run(settings, scenario)
    assert not status["done"] and status["batches"] == 0 and "error" not in status
    assert f"KV_{bucket}" not in streams
