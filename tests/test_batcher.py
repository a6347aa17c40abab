"""The Batcher (client-side batching) against a real nats-server: fenced by default, and the fence=False opt-out."""

from __future__ import annotations

import asyncio
import base64
import logging

import pytest

from airflow_jetstream.client import Batcher, BatchMessage, JetStreamError, metrics, stream_info
from airflow_jetstream.client.errors import InvalidRequestError, InvalidSubjectError
from tests.support.nats_calls import with_streams

ATOM = {"name": "ATOM", "subjects": ["atom.>"], "allow_atomic": True}


def run(settings, body, streams=(ATOM,)):
    return with_streams(settings, body, streams)


async def data_at(conn, stream: str, seq: int) -> bytes:
    reply = await conn.api_request(f"STREAM.MSG.GET.{stream}", {"seq": seq})
    return base64.b64decode(reply["message"].get("data", ""))


class BatchSizes:
    def __init__(self):
        self.sizes: list[float] = []

    def incr(self, name, count=1, tags=None):
        return None

    def timing(self, name, millis, tags=None):
        return None

    def gauge(self, name, value, tags=None):
        if name == "batcher.batch_size":
            self.sizes.append(value)


@pytest.fixture
def batch_sizes():
    sink = BatchSizes()
    metrics.set_metrics_sink(sink)
    yield sink.sizes
    metrics.set_metrics_sink(None)


def test_concurrent_publishers_get_their_own_results_in_order(settings, batch_sizes):
    async def body(conn):
        async with Batcher(conn, max_batch=50, fence=False) as batcher:
            async def publisher(k):
                return [await batcher.publish(f"atom.p{k}", b"%d:%d" % (k, i)) for i in range(15)]

            per_publisher = await asyncio.gather(*(publisher(k) for k in range(64)))
        checks = []
        for k, results in enumerate(per_publisher):
            for i, result in enumerate(results):
                checks.append((k, i, result, await data_at(conn, "ATOM", result.seq)))
        return per_publisher, checks, (await stream_info(conn, "ATOM"))["state"]

    per_publisher, checks, state = run(settings, body)
    assert state["messages"] == 64 * 15
    for results in per_publisher:
        seqs = [r.seq for r in results]
        assert all(r.ok and r.stream == "ATOM" for r in results)
        assert seqs == sorted(seqs) and len(set(seqs)) == 15
    for k, i, _result, stored in checks:
        assert stored == b"%d:%d" % (k, i), "each caller's seq holds its own message"
    assert max(batch_sizes) <= 50, "batches are bounded by max_batch"
    assert max(batch_sizes) > 1, "concurrent calls are coalesced"


def test_by_default_every_item_is_fenced_in_atomic_groups_of_up_to_500(settings, batch_sizes):
    """1,000 items in one group of max_batch 1000: two atomic batches of 500 items and their 500 fences (the
    server's max_msgs is 1000), no item re-sent on its own; each item's seq holds it, its fence the seq after."""
    resent: list[str] = []

    class Sink(BatchSizes):
        def incr(self, name, count=1, tags=None):
            if name == "batcher.resent_individually":
                resent.append((tags or {}).get("reason", ""))

    sink = Sink()
    metrics.set_metrics_sink(sink)

    async def body(conn):
        async with Batcher(conn, max_batch=1000, flush_interval=60) as batcher:
            futures = [await batcher.submit(BatchMessage("atom.f", b"%d" % i, msg_id=f"f-{i}")) for i in range(1000)]
            results = [await f for f in futures]
        stored = [await data_at(conn, "ATOM", r.seq) for r in results[:3] + results[-3:]]
        return results, stored, (await stream_info(conn, "ATOM"))["state"]

    try:
        results, stored, state = run(settings, body)
    finally:
        metrics.set_metrics_sink(None)
    assert all(r.ok and not r.duplicate for r in results)
    assert [r.seq for r in results] == list(range(1, 2000, 2)), "each item is followed by its fence"
    assert stored == [b"0", b"1", b"2", b"997", b"998", b"999"]
    assert state["messages"] == 2000
    assert sink.sizes == [1000] and resent == []


