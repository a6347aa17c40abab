"""JetStreamAtomicBatchPublishOperator: list, file (JSONL/Parquet), XCom in a real DAG run, split, failures."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from pathlib import Path

import pytest

from airflow_jetstream.client import ConnectionSettings, stream_info
from airflow_jetstream.client.batches.atomic import fence_count
from airflow_jetstream.client.batches.publish_chunks import check_target_stream, publish_chunks
from airflow_jetstream.client.batches.types import BatchMessage
from airflow_jetstream.client.errors import (
    BatchPublishError,
    FastBatchError,
    InvalidFunctionError,
    InvalidRequestError,
)
from airflow_jetstream.operators.publish import JetStreamAtomicBatchPublishOperator
from tests.support.airflow_cli import dag_test_env, run_airflow
from tests.support.nats_calls import requests_of, with_streams

ORDERS = {"name": "ORDERS", "subjects": ["orders.>"], "allow_atomic": True}


def admin(server, body, stream=ORDERS):
    return with_streams(ConnectionSettings(servers=server.url), body, [stream] if stream else [])


def stored(server, stream="ORDERS"):
    async def body(conn):
        last = (await stream_info(conn, stream))["state"]["last_seq"]
        out = []
        for seq in range(1, last + 1):
            msg = (await conn.api_request(f"STREAM.MSG.GET.{stream}", {"seq": seq}))["message"]
            if not msg["subject"].startswith("_FENCE."):  # the chunks' write fences are not messages of the input
                out.append((msg["subject"], base64.b64decode(msg.get("data", ""))))
        return out

    return admin(server, body, stream=None)


def test_messages_list_with_default_subject_and_data_kinds(nats_server, nats_conn):
    admin(nats_server, lambda conn: asyncio.sleep(0))
    op = JetStreamAtomicBatchPublishOperator(
        task_id="publish",
        subject="orders.new",
        stream="ORDERS",
        messages=[
            {"data": "text"},
            {"data": b"raw"},
            {"subject": "orders.vip", "data": {"id": 7, "items": [1, 2]}, "headers": {"X-Src": "t"}},
        ],
    )
    result = op.execute(context={})
    assert result == {"stream": "ORDERS", "mode": "atomic", "batch": result["batch"], "chunks": 1, "count": 3,
                      "first_seq": 1, "last_seq": 3, "already_committed": False, "already_committed_chunks": 0,
                      "duplicates": 0, "stored_exact": True, "batch_prefix": result["batch_prefix"],
                      "msg_id_prefix": None}
    assert result["batch"] == result["batch_prefix"] + "-1"
    json.dumps(result)
    assert stored(nats_server) == [("orders.new", b"text"), ("orders.new", b"raw"),
                                   ("orders.vip", b'{"id":7,"items":[1,2]}')]


def test_jsonl_file_split_into_chunks_with_chained_expectation(nats_server, nats_conn, tmp_path, capsys):
    admin(nats_server, lambda conn: asyncio.sleep(0))
    path = tmp_path / "orders.jsonl"
    path.write_text("\n".join(json.dumps({"data": {"n": i}}) for i in range(7)) + "\n\n")
    op = JetStreamAtomicBatchPublishOperator(task_id="publish", messages_file=str(path), subject="orders.f",
                                             split=True, batch_size=3, expected_last_seq="0")
    result = op.execute(context={})
    assert result["count"] == 7 and (result["first_seq"], result["last_seq"]) == (1, 7)
    assert result["chunks"] == 3
    out = capsys.readouterr().out
    assert "Validated 7 message(s); publishing them as 3 atomic batch(es) of at most 3" in out
    assert "chunk 2/3: 3 message(s) committed to ORDERS, seq 4..6" in out
    assert [json.loads(d)["n"] for _, d in stored(nats_server)] == list(range(7))


def test_parquet_file(nats_server, nats_conn, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    admin(nats_server, lambda conn: asyncio.sleep(0))
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"subject": ["orders.a", "orders.b"], "data": [b"\x00\x01", b"two"],
                             "msg_id": ["p1", "p2"]}), path)
    result = JetStreamAtomicBatchPublishOperator(task_id="publish", messages_file=str(path)).execute(context={})
    assert result["count"] == 2
    assert stored(nats_server) == [("orders.a", b"\x00\x01"), ("orders.b", b"two")]


def test_too_many_messages_without_split_fails_before_sending(nats_server, nats_conn):
    admin(nats_server, lambda conn: asyncio.sleep(0))
    op = JetStreamAtomicBatchPublishOperator(task_id="publish", subject="orders.x", batch_size=5,
                                             messages=[{"data": i} for i in range(6)])
    with pytest.raises(InvalidRequestError) as info:
        op.execute(context={})
    assert info.value.reason == "batch_too_large" and "split=True" in str(info.value)
    assert stored(nats_server) == []


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"messages": [{"data": 1}]}, "invalid_message"),  # no subject anywhere
        ({"messages": [{"subject": "orders.a", "body": 1}]}, "invalid_message"),
        ({"messages": "not json"}, "invalid_message"),
        ({"messages": [], "subject": "orders.a"}, "empty_batch"),
        ({"messages": [{"data": 1}], "messages_file": "/x.jsonl", "subject": "orders.a"}, "invalid_request"),
        ({"messages_file": "/does/not/exist.jsonl"}, "file_not_found"),
        ({"messages": [{"subject": "orders.a", "data": {1, 2}}]}, "invalid_payload"),
        ({"messages": [{"subject": "orders.a"}], "expected_last_seq": "abc"}, "invalid_request"),
    ],
)
def test_bad_input_is_rejected(nats_server, nats_conn, kwargs, reason):
    with pytest.raises(InvalidRequestError) as info:
        JetStreamAtomicBatchPublishOperator(task_id="publish", **kwargs).execute(context={})
    assert info.value.reason == reason


def test_stream_checks_happen_before_publishing(nats_server, nats_conn):
    admin(nats_server, lambda conn: asyncio.sleep(0), stream={"name": "PLAIN", "subjects": ["plain.>"]})
    admin(nats_server, lambda conn: asyncio.sleep(0), stream={**ORDERS, "name": "OTHER", "subjects": ["other.>"]})
    admin(nats_server, lambda conn: asyncio.sleep(0))
    with pytest.raises(BatchPublishError) as not_atomic:
        JetStreamAtomicBatchPublishOperator(task_id="p", stream="PLAIN", subject="plain.x",
                                            messages=[{"data": 1}]).execute(context={})
    assert not_atomic.value.reason == "stream_not_atomic"
    with pytest.raises(BatchPublishError) as wrong:
        JetStreamAtomicBatchPublishOperator(task_id="p", stream="ORDERS", subject="orders.x",
                                            messages=[{"data": 1}, {"subject": "other.y", "data": 2}]
                                            ).execute(context={})
    assert wrong.value.reason == "wrong_stream" and "'other.y' is captured by stream 'OTHER'" in str(wrong.value)
    assert stored(nats_server, "OTHER") == [] and stored(nats_server) == []


def test_the_stream_is_checked_once_per_publish(nats_server, nats_conn):
    """The operator checks the stream before validating the chunks and hands the checked stream to publish_chunks,
    which does not ask for it again (one STREAM.INFO per publish); called directly, publish_chunks checks it."""
    admin(nats_server, lambda conn: asyncio.sleep(0), stream={"name": "PLAIN", "subjects": ["plain.>"]})
    admin(nats_server, lambda conn: asyncio.sleep(0))
    info = "$JS.API.STREAM.INFO.ORDERS"
    op = JetStreamAtomicBatchPublishOperator(task_id="p", stream="ORDERS", subject="orders.x", split=True,
                                             batch_size=2, messages=[{"data": n} for n in range(5)])
    sent: list[str] = []
    publish = op._publish

    async def counted(conn, **kwargs):
        with requests_of(conn) as seen:
            try:
                return await publish(conn, **kwargs)
            finally:
                sent.extend(seen)

    op._publish = counted
    assert op.execute(context={})["count"] == 5
    assert sent.count(info) == 1

    async def direct(conn):
        chunks = [[BatchMessage(subject="orders.y", data=b"1")]]
        with requests_of(conn) as seen:
            summary = await publish_chunks(conn, chunks, stream="ORDERS")
        with pytest.raises(BatchPublishError) as refused:
            await publish_chunks(conn, [[BatchMessage(subject="plain.y", data=b"1")]], stream="PLAIN")
        unfenced = await check_target_stream(conn, "ORDERS")
        with requests_of(conn) as fenced:  # fences asked for of a target checked without them: checked again
            await publish_chunks(conn, chunks, target=unfenced, fence_prefix=uuid.uuid4().hex)
        fences = await fence_count(conn, "ORDERS")
        return summary.count, seen.count(info), refused.value.reason, fenced.count(info), fences

    assert admin(nats_server, direct, stream=None) == (1, 1, "stream_not_atomic", 1, 1)
    assert len(stored(nats_server)) == 7 and stored(nats_server, "PLAIN") == []


def test_stream_and_target_naming_two_streams_are_refused(nats_server, nats_conn):
    """``stream`` naming another stream than ``target`` is refused before anything is sent; a fast-checked target
    used for an atomic publish meets the server's refusal, nothing stored."""
    admin(nats_server, lambda conn: asyncio.sleep(0), stream={"name": "BULK", "subjects": ["bulk.>"],
                                                               "allow_batched": True})

    async def body(conn):
        fast = await check_target_stream(conn, "BULK", mode="fast")
        with pytest.raises(BatchPublishError) as atomic:
            await publish_chunks(conn, [[BatchMessage(subject="bulk.x", data=b"1")]], target=fast, mode="atomic")
        with pytest.raises(InvalidRequestError) as two:
            await publish_chunks(conn, [[BatchMessage(subject="bulk.x", data=b"1")]], stream="ORDERS", target=fast,
                                 mode="fast")
        return atomic.value.reason, two.value.reason, str(two.value), (await stream_info(conn, "BULK"))["state"]

    reason, two_reason, two_text, state = admin(nats_server, body, stream=None)
    assert reason == "stream_not_atomic"
    assert two_reason == "invalid_request" and "'ORDERS'" in two_text and "'BULK'" in two_text
    assert state["messages"] == 0


