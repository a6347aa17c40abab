"""``@task.pyspark`` with the ``nats`` connection: the same task on a local session or over Spark Connect.

``jetstream_pyspark_task`` (trigger it manually):

1. ensure the stream ``PYSPARK_ORDERS`` (subjects ``pyspark.orders.>``, atomic batches allowed);
2. a ``@task.pyspark`` task builds its session from the Spark connection ``spark_default`` (of type
   ``spark``: a classic session, e.g. ``local[2]``; of type ``spark_connect``: a Spark Connect
   session; the decorator does not template ``conn_id``), registers the data source with the ``nats`` connection
   ``params.nats_conn_id`` and the package shipped to Spark's Python workers, writes
   ``params.rows`` orders under a job id derived from the run id (so running the task again stores
   nothing twice), reads the stream back and returns the write's job record counts and the stream's
   message and distinct order counts.

The credentials travel inside the registered data source, never in Spark conf, so the same code
works on both kinds of session; ``ship_package=True`` lets the task run against Python workers
(a Connect server's, a cluster's) that do not have ``airflow-jetstream`` installed.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import pendulum
from airflow.sdk import DAG, Param, task

from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator

STREAM = "PYSPARK_ORDERS"
log = logging.getLogger(__name__)

with DAG(
    dag_id="jetstream_pyspark_task",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "nats_conn_id": Param("nats_default", type="string"),
        "rows": Param(1000, type="integer", minimum=1),
    },
    tags=["jetstream", "spark"],
):
    ensure = JetStreamEnsureStreamOperator(
        task_id="ensure_stream",
        nats_conn_id="{{ params.nats_conn_id }}",
        config={"name": STREAM, "subjects": ["pyspark.orders.>"], "allow_atomic": True},
    )

    @task.pyspark(conn_id="spark_default")
    def write_and_read(nats_conn_id: str, rows: int, spark: Any = None, run_id: str | None = None) -> dict[str, int]:
        from pyspark.sql import functions as F

        from airflow_jetstream.client.kv import get_job_record
        from airflow_jetstream.hooks.jetstream import JetStreamHook
        from airflow_jetstream.spark import register

        hook = JetStreamHook(nats_conn_id)
        register(spark, hook.settings, ship_package=True)
        # one job id per DAG run, from its run id (a run triggered through the API has no logical date):
        # running the task again (cleared, retried) stores nothing twice
        job_id = "pyspark-" + hashlib.sha256(str(run_id).encode()).hexdigest()[:16]
        orders = spark.range(0, int(rows), numPartitions=2).select(
            F.concat(F.lit("pyspark.orders."), (F.col("id") % 4).cast("string")).alias("subject"),
            F.col("id").alias("order_id"),
            (F.col("id") % 100 / 4).alias("amount"),
        )
        orders.write.format("jetstream").mode("append").options(stream=STREAM, job_id=job_id).save()
        # what the write committed (save() returns once its commit stored the job record); the write's own
        # progress lines are in the Spark driver's log, which over Connect is the server's
        job = hook.run(get_job_record, job_id)
        read = (spark.read.format("jetstream").schema("order_id long, amount double")
                .options(stream=STREAM, decode="json").load())
        counts = read.agg(F.count("*").alias("messages"), F.countDistinct("order_id").alias("orders")).first()
        log.info("write job %s: %d rows written, %d stored now (the rest were stored by an earlier try); "
                 "stream %s holds %d messages, %d distinct orders", job_id, job["rows"], job["stored"], STREAM,
                 counts["messages"], counts["orders"])
        return {"rows_written": job["rows"], "rows_stored": job["stored"], "messages_in_stream": counts["messages"],
                "orders_in_stream": counts["orders"]}

    ensure >> write_and_read("{{ params.nats_conn_id }}", "{{ params.rows }}")
