"""Batch ledger against a real nats-server: record, claim (CAS), consume, release, reap, dead letters."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from airflow_jetstream.client import ConnectionSettings, metrics, open_connection
from airflow_jetstream.client.errors import (
    BatchesFailedError,
    BatchNotFoundError,
    ClaimLostError,
    InvalidRequestError,
    LedgerConflictError,
    LedgerNotFoundError,
    LedgerWaitTimeoutError,
)
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.ledger.counts import run_reached
from airflow_jetstream.client.ledger.records import batch_key
from airflow_jetstream.client.ledger.wait import LedgerWait
from tests.support.polling import async_wait_until

RUN = "manual__2026-11-25T23:46:59.123+00:00"


class FakeClock:
    """A wall clock the test moves forward by hand (visibility deadlines without waiting)."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def run(settings: ConnectionSettings, scenario, **ledger_kwargs):
    async def go():
        async with open_connection(settings) as conn:
            ledger = await BatchLedger.open(conn, **ledger_kwargs)
            return await scenario(ledger)

    return asyncio.run(go())


def test_batch_key_escapes_airflow_run_ids():
    key = batch_key(RUN, "job-1.p0/c3")
    assert key == "manual__2026-11-25T23=3A46=3A59=2E123=2B00=3A00.job-1=2Ep0=2Fc3"
    assert key.count(".") == 1
    assert batch_key("a.b", "c") != batch_key("a", "b.c")
    with pytest.raises(InvalidRequestError):
        batch_key("", "x")


def test_record_is_idempotent_and_rejects_a_different_location(settings):
    async def scenario(ledger: BatchLedger):
        first = await ledger.record(RUN, "b1", stream="ORDERS", count=3, first_seq=1, last_seq=3, meta={"p": 0})
        again = await ledger.record(RUN, "b1", stream="ORDERS", count=3, first_seq=1, last_seq=3)
        with pytest.raises(LedgerConflictError) as conflict:
            await ledger.record(RUN, "b1", stream="ORDERS", count=3, first_seq=4, last_seq=6)
        stored = await ledger.get(RUN, "b1")
        missing = await ledger.get(RUN, "nope")
        return first, again, conflict.value, stored, missing

    first, again, conflict, stored, missing = run(settings, scenario)
    assert first.state == "published" and first.attempts == 0 and first.revision > 0
    assert again.revision == first.revision
    assert conflict.reason == "ledger_conflict" and "distinct batch id" in conflict.message
    assert stored.to_dict() == first.to_dict()
    assert stored.meta == {"p": 0}
    assert missing is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"count": -1},
        {"count": 5, "first_seq": 1, "last_seq": 3},
        {"count": 1, "first_seq": 4, "last_seq": 3},
        {"count": 1, "first_seq": 0},
        {"count": True},
        {"count": 1, "meta": {"when": object()}},
    ],
)
def test_bad_locations_are_rejected_before_anything_is_written(settings, kwargs):
    async def scenario(ledger: BatchLedger):
        with pytest.raises(InvalidRequestError):
            await ledger.record(RUN, "bad", stream="ORDERS", **kwargs)
        return await ledger.get(RUN, "bad")

    assert run(settings, scenario) is None


def test_claim_consume_and_summary(settings):
    async def scenario(ledger: BatchLedger):
        for i in range(3):
            await ledger.record(RUN, f"b{i}", stream="ORDERS", count=10, first_seq=1 + 10 * i, last_seq=10 * (i + 1))
        await ledger.record("other-run", "b0", stream="ORDERS", count=1)
        claim = await ledger.claim(RUN, "b0", owner="task-1")
        second = await ledger.claim(RUN, "b0", owner="task-2")
        consumed = await ledger.mark_consumed(claim)
        consumed_again = await ledger.mark_consumed(claim)
        summary = await ledger.summary(RUN)
        return claim, second, consumed, consumed_again, summary

    claim, second, consumed, consumed_again, summary = run(settings, scenario)
    assert claim.state == "in_progress" and claim.attempts == 1 and claim.owner == "task-1" and claim.claim_id
    assert second is None
    assert consumed.state == "consumed" and consumed.consumed_at
    assert consumed_again.revision == consumed.revision
    assert summary["batches"] == 3
    assert summary["states"] == {"published": 2, "in_progress": 0, "consumed": 1, "failed": 0}
    assert summary["messages"]["consumed"] == 10 and summary["messages"]["published"] == 20
    assert summary["streams"] == ["ORDERS"] and summary["failed"] == []
    assert not run_reached(summary, "consumed")
    assert run_reached(summary, "published")



