"""Structured Streaming with the ``jetstream`` source and sink against a real nats-server and Spark ``local[2]``.

Each query reads stream ``<X>_SRC`` with ``spark.readStream.format("jetstream")`` and writes the
payloads to ``<X>_DST`` with ``df.writeStream.format("jetstream")``, so ``<X>_DST`` holding every
payload of ``<X>_SRC`` exactly once shows that both the source and the sink delivered exactly once.
One SparkSession and one nats-server for the module; every test uses its own streams and checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_jetstream.client import ensure_stream, stream_info
from airflow_jetstream.client.kv.job_records import DEFAULT_JOB_BUCKET, get_job_record
from airflow_jetstream.embedded import EmbeddedNatsServer
from tests.support.nats_calls import call_on, stored_rows
from tests.support.polling import wait_until
from tests.support.process_tree import kill_process_tree
from tests.support.servers import module_server
from tests.support.spark_session import module_spark

pytestmark = pytest.mark.spark

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402

from airflow_jetstream.spark.writer import micro_batch_job_id  # noqa: E402
from tests.support.spark_stream_copy import start_copy  # noqa: E402

server = module_server("nats")
spark = module_spark("test-jetstream-streaming")


async def _publish(conn: Any, subjects_and_numbers: list[tuple[str, int]]) -> None:
    for subject, number in subjects_and_numbers:
        await conn.js.publish(subject, payload(number))


def publish(server: EmbeddedNatsServer, prefix: str, numbers: range, subject: str = "a") -> None:
    call_on(server, _publish, [(f"{prefix}.src.{subject}", n) for n in numbers])


async def _payloads(conn: Any, stream: str) -> list[bytes]:
    from airflow_jetstream.client.reading.stored import read_range

    state = (await stream_info(conn, stream))["state"]
    out: list[bytes] = []
    async for chunk in read_range(conn, stream, max(1, state["first_seq"]), state["last_seq"]):
        out.extend(bytes(m[4]) for m in chunk)
    return out


def payload(number: int) -> bytes:
    return f'{{"n":{number},"amount":{number}}}'.encode()


async def _state(conn: Any, stream: str) -> dict[str, Any]:
    """The stream's state, ``messages`` counting rows only (not the write fences of atomic chunks)."""
    return {**(await stream_info(conn, stream))["state"], "messages": await stored_rows(conn, stream)}


def assert_exactly_once(server: EmbeddedNatsServer, stream: str, numbers: range) -> None:
    stored = Counter(call_on(server, _payloads, stream))
    expected = Counter(payload(n) for n in numbers)
    assert stored == expected, (f"missing {sorted((expected - stored).elements())[:5]}, "
                                f"twice {sorted((stored - expected).elements())[:5]}")


def make_streams(server: EmbeddedNatsServer, prefix: str, dst_subjects: list[str], src: dict[str, Any] | None = None,
                 **dst: Any) -> None:
    call_on(server, ensure_stream, {"name": f"{prefix}_SRC", "subjects": [f"{prefix}.src.>"], **(src or {})})
    call_on(server, ensure_stream, {"name": f"{prefix}_DST", "subjects": dst_subjects, "allow_atomic": True, **dst})


def run_query(spark: SparkSession, server: EmbeddedNatsServer, prefix: str, checkpoint: Path,
              **read_options: Any) -> list[dict[str, Any]]:
    query = start_copy(spark, server.url, prefix, checkpoint, **read_options)
    query.awaitTermination()
    return [p for p in query.recentProgress if p["numInputRows"]]


def ends(progress: list[dict[str, Any]]) -> list[tuple[int, int, int]]:
    """(batch id, rows, end seq) of each micro-batch that ran."""
    return [(p["batchId"], p["numInputRows"], json.loads(p["sources"][0]["endOffset"])["seq"]) for p in progress]


def job_state(server: EmbeddedNatsServer, job_id: str) -> str | None:
    record = call_on(server, get_job_record, job_id)
    return None if record is None else record["state"]


