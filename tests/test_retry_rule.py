"""The client's one retry rule (client/retry.py) and the retries built on it: atomic batches, range reads."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re

import pytest

from airflow_jetstream.client.admin.streams import ensure_stream, stream_info
from airflow_jetstream.client.batches import atomic
from airflow_jetstream.client.batches.types import BatchMessage
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import (
    BatchPublishError,
    LeaderUnavailableError,
    RequestTimeoutError,
    StreamNotFoundError,
)
from airflow_jetstream.client.reading import stored
from airflow_jetstream.client.retry import Backoff, is_leader_unavailable, retry


def test_retry_stops_at_the_deadline_with_the_last_error_saying_how_long(caplog):
    calls = []

    async def attempt():
        calls.append(1)
        raise LeaderUnavailableError("no leader")

    async def main():
        return await retry("probe", attempt, transient=is_leader_unavailable, budget=0.3,
                           backoff=Backoff(0.05, 0.1))

    with caplog.at_level(logging.WARNING, logger="airflow_jetstream.client.retry"), \
            pytest.raises(LeaderUnavailableError) as err:
        asyncio.run(main())
    pauses = [r.args[4] for r in caplog.records if r.getMessage().startswith("probe: ")]
    # how many retries fit depends on how fast the box runs the loop; the pauses' rule does not
    assert 2 <= len(calls) <= 10 and len(pauses) == len(calls) - 1
    assert all(p <= 0.1 for p in pauses)
    # each pause is cut to what is left until the deadline, so together they never outlast the budget
    assert sum(pauses) <= 0.3 + 1e-6, pauses
    assert f"still failing after {len(calls) - 1} retries over 0.3s (leader_wait)" in str(err.value)


def test_retry_raises_what_is_not_transient_at_once_and_honours_max_retries():
    async def refused():
        raise StreamNotFoundError("gone")

    flaky = []

    async def timeout():
        flaky.append(1)
        raise RequestTimeoutError("slow")

    async def main():
        with pytest.raises(StreamNotFoundError):
            await retry("refused", refused, transient=lambda exc: "no" if exc.reason == "timeout" else None,
                        budget=5)
        with pytest.raises(RequestTimeoutError):
            await retry("slow", timeout, transient=lambda exc: "slow", budget=None, max_retries=2,
                        backoff=Backoff(0.01, 0.01))

    asyncio.run(main())
    assert len(flaky) == 3


def test_a_loop_bounded_by_max_retries_names_that_setting_and_jitter_never_exceeds_most():
    async def timeout():
        raise RequestTimeoutError("slow")

    async def main():
        await retry("slow", timeout, transient=lambda exc: "slow", budget=None, budget_name="retries",
                    max_retries=2, backoff=Backoff(0.01, 0.01))

    with pytest.raises(RequestTimeoutError) as err:
        asyncio.run(main())
    assert str(err.value).startswith("slow; still failing after 2 retries (retries=2)")
    jittered = Backoff(1.0, 4.0, jitter=True)
    pauses = [jittered.pause(n) for n in (1, 2, 3, 4) for _ in range(50)]
    assert all(0.5 <= p <= 1.0 for p in pauses[:50]) and all(2.0 <= p <= 4.0 for p in pauses[100:])


def interrupt_range_reads(monkeypatch, starts: list[int], *, resume: bool) -> None:
    """Every range reader (its first sequence noted in ``starts``) returns one chunk, then its leader goes
    away (503); with ``resume=False`` only the first reader returns a chunk."""
    real_read = stored.read_with_consumer

    async def one_chunk_then_no_leader(conn, stream, start, last, subjects, batch):
        first = start["opt_start_seq"]
        starts.append(first)
        if resume or first == 1:
            async with contextlib.aclosing(real_read(conn, stream, start, last, subjects, batch)) as reader:
                yield await anext(reader)
        if first + batch <= last:
            raise LeaderUnavailableError(f"stream {stream!r}: the read consumer answered status 503")

    monkeypatch.setattr(stored, "read_with_consumer", one_chunk_then_no_leader)


def read_30_in_fives(settings, leader_wait: float) -> tuple[list[int], LeaderUnavailableError | None]:
    """The sequences a read of seq 1..30 of a new stream returns in chunks of 5, and the error that ended it."""

    async def main():
        returned, error = [], None
        async with open_connection(dataclasses.replace(settings, leader_wait=leader_wait)) as conn:
            await ensure_stream(conn, {"name": "RANGE", "subjects": ["range.>"]})
            for i in range(30):
                await conn.js.publish("range.x", b"%d" % i)
            try:
                async for chunk in stored.read_range(conn, "RANGE", 1, 30, batch=5):
                    returned.extend(m[1] for m in chunk)
            except LeaderUnavailableError as exc:
                error = exc
        return returned, error

    return asyncio.run(main())


def test_a_range_read_resumes_after_each_interruption_with_the_budget_counted_since_its_last_chunk(
        settings, monkeypatch, caplog):
    """The read goes on from the sequence after each chunk, each message once, although the pauses
    together (5 x 0.25 s) outlast leader_wait (1 s): the budget counts from the first failure since the
    last progress."""
    starts: list[int] = []
    interrupt_range_reads(monkeypatch, starts, resume=True)
    with caplog.at_level(logging.WARNING, logger=stored.__name__):
        seqs, error = read_30_in_fives(settings, leader_wait=1.0)
    assert seqs == list(range(1, 31)) and error is None
    assert starts == [1, 6, 11, 16, 21, 26]
    retries = [r.getMessage() for r in caplog.records if r.name == stored.__name__]
    # each interruption starts a new retry loop with the whole leader_wait: every line is its "retry 1"
    # (the time left it prints is not checked: it depends on how fast the box runs the loop)
    assert [re.sub(r"\d+\.\d s of", "<left> s of", line) for line in retries] == [
        f"stream RANGE: read interrupted at seq {seq} (leader_unavailable); retry 1 in 0.25 s, "
        "<left> s of leader_wait left" for seq in (6, 11, 16, 21, 26)]


def test_a_range_read_that_stays_interrupted_ends_saying_where_it_stopped(settings, monkeypatch):
    starts: list[int] = []
    interrupt_range_reads(monkeypatch, starts, resume=False)
    seqs, error = read_30_in_fives(settings, leader_wait=0.3)
    assert seqs == [1, 2, 3, 4, 5] and error is not None and set(starts) == {1, 6}
    assert "still failing after" in error.message
    assert error.message.endswith("over 0.3s (leader_wait): the read of seq 1..30 stopped at seq 6; check that a "
                                  "quorum of the cluster's servers runs, then re-run")


def test_an_atomic_resend_meeting_its_own_first_attempt_is_asked_again(settings, monkeypatch):
    """10158 (the same msg id is still being stored) is retried within leader_wait, not raised: it cannot
    be produced on demand, so the first send answers it and later ones go to the real server."""
    real_send = atomic._send_batch
    answered = []

    async def first_in_process(*args, **kwargs):
        if not answered:
            answered.append(1)
            raise BatchPublishError("duplicate message id is in process", reason="msg_id_in_process",
                                    code=409, err_code=10158)
        return await real_send(*args, **kwargs)

    monkeypatch.setattr(atomic, "_send_batch", first_in_process)

    async def main():
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": "INPROC", "subjects": ["inproc.>"], "allow_atomic": True})
            result = await atomic.publish_atomic_batch(conn, [BatchMessage("inproc.a", b"1", msg_id="i-1")])
            return result, (await stream_info(conn, "INPROC"))["state"]["messages"]

    result, stored = asyncio.run(main())
    assert answered and result.count == 1 and stored == 1


def test_a_ledger_change_whose_answer_is_lost_is_found_on_the_reread_not_made_twice(settings, monkeypatch):
    """A ledger write (record + counts, one atomic batch) that the server stored but whose answer was lost (an
    election, a cut connection) is read again: the record holding exactly what was written is this change's own
    success. A claim is not taken a second time (which would count two attempts) nor reported as lost."""
    from airflow_jetstream.client.errors import RequestTimeoutError
    from airflow_jetstream.client.kv import keys
    from airflow_jetstream.client.ledger.batch_ledger import BatchLedger

    real_send = keys._send
    lost: list[str] = []

    async def answer_lost(conn, bucket, writes, context):
        await real_send(conn, bucket, writes, context)  # stored...
        lost.append(writes[0].key)
        raise RequestTimeoutError("no reply")  # ...but the answer never came

    async def main():
        async with open_connection(settings) as conn:
            ledger = await BatchLedger.open(conn, "lost_answers")
            monkeypatch.setattr(keys, "_send", answer_lost)
            recorded = await ledger.record("run-1", "b-1", stream="S", count=2, first_seq=1, last_seq=2)
            claim = await ledger.claim("run-1", "b-1", owner="me")
            monkeypatch.setattr(keys, "_send", real_send)
            return recorded, claim, await ledger.get("run-1", "b-1"), await ledger.summary("run-1")

    recorded, claim, stored, summary = asyncio.run(main())
    assert len(lost) == 2 and (recorded.first_seq, recorded.last_seq) == (1, 2)
    assert claim is not None and claim.claim_id == stored.claim_id and stored.attempts == 1
    assert (summary["batches"], summary["states"]["in_progress"], summary["attempts"]) == (1, 1, 1)
