"""JetStreamConsumeOperator on a real server: acks after success, a retry after a failure half way
loses and repeats nothing, batches, max_messages, term_on, ordered range reads, typed bad input."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from airflow_jetstream.client.admin.consumers import consumer_info, ensure_consumer, list_consumers
from airflow_jetstream.client.admin.streams import ensure_stream
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import (
    ApplyFunctionError,
    ConsumerConfigError,
    InvalidFunctionError,
    InvalidRequestError,
)
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsServer
from airflow_jetstream.operators.consume import JetStreamConsumeOperator
from tests.support.polling import async_wait_until
from tests.support.servers import default_conn_id, module_server

SEEN: list[int] = []
BATCHES: list[list[int]] = []


def record(message, fail_at: int | None = None) -> None:
    """Module-level apply_function (importable by dotted path): fails once, on its first delivery of fail_at."""
    if message.seq == fail_at and message.delivered == 1:
        raise RuntimeError(f"cannot handle order {message.json()['order']}")
    SEEN.append(message.seq)


def record_batch(messages) -> None:
    BATCHES.append([m.seq for m in messages])


def parse(message) -> None:
    message.json()  # ValueError for a payload that is not JSON
    SEEN.append(message.seq)


def _forget_seen() -> None:
    SEEN.clear()
    BATCHES.clear()


server = module_server("consume")
conn_id = default_conn_id(before=_forget_seen)


def _run(server: EmbeddedNatsServer, coro_fn, *args):
    async def main():
        settings = ConnectionSettings(servers=server.url, connect_timeout=2, request_timeout=3)
        async with open_connection(settings) as conn:
            return await coro_fn(conn, *args)
    return asyncio.run(main())


async def _stream_with(conn, name: str, payloads: list[bytes], **config) -> None:
    await ensure_stream(conn, {"name": name, "subjects": [f"{name.lower()}.>"], **config})
    for index, payload in enumerate(payloads):
        await conn.js.publish(f"{name.lower()}.{index % 2}", payload)


def _orders(n: int) -> list[bytes]:
    return [json.dumps({"order": i}).encode() for i in range(1, n + 1)]


def test_retry_after_a_failure_half_way_loses_and_repeats_nothing(conn_id, server) -> None:
    _run(server, _stream_with, "CONS_RETRY", _orders(10))
    kwargs = dict(task_id="consume", stream="CONS_RETRY", consumer="billing",
                  apply_function="tests.test_consume_operator.record", apply_function_kwargs={"fail_at": 6},
                  batch_size=4, fetch_timeout=0.5, nak_delay=0)
    with pytest.raises(ApplyFunctionError) as failed:
        JetStreamConsumeOperator(**kwargs).execute({})
    assert failed.value.reason == "apply_function_failed"
    assert "seq 6" in str(failed.value) and "cannot handle order 6" in str(failed.value)
    assert SEEN == [1, 2, 3, 4, 5]  # acked one by one up to the failure

    summary = JetStreamConsumeOperator(**kwargs).execute({})  # the task retry
    assert list(range(1, 11)) == SEEN, "every message exactly once over both tries"
    assert summary == {"mode": "durable", "stream": "CONS_RETRY", "consumer": "billing", "processed": 5,
                       "acked": 5, "terminated": 0, "batches": 5, "first_seq": 6, "last_seq": 10,
                       "stopped": "no_messages", "num_pending": 0, "num_ack_pending": 0}
    json.dumps(summary)


def test_a_failed_message_waits_out_its_back_off_and_stays_pending(conn_id, server) -> None:
    _run(server, _stream_with, "CONS_BACKOFF", _orders(5))
    kwargs = dict(task_id="consume", stream="CONS_BACKOFF", consumer="billing", apply_function=record,
                  apply_function_kwargs={"fail_at": 3}, fetch_timeout=0.5, nak_delay=[600])
    with pytest.raises(ApplyFunctionError, match="redelivered after 600 s"):
        JetStreamConsumeOperator(**kwargs).execute({})
    retry = JetStreamConsumeOperator(**kwargs).execute({})
    assert SEEN == [1, 2, 4, 5]  # seq 3 is in its back-off: the retry goes on with the rest
    assert (retry["num_pending"], retry["num_ack_pending"]) == (0, 1), "seq 3 is not lost: it awaits redelivery"
    info = _run(server, consumer_info, "CONS_BACKOFF", "billing")
    assert info["ack_floor"]["stream_seq"] == 2  # everything after seq 2 but seq 3 is acknowledged


def test_batches_and_max_messages_leave_the_rest_for_the_next_run(conn_id, server) -> None:
    _run(server, _stream_with, "CONS_BATCH", _orders(10))
    kwargs = dict(task_id="consume", stream="CONS_BATCH", consumer="batcher", filter_subjects=["cons_batch.>"],
                  apply_function_batch=record_batch, batch_size=3, fetch_timeout=0.5)
    first = JetStreamConsumeOperator(max_messages=7, **kwargs).execute({})
    assert [len(b) for b in BATCHES] == [3, 3, 1]
    assert (first["processed"], first["stopped"], first["num_pending"]) == (7, "max_messages", 3)
    second = JetStreamConsumeOperator(**kwargs).execute({})
    assert sorted(seq for batch in BATCHES for seq in batch) == list(range(1, 11))
    assert (second["processed"], second["first_seq"], second["last_seq"]) == (3, 8, 10)


def test_a_batch_is_a_whole_pull_request_even_when_its_messages_arrive_one_by_one(conn_id, server) -> None:
    """Messages published one at a time into an open pull request arrive in separate reads: the batch
    still holds the request's ``batch_size`` messages (it used to be cut at the first one)."""
    _run(server, _stream_with, "CONS_TRICKLE", [])
    _run(server, ensure_consumer, "CONS_TRICKLE", {"durable_name": "trickle", "ack_policy": "explicit"})

    async def publish_into_the_waiting_request(conn) -> None:
        async def waiting() -> bool:
            return (await consumer_info(conn, "CONS_TRICKLE", "trickle"))["num_waiting"] >= 1
        await async_wait_until(waiting, "the operator's pull request")
        for payload in _orders(3):
            await conn.js.publish("cons_trickle.0", payload)  # each acked before the next is sent

    publisher = threading.Thread(target=_run, args=(server, publish_into_the_waiting_request))
    publisher.start()
    try:
        summary = JetStreamConsumeOperator(task_id="consume", stream="CONS_TRICKLE", consumer="trickle",
                                           apply_function_batch=record_batch, batch_size=3, max_messages=3,
                                           fetch_timeout=30).execute({})
    finally:
        publisher.join(timeout=60)
    assert BATCHES == [[1, 2, 3]]
    assert (summary["processed"], summary["stopped"]) == (3, "max_messages")