def test_available_now_runs_read_what_arrived_since_the_last(server: EmbeddedNatsServer, spark: SparkSession,
                                                             tmp_path: Path) -> None:
    # a work queue consumed as it is read (read by direct get; purged when Spark commits on the source)
    make_streams(server, "an", ["an.dst.>"], src={"retention": "workqueue", "allow_direct": True})
    options = {"max_messages_per_trigger": "100", "consume": "true"}
    publish(server, "an", range(250))
    first = run_query(spark, server, "an", tmp_path, **options)
    # read limits: three micro-batches of at most 100 messages, up to what was stored at the start
    assert ends(first) == [(0, 100, 100), (1, 100, 200), (2, 50, 250)]
    # the latest offset the source reported (the progress's lag)
    assert '"seq": 250' in first[0]["sources"][0]["latestOffset"]
    assert_exactly_once(server, "an_DST", range(250))
    # Spark commits a micro-batch on the source when it plans the next one: 201..250 are still there
    assert call_on(server, _state, "an_SRC")["first_seq"] == 201

    publish(server, "an", range(250, 330))
    second = run_query(spark, server, "an", tmp_path, **options)
    assert ends(second) == [(3, 80, 330)]
    assert_exactly_once(server, "an_DST", range(330))
    assert call_on(server, _state, "an_SRC")["first_seq"] == 251
    # nothing new: a third run plans no micro-batch and stores nothing
    assert ends(run_query(spark, server, "an", tmp_path, **options)) == []
    assert_exactly_once(server, "an_DST", range(330))


def test_query_failing_mid_batch_then_restarted_stores_every_message_once(
        server: EmbeddedNatsServer, spark: SparkSession, tmp_path: Path) -> None:
    # micro-batch 1 (seq 101..200, subject b) is read by two tasks: the sink's stream takes no b subject
    # yet, so both tasks fail and the query dies
    make_streams(server, "kr", ["kr.dst.a"])
    publish(server, "kr", range(100), "a")
    publish(server, "kr", range(100, 200), "b")
    publish(server, "kr", range(200, 300), "a")
    options = {"max_messages_per_trigger": "100", "num_partitions": "2"}
    query = start_copy(spark, server.url, "kr", tmp_path, **options)
    with pytest.raises(pyspark.errors.StreamingQueryException, match=r"kr\.dst\.b"):
        query.awaitTermination()
    query_id = query.id
    assert job_state(server, micro_batch_job_id(query_id, 0)) == "committed"
    # no task reported to abort(): the driver names the job from the checkpoint's query id
    assert job_state(server, micro_batch_job_id(query_id, 1)) == "aborted"

    call_on(server, ensure_stream, {"name": "kr_DST", "subjects": ["kr.dst.a", "kr.dst.b"]})
    progress = run_query(spark, server, "kr", tmp_path, **options)
    # the restart runs micro-batch 1 again, same bounds, then goes on
    assert ends(progress) == [(1, 100, 200), (2, 100, 300)]
    assert job_state(server, micro_batch_job_id(query_id, 1)) == "committed"
    assert_exactly_once(server, "kr_DST", range(300))