def test_fenced_items_fail_alone_before_anything_is_sent(settings):
    """No msg id, a stream without allow_atomic, a stream without its fence namespace: typed errors per item,
    nothing of them stored, the other items of the group stored."""
    unfenced = {"name": "NOFNS", "subjects": ["nofns.>"], "allow_atomic": True}

    async def body(conn):
        await conn.api_request("STREAM.UPDATE.NOFNS", {**unfenced, "subjects": ["nofns.>"]}, context="test")
        async with Batcher(conn, flush_interval=0.05) as batcher:
            results = await asyncio.gather(
                batcher.publish("atom.a", b"1", msg_id="a-1"),
                batcher.publish("atom.a", b"2"),
                batcher.publish("plain.a", b"3", msg_id="p-1"),
                batcher.publish("nofns.a", b"4", msg_id="n-1"),
                batcher.publish("atom.a", b"5", msg_id="a-2"),
            )
        states = [(await stream_info(conn, name))["state"]["messages"] for name in ("ATOM", "PLAIN", "NOFNS")]
        return results, states

    results, states = run(settings, body, streams=(ATOM, {"name": "PLAIN", "subjects": ["plain.>"]}, unfenced))
    assert [r.error for r in results] == ["", "invalid_msg_id", "stream_not_atomic", "stream_not_fenced", ""]
    assert "fence=False" in results[1].message
    assert states == [4, 0, 0], "two items and their fences; nothing of the refused ones"


def test_the_unfenced_opt_out_warns_once_when_items_carry_msg_ids(settings, caplog):
    async def body(conn):
        async with Batcher(conn, fence=False) as batcher:
            plain = await batcher.publish("atom.o", b"0")
            with_ids = [await batcher.publish("atom.o", b"%d" % i, msg_id=f"o-{i}") for i in range(3)]
        return [plain, *with_ids]

    with caplog.at_level(logging.WARNING, logger="airflow_jetstream.client.batches.batcher"):
        results = run(settings, body)
    assert [r.seq for r in results] == [1, 2, 3, 4], "no fences"
    warnings = [r.getMessage() for r in caplog.records if "fence=False" in r.getMessage()]
    assert len(warnings) == 1 and "duplicate_window" in warnings[0] and "'o-0'" in warnings[0]


@pytest.mark.parametrize("atomic", [False, True])
def test_per_item_errors_do_not_fail_the_other_items(settings, atomic):
    async def body(conn):
        await conn.js.publish("atom.k", b"first")
        async with Batcher(conn, flush_interval=0.05, atomic=atomic, fence=False) as batcher:
            results = await asyncio.gather(
                batcher.publish("atom.a", b"1"),
                batcher.publish("atom bad", b"2"),
                batcher.publish("atom.k", b"3", expected_last_subject_seq=99),
                batcher.publish("atom.b", b"4", headers={"Nats-Batch-Id": "x"}),
                batcher.publish("atom.c", b"5", msg_id="dup"),
                batcher.publish("atom.d", b"6"),
                batcher.publish("atom.e", b"7", headers={"Nats-Expected-Last-Msg-Id": "m"}),  # see docs/cluster.md
            )
            again = await batcher.publish("atom.c", b"5", msg_id="dup")
        return results, again, (await stream_info(conn, "ATOM"))["state"]

    results, again, state = run(settings, body)
    assert [r.error for r in results] == ["", "invalid_subject", "wrong_last_sequence", "unsupported_header", "", "",
                                          "unsupported_header"]
    assert results[2].err_code is not None and results[2].to_dict()["error"] == "wrong_last_sequence"
    assert again.ok and again.duplicate and again.seq == results[4].seq
    assert state["messages"] == 4
    with pytest.raises(JetStreamError) as info:
        results[2].raise_for_error()
    assert info.value.reason == "wrong_last_sequence"
    with pytest.raises(InvalidSubjectError, match="atom bad"):  # the typed error of the item's reason
        results[1].raise_for_error()