def test_retried_task_with_dedupe_key_publishes_once(nats_server, nats_conn):
    admin(nats_server, lambda conn: asyncio.sleep(0))

    def op():
        return JetStreamAtomicBatchPublishOperator(task_id="p", subject="orders.x", dedupe_key="run-1", split=True,
                                                   batch_size=4, messages=[{"data": i} for i in range(10)])

    first = op().execute(context={})
    again = op().execute(context={})
    assert not first["already_committed"] and again["already_committed"]
    # chunks of 4, 4 and 2 messages, each followed by its fence (seqs 5, 10, 13): the range spans 1..12
    assert (again["first_seq"], again["last_seq"]) == (1, 12)
    assert len(stored(nats_server)) == 10


def test_failed_chunk_reports_committed_chunks(nats_server, nats_conn):
    admin(nats_server, lambda conn: asyncio.sleep(0))
    messages = [{"data": i} for i in range(6)]
    messages[4]["subject"] = "elsewhere.x"  # no stream captures it: chunk 2 fails
    op = JetStreamAtomicBatchPublishOperator(task_id="p", subject="orders.x", split=True, batch_size=3,
                                             messages=messages)
    with pytest.raises(BatchPublishError) as info:
        op.execute(context={})
    assert "chunk 2/2 failed after chunks 1..1 were committed (3 message(s), seqs 1..3)" in str(info.value)
    assert len(stored(nats_server)) == 3