def test_driver_killed_mid_write_then_restarted_stores_every_message_once(
        server: EmbeddedNatsServer, spark: SparkSession, tmp_path: Path) -> None:
    """The driver (python, its JVM and Python workers) is SIGKILLed while micro-batch 1 is half written.

    A separate driver copies seq 1..200 in micro-batches of 100, read by two tasks each. In micro-batch 1
    the task of seq 101..150 holds at its row with payload 120 (a gate file that never appears), while the
    task of seq 151..200 stores its 50 rows: the kill lands after micro-batch 0's commit is in the
    checkpoint, with micro-batch 1 planned and partly stored and its commit not written.
    """
    make_streams(server, "kd", ["kd.dst.>"])
    publish(server, "kd", range(200))
    checkpoint, gate = tmp_path / "checkpoint", tmp_path / "gate"
    options = {"max_messages_per_trigger": "100", "num_partitions": "2"}
    command = [sys.executable, "-m", "tests.support.spark_stream_copy", server.url, "kd", str(checkpoint),
               "--hold", payload(120).decode(), "--gate", str(gate),
               *(f"--option={name}={value}" for name, value in options.items())]
    log = tmp_path / "driver.log"
    with log.open("wb") as out:
        driver = subprocess.Popen(command, cwd=Path(__file__).resolve().parents[1], stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def half_written() -> bool:
            assert driver.poll() is None, f"the driver exited early:\n{log.read_text()[-3000:]}"
            return (checkpoint / "commits" / "0").exists() and call_on(server, _state, "kd_DST")["messages"] >= 150

        wait_until(half_written, "micro-batch 0 committed and half of micro-batch 1 stored", timeout=240,
                   every=0.2)
    finally:
        killed = kill_process_tree(driver)
    assert driver.returncode == -signal.SIGKILL
    # the driver, its JVM and Python workers (pyspark's worker daemon runs in a process group of its own)
    assert "java" in killed.values() and sum(name.startswith("python") for name in killed.values()) >= 2
    assert (checkpoint / "offsets" / "1").exists() and not (checkpoint / "commits" / "1").exists()
    assert call_on(server, _state, "kd_DST")["messages"] == 150
    query_id = json.loads((checkpoint / "metadata").read_text().splitlines()[0])["id"]
    assert job_state(server, micro_batch_job_id(query_id, 0)) == "committed"
    assert job_state(server, micro_batch_job_id(query_id, 1)) is None  # the driver died before commit/abort

    gate.touch()
    progress = run_query(spark, server, "kd", checkpoint, hold=payload(120), gate=gate, **options)
    # the restart runs micro-batch 1 again with the same bounds
    assert ends(progress) == [(1, 100, 200)]
    assert_exactly_once(server, "kd_DST", range(200))
    records = {batch: call_on(server, get_job_record, micro_batch_job_id(query_id, batch)) for batch in range(2)}
    assert [records[batch]["state"] for batch in range(2)] == ["committed"] * 2
    # the replayed micro-batch stored only the held task's 50 rows; the other task's chunk was stored before
    replayed = records[1]
    assert (replayed["rows"], replayed["stored"]) == (100, 50)
    assert replayed["skipped_batches"] + replayed["duplicate_batches"] == 1


async def _await_window_passed(conn: Any, stream: str) -> int:
    """Publish one msg id until the server stores it again: the duplicate window has passed (bounded)."""
    for attempt in range(200):
        ack = await conn.js.publish(f"{stream.lower()}.probe", b"probe", headers={"Nats-Msg-Id": "probe"})
        if attempt and not ack.duplicate:
            return attempt
        await asyncio.sleep(0.05)
    raise AssertionError("the duplicate window never passed")


async def _delete_job_record(conn: Any, job_id: str) -> None:
    kv = await conn.js.key_value(DEFAULT_JOB_BUCKET)
    await kv.purge(job_id)


def test_last_micro_batch_replayed_after_the_duplicate_window_stores_nothing_twice(
        server: EmbeddedNatsServer, spark: SparkSession, tmp_path: Path) -> None:
    make_streams(server, "rp", ["rp.dst.>"], duplicate_window=1)
    call_on(server, ensure_stream, {"name": "RP_PROBE", "subjects": ["rp_probe.probe"], "duplicate_window": 1})
    publish(server, "rp", range(200))
    checkpoint = tmp_path / "checkpoint"
    first = run_query(spark, server, "rp", checkpoint, max_messages_per_trigger="100")
    assert ends(first) == [(0, 100, 100), (1, 100, 200)]
    job_id = micro_batch_job_id(first[0]["id"], 1)

    def forget_commit() -> None:
        (checkpoint / "commits" / "1").unlink()
        (checkpoint / "commits" / ".1.crc").unlink(missing_ok=True)

    # the sink's tasks stored micro-batch 1 but the query died before Spark wrote its commit and
    # before the driver wrote the job record: only the batch ledger knows what was stored
    forget_commit()
    call_on(server, _delete_job_record, job_id)
    assert call_on(server, _await_window_passed, "RP_PROBE") >= 1
    replay = run_query(spark, server, "rp", checkpoint, max_messages_per_trigger="100")
    assert ends(replay) == [(1, 100, 200)]
    assert_exactly_once(server, "rp_DST", range(200))
    assert job_state(server, job_id) == "committed"

    # the commit lost again, the job record kept: the tasks skip the committed micro-batch whole
    forget_commit()
    replay = run_query(spark, server, "rp", checkpoint, max_messages_per_trigger="100")
    assert ends(replay) == [(1, 100, 200)]
    assert_exactly_once(server, "rp_DST", range(200))


async def _stored_time(conn: Any, stream: str, seq: int) -> str:
    """The time the server stored message ``seq`` (RFC 3339, cut to microseconds)."""
    reply = await conn.api_request(f"STREAM.MSG.GET.{stream}", {"seq": seq}, context="test")
    stamp = reply["message"]["time"].rstrip("Z")
    base, _, fraction = stamp.partition(".")
    return f"{base}.{(fraction + '000000')[:6]}+00:00"


def test_scheduled_available_now_steps_read_each_interval_once_and_a_cleared_run_stores_nothing_twice(
        server: EmbeddedNatsServer, spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example DAG's Spark step (dags_examples/spark_apps/stream_orders.py), run per interval."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "dags_examples" / "spark_apps"))
    from stream_orders import run_step

    call_on(server, ensure_stream, {"name": "IN_AGG", "subjects": ["orders.raw.*"]})
    call_on(server, ensure_stream, {"name": "IN_LARGE", "subjects": ["orders.large.*"], "allow_atomic": True})
    orders = [(f"orders.raw.{'emea' if n % 2 else 'apac'}", n) for n in range(150)]
    call_on(server, _publish, orders)
    # interval 1 ends when order 100 (seq 101) was stored; interval 2 when seq 141 was stored
    t1, t2 = call_on(server, _stored_time, "IN_AGG", 101), call_on(server, _stored_time, "IN_AGG", 141)
    checkpoints = tmp_path / "checkpoints"

    def step(end: str) -> int:
        return run_step(spark, checkpoints, end, from_stream="IN_AGG", to_stream="IN_LARGE", min_amount=0,
                        max_messages_per_trigger="60", connection={"servers": server.url})

    assert step(t1) == 100
    assert step(t2) == 40
    assert_exactly_once(server, "IN_LARGE", range(140))
    # run 1 cleared and run again (after run 2): the same micro-batches again, nothing stored twice
    assert step(t1) == 100
    assert_exactly_once(server, "IN_LARGE", range(140))
    assert step("2100-01-01T00:00:00+00:00") == 10
    assert_exactly_once(server, "IN_LARGE", range(150))




def test_micro_batch_replayed_after_the_window_without_its_records_stores_nothing_twice(
        server: EmbeddedNatsServer, spark: SparkSession, tmp_path: Path) -> None:
    """Micro-batch 1 committed its chunks, then everything that remembers it is gone but the stream: Spark's
    commit for it (the driver died before writing it), the job record and the ledger entries (its tasks died
    between the commit and the record), and the duplicate window has passed. The restarted query replays it;
    the chunks' fences refuse every second commit, so each row is stored once."""
    from pyspark.sql import functions as F

    from airflow_jetstream.client import BatchMessage
    from airflow_jetstream.client.batches.wire import stored_sequences

    make_streams(server, "rz", ["rz.dst.>"], duplicate_window="200ms")
    publish(server, "rz", range(200))

    def run() -> str:
        source = (spark.readStream.format("jetstream")
                  .options(servers=server.url, stream="rz_SRC", max_messages_per_trigger="100").load())
        query = (source.select(F.lit("rz.dst.x").alias("subject"), "payload").writeStream.format("jetstream")
                 .options(servers=server.url, stream="rz_DST", ledger_bucket="LEDGER_RZ", job_bucket="JOBS_RZ")
                 .option("checkpointLocation", str(tmp_path)).trigger(availableNow=True).start())
        query.awaitTermination()
        return str(query.id)

    query_id = run()
    assert_exactly_once(server, "rz_DST", range(200))
    for written in ("1", ".1.crc"):  # the commit and its checksum file
        (tmp_path / "commits" / written).unlink(missing_ok=True)

    async def forget(conn: Any) -> None:
        for bucket in ("LEDGER_RZ", "JOBS_RZ"):
            await conn.js.delete_key_value(bucket)

    call_on(server, forget)
    chunk = BatchMessage("rz.dst.x", b"", msg_id=f"{micro_batch_job_id(query_id, 1)}-0-c0")

    async def remembered(conn: Any) -> bool:
        return (await stored_sequences(conn, [chunk]))[0] is not None

    wait_until(lambda: not call_on(server, remembered), "the stream to forget micro-batch 1's chunk msg id")
    assert run() == query_id
    assert_exactly_once(server, "rz_DST", range(200))