def test_listing_shows_each_batch_once_at_its_latest_state_and_skips_removed_keys(settings):
    """The listing reads the bucket's last value per key until nothing is pending (not a KV watch's
    "initial values done" marker, which nats-py can send before the values): 2500 batches take
    three pulls, updates show as their latest state, deleted and purged keys are not listed."""

    async def scenario(ledger: BatchLedger):
        assert await ledger.batches("empty-run") == []
        await asyncio.gather(*(ledger.record(RUN, f"b{i:04d}", stream="ORDERS", count=1) for i in range(2500)))
        await ledger.mark_consumed(await ledger.claim(RUN, "b0007", owner="t"))
        await (await ledger.conn.js.key_value(ledger.bucket)).delete(batch_key(RUN, "b0001"))
        await (await ledger.conn.js.key_value(ledger.bucket)).purge(batch_key(RUN, "b0002"))
        return await ledger.batches(RUN), await ledger.batches(RUN, state="consumed")

    # 2500 creates in flight at once: on a loaded box the last answers can take longer than the usual 3 s
    listed, consumed = run(dataclasses.replace(settings, request_timeout=20), scenario, history=5)
    ids = [r.batch_id for r in listed]
    assert ids == sorted(f"b{i:04d}" for i in range(2500) if i not in (1, 2))
    assert [r.batch_id for r in consumed] == ["b0007"] and consumed[0].attempts == 1

class CountingSink:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def incr(self, name, count=1, tags=None):
        self.counts[name] = self.counts.get(name, 0) + count

    def timing(self, name, millis, tags=None):
        return None

    def gauge(self, name, value, tags=None):
        return None


@pytest.fixture
def counting_sink():
    sink = CountingSink()
    metrics.set_metrics_sink(sink)
    yield sink
    metrics.set_metrics_sink(None)


class ReadTogetherLedger(BatchLedger):
    """Holds each claimer after its first read until all have read: every update then races on one revision."""

    barrier: asyncio.Barrier | None = None

    async def read_entries(self, keys, **kwargs):
        entries = await super().read_entries(keys, **kwargs)
        barrier, self.barrier = self.barrier, None
        if barrier is not None:
            await barrier.wait()
        return entries


def test_racing_claimers_exactly_one_wins(settings, counting_sink):
    """Eight connections read the same revision, then all try to claim: exactly one update gets through."""
    claimers = 8

    async def scenario():
        async with open_connection(settings) as setup:
            ledger = await BatchLedger.open(setup)
            await ledger.record(RUN, "hot", stream="ORDERS", count=1)

        barrier = asyncio.Barrier(claimers)

        async def claimer(n: int):
            async with open_connection(settings) as conn:
                mine = await ReadTogetherLedger.open(conn, create=False)
                mine.barrier = barrier
                return await mine.claim(RUN, "hot", owner=f"claimer-{n}")

        results = await asyncio.gather(*(claimer(n) for n in range(claimers)))
        async with open_connection(settings) as conn:
            final = await (await BatchLedger.open(conn, create=False)).get(RUN, "hot")
        return results, final

    results, final = asyncio.run(scenario())
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert final.state == "in_progress" and final.attempts == 1
    assert final.claim_id == winners[0].claim_id and final.owner == winners[0].owner
    assert counting_sink.counts["ledger.claimed"] == 1
    assert counting_sink.counts["ledger.cas_retry"] == claimers - 1  # every loser hit the revision check