def test_failed_fast_chunk_says_how_many_messages_of_the_whole_publish_are_stored(nats_server, nats_conn):
    full = {**ORDERS, "allow_batched": True, "max_msgs": 4, "discard": "new"}  # the 5th message is refused
    admin(nats_server, lambda conn: asyncio.sleep(0), stream=full)
    op = JetStreamAtomicBatchPublishOperator(task_id="p", subject="orders.x", split=True, batch_size=3, mode="fast",
                                             messages=[{"data": i} for i in range(6)])
    with pytest.raises(FastBatchError) as info:
        op.execute(context={})
    assert "chunk 2/2 failed after chunks 1..1 were committed (3 message(s), seqs ..3)" in str(info.value)
    assert (info.value.stored, info.value.total, info.value.stream) == (4, 6, "ORDERS")  # chunk 1, and 1 of chunk 2
    assert [data for _, data in stored(nats_server)] == [b"0", b"1", b"2", b"3"]


def test_invalid_line_at_the_end_of_a_file_fails_before_anything_is_sent(nats_server, nats_conn, tmp_path):
    admin(nats_server, lambda conn: asyncio.sleep(0))
    path = tmp_path / "orders.jsonl"
    path.write_text("".join(json.dumps({"data": {"n": i}}) + "\n" for i in range(2500)) + "{not json\n")
    op = JetStreamAtomicBatchPublishOperator(task_id="p", messages_file=str(path), subject="orders.f", split=True)
    with pytest.raises(InvalidRequestError) as info:
        op.execute(context={})
    assert info.value.reason == "invalid_message" and "orders.jsonl:2501" in str(info.value)
    assert stored(nats_server) == []