def test_atomic_groups_use_one_batch_each(settings):
    async def body(conn):
        async with Batcher(conn, atomic=True, max_batch=10, flush_interval=0.3, fence=False) as batcher:
            futures = [await batcher.submit(BatchMessage("atom.g", b"%d" % i)) for i in range(25)]
            results = [await f for f in futures]
        return results, batcher.atomic

    results, atomic = run(settings, body)
    assert [r.seq for r in results] == list(range(1, 26))
    assert atomic is True


def test_stream_without_atomic_falls_back_to_individual_publishes(settings):
    async def body(conn):
        async with Batcher(conn, atomic=True, fence=False) as batcher:
            results = await asyncio.gather(*(batcher.publish("plain.x", b"%d" % i) for i in range(30)))
            return results, batcher.atomic

    results, atomic = run(settings, body, streams=({"name": "PLAIN", "subjects": ["plain.>"]},))
    assert [r.seq for r in results] == list(range(1, 31))
    assert atomic is False


def test_no_stream_is_a_per_item_error(settings):
    async def body(conn):
        async with Batcher(conn, timeout=2, fence=False) as batcher:
            return await asyncio.gather(batcher.publish("atom.ok", b"1"), batcher.publish("nowhere.x", b"2"))

    ok, missing = run(settings, body)
    assert ok.ok and missing.error == "no_stream_for_subject"


def test_closed_connection_is_a_per_item_error_not_a_hang(settings):
    async def body(conn):
        batcher = Batcher(conn, timeout=2, fence=False)
        first = await batcher.publish("atom.ok", b"1")  # opens the batcher's reply inbox
        await conn.nc.close()
        lost = await asyncio.gather(batcher.publish("atom.ok", b"2"), batcher.publish("atom.ok", b"3"))
        await batcher.close()
        return first, lost

    first, lost = run(settings, body)
    assert first.ok
    assert [r.error for r in lost] == ["connection_lost", "connection_lost"]


def test_closed_connection_before_the_first_group(settings):
    async def body(conn):
        await conn.nc.close()
        async with Batcher(conn, timeout=2, fence=False) as batcher:
            return await batcher.publish("atom.ok", b"1")

    assert run(settings, body).error == "connection_lost"


def test_close_flushes_pending_and_rejects_new_items(settings):
    async def body(conn):
        batcher = Batcher(conn, max_batch=7, flush_interval=10, fence=False)
        futures = [await batcher.submit(BatchMessage("atom.x", b"%d" % i)) for i in range(20)]
        await batcher.close()
        assert all(f.done() for f in futures)
        with pytest.raises(InvalidRequestError) as info:
            await batcher.submit(BatchMessage("atom.x", b"late"))
        return [f.result() for f in futures], info.value, (await stream_info(conn, "ATOM"))["state"]

    results, closed, state = run(settings, body)
    assert [r.seq for r in results] == list(range(1, 21))
    assert closed.reason == "batcher_closed"
    assert state["messages"] == 20


def test_cancelled_callers_lose_no_items(settings):
    async def body(conn):
        async with Batcher(conn, flush_interval=3600, fence=False) as batcher:  # only close() sends the group
            tasks = [asyncio.ensure_future(batcher.publish("atom.c", b"%d" % i)) for i in range(40)]
            for _ in range(100):  # each task queues its item the first time it runs, without waiting on anything
                if len(batcher._queue) == 40:
                    break
                await asyncio.sleep(0)
            assert len(batcher._queue) == 40  # all 40 accepted, none sent yet
            for task in tasks[::2]:
                task.cancel()
            await batcher.close()
            done = await asyncio.gather(*tasks, return_exceptions=True)
        stored = sorted([int(await data_at(conn, "ATOM", seq)) for seq in range(1, 41)])
        return done, stored, (await stream_info(conn, "ATOM"))["state"]

    done, stored, state = run(settings, body)
    assert sum(isinstance(d, asyncio.CancelledError) for d in done) == 20
    assert state["messages"] == 40
    assert stored == list(range(40))


def test_invalid_configuration():
    class FakeConn:
        settings = type("S", (), {"request_timeout": 1})()

    with pytest.raises(InvalidRequestError):
        Batcher(FakeConn(), max_batch=0)
    with pytest.raises(InvalidRequestError):
        Batcher(FakeConn(), max_batch=10, max_pending=5)