def test_dead_claimer_is_reaped_then_dead_lettered_after_max_attempts(settings):
    clock = FakeClock()

    async def scenario(ledger: BatchLedger):
        await ledger.record(RUN, "b0", stream="ORDERS", count=5, first_seq=1, last_seq=5)
        await ledger.record(RUN, "b1", stream="ORDERS", count=5, first_seq=6, last_seq=10)
        dead = await ledger.claim(RUN, "b0", owner="attempt-1")
        ok = await ledger.claim(RUN, "b1", owner="attempt-1")
        clock.advance(20)
        early = await ledger.reap(RUN)
        await ledger.extend(ok)
        clock.advance(20)  # b0 is past its 30 s deadline; b1 was extended
        first = await ledger.reap(RUN)
        after_first = await ledger.get(RUN, "b0")
        await ledger.mark_consumed(ok)
        with pytest.raises(ClaimLostError) as lost:
            await ledger.mark_consumed(dead)
        second = await ledger.claim(RUN, "b0", owner="attempt-2")
        clock.advance(31)
        third = await ledger.claim(RUN, "b0", owner="attempt-3")  # claim itself expires attempt 2
        clock.advance(31)
        final = await ledger.reap(RUN)
        summary = await ledger.summary(RUN)
        return early, first, after_first, lost.value, second, third, final, summary

    early, first, after_first, lost, second, third, final, summary = run(
        settings, scenario, visibility_timeout=30, max_attempts=3, clock=clock
    )
    assert early == {"returned": [], "failed": [], "returned_count": 0, "failed_count": 0}
    assert [r["batch_id"] for r in first["returned"]] == ["b0"] and first["failed"] == []
    assert after_first.state == "published" and after_first.attempts == 1
    assert "attempt-1" in after_first.last_error and "visibility deadline" in after_first.last_error
    assert lost.reason == "claim_lost"
    assert second.attempts == 2 and third.attempts == 3
    assert final["returned"] == [] and [r["batch_id"] for r in final["failed"]] == ["b0"]
    assert (first["returned_count"], final["failed_count"]) == (1, 1)
    assert final["failed"][0]["state"] == "failed" and final["failed"][0]["attempts"] == 3
    assert summary["states"] == {"published": 0, "in_progress": 0, "consumed": 1, "failed": 1}
    assert summary["failed"][0]["batch_id"] == "b0" and "attempt-3" in summary["failed"][0]["last_error"]
    with pytest.raises(BatchesFailedError) as failed:
        run_reached(summary, "consumed")
    assert failed.value.failed[0]["batch_id"] == "b0"
    assert failed.value.to_dict()["reason"] == "batches_failed"


def test_release_returns_then_fails_and_requeue_reopens(settings):
    async def scenario(ledger: BatchLedger):
        await ledger.record(RUN, "b0", stream="ORDERS", count=1)
        one = await ledger.claim(RUN, "b0")
        back = await ledger.release(one, error="parquet write failed: disk full")
        two = await ledger.claim(RUN, "b0")
        dead = await ledger.release(two, error="still full")
        none = await ledger.claim(RUN, "b0")
        requeued = await ledger.requeue(RUN)
        fresh = await ledger.claim(RUN, "b0")
        await ledger.mark_consumed(fresh)
        replay = await ledger.requeue(RUN, states=("consumed", "failed"))
        return back, dead, none, requeued, fresh, replay

    back, dead, none, requeued, fresh, replay = run(settings, scenario, max_attempts=2)
    assert back.state == "published" and back.last_error == "parquet write failed: disk full"
    assert dead.state == "failed" and dead.attempts == 2 and dead.failed_at
    assert none is None
    assert [r.batch_id for r in requeued] == ["b0"] and requeued[0].attempts == 0
    assert fresh.attempts == 1
    assert replay[0].state == "published" and replay[0].consumed_at is None


def test_dead_claim_returns_in_real_time_and_wait_all_reports_the_dead_letter(settings):
    """Short real visibility timeout: a new claimer gets the batch back once the dead claim expired,
    and wait_all(reap=True) turns the last dead attempt into a reported failure."""

    async def scenario(ledger: BatchLedger):
        await ledger.record(RUN, "b0", stream="ORDERS", count=2)
        await ledger.record(RUN, "b1", stream="ORDERS", count=2)
        await ledger.claim(RUN, "b0", owner="dies-1")
        published = await ledger.wait_all(RUN, "published", timeout=0)  # in progress counts as published
        with pytest.raises(LedgerWaitTimeoutError) as waited:
            await ledger.wait_all(RUN, "consumed", timeout=0.2, poll_interval=0.05)
        claims = []

        async def claimed_again() -> bool:  # once b0's claim is older than the visibility timeout
            claims.append(await ledger.claim(RUN, "b0", owner="dies-2"))
            return claims[-1] is not None

        await async_wait_until(claimed_again, "a second claim of b0 after its visibility timeout", timeout=15)
        second = claims[-1]
        ok = await ledger.claim(RUN, "b1", owner="works")
        await ledger.mark_consumed(ok)
        with pytest.raises(BatchesFailedError) as failed:
            await ledger.wait_all(RUN, "consumed", timeout=15, poll_interval=0.05, reap=True)
        return published, waited.value, second, failed.value, await ledger.summary(RUN)

    published, waited, second, failed, summary = run(settings, scenario, visibility_timeout=0.3, max_attempts=2)
    assert published["states"]["in_progress"] == 1
    assert waited.reason == "wait_timeout" and "consumed" in waited.message
    assert second is not None and second.attempts == 2
    assert [f["batch_id"] for f in failed.failed] == ["b0"] and "dies-2" in failed.failed[0]["last_error"]
    assert summary["states"] == {"published": 0, "in_progress": 0, "consumed": 1, "failed": 1}