def test_parquet_file_is_read_by_record_batch_in_chunks(nats_server, nats_conn, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    admin(nats_server, lambda conn: asyncio.sleep(0))
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"data": [f"row-{i}" for i in range(2500)]}), path, row_group_size=700)
    result = JetStreamAtomicBatchPublishOperator(task_id="p", messages_file=str(path), subject="orders.pq",
                                                 split=True).execute(context={})
    assert (result["count"], result["chunks"], result["first_seq"], result["last_seq"]) == (2500, 3, 1, 2500)
    assert [d for _, d in stored(nats_server)] == [f"row-{i}".encode() for i in range(2500)]


def test_check_target_stream_is_the_rule_the_operator_and_the_spark_writer_share(nats_server):
    async def body(conn):
        target = await check_target_stream(conn, "ORDERS", ["orders.a", "orders.b.c"])
        assert (target.name, target.duplicate_window) == ("ORDERS", 120.0)
        assert target.filters == ("orders.>", "_FENCE.ORDERS.>")
        errors = []
        for subjects, mode in ((["orders.a", "other.x"], "atomic"), (["nobody.x"], "atomic"), ([], "fast")):
            with pytest.raises(BatchPublishError) as info:
                await check_target_stream(conn, "ORDERS", subjects, mode=mode)
            errors.append((info.value.reason, str(info.value)))
        return errors

    admin(nats_server, lambda conn: asyncio.sleep(0), stream={**ORDERS, "name": "OTHER", "subjects": ["other.>"]})
    wrong, nobody, not_batched = admin(nats_server, body)
    assert wrong[0] == "wrong_stream" and "'other.x' is captured by stream 'OTHER'" in wrong[1]
    assert nobody[0] == "wrong_stream" and "captured by no stream" in nobody[1]
    assert not_batched[0] == "stream_not_batched" and "allow_batched" in not_batched[1]


FAILURES = {"left": 0}


def produce_orders(count: int, fail_at: int | None = None):
    """A producer_function for the tests: ``count`` orders, failing once at ``fail_at`` if told."""
    for n in range(count):
        if n == fail_at and FAILURES["left"]:
            FAILURES["left"] -= 1
            raise RuntimeError(f"upstream API failed at order {n}")
        yield {"subject": f"orders.{n % 3}", "data": {"n": n}}


class TaskIdentity:
    """What the operator reads from the task instance in the context: its identity across tries."""

    dag_id, task_id, run_id, map_index = "daily", "produce", "manual__2026-01-01", -1


