"""A fast batch re-sent after an earlier attempt stored it (a retried or concurrent Spark task): the result
names where the stream holds the batch's own messages, never the stream's last sequence ("counts are facts")."""

from __future__ import annotations

from airflow_jetstream.client import BatchMessage, publish_fast_batch, stream_info
from tests.support.nats_calls import with_streams

STREAM = {"name": "RESEND", "subjects": ["resend.>"], "allow_batched": True}


def batch(first: int, last: int) -> list[BatchMessage]:
    return [BatchMessage("resend.x", b"%d" % i, msg_id=f"row-{i}") for i in range(first, last + 1)]


def test_a_fully_stored_batch_sent_again_reports_its_own_range(settings):
    async def body(conn):
        first = await publish_fast_batch(conn, batch(1, 20))
        await publish_fast_batch(conn, batch(21, 30))  # later messages: the stream ends past the first batch
        again = await publish_fast_batch(conn, batch(1, 20))
        tail = await publish_fast_batch(conn, batch(11, 20))  # the second half of the first batch
        return first, again, tail, (await stream_info(conn, "RESEND"))["state"]

    first, again, tail, state = with_streams(settings, body, [STREAM])
    assert (state["messages"], state["last_seq"]) == (30, 30)  # nothing stored twice
    assert (first.last_seq, first.duplicates) == (20, 0)
    assert (again.count, again.last_seq, again.duplicates) == (20, 20, 20)  # not 30, the stream's last
    assert (tail.count, tail.last_seq, tail.duplicates) == (10, 20, 10)


def test_a_partly_stored_batch_sent_again_ends_at_its_new_last_message_and_counts_its_duplicates(settings):
    async def body(conn):
        await publish_fast_batch(conn, batch(1, 10))
        await conn.js.publish("resend.other", b"interleaved")
        return await publish_fast_batch(conn, batch(1, 15)), (await stream_info(conn, "RESEND"))["state"]

    result, state = with_streams(settings, body, [STREAM])
    assert (state["messages"], state["last_seq"]) == (16, 16)
    assert (result.count, result.last_seq) == (15, 16)
    assert result.duplicates == 10  # the stream grew by 5 of the 15 accepted: the msg ids tell which