def test_unknown_batch_bucket_and_bad_params(settings):
    async def scenario():
        async with open_connection(settings) as conn:
            with pytest.raises(LedgerNotFoundError):
                await BatchLedger.open(conn, "missing_bucket", create=False)
            ledger = await BatchLedger.open(conn)
            with pytest.raises(BatchNotFoundError):
                await ledger.claim(RUN, "never-recorded")
            with pytest.raises(InvalidRequestError):
                await ledger.wait_all(RUN, "failed")
            with pytest.raises(InvalidRequestError):
                await BatchLedger.open(conn, max_attempts=0)
            with pytest.raises(InvalidRequestError):
                await BatchLedger.open(conn, visibility_timeout=0)
            with pytest.raises(InvalidRequestError) as bad_bucket:
                await BatchLedger.open(conn, "runs:2026")
            assert bad_bucket.value.reason == "invalid_name"
            assert await ledger.summary("no-such-run") == {
                "run_id": "no-such-run", "bucket": "batch_ledger", "batches": 0,
                "states": {"published": 0, "in_progress": 0, "consumed": 0, "failed": 0},
                "messages": {"published": 0, "in_progress": 0, "consumed": 0, "failed": 0},
                "attempts": 0, "expired_claims": 0, "streams": [], "failed": [], "next_deadline": None,
                "counted_by": "counts",
            }

    asyncio.run(scenario())


def test_any_reaper_applies_the_claimers_limits_and_the_ledger_wait_reports(settings):
    """A sensor-side reaper with default settings uses the max_attempts the claimer stored."""
    clock = FakeClock()

    async def scenario():
        async with open_connection(settings) as conn:
            before = await LedgerWait(RUN, min_batches=1).check(conn)
            claimer = await BatchLedger.open(conn, visibility_timeout=5, max_attempts=1, clock=clock)
            await claimer.record(RUN, "b0", stream="ORDERS", count=4)
            await claimer.record(RUN, "b1", stream="ORDERS", count=6)
            await claimer.claim(RUN, "b0", owner="dies")
            waiting = await LedgerWait(RUN, "published", min_batches=3).check(conn)
            published = await LedgerWait(RUN, "published", min_batches=2).check(conn)
            clock.advance(6)
            reaper = await BatchLedger.open(conn, clock=clock)  # defaults: max_attempts=3
            reaped = await reaper.reap(RUN)
            after = await LedgerWait(RUN, reap=True).check(conn)
            tolerant = await LedgerWait(RUN, "published", fail_on_failed=False).check(conn)
            return before, waiting, published, reaped, after, tolerant

    before, waiting, published, reaped, after, tolerant = asyncio.run(scenario())
    assert before["batches"] == 0 and before["done"] is False and "error" not in before
    assert waiting["done"] is False and published["done"] is True and published["awaited"] == "published"
    assert [r["batch_id"] for r in reaped["failed"]] == ["b0"] and reaped["failed"][0]["max_attempts"] == 1
    assert after["done"] is False and after["error"]["reason"] == "batches_failed"
    assert after["error"]["failed"][0]["batch_id"] == "b0" and after["messages"]["failed"] == 4
    assert tolerant["done"] is False and "error" not in tolerant  # a failed batch never reaches a state


def test_records_from_a_newer_version_still_decode(settings):
    async def scenario(ledger: BatchLedger):
        stored = await ledger.record(RUN, "b0", stream="ORDERS", count=1)
        body = json.loads(stored.encode())
        body["added_in_a_later_version"] = {"x": 1}
        await (await ledger.conn.js.key_value(ledger.bucket)).put(batch_key(RUN, "b0"), json.dumps(body).encode())
        await (await ledger.conn.js.key_value(ledger.bucket)).put(batch_key(RUN, "junk"), b"not json")
        with pytest.raises(LedgerConflictError) as corrupt:
            await ledger.get(RUN, "junk")
        return await ledger.get(RUN, "b0"), corrupt.value

    newer, corrupt = run(settings, scenario)
    assert newer.batch_id == "b0" and newer.state == "published"
    assert corrupt.reason == "ledger_corrupt"