@pytest.mark.parametrize("mode", ["atomic", "fast"])
def test_producer_function_retried_after_failing_half_way_stores_each_message_once(nats_server, nats_conn, mode):
    admin(nats_server, lambda conn: asyncio.sleep(0), stream={**ORDERS, "allow_batched": True})
    FAILURES["left"] = 1

    def op():
        return JetStreamAtomicBatchPublishOperator(
            task_id="produce", producer_function="tests.test_publish_operator.produce_orders",
            producer_function_kwargs={"count": 1200, "fail_at": 700}, stream="ORDERS", split=True, batch_size=300,
            mode=mode)

    with pytest.raises(RuntimeError, match="order 700"):
        op().execute(context={"ti": TaskIdentity()})
    assert len(stored(nats_server)) == 600  # chunks 1 and 2 committed before the failure
    result = op().execute(context={"ti": TaskIdentity()})
    assert (result["count"], result["chunks"], result["mode"]) == (1200, 4, mode)
    assert result["msg_id_prefix"].startswith("pf-")
    assert result["duplicates"] == (600 if mode == "fast" else 0)  # fast: chunks 1-2 skipped by msg id
    if mode == "atomic":
        # each chunk is followed by its fence: the last chunk ends at 1,200 rows + 3 fences
        assert result["already_committed_chunks"] == 2 and (result["first_seq"], result["last_seq"]) == (1, 1203)
    numbers = sorted(json.loads(d)["n"] for _, d in stored(nats_server))
    assert numbers == list(range(1200))


def test_producer_function_callable_with_args_and_its_errors(nats_server, nats_conn):
    admin(nats_server, lambda conn: asyncio.sleep(0))
    result = JetStreamAtomicBatchPublishOperator(
        task_id="p", producer_function=produce_orders, producer_function_args=[5], dedupe_key="run-7",
    ).execute(context={})
    assert (result["count"], result["msg_id_prefix"]) == (5, "run-7")
    with pytest.raises(InvalidRequestError) as no_identity:
        JetStreamAtomicBatchPublishOperator(task_id="p", producer_function=produce_orders,
                                            producer_function_args=[5]).execute(context={})
    assert no_identity.value.reason == "invalid_request" and "dedupe_key" in str(no_identity.value)
    with pytest.raises(InvalidFunctionError) as bad_path:  # as a bad apply_function of the consume operator
        JetStreamAtomicBatchPublishOperator(task_id="p", producer_function="tests.nowhere.produce",
                                            dedupe_key="k").execute(context={})
    assert bad_path.value.reason == "invalid_function" and "cannot import module 'tests.nowhere'" in str(bad_path.value)
    with pytest.raises(InvalidRequestError) as not_iterable:
        JetStreamAtomicBatchPublishOperator(task_id="p", producer_function=lambda: {"data": 1},
                                            dedupe_key="k").execute(context={})
    assert not_iterable.value.reason == "invalid_message"
    assert len(stored(nats_server)) == 5


DAG_FILE = '''
import pendulum
from airflow.sdk import DAG, task

from airflow_jetstream.client.batches.publish_chunks import check_target_stream
from airflow_jetstream.operators.publish import JetStreamAtomicBatchPublishOperator


@task
def produce():
    return [{"subject": "orders.xcom", "data": {"n": i}, "msg_id": f"x-{i}"} for i in range(5)]


@task
def report(result: dict):
    print("PUBLISH_RESULT " + ",".join(f"{k}={result[k]}" for k in ("stream", "count", "first_seq", "last_seq")))


with DAG("publish_from_xcom", start_date=pendulum.datetime(2026, 1, 1), schedule=None):
    published = JetStreamAtomicBatchPublishOperator(task_id="publish", messages=produce(), stream="ORDERS")
    report(published.output)
'''


@pytest.mark.airflow_cli
def test_messages_from_xcom_in_a_dag_run(nats_server, tmp_path: Path):
    admin(nats_server, lambda conn: asyncio.sleep(0))
    env = dag_test_env(tmp_path / "airflow", nats_server.url, {"publish_dag.py": DAG_FILE})
    run = run_airflow(["dags", "test", "publish_from_xcom"], env)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "PUBLISH_RESULT stream=ORDERS,count=5,first_seq=1,last_seq=5" in output, output[-4000:]
    assert "chunk 1/1: 5 message(s) committed to ORDERS, seq 1..5" in output
    assert [json.loads(d)["n"] for _, d in stored(nats_server)] == list(range(5))
