"""The ``jetstream`` Spark data source (local[2]) against the 3-node cluster: atomic and bulk writes
and a read, each with a SIGKILL of the stream's leader during the job; a re-run of the write job
leaves the stream exact (the ledger skips what is stored, msg ids drop the rest). The ledger and
job buckets the writer creates get three replicas."""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_jetstream.client.admin.streams import ensure_stream, stream_info
from airflow_jetstream.client.kv.job_records import get_job_record
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.reading.stored import read_range
from airflow_jetstream.embedded import EmbeddedNatsCluster
from tests.support.cluster_tools import call, wait_for
from tests.support.nats_calls import stored_rows
from tests.support.spark_session import local_spark

pytestmark = pytest.mark.spark

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

ROWS = 20_000


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    yield from local_spark("test-jetstream-cluster")


def stored(cluster: EmbeddedNatsCluster, stream: str) -> int:
    return int(call(cluster, stored_rows, stream))  # rows only, not the chunks' write fences


async def _payloads(conn: Any, stream: str) -> list[int]:
    last = int((await stream_info(conn, stream))["state"]["last_seq"])
    out: list[int] = []
    async for chunk in read_range(conn, stream, 1, last):
        out.extend(int(data) for _, _, _, _, data in chunk)
    return out


async def _misrecorded(conn: Any, stream: str, run_id: str) -> tuple[int, list[str]]:
    """Ledger records of ``run_id`` whose range does not hold their own chunk ("counts are facts"): the
    message at ``last_seq`` (and ``first_seq``) must be the chunk's last (first) row, and there are ``count``
    of them. Row ``r`` of partition ``p`` is id ``p * ROWS / 2 + r`` (spark.range splits evenly). Returns
    (records checked, the wrong ones)."""
    async def payload(seq: int) -> int:
        reply = await conn.api_request(f"STREAM.MSG.GET.{stream}", {"seq": seq})
        return int(base64.b64decode(reply["message"]["data"]))

    wrong, checked = [], 0
    async for rec in (await BatchLedger.open(conn, create=False)).iter_batches(run_id):
        checked += 1
        first_id = rec.meta["partition"] * (ROWS // 2) + rec.meta["first_row"]
        holds = rec.last_seq is not None and await payload(rec.last_seq) == first_id + rec.count - 1
        if rec.first_seq is not None:
            holds = holds and rec.last_seq - rec.first_seq + 1 == rec.count and await payload(rec.first_seq) == first_id
        if not holds:
            wrong.append(f"{rec.batch_id}: {rec.count} at {rec.first_seq}..{rec.last_seq}")
    return checked, wrong


def during_leader_kill(cluster: EmbeddedNatsCluster, stream: str, job: Any, started: Any) -> BaseException | None:
    """Run ``job()``; a helper thread SIGKILLs ``stream``'s leader once ``started()`` is true; restart after.

    The job runs in this thread (PySpark's Python data sources are registered for it); returns its error.
    """
    victim = wait_for(lambda: cluster.stream_leader(stream), f"a leader of {stream}")
    done = threading.Event()
    killed = threading.Event()

    def killer() -> None:
        while not done.wait(0.1):  # bounded by the job: it stops when the job ends
            if started():
                cluster.kill(victim)
                killed.set()
                return

    thread = threading.Thread(target=killer)
    thread.start()
    error: BaseException | None = None
    try:
        job()
    except Exception as exc:  # the job may fail; the re-run must make the stream exact
        error = exc
    finally:
        done.set()
        thread.join(timeout=60)
        cluster.restart(victim)
    assert killed.is_set(), f"the job on {stream} ended before the leader kill ({error})"
    return error


@pytest.mark.parametrize("mode", ["atomic", "fast"])
def test_write_through_a_leader_kill_and_rerun_leave_the_stream_exact(
        nats_cluster_module: EmbeddedNatsCluster, spark: SparkSession, mode: str) -> None:
    cluster = nats_cluster_module
    stream = f"SW_{mode.upper()}"
    flag = "allow_atomic" if mode == "atomic" else "allow_batched"
    call(cluster, ensure_stream, {"name": stream, "subjects": [f"{stream.lower()}.>"], "num_replicas": 3, flag: True})
    frame = spark.range(0, ROWS, numPartitions=2).select(F.lit(f"{stream.lower()}.x").alias("subject"),
                                                        F.col("id").cast("string").alias("payload"))
    options = {"servers": cluster.servers, "stream": stream, "job_id": f"cw-{mode}", "mode": mode,
               "batch_size": "500"}

    def write() -> None:
        frame.write.format("jetstream").mode("append").options(**options).save()

    first_error = during_leader_kill(cluster, stream, write, lambda: stored(cluster, stream) > 0)
    outcome = "succeeded" if first_error is None else str(first_error).strip().splitlines()[-1][:300]
    logging.getLogger(__name__).info("first %s job: %s; %d stored", mode, outcome, stored(cluster, stream))
    write()  # the re-run an Airflow retry makes

    payloads = call(cluster, _payloads, stream)
    assert len(payloads) == ROWS and set(payloads) == set(range(ROWS))  # nothing lost, nothing twice
    assert call(cluster, get_job_record, f"cw-{mode}")["state"] == "committed"
    assert call(cluster, _misrecorded, stream, f"cw-{mode}") == (ROWS // 500, [])  # one record per chunk
    for bucket in ("KV_batch_ledger", "KV_jetstream_jobs"):  # created by the writer, unasked, as R3
        assert call(cluster, stream_info, bucket)["config"]["num_replicas"] == 3


def test_read_through_a_leader_kill(nats_cluster_module: EmbeddedNatsCluster, spark: SparkSession) -> None:
    cluster = nats_cluster_module
    call(cluster, ensure_stream, {"name": "SR", "subjects": ["sr.>"], "num_replicas": 3, "allow_batched": True})
    spark.range(0, ROWS, numPartitions=2).select(F.lit("sr.x").alias("subject"),
                                                 F.col("id").cast("string").alias("payload")).write.format(
        "jetstream").mode("append").options(servers=cluster.servers, stream="SR", mode="fast", job_id="sr").save()
    got: dict[str, Any] = {}
    reading = threading.Event()

    def read() -> None:
        df = spark.read.format("jetstream").options(servers=cluster.servers, stream="SR", decode="utf-8",
                                                    num_partitions="2").load()
        reading.set()  # planned: the partitions' reads come next
        got["row"] = df.agg(F.count("*").alias("n"), F.countDistinct("payload").alias("distinct")).collect()[0]

    error = during_leader_kill(cluster, "SR", read, reading.is_set)
    assert error is None, error
    assert (got["row"]["n"], got["row"]["distinct"]) == (ROWS, ROWS)