def test_claim_of_an_expired_last_attempt_stores_the_dead_letter(settings):
    clock = FakeClock()

    async def scenario(ledger: BatchLedger):
        await ledger.record(RUN, "b0", stream="ORDERS", count=1)
        await ledger.claim(RUN, "b0", owner="only-attempt")
        clock.advance(11)
        again = await ledger.claim(RUN, "b0", owner="too-late")
        return again, await ledger.get(RUN, "b0"), await ledger.reap(RUN)

    again, stored, reaped = run(settings, scenario, visibility_timeout=10, max_attempts=1, clock=clock)
    assert again is None
    assert stored.state == "failed" and stored.attempts == 1 and "only-attempt" in stored.last_error
    assert reaped == {"returned": [], "failed": [], "returned_count": 0, "failed_count": 0}  # nothing left


def test_reaper_and_a_late_consumer_racing_on_one_expired_claim_never_both_win(settings):
    clock = FakeClock()

    async def scenario():
        barrier = asyncio.Barrier(2)
        async with open_connection(settings) as c1, open_connection(settings) as c2:
            consumer = await ReadTogetherLedger.open(c1, visibility_timeout=5, clock=clock)
            reaper = await ReadTogetherLedger.open(c2, clock=clock)
            await consumer.record(RUN, "b0", stream="ORDERS", count=1)
            claim = await consumer.claim(RUN, "b0", owner="slow")
            clock.advance(6)
            consumer.barrier = reaper.barrier = barrier

            async def finish():
                try:
                    return await consumer.mark_consumed(claim)
                except ClaimLostError as exc:
                    return exc

            marked, reaped = await asyncio.gather(finish(), reaper.reap(RUN))
            return claim, marked, reaped, await reaper.get(RUN, "b0")

    claim, marked, reaped, final = asyncio.run(scenario())
    if isinstance(marked, ClaimLostError):
        assert [r["batch_id"] for r in reaped["returned"]] == ["b0"] and final.state == "published"
    else:
        assert reaped["returned_count"] == reaped["failed_count"] == 0 and final.state == "consumed"
    assert final.revision == claim.revision + 2  # exactly one more write: the record and its counts, one batch


def test_a_claim_whose_write_got_no_answer_but_landed_late_is_held_by_its_claimer(settings, monkeypatch):
    """The chaos suite's misreport (seed 144): a claim's write timed out, its next try met no stream leader,
    and the first write was then stored after all. The claimer must get its claim, not None while the batch
    stays in progress under a claim nobody holds until its deadline."""
    from airflow_jetstream.client.errors import LeaderUnavailableError, RequestTimeoutError
    from airflow_jetstream.client.ledger import store

    real_write = store.write
    held: list[tuple] = []

    async def lossy_write(conn, bucket, writes, *, context):
        if not held:  # the first try: the server gets it late, its answer is lost
            held.append((conn, bucket, writes, context))
            raise RequestTimeoutError(f"{context}: no answer")
        if len(held) == 1:  # the next try meets no leader, while the first one is stored now
            first = held.pop()
            held.append(None)
            await real_write(*first[:3], context=first[3])
            raise LeaderUnavailableError(f"{context}: no stream leader answered")
        return await real_write(conn, bucket, writes, context=context)

    async def scenario(ledger: BatchLedger):
        await ledger.record(RUN, "late", stream="ORDERS", count=3, first_seq=1, last_seq=3)
        monkeypatch.setattr(store, "write", lossy_write)
        claim = await ledger.claim(RUN, "late", owner="task-1")
        monkeypatch.setattr(store, "write", real_write)
        stored = (await ledger.get(RUN, "late"))
        consumed = await ledger.mark_consumed(claim) if claim is not None else None
        return claim, stored, consumed

    claim, stored, consumed = run(settings, scenario)
    assert held == [None], "the injected faults did not both happen"
    assert claim is not None, f"the claim was stored ({stored.state}, claim {stored.claim_id}) but not handed over"
    assert (claim.state, claim.claim_id, claim.attempts) == ("in_progress", stored.claim_id, 1)
    assert consumed.state == "consumed"
