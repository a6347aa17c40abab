"""Atomic batch publish against a real nats-server: commit, validation, server errors, retries, idempotency."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from airflow_jetstream.client import BatchMessage, metrics, publish_atomic_batch, stream_info
from airflow_jetstream.client.batches.atomic import publish_atomic_batches
from airflow_jetstream.client.batches.wire import encode_frame, stored_sequences
from airflow_jetstream.client.errors import BatchPublishError, InvalidRequestError, InvalidSubjectError
from airflow_jetstream.client.natspy_internals import write_raw
from tests.support.nats_calls import with_streams

ATOM = {"name": "ATOM", "subjects": ["atom.>"], "allow_atomic": True}


def run(settings, body, stream=ATOM):
    return with_streams(settings, body, [stream] if stream else [])


async def get_msg(conn, stream: str, seq: int) -> dict:
    reply = await conn.api_request(f"STREAM.MSG.GET.{stream}", {"seq": seq})
    return reply["message"]


async def state(conn, stream: str = "ATOM") -> dict:
    return (await stream_info(conn, stream))["state"]


def test_commit_stores_all_messages_in_order_with_headers(settings):
    async def body(conn):
        await conn.js.publish("atom.before", b"0")
        msgs = [
            BatchMessage("atom.a", b"one", headers={"X-Trace": "t1"}, msg_id="m1"),
            BatchMessage("atom.b", b"two"),
            BatchMessage("atom.a", b"three", msg_id="m3"),
        ]
        result = await publish_atomic_batch(conn, msgs, batch_id="b-1")
        stored = [await get_msg(conn, "ATOM", seq) for seq in range(2, 5)]
        return result, stored, await state(conn)

    result, stored, st = run(settings, body)
    assert result.to_dict() == {"stream": "ATOM", "batch": "b-1", "count": 3, "first_seq": 2, "last_seq": 4,
                                "already_committed": False, "duplicates": 0}
    assert [m["subject"] for m in stored] == ["atom.a", "atom.b", "atom.a"]
    assert [base64.b64decode(m["data"]) for m in stored] == [b"one", b"two", b"three"]
    first_headers = base64.b64decode(stored[0]["hdrs"]).decode()
    assert "X-Trace: t1" in first_headers and "Nats-Msg-Id: m1" in first_headers
    assert st["messages"] == 4 and st["last_seq"] == 4


def test_single_message_batch_and_flow_control(settings):
    async def body(conn):
        one = await publish_atomic_batch(conn, [BatchMessage("atom.x", b"solo")])
        many = await publish_atomic_batch(conn, [BatchMessage("atom.x", b"%d" % i) for i in range(450)],
                                          flow_every=100)
        return one, many, await state(conn)

    one, many, st = run(settings, body)
    assert (one.count, one.first_seq, one.last_seq) == (1, 1, 1)
    assert (many.count, many.first_seq, many.last_seq) == (450, 2, 451)
    assert st["messages"] == 451


@pytest.mark.parametrize(
    ("messages", "kwargs", "error", "reason"),
    [
        ([], {}, InvalidRequestError, "empty_batch"),
        ([BatchMessage("atom.x", b"")] * 6, {"max_msgs": 5}, InvalidRequestError, "batch_too_large"),
        ([BatchMessage("atom.x", b"")], {"batch_id": "x" * 65}, InvalidRequestError, "batch_id_invalid"),
        ([BatchMessage("atom.x", b"")], {"batch_id": "has.dot"}, InvalidRequestError, "batch_id_invalid"),
        ([BatchMessage("atom.x", b""), BatchMessage("atom.*", b"")], {}, InvalidSubjectError, "invalid_subject"),
        ([BatchMessage("atom.x", b"x" * (2 * 1024 * 1024))], {}, InvalidRequestError, "payload_too_large"),
        ([BatchMessage("atom.x", b"", headers={"Nats-Expected-Last-Msg-Id": "a"})], {}, InvalidRequestError,
         "unsupported_header"),
        ([BatchMessage("atom.x", b"", headers={"Nats-Batch-Id": "mine"})], {}, InvalidRequestError,
         "unsupported_header"),
        ([BatchMessage("atom.x", b"", headers={"Bad Key": "v"})], {}, InvalidRequestError, "invalid_header"),
        ([BatchMessage("atom.x", b"", headers={"K": "a\r\nPUB x 1"})], {}, InvalidRequestError, "invalid_header"),
        ([BatchMessage("atom.x", b"", msg_id="same"), BatchMessage("atom.y", b"", msg_id="same")], {},
         InvalidRequestError, "duplicate_msg_id"),
        ([BatchMessage("atom.x", "text")], {}, InvalidRequestError, "invalid_payload"),
        ([BatchMessage("atom.x", b"")], {"expected_last_seq": -1}, InvalidRequestError, "invalid_request"),
    ],
)
def test_invalid_batches_are_refused_before_sending(settings, nats_server, messages, kwargs, error, reason):
    async def body(conn):
        await conn.nc.flush()
        before = nats_server.monitor("varz")["in_msgs"]
        with pytest.raises(error) as info:
            await publish_atomic_batch(conn, messages, **kwargs)
        await conn.nc.flush()
        return info.value, before, nats_server.monitor("varz")["in_msgs"], await state(conn)

    exc, before, after, st = run(settings, body)
    assert exc.reason == reason
    assert after == before, "nothing may be sent for an invalid batch"
    assert st["messages"] == 0


def test_stream_without_allow_atomic(settings):
    async def body(conn):
        with pytest.raises(BatchPublishError) as info:
            await publish_atomic_batch(conn, [BatchMessage("plain.x", b"1"), BatchMessage("plain.x", b"2")])
        return info.value, await state(conn, "PLAIN")

    exc, st = run(settings, body, stream={"name": "PLAIN", "subjects": ["plain.>"]})
    assert exc.reason == "stream_not_atomic" and exc.err_code == 10174
    assert "allow_atomic" in str(exc)
    assert st["messages"] == 0


def test_no_stream_for_subject(settings):
    async def body(conn):
        with pytest.raises(BatchPublishError) as info:
            await publish_atomic_batch(conn, [BatchMessage("nowhere.x", b"1")], timeout=2)
        return info.value

    assert run(settings, body).reason == "no_stream_for_subject"


def test_a_later_subject_without_a_stream_is_named_and_never_read_as_an_election(settings, caplog):
    """Only the 2nd subject lacks a stream: refused at once naming it, no re-send, nothing stored."""
    async def body(conn):
        with pytest.raises(BatchPublishError) as info:
            await publish_atomic_batch(conn, [BatchMessage("atom.x", b"1"), BatchMessage("nowhere.y", b"2")],
                                       timeout=2)
        return info.value, (await stream_info(conn, "ATOM"))["state"]["messages"]

    with caplog.at_level("INFO", logger="airflow_jetstream"):
        refused, stored = run(settings, body)
    assert refused.reason == "no_stream_for_subject" and "no stream captures 'nowhere.y'" in str(refused)
    assert "'atom.x'" not in str(refused)
    assert stored == 0
    assert not [r for r in caplog.records if "re-sending" in r.getMessage()], "not retried as an election"


def test_server_max_msgs_is_batch_too_large(nats_server_factory):
    from airflow_jetstream.client import ConnectionSettings

    server = nats_server_factory(jetstream={"limits": {"batch": {"max_msgs": 10}}})

    async def body(conn):
        with pytest.raises(BatchPublishError) as info:
            await publish_atomic_batch(conn, [BatchMessage("atom.x", b"%d" % i) for i in range(11)])
        return info.value, await state(conn)

    exc, st = run(ConnectionSettings(servers=server.url), body)
    assert exc.reason == "batch_too_large" and exc.err_code == 10199
    assert st["messages"] == 0


def test_expected_last_seq_and_per_subject_expectation(settings):
    async def body(conn):
        first = await publish_atomic_batch(conn, [BatchMessage("atom.a", b"1"), BatchMessage("atom.b", b"2")],
                                           expected_last_seq=0)
        with pytest.raises(BatchPublishError) as stale:
            await publish_atomic_batch(conn, [BatchMessage("atom.a", b"3")] * 2, expected_last_seq=0)
        with pytest.raises(BatchPublishError) as subject_stale:
            await publish_atomic_batch(conn, [BatchMessage("atom.c", b"4"),
                                              BatchMessage("atom.a", b"5", expected_last_subject_seq=7)])
        ok = await publish_atomic_batch(conn, [BatchMessage("atom.a", b"6", expected_last_subject_seq=1),
                                               BatchMessage("atom.b", b"7")], expected_last_seq=2)
        return first, stale.value, subject_stale.value, ok, await state(conn)

    first, stale, subject_stale, ok, st = run(settings, body)
    assert (first.first_seq, first.last_seq) == (1, 2)
    assert stale.reason == "wrong_last_sequence"
    assert subject_stale.reason == "wrong_last_sequence"
    assert (ok.first_seq, ok.last_seq) == (3, 4)
    assert st["messages"] == 4, "refused batches store nothing"


def test_retry_of_committed_batch_is_idempotent(settings):
    msgs = [BatchMessage("atom.x", b"%d" % i, msg_id=f"order-{i}") for i in range(20)]

    async def body(conn):
        first = await publish_atomic_batch(conn, msgs)
        again = await publish_atomic_batch(conn, msgs)
        probe = await stored_sequences(conn, [*msgs, BatchMessage("atom.x", b"", msg_id="never-sent")])
        st_after_probe = await state(conn)
        with pytest.raises(BatchPublishError) as partial:
            await publish_atomic_batch(conn, [*msgs[:3], BatchMessage("atom.x", b"new", msg_id="fresh")])
        return first, again, probe, st_after_probe, partial.value, await state(conn)

    first, again, probe, st_probe, partial, st = run(settings, body)
    assert not first.already_committed
    assert again.already_committed
    assert (again.first_seq, again.last_seq, again.count, again.stream) == (1, 20, 20, "ATOM")
    assert probe == [*list(range(1, 21)), None]
    assert st_probe["messages"] == 20 and st_probe["last_seq"] == 20, "probing must not write"
    assert partial.reason == "duplicate_msg_id" and "3 of 4" in str(partial)
    assert "'order-0' (seq 1), 'order-1' (seq 2), 'order-2' (seq 3)" in str(partial), "names the stored ids"
    assert st["messages"] == 20


def test_one_msg_id_per_batch_makes_a_retry_idempotent(settings):
    """An id on the first message names the whole batch: it is stored whole, in one run of sequences."""
    named = [BatchMessage("atom.x", b"%d" % i, msg_id="chunk-7" if i == 0 else None) for i in range(50)]
    pair = [BatchMessage("atom.x", b"a", msg_id="a"), BatchMessage("atom.x", b"b", msg_id="b")]

    async def body(conn):
        await publish_atomic_batch(conn, [BatchMessage("atom.x", b"before")])
        first = await publish_atomic_batch(conn, named)
        again = await publish_atomic_batch(conn, named)
        await publish_atomic_batch(conn, pair)
        with pytest.raises(BatchPublishError) as reordered:
            await publish_atomic_batch(conn, pair[::-1])
        return first, again, reordered.value, await state(conn)

    first, again, reordered, st = run(settings, body)
    assert (first.first_seq, first.last_seq, first.already_committed) == (2, 51, False)
    assert (again.first_seq, again.last_seq, again.count, again.already_committed) == (2, 51, 50, True)
    assert reordered.reason == "duplicate_msg_id" and "not as one earlier commit" in str(reordered)
    assert st["messages"] == 53, "neither the retry nor the reordered batch stored anything"


def test_too_many_inflight_is_retried_with_backoff(nats_server_factory):
    from airflow_jetstream.client import ConnectionSettings

    server = nats_server_factory(jetstream={"limits": {"batch": {"max_inflight_per_stream": 1}}})
    class Sink:
        def __init__(self):
            self.retried: asyncio.Event | None = None

        def incr(self, name, count=1, tags=None):
            if name == "batch.retried" and self.retried is not None:
                self.retried.set()

        def timing(self, name, millis, tags=None):
            return None

        def gauge(self, name, value, tags=None):
            return None

    sink = Sink()

    async def body(conn):
        sink.retried = asyncio.Event()
        # Another client holds the stream's only in-flight slot with an open batch.
        reply = conn.nc.new_inbox()
        sub = await conn.nc.subscribe(reply)
        blocker = b"Nats-Batch-Id: blocker\r\nNats-Batch-Sequence: 1\r\n"
        await write_raw(conn.nc, encode_frame(b"atom.x", reply.encode(), blocker, b"b"))
        await sub.next_msg(timeout=2)
        with pytest.raises(BatchPublishError) as refused:
            await publish_atomic_batch(conn, [BatchMessage("atom.x", b"1")], retries=0)
        task = asyncio.ensure_future(publish_atomic_batch(conn, [BatchMessage("atom.y", b"1")] * 3, retries=50))
        await asyncio.wait_for(sink.retried.wait(), 5)
        commit = b"Nats-Batch-Id: blocker\r\nNats-Batch-Sequence: 2\r\nNats-Batch-Commit: 1\r\n"
        await write_raw(conn.nc, encode_frame(b"atom.x", reply.encode(), commit, b"c"))
        committed = json.loads((await sub.next_msg(timeout=5)).data)
        assert committed["count"] == 2, committed
        result = await asyncio.wait_for(task, 20)
        return refused.value, result, await state(conn)

    metrics.set_metrics_sink(sink)
    try:
        refused, result, st = run(ConnectionSettings(servers=server.url), body)
    finally:
        metrics.set_metrics_sink(None)
    assert refused.reason == "too_many_inflight" and refused.code == 429
    assert result.count == 3 and result.last_seq == 5
    assert st["messages"] == 5


def test_many_batches_with_two_in_flight(settings, nats_server):
    async def body(conn):
        msgs = [BatchMessage("atom.m", b"%d" % i) for i in range(2500)]
        results = await publish_atomic_batches(conn, msgs, batch_size=1000, concurrency=2)
        await conn.nc.flush()
        before = nats_server.monitor("varz")["in_msgs"]
        with pytest.raises(InvalidSubjectError):
            await publish_atomic_batches(conn, [*msgs[:1500], BatchMessage("atom.>", b"")], batch_size=1000)
        await conn.nc.flush()
        sent_for_invalid = nats_server.monitor("varz")["in_msgs"] - before
        return results, sent_for_invalid, await state(conn)

    results, sent_for_invalid, st = run(settings, body)
    assert [r.count for r in results] == [1000, 1000, 500]
    assert all(r.last_seq - r.first_seq + 1 == r.count for r in results)
    assert sorted(s for r in results for s in range(r.first_seq, r.last_seq + 1)) == list(range(1, 2501))
    assert sent_for_invalid == 0, "an invalid chunk anywhere stops every chunk before sending"
    assert st["messages"] == 2500


@pytest.mark.parametrize(
    ("err_code", "code", "reason"),
    [
        (10174, 400, "stream_not_atomic"),
        (10175, 400, "batch_sequence_missing"),
        (10176, 400, "batch_incomplete"),
        (10199, 400, "batch_too_large"),
        (10179, 400, "batch_id_invalid"),
        (10200, 400, "batch_commit_invalid"),
        (10210, 429, "too_many_inflight"),
        (10071, 400, "wrong_last_sequence"),
        (10164, 400, "wrong_last_sequence"),
        (10201, 400, "duplicate_msg_id"),
        (10177, 400, "unsupported_header"),
        (10185, 412, "api_level_too_high"),
    ],
)
def test_every_batch_error_of_the_server_is_typed(err_code, code, reason):
    """The server's refusals (wire facts table) become BatchPublishErrors with a reason and a hint."""
    from airflow_jetstream.client.batches.wire import parse_reply

    reply = json.dumps({"error": {"code": code, "err_code": err_code, "description": "server text"},
                        "stream": "ATOM", "seq": 0}).encode()
    with pytest.raises(BatchPublishError) as info:
        parse_reply(reply, "atomic batch b1")
    assert (info.value.reason, info.value.code, info.value.err_code) == (reason, code, err_code)
    assert str(info.value).startswith("atomic batch b1: server text; ")
