"""The ``jetstream`` PySpark data source against a real nats-server and Spark ``local[2]``.

One SparkSession and one nats-server for the module (a SparkSession costs seconds to start); every
test uses its own streams and job ids.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_jetstream.client import ensure_stream, stream_info
from airflow_jetstream.client.errors import ClaimLostError, LedgerConflictError
from airflow_jetstream.client.kv.job_records import get_job_record
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsServer
from tests.support.nats_calls import (
    all_messages,
    call_on,
    drop_bucket,
    ledger_ranges,
    publish_until_window_passed,
    stored_rows,
)
from tests.support.servers import module_server
from tests.support.spark_session import module_spark

pytestmark = pytest.mark.spark

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from airflow_jetstream.spark import consume, register  # noqa: E402

server = module_server("nats")
spark = module_spark("test-jetstream-datasource")


async def _state(conn: Any, name: str) -> dict[str, Any]:
    return (await stream_info(conn, name))["state"]


def orders(spark: SparkSession, rows: int, prefix: str) -> Any:
    return spark.range(0, rows, numPartitions=2).select(
        F.concat(F.lit(prefix + "."), F.when(F.col("id") % 2 == 0, "eu").otherwise("us")).alias("subject"),
        F.col("id").alias("order_id"),
        (F.col("id") * 2).cast("double").alias("amount"),
        F.create_map(F.lit("X-Source"), F.lit("test")).alias("headers"),
    )


def test_atomic_write_then_parallel_read_round_trip(server: EmbeddedNatsServer, spark: SparkSession) -> None:
    call_on(server, ensure_stream, {"name": "RT", "subjects": ["rt.>"], "allow_atomic": True})
    rows = 2500
    orders(spark, rows, "rt").write.format("jetstream").mode("append").options(
        servers=server.url, stream="RT", job_id="rt-1", batch_size="400").save()

    state = call_on(server, _state, "RT")
    assert state["messages"] == rows + 8  # and the fence of each of the 8 atomic chunks
    stored = call_on(server, all_messages, "RT")
    # deterministic chunks: per partition (1250 rows) batches of 400, 400, 400, 50
    batch_ids = {m[3]["Nats-Batch-Id"] for m in stored}
    assert sorted(b.rsplit("-a", 1)[0] for b in batch_ids) == sorted(
        f"rt-1-{p}-{c}" for p in (0, 1) for c in range(4))
    # one msg id per atomic chunk, on its first message
    with_ids = [m for m in stored if "Nats-Msg-Id" in m[3]]
    assert sorted(m[3]["Nats-Msg-Id"] for m in with_ids) == sorted(f"rt-1-{p}-c{c}" for p in (0, 1) for c in range(4))
    assert {m[3]["Nats-Batch-Sequence"] for m in with_ids} == {"1"}
    assert json.loads(stored[0][4]).keys() == {"order_id", "amount"}

    record = call_on(server, get_job_record, "rt-1")
    assert record["state"] == "committed" and record["stored"] == rows and record["batches"] == 8
    assert sorted(r["partition"] for r in record["reports"]) == [0, 1]
    ledger_summary = call_on(server, lambda conn: _ledger_summary(conn, "rt-1"))
    assert ledger_summary["batches"] == 8 and ledger_summary["messages"]["published"] == rows

    df = (spark.read.format("jetstream").schema("subject string, seq long, timestamp timestamp, "
                                                "headers map<string,string>, order_id long, amount double")
          .options(servers=server.url, stream="RT", decode="json", num_partitions="3").load())
    assert df.rdd.getNumPartitions() == 3
    got = df.agg(F.count("*").alias("n"), F.countDistinct("order_id").alias("ids"), F.sum("amount").alias("sum"),
                 F.countDistinct("seq").alias("seqs"), F.min("timestamp").isNotNull().alias("ts"),
                 F.max(F.col("headers")["X-Source"]).alias("hdr")).collect()[0]
    assert (got["n"], got["ids"], got["seqs"]) == (rows, rows, rows)
    assert got["sum"] == float(sum(2 * i for i in range(rows)))
    assert got["ts"] and got["hdr"] == "test"

    eu = (spark.read.format("jetstream").options(servers=server.url, stream="RT", filter_subjects="rt.eu",
                                                   start_seq="1001", decode="utf-8").load())
    eu_rows = eu.select("subject", "seq", "payload").collect()
    assert eu_rows and {r["subject"] for r in eu_rows} == {"rt.eu"}
    assert min(r["seq"] for r in eu_rows) >= 1001
    assert len(eu_rows) == sum(1 for m in stored if m[0] == "rt.eu" and m[1] >= 1001)
    assert isinstance(eu_rows[0]["payload"], str)


async def _ledger_summary(conn: Any, run_id: str) -> dict[str, Any]:
    return await (await BatchLedger.open(conn)).summary(run_id)


def test_failed_job_rerun_completes_without_duplicates_after_the_window(
        server: EmbeddedNatsServer, spark: SparkSession) -> None:
    call_on(server, ensure_stream, {"name": "RERUN", "subjects": ["rerun.>"], "allow_atomic": True,
                                "duplicate_window": "200ms"})
    rows = 1000

    def frame(bad_row: int | None) -> Any:
        subject = F.lit("rerun.orders")
        if bad_row is not None:  # a subject with white space: the chunk holding it is refused before sending
            subject = F.when(F.col("id") == bad_row, F.lit("rerun.bad subject")).otherwise(subject)
        return spark.range(0, rows, numPartitions=1).select(subject.alias("subject"),
                                                            F.col("id").cast("string").alias("payload"))

    options = {"servers": server.url, "stream": "RERUN", "job_id": "rerun-1", "batch_size": "300",
               "inflight": "1"}
    with pytest.raises(Exception, match=r"invalid_subject|white space"):
        frame(bad_row=950).write.format("jetstream").mode("append").options(**options).save()

    # what the failed job left: the chunks before the bad one, whole, and recorded in the ledger
    assert call_on(server, _state, "RERUN")["messages"] == 900 + 3  # 3 chunks and their fences
    ledger = call_on(server, lambda conn: _ledger_summary(conn, "rerun-1"))
    assert (ledger["batches"], ledger["messages"]["published"]) == (3, 900)
    assert call_on(server, get_job_record, "rerun-1")["state"] == "aborted"

    probes = call_on(server, publish_until_window_passed, "rerun.probe")
    frame(bad_row=None).write.format("jetstream").mode("append").options(**options).save()

    assert call_on(server, _state, "RERUN")["messages"] == rows + probes + 4  # 4 chunks, 4 fences
    record = call_on(server, get_job_record, "rerun-1")
    assert (record["state"], record["skipped_batches"], record["stored"]) == ("committed", 3, 100)
    payloads = [m[4] for m in call_on(server, all_messages, "RERUN") if m[0] == "rerun.orders"]
    assert sorted(int(p) for p in payloads) == list(range(rows))


def test_bulk_write_and_bad_input_rejected_before_sending(server: EmbeddedNatsServer, spark: SparkSession) -> None:
    call_on(server, ensure_stream, {"name": "BULK", "subjects": ["bulk.>"], "allow_batched": True})
    frame = orders(spark, 3000, "bulk").select("subject", F.col("order_id").cast("string").alias("payload"))
    frame.write.format("jetstream").mode("append").options(servers=server.url, stream="BULK", mode="fast",
                                                            job_id="bulk-1").save()
    assert call_on(server, _state, "BULK")["messages"] == 3000
    assert call_on(server, get_job_record, "bulk-1")["stored"] == 3000
    # bulk chunks can be stored in part, so every message carries its own msg id
    ids = {m[3]["Nats-Msg-Id"] for m in call_on(server, all_messages, "BULK")}
    assert ids == {f"bulk-1-{p}-{r}" for p in (0, 1) for r in range(1500)}

    with pytest.raises(Exception, match="allow_atomic"):
        frame.write.format("jetstream").mode("append").options(servers=server.url, stream="BULK").save()
    with pytest.raises(Exception, match=r"unknown_option|numpartitions"):
        frame.write.format("jetstream").mode("append").options(servers=server.url, stream="BULK",
                                                                numPartitions="2").save()
    with pytest.raises(Exception, match=r"unknown_option|strem"):  # at load(), before any action
        spark.read.format("jetstream").options(servers=server.url, stream="BULK", strem="BULK").load()
    given_schema = spark.read.format("jetstream").schema("payload binary").options(servers=server.url, strem="BULK")
    with pytest.raises(Exception, match=r"unknown_option|strem"):  # Spark builds it only at the first action
        given_schema.load().count()
    with pytest.raises(Exception, match="only appends"):
        frame.write.format("jetstream").mode("overwrite").options(servers=server.url, stream="BULK").save()
    with pytest.raises(Exception, match="consumer_required"):
        spark.read.format("jetstream").options(servers=server.url, stream="BULK", consume="true").load().count()
    assert call_on(server, _state, "BULK")["messages"] == 3000


@pytest.mark.parametrize("mode", ["atomic", "fast"])
def test_rerun_without_ledger_entries_is_deduplicated_by_msg_ids(server: EmbeddedNatsServer, spark: SparkSession,
                                                                  mode: str) -> None:
    """The narrow case the ledger cannot cover (chunks committed, ledger entries never written):
    within the duplicate window the msg ids make the re-run store nothing twice."""
    name = f"NOLEDGER_{mode.upper()}"
    call_on(server, ensure_stream, {"name": name, "subjects": [f"noledger.{mode}.>"], "allow_atomic": True,
                                "allow_batched": True, "duplicate_window": "10m"})
    frame = orders(spark, 1000, f"noledger.{mode}").select("subject", F.col("order_id").cast("string").alias("payload"))
    options = {"servers": server.url, "stream": name, "job_id": f"noledger-{mode}", "batch_size": "200",
               "mode": mode, "ledger_bucket": "none"}
    frame.write.format("jetstream").mode("append").options(**options).save()
    frame.write.format("jetstream").mode("append").options(**options).save()

    assert call_on(server, _state, name)["messages"] == 1000 + (6 if mode == "atomic" else 0)  # + atomic fences
    record = call_on(server, get_job_record, f"noledger-{mode}")
    assert record["state"] == "committed"
    # atomic: each refused retry is recognised as the earlier commit of its chunk; bulk: the server
    # skips every message by msg id and the probes find them all stored before
    assert (record["stored"], record["duplicate_batches"]) == (0, 6)


async def _publish(conn: Any, subject: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        await conn.js.publish(subject, json.dumps({"n": i}).encode())


def test_consume_workqueue_acks_only_after_success(server: EmbeddedNatsServer, spark: SparkSession,
                                                   tmp_path: Path) -> None:
    call_on(server, ensure_stream, {"name": "WQ", "subjects": ["wq.>"], "retention": "workqueue",
                                "allow_direct": True, "allow_atomic": True})
    spark.range(0, 600, numPartitions=2).select(F.lit("wq.jobs").alias("subject"), F.col("id").alias("n")) \
        .write.format("jetstream").mode("append").options(servers=server.url, stream="WQ", job_id="wq-run",
                                                           batch_size="200").save()
    out = str(tmp_path / "out")
    options = {"servers": server.url, "stream": "WQ", "num_partitions": "2"}

    with pytest.raises(RuntimeError, match="job died"), consume(spark, options, run_id="wq-run") as (df, consumption):
        assert len(consumption.claimed) == 4  # 2 partitions x (200 + 100 rows)
        df.write.mode("overwrite").parquet(out)
        raise RuntimeError("job died after writing its output")
    assert consumption.removed is None
    assert call_on(server, _state, "WQ")["messages"] == 600 + 4  # nothing lost (and the 4 chunks' fences)
    ledger = call_on(server, lambda conn: _ledger_summary(conn, "wq-run"))
    assert ledger["states"]["published"] == 4 and ledger["attempts"] == 4  # released for the next attempt

    with consume(spark, {**options, "decode": "json"}, schema="seq long, n long",
                 run_id="wq-run") as (df, consumption):
        call_on(server, _publish, "wq.jobs", 50, start=600)  # arrives after the bounds were fixed
        df.write.mode("overwrite").parquet(out)
    assert consumption.removed == 600
    result = spark.read.parquet(out).agg(F.count("*").alias("rows"), F.countDistinct("n").alias("distinct"),
                                         F.max("n").alias("max")).collect()[0]
    assert (result["rows"], result["distinct"], result["max"]) == (600, 600, 599)
    assert call_on(server, _state, "WQ")["messages"] == 50 + 4  # later messages stay for the next run
    ledger = call_on(server, lambda conn: _ledger_summary(conn, "wq-run"))
    assert ledger["states"]["consumed"] == 4 and ledger["attempts"] == 8

    with consume(spark, options) as (df, consumption):
        assert df.count() == 50
    assert consumption.removed == 50 and call_on(server, _state, "WQ")["messages"] == 4  # the fences stay
    assert not consumption.already_consumed  # no run: no ledger to ask

    # the run again (a retry of a job whose success its scheduler never heard): the ledger says consumed, and the
    # job learns it, so that it keeps the earlier output instead of replacing it with its empty read
    with consume(spark, options, run_id="wq-run") as (df, again):
        assert again.already_consumed and not again.claimed


def test_consume_plans_with_the_connection_register_was_given(server: EmbeddedNatsServer,
                                                               spark: SparkSession) -> None:
    """After register(spark, settings), consume() needs no servers option, as spark.read does (it planned with the
    session's conf only and refused the read for want of servers)."""
    call_on(server, ensure_stream, {"name": "RQ", "subjects": ["rq.>"], "retention": "workqueue",
                                    "allow_direct": True})
    call_on(server, _publish, "rq.jobs", 3)
    register(spark, ConnectionSettings(servers=server.url))
    try:
        with consume(spark, {"stream": "RQ"}) as (df, consumption):
            assert df.count() == 3
        assert consumption.removed == 3
    finally:
        register(spark)


async def _take_over(conn: Any, run_id: str) -> dict[str, int]:
    """Another consume job, an hour later by its clock (the first one's claims long expired), claims and consumes
    every batch of the run; returns its claims' tokens."""
    later = await BatchLedger.open(conn, clock=lambda: time.time() + 3600)
    claims = await later.claim_available(run_id, owner="successor")
    await later.settle(claims)
    return {claim.batch_id: claim.revision for claim in claims}


def test_a_consume_job_whose_claims_were_taken_over_removes_nothing(server: EmbeddedNatsServer,
                                                                      spark: SparkSession) -> None:
    """A consume job frozen past its claims' deadline: another job claims and consumes the run meanwhile. When
    the frozen job's block ends, its marks are refused (claim_lost) and it acknowledges nothing (before, it removed
    the messages first). Its claims' tokens are lower than the successor's: an output fenced by them is not read."""
    call_on(server, ensure_stream, {"name": "ZQ", "subjects": ["zq.>"], "retention": "workqueue",
                                    "allow_direct": True, "allow_atomic": True})
    spark.range(0, 300, numPartitions=1).select(F.lit("zq.jobs").alias("subject"), F.col("id").alias("n")) \
        .write.format("jetstream").mode("append").options(servers=server.url, stream="ZQ", job_id="zq-run",
                                                           batch_size="100").save()
    with pytest.raises(ClaimLostError) as lost, \
            consume(spark, {"servers": server.url, "stream": "ZQ"}, run_id="zq-run") as (_df, consumption):
        tokens = consumption.claim_revisions
        successor = call_on(server, _take_over, "zq-run")
    assert lost.value.reason == "claim_lost"
    assert consumption.removed is None and call_on(server, stored_rows, "ZQ") == 300
    assert len(tokens) == 3 and all(successor[batch] > token for batch, token in tokens.items())
    ledger = call_on(server, lambda conn: _ledger_summary(conn, "zq-run"))
    assert ledger["states"]["consumed"] == 3


async def _hold(conn: Any, run_id: str, limit: int | None = None) -> int:
    """Another consume attempt claims every batch of the run, or ``limit`` of them (its deadline an hour away);
    returns how many."""
    ledger = await BatchLedger.open(conn, visibility_timeout="1h")
    return len(await ledger.claim_available(run_id, owner="zombie", limit=limit))


def test_a_consume_job_finds_the_runs_claims_held_by_another_attempt_and_reads_nothing(
        server: EmbeddedNatsServer, spark: SparkSession) -> None:
    """A retry that starts while an earlier attempt (a zombie its scheduler no longer hears) still holds the run's
    claims before their deadline: it is refused, naming the fix, and removes nothing; the zombie's claims stand.
    Before, it claimed nothing, read the run and acknowledged it (the zombie's batches consumed by nobody's claim)."""
    call_on(server, ensure_stream, {"name": "HQ", "subjects": ["hq.>"], "retention": "workqueue",
                                    "allow_direct": True, "allow_atomic": True})
    spark.range(0, 200, numPartitions=1).select(F.lit("hq.jobs").alias("subject"), F.col("id").alias("n")) \
        .write.format("jetstream").mode("append").options(servers=server.url, stream="HQ", job_id="hq-run",
                                                           batch_size="100").save()
    assert call_on(server, _hold, "hq-run") == 2
    with pytest.raises(LedgerConflictError, match="claimed by another attempt") as held, \
            consume(spark, {"servers": server.url, "stream": "HQ"}, run_id="hq-run"):
        pytest.fail("the block ran while another attempt held the run's claims")
    assert held.value.reason == "ledger_conflict" and "Run again after that deadline" in str(held.value)
    assert call_on(server, stored_rows, "HQ") == 200
    ledger = call_on(server, lambda conn: _ledger_summary(conn, "hq-run"))
    assert ledger["states"]["in_progress"] == 2 and ledger["attempts"] == 2  # the zombie's claims, untouched


def test_a_consume_job_that_claimed_part_of_a_run_another_attempt_holds_gives_its_claims_back(
        server: EmbeddedNatsServer, spark: SparkSession) -> None:
    """Another attempt holds one batch of the run before its deadline; the retry claims the other two, is refused
    (reading the run would consume the held batch under nobody's claim) and settles its own two claims as failed
    attempts: they are claimable again, nothing is removed, and the held batch stays the other attempt's."""
    call_on(server, ensure_stream, {"name": "PQ", "subjects": ["pq.>"], "retention": "workqueue",
                                    "allow_direct": True, "allow_atomic": True})
    spark.range(0, 300, numPartitions=1).select(F.lit("pq.jobs").alias("subject"), F.col("id").alias("n")) \
        .write.format("jetstream").mode("append").options(servers=server.url, stream="PQ", job_id="pq-run",
                                                           batch_size="100").save()
    assert call_on(server, _hold, "pq-run", 1) == 1
    with pytest.raises(LedgerConflictError, match="1 batch\\(es\\) are claimed by another attempt"), \
            consume(spark, {"servers": server.url, "stream": "PQ"}, run_id="pq-run"):
        pytest.fail("the block ran while another attempt held a batch of the run")
    assert call_on(server, stored_rows, "PQ") == 300
    records = call_on(server, lambda conn: BatchLedger(conn).batches("pq-run"))
    assert sorted((rec.state, rec.owner == "zombie", rec.attempts) for rec in records) == [
        ("in_progress", True, 1), ("published", False, 1), ("published", False, 1)], records
    assert all("held by another attempt" in (rec.last_error or "") for rec in records if rec.state == "published")


async def _interest_setup(conn: Any) -> None:
    await ensure_stream(conn, {"name": "INT", "subjects": ["int.>"], "retention": "interest", "allow_direct": True})
    await conn.api_request("CONSUMER.CREATE.INT.SPARK", {"stream_name": "INT", "config": {
        "durable_name": "SPARK", "ack_policy": "explicit", "deliver_policy": "all", "filter_subject": "int.a"}})
    await conn.api_request("CONSUMER.CREATE.INT.OTHER", {"stream_name": "INT", "config": {
        "durable_name": "OTHER", "ack_policy": "explicit", "deliver_policy": "all", "filter_subject": "int.b"}})
    await _publish(conn, "int.a", 300)
    await _publish(conn, "int.b", 100)


async def _ack_floor(conn: Any, consumer: str) -> int:
    info = await conn.api_request(f"CONSUMER.INFO.INT.{consumer}")
    return int(info["ack_floor"]["stream_seq"])


def test_consume_interest_stream_through_its_durable_consumer(server: EmbeddedNatsServer,
                                                               spark: SparkSession) -> None:
    call_on(server, _interest_setup)
    options = {"servers": server.url, "stream": "INT", "consumer": "SPARK", "decode": "json"}
    with pytest.raises(RuntimeError, match="boom"), consume(spark, options, schema="subject string, n long") as (df, _):
        assert df.count() == 300
        raise RuntimeError("boom")
    assert call_on(server, _ack_floor, "SPARK") == 0 and call_on(server, _state, "INT")["messages"] == 400

    with consume(spark, options, schema="subject string, n long") as (df, consumption):
        got = df.agg(F.count("*").alias("n"), F.countDistinct("n").alias("d"),
                     F.collect_set("subject").alias("subjects")).collect()[0]
    assert (got["n"], got["d"], got["subjects"]) == (300, 300, ["int.a"])
    assert consumption.removed == 300
    assert call_on(server, _ack_floor, "SPARK") == consumption.plan.last_seq
    assert call_on(server, _state, "INT")["messages"] == 100  # OTHER's messages are kept
    with pytest.raises(Exception, match=r"consumer_required|durable consumer"):
        spark.read.format("jetstream").options(servers=server.url, stream="INT", consume="true").load().count()


async def _worker_filters(conn: Any, stream: str, prefix: str) -> dict[str, list[str]]:
    reply = await conn.api_request(f"CONSUMER.LIST.{stream}", {})
    return {c["name"]: sorted(c["config"].get("filter_subjects") or [c["config"].get("filter_subject")])
            for c in reply.get("consumers", []) if c["name"].startswith(prefix)}


def test_subject_partitioned_consume_with_per_worker_consumers(server: EmbeddedNatsServer,
                                                               spark: SparkSession) -> None:
    call_on(server, ensure_stream, {"name": "SUBJ", "subjects": ["subj.>"]})
    for subject, count in (("subj.eu", 120), ("subj.uk", 80), ("subj.us", 150), ("subj.other", 30)):
        call_on(server, _publish, subject, count)
    options = {"servers": server.url, "stream": "SUBJ", "worker_subjects": "subj.eu,subj.uk;subj.us",
               "worker_prefix": "orders-reader"}

    with consume(spark, options) as (df, consumption):
        assert df.rdd.getNumPartitions() == 2
        by_subject = {r["subject"]: r["count"] for r in df.groupBy("subject").count().collect()}
    assert by_subject == {"subj.eu": 120, "subj.uk": 80, "subj.us": 150}
    assert call_on(server, _worker_filters, "SUBJ", "orders-reader") == {
        "orders-reader-0": ["subj.eu", "subj.uk"], "orders-reader-1": ["subj.us"]}
    assert [w["first_seq"] for w in consumption.to_dict()["workers"]] == [1, 1]

    call_on(server, _publish, "subj.us", 10)
    call_on(server, _publish, "subj.other", 5)
    with consume(spark, options) as (df, consumption):
        rows = df.select("subject", "seq").collect()
    assert {r["subject"] for r in rows} == {"subj.us"} and len(rows) == 10
    assert min(r["seq"] for r in rows) > 380  # each worker's cursor moved past the first consume
    assert call_on(server, _state, "SUBJ")["messages"] == 395  # a Limits stream keeps its messages
    with pytest.raises(Exception, match="worker_subjects sets the partitions"):
        spark.read.format("jetstream").options(**options, num_partitions="3").load().count()


def test_chunks_committed_but_never_recorded_are_not_stored_again_after_the_window(
        server: EmbeddedNatsServer, spark: SparkSession) -> None:
    """Every chunk of a job committed and none recorded (its tasks killed between the commit and the ledger
    entry), re-run with the same job_id after the duplicate window: each chunk's fence refuses the second
    commit, every row is stored once, and the ledger records the sequences the server committed."""
    call_on(server, ensure_stream, {"name": "UNREC", "subjects": ["unrec.>"], "allow_atomic": True,
                                    "duplicate_window": "200ms"})
    frame = spark.range(0, 600, numPartitions=2).select(F.lit("unrec.rows").alias("subject"),
                                                        F.col("id").cast("string").alias("payload"))
    options = {"servers": server.url, "stream": "UNREC", "job_id": "unrec-1", "batch_size": "100",
               "ledger_bucket": "LEDGER_UNREC"}
    frame.write.format("jetstream").mode("append").options(**options).save()
    committed = call_on(server, ledger_ranges, "LEDGER_UNREC", "unrec-1")
    call_on(server, drop_bucket, "LEDGER_UNREC")  # what tasks killed after their commits leave: no entries
    probes = call_on(server, publish_until_window_passed, "unrec.probe")

    frame.write.format("jetstream").mode("append").options(**options).save()
    assert call_on(server, stored_rows, "UNREC") == 600 + probes
    payloads = [m[4] for m in call_on(server, all_messages, "UNREC") if m[0] == "unrec.rows"]
    assert sorted(int(p) for p in payloads) == list(range(600))
    record = call_on(server, get_job_record, "unrec-1")
    assert (record["stored"], record["duplicate_batches"]) == (0, 6)
    assert call_on(server, ledger_ranges, "LEDGER_UNREC", "unrec-1") == committed
