"""Fast (non-atomic) batch publish against a real nats-server: flow control, duplicates, gaps, errors."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import replace

import pytest

from airflow_jetstream.client import BatchMessage, publish_fast_batch, stream_info
from airflow_jetstream.client.batches import fast as fast_batch_module
from airflow_jetstream.client.batches.fast import FastBatchRun
from airflow_jetstream.client.connection import connect
from airflow_jetstream.client.errors import (
    BatchPublishError,
    FastBatchError,
    InvalidRequestError,
    LeaderUnavailableError,
    RequestTimeoutError,
)
from tests.support.nats_calls import with_streams
from tests.support.tcp_proxy import CuttableProxy

FAST = {"name": "FAST", "subjects": ["fast.>"], "allow_batched": True}


def run(settings, body, stream=FAST):
    return with_streams(settings, body, [stream] if stream else [])


async def contents(conn, stream: str = "FAST") -> list[bytes]:
    last = (await stream_info(conn, stream))["state"]["last_seq"]
    out = []
    for seq in range(1, last + 1):
        reply = await conn.api_request(f"STREAM.MSG.GET.{stream}", {"seq": seq})
        out.append(base64.b64decode(reply["message"].get("data", "")))
    return out


def test_bulk_publish_with_flow_control(settings):
    payloads = [b"m%05d" % i for i in range(3000)]

    async def body(conn):
        result = await publish_fast_batch(conn, [BatchMessage("fast.x", p) for p in payloads], flow=64)
        return result, await contents(conn)

    result, stored = run(settings, body)
    assert result.count == 3000 and result.last_seq == 3000 and result.stream == "FAST"
    assert result.first_seq is None
    assert stored == payloads


def test_single_message_and_headers(settings):
    async def body(conn):
        result = await publish_fast_batch(conn, [BatchMessage("fast.one", b"1", headers={"X-K": "v"}, msg_id="a")])
        msg = (await conn.api_request("STREAM.MSG.GET.FAST", {"seq": 1}))["message"]
        return result, base64.b64decode(msg["hdrs"]).decode()

    result, headers = run(settings, body)
    assert result.count == 1 and result.last_seq == 1
    assert "X-K: v" in headers and "Nats-Msg-Id: a" in headers


def test_stream_without_allow_batched(settings):
    async def body(conn):
        with pytest.raises(BatchPublishError) as info:
            await publish_fast_batch(conn, [BatchMessage("slow.x", b"1")] * 3)
        return info.value, (await stream_info(conn, "SLOW"))["state"]["messages"]

    exc, stored = run(settings, body, stream={"name": "SLOW", "subjects": ["slow.>"]})
    assert exc.reason == "stream_not_batched" and exc.err_code == 10205
    assert stored == 0


@pytest.mark.parametrize(
    ("messages", "kwargs", "reason"),
    [
        ([], {}, "empty_batch"),
        ([BatchMessage("fast.x", b"")], {"batch_id": "x" * 61}, "batch_id_invalid"),
        ([BatchMessage("fast.x", b"")], {"flow": 0}, "invalid_request"),
        ([BatchMessage("fast.>", b"")], {}, "invalid_subject"),
        ([BatchMessage("fast.x", b"", headers={"Nats-Batch-Id": "x"})], {}, "unsupported_header"),
        ([BatchMessage("fast.x", b"", headers={"Nats-Expected-Last-Msg-Id": "m1"})], {}, "unsupported_header"),
    ],
)
def test_invalid_input_sends_nothing(settings, nats_server, messages, kwargs, reason):
    async def body(conn):
        await conn.nc.flush()
        before = nats_server.monitor("varz")["in_msgs"]
        with pytest.raises(InvalidRequestError) as info:
            await publish_fast_batch(conn, messages, **kwargs)
        await conn.nc.flush()
        return info.value, before, nats_server.monitor("varz")["in_msgs"]

    exc, before, after = run(settings, body)
    assert exc.reason == reason
    assert after == before


def test_duplicates_are_skipped_but_counted(settings):
    async def body(conn):
        for i in range(5):
            await conn.js.publish("fast.x", b"old%d" % i, headers={"Nats-Msg-Id": f"id-{i}"})
        msgs = [BatchMessage("fast.x", b"new%d" % i, msg_id=f"id-{i}") for i in range(10)]
        result = await publish_fast_batch(conn, msgs)
        return result, await contents(conn)

    result, stored = run(settings, body)
    assert result.count == 10
    assert stored == [b"old%d" % i for i in range(5)] + [b"new%d" % i for i in range(5, 10)]


def test_duplicate_probes_failing_after_the_batch_is_stored_say_what_is_stored(nats_server, settings):
    """The msg id probes that count a fast batch's duplicates run after the server stored the batch: when they
    fail (here the connection stops reaching the server once the final ack came back), the error is a
    FastBatchError with what is stored, caused by the probe's error, not the probe's own error."""
    marker = b'"batch":"dup-probe"'

    async def body(conn):
        for i in range(5):
            await conn.js.publish("fast.x", b"old%d" % i, headers={"Nats-Msg-Id": f"id-{i}"})
        proxy = await CuttableProxy(nats_server.port, hold_after=marker).start()
        client = await connect(replace(settings, servers=f"nats://127.0.0.1:{proxy.port}", request_timeout=0.5),
                               allow_reconnect=False)
        msgs = [BatchMessage("fast.x", b"new%d" % i, msg_id=f"id-{i}") for i in range(10)]
        try:
            with pytest.raises(FastBatchError) as info:
                await publish_fast_batch(client, msgs, batch_id="dup-probe")
        finally:
            await client.close()
            await proxy.close()
        return proxy.holding, info.value, await contents(conn)

    holding, exc, stored = run(settings, body)
    assert holding, "the probes ran after the final ack"
    assert exc.stored == 10 and exc.total == 10 and exc.stream == "FAST"
    assert isinstance(exc.__cause__, RequestTimeoutError) and exc.reason == "timeout"
    assert "the msg id probes counting its duplicates failed after the server stored it" in str(exc)
    assert "the first 10 of its 10 messages are stored in stream 'FAST'" in str(exc)
    assert stored == [b"old%d" % i for i in range(5)] + [b"new%d" % i for i in range(5, 10)]


def test_gap_is_healed_by_resuming(settings, monkeypatch):
    """A message lost on the way makes the server end the batch; the rest is re-sent once, in order."""
    original = FastBatchRun.encode
    dropped: list[int] = []

    def lossy_encode(self, first, last):
        if not dropped and first <= 150 <= last:
            dropped.append(150)
            return original(self, first, 149) + original(self, 151, last)
        return original(self, first, last)

    monkeypatch.setattr(FastBatchRun, "encode", lossy_encode)
    payloads = [b"%04d" % i for i in range(400)]

    async def body(conn):
        result = await publish_fast_batch(conn, [BatchMessage("fast.g", p) for p in payloads], flow=50)
        return result, await contents(conn)

    result, stored = run(settings, body)
    assert dropped == [150]
    assert result.count == 400
    assert stored == payloads, "every message exactly once, in order"


def test_server_error_mid_batch_reports_what_was_stored(settings):
    stream = {**FAST, "max_msg_size": 100}

    async def body(conn):
        msgs = [BatchMessage("fast.x", b"ok%d" % i) for i in range(20)]
        msgs[12] = BatchMessage("fast.x", b"x" * 500)
        with pytest.raises(BatchPublishError) as info:
            await publish_fast_batch(conn, msgs, flow=4)
        return info.value, await contents(conn)

    exc, stored = run(settings, body, stream=stream)
    assert exc.stored == 12 and exc.total == 20 and exc.reason == "message_too_large"
    assert "the first 12 of its 20 messages are stored" in str(exc)
    assert stored == [b"ok%d" % i for i in range(12)]


def test_concurrent_fast_batches(settings):
    async def body(conn):
        batches = [[BatchMessage(f"fast.{k}", b"%d-%d" % (k, i)) for i in range(500)] for k in range(3)]
        results = await asyncio.gather(*(publish_fast_batch(conn, b, flow=100) for b in batches))
        return results, await contents(conn)

    results, stored = run(settings, body)
    assert [r.count for r in results] == [500, 500, 500]
    assert len(stored) == 1500
    for k in range(3):
        mine = [s for s in stored if s.startswith(b"%d-" % k)]
        assert mine == [b"%d-%d" % (k, i) for i in range(500)], "each batch keeps its own order"


@pytest.mark.parametrize("headers", [None, {"X-Multi": ["a", "b"], "X-One": "1"}], ids=["plain", "repeated_header"])
def test_interrupted_batch_unknown_to_the_leader_is_counted_in_the_stream(settings, monkeypatch, caplog, headers):
    """When no leader knows an interrupted batch any more (simulated: the ping finds nothing), its messages
    are counted by reading the stream back, skipping another publisher's messages stored in between;
    the resume then stores each message exactly once (also messages with a repeated header, which the count
    compares value by value)."""
    original_send = FastBatchRun._send
    interrupted: list[int] = []

    async def send_then_lose_the_leader(self):
        if interrupted:
            return await original_send(self)
        full = self.messages
        self.messages = full[:120]  # the first 120 are stored, then the leader "goes away"
        await original_send(self)
        self.messages = full
        interrupted.append(120)
        for i in range(3):
            await self.conn.js.publish("fast.other", b"other%d" % i)
        raise LeaderUnavailableError("simulated: the stream has no leader")

    async def no_leader_knows_the_batch(self):
        return None

    monkeypatch.setattr(FastBatchRun, "_send", send_then_lose_the_leader)
    monkeypatch.setattr(FastBatchRun, "_settle", no_leader_knows_the_batch)
    payloads = [b"p%04d" % i for i in range(300)]

    async def body(conn):
        result = await publish_fast_batch(conn, [BatchMessage("fast.i", p, headers) for p in payloads], flow=50)
        return result, await contents(conn)

    with caplog.at_level("WARNING", logger=fast_batch_module.__name__):
        result, stored = run(settings, body)
    assert interrupted == [120]
    assert result.count == 300
    assert stored == [*payloads[:120], b"other0", b"other1", b"other2", *payloads[120:]]
    assert any("120 of 300 messages stored (counted in the stream)" in r.getMessage() for r in caplog.records)


def test_interrupted_batch_on_a_workqueue_stream_says_the_count_is_unknown(settings, monkeypatch):
    """On a WorkQueue stream messages may be consumed before they are counted: without the server's own
    count the error says stored is unknown (None) instead of guessing, and nothing is resumed."""
    original_send = FastBatchRun._send

    async def send_then_lose_the_leader(self):
        self.messages = self.messages[:50]
        await original_send(self)
        raise LeaderUnavailableError("simulated: the stream has no leader")

    async def no_leader_knows_the_batch(self):
        return None

    monkeypatch.setattr(FastBatchRun, "_send", send_then_lose_the_leader)
    monkeypatch.setattr(FastBatchRun, "_settle", no_leader_knows_the_batch)
    stream = {**FAST, "retention": "workqueue"}

    async def body(conn):
        with pytest.raises(BatchPublishError) as info:
            await publish_fast_batch(conn, [BatchMessage("fast.w", b"%d" % i) for i in range(100)])
        return info.value, await contents(conn)

    exc, stored = run(settings, body, stream=stream)
    assert exc.stored is None and exc.total == 100 and exc.reason == "stored_unknown"
    assert "after seq 0" in str(exc)
    assert len(stored) == 50


def test_connection_closed_mid_batch_is_a_fast_batch_error(settings, monkeypatch):
    """The connection closes for good between two writes of a batch (the client's own close: a real closed
    connection at a chosen moment): the error is a FastBatchError saying how many are stored is unknown, not the
    write's ConnectionFailedError."""
    real_write = fast_batch_module.write_raw
    writes: list[int] = []

    async def close_before_the_second_write(nc, frames):
        writes.append(len(frames))
        if len(writes) == 2:
            await nc.close()
        await real_write(nc, frames)

    monkeypatch.setattr(fast_batch_module, "write_raw", close_before_the_second_write)

    async def body(conn):
        own = await connect(settings, allow_reconnect=False)
        with pytest.raises(FastBatchError) as info:
            await publish_fast_batch(own, [BatchMessage("fast.c", b"%d" % i) for i in range(50)], flow=10)
        return info.value, await contents(conn)

    exc, stored = run(settings, body)
    assert exc.reason == "connection_lost" and exc.stored is None and exc.total == 50
    assert "after seq 0" in str(exc)
    assert stored == [b"0"]