def test_term_on_terminates_bad_messages_and_goes_on(conn_id, server) -> None:
    _run(server, _stream_with, "CONS_TERM", [b'{"order": 1}', b"not json", b'{"order": 3}'])
    summary = JetStreamConsumeOperator(task_id="consume", stream="CONS_TERM", consumer="parser",
                                       apply_function=parse, term_on=["json.JSONDecodeError"],
                                       fetch_timeout=0.5).execute({})
    assert SEEN == [1, 3]
    assert (summary["processed"], summary["terminated"], summary["num_pending"], summary["num_ack_pending"]) == \
        (2, 1, 0, 0)


def test_ordered_read_of_a_range_keeps_no_cursor_and_a_retry_rereads_it(conn_id, server) -> None:
    _run(server, _stream_with, "CONS_RANGE", _orders(8))
    kwargs = dict(task_id="replay", stream="CONS_RANGE", start_seq="3", end_seq="6",
                  apply_function=record, apply_function_kwargs={"fail_at": 5}, fetch_timeout=0.5)
    with pytest.raises(ApplyFunctionError, match="reads the range again"):
        JetStreamConsumeOperator(**kwargs).execute({})
    assert SEEN == [3, 4]
    SEEN.clear()
    summary = JetStreamConsumeOperator(**{**kwargs, "apply_function_kwargs": {}}).execute({})
    assert SEEN == [3, 4, 5, 6]
    assert summary["mode"] == "ordered" and summary["acked"] == 0
    assert (summary["first_seq"], summary["last_seq"], summary["next_seq"], summary["range"]) == (3, 6, 7, [3, 6])
    # no cursor on the server: at most the failed read's ephemeral consumer, which the server drops when idle
    assert all(not c["config"].get("durable_name") and c["config"]["inactive_threshold"]
               for c in _run(server, list_consumers, "CONS_RANGE"))


def test_bad_input_is_a_typed_error_naming_the_fix(conn_id, server) -> None:
    with pytest.raises(InvalidFunctionError, match="exactly one of"):
        JetStreamConsumeOperator(task_id="t", stream="S", apply_function=record, apply_function_batch=record_batch)
    with pytest.raises(InvalidRequestError, match="batch_size must be"):
        JetStreamConsumeOperator(task_id="t", stream="S", apply_function=record, batch_size=0)
    with pytest.raises(InvalidFunctionError, match="term_on"):
        JetStreamConsumeOperator(task_id="t", stream="S", apply_function=record, term_on=["json.dumps"])
    with pytest.raises(InvalidFunctionError, match="cannot import module") as missing:
        JetStreamConsumeOperator(task_id="t", stream="S", apply_function="no_such_pkg.handle").execute({})
    assert missing.value.reason == "invalid_function"

    async def push_consumer(conn):
        await _stream_with(conn, "CONS_PUSH", _orders(1))
        await ensure_consumer(conn, "CONS_PUSH", {"durable_name": "pushy", "deliver_subject": "deliver.pushy"})
    _run(server, push_consumer)
    with pytest.raises(ConsumerConfigError, match="pull consumer") as push:
        JetStreamConsumeOperator(task_id="t", stream="CONS_PUSH", consumer="pushy", apply_function=record,
                                 fetch_timeout=0.5).execute({})
    assert push.value.reason == "not_pull_consumer"
    assert SEEN == []
